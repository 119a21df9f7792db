// An eviction policy whose `evicts` is a data member, not a constant: the engine says it must be static constexpr.
#include "common.hpp"

struct nonstatic_policy : zipage::policy_base {
  bool evicts = true;
  std::string_view name() const { return "nonstatic"; }
  void score(const zipage::score_context&, std::span<float>, std::span<float>) const {}
};

using model = cf::declared_model<zipage::cpu_backend>;
[[maybe_unused]] constexpr auto size = sizeof(zipage::engine<model, nonstatic_policy>);
