// zipage::cuda_backend (backend/cuda/cuda_backend.hpp): linear layers — cuBLASLt plans cached per shape and
// alignment, and the fixed-order (batch-invariant) fp32 GEMM; an FP8 (e4m3) weight goes to fp8_linear.cu.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "context.cuh"
#include "fp8_linear.cuh"
#include "zipage/backend/cuda/ops.hpp"

namespace zipage {

const cuda_detail::gemm_plan& cuda_detail::cache_gemm_plan(context& c, const gemm_key& key,
                                                           std::unique_ptr<gemm_plan> plan, std::uint32_t min_alignment) {
  if (key.sms > 0) {
    const std::int32_t sms = key.sms;
    ZIPAGE_LT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms, sizeof sms));
  }
  cublasLtMatmulPreference_t pref = nullptr;
  ZIPAGE_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::uint64_t ws = c.opts.gemm_workspace_bytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  if (min_alignment > 0)
    for (const auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      cublasLtMatmulPreferenceSetAttribute(pref, attr, &min_alignment, sizeof min_alignment);
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(c.lt, plan->desc, plan->a, plan->b, plan->c, plan->c, pref, 1, &result, &returned);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    plan->algo = result.algo;
    plan->ok = true;
  }
  auto& ref = *plan;
  c.gemms.emplace(key, std::move(plan));
  return ref;
}

namespace {

// "linear bf16 6144x4096": an op timing name (cuda_backend_options::op_timing) of a weight [n][k].
std::string shape_name(const char* what, cuda_dtype t, int n, int k) {
  return what + std::string(to_string(t)) + " " + std::to_string(n) + "x" + std::to_string(k);
}

int alignment_of(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  int a = 1;
  while (a < 256 && (v & static_cast<std::uintptr_t>(a)) == 0) a <<= 1;
  return a;
}

const cuda_detail::gemm_plan& gemm_plan_for(context& c, int m, int n, int k, cuda_dtype t, int align) {
  const cuda_detail::gemm_key key{m, n, k, t, align, c.gemm_sms()};
  auto it = c.gemms.find(key);
  if (it != c.gemms.end()) return *it->second;
  auto plan = std::make_unique<cuda_detail::gemm_plan>();
  const cudaDataType_t dt = t == cuda_dtype::bf16 ? CUDA_R_16BF : CUDA_R_32F;
  ZIPAGE_LT_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  ZIPAGE_LT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  ZIPAGE_LT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  // Column-major view: out^T [n x m] = W [k x n]^T * x^T [k x m].
  ZIPAGE_LT_CHECK(cublasLtMatrixLayoutCreate(&plan->a, dt, static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(n), k));
  ZIPAGE_LT_CHECK(cublasLtMatrixLayoutCreate(&plan->b, dt, static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(m), k));
  ZIPAGE_LT_CHECK(cublasLtMatrixLayoutCreate(&plan->c, dt, static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(m), n));
  return cuda_detail::cache_gemm_plan(c, key, std::move(plan), static_cast<std::uint32_t>(align));
}

}  // namespace

void cuda_backend::linear(const cuda_tensor& x, const cuda_tensor& w, cuda_tensor& out) const {
  context& c = use(ctx_);
  check(x.cols() == w.cols(), "linear: input width ", x.cols(), " does not match weight input width ", w.cols());
  check(&x != &out && &w != &out, "linear: the output may not alias an input");
  if (w.dtype() == cuda_dtype::e4m3) return cuda_detail::fp8_linear(ctx_, x, w, out);  // FP8 weight (fp8_linear.cu)
  check(x.dtype() == w.dtype(), "linear: input is ", to_string(x.dtype()), " but the weight is ", to_string(w.dtype()));
  access::shape(ctx_, out, x.rows(), w.rows(), x.dtype());
  const int m = x.rows(), n = w.rows(), k = x.cols();
  if (m == 0 || n == 0) return;
  if (!(x.dtype() == cuda_dtype::f32 && c.opts.batch_invariant) && c.opts.gemm_workspace_bytes > 0) {
    const int align = std::min({alignment_of(x.data()), alignment_of(w.data()), alignment_of(out.data())});
    const auto& plan = gemm_plan_for(c, m, n, k, x.dtype(), align);
    if (plan.ok) {
      if (c.skip_launch(3, x.data(), w.data(), out.data(), m, n, k, x.dtype(), &plan, c.lt_workspace)) return;
      const auto timed = time_op(c, [&] { return shape_name("linear ", x.dtype(), n, k); });
      const float alpha = 1.0f, beta = 0.0f;
      ZIPAGE_LT_CHECK(cublasLtMatmul(c.lt, plan.desc, &alpha, w.data(), plan.a, x.data(), plan.b, &beta, out.data(),
                                     plan.c, out.data(), plan.c, &plan.algo, c.lt_workspace, c.opts.gemm_workspace_bytes,
                                     c.stream));
      return;
    }
  }
  if (c.skip_launch(4, x.data(), w.data(), out.data(), m, n, k, x.dtype())) return;
  const auto timed = time_op(c, [&] { return shape_name("linear fixed-order ", x.dtype(), n, k); });
  cuda::gemm_fixed_order(x.dtype(), x.data(), w.data(), out.data(), m, n, k, as_stream(c.stream));
}

}  // namespace zipage
