#pragma once
// Host API of the FP8 linear layers' quantisation kernels (src/cuda/fp8_gemm.cu; docs/fp8.md "FP8 weights"),
// without any CUDA header. Both are bit-exact with the CPU reference (core/fp8_linear.hpp) on the same values:
// amax with fmaxf (NaN ignored), scale = __fdiv_rn(amax, 448), code = SATFINITE e4m3 of __fdiv_rn(x, scale),
// zero codes under a zero scale. The layouts are the ones cuBLASLt's block-scaled FP8 GEMM reads.
#include <algorithm>
#include <cstddef>
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

namespace zipage::cuda::fp8 {

// ---- The block-scaled FP8 GEMM of our own (src/cuda/fp8_gemm_sm90.cu, fp8_gemm_sm90.cuh): Hopper wgmma, 64-token
// tiles, for the decode batches at which cuBLASLt's 128-token tiles leave a round of tiles mostly idle.
// out [m][n] bf16 (row stride n) = dequantised x codes [m][k] . dequantised W codes [n][k]^T, with x's codes and
// scales in quantize_activations' layout (padded = padded_rows(m)) and W's in quantize_weight_blocks'.
struct gemm_sm90_args {
  const std::uint8_t* x_codes = nullptr;  // [padded_rows(m)][k]
  const float* x_scales = nullptr;        // [k/128][padded_rows(m)]
  const std::uint8_t* w_codes = nullptr;  // [n][k]
  const float* w_scales = nullptr;        // [n/128][weight_scale_ld(k)]
  void* out = nullptr;                    // [m][n] bf16
  int m = 0, n = 0, k = 0;
  // Split-K, for batches whose tiles do not fill the GPU (a 64-token batch of a 4096-wide output is 32 tiles):
  // `splits` CTAs per tile sum parts of K into fp32 partials in `workspace`, and the last of them adds the parts in a
  // fixed order (deterministic). 0: gemm_sm90_splits' choice, lowered to what `workspace` holds (none without
  // counters); 1: none. Splits > 1 need a workspace of gemm_sm90_workspace_bytes and `counters`:
  // gemm_sm90_max_split_tiles zero ints, which every launch leaves zero.
  int splits = 0;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  int* counters = nullptr;
};

inline constexpr int gemm_sm90_max_split_tiles = 1024;
// A CTA's tile: 64 tokens x 128 outputs, K in 128-column groups (one scale each).
inline constexpr int gemm_sm90_tile_rows = 64, gemm_sm90_tile_cols = 128, gemm_sm90_group = 128;
[[nodiscard]] constexpr int gemm_sm90_tiles(int m, int n) {
  return (padded_rows(m) + gemm_sm90_tile_rows - 1) / gemm_sm90_tile_rows * (n / gemm_sm90_tile_cols);
}
// The split count the kernel runs with for `requested` (gemm_sm90_args::splits) on a device of `sms` multiprocessors:
// requested if > 0 (at most one per 128-column group), else about one CTA per multiprocessor (floor(sms / tiles)),
// at least 2 groups each; 1 from gemm_sm90_max_split_tiles tiles on.
[[nodiscard]] constexpr int gemm_sm90_splits(int requested, int m, int n, int k, int sms) {
  const int groups = k / gemm_sm90_group, tiles = gemm_sm90_tiles(m, n);
  if (groups <= 1 || tiles <= 0 || tiles > gemm_sm90_max_split_tiles) return 1;
  if (requested > 0) return std::min(requested, groups);
  // In graphs over weights read from HBM, 4 splits of the 32 tiles of a 4096-wide output beat 8 (9.9 against 11.7 us
  // at 8 tokens) and 2 of 48 tiles beat 5 (docs/benchmarks.md, 2026-12-04).
  return std::clamp(sms / tiles, 1, groups / 2);
}
// Bytes of the fp32 partials of `splits` splits of an m x n product (0 without splits).
[[nodiscard]] constexpr std::size_t gemm_sm90_workspace_bytes(int m, int n, int splits) {
  return splits > 1 ? static_cast<std::size_t>(gemm_sm90_tiles(m, n)) * static_cast<std::size_t>(splits) *
                          gemm_sm90_tile_rows * gemm_sm90_tile_cols * sizeof(float)
                    : 0;
}

// Whether this build and device run it (an sm_90a build on a compute-capability 9.0 device whose driver
// encodes TMA tensor maps) — asked once per device.
[[nodiscard]] bool gemm_sm90_available();
// Whether it takes the shape: n and k multiples of 128, 16-byte aligned pointers (and gemm_sm90_available()).
[[nodiscard]] bool gemm_sm90_supported(const gemm_sm90_args& a);
// Throws (naming the field) where gemm_sm90_supported does not hold.
void gemm_sm90(const gemm_sm90_args& a, cuda_stream stream);

}  // namespace zipage::cuda::fp8
