#pragma once
// A small random-weight Llama for tests that need many requests fast.
#include <random>

#include "zipage/models/llama.hpp"

namespace zipage::testing {

inline llama_model<cpu_backend> tiny_llama(unsigned seed = 1, int vocab = 64) {
  model_config c;
  c.vocab_size = vocab;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_q_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.ffn_size = 48;
  c.rope = rope_style::half;
  c.bos = 0;
  c.eos = vocab - 1;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](int rows, int cols, float scale) {
    cpu::matrix m(rows, cols);
    for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = normal(rng) * scale;
    return m;
  };
  auto ones = [](int n) { return cpu::matrix::Ones(1, n); };
  llama_weights<cpu_backend> w;
  w.embedding = random(c.vocab_size, c.hidden_size, 1.0f);
  for (int l = 0; l < c.num_layers; ++l) {
    llama_layer_weights<cpu_backend> lw;
    lw.attn_norm = ones(c.hidden_size);
    lw.ffn_norm = ones(c.hidden_size);
    const float s = 1.0f / std::sqrt(static_cast<float>(c.hidden_size));
    lw.wq = random(c.q_size(), c.hidden_size, 2 * s);
    lw.wk = random(c.kv_size(), c.hidden_size, 2 * s);
    lw.wv = random(c.kv_size(), c.hidden_size, s);
    lw.wo = random(c.hidden_size, c.q_size(), s);
    lw.w_gate = random(c.ffn_size, c.hidden_size, s);
    lw.w_up = random(c.ffn_size, c.hidden_size, s);
    lw.w_down = random(c.hidden_size, c.ffn_size, 1.0f / std::sqrt(static_cast<float>(c.ffn_size)));
    w.layers.push_back(std::move(lw));
  }
  w.final_norm = ones(c.hidden_size);
  return llama_model<cpu_backend>(c, std::move(w));
}

}  // namespace zipage::testing
