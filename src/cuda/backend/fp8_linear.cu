// zipage::cuda_backend (backend/cuda/cuda_backend.hpp): FP8 linear weights (docs/fp8.md "FP8 weights") — their
// quantisation at load, the per-token activation quantisation before each GEMM, and cuBLASLt's block-scaled FP8
// GEMM: out^T [n x m] = (W codes · 128x128 block scales)^T (x codes · per-token 128-group scales), fp32
// accumulation, bf16 out. Batches of up to 64 tokens run fp8::gemm_sm90 instead, on the same codes and scales
// (cuda_backend_options::fp8_gemm_kernel; docs/fp8.md "Our own FP8 GEMM for small batches").
//
// cuBLASLt's contract for these scale modes (CUDA 12.9+, Hopper; cuBLAS docs "block scaling" and NVIDIA's
// LtBlk128x128Fp8Matmul sample): FP8 operands in the "TN" form only (A transposed, B not: both K-major, which
// row-major [out][in] weights and [tokens][in] activations are), leading dimensions multiples of 16 bytes;
// A (the weight) with BLK128x128_32F: fp32 scales column-major [ceil(K/128)] x [ceil(N/128)] with the leading
// dimension ceil(K/128) rounded up to a multiple of 4; B (the activations) with VEC128_32F: fp32 scales
// [ceil(K/128)] rows of M (the token count, which we pad to a multiple of 4 with zero rows). These layouts come
// from the sample's scale-tensor sizes and from users of torch's scaled_mm, not from a run here: the GPU test
// (tests/gpu/test_cuda_fp8_gemm.cpp) checks the product against the CPU reference.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "context.cuh"
#include "fp8_linear.cuh"
#include "zipage/backend/cuda/fp8_gemm.hpp"
#include "zipage/core/fp8_linear.hpp"

namespace zipage {

namespace cuda_detail {

namespace {

constexpr std::size_t round256(std::size_t b) { return (b + 255) & ~std::size_t{255}; }

// The activation workspace for m tokens of width k: codes [padded(m)][k], then scales [groups(k)][padded(m)].
struct fp8_workspace {
  std::uint8_t* codes;
  float* scales;
};
std::size_t fp8_workspace_bytes(int m, int k) {
  const auto mp = static_cast<std::size_t>(cuda::fp8::padded_rows(m));
  return round256(mp * static_cast<std::size_t>(k)) + static_cast<std::size_t>((k + 127) / 128) * mp * sizeof(float);
}
fp8_workspace fp8_workspace_for(context& c, int m, int k) {
  void* before = c.fp8_ws.p;
  const std::size_t bytes = fp8_workspace_bytes(m, k);
  check(!c.capturing() || bytes <= c.fp8_ws.cap, "cuda graphs: the FP8 activation workspace grew during stream capture");
  auto* p = static_cast<std::uint8_t*>(c.fp8_ws.reserve(bytes, c.stream));
  // A record pass that moved it signed stale pointers in earlier launches: it runs again (decode_graph.cu).
  if (p != before && c.graph.phase == graph_phase::record) c.graph.arena_moved = true;
  const auto mp = static_cast<std::size_t>(cuda::fp8::padded_rows(m));
  return {p, reinterpret_cast<float*>(p + round256(mp * static_cast<std::size_t>(k)))};
}

// The plan for padded m tokens, cached per shape like gemm_plan_for (key dtype e4m3). Scale pointers are set
// per call (each weight has its own); those given here only let the heuristic see a complete descriptor.
const gemm_plan& fp8_plan_for(context& c, int mp, int n, int k, const float* w_scales, const float* x_scales) {
  const gemm_key key{mp, n, k, cuda_dtype::e4m3, 16, c.gemm_sms()};
  if (auto it = c.gemms.find(key); it != c.gemms.end()) return *it->second;
  auto plan = std::make_unique<gemm_plan>();
  ZIPAGE_LT_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const std::int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  auto set = [&](cublasLtMatmulDescAttributes_t a, const void* v, std::size_t size) {
    ZIPAGE_LT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, a, v, size));
  };
  set(CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  set(CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof a_mode);
  set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof b_mode);
  set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof w_scales);
  set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales, sizeof x_scales);
  // Column-major view: out^T [n x mp] = W [k x n]^T * x^T [k x mp]; the codes are K-major ("TN").
  const auto u = [](int v) { return static_cast<std::uint64_t>(v); };
  ZIPAGE_LT_CHECK(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_8F_E4M3, u(k), u(n), k));
  ZIPAGE_LT_CHECK(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_8F_E4M3, u(k), u(mp), k));
  ZIPAGE_LT_CHECK(cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_16BF, u(n), u(mp), n));
  return cache_gemm_plan(c, key, std::move(plan), 0);
}

