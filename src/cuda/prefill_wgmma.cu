// Paged prefill attention on Hopper's warpgroup MMAs (prefill_wgmma.cuh). A translation unit of its own: the
// kernel's 1024-byte-aligned dynamic shared memory would otherwise pad the other prefill kernels' too.
#include <algorithm>
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

// (The kernel is a template argument: kernels that share a Config still each need their own shared-memory opt-in.)
// Persistent: one CTA per SM, each walking through work items (ws_protocol::persistent_item); otherwise one CTA per
// item.
template <class Config, auto Kernel>
void launch(prefill_args a, int num_tokens, bool persistent, cuda_stream stream) {
  opt_in_smem<Kernel>(Config::kSmemBytes);
  a.tokens_per_tile = Config::kRows / a.group;
  const long long tiles = static_cast<long long>(num_tokens) / a.tokens_per_tile + a.num_seqs;
  const long long items = tiles * a.num_kv_heads;
  check(items < (1ll << 30), "paged_prefill_attention: too many query tiles");
  const long long ctas = persistent ? std::min<long long>(items, device_multiprocessors()) : items;
  Kernel<<<static_cast<unsigned>(ctas), Config::kThreads, Config::kSmemBytes, stream>>>(a);
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_prefill_wgmma(const prefill_args& a, int num_tokens, prefill_kernel kernel, cuda_stream stream) {
  using ws128 = prefill_wgmma_ws_config<2>;
  using ws64 = prefill_wgmma_ws_config<1>;
  constexpr auto k128 = paged_prefill_wgmma_ws_kernel<128, 2, false>;
  constexpr auto k64_overlap = paged_prefill_wgmma_ws_kernel<128, 1, true>;
  switch (kernel) {
    case prefill_kernel::wgmma: launch<ws128, k128>(a, num_tokens, true, stream); break;
    case prefill_kernel::wgmma_overlap: launch<ws64, k64_overlap>(a, num_tokens, true, stream); break;
    case prefill_kernel::wgmma_ws128: launch<ws128, k128>(a, num_tokens, false, stream); break;
    case prefill_kernel::wgmma_ws_overlap: launch<ws64, k64_overlap>(a, num_tokens, false, stream); break;
    default: check(false, "launch_prefill_wgmma: not a wgmma kernel: ", to_string(kernel));
  }
}

}  // namespace detail

}  // namespace zipage::cuda
