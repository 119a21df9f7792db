// An eviction policy without score(): the engine says which member to add.
#include "common.hpp"

struct no_score_policy : zipage::policy_base {
  std::string_view name() const { return "no_score"; }
};

[[maybe_unused]] constexpr auto size = sizeof(zipage::engine<cf::declared_model<zipage::cpu_backend>, no_score_policy>);
