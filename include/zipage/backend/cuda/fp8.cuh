#pragma once
// Device side of the FP8 KV cache (docs/fp8.md): OCP E4M3 codes with one bf16 scale per (token, KV head) and side
// (core/kv_scale.hpp: kv_scale_from_amax, kv_scale_to_f32, shared with the CPU). Encoding is the hardware's SATFINITE
// conversion, bit-exact with zipage::f32_to_fp8_e4m3; decoding is exact (every E4M3 value is a half and a float).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "zipage/core/kv_scale.hpp"

namespace zipage::cuda::detail {

inline constexpr float kFp8E4m3Max = 448.0f;

__device__ __forceinline__ std::uint8_t f32_to_e4m3(float x) {
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// x's code under an fp32 `scale` (IEEE division, as the CPU's x / scale): zero codes under a zero scale. The FP8
// activations and weights (fp8_copy.cuh, fp8_gemm.cu) and the KV cache (under kv_scale_to_f32 of its bf16 scale).
__device__ __forceinline__ std::uint8_t e4m3_code(float x, float scale) {
  return scale == 0.0f ? std::uint8_t{0} : f32_to_e4m3(__fdiv_rn(x, scale));
}

// The tuned kernels' tile loaders gather each token's 2-byte scale as the aligned 4-byte word of the scale array that
// holds it (cp.async copies 4, 8 or 16 aligned bytes, and a tile's scales are strided by num_kv_heads), one word per
// token and side in the stage. Under paged_kv_view::fp8_scale_words (block_size x num_kv_heads even, the arrays
// 4-byte aligned) slot x num_kv_heads and position x num_kv_heads are equal modulo 2 (they differ by a multiple of
// block_size x num_kv_heads), so the scale's half of the word follows from the token's row in a tile (tiles start at
// even token positions) and the KV head.
__device__ __forceinline__ const void* scale_word(const std::uint16_t* p) {
  return reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(p) & ~std::uintptr_t{3});
}
// The bit offset of token row `row`'s scale in its word: 16 x ((row x num_kv_heads + kv_head) mod 2).
__device__ __forceinline__ int scale_shift(int row, int num_kv_heads, int kv_head) {
  return ((row * num_kv_heads + kv_head) & 1) << 4;
}
// The scale a gathered word holds at bit offset `shift` (0 or 16), as an fp32 (kv_scale_to_f32: the bf16's bits in
// the top half).
__device__ __forceinline__ float scale_in_word(std::uint32_t word, int shift) {
  return __uint_as_float((word << (16 - shift)) & 0xffff0000u);
}

__device__ __forceinline__ float e4m3_to_f32(std::uint8_t code) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
  return __half2float(__half(h));
}

// Two codes (low byte first) -> two floats.
__device__ __forceinline__ float2 e4m3x2_to_f32x2(std::uint16_t codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes), __NV_E4M3);
  return __half22float2(__half2(h));
}

// Four codes (bytes of w, low first) -> two half2 words, exactly: lo = (byte 0, byte 1), hi = (byte 2, byte 3),
// the lower byte in the lower half. One cvt.rn.f16x2.e4m3x2 per two codes.
__device__ __forceinline__ void e4m3x4_to_f16x4(std::uint32_t w, std::uint32_t& lo, std::uint32_t& hi) {
  asm("{\n"
      "  .reg .b16 a, b;\n"
      "  mov.b32 {a, b}, %2;\n"
      "  cvt.rn.f16x2.e4m3x2 %0, a;\n"
      "  cvt.rn.f16x2.e4m3x2 %1, b;\n"
      "}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}

}  // namespace zipage::cuda::detail