// Whether the FP8 GEMM runs for a weight [n][k] (decided once, at load): 16-byte leading dimensions (k codes,
// n bf16 outputs) and a cuBLASLt algorithm for a decode-sized and a prefill-sized batch.
bool fp8_gemm_supported(context& c, int n, int k, const float* w_scales) {
  if (k % 16 != 0 || n % 16 != 0 || c.opts.gemm_workspace_bytes == 0) return false;
  for (const int m : {4, 256, 2048}) {
    const fp8_workspace ws = fp8_workspace_for(c, m, k);
    if (!fp8_plan_for(c, m, n, k, w_scales, ws.scales).ok) return false;
  }
  return true;
}

}  // namespace

namespace {

// Once per backend, before the first weight becomes FP8: a small GEMM whose every 128x128 weight block and
// every (token, group) has its own scale, against the CPU reference (core/fp8_linear.hpp). The scale layouts
// this file gives cuBLASLt come from NVIDIA's sample and torch users, not from its documentation; if they were
// wrong the product would be far off, and then no weight becomes FP8 (a line on stderr says why) instead of a
// model running on garbage.
bool fp8_self_test(const std::shared_ptr<context>& ctx) {
  context& c = *ctx;
  if (c.fp8_self_test >= 0) return c.fp8_self_test == 1;
  constexpr int m = 6, n = 256, k = 384;
  std::vector<float> w(static_cast<std::size_t>(n) * k), x(static_cast<std::size_t>(m) * k);
  std::uint32_t h = 12345u;
  auto next = [&h] { return (h = h * 1664525u + 1013904223u) >> 8; };
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < k; ++j)  // block (i/128, j/128) spans (1 + 2 bi + 5 bj) times [-1, 1)
      w[static_cast<std::size_t>(i) * k + j] = (float(next() % 2048) / 1024.0f - 1.0f) * float(1 + 2 * (i / 128) + 5 * (j / 128));
  std::vector<std::uint16_t> xb(x.size());
  for (int r = 0; r < m; ++r)
    for (int j = 0; j < k; ++j) {  // each (token, group) its own range
      const float v = float(static_cast<int>(next() % 255) - 127) * 0.0625f * float(1 + r + 3 * (j / 128));
      std::uint32_t u;
      std::memcpy(&u, &v, 4);
      xb[static_cast<std::size_t>(r) * k + j] = static_cast<std::uint16_t>(u >> 16);
      // The reference quantises exactly the bf16 value the device reads (v truncated to bf16): quantising v
      // itself moves some codes by one e4m3 step, which once read as a layout error of ~5.5x the tolerance.
      u &= 0xFFFF0000u;
      std::memcpy(&x[static_cast<std::size_t>(r) * k + j], &u, 4);
    }
  cuda_tensor wt, xt, out;
  access::shape(ctx, wt, n, k, cuda_dtype::f32);
  access::shape(ctx, xt, m, k, cuda_dtype::bf16);
  ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(wt.data(), w.data(), wt.bytes(), cudaMemcpyHostToDevice, c.stream));
  ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(xt.data(), xb.data(), xt.bytes(), cudaMemcpyHostToDevice, c.stream));
  cuda_buffer codes, scales;
  access::reserve(ctx, codes, static_cast<std::size_t>(n) * k);
  access::reserve(ctx, scales, static_cast<std::size_t>(n / 128) * cuda::fp8::weight_scale_ld(k) * 4);
  cuda::fp8::quantize_weight_blocks(cuda_dtype::f32, wt.data(), n, k, static_cast<std::uint8_t*>(codes.data()),
                                    static_cast<float*>(scales.data()), as_stream(c.stream));
  double worst = -1.0;
  if (fp8_gemm_supported(c, n, k, static_cast<const float*>(scales.data()))) {
    access::set_e4m3(wt, std::move(codes), std::move(scales), n, k);
    fp8_linear(ctx, xt, wt, out, cuda::fp8_gemm_kernel::cublaslt);  // the layouts checked are cuBLASLt's
    std::vector<std::uint16_t> ob(static_cast<std::size_t>(m) * n);
    ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(ob.data(), out.data(), ob.size() * 2, cudaMemcpyDeviceToHost, c.stream));
    ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.stream));
    const auto ref = fp8_linear::linear(x, m, fp8_linear::quantize_weight(w, n, k));
    double s2 = 0;
    for (const double v : ref) s2 += v * v;
    const double rms = std::sqrt(s2 / double(ref.size()));
    worst = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      const std::uint32_t u = std::uint32_t{ob[i]} << 16;
      float got;
      std::memcpy(&got, &u, 4);
      worst = std::max(worst, std::fabs(double(got) - ref[i]) / (0x1p-7 * std::fabs(ref[i]) + 0x1p-7 * rms));
    }
  }
  c.fp8_self_test = worst >= 0.0 && worst <= 1.0 ? 1 : 0;
  if (c.fp8_self_test == 0)
    std::fprintf(stderr, "cuda_backend: FP8 weights disabled: cuBLASLt's block-scaled FP8 GEMM %s (weights stay %s)\n",
                 worst < 0 ? "is not available for a 6 x 256 x 384 product"
                           : ("is off the CPU reference (worst error " + std::to_string(worst) + " x the tolerance)").c_str(),
                 to_string(c.opts.dtype));
  return c.fp8_self_test == 1;
}

}  // namespace

