#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>

#include "zipage/cuda/device.hpp"

namespace zipage::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error so later calls start clean
    return 0;
  }
  return n;
}

std::string describe_device(int device) {
  cudaDeviceProp p{};
  if (const cudaError_t e = cudaGetDeviceProperties(&p, device); e != cudaSuccess)
    return std::string("no CUDA device: ") + cudaGetErrorString(e);
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %d SMs, %.1f GiB)", p.name, p.major, p.minor, p.multiProcessorCount,
                static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

bool current_device_runs_sm90a() {
#if defined(ZIPAGE_CUDA_SM90A)
  // Bit d of `known`: device d was asked; of `yes`: it is compute capability 9.0.
  static std::atomic<std::uint64_t> known{0}, yes{0};
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  const std::uint64_t bit = dev < 64 ? std::uint64_t{1} << dev : 0;
  if (known.load(std::memory_order_acquire) & bit) return (yes.load(std::memory_order_relaxed) & bit) != 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) return false;
  const bool runs = major == 9 && minor == 0;
  if (runs) yes.fetch_or(bit, std::memory_order_relaxed);
  known.fetch_or(bit, std::memory_order_release);
  return runs;
#else
  return false;  // the library was not built for sm_90a (CMAKE_CUDA_ARCHITECTURES)
#endif
}

}  // namespace zipage::cuda
