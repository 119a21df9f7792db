// A backend without swap_in (hidden here by a member of another shape): the engine names the KV movement
// members it needs.
#include "common.hpp"

struct no_swap_backend : zipage::cpu_backend {
  void swap_in() const = delete;
};

[[maybe_unused]] constexpr auto size = sizeof(zipage::engine<cf::declared_model<no_swap_backend>>);