void fp8_linear(const std::shared_ptr<context>& ctx, const cuda_tensor& x, const cuda_tensor& w, cuda_tensor& out,
                std::optional<cuda::fp8_gemm_kernel> kernel) {
  context& c = use(ctx);
  check(x.dtype() == cuda_dtype::bf16, "linear: an FP8 (e4m3) weight takes bf16 activations, got ", to_string(x.dtype()));
  const int m = x.rows(), n = w.rows(), k = x.cols();
  const int mp = cuda::fp8::padded_rows(m);
  // cuBLASLt writes the padding tokens' rows too: out keeps room for them (grown in a record pass, never in capture).
  const void* before = out.data();
  access::reserve(ctx, access::buf(out), static_cast<std::size_t>(mp) * static_cast<std::size_t>(n) * 2);
  if (out.data() != before && c.graph.phase == graph_phase::record) c.graph.arena_moved = true;
  access::shape(ctx, out, m, n, cuda_dtype::bf16);
  if (m == 0 || n == 0) return;
  const fp8_workspace ws = fp8_workspace_for(c, m, k);
  const gemm_plan& plan = fp8_plan_for(c, mp, n, k, w.scales(), ws.scales);
  check(plan.ok, "linear: cuBLASLt has no block-scaled FP8 GEMM for ", m, " tokens (padded to ", mp, ") x [", n, "][", k,
        "] (the weight passed the load-time check at 4, 256 and 2048 tokens)");
  // x's codes may be in the workspace already: written beside x by the op that made it (fp8_copy_for), or by the
  // previous linear() on x (q, k and v projections of one input), with no op run since.
  const bool quantized = c.opts.fuse_fp8_quantize && c.fp8_ws_holds.holds(x.data(), m, k, ws.codes, c.launch_seq);
  c.count([&](cuda_backend_counters& t) {
    ++t.fp8_linears;
    t.fp8_inputs_prequantized += quantized ? 1 : 0;
  });
  const cuda::fp8_gemm_kernel requested = kernel.value_or(c.opts.fp8_gemm_kernel);
  const bool skip = c.skip_launch(11, x.data(), w.data(), w.scales(), out.data(), m, n, k, ws.codes, &plan, c.lt_workspace,
                                  quantized, static_cast<int>(requested));
  c.fp8_ws_holds = {x.data(), m, k, ws.codes, c.launch_seq};
  if (skip) return;
  if (!quantized) {
    const auto timed = time_op(c, [&] { return "fp8 quantize " + std::to_string(k); });
    cuda::fp8::quantize_activations(cuda_dtype::bf16, x.data(), m, mp, k, ws.codes, ws.scales, as_stream(c.stream));
  }
  const auto timed = time_op(c, [&] { return "linear fp8 " + std::to_string(n) + "x" + std::to_string(k); });
  if (requested != cuda::fp8_gemm_kernel::cublaslt) {
    // Split-K and stream-K hold their partials in cuBLASLt's workspace, as far as they fit; the plan fills the
    // multiprocessors that the other nano-batch's attention leaves (all of them outside overlap).
    cuda::fp8::gemm_sm90_args own{ws.codes, ws.scales, static_cast<const std::uint8_t*>(w.data()), w.scales(),
                                  out.data(), m, n, k};
    own.workspace = c.lt_workspace;
    own.workspace_bytes = c.opts.gemm_workspace_bytes;
    own.counters = c.sm90_counters;
    own.sms = c.gemm_sms();
    if (cuda::resolve_fp8_gemm_kernel(requested, m, cuda::fp8::gemm_sm90_supported(own)) ==
        cuda::fp8_gemm_kernel::sm90) {
      c.count([](cuda_backend_counters& t) { ++t.sm90_fp8_gemms; });
      cuda::fp8::gemm_sm90(own, as_stream(c.stream));
      return;
    }
  }
  const float* w_scales = w.scales();
  const float* x_scales = ws.scales;
  ZIPAGE_LT_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof w_scales));
  ZIPAGE_LT_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales, sizeof x_scales));
  const float alpha = 1.0f, beta = 0.0f;
  ZIPAGE_LT_CHECK(cublasLtMatmul(c.lt, plan.desc, &alpha, w.data(), plan.a, ws.codes, plan.b, &beta, out.data(), plan.c,
                                 out.data(), plan.c, &plan.algo, c.lt_workspace, c.opts.gemm_workspace_bytes, c.stream));
}

