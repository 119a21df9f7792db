#pragma once
// Host conversions between fp32 and OCP FP8 E4M3 ("e4m3fn": 1 sign, 4 exponent bits with bias 7,
// 3 mantissa bits; no infinities; S.1111.111 is NaN, so the largest finite magnitude is 1.75 x 2^8 = 448;
// subnormals m x 2^-9). The FP8 KV cache's reference (backend/cpu/fp8_kv.hpp) and the future CUDA
// kernels' tests use these. Bit-exact with CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3):
// round to nearest, ties to even; finite overflow and +-inf saturate to +-448; NaN stays NaN (sign kept).
#include <bit>
#include <cstdint>
#include <limits>

namespace zipage {

inline constexpr float fp8_e4m3_max = 448.0f;
inline constexpr std::uint8_t fp8_e4m3_nan = 0x7f;  // also 0xff (negative sign)

// E4M3 code -> fp32, exact for every code (every E4M3 value is an fp32 value).
constexpr float fp8_e4m3_to_f32(std::uint8_t code) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(code & 0x80u) << 24;
  if ((code & 0x7fu) == 0x7fu) return std::bit_cast<float>(sign | 0x7fc00000u);
  const std::uint32_t exponent = (code >> 3) & 0xfu;
  const std::uint32_t mantissa = code & 0x7u;
  if (exponent == 0) {  // zero or subnormal: m x 2^-9
    const float magnitude = static_cast<float>(mantissa) * 0x1p-9f;
    return sign != 0 ? -magnitude : magnitude;
  }
  // Re-bias the exponent from 7 to 127 and widen the mantissa from 3 to 23 bits.
  return std::bit_cast<float>(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

// fp32 -> E4M3 code: round to nearest even, saturating (|x| >= 448 and +-inf give +-448), NaN -> 0x7f/0xff.
constexpr std::uint8_t f32_to_fp8_e4m3(float f) noexcept {
  const auto x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint8_t>((x >> 24) & 0x80u);
  const std::uint32_t magnitude_bits = x & 0x7fffffffu;
  if (magnitude_bits > 0x7f800000u) return static_cast<std::uint8_t>(sign | fp8_e4m3_nan);
  const float a = std::bit_cast<float>(magnitude_bits);
  if (a >= fp8_e4m3_max) return static_cast<std::uint8_t>(sign | 0x7eu);  // also +-inf
  // Half the smallest subnormal (2^-10) is a tie between 0 and 2^-9 and rounds to the even one, 0.
  if (a <= 0x1p-10f) return sign;
  // Here 2^-10 < a < 448, so a is a normal fp32: a = M x 2^(E - 23) with M = 1.f in 24 bits.
  const int e = static_cast<int>(magnitude_bits >> 23) - 127;  // -10 .. 8
  const std::uint32_t m = (magnitude_bits & 0x7fffffu) | 0x800000u;
  // The E4M3 quantum at this magnitude is 2^(max(e, -6) - 3): keep 3 fraction bits of a normal,
  // fewer of a subnormal. n = M / 2^shift, rounded to nearest even.
  const int shift = 20 + (e < -6 ? -6 - e : 0);  // 20 .. 24
  std::uint32_t n = m >> shift;
  const std::uint32_t rest = m & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (n & 1u))) ++n;
  if (e < -6) return static_cast<std::uint8_t>(sign | n);  // n = 8 carries into the smallest normal, 2^-6
  // Normal: n in [8, 16]; a carry to 16 becomes the next exponent's mantissa 0 through the addition.
  return static_cast<std::uint8_t>(sign | static_cast<std::uint8_t>(((e + 7) << 3) + static_cast<int>(n) - 8));
}

// Rounds x to the nearest E4M3 value (saturating), as an fp32.
constexpr float fp8_e4m3_round(float x) noexcept { return fp8_e4m3_to_f32(f32_to_fp8_e4m3(x)); }

constexpr bool fp8_e4m3_is_nan(std::uint8_t code) noexcept { return (code & 0x7fu) == 0x7fu; }

static_assert(fp8_e4m3_to_f32(0x7e) == 448.0f && fp8_e4m3_to_f32(0x01) == 0x1p-9f && fp8_e4m3_to_f32(0x08) == 0x1p-6f);
static_assert(f32_to_fp8_e4m3(1.0f) == 0x38 && f32_to_fp8_e4m3(-448.0f) == 0xfe && f32_to_fp8_e4m3(1e9f) == 0x7e);
static_assert(f32_to_fp8_e4m3(std::numeric_limits<float>::infinity()) == 0x7e);

}  // namespace zipage
