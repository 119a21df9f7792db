// The swapped-operand FP8 decode kernel's launcher (decode_swapped.cuh; attention.hpp says what it takes).
#include <algorithm>
#include <array>
#include <mutex>

#include "launch_checks.hpp"
#include "tensor_map.hpp"
#include "zipage/backend/cuda/attention.hpp"
#include "zipage/backend/cuda/decode_swapped.cuh"
#include "zipage/cuda/device.hpp"

namespace zipage::cuda {

bool decode_swapped_supported(const decode_params& p) {
  const int kvh = p.kv.num_kv_heads;
  const int bs = p.kv.block_size;
  return p.kv.k_scale != nullptr && p.kv.v_scale != nullptr && p.kv.head_dim == 128 && kvh > 0 && p.num_q_heads > 0 &&
         p.num_q_heads % kvh == 0 && p.num_q_heads / kvh <= 8 && bs >= 2 && (bs & (bs - 1)) == 0 &&
         p.num_seqs >= 0 && p.num_seqs <= 65535 && kvh <= 65535;
}

void paged_decode_attention_swapped(const decode_params& p, cuda_stream stream, int stages) {
  check(decode_swapped_supported(p), "paged_decode_attention_swapped: needs FP8 K/V (k_scale and v_scale), head_dim "
        "128 (got ", p.kv.head_dim, "), at most 8 query heads per KV head (got ", p.num_q_heads, " / ",
        p.kv.num_kv_heads, ") and a power-of-two block size (got ", p.kv.block_size, ")");
  check(stages == 0 || stages == 3 || stages == 4, "paged_decode_attention_swapped: stages ", stages,
        " (3, 4, or 0 for the default 3)");
  if (p.out_fp8.wanted()) detail::check_fp8_copy("paged_decode_attention_swapped", p.out_fp8, p.num_seqs);
  if (p.num_seqs == 0) return;
  namespace d = detail;
  const d::decode_args a = d::make_decode_args(p, 1, 0);  // head_chunks is unused: grid.y is the KV head
  const dim3 grid(1, static_cast<unsigned>(p.kv.num_kv_heads), static_cast<unsigned>(p.num_seqs));
  auto run = [&]<int S>() {
    d::opt_in_smem<d::paged_decode_swapped_kernel<S>>(d::kSwappedSmemBytes<S>);
    d::paged_decode_swapped_kernel<S><<<grid, 128, d::kSwappedSmemBytes<S>, stream>>>(a);
  };
  if (stages == 4) run.template operator()<4>();
  else run.template operator()<d::kSwappedStages>();
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

namespace {

// One side's codes, [num_blocks * block_size][kv_heads][128] bytes, as the TMA-fed kernel reads them: boxes of one
// 64-token tile of one KV head, 128-byte swizzle.
CUtensorMap kv_code_map(void* codes, const paged_kv_view& kv, const char* side) {
  CUtensorMap map{};
  const cuuint64_t dims[3] = {128, static_cast<cuuint64_t>(kv.num_kv_heads),
                              static_cast<cuuint64_t>(kv.num_blocks) * static_cast<cuuint64_t>(kv.block_size)};
  const cuuint64_t strides[2] = {128, static_cast<cuuint64_t>(kv.num_kv_heads) * 128};
  const cuuint32_t box[3] = {128, 1, static_cast<cuuint32_t>(detail::kKvTile)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = detail::tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, codes, dims, strides, box,
                                                  element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  check(r == CUDA_SUCCESS, "paged_decode_attention_swapped_tma: cuTensorMapEncodeTiled failed (CUresult ",
        static_cast<int>(r), ") for the ", side, " cache of ", kv.num_blocks, " blocks x ", kv.block_size, " x ",
        kv.num_kv_heads, " heads");
  return map;
}

}  // namespace

bool decode_swapped_tma_supported(const decode_params& p) {
  return decode_swapped_supported(p) && p.kv.block_size >= detail::kKvTile && p.kv.num_blocks > 0 &&
         detail::aligned16(p.kv.k_cache) && detail::aligned16(p.kv.v_cache) && current_device_runs_sm90a() &&
         detail::tensor_map_encoder() != nullptr;
}

void paged_decode_attention_swapped_tma(const decode_params& p, cuda_stream stream, int stages) {
  check(decode_swapped_tma_supported(p), "paged_decode_attention_swapped_tma: needs what the swapped kernel needs, "
        "blocks of at least 64 tokens (got ", p.kv.block_size, "), kv.num_blocks (got ", p.kv.num_blocks,
        "), 16-byte aligned caches and an sm_90a device whose driver encodes tensor maps");
  check(stages == 0 || stages == 3 || stages == 4, "paged_decode_attention_swapped_tma: stages ", stages,
        " (3, 4, or 0 for the default 3)");
  if (p.out_fp8.wanted()) detail::check_fp8_copy("paged_decode_attention_swapped_tma", p.out_fp8, p.num_seqs);
  if (p.num_seqs == 0) return;
  namespace d = detail;
  const d::decode_args a = d::make_decode_args(p, 1, 0);
  const d::swapped_tma_maps maps{kv_code_map(p.kv.k_cache, p.kv, "K"), kv_code_map(p.kv.v_cache, p.kv, "V")};
  const dim3 grid(1, static_cast<unsigned>(p.kv.num_kv_heads), static_cast<unsigned>(p.num_seqs));
  auto run = [&]<int S>() {
    constexpr int bytes = d::swapped_tma_layout<S>::kSmemBytes;
    d::opt_in_smem<d::paged_decode_swapped_tma_kernel<S>>(bytes);
    d::paged_decode_swapped_tma_kernel<S><<<grid, 128, bytes, stream>>>(a, maps);
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
