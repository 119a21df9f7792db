#pragma once
// A one-layer model over an 8-token vocabulary that emits token (t + 1) mod 8 after token t, attending over
// its cache on the way: EOS (7) comes on a known step, which stories260K (trained to end stories with BOS)
// never does. max_context > 0 gives it a trained context for the engine to enforce.
#include <Eigen/Core>

#include "zipage/backend/cpu/cpu_backend.hpp"
#include "zipage/model/forward_context.hpp"
#include "zipage/model/model_config.hpp"

namespace zipage::testing {

struct counting_model {
  using backend_type = cpu_backend;
  using tensor = backend_type::tensor;
  model_config cfg;
  explicit counting_model(int max_context = 0) {
    cfg.vocab_size = 8;
    cfg.hidden_size = 8;
    cfg.num_layers = 1;
    cfg.num_q_heads = 2;
    cfg.num_kv_heads = 1;
    cfg.head_dim = 4;
    cfg.ffn_size = 8;
    cfg.bos = 0;
    cfg.eos = 7;
    cfg.max_context = max_context;
  }
  const model_config& config() const { return cfg; }
  tensor forward(forward_context<backend_type>& ctx) {
    tensor x, attn, last;
    ctx.backend().embedding(tensor::Identity(8, 8), ctx.tokens(), x);
    ctx.attention(0, x, x.leftCols(4), x.leftCols(4), attn);
    ctx.backend().gather_rows(x, ctx.logits_rows(), last);
    tensor logits = tensor::Zero(last.rows(), 8);
    for (Eigen::Index r = 0; r < last.rows(); ++r) {
      Eigen::Index t = 0;
      last.row(r).maxCoeff(&t);
      logits(r, (t + 1) % 8) = 10.0f;
    }
    return logits;
  }
};

}  // namespace zipage::testing
