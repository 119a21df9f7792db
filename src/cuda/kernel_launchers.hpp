#pragma once
// Private to src/cuda/ (not installed): the per-kernel launchers behind the public one-per-op launchers
// of backend/cuda/ops.hpp and attention.hpp, which pick between them (src/cuda/ops.cpp,
// src/cuda/paged_attention.cpp; the tuned attention kernels' launchers are public, in attention.hpp). `tuned` launchers run the bf16
// kernels of backend/cuda/elementwise.cuh (src/cuda/elementwise.cu) and check their own preconditions;
// `reference` launchers run the any-shape fp32/bf16 kernels (src/cuda/reference_ops.cu). Arguments and
// shapes as in ops.hpp.
#include <cstdint>

#include "zipage/backend/cuda/attention.hpp"
#include "zipage/backend/cuda/dtype.hpp"
#include "zipage/backend/cuda/ops.hpp"

namespace zipage::cuda::tuned {

void gather_rows(const void* table, std::int64_t num_rows, int cols, const std::int32_t* ids, int num_ids, void* out,
                 cuda_stream stream);
void rms_norm(const void* x, cuda_dtype wt, const void* weight, void* out, std::int64_t rows, int cols, int width,
              float eps, cuda_stream stream);
void rope(void* x, const std::int32_t* positions, std::int64_t rows, int num_heads, int head_dim,
          std::int64_t row_stride, float theta, rope_style style, cuda_stream stream);
void silu_mul(const void* gate, const void* up, void* out, std::int64_t rows, int cols, std::int64_t in_row_stride,
              cuda_stream stream);
void silu_mul_fp8(const void* gate, const void* up, void* out, std::int64_t rows, int cols, std::int64_t in_row_stride,
                  const fp8_copy& copy, cuda_stream stream);
void add(const void* a, const void* b, void* out, std::int64_t n, cuda_stream stream);
void qkv_epilogue(const qkv_epilogue_params& p, cuda_stream stream);
void add_rms_norm(void* x, const void* y, cuda_dtype wt, const void* weight, void* out, std::int64_t rows, int width,
                  float eps, const fp8_copy& copy, cuda_stream stream);
void append_kv(void* k_cache, void* v_cache, const void* k, const void* v, const std::int64_t* slots, int num_tokens,
               int num_kv_heads, int head_dim, std::int64_t k_row_stride, std::int64_t v_row_stride,
               cuda_stream stream);
// Into an FP8 cache (kv.k_scale set): bf16 K/V, head_dim 128, strides of whole 8-element vectors, k and v 16-byte
// and the caches 8-byte aligned (append_kv_fp8_supported); the same bytes as reference::append_kv_fp8.
[[nodiscard]] bool append_kv_fp8_supported(const append_kv_params& p);
void append_kv_fp8(const append_kv_params& p, cuda_stream stream);

}  // namespace zipage::cuda::tuned

namespace zipage::cuda::reference {

void gather_rows(cuda_dtype t, const void* table, std::int64_t num_rows, int cols, const std::int32_t* ids,
                 int num_ids, void* out, cuda_stream stream);
void rms_norm(cuda_dtype t, const void* x, cuda_dtype wt, const void* weight, void* out, std::int64_t rows, int cols,
              int width, float eps, cuda_stream stream);
void rope(cuda_dtype t, const rope_params& p, cuda_stream stream);
void silu_mul(cuda_dtype t, const void* gate, const void* up, void* out, std::int64_t rows, int cols,
              std::int64_t in_row_stride, cuda_stream stream);
void add(cuda_dtype t, const void* a, const void* b, void* out, std::int64_t n, cuda_stream stream);
void append_kv(cuda_dtype t, const append_kv_params& p, cuda_stream stream);      // bf16 / fp32 cache
void append_kv_fp8(cuda_dtype t, const append_kv_params& p, cuda_stream stream);  // FP8 cache (quantising)
// Generic paged attention (any head_dim <= 512, any block size; FP8 cache when kv.k_scale is set): one CTA
// per (token, query head), the softmax over the token's whole KV range, as cpu::paged_attention.
void paged_attention(cuda_dtype t, const attention_params& p, cuda_stream stream);

}  // namespace zipage::cuda::reference