cuda::fp8_copy fp8_copy_for(context& c, const cuda_tensor& out, cuda::kernel_variant v, std::int64_t in_row_stride,
                            std::initializer_list<const void*> pointers) {
  if (!c.opts.fuse_fp8_quantize || !c.fp8_weights_in_use || out.empty() ||
      !cuda::fp8_copy_supported(out.dtype(), v, out.cols(), in_row_stride, pointers))
    return {};
  const fp8_workspace ws = fp8_workspace_for(c, out.rows(), out.cols());
  return {ws.codes, ws.scales, cuda::fp8::padded_rows(out.rows())};
}

void fp8_copy_written(context& c, const cuda_tensor& out, const cuda::fp8_copy& copy) {
  if (copy.wanted()) c.fp8_ws_holds = {out.data(), out.rows(), out.cols(), copy.codes, c.launch_seq};
}

}  // namespace cuda_detail

bool cuda_backend::fp8_linear_weights(bool fp8_checkpoint) const {
  return dtype() == cuda_dtype::bf16 && fp8_weights(options().weight_dtype, fp8_checkpoint);
}

bool cuda_backend::prepare_linear_weight(cuda_tensor& w, bool fp8_checkpoint) const {
  if (w.dtype() == cuda_dtype::e4m3) return true;
  if (!fp8_linear_weights(fp8_checkpoint) || w.empty()) return false;
  context& c = use(ctx_);
  if (!cuda_detail::fp8_self_test(ctx_)) {
    c.count([&](cuda_backend_counters&) { ++c.fp8_weights_kept; });
    return false;
  }
  const int n = w.rows(), k = w.cols();
  cuda_buffer codes, scales;
  const auto sbytes = static_cast<std::size_t>((n + 127) / 128) * static_cast<std::size_t>(cuda::fp8::weight_scale_ld(k)) * 4;
  access::reserve(ctx_, codes, static_cast<std::size_t>(w.size()));
  access::reserve(ctx_, scales, sbytes);
  cuda::fp8::quantize_weight_blocks(w.dtype(), w.data(), n, k, static_cast<std::uint8_t*>(codes.data()),
                                    static_cast<float*>(scales.data()), as_stream(c.stream));
  if (!cuda_detail::fp8_gemm_supported(c, n, k, static_cast<const float*>(scales.data()))) {
    c.count([&](cuda_backend_counters&) { ++c.fp8_weights_kept; });
    return false;  // the codes are freed in stream order; w stays as it was
  }
  access::set_e4m3(w, std::move(codes), std::move(scales), n, k);
  c.fp8_weights_in_use = true;
  c.count([&](cuda_backend_counters&) { ++c.fp8_weights; });
  return true;
}

