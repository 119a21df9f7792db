// Paged prefill attention on Hopper's warpgroup MMAs (prefill_wgmma.cuh). A translation unit of its own: the
// kernel's 1024-byte-aligned dynamic shared memory would otherwise pad the other prefill kernels' too.
#include <atomic>
#include <cstdint>

#include "zipage/backend/cuda/attention.hpp"
#include "zipage/backend/cuda/prefill_wgmma.cuh"

namespace zipage::cuda {

bool wgmma_prefill_available() {
#if defined(ZIPAGE_CUDA_SM90A)
  // Asked before every automatic prefill launch: the answer per device is kept (bit d of `known`: device d was
  // asked; of `yes`: it runs wgmma). Devices past 63 are asked every time.
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

prefill_kernel prefill_kernel_on_device(prefill_kernel requested, int head_dim, bool fp8_kv) {
  const bool may_run =
      is_wgmma(requested) || (requested == prefill_kernel::automatic && wgmma_prefill_fits(head_dim, fp8_kv));
  return resolve_prefill_kernel(requested, head_dim, fp8_kv, may_run && wgmma_prefill_available());
}

namespace detail {

namespace {

template <auto Kernel>  // (each kernel needs its own shared-memory opt-in)
void launch(prefill_args a, int num_tokens, cuda_stream stream) {
  using cfg = prefill_wgmma_config;
  opt_in_smem<Kernel>(cfg::kSmemBytes);
  a.tokens_per_tile = cfg::kRows / a.group;
  const long long tiles = static_cast<long long>(num_tokens) / a.tokens_per_tile + a.num_seqs;
  check(tiles < (1ll << 31), "paged_prefill_attention: too many query tiles");
  const dim3 grid(static_cast<unsigned>(tiles), a.num_kv_heads);
  Kernel<<<grid, cfg::kThreads, cfg::kSmemBytes, stream>>>(a);
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_prefill_wgmma(const prefill_args& a, int num_tokens, cuda_stream stream) {
  launch<paged_prefill_wgmma_kernel<128>>(a, num_tokens, stream);
}

}  // namespace detail

}  // namespace zipage::cuda
