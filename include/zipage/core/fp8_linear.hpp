#pragma once
// The CPU reference of FP8 linear layers (issue 14 part 2, docs/fp8.md "FP8 weights"): what the CUDA backend's
// FP8 weights, its per-token activation quantisation and its cuBLASLt block-scaled FP8 GEMM compute, written
// plainly so that the device can be checked against it (quantisation bit for bit, the GEMM within a tolerance).
//
//  * Weights [rows = out][cols = in] in 128x128 blocks: scale = amax / 448 over the block (IEEE division),
//    code = e4m3(w / scale) (IEEE division, round to nearest even, saturating: f32_to_fp8_e4m3); an all-zero
//    block has scale 0 and zero codes. Scales row-major [ceil(rows/128)][ceil(cols/128)].
//  * Activations [rows = tokens][cols = in] per token and 128-column group, the same rule; scales row-major
//    [rows][ceil(cols/128)].
//  * The GEMM: out[i][j] = sum_k (xc[i][k] * xs[i][k/128]) * (wc[j][k] * ws[j/128][k/128]), every product
//    and the sum in double (the device accumulates in fp32 per 128-wide slice, then rounds to bf16).
// amax ignores NaN (std::fmax, as CUDA's fmaxf); a NaN value gives a NaN code (0x7f / 0xff).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/fp8.hpp"

namespace zipage::fp8_linear {

inline constexpr int block = 128;

// Number of 128-wide groups covering n.
[[nodiscard]] constexpr int groups(int n) noexcept { return (n + block - 1) / block; }

// The scale of a block whose largest magnitude is amax, and one value's code under it.
[[nodiscard]] inline float scale_of(float amax) noexcept { return amax / fp8_e4m3_max; }
[[nodiscard]] inline std::uint8_t code_of(float x, float scale) noexcept {
  return scale == 0.0f ? std::uint8_t{0} : f32_to_fp8_e4m3(x / scale);
}

// E4M3 codes of a [rows][cols] matrix and their fp32 scales (layout per the function that made them).
struct quantized {
  int rows = 0, cols = 0;
  std::vector<std::uint8_t> codes;  // [rows][cols]
  std::vector<float> scales;
};

// A [rows][cols] matrix in block_rows x block_cols blocks: scale = amax / 448 over the block, or
// `zero_block_scale` for an all-zero block; code = e4m3(x / scale), zero codes under a zero scale. Scales
// row-major [ceil(rows/block_rows)][ceil(cols/block_cols)]. `what` names the caller in the size error.
[[nodiscard]] inline quantized quantize_blocks(std::span<const float> x, int rows, int cols, int block_rows,
                                               int block_cols, float zero_block_scale = 0.0f,
                                               const char* what = "fp8_linear::quantize_blocks") {
  const std::size_t R = static_cast<std::size_t>(rows), C = static_cast<std::size_t>(cols);
  check(rows >= 0 && cols >= 0 && x.size() == R * C, what, ": ", x.size(), " values for [", rows, ", ", cols, "]");
  check(block_rows > 0 && block_cols > 0, what, ": block ", block_rows, "x", block_cols, " is empty");
  const std::size_t br = static_cast<std::size_t>(block_rows), bc = static_cast<std::size_t>(block_cols);
  const std::size_t sc = (C + bc - 1) / bc;
  quantized q{rows, cols, std::vector<std::uint8_t>(R * C), std::vector<float>((R + br - 1) / br * sc, 0.0f)};
  for (std::size_t i = 0; i < R; ++i)
    for (std::size_t j = 0; j < C; ++j) {
      float& a = q.scales[(i / br) * sc + j / bc];
      a = std::fmax(a, std::fabs(x[i * C + j]));
    }
  for (float& s : q.scales) s = s > 0.0f ? scale_of(s) : zero_block_scale;
  for (std::size_t i = 0; i < R; ++i)
    for (std::size_t j = 0; j < C; ++j) q.codes[i * C + j] = code_of(x[i * C + j], q.scales[(i / br) * sc + j / bc]);
  return q;
}

// A weight [rows][cols] in 128x128 blocks; scales [groups(rows)][groups(cols)].
[[nodiscard]] inline quantized quantize_weight(std::span<const float> w, int rows, int cols) {
  return quantize_blocks(w, rows, cols, block, block, 0.0f, "fp8_linear::quantize_weight");
}

// Activations [rows][cols] per token and 128-column group (1 x 128 blocks); scales [rows][groups(cols)].
[[nodiscard]] inline quantized quantize_activations(std::span<const float> x, int rows, int cols) {
  return quantize_blocks(x, rows, cols, 1, block, 0.0f, "fp8_linear::quantize_activations");
}

// Dequantised weight value [i][j] and activation value [i][j] (exact in double).
[[nodiscard]] inline double weight_value(const quantized& w, int i, int j) {
  const auto sc = static_cast<std::size_t>(groups(w.cols));
  return double(fp8_e4m3_to_f32(w.codes[static_cast<std::size_t>(i) * w.cols + j])) *
         double(w.scales[static_cast<std::size_t>(i / block) * sc + static_cast<std::size_t>(j / block)]);
}
[[nodiscard]] inline double activation_value(const quantized& x, int i, int j) {
  const auto G = static_cast<std::size_t>(groups(x.cols));
  return double(fp8_e4m3_to_f32(x.codes[static_cast<std::size_t>(i) * x.cols + j])) *
         double(x.scales[static_cast<std::size_t>(i) * G + static_cast<std::size_t>(j / block)]);
}

// out [x.rows][w.rows] = x · wᵀ on the dequantised values, in double.
[[nodiscard]] inline std::vector<double> gemm(const quantized& x, const quantized& w) {
  check(x.cols == w.cols, "fp8_linear::gemm: input width ", x.cols, " does not match weight input width ", w.cols);
  const int m = x.rows, n = w.rows, k = x.cols;
  std::vector<double> xv(static_cast<std::size_t>(m) * k), wv(static_cast<std::size_t>(n) * k);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < k; ++j) xv[static_cast<std::size_t>(i) * k + j] = activation_value(x, i, j);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < k; ++j) wv[static_cast<std::size_t>(i) * k + j] = weight_value(w, i, j);
  std::vector<double> out(static_cast<std::size_t>(m) * n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      const double* a = xv.data() + static_cast<std::size_t>(i) * k;
      const double* b = wv.data() + static_cast<std::size_t>(j) * k;
      double s = 0.0;
      for (int t = 0; t < k; ++t) s += a[t] * b[t];
      out[static_cast<std::size_t>(i) * n + j] = s;
    }
  return out;
}

// The FP8 linear layer end to end: quantise x per token-group, multiply by the quantised weight.
[[nodiscard]] inline std::vector<double> linear(std::span<const float> x, int rows, const quantized& w) {
  return gemm(quantize_activations(x, rows, w.cols), w);
}

}  // namespace zipage::fp8_linear
