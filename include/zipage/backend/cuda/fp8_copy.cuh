#pragma once
// Device helpers that write an fp8_copy (ops.hpp): the FP8 codes and per-(token, 128-column group) scales of bf16
// rows, byte for byte what fp8::quantize_activations' scalar kernel writes. Used by the tuned elementwise kernels
// (elementwise.cuh: the copy beside their output) and by the vectorised activation quantisation (src/cuda/fp8_gemm.cu).
#include <cstdint>

#include "zipage/backend/cuda/common.cuh"
#include "zipage/backend/cuda/fp8.cuh"
#include "zipage/backend/cuda/ops.hpp"  // fp8_copy

namespace zipage::cuda::detail {

// ---- fp8_copy (ops.hpp): the FP8 codes and scale of 8 bf16 outputs at column c of a row, as
// fp8::quantize_activations computes them from those outputs. The 16 threads holding a 128-column group are the
// consecutive lanes of one half-warp, active together (the callers' rows are whole groups), and share its amax.
__device__ __forceinline__ void store_fp8_copy8(const fp8_copy& q, std::int64_t row, int cols, int c, const uint4& packed) {
  float f[8];
  bf16x8_to_float(packed, f);
  float amax = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(f[e]));
  const unsigned half_warp = 0xffffu << (threadIdx.x & 16);
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(half_warp, amax, o));
  const float scale = __fdiv_rn(amax, kFp8E4m3Max);
  std::uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    lo |= std::uint32_t{e4m3_code(f[e], scale)} << (8 * e);
    hi |= std::uint32_t{e4m3_code(f[e + 4], scale)} << (8 * e);
  }
  *reinterpret_cast<uint2*>(q.codes + row * cols + c) = make_uint2(lo, hi);
  if ((threadIdx.x & 15) == 0) q.scales[std::int64_t{c / 128} * q.padded + row] = scale;
}
// A padding row's (row >= the op's rows): zero codes and scale, so the GEMM's padding rows stay finite.
__device__ __forceinline__ void zero_fp8_copy8(const fp8_copy& q, std::int64_t row, int cols, int c) {
  *reinterpret_cast<uint2*>(q.codes + row * cols + c) = make_uint2(0, 0);
  if ((threadIdx.x & 15) == 0) q.scales[std::int64_t{c / 128} * q.padded + row] = 0.0f;
}

}  // namespace zipage::cuda::detail
