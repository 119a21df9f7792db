// Must compile: with full_kv (nothing evicted) a backend needs no compression members
// (backend_missing_compression.cpp is the same backend under an evicting policy).
#include "common.hpp"

struct no_gather_backend : zipage::cpu_backend {
  void gather_keys() const = delete;
  void apply_compaction() const = delete;
};

static_assert(zipage::backend<no_gather_backend>);
static_assert(!zipage::evicting_backend<no_gather_backend>);

// Defined, so that the engine's member functions are instantiated (and compiled) too.
struct tiny_model {
  using backend_type = no_gather_backend;
  zipage::model_config cfg;
  const zipage::model_config& config() const { return cfg; }
  backend_type::tensor forward(zipage::forward_context<backend_type>& ctx) {
    backend_type::tensor x, attn;
    ctx.backend().embedding(backend_type::tensor::Identity(8, 8), ctx.tokens(), x);
    ctx.attention(0, x, x, x, attn);
    return x;
  }
};

void run(zipage::engine<tiny_model>& e) {
  (void)e.generate({{0, 1}}, {});
  (void)e.cancel(0);
}
