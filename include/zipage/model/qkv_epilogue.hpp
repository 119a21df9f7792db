#pragma once
// What follows a fused q|k|v projection in a Llama-family attention block, as one backend op: cut the row into
// q, k and v, add the biases (Qwen2), RMSNorm each q and k head (Qwen3), rotate q and k (RoPE). A backend that has
// `qkv_epilogue(qkv, epilogue, q, k, v)` may do it in one kernel; it must give what split_columns, add_bias,
// rms_norm and rope give one after another (models/llama.hpp fuses_qkv_epilogue).
#include <cstdint>
#include <span>

#include "zipage/model/model_config.hpp"

namespace zipage {

template <class Tensor>
struct qkv_epilogue {
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  const Tensor* q_bias = nullptr;  // [1][q heads * head_dim], or none
  const Tensor* k_bias = nullptr;  // [1][kv heads * head_dim]
  const Tensor* v_bias = nullptr;
  const Tensor* q_norm = nullptr;  // [1][head_dim]: per-head RMSNorm weights, or none
  const Tensor* k_norm = nullptr;
  float rms_eps = 1e-6f;
  std::span<const std::int32_t> positions;  // one per row
  float rope_theta = 10000.0f;
  rope_style style = rope_style::half;
  rope_scaling_config scaling;  // applied to the inverse frequencies (none: unscaled)
};

}  // namespace zipage
