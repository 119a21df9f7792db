// A model without forward(): the engine says what to add.
#include "common.hpp"

struct no_forward_model {
  using backend_type = zipage::cpu_backend;
  const zipage::model_config& config() const;
};

[[maybe_unused]] constexpr auto size = sizeof(zipage::engine<no_forward_model>);
