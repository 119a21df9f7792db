// The CPU reference of FP8 linear layers (core/fp8_linear.hpp): block quantisation of weights, per-token
// group quantisation of activations, the FP8 GEMM on dequantised values; and the re-quantisation of an FP8
// checkpoint's dequantised weights (models/hf_fp8.hpp) recovering its codes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "zipage/core/fp8_linear.hpp"
#include "zipage/core/weight_dtype.hpp"
#include "zipage/models/hf_fp8.hpp"

using namespace zipage;

namespace {

std::vector<float> normal(int n, float sigma, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace

TEST_CASE("weight_dtype: --quantization values, and auto runs FP8 checkpoints in FP8") {
  CHECK(parse_weight_quantization("auto") == weight_dtype::auto_);
  CHECK(parse_weight_quantization("none") == weight_dtype::compute);
  CHECK(parse_weight_quantization("fp8") == weight_dtype::fp8_e4m3);
  CHECK(parse_weight_quantization("fp8_e4m3") == weight_dtype::fp8_e4m3);
  CHECK_THROWS_WITH_AS((void)parse_weight_quantization("int8"), doctest::Contains("--quantization: 'int8'"), error);
  CHECK(fp8_weights(weight_dtype::auto_, true));
  CHECK_FALSE(fp8_weights(weight_dtype::auto_, false));
  CHECK_FALSE(fp8_weights(weight_dtype::compute, true));
  CHECK(fp8_weights(weight_dtype::fp8_e4m3, false));
}

TEST_CASE("fp8_linear: weight blocks take amax / 448 and round each value to nearest even") {
  // [130][259]: 2 x 3 blocks, the last row and column ragged; block (1, 2) is all zeros.
  const int R = 130, C = 259;
  auto w = normal(R * C, 0.05f, 1);
  for (int i = 128; i < R; ++i)
    for (int j = 256; j < C; ++j) w[static_cast<std::size_t>(i) * C + j] = 0.0f;
  const auto q = fp8_linear::quantize_weight(w, R, C);
  REQUIRE(q.scales.size() == 6u);
  CHECK(q.scales[5] == 0.0f);
  for (int b = 0; b < 5; ++b) {
    float amax = 0.0f;
    const int r0 = (b / 3) * 128, c0 = (b % 3) * 128;
    for (int i = r0; i < std::min(R, r0 + 128); ++i)
      for (int j = c0; j < std::min(C, c0 + 128); ++j) amax = std::fmax(amax, std::fabs(w[static_cast<std::size_t>(i) * C + j]));
    CHECK(q.scales[static_cast<std::size_t>(b)] == amax / 448.0f);
  }
  int at_max = 0;
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j) {
      const std::size_t k = static_cast<std::size_t>(i) * C + j;
      const float s = q.scales[static_cast<std::size_t>((i / 128) * 3 + j / 128)];
      const std::uint8_t want = s == 0.0f ? 0 : f32_to_fp8_e4m3(w[k] / s);
      CHECK(q.codes[k] == want);
      at_max += (q.codes[k] & 0x7f) == 0x7e;
      // The dequantised value is within half an E4M3 step (relative 2^-4) or a subnormal step of the input.
      const double v = fp8_linear::weight_value(q, i, j);
      CHECK(std::fabs(v - w[k]) <= std::fmax(std::fabs(w[k]) / 16.0, double(s) * 0x1p-10) + 1e-12);
    }
  CHECK(at_max >= 5);  // every non-zero block has its largest value at +-448
}

TEST_CASE("fp8_linear: activations per token and 128-column group") {
  const int R = 3, C = 300;  // groups of 128, 128, 44
  auto x = normal(R * C, 2.0f, 2);
  for (int j = 128; j < 256; ++j) x[static_cast<std::size_t>(C) + j] = 0.0f;  // row 1, group 1: zeros
  x[7] = 1e30f;                                                                  // row 0, group 0: saturating amax
  const auto q = fp8_linear::quantize_activations(x, R, C);
  REQUIRE(q.scales.size() == 9u);
  CHECK(q.scales[4] == 0.0f);
  for (int j = 128; j < 256; ++j) CHECK(q.codes[static_cast<std::size_t>(C) + j] == 0);
  CHECK(q.scales[0] == 1e30f / 448.0f);
  CHECK(q.codes[7] == 0x7e);
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j) {
      const std::size_t k = static_cast<std::size_t>(i) * C + j;
      const float s = q.scales[static_cast<std::size_t>(i * 3 + j / 128)];
      CHECK(q.codes[k] == (s == 0.0f ? 0 : f32_to_fp8_e4m3(x[k] / s)));
    }
}

