#pragma once
// Shared by the CUDA kernels: error checking and the few PTX wrappers the attention kernels use
// (cp.async, ldmatrix, bf16 mma.sync, ex2). Device code only compiles under nvcc.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "zipage/core/error.hpp"

namespace zipage::cuda::detail {

[[noreturn]] inline void cuda_fail(cudaError_t e, const char* what, const char* file, int line) {
  fail("CUDA error ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ") in ", what, " at ", file, ":", line);
}

}  // namespace zipage::cuda::detail

// Throws zipage::error when a CUDA runtime call fails.
#define ZIPAGE_CUDA_CHECK(expr)                                                           \
  do {                                                                                    \
    const cudaError_t zipage_cuda_err_ = (expr);                                          \
    if (zipage_cuda_err_ != cudaSuccess)                                                  \
      ::zipage::cuda::detail::cuda_fail(zipage_cuda_err_, #expr, __FILE__, __LINE__);     \
  } while (0)

// After a <<<...>>> launch: throws on a launch error (bad configuration, too much shared memory...).
#define ZIPAGE_CUDA_CHECK_LAUNCH() ZIPAGE_CUDA_CHECK(cudaGetLastError())

namespace zipage::cuda::detail {

using bf16 = __nv_bfloat16;

// Dynamic shared memory above 48 KB needs an opt-in per kernel and device: raises Kernel's limit to `bytes` once per
// device (a template argument, so that the record of devices done is one per kernel).
template <auto Kernel>
void opt_in_smem(int bytes) {
  static std::atomic<std::uint64_t> done{0};
  int dev = 0;
  ZIPAGE_CUDA_CHECK(cudaGetDevice(&dev));
  const std::uint64_t bit = std::uint64_t{1} << (dev & 63);
  if (done.load(std::memory_order_acquire) & bit) return;
  ZIPAGE_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.fetch_or(bit, std::memory_order_release);
}

inline int device_multiprocessors() {
  int dev = 0;
  ZIPAGE_CUDA_CHECK(cudaGetDevice(&dev));
  int sms = 0;
  ZIPAGE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global->shared copy that bypasses L1; when !valid, nothing is read and zeros are written.
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
// 4-byte global->shared copy (through L1: .cg takes 16 bytes only); when !valid, zeros are written.
__device__ __forceinline__ void cp_async_4(std::uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a * b for one m16n8k16 tile: bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> packed bf16x2 (lo in the low half), round to nearest even.
__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 8 bf16 (one 16-byte vector) <-> 8 floats.
__device__ __forceinline__ void bf16x8_to_float(const uint4& v, float (&f)[8]) {
  const std::uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ uint4 float_to_bf16x8(const float (&f)[8]) {
  return make_uint4(pack_bf16(f[0], f[1]), pack_bf16(f[2], f[3]), pack_bf16(f[4], f[5]), pack_bf16(f[6], f[7]));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace zipage::cuda::detail
