// Paged prefill attention on Hopper's warpgroup MMAs (prefill_wgmma.cuh). A translation unit of its own: the
// kernel's 1024-byte-aligned dynamic shared memory would otherwise pad the other prefill kernels' too.
#include <cstdint>

#include "zipage/backend/cuda/attention.hpp"
#include "zipage/backend/cuda/prefill_wgmma.cuh"
#include "zipage/cuda/device.hpp"

namespace zipage::cuda {

bool wgmma_prefill_available() { return current_device_runs_sm90a(); }

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
