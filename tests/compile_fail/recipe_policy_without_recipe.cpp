// A recipe_policy<P> whose P has no recipe(): recipe_policy says what to define.
#include "common.hpp"
#include "zipage/policy/policies.hpp"

struct no_recipe_policy : zipage::recipe_policy<no_recipe_policy> {
  std::string_view name() const { return "no_recipe"; }
};

void build() {
  using model = cf::declared_model<zipage::cpu_backend>;
  zipage::engine<model, no_recipe_policy> eng(model{});
  (void)eng.step();
}
