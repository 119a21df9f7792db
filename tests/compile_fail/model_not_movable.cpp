// A model that cannot move: the engine, which takes it by value, says so first.
#include "common.hpp"

struct pinned_model {
  using backend_type = zipage::cpu_backend;
  pinned_model() = default;
  pinned_model(pinned_model&&) = delete;
  const zipage::model_config& config() const;
  zipage::cpu_backend::tensor forward(zipage::forward_context<zipage::cpu_backend>& ctx);
};

[[maybe_unused]] constexpr auto size = sizeof(zipage::engine<pinned_model>);
