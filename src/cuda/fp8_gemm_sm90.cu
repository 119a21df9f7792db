// The block-scaled FP8 GEMM on Hopper wgmma (fp8_gemm_sm90.cuh; fp8_gemm.hpp says what it takes). A translation
// unit of its own: the kernel's 1,024-byte-aligned shared memory and the driver's tensor-map encoder stay here.
#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <cstdint>

#include "launch_checks.hpp"
#include "zipage/backend/cuda/fp8_gemm.hpp"
#include "zipage/backend/cuda/fp8_gemm_sm90.cuh"
#include "zipage/cuda/device.hpp"

namespace zipage::cuda::fp8 {

namespace {

// cuTensorMapEncodeTiled from the driver, found at run time (nothing links against libcuda); null without it.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      return PFN_cuTensorMapEncodeTiled_v12000{nullptr};
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// Codes [rows][k] bytes as TMA reads them: boxes of `box_rows` rows x 128 bytes, 128-byte swizzle, rows past
// `rows` read as zeros.
CUtensorMap code_map(const void* codes, int rows, int k, int box_rows, const char* what) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k)};
  const cuuint32_t box[2] = {detail::fp8_gemm::kBK, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(codes), dims, strides,
                                          box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  check(r == CUDA_SUCCESS, "fp8::gemm_sm90: cuTensorMapEncodeTiled failed (CUresult ", static_cast<int>(r), ") for the ",
        what, " codes [", rows, "][", k, "]");
  return map;
}

}  // namespace

bool gemm_sm90_available() { return current_device_runs_sm90a() && tensor_map_encoder() != nullptr; }

bool gemm_sm90_supported(const gemm_sm90_args& a) {
  using detail::aligned16;
  return a.m >= 0 && a.n > 0 && a.k > 0 && a.n % detail::fp8_gemm::kBN == 0 && a.k % detail::fp8_gemm::kBK == 0 &&
         aligned16(a.x_codes) && aligned16(a.x_scales) && aligned16(a.w_codes) && detail::aligned(a.w_scales, 4) &&
         detail::aligned(a.out, 4) && gemm_sm90_available();
}

static_assert(gemm_sm90_tile_cols == detail::fp8_gemm::kBN && gemm_sm90_group == detail::fp8_gemm::kBK &&
                  gemm_sm90_ctas_per_sm(64) == detail::fp8_gemm::shape<1>::kCtasPerSm &&
                  gemm_sm90_ctas_per_sm(128) == detail::fp8_gemm::shape<2>::kCtasPerSm,
              "fp8_gemm.hpp's tile constants are the kernel's");

namespace {

template <int kWG>
void launch(const detail::fp8_gemm::args& ka, const CUtensorMap& a_map, const CUtensorMap& b_map, cudaStream_t stream) {
  namespace g = detail::fp8_gemm;
  constexpr int smem = g::shape<kWG>::kSmemBytes;
  detail::opt_in_smem<g::fp8_gemm_sm90_kernel<kWG>>(smem);
  g::fp8_gemm_sm90_kernel<kWG><<<static_cast<unsigned>(ka.plan.ctas), g::shape<kWG>::kThreads, smem, stream>>>(ka, a_map, b_map);
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace

gemm_sm90_plan gemm_sm90_plan_for(const gemm_sm90_args& a) {
  const int sms = a.sms > 0 ? a.sms : detail::device_multiprocessors();
  return plan_gemm_sm90(a.m, a.n, a.k, a.splits, a.tile_rows, sms, a.counters != nullptr ? a.workspace_bytes : 0);
}

void gemm_sm90(const gemm_sm90_args& a, cuda_stream stream) {
  namespace g = detail::fp8_gemm;
  check(a.n > 0 && a.n % g::kBN == 0, "fp8::gemm_sm90: n (", a.n, ") must be a positive multiple of 128");
  check(a.k > 0 && a.k % g::kBK == 0, "fp8::gemm_sm90: k (", a.k, ") must be a positive multiple of 128");
  check(a.m >= 0, "fp8::gemm_sm90: m is negative (", a.m, ")");
  check(a.splits >= 0 || a.splits == gemm_sm90_stream_k, "fp8::gemm_sm90: splits (", a.splits,
        ") must be 0 (automatic), 1 (none), a split count or gemm_sm90_stream_k");
  check(a.tile_rows == 0 || is_gemm_sm90_tile_rows(a.tile_rows), "fp8::gemm_sm90: tile_rows (", a.tile_rows,
        ") must be 0 (automatic), 64 or 128");
  check(a.sms >= 0, "fp8::gemm_sm90: sms is negative (", a.sms, ")");
  check(detail::aligned16(a.x_codes) && detail::aligned16(a.x_scales) && detail::aligned16(a.w_codes),
        "fp8::gemm_sm90: x_codes, x_scales and w_codes must be 16-byte aligned");
  check(detail::aligned(a.w_scales, 4) && detail::aligned(a.out, 4), "fp8::gemm_sm90: w_scales and out must be 4-byte aligned");
  check(gemm_sm90_available(), "fp8::gemm_sm90: needs an sm_90a build on a compute-capability 9.0 device with TMA");
  if (a.m == 0) return;
  const int mp = padded_rows(a.m);
  const int rows = gemm_sm90_tile_rows_for(a.tile_rows, a.m);
  const long long tiles = static_cast<long long>((mp + rows - 1) / rows) * (a.n / g::kBN);
  check(tiles * std::max(1, a.splits) < (1ll << 31), "fp8::gemm_sm90: too many tiles (", tiles, ")");
  const gemm_sm90_plan plan = gemm_sm90_plan_for(a);
  if (plan.shared_groups() > 0) {
    check(a.counters != nullptr, "fp8::gemm_sm90: ", plan.ctas, " CTAs sharing tiles need counters (gemm_sm90_max_split_tiles zero ints)");
    check(plan.tiles - plan.dp_tiles <= gemm_sm90_max_split_tiles, "fp8::gemm_sm90: ", a.splits, " splits of ",
          plan.tiles, " tiles need more than gemm_sm90_max_split_tiles counters");
    check(a.workspace != nullptr && a.workspace_bytes >= plan.workspace_bytes() && detail::aligned16(a.workspace),
          "fp8::gemm_sm90: ", plan.ctas, " CTAs sharing tiles of ", a.m, " x ", a.n, " need a 16-byte aligned workspace of ",
          plan.workspace_bytes(), " bytes (got ", a.workspace_bytes, ")");
  }
  const CUtensorMap a_map = code_map(a.x_codes, mp, a.k, rows, "activation");
  const CUtensorMap b_map = code_map(a.w_codes, a.n, a.k, g::kBN, "weight");
  const g::args ka{a.x_scales, a.w_scales, static_cast<__nv_bfloat16*>(a.out), a.m, mp, a.n, a.k, weight_scale_ld(a.k),
                   plan, static_cast<float*>(a.workspace), a.counters};
  if (rows == 64)
    launch<1>(ka, a_map, b_map, reinterpret_cast<cudaStream_t>(stream));
  else
    launch<2>(ka, a_map, b_map, reinterpret_cast<cudaStream_t>(stream));
}

}  // namespace zipage::cuda::fp8
