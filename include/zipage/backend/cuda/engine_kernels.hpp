#pragma once
// The generic paged attention of the engine's CUDA backend: fp32 and bf16 data of any head_dim, written to
// mirror cpu::paged_attention (a softmax over the token's whole KV range). The other ops are in ops.hpp.
// No CUDA header here. The launcher throws zipage::error on bad arguments or a failed launch.
#include <cstddef>
#include <cstdint>

#include "zipage/backend/cuda/dtype.hpp"
#include "zipage/backend/cuda/paged_kv_view.hpp"

namespace zipage {

namespace cuda::engine {

// Causal GQA attention over the paged cache for any head_dim <= 512 and block size: one CTA per (token,
// query head), the softmax over the token's whole KV range (as cpu::paged_attention, online in chunks of
// 64 keys). q, out: [num_tokens][num_q_heads * head_dim].
struct generic_attention_params {
  const void* q = nullptr;
  void* out = nullptr;
  // One layer's cache and the page tables; lengths are per token (token_kv_len), so kv.kv_len is unused.
  // FP8 KV cache: with kv.k_scale / kv.v_scale set, each K/V value is read as float(code) * scale (as
  // cpu::fp8::paged_attention).
  paged_kv_view kv;
  const std::int32_t* token_seq = nullptr;
  const std::int32_t* token_kv_len = nullptr;
  int num_tokens = 0;
  int num_q_heads = 0;
  float scale = 0.0f;
};
void paged_attention(cuda_dtype t, const generic_attention_params& p, cuda_stream stream);

}  // namespace cuda::engine
}  // namespace zipage
