#pragma once
// Private to src/cuda/: what the any-shape kernels (reference_ops.cu, reference_attention.cu, fp8_gemm.cu)
// share — element loads and stores in fp32 arithmetic, a grid size, the f32/bf16 dispatch, and the
// grid-stride loop.
#include <algorithm>
#include <cstdint>

#include "zipage/backend/cuda/common.cuh"
#include "zipage/backend/cuda/dtype.hpp"

namespace zipage::cuda {

namespace {

using detail::bf16;

__device__ __forceinline__ float load_f(const float* p, std::int64_t i) { return p[i]; }
__device__ __forceinline__ float load_f(const bf16* p, std::int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void store_f(float* p, std::int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store_f(bf16* p, std::int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

inline unsigned grid_for(std::int64_t items, int threads) {
  static const int sms = detail::device_multiprocessors();
  const std::int64_t blocks = (items + threads - 1) / threads;
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min<std::int64_t>(blocks, std::int64_t{sms} * 32)));
}

// Calls f.template operator()<T>() with T = float or bf16. An e4m3 tensor (an FP8 linear weight, which only
// linear() reads) is refused here, so every op but linear names the mistake instead of reading codes as bf16.
template <class F>
void dispatch(cuda_dtype t, F&& f) {
  if (t == cuda_dtype::f32)
    f.template operator()<float>();
  else if (t == cuda_dtype::bf16)
    f.template operator()<bf16>();
  else
    fail("CUDA op on an ", to_string(t), " tensor: only linear() takes FP8 (e4m3) weights; other ops need f32 or bf16");
}

#define GRID_STRIDE(i, n) \
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < (n); i += std::int64_t{gridDim.x} * blockDim.x)

}  // namespace

}  // namespace zipage::cuda
