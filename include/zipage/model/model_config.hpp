#pragma once
#include <string>

#include "zipage/core/error.hpp"
#include "zipage/core/types.hpp"

namespace zipage {

// How RoPE pairs the dimensions of a head: GGUF llama checkpoints rotate adjacent pairs (x[2i], x[2i+1]);
// Hugging Face checkpoints rotate the two halves (x[i], x[i + d/2]).
enum class rope_style { interleaved, half };

struct model_config {
  std::string architecture = "llama";
  int vocab_size = 0;
  int hidden_size = 0;
  int num_layers = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int ffn_size = 0;
  int max_context = 0;  // trained context; 0 = unknown
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  rope_style rope = rope_style::interleaved;
  bool tied_embeddings = true;
  token_id bos = -1;
  token_id eos = -1;

  [[nodiscard]] int q_size() const { return num_q_heads * head_dim; }
  [[nodiscard]] int kv_size() const { return num_kv_heads * head_dim; }
  [[nodiscard]] int gqa_group() const { return num_q_heads / num_kv_heads; }

  void validate() const {
    auto positive = [](int v, const char* name) {
      check(v > 0, "model config: ", name, " must be positive, got ", v);
    };
    positive(vocab_size, "vocab_size");
    positive(hidden_size, "hidden_size");
    positive(num_layers, "num_layers");
    positive(num_q_heads, "num_q_heads");
    positive(num_kv_heads, "num_kv_heads");
    positive(head_dim, "head_dim");
    positive(ffn_size, "ffn_size");
    check(num_q_heads % num_kv_heads == 0, "model config: num_q_heads (", num_q_heads,
          ") must be a multiple of num_kv_heads (", num_kv_heads, ")");
    check(head_dim % 2 == 0, "model config: head_dim must be even for RoPE, got ", head_dim);
    check(rope_theta > 0.0f, "model config: rope_theta must be positive, got ", rope_theta);
    check(rms_eps > 0.0f, "model config: rms_eps must be positive, got ", rms_eps);
    check(bos < vocab_size && eos < vocab_size, "model config: bos/eos (", bos, "/", eos,
          ") outside the vocabulary of ", vocab_size);
  }
};

}  // namespace zipage
