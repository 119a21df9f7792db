// Paged prefill attention on Hopper's warpgroup MMAs (prefill_wgmma.cuh). A translation unit of its own: the
// kernel's 1024-byte-aligned dynamic shared memory would otherwise pad the other prefill kernels' too.
#include <atomic>
#include <cstdint>

#include "zipage/backend/cuda/attention.hpp"
#include "zipage/backend/cuda/prefill_wgmma.cuh"

namespace zipage::cuda {

bool wgmma_prefill_available() {
#if defined(ZIPAGE_CUDA_SM90A)
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) return false;
  return major == 9 && minor == 0;
#else
  return false;  // the library was not built for sm_90a (CMAKE_CUDA_ARCHITECTURES)
#endif
}

namespace detail {

namespace {

template <bool PIPELINED>
void launch(prefill_args a, int num_tokens, cuda_stream stream) {
  using cfg = prefill_wgmma_config<PIPELINED>;
  constexpr auto kernel = paged_prefill_wgmma_kernel<cfg::kD, PIPELINED>;
  static std::atomic<std::uint64_t> done{0};
  int dev = 0;
  ZIPAGE_CUDA_CHECK(cudaGetDevice(&dev));
  const std::uint64_t bit = std::uint64_t{1} << (dev & 63);
  if (!(done.load(std::memory_order_acquire) & bit)) {
    ZIPAGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, cfg::kSmemBytes));
    done.fetch_or(bit, std::memory_order_release);
  }
  a.tokens_per_tile = cfg::kRows / a.group;
  const long long tiles = static_cast<long long>(num_tokens) / a.tokens_per_tile + a.num_seqs;
  check(tiles < (1ll << 31), "paged_prefill_attention: too many query tiles");
  const dim3 grid(static_cast<unsigned>(tiles), a.num_kv_heads);
  kernel<<<grid, cfg::kThreads, cfg::kSmemBytes, stream>>>(a);
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_prefill_wgmma(const prefill_args& a, int num_tokens, bool pipelined, cuda_stream stream) {
  pipelined ? launch<true>(a, num_tokens, stream) : launch<false>(a, num_tokens, stream);
}

}  // namespace detail

}  // namespace zipage::cuda
