#pragma once
// Device helpers that write an fp8_copy (fp8_copy.hpp): the FP8 codes and per-(token, 128-column group) scales of bf16
// rows, byte for byte what fp8::quantize_activations' scalar kernel writes. Used by the tuned elementwise kernels
// (elementwise.cuh: the copy beside their output), the decode attention kernel (decode_kernel.cuh: the o
// projection's input) and the vectorised activation quantisation (src/cuda/fp8_gemm.cu).
#include <cstdint>

#include "zipage/backend/cuda/common.cuh"
#include "zipage/backend/cuda/fp8.cuh"
#include "zipage/backend/cuda/fp8_copy.hpp"

namespace zipage::cuda::detail {

// The scale of a 128-column group of a row, from this thread's 8 values of it (already rounded to bf16, as
// fp8::quantize_activations reads them): amax / 448 over the group. The 16 threads holding the group are the
// consecutive lanes of one half-warp, active together (the callers' rows are whole groups), and share its amax.
__device__ __forceinline__ float fp8_group_scale(const float (&f)[8]) {
  float amax = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(f[e]));
  const unsigned half_warp = 0xffffu << (threadIdx.x & 16);
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(half_warp, amax, o));
  return __fdiv_rn(amax, kFp8E4m3Max);
}

// ---- fp8_copy (fp8_copy.hpp): the FP8 codes and scale of 8 bf16 outputs at column c of a row, as
// fp8::quantize_activations computes them from those outputs.
__device__ __forceinline__ void store_fp8_copy8(const fp8_copy& q, std::int64_t row, int cols, int c, const uint4& packed) {
  float f[8];
  bf16x8_to_float(packed, f);
  const float scale = fp8_group_scale(f);
  std::uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    lo |= std::uint32_t{e4m3_code(f[e], scale)} << (8 * e);
    hi |= std::uint32_t{e4m3_code(f[e + 4], scale)} << (8 * e);
  }
  *reinterpret_cast<uint2*>(q.codes + row * cols + c) = make_uint2(lo, hi);
  if ((threadIdx.x & 15) == 0) q.scales[std::int64_t{c / 128} * q.padded + row] = scale;
}

// The same for 8 outputs at columns group + 16 i + c (i = 0..7) of a 128-column group starting at `group`, c = the
// lane's index in its half-warp: the FP8 decode kernel's output order (decode_kernel.cuh). f: the outputs as
// rounded to bf16. Per store instruction the half-warp writes 16 consecutive bytes.
__device__ __forceinline__ void store_fp8_copy_strided8(const fp8_copy& q, std::int64_t row, int cols, int group,
                                                        const float (&f)[8]) {
  const int c = threadIdx.x & 15;
  const float scale = fp8_group_scale(f);
  std::uint8_t* dst = q.codes + row * cols + group + c;
#pragma unroll
  for (int i = 0; i < 8; ++i) dst[16 * i] = e4m3_code(f[i], scale);
  if (c == 0) q.scales[std::int64_t{group / 128} * q.padded + row] = scale;
}

// A padding row's (row >= the op's rows): zero codes and scale, so the GEMM's padding rows stay finite.
__device__ __forceinline__ void zero_fp8_copy8(const fp8_copy& q, std::int64_t row, int cols, int c) {
  *reinterpret_cast<uint2*>(q.codes + row * cols + c) = make_uint2(0, 0);
  if ((threadIdx.x & 15) == 0) q.scales[std::int64_t{c / 128} * q.padded + row] = 0.0f;
}

// The padding rows [rows, q.padded) of a copy of `cols` columns, zeroed by one CTA (all its threads).
__device__ __forceinline__ void zero_fp8_copy_padding(const fp8_copy& q, int rows, int cols) {
  const int pad = q.padded - rows;
  for (int i = threadIdx.x; i < pad * (cols / 8); i += blockDim.x)
    *reinterpret_cast<uint2*>(q.codes + std::int64_t{rows} * cols + std::int64_t{i} * 8) = make_uint2(0, 0);
  for (int i = threadIdx.x; i < pad * (cols / 128); i += blockDim.x)
    q.scales[std::int64_t{i / pad} * q.padded + rows + i % pad] = 0.0f;
}

}  // namespace zipage::cuda::detail