TEST_CASE("fp8_linear: the GEMM is the double product of dequantised values, close to the exact one") {
  const int M = 5, N = 40, K = 384;
  const auto x = normal(M * K, 1.0f, 3);
  const auto w = normal(N * K, 0.02f, 4);
  const auto wq = fp8_linear::quantize_weight(w, N, K);
  const auto out = fp8_linear::linear(x, M, wq);
  const auto xq = fp8_linear::quantize_activations(x, M, K);
  double err2 = 0.0, ref2 = 0.0;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0.0, exact = 0.0;
      for (int k = 0; k < K; ++k) {
        s += fp8_linear::activation_value(xq, i, k) * fp8_linear::weight_value(wq, j, k);
        exact += double(x[static_cast<std::size_t>(i) * K + k]) * double(w[static_cast<std::size_t>(j) * K + k]);
      }
      const double o = out[static_cast<std::size_t>(i) * N + j];
      CHECK(o == doctest::Approx(s).epsilon(1e-12));
      err2 += (o - exact) * (o - exact);
      ref2 += exact * exact;
    }
  // Two E4M3 roundings (relative RMS ~2^-5 each, averaging over K): a few percent at most.
  const double rel = std::sqrt(err2 / ref2);
  MESSAGE("fp8 GEMM vs exact fp32 inputs: relative RMS " << rel);
  CHECK(rel < 0.06);
}

TEST_CASE("fp8_linear: re-quantising an FP8 checkpoint's dequantised weights recovers its codes") {
  // The releases' quantiser (hf_fp8.hpp: scale = amax / 448, so every non-zero block holds a +-448 code),
  // then zipage's exact dequantisation at load, then the FP8-weight quantiser with the same 128x128 blocks.
  const int R = 200, C = 300;
  const auto w = normal(R * C, 0.03f, 5);
  std::vector<float> scale_inv;
  const auto codes = quantize_fp8_blocks(w, R, C, 128, 128, scale_inv);
  std::vector<float> deq(w.size());
  dequantize_fp8_blocks(codes, R, C, scale_inv, 128, 128, deq);
  const auto q = fp8_linear::quantize_weight(deq, R, C);
  int same = 0;
  for (std::size_t k = 0; k < codes.size(); ++k) same += q.codes[k] == codes[k];
  CHECK(same == static_cast<int>(codes.size()));
  for (std::size_t b = 0; b < scale_inv.size(); ++b) {
    // fl(fl(448 s) / 448) is s or a neighbour of s.
    CHECK(std::fabs(q.scales[b] - scale_inv[b]) <= std::nextafter(scale_inv[b], 1e30f) - scale_inv[b]);
  }
  // A block whose largest code is 416 (0x7d) instead of 448 gets another scale: its codes are rescaled.
  std::vector<std::uint8_t> small(static_cast<std::size_t>(128 * 128));
  for (std::size_t k = 0; k < small.size(); ++k) small[k] = static_cast<std::uint8_t>((k * 37) % 0x7e) | ((k & 1) << 7);
  small[0] = 0x7d;
  std::vector<float> one_scale{0.01f}, deq_small(small.size());
  dequantize_fp8_blocks(small, 128, 128, one_scale, 128, 128, deq_small);
  const auto qs = fp8_linear::quantize_weight(deq_small, 128, 128);
  CHECK(qs.scales[0] != one_scale[0]);
  CHECK(qs.codes != small);
}
