#pragma once
// Host conversions between fp32 and the 16-bit float formats of model files (IEEE binary16 and
// bfloat16), shared by the GGUF and safetensors readers and writers and by the tests.
#include <bit>
#include <cstdint>

namespace zipage {

// IEEE binary16 -> binary32; exact for every input (subnormals, signed zeros, inf, NaN payloads).
inline float fp16_to_f32(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) {
    // Re-bias the exponent from 15 to 127.
    return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  }
  // Zero or subnormal: mantissa x 2^-24, exactly representable as a normal float.
  const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
  return sign != 0 ? -magnitude : magnitude;
}

// bfloat16 is the top half of a binary32, so widening is a shift.
inline float bf16_to_f32(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

// fp32 -> IEEE binary16. Overflow gives +-inf, tiny values become subnormals or +-0, NaN stays
// a (quiet) NaN.
inline std::uint16_t f32_to_fp16(float f) noexcept {
  const auto x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t exponent = (x >> 23) & 0xffu;
  std::uint32_t mantissa = x & 0x7fffffu;
  if (exponent == 0xff) {  // inf, or NaN with its top payload bits and the quiet bit set
    return static_cast<std::uint16_t>(sign | 0x7c00u | (mantissa ? 0x200u | (mantissa >> 13) : 0u));
  }
  const int e = static_cast<int>(exponent) - 127 + 15;  // re-biased exponent
  if (e >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    // Subnormal half: value = m24 x 2^(exponent-150) = h x 2^-24, so h = m24 >> (14 - e).
    // Below 2^-25 (e < -10) everything rounds to zero.
    if (e < -10) return sign;
    mantissa |= 0x800000u;  // the implicit leading one
    const auto shift = static_cast<std::uint32_t>(14 - e);
    std::uint32_t h = mantissa >> shift;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (h & 1u))) ++h;  // may carry into the smallest normal
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = (static_cast<std::uint32_t>(e) << 10) | (mantissa >> 13);
  const std::uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry may reach inf: correct
  return static_cast<std::uint16_t>(sign | h);
}

// fp32 -> bfloat16 (the top 16 bits, rounded). NaN stays a quiet NaN; overflow gives inf.
inline std::uint16_t f32_to_bf16(float f) noexcept {
  const auto x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>((x + rounding) >> 16);
}

}  // namespace zipage
