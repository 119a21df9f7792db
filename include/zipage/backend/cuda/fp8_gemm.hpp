#pragma once
// Host API of the FP8 linear layers' quantisation kernels (src/cuda/fp8_gemm.cu; docs/fp8.md "FP8 weights"),
// without any CUDA header. Both are bit-exact with the CPU reference (core/fp8_linear.hpp) on the same values:
// amax with fmaxf (NaN ignored), scale = __fdiv_rn(amax, 448), code = SATFINITE e4m3 of __fdiv_rn(x, scale),
// zero codes under a zero scale. The layouts are the ones cuBLASLt's block-scaled FP8 GEMM reads.
#include <cstdint>

#include "zipage/backend/cuda/dtype.hpp"

namespace zipage::cuda::fp8 {

// Rows of the activation workspace: cuBLASLt's VEC128_32F scales are token-major, one column of `padded_rows`
// per 128-column group, so the token count is padded to a multiple of 4 (16-byte columns).
[[nodiscard]] constexpr int padded_rows(int rows) { return (rows + 3) & ~3; }
// Leading dimension of a weight's BLK128x128_32F scales: its 128-column blocks, padded to a multiple of 4.
[[nodiscard]] constexpr int weight_scale_ld(int cols) { return (((cols + 127) / 128) + 3) & ~3; }

// w [rows][cols] (bf16 or f32) -> codes [rows][cols] and scales [ceil(rows/128)][weight_scale_ld(cols)]
// (block (i, j) at i * ld + j; the padding columns are written 0). One CTA per 128x128 block.
void quantize_weight_blocks(cuda_dtype t, const void* w, int rows, int cols, std::uint8_t* codes, float* scales,
                            cuda_stream stream);

// x [rows][cols] (bf16 or f32) -> codes [padded][cols] and scales [ceil(cols/128)][padded], group g of token r at
// g * padded + r; the rows from `rows` to `padded` get zero codes and zero scales. One warp per (token, group).
void quantize_activations(cuda_dtype t, const void* x, int rows, int padded, int cols, std::uint8_t* codes,
                          float* scales, cuda_stream stream);

}  // namespace zipage::cuda::fp8
