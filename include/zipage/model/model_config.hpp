#pragma once
#include <cmath>
#include <string>
#include <vector>

#include "zipage/core/checked.hpp"
#include "zipage/core/error.hpp"
#include "zipage/core/types.hpp"

namespace zipage {

// How RoPE pairs the dimensions of a head: GGUF llama checkpoints rotate adjacent pairs (x[2i], x[2i+1]);
// Hugging Face checkpoints rotate the two halves (x[i], x[i + d/2]).
enum class rope_style { interleaved, half };

// RoPE frequency scaling. `llama3` is Llama 3.1's: with wavelength λ = 2π/f of a rotation frequency f,
// λ < original_max_position / high_freq_factor keeps f, λ > original_max_position / low_freq_factor
// uses f / factor, and wavelengths in between interpolate smoothly between the two.
// none; llama3 (Llama 3.1's, from its four parameters: Hugging Face checkpoints); factors (a divisor per
// frequency, as llama.cpp's converter stores Llama 3's scaling in a GGUF file's rope_freqs.weight).
enum class rope_scaling_type { none, llama3, factors };

struct rope_scaling_config {
  rope_scaling_type type = rope_scaling_type::none;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position = 8192;
  std::vector<float> freq_factors;  // factors: frequency i is divided by freq_factors[i] (head_dim / 2 of them)

  [[nodiscard]] bool enabled() const noexcept { return type != rope_scaling_type::none; }

  // The scaled inverse frequency (radians per position) of frequency i (0 .. head_dim / 2 - 1), unscaled inv_freq.
  [[nodiscard]] double apply(int i, double inv_freq) const noexcept {
    if (type == rope_scaling_type::factors) return inv_freq / double(freq_factors[static_cast<std::size_t>(i)]);
    return apply(inv_freq);
  }
  // The same for the scalings that do not depend on i (none, llama3).
  [[nodiscard]] double apply(double inv_freq) const noexcept {
    if (type != rope_scaling_type::llama3) return inv_freq;
    const double pi = 3.14159265358979323846;
    const double wavelen = 2.0 * pi / inv_freq;
    const double old_len = original_max_position;
    if (wavelen < old_len / high_freq_factor) return inv_freq;
    if (wavelen > old_len / low_freq_factor) return inv_freq / factor;
    const double smooth = (old_len / wavelen - low_freq_factor) / (double(high_freq_factor) - low_freq_factor);
    return (1.0 - smooth) * inv_freq / factor + smooth * inv_freq;
  }

  void validate() const {
    if (type == rope_scaling_type::none) return;
    if (type == rope_scaling_type::factors) {
      check(!freq_factors.empty(), "model config: rope scaling by factors has no factors");
      for (std::size_t i = 0; i < freq_factors.size(); ++i)
        check(std::isfinite(freq_factors[i]) && freq_factors[i] > 0.0f, "model config: rope frequency factor ", i,
              " must be finite and positive, got ", freq_factors[i]);
      return;
    }
    check(std::isfinite(factor) && factor >= 1.0f, "model config: rope scaling factor must be finite and >= 1, got ",
          factor);
    check(std::isfinite(low_freq_factor) && low_freq_factor > 0.0f,
          "model config: rope scaling low_freq_factor must be finite and positive, got ", low_freq_factor);
    check(std::isfinite(high_freq_factor) && high_freq_factor > low_freq_factor,
          "model config: rope scaling high_freq_factor (", high_freq_factor, ") must exceed low_freq_factor (",
          low_freq_factor, ") and be finite");
    check(original_max_position > 0, "model config: rope scaling original_max_position_embeddings must be positive, got ",
          original_max_position);
  }
};

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
  // Added for Hugging Face checkpoints; the defaults keep GGUF models as they were.
  rope_scaling_config rope_scaling;   // RoPE frequency scaling (Llama 3.1)
  bool qkv_bias = false;              // q/k/v projections carry a bias (Qwen2)
  bool qk_norm = false;               // per-head RMSNorm of q and k before RoPE (Qwen3)
  std::vector<token_id> extra_eos;    // further end-of-sequence ids besides `eos` (e.g. <|endoftext|>)

  // Row widths of q and k/v, computed in 64 bits: a product beyond int is an error naming the fields
  // (each field passing its own range check is not enough, e.g. 536870916 heads x head_dim 8).
  [[nodiscard]] int q_size() const { return checked_dim(num_q_heads, head_dim, "model config: num_q_heads x head_dim"); }
  [[nodiscard]] int kv_size() const { return checked_dim(num_kv_heads, head_dim, "model config: num_kv_heads x head_dim"); }
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
    // Derived sizes: every tensor dimension fits an int, every tensor's element count and one token's K/V
    // over all layers fit 64 bits (the loaders then compare them with the tensors the file holds).
    const std::int64_t q = q_size(), kv = kv_size();
    (void)checked_mul(q, hidden_size, "model config: (num_q_heads x head_dim) x hidden_size");
    (void)checked_mul(kv, hidden_size, "model config: (num_kv_heads x head_dim) x hidden_size");
    (void)checked_mul(ffn_size, hidden_size, "model config: ffn_size x hidden_size");
    (void)checked_mul(vocab_size, hidden_size, "model config: vocab_size x hidden_size");
    (void)checked_mul(checked_mul(2 * kv, num_layers, "model config: 2 x (num_kv_heads x head_dim) x num_layers"),
                      8, "model config: K/V bytes per token");
    // Finite too: a value that overflowed float on the way in (1e300 in config.json, inf in a GGUF file) would
    // otherwise run and produce garbage (x / inf = 0 norms, NaN rotations).
    check(std::isfinite(rope_theta) && rope_theta > 0.0f, "model config: rope_theta must be finite and positive, got ",
          rope_theta);
    check(std::isfinite(rms_eps) && rms_eps > 0.0f, "model config: rms_eps must be finite and positive, got ", rms_eps);
    check(bos < vocab_size && eos < vocab_size, "model config: bos/eos (", bos, "/", eos,
          ") outside the vocabulary of ", vocab_size);
    for (token_id id : extra_eos)
      check(id >= 0 && id < vocab_size, "model config: extra eos id ", id, " outside the vocabulary of ", vocab_size);
    rope_scaling.validate();
    check(rope_scaling.type != rope_scaling_type::factors ||
              rope_scaling.freq_factors.size() == static_cast<std::size_t>(head_dim / 2),
          "model config: ", rope_scaling.freq_factors.size(), " rope frequency factors for a head size of ", head_dim,
          " (", head_dim / 2, " frequencies)");
  }
};

}  // namespace zipage
