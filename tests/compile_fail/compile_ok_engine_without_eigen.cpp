// Must compile: zipage/engine/engine.hpp is backend-neutral. This target is built without the CPU (Eigen)
// backend's dependency on its include path (no Eigen3::Eigen), so an include of backend/cpu/ from the
// engine's headers fails here; and no Eigen header may have been pulled in from elsewhere either.
#include "zipage/engine/engine.hpp"

#if defined(EIGEN_WORLD_VERSION)
#error "zipage/engine/engine.hpp pulled in Eigen (the CPU backend): keep it backend-neutral"
#endif

// What a user of the engine names without choosing a backend.
[[maybe_unused]] static const zipage::engine_config config{.block_size = 16, .num_blocks = 64};
[[maybe_unused]] static const zipage::cache_geometry geometry = config.geometry();
static_assert(!zipage::backend<int>);
