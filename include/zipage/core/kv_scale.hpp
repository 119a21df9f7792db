#pragma once
// The FP8 KV cache's per-(token, KV head) scale (docs/fp8.md, "Format"): a bf16, stored as its 16 bits
// (std::uint16_t), shared by the CPU reference (backend/cpu/fp8_kv.hpp) and the CUDA kernels (backend/cuda/fp8.cuh
// and everything that reads a scale). Host and device: constexpr, and __host__ __device__ in a CUDA translation unit
// (ZIPAGE_HOST_DEVICE; no CUDA header here).
//
//   encode     from the head's amax = max |x| over its head_dim values (NaN if any value is NaN):
//              s = bf16_rne(amax / 448), the IEEE fp32 quotient (plain / on the CPU, __fdiv_rn on the GPU, no
//              fast-math) rounded to bf16, to nearest, ties to even. So the fp32 scale of the cache before it
//              (amax / 448) rounded to bf16, with its semantics: amax 0 -> 0; NaN -> NaN (0x7fc0); inf -> inf
//              (0x7f80); a quotient that rounds to bf16 0 (amax below ~2^-125) -> 0.
//   codes      code[i] = e4m3_satfinite(x[i] / s) (IEEE division) for s != 0; zero codes for s == 0. The rounded
//              s may be up to 2^-8 relative below amax / 448, so x / s may exceed 448 by up to 0.4%: the SATFINITE
//              conversion clamps it to 448 (E4M3 rounding to nearest would give 448 for it anyway). A NaN scale
//              gives NaN codes, an infinite one zero codes (and NaN for an infinite value): every value read back
//              from such a head is NaN, as the fp32 cache would carry the NaN / inf into attention.
//   read       x'[i] = float(code[i]) * float(s), float(s) exact (the bf16 bits << 16).
//
// bf16 keeps 8 significant bits, so s is within 2^-8 (0.4%) of amax / 448 and amax / s within [446.2, 449.8]: the
// largest magnitude of a head always gets code +-448 and reads back as 448 s, within 0.4% of amax (for a normal s,
// i.e. amax above ~5e-36; a subnormal bf16 has fewer bits). The E8M0 power-of-two scale this replaced left it
// anywhere in (224, 448], with E4M3's rounding error (docs/fp8.md: measured and rejected).
#include <bit>
#include <cstdint>
#include <type_traits>

#include "zipage/core/host_device.hpp"

namespace zipage {

inline constexpr std::uint16_t kv_scale_zero = 0x0000;  // scale 0: an all-zero head (or one that underflows)
inline constexpr std::uint16_t kv_scale_inf = 0x7f80;   // a head with an infinite value (and no NaN)
inline constexpr std::uint16_t kv_scale_nan = 0x7fc0;   // a head with a NaN (the canonical quiet NaN)
inline constexpr float kv_scale_fp8_max = 448.0f;       // the largest finite E4M3 magnitude

// The scale a bf16's bits stand for (exact: bf16 is the top half of an fp32).
ZIPAGE_HOST_DEVICE constexpr float kv_scale_to_f32(std::uint16_t s) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(s) << 16);
}

// An fp32 rounded to bf16, to nearest, ties to even (subnormals included: the bit pattern's rounding is exact for
// them too; a finite value rounds to inf only from above the largest bf16); any NaN -> kv_scale_nan.
ZIPAGE_HOST_DEVICE constexpr std::uint16_t kv_scale_round(float x) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return kv_scale_nan;
  return static_cast<std::uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// amax / 448 in IEEE fp32 (round to nearest): __fdiv_rn in device code, whatever the division flags; `/` on the
// host and in constant evaluation (the same correctly rounded quotient).
ZIPAGE_HOST_DEVICE constexpr float kv_scale_quotient(float amax) noexcept {
#if defined(__CUDA_ARCH__)
  if (!std::is_constant_evaluated()) return __fdiv_rn(amax, kv_scale_fp8_max);
#endif
  return amax / kv_scale_fp8_max;
}

// The scale of a head whose largest magnitude is amax (>= 0 or NaN; the sign bit is ignored): bf16_rne(amax / 448).
ZIPAGE_HOST_DEVICE constexpr std::uint16_t kv_scale_from_amax(float amax) noexcept {
  return kv_scale_round(kv_scale_quotient(std::bit_cast<float>(std::bit_cast<std::uint32_t>(amax) & 0x7fffffffu)));
}

static_assert(kv_scale_to_f32(0x3f80) == 1.0f && kv_scale_to_f32(kv_scale_zero) == 0.0f);
static_assert(kv_scale_to_f32(kv_scale_nan) != kv_scale_to_f32(kv_scale_nan));
static_assert(kv_scale_to_f32(kv_scale_inf) == std::bit_cast<float>(0x7f800000u));
// Rounding: exact bf16 values stay; halfway cases go to the even neighbour; just above halfway rounds up.
static_assert(kv_scale_round(1.0f) == 0x3f80 && kv_scale_round(1.0f + 0x1p-8f) == 0x3f80);
static_assert(kv_scale_round(1.0f + 0x1p-7f + 0x1p-8f) == 0x3f82);
static_assert(kv_scale_round(1.0f + 0x1p-8f + 0x1p-23f) == 0x3f81);
// 448 -> 1; 1.0 -> bf16(1 / 448) = 0x3b12 (1.140625 x 2^-9, 0.2% below 1 / 448); 0 -> 0; inf -> inf; tiny -> 0.
static_assert(kv_scale_from_amax(448.0f) == 0x3f80 && kv_scale_from_amax(1.0f) == 0x3b12);
static_assert(kv_scale_from_amax(0.0f) == kv_scale_zero && kv_scale_from_amax(-0.0f) == kv_scale_zero);
static_assert(kv_scale_from_amax(std::bit_cast<float>(0x7f800000u)) == kv_scale_inf);
// (NaN and the underflow to 0 are tested in tests/unit/test_fp8_kv.cpp: clang's constant evaluation refuses a
// division giving NaN, nvcc's one that underflows.)
static_assert(kv_scale_from_amax(3.4e38f) == 0x7b12);

}  // namespace zipage
