// A backend without the compression members runs full KV (compile_ok_full_kv_backend.cpp) but not an
// evicting policy: the engine says which members that needs.
#include "common.hpp"
#include "zipage/policy/policies.hpp"

struct no_gather_backend : zipage::cpu_backend {
  void gather_keys() const = delete;
};

[[maybe_unused]] constexpr auto size =
    sizeof(zipage::engine<cf::declared_model<no_gather_backend>, zipage::zipage_policy>);
