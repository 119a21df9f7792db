#pragma once
// What the compile-fail sources share: a model declared (never defined: the sources only instantiate the
// engine's class, never run it) on a given backend.
#include "zipage/backend/cpu/cpu_backend.hpp"
#include "zipage/engine/engine.hpp"

namespace cf {

template <class Backend>
struct declared_model {
  using backend_type = Backend;
  const zipage::model_config& config() const;
  typename Backend::tensor forward(zipage::forward_context<Backend>& ctx);
};

}  // namespace cf