std::optional<cuda_tensor> cuda_backend::stack_rows(std::span<const cuda_tensor* const> parts) const {
  check(!parts.empty(), "stack_rows: no parts");
  context& c = use(ctx_);
  check(!c.capturing(), "stack_rows: weights are stacked at load, not inside a graph capture");
  const cuda_tensor& first = *parts.front();
  int rows = 0;
  for (const cuda_tensor* p : parts) {
    check(p->cols() == first.cols(), "stack_rows: parts of ", first.cols(), " and ", p->cols(), " columns");
    if (p->dtype() != first.dtype()) return std::nullopt;  // e.g. one part kept bf16 where cuBLASLt refused FP8
    rows += p->rows();
  }
  const int cols = first.cols();
  if (first.dtype() != cuda_dtype::e4m3) {
    cuda_tensor out;
    access::shape(ctx_, out, rows, cols, first.dtype());
    auto* at = static_cast<char*>(out.data());
    for (const cuda_tensor* p : parts) {
      if (p->bytes()) ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(at, p->data(), p->bytes(), cudaMemcpyDeviceToDevice, c.stream));
      at += p->bytes();
    }
    return out;
  }
  // FP8: the codes stack as bytes; the block scales stack by 128-row block rows, which is exact only when every
  // part but the last ends on a block boundary.
  for (std::size_t i = 0; i + 1 < parts.size(); ++i)
    if (parts[i]->rows() % 128 != 0) return std::nullopt;
  const auto ld_bytes = static_cast<std::size_t>(first.scale_ld()) * sizeof(float);
  cuda_buffer codes, scales;
  access::reserve(ctx_, codes, static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
  access::reserve(ctx_, scales, static_cast<std::size_t>((rows + 127) / 128) * ld_bytes);
  auto* code_at = static_cast<char*>(codes.data());
  auto* scale_at = static_cast<char*>(scales.data());
  for (const cuda_tensor* p : parts) {
    const std::size_t code_bytes = static_cast<std::size_t>(p->size());
    const std::size_t scale_bytes = static_cast<std::size_t>((p->rows() + 127) / 128) * ld_bytes;
    if (code_bytes) ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(code_at, p->data(), code_bytes, cudaMemcpyDeviceToDevice, c.stream));
    if (scale_bytes)
      ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(scale_at, p->scales(), scale_bytes, cudaMemcpyDeviceToDevice, c.stream));
    code_at += code_bytes;
    scale_at += scale_bytes;
  }
  if (!cuda_detail::fp8_gemm_supported(c, rows, cols, static_cast<const float*>(scales.data()))) return std::nullopt;
  cuda_tensor out;
  access::set_e4m3(out, std::move(codes), std::move(scales), rows, cols);
  c.fp8_weights_in_use = true;
  return out;
}

