#pragma once
// A small random Qwen3 checkpoint quantised the way Qwen's official Qwen3-*-FP8 releases are (issue 14,
// part 2), written twice:
//   fp8_dir: config.json with quantization_config {fp8, e4m3, dynamic, [br, bc]}; every q/k/v/o/gate/up/down
//            weight as F8_E4M3 codes plus `<name>_scale_inv` (per block: scale = amax / 448,
//            code = e4m3(w / scale)); embeddings and norms in BF16 (tied lm_head);
//   ref_dir:  the same model unquantised: the same BF16 tensors, and every quantised weight written as F32
//            holding its dequantised values decode(code) * scale — the numbers the FP8 loader must produce.
// Used by tests/unit/test_fp8_checkpoint.cpp and by tests/fp8/make_fp8_checkpoint.cpp (the ctest fixture).
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "zipage/core/fp8.hpp"
#include "zipage/core/half.hpp"
#include "zipage/core/json.hpp"
#include "zipage/models/hf_fp8.hpp"
#include "zipage/safetensors/writer.hpp"

namespace zipage::testing {

struct fp8_qwen3_spec {
  // Defaults: every quantised matrix is ragged (144 = 128 + 16, 160 = 128 + 32, 272 = 2 * 128 + 16, 80 < 128).
  int hidden = 144, layers = 2, heads = 2, kv_heads = 1, head_dim = 80, ffn = 272, vocab = 512;
  int block_rows = 128, block_cols = 128;
  bool bf16_scales = false;  // store _scale_inv as BF16 (the reference uses the stored, rounded values)
  std::uint32_t seed = 14;
  int bos = 1, eos = 2;
};

inline json::value fp8_qwen3_config(const fp8_qwen3_spec& s, bool quantised) {
  json::value c = {{"architectures", {"Qwen3ForCausalLM"}}, {"model_type", "qwen3"}, {"hidden_size", s.hidden},
                   {"num_hidden_layers", s.layers}, {"num_attention_heads", s.heads},
                   {"num_key_value_heads", s.kv_heads}, {"head_dim", s.head_dim}, {"intermediate_size", s.ffn},
                   {"vocab_size", s.vocab}, {"rms_norm_eps", 1e-6}, {"rope_theta", 1000000.0},
                   {"tie_word_embeddings", true}, {"hidden_act", "silu"}, {"max_position_embeddings", 4096},
                   {"bos_token_id", s.bos}, {"eos_token_id", s.eos}, {"torch_dtype", "bfloat16"}};
  if (quantised)
    c["quantization_config"] = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
                                {"modules_to_not_convert", nullptr},
                                {"weight_block_size", {s.block_rows, s.block_cols}}};
  return c;
}

inline void write_fp8_qwen3(const std::filesystem::path& fp8_dir, const std::filesystem::path& ref_dir,
                            const fp8_qwen3_spec& s) {
  namespace st = zipage::safetensors;
  std::filesystem::create_directories(fp8_dir);
  std::filesystem::create_directories(ref_dir);
  std::ofstream(fp8_dir / "config.json") << fp8_qwen3_config(s, true).dump(2) << "\n";
  std::ofstream(ref_dir / "config.json") << fp8_qwen3_config(s, false).dump(2) << "\n";

  std::mt19937 rng(s.seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  st::writer q, ref;
  q.set_metadata("format", "pt");
  ref.set_metadata("format", "pt");
  auto both_bf16 = [&](const std::string& name, std::vector<std::int64_t> shape, const std::vector<float>& v) {
    q.add(name, shape, v, st::dtype::bf16);
    ref.add(name, std::move(shape), v, st::dtype::bf16);
  };
  auto linear = [&](const std::string& name, int rows, int cols, float scale) {
    std::vector<float> w(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
    for (float& x : w) x = u(rng) * scale;
    std::vector<float> sc;
    const std::vector<std::uint8_t> codes = quantize_fp8_blocks(w, rows, cols, s.block_rows, s.block_cols, sc);
    if (s.bf16_scales)
      for (float& x : sc) x = bf16_to_f32(f32_to_bf16(x));  // what the checkpoint will hold
    std::vector<std::byte> bytes(codes.size());
    for (std::size_t i = 0; i < codes.size(); ++i) bytes[i] = static_cast<std::byte>(codes[i]);
    q.add_raw(name, "F8_E4M3", {rows, cols}, std::move(bytes));
    const std::int64_t sr = (rows + s.block_rows - 1) / s.block_rows, scn = (cols + s.block_cols - 1) / s.block_cols;
    q.add(name + "_scale_inv", {sr, scn}, sc, s.bf16_scales ? st::dtype::bf16 : st::dtype::f32);
    std::vector<float> deq(w.size());
    dequantize_fp8_blocks(codes, rows, cols, sc, s.block_rows, s.block_cols, deq, name);
    ref.add(name, {rows, cols}, deq, st::dtype::f32);
  };
  auto norm = [&](const std::string& name, int n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& x : v) x = 1.0f + 0.2f * u(rng);
    both_bf16(name, {n}, v);
  };
  {
    std::vector<float> e(static_cast<std::size_t>(s.vocab) * static_cast<std::size_t>(s.hidden));
    for (float& x : e) x = u(rng);
    both_bf16("model.embed_tokens.weight", {s.vocab, s.hidden}, e);
  }
  const int qs = s.heads * s.head_dim, kvs = s.kv_heads * s.head_dim;
  const float in_scale = 1.0f / std::sqrt(float(s.hidden));
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    norm(p + "input_layernorm.weight", s.hidden);
    linear(p + "self_attn.q_proj.weight", qs, s.hidden, 2.0f * in_scale);
    linear(p + "self_attn.k_proj.weight", kvs, s.hidden, 2.0f * in_scale);
    linear(p + "self_attn.v_proj.weight", kvs, s.hidden, in_scale);
    linear(p + "self_attn.o_proj.weight", s.hidden, qs, 1.0f / std::sqrt(float(qs)));
    norm(p + "self_attn.q_norm.weight", s.head_dim);
    norm(p + "self_attn.k_norm.weight", s.head_dim);
    norm(p + "post_attention_layernorm.weight", s.hidden);
    linear(p + "mlp.gate_proj.weight", s.ffn, s.hidden, in_scale);
    linear(p + "mlp.up_proj.weight", s.ffn, s.hidden, in_scale);
    linear(p + "mlp.down_proj.weight", s.hidden, s.ffn, 1.0f / std::sqrt(float(s.ffn)));
  }
  norm("model.norm.weight", s.hidden);
  q.write(fp8_dir / "model.safetensors");
  ref.write(ref_dir / "model.safetensors");
}

}  // namespace zipage::testing
