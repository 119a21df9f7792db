// FP8 linear layers (include/zipage/backend/cuda/fp8_gemm.hpp): block quantisation of a weight at load and
// per-token, per-128-column-group quantisation of activations before each FP8 GEMM. Both follow the CPU
// reference (core/fp8_linear.hpp) bit for bit: IEEE divisions (__fdiv_rn: this file must not rely on
// --use_fast_math turning `/` into an approximation) and the SATFINITE round-to-nearest-even conversion.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "launch_checks.hpp"
#include "reference_common.cuh"
#include "zipage/backend/cuda/common.cuh"
#include "zipage/backend/cuda/fp8.cuh"
#include "zipage/backend/cuda/fp8_copy.cuh"
#include "zipage/backend/cuda/fp8_gemm.hpp"

namespace zipage::cuda::fp8 {

namespace {

constexpr int kBlock = 128;

// One CTA of 256 threads per 128x128 block (blockIdx.x: column block, blockIdx.y: row block); the padding
// scales of a row of blocks are written by its CTAs past the last column block (gridDim.x = scale ld).
template <class T>
__global__ void quantize_weight_kernel(const T* __restrict__ w, int rows, int cols, std::uint8_t* __restrict__ codes,
                                       float* __restrict__ scales, int ld) {
  const int bc = blockIdx.x, br = blockIdx.y;
  const int c0 = bc * kBlock, r0 = br * kBlock;
  if (c0 >= cols) {  // padding column of the scale matrix
    if (threadIdx.x == 0) scales[static_cast<std::int64_t>(br) * ld + bc] = 0.0f;
    return;
  }
  const int nr = min(kBlock, rows - r0), nc = min(kBlock, cols - c0);
  float amax = 0.0f;
  for (int i = threadIdx.x; i < nr * nc; i += blockDim.x)
    amax = fmaxf(amax, fabsf(load_f(w, static_cast<std::int64_t>(r0 + i / nc) * cols + c0 + i % nc)));
  __shared__ float part[8];
  amax = detail::warp_max(amax);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = part[0];
  for (int i = 1; i < static_cast<int>(blockDim.x >> 5); ++i) amax = fmaxf(amax, part[i]);
  const float scale = __fdiv_rn(amax, detail::kFp8E4m3Max);
  if (threadIdx.x == 0) scales[static_cast<std::int64_t>(br) * ld + bc] = scale;
  for (int i = threadIdx.x; i < nr * nc; i += blockDim.x) {
    const std::int64_t at = static_cast<std::int64_t>(r0 + i / nc) * cols + c0 + i % nc;
    codes[at] = detail::e4m3_code(load_f(w, at), scale);
  }
}

// One warp per (token, group): each lane reads 4 values of the group (coalesced), the warp reduces amax.
template <class T>
__global__ void quantize_activations_kernel(const T* __restrict__ x, int rows, int padded, int cols, int groups,
                                            std::uint8_t* __restrict__ codes, float* __restrict__ scales) {
  const std::int64_t warp = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp >= static_cast<std::int64_t>(padded) * groups) return;
  const int r = static_cast<int>(warp / groups), g = static_cast<int>(warp % groups);
  const int c0 = g * kBlock, nc = min(kBlock, cols - c0);
  const std::int64_t base = static_cast<std::int64_t>(r) * cols + c0;
  if (r >= rows) {  // padding token: zero codes and scale, so the GEMM's padding rows stay finite
    for (int j = lane; j < nc; j += 32) codes[base + j] = 0;
    if (lane == 0) scales[static_cast<std::int64_t>(g) * padded + r] = 0.0f;
    return;
  }
  float v[kBlock / 32];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kBlock / 32; ++i) {
    const int j = lane + 32 * i;
    v[i] = j < nc ? load_f(x, base + j) : 0.0f;
    amax = fmaxf(amax, fabsf(v[i]));
  }
  amax = detail::warp_max(amax);
  const float scale = __fdiv_rn(amax, detail::kFp8E4m3Max);
#pragma unroll
  for (int i = 0; i < kBlock / 32; ++i) {
    const int j = lane + 32 * i;
    if (j < nc) codes[base + j] = detail::e4m3_code(v[i], scale);
  }
  if (lane == 0) scales[static_cast<std::int64_t>(g) * padded + r] = scale;
}

// bf16 rows of whole 128-column groups: a thread per 16-byte chunk, the 16 threads of a group in one half-warp
// (store_fp8_copy8: the scalar kernel's amax, division and conversion, so the same bytes), padding rows zeroed.
// The scalar kernel reads 2 bytes per lane and reached ~1 TB/s on the H200's 4,096-wide rows (op timing, 2026-12-02).
__global__ void quantize_bf16_rows_kernel(const __nv_bfloat16* __restrict__ x, int rows, int cols, fp8_copy q) {
  const int chunks = cols / 8;
  const std::int64_t total = std::int64_t{q.padded} * chunks;
  const std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= total) return;  // whole half-warps: total is a multiple of 16
  const std::int64_t r = i / chunks;
  const int c = static_cast<int>(i % chunks) * 8;
  if (r >= rows)
    detail::zero_fp8_copy8(q, r, cols, c);
  else
    detail::store_fp8_copy8(q, r, cols, c, *reinterpret_cast<const uint4*>(x + r * cols + c));
}

}  // namespace

void quantize_weight_blocks(cuda_dtype t, const void* w, int rows, int cols, std::uint8_t* codes, float* scales,
                            cuda_stream stream) {
  if (rows <= 0 || cols <= 0) return;
  const int ld = weight_scale_ld(cols);
  const dim3 grid(static_cast<unsigned>(ld), static_cast<unsigned>((rows + kBlock - 1) / kBlock));
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  dispatch(t, [&]<class T>() {
    quantize_weight_kernel<<<grid, 256, 0, s>>>(static_cast<const T*>(w), rows, cols, codes, scales, ld);
  });
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void quantize_activations(cuda_dtype t, const void* x, int rows, int padded, int cols, std::uint8_t* codes,
                          float* scales, cuda_stream stream) {
  if (padded <= 0 || cols <= 0) return;
  const int groups = (cols + kBlock - 1) / kBlock;
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  if (t == cuda_dtype::bf16 && cols % kBlock == 0 && detail::aligned16(x) && detail::aligned(codes, 8)) {
    const std::int64_t threads = static_cast<std::int64_t>(padded) * (cols / 8);
    quantize_bf16_rows_kernel<<<static_cast<unsigned>((threads + 255) / 256), 256, 0, s>>>(
        static_cast<const __nv_bfloat16*>(x), rows, cols, fp8_copy{codes, scales, padded});
    ZIPAGE_CUDA_CHECK_LAUNCH();
    return;
  }
  const std::int64_t threads = static_cast<std::int64_t>(padded) * groups * 32;
  const auto blocks = static_cast<unsigned>((threads + 255) / 256);
  dispatch(t, [&]<class T>() {
    quantize_activations_kernel<<<blocks, 256, 0, s>>>(static_cast<const T*>(x), rows, padded, cols, groups, codes,
                                                       scales);
  });
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace zipage::cuda::fp8
