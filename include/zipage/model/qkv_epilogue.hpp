#pragma once
// What follows a fused q|k|v projection in a Llama-family attention block, as one backend op: cut the row into
// q, k and v, add the biases (Qwen2), RMSNorm each q and k head (Qwen3), rotate q and k (RoPE). A backend that has
// `qkv_epilogue(qkv, epilogue, q, k, v)` may do it in one kernel; it must give what split_columns, add_bias,
// rms_norm and rope give one after another: separate_qkv_epilogue below, which a backend without such a kernel
// (or for shapes its kernel cannot take) calls itself (models/llama.hpp fuses_projections).
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

// The epilogue as the separate ops, one after another, on any backend `ops` with split_columns, add_bias, rms_norm
// and rope (with RoPE scaling).
template <class Ops, class Tensor>
void separate_qkv_epilogue(const Ops& ops, const Tensor& qkv, const qkv_epilogue<Tensor>& e, Tensor& q, Tensor& k,
                           Tensor& v) {
  const int widths[] = {e.num_q_heads * e.head_dim, e.num_kv_heads * e.head_dim, e.num_kv_heads * e.head_dim};
  Tensor* const outs[] = {&q, &k, &v};
  ops.split_columns(qkv, widths, outs);
  if (e.q_bias) ops.add_bias(q, *e.q_bias);
  if (e.k_bias) ops.add_bias(k, *e.k_bias);
  if (e.v_bias) ops.add_bias(v, *e.v_bias);
  if (e.q_norm) ops.rms_norm(q, *e.q_norm, e.rms_eps, q);
  if (e.k_norm) ops.rms_norm(k, *e.k_norm, e.rms_eps, k);
  ops.rope(q, e.positions, e.head_dim, e.rope_theta, e.style, e.scaling);
  ops.rope(k, e.positions, e.head_dim, e.rope_theta, e.style, e.scaling);
}

}  // namespace zipage
