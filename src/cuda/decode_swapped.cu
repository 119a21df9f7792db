// The swapped-operand FP8 decode kernel's launcher (decode_swapped.cuh; attention.hpp says what it takes).
#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>

#include "launch_checks.hpp"
#include "zipage/backend/cuda/attention.hpp"
#include "zipage/backend/cuda/decode_swapped.cuh"
#include "zipage/cuda/device.hpp"

namespace zipage::cuda {

bool decode_swapped_supported(const decode_params& p) {
  const int kvh = p.kv.num_kv_heads;
  const int bs = p.kv.block_size;
  return p.kv.k_scale != nullptr && p.kv.v_scale != nullptr && p.kv.fp8_scale_words() && p.kv.head_dim == 128 &&
         kvh > 0 && p.num_q_heads > 0 &&
         p.num_q_heads % kvh == 0 && p.num_q_heads / kvh <= 8 && bs >= 2 && (bs & (bs - 1)) == 0 &&
         p.num_seqs >= 0 && p.num_seqs <= 65535 && kvh <= 65535;
}

void paged_decode_attention_swapped(const decode_params& p, cuda_stream stream, int stages, fp8_decode_kernel kernel) {
  check(decode_swapped_supported(p), "paged_decode_attention_swapped: needs FP8 K/V (k_scale and v_scale, "
        "paged_kv_view::fp8_scale_words), head_dim 128 (got ", p.kv.head_dim, "), at most 8 query heads per KV head "
        "(got ", p.num_q_heads, " / ", p.kv.num_kv_heads, ") and a power-of-two block size (got ", p.kv.block_size,
        ")");
  check(stages == 0 || stages == 3 || stages == 4, "paged_decode_attention_swapped: stages ", stages,
        " (3, 4, or 0 for the default 3)");
  check(is_swapped(kernel), "paged_decode_attention_swapped: kernel ", to_string(kernel),
        " (swapped or swapped_e4m3_qk)");
  if (p.out_fp8.wanted()) detail::check_fp8_copy("paged_decode_attention_swapped", p.out_fp8, p.num_seqs);
  if (p.append.wanted())
    check(p.append.v != nullptr && p.append.slots != nullptr && p.append.k_stride % 8 == 0 &&
              p.append.v_stride % 8 == 0 && p.append.k_stride >= std::int64_t{p.kv.num_kv_heads} * 128 &&
              p.append.v_stride >= std::int64_t{p.kv.num_kv_heads} * 128 &&
              reinterpret_cast<std::uintptr_t>(p.append.k) % 16 == 0 &&
              reinterpret_cast<std::uintptr_t>(p.append.v) % 16 == 0,
          "paged_decode_attention_swapped: append needs k, v and slots, strides of whole 8-element vectors covering "
          "the KV heads (got ", p.append.k_stride, " / ", p.append.v_stride, ") and 16-byte aligned k / v");
  if (p.num_seqs == 0) return;
  namespace d = detail;
  const d::decode_args a = d::make_decode_args(p, 1, 0);  // head_chunks is unused: grid.y is the KV head
  const dim3 grid(1, static_cast<unsigned>(p.kv.num_kv_heads), static_cast<unsigned>(p.num_seqs));
  if (kernel == fp8_decode_kernel::swapped_e4m3_qk) {
    check(stages == 0 || stages == d::kSwappedWgmmaStages, "paged_decode_attention_swapped: swapped_e4m3_qk runs ",
          d::kSwappedWgmmaStages, " stages (got ", stages, ")");
    check(current_device_runs_sm90a(), "paged_decode_attention_swapped: swapped_e4m3_qk needs wgmma (an sm_90a build "
          "on a compute-capability-9.0 device)");
    constexpr int S = d::kSwappedWgmmaStages;
    d::opt_in_smem<d::paged_decode_swapped_wgmma_kernel<S>>(d::kSwappedWgmmaSmemBytes);
    d::paged_decode_swapped_wgmma_kernel<S><<<grid, 128, d::kSwappedWgmmaSmemBytes, stream>>>(a);
    ZIPAGE_CUDA_CHECK_LAUNCH();
    return;
  }
  auto run = [&]<int S>() {
    d::opt_in_smem<d::paged_decode_swapped_kernel<S>>(d::kSwappedSmemBytes<S>);
    d::paged_decode_swapped_kernel<S><<<grid, 128, d::kSwappedSmemBytes<S>, stream>>>(a);
  };
  if (stages == 4) run.template operator()<4>();
  else run.template operator()<d::kSwappedStages>();
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

double decode_swapped_waves(const decode_params& p) {
  static std::mutex mu;
  static std::array<int, 64> per_sm{};  // by device
  int dev = 0;
  ZIPAGE_CUDA_CHECK(cudaGetDevice(&dev));
  int ctas_per_sm = 0;
  {
    std::lock_guard lock(mu);
    if (dev < 64) ctas_per_sm = per_sm[std::size_t(dev)];
    if (ctas_per_sm == 0) {
      namespace d = detail;
      constexpr int S = d::kSwappedStages;
      d::opt_in_smem<d::paged_decode_swapped_kernel<S>>(d::kSwappedSmemBytes<S>);
      ZIPAGE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, d::paged_decode_swapped_kernel<S>,
                                                                      128, d::kSwappedSmemBytes<S>));
      ctas_per_sm = std::max(1, ctas_per_sm);
      if (dev < 64) per_sm[std::size_t(dev)] = ctas_per_sm;
    }
  }
  const double slots = double(ctas_per_sm) * detail::device_multiprocessors();
  return double(p.num_seqs) * p.kv.num_kv_heads / slots;
}

}  // namespace zipage::cuda
