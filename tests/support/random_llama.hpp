#pragma once
// A random Llama-family model (optionally Qwen3's q/k norms, Qwen2's q/k/v biases, an untied LM head),
// with the same weights on every backend: the values are drawn on the host from one seeded normal
// stream, in a fixed order, then handed to the backend. Tests compare backends and engines on it.
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "zipage/model/model_config.hpp"
#include "zipage/models/llama.hpp"

namespace zipage::testing {

// Draws, in order: the embedding; per layer attn_norm, ffn_norm, wq, wk, wv, wo, then bq, bk, bv (with
// c.qkv_bias), q_norm, k_norm (with c.qk_norm), w_gate, w_up, w_down; the final norm; the LM head (when
// c.tied_embeddings is off). Norm weights are 1 + N(0, 0.1²); projections are scaled by their fan-in
// (wq and wk twice as wide, so attention is not uniform).
// `fuse`: the layers' q/k/v and gate/up projections fused (fuse_projections), as the loaders make them.
template <class B>
llama_model<B> random_llama(const B& b, const model_config& c, unsigned seed, bool fuse = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](int rows, int cols, float scale, float offset = 0.0f) {
    std::vector<float> v(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
    for (float& x : v) x = offset + normal(rng) * scale;
    return b.from_host(v, rows, cols);
  };
  const auto fan_in = [](int n) { return 1.0f / std::sqrt(static_cast<float>(n)); };
  const float s = fan_in(c.hidden_size);
  llama_weights<B> w;
  w.embedding = random(c.vocab_size, c.hidden_size, 1.0f);
  for (int l = 0; l < c.num_layers; ++l) {
    llama_layer_weights<B> lw;
    lw.attn_norm = random(1, c.hidden_size, 0.1f, 1.0f);
    lw.ffn_norm = random(1, c.hidden_size, 0.1f, 1.0f);
    lw.wq = random(c.q_size(), c.hidden_size, 2 * s);
    lw.wk = random(c.kv_size(), c.hidden_size, 2 * s);
    lw.wv = random(c.kv_size(), c.hidden_size, s);
    lw.wo = random(c.hidden_size, c.q_size(), fan_in(c.q_size()));
    if (c.qkv_bias) {
      lw.bq = random(1, c.q_size(), 0.5f);
      lw.bk = random(1, c.kv_size(), 0.5f);
      lw.bv = random(1, c.kv_size(), 0.5f);
    }
    if (c.qk_norm) {
      lw.q_norm = random(1, c.head_dim, 0.1f, 1.0f);
      lw.k_norm = random(1, c.head_dim, 0.1f, 1.0f);
    }
    lw.w_gate = random(c.ffn_size, c.hidden_size, s);
    lw.w_up = random(c.ffn_size, c.hidden_size, s);
    lw.w_down = random(c.hidden_size, c.ffn_size, fan_in(c.ffn_size));
    if (fuse) fuse_projections(b, lw);
    w.layers.push_back(std::move(lw));
  }
  w.final_norm = random(1, c.hidden_size, 0.1f, 1.0f);
  if (!c.tied_embeddings) w.lm_head = random(c.vocab_size, c.hidden_size, 1.0f);
  return llama_model<B>(c, std::move(w));
}

}  // namespace zipage::testing