cuda_tensor cuda_backend::linear_weight_from_host(std::span<const float> values, int rows, int cols,
                                                  bool fp8_checkpoint) const {
  if (!fp8_linear_weights(fp8_checkpoint)) return from_host(values, rows, cols);
  check(values.size() == static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols), "linear_weight_from_host: ",
        values.size(), " values do not fill a ", rows, "x", cols, " tensor");
  context& c = use(ctx_);
  cuda_tensor f;  // the fp32 values on the device, quantised from there (no bf16 rounding first)
  access::shape(ctx_, f, rows, cols, cuda_dtype::f32);
  if (!f.empty())
    ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(f.data(), values.data(), f.bytes(), cudaMemcpyHostToDevice, c.stream));
  if (!prepare_linear_weight(f, fp8_checkpoint)) f = from_host(values, rows, cols);  // kept: the compute dtype
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.stream));  // the host values may go away
  return f;
}

void cuda_backend::fp8_weight_to_host(const cuda_tensor& w, std::vector<std::uint8_t>& codes,
                                      std::vector<float>& scales) const {
  check(w.dtype() == cuda_dtype::e4m3, "fp8_weight_to_host: the tensor is ", to_string(w.dtype()), ", not e4m3");
  context& c = use(ctx_);
  const int nb = (w.rows() + 127) / 128, kb = (w.cols() + 127) / 128, ld = w.scale_ld();
  codes.resize(static_cast<std::size_t>(w.size()));
  std::vector<float> padded(static_cast<std::size_t>(nb) * static_cast<std::size_t>(ld));
  ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(codes.data(), w.data(), codes.size(), cudaMemcpyDeviceToHost, c.stream));
  ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(padded.data(), w.scales(), padded.size() * 4, cudaMemcpyDeviceToHost, c.stream));
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  scales.resize(static_cast<std::size_t>(nb) * static_cast<std::size_t>(kb));
  for (int i = 0; i < nb; ++i)
    for (int j = 0; j < kb; ++j) scales[static_cast<std::size_t>(i * kb + j)] = padded[static_cast<std::size_t>(i * ld + j)];
}

void cuda_backend::quantize_activations_to_host(const cuda_tensor& x, std::vector<std::uint8_t>& codes,
                                                std::vector<float>& scales) const {
  check(x.dtype() != cuda_dtype::e4m3, "quantize_activations_to_host: x is an e4m3 weight");
  context& c = use(ctx_);
  const int m = x.rows(), k = x.cols(), mp = cuda::fp8::padded_rows(m), g = (k + 127) / 128;
  const auto ws = cuda_detail::fp8_workspace_for(c, m, k);
  ++c.launch_seq;  // the workspace no longer holds what fp8_ws_holds says
  cuda::fp8::quantize_activations(x.dtype(), x.data(), m, mp, k, ws.codes, ws.scales, as_stream(c.stream));
  codes.resize(static_cast<std::size_t>(m) * static_cast<std::size_t>(k));
  std::vector<float> cols(static_cast<std::size_t>(g) * static_cast<std::size_t>(mp));
  if (!codes.empty())
    ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(codes.data(), ws.codes, codes.size(), cudaMemcpyDeviceToHost, c.stream));
  if (!cols.empty())
    ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(cols.data(), ws.scales, cols.size() * 4, cudaMemcpyDeviceToHost, c.stream));
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  scales.resize(static_cast<std::size_t>(m) * static_cast<std::size_t>(g));
  for (int r = 0; r < m; ++r)
    for (int j = 0; j < g; ++j) scales[static_cast<std::size_t>(r * g + j)] = cols[static_cast<std::size_t>(j * mp + r)];
}

std::string cuda_backend::describe_weights() const {
  int fp8 = 0, kept = 0;
  ctx_->count([&](cuda_backend_counters&) {
    fp8 = ctx_->fp8_weights;
    kept = ctx_->fp8_weights_kept;
  });
  if (fp8 == 0 && kept == 0) return std::string("linear weights ") + to_string(dtype());
  std::string s = "linear weights fp8_e4m3 + 128x128 block scales: " + std::to_string(fp8) + " FP8";
  if (kept > 0) s += ", " + std::to_string(kept) + " kept " + to_string(dtype()) + " (shape cuBLASLt's FP8 GEMM refuses)";
  return s;
}

}  // namespace zipage
