// Which cuBLASLt configurations run the engine's block-scaled FP8 GEMM (e4m3 weights with 128x128 block scales,
// e4m3 activations with per-token 128-group scales, bf16 out; the layout of src/cuda/backend/fp8_linear.cu) at
// the decode batches the compressed engine runs, and how fast. cuBLASLt's heuristic offers one algorithm for this
// GEMM, and at 513-1,023 rows it costs what 1,024 rows cost (docs/benchmarks.md, 2026-12-03): a second, mostly
// idle wave of tiles. Here every algorithm id cuBLASLt lists for the types, with every tile, cluster shape and
// split-K count cublasLtMatmulAlgoCheck accepts, is timed (CUDA events, median of 15 after 3 warm-ups) against
// the heuristic's choice, in the same process. Random finite codes and unit scales; nothing is asserted.
//
//   bench_fp8_gemm_configs [M ...]      (default: 512 662 704 1024)
//   bench_fp8_gemm_configs --split-tail [M ...]   (the rows past 512 as two half-K GEMMs beside the first 512: split_tail)
//   bench_fp8_gemm_configs --sm90 [M ...]   (fp8::gemm_sm90, our wgmma kernel, with the plan it picks, against the
//                                           heuristic's: time, joules over ~1 s of back-to-back calls each, and the
//                                           largest difference of the two outputs, on scales that vary per block)
//   bench_fp8_gemm_configs --sm90-graph [M ...]   (the same two GEMMs as the engine runs them: inside a CUDA graph,
//                                           so no host time between launches, and over copies of the weight that
//                                           together exceed L2, so each call reads its weight from HBM; ours with
//                                           64- and 128-token tiles, whole, split and stream-K)
//   bench_fp8_gemm_configs --sm90-scaling [M ...]   (as --sm90-graph, ours with 128-token tiles on all, 3/4, 1/2 and
//                                           1/4 of the multiprocessors: bound by the L2's total bandwidth or not)
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "zipage/backend/cuda/event_timer.cuh"
#include "zipage/backend/cuda/fp8_gemm.hpp"  // padded_rows, weight_scale_ld, gemm_sm90
#include "zipage/cuda/energy.hpp"

namespace {

#define CK(expr) ZIPAGE_CUDA_CHECK(expr)
#define LT(expr)                                                                          \
  do {                                                                                    \
    const cublasStatus_t st_ = (expr);                                                    \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                   \
      std::fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #expr, st_); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

// Finite positive e4m3 codes (bit 3 and the sign cleared: exponent field <= 14, never the NaN code).
__global__ void fill_codes(std::uint8_t* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    p[i] = static_cast<std::uint8_t>((h >> 8) & 0x77u);
  }
}
__global__ void fill_ones(float* p, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    p[i] = 1.0f;
}
// Scales in [2^-10, 2^-10 * 2) that differ from block to block (a layout error then shows in the product).
__global__ void fill_scales(float* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    p[i] = 0x1p-10f * (1.0f + static_cast<float>((static_cast<std::uint32_t>(i) * 2654435761u ^ seed) % 1024u) / 1024.0f);
}

// Median µs of `runs` calls of fn, each timed alone on `stream` by CUDA events (warm-ups are the caller's).
template <class F>
double median_timed_us(cudaStream_t stream, int runs, F&& fn) {
  zipage::cuda::event_timer timer;
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) t.push_back(timer.time(stream, fn) * 1e6);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct config {
  cublasLtMatmulAlgo_t algo;
  int id = 0, tile = 0, cluster = 0, splitk = 1;
  float waves = 0;
  double us = 0;
};

// One GEMM shape: out^T [n x mp] = W [k x n]^T * x^T [k x mp], as fp8_plan_for builds it.
struct gemm_case {
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  std::uint8_t *w = nullptr, *x = nullptr;
  float *ws_scale = nullptr, *xs_scale = nullptr;
  void* out = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = std::size_t{32} << 20;
  int m, n, k;

  gemm_case(cublasLtHandle_t h, int m_, int n_, int k_) : lt(h), m(m_), n(n_), k(k_) {
    const int mp = zipage::cuda::fp8::padded_rows(m);
    const std::size_t w_scales = std::size_t((n + 127) / 128) * zipage::cuda::fp8::weight_scale_ld(k);
    const std::size_t x_scales = std::size_t((k + 127) / 128) * mp;
    CK(cudaMalloc(&w, std::size_t(n) * k));
    CK(cudaMalloc(&x, std::size_t(mp) * k));
    CK(cudaMalloc(&ws_scale, w_scales * 4));
    CK(cudaMalloc(&xs_scale, x_scales * 4));
    CK(cudaMalloc(&out, std::size_t(n) * mp * 2));
    CK(cudaMalloc(&workspace, workspace_bytes));
    fill_codes<<<1024, 256>>>(w, std::size_t(n) * k, 1);
    fill_codes<<<1024, 256>>>(x, std::size_t(mp) * k, 2);
    fill_ones<<<64, 256>>>(ws_scale, w_scales);
    fill_ones<<<64, 256>>>(xs_scale, x_scales);
    CK(cudaDeviceSynchronize());
    LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const std::int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof a_mode));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof b_mode));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ws_scale, sizeof ws_scale));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs_scale, sizeof xs_scale));
    const auto u = [](int v) { return static_cast<std::uint64_t>(v); };
    LT(cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, u(k), u(n), k));
    LT(cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, u(k), u(mp), k));
    LT(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, u(n), u(mp), n));
  }
  ~gemm_case() {
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(desc);
    for (void* p : {static_cast<void*>(w), static_cast<void*>(x), static_cast<void*>(ws_scale),
                    static_cast<void*>(xs_scale), out, workspace})
      cudaFree(p);
  }

  bool run(const cublasLtMatmulAlgo_t& algo, cudaStream_t stream = nullptr) const {
    const float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(lt, desc, &alpha, w, a, x, b, &beta, out, c, out, c, &algo, workspace, workspace_bytes,
                          stream) == CUBLAS_STATUS_SUCCESS;
  }
  // cuBLASLt's first heuristic result (what the engine runs) and its waves.
  cublasLtMatmulHeuristicResult_t heuristic() const {
    cublasLtMatmulPreference_t pref = nullptr;
    LT(cublasLtMatmulPreferenceCreate(&pref));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                            sizeof workspace_bytes));
    cublasLtMatmulHeuristicResult_t h{};
    int returned = 0;
    LT(cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, c, c, pref, 1, &h, &returned));
    cublasLtMatmulPreferenceDestroy(pref);
    if (returned == 0) {
      std::fprintf(stderr, "no heuristic result for %d x %d x %d\n", m, n, k);
      std::exit(1);
    }
    return h;
  }
  // Median µs of 15 timed runs after 3 warm-ups; < 0 when a run fails.
  double time_us(const cublasLtMatmulAlgo_t& algo) const {
    for (int i = 0; i < 3; ++i)
      if (!run(algo)) return -1;
    if (cudaDeviceSynchronize() != cudaSuccess) return -1;
    return median_timed_us(nullptr, 15, [&] { run(algo); });
  }
  // The configuration's waves and required workspace, if cuBLASLt accepts it for this shape.
  bool check(const cublasLtMatmulAlgo_t& algo, float& waves) const {
    cublasLtMatmulHeuristicResult_t r{};
    if (cublasLtMatmulAlgoCheck(lt, desc, a, b, c, c, &algo, &r) != CUBLAS_STATUS_SUCCESS) return false;
    waves = r.wavesCount;
    return r.workspaceSize <= workspace_bytes;
  }
};

template <class T>
std::vector<T> cap_list(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  std::size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS || bytes == 0) return {};
  std::vector<T> v(bytes / sizeof(T));
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, v.data(), bytes, &bytes) != CUBLAS_STATUS_SUCCESS) return {};
  return v;
}

int config_attr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  std::uint32_t v = 0;
  std::size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof v, &written);
  return static_cast<int>(v);
}

void survey(cublasLtHandle_t lt, const char* name, int n, int k, int m) {
  const gemm_case g(lt, m, n, k);
  const double flop = 2.0 * m * n * static_cast<double>(k);
  // cuBLASLt's heuristic (what the engine runs).
  cublasLtMatmulPreference_t pref = nullptr;
  LT(cublasLtMatmulPreferenceCreate(&pref));
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &g.workspace_bytes,
                                          sizeof g.workspace_bytes));
  cublasLtMatmulHeuristicResult_t h[8];
  int returned = 0;
  LT(cublasLtMatmulAlgoGetHeuristic(lt, g.desc, g.a, g.b, g.c, g.c, pref, 8, h, &returned));
  cublasLtMatmulPreferenceDestroy(pref);
  if (returned == 0) {
    std::printf("| %s | %d x %d | %d | no heuristic result | | | |\n", name, n, k, m);
    return;
  }
  const double base_us = g.time_us(h[0].algo);
  // Every listed algorithm x tile x cluster shape x split-K count that cuBLASLt accepts.
  int ids[128], nids = 0;
  LT(cublasLtMatmulAlgoGetIds(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF,
                              CUDA_R_16BF, 128, ids, &nids));
  std::vector<config> found;
  int checked = 0;
  const int hid = config_attr(h[0].algo, CUBLASLT_ALGO_CONFIG_ID), htile = config_attr(h[0].algo, CUBLASLT_ALGO_CONFIG_TILE_ID);
  for (int i = 0; i < nids; ++i) {
    cublasLtMatmulAlgo_t algo{};
    if (cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF,
                               CUDA_R_16BF, ids[i], &algo) != CUBLAS_STATUS_SUCCESS)
      continue;
    std::vector<std::uint32_t> tiles = cap_list<std::uint32_t>(algo, CUBLASLT_ALGO_CAP_TILE_IDS);
    if (tiles.empty()) tiles.push_back(CUBLASLT_MATMUL_TILE_UNDEFINED);
    std::vector<std::uint32_t> stages = cap_list<std::uint32_t>(algo, CUBLASLT_ALGO_CAP_STAGES_IDS);
    if (stages.empty()) stages.push_back(CUBLASLT_MATMUL_STAGES_UNDEFINED);
    std::int32_t splitk_support = 0;
    std::size_t written = 0;
    cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk_support, sizeof splitk_support,
                                      &written);
    // Seeds: the initialised algorithm, and for the heuristic's own id its configuration (whose other attributes, e.g.
    // the inner shape, an initialised algorithm may lack; the first survey's 20,736 initialised configurations were
    // all refused by cublasLtMatmulAlgoCheck).
    const cublasLtMatmulAlgo_t seeds[2] = {algo, h[0].algo};
    for (int si = 0; si < (ids[i] == hid ? 2 : 1); ++si)
      for (const std::uint32_t tile : tiles)
        for (const std::uint32_t stage : stages)
          for (const std::uint32_t cluster : {CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_1x1x1,
                                              CUBLASLT_CLUSTER_SHAPE_2x1x1, CUBLASLT_CLUSTER_SHAPE_1x2x1})
            for (const std::int32_t splitk : {1, 2, 3, 4}) {
              if (splitk > 1 && !splitk_support) continue;
              cublasLtMatmulAlgo_t cfg = seeds[si];
              cublasLtMatmulAlgoConfigSetAttribute(&cfg, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile);
              cublasLtMatmulAlgoConfigSetAttribute(&cfg, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stage, sizeof stage);
              cublasLtMatmulAlgoConfigSetAttribute(&cfg, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster);
              cublasLtMatmulAlgoConfigSetAttribute(&cfg, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk);
              float waves = 0;
              ++checked;
              if (!g.check(cfg, waves)) continue;
              config c{cfg, ids[i], static_cast<int>(tile), static_cast<int>(cluster), splitk, waves, 0};
              c.us = g.time_us(cfg);
              if (c.us > 0) found.push_back(c);
            }
  }
  // The heuristic's configuration itself must pass the check: if it does not, the check (not the search) is wrong.
  float hwaves = 0;
  const bool heuristic_checks = g.check(h[0].algo, hwaves);
  std::sort(found.begin(), found.end(), [](const config& a, const config& b) { return a.us < b.us; });
  if (found.empty()) {
    std::printf("| %s | %d x %d | %d | %.1f (algo %d, tile %d, stages %d, %.2f waves, %d heuristic results) | none of %d "
                "accepted (the heuristic's own configuration %s the check) | | |\n",
                name, n, k, m, base_us, hid, htile, config_attr(h[0].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                h[0].wavesCount, returned, checked, heuristic_checks ? "passes" : "fails");
    return;
  }
  const config& best = found.front();
  std::printf("| %s | %d x %d | %d | %.1f (algo %d, tile %d, %.2f waves; %d heuristic results) | %.1f (algo %d, tile %d, "
              "cluster %d, split-K %d, %.2f waves; %zu of %d configurations ran) | %.0f | %.2fx |\n",
              name, n, k, m, base_us, hid, htile, h[0].wavesCount, returned, best.us, best.id, best.tile, best.cluster,
              best.splitk, best.waves, found.size(), checked, flop / best.us / 1e6, base_us / best.us);
}

// out[i] += part[i] (bf16), the split tail's second half-K product added to the first.
__global__ void add_bf16(std::uint16_t* out, const std::uint16_t* part, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    const float a = __uint_as_float(std::uint32_t{out[i]} << 16), b = __uint_as_float(std::uint32_t{part[i]} << 16);
    out[i] = static_cast<std::uint16_t>(__float_as_uint(a + b) >> 16);
  }
}

// Median µs of 15 timed runs (3 warm-ups) of `work(s0, s1, s2)`: three streams forked from s0 and joined back to it.
template <class Work>
double time_forked(Work&& work) {
  cudaStream_t s[3];
  cudaEvent_t fork, join[2];
  for (auto& x : s) CK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
  CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  for (auto& e : join) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const auto once = [&] {
    CK(cudaEventRecord(fork, s[0]));
    CK(cudaStreamWaitEvent(s[1], fork));
    CK(cudaStreamWaitEvent(s[2], fork));
    work(s[0], s[1], s[2]);
    CK(cudaEventRecord(join[0], s[1]));
    CK(cudaEventRecord(join[1], s[2]));
    CK(cudaStreamWaitEvent(s[0], join[0]));
    CK(cudaStreamWaitEvent(s[0], join[1]));
  };
  for (int i = 0; i < 3; ++i) once();
  CK(cudaStreamSynchronize(s[0]));
  const double us = median_timed_us(s[0], 15, once);
  CK(cudaStreamSynchronize(s[0]));
  for (auto& x : s) CK(cudaStreamDestroy(x));
  CK(cudaEventDestroy(fork));
  for (auto& e : join) CK(cudaEventDestroy(e));
  return us;
}

// The second wave taken apart by hand (--split-tail): the first `head` rows as one GEMM, one round of 128 x 128
// tiles at N = 4,096, and the remaining rows as two half-K GEMMs on two more streams, their partial products added
// by a small kernel. cuBLASLt accepts no split-K for this scaling, so this is the only way to make the tail's tiles
// shorter. Timing only (unit scales, random codes): an engine would also need each half's scales in the layout
// cuBLASLt derives from the half's shape. Against the whole GEMM and against head and tail unsplit on two streams.
void split_tail(cublasLtHandle_t lt, const char* name, int n, int k, int m, int head) {
  if (m <= head || k % 256 != 0) return;
  const int tail = m - head;
  const gemm_case whole(lt, m, n, k), g_head(lt, head, n, k), g_tail(lt, tail, n, k), g_t0(lt, tail, n, k / 2),
      g_t1(lt, tail, n, k / 2);
  const auto hw = whole.heuristic(), hh = g_head.heuristic(), ht = g_tail.heuristic(), h0 = g_t0.heuristic(),
             h1 = g_t1.heuristic();
  const double whole_us = whole.time_us(hw.algo);
  const double head_us = g_head.time_us(hh.algo);
  const double unsplit_us = time_forked([&](cudaStream_t s0, cudaStream_t s1, cudaStream_t) {
    g_head.run(hh.algo, s0);
    g_tail.run(ht.algo, s1);
  });
  const std::size_t tail_elems = std::size_t(n) * zipage::cuda::fp8::padded_rows(tail);
  cudaEvent_t second_half;  // the add waits for the second half on s1
  CK(cudaEventCreateWithFlags(&second_half, cudaEventDisableTiming));
  const double split_us = time_forked([&](cudaStream_t s0, cudaStream_t s1, cudaStream_t s2) {
    g_head.run(hh.algo, s0);
    g_t0.run(h0.algo, s1);
    g_t1.run(h1.algo, s2);
    CK(cudaEventRecord(second_half, s2));
    CK(cudaStreamWaitEvent(s1, second_half));
    add_bf16<<<132, 256, 0, s1>>>(static_cast<std::uint16_t*>(g_t0.out), static_cast<const std::uint16_t*>(g_t1.out),
                                  tail_elems);
  });
  CK(cudaEventDestroy(second_half));
  std::printf("| %s | %d x %d | %d = %d + %d | %.1f (%.2f waves) | %.1f | %.1f | %.1f (half-K tail %.2f waves) | %.2fx |\n",
              name, n, k, m, head, tail, whole_us, hw.wavesCount, head_us, unsplit_us, split_us, h0.wavesCount,
              whole_us / split_us);
}

// --sm90: our kernel against cuBLASLt's heuristic on the same codes and scales (scales varying per block and token).
void compare_sm90(cublasLtHandle_t lt, const zipage::cuda::energy_meter& meter, const char* name, int n, int k, int m) {
  gemm_case g(lt, m, n, k);
  const int mp = zipage::cuda::fp8::padded_rows(m);
  fill_scales<<<64, 256>>>(g.ws_scale, std::size_t((n + 127) / 128) * zipage::cuda::fp8::weight_scale_ld(k), 7);
  fill_scales<<<64, 256>>>(g.xs_scale, std::size_t((k + 127) / 128) * mp, 9);
  void* ours = nullptr;
  CK(cudaMalloc(&ours, std::size_t(n) * mp * 2));
  zipage::cuda::fp8::gemm_sm90_args args{g.x, g.xs_scale, g.w, g.ws_scale, ours, m, n, k};
  args.workspace = g.workspace;  // as the backend does: cuBLASLt's workspace holds the split partials
  args.workspace_bytes = g.workspace_bytes;
  int* counters = nullptr;
  CK(cudaMalloc(&counters, sizeof(int) * zipage::cuda::fp8::gemm_sm90_max_split_tiles));
  CK(cudaMemset(counters, 0, sizeof(int) * zipage::cuda::fp8::gemm_sm90_max_split_tiles));
  args.counters = counters;
  if (!zipage::cuda::fp8::gemm_sm90_supported(args)) {
    std::printf("| %s | %d x %d | %d | not supported here | | | | |\n", name, n, k, m);
    cudaFree(ours);
    cudaFree(counters);
    return;
  }
  const auto plan = zipage::cuda::fp8::gemm_sm90_plan_for(args);
  const bool shared = plan.dp_tiles < plan.tiles;
  const auto h = g.heuristic();
  const auto run_lt = [&] { g.run(h.algo); };
  const auto run_ours = [&] { zipage::cuda::fp8::gemm_sm90(args, nullptr); };
  run_lt();
  run_ours();
  CK(cudaDeviceSynchronize());
  // The largest |ours - cuBLASLt| over the largest |cuBLASLt| (both bf16, m rows).
  std::vector<std::uint16_t> a(std::size_t(m) * n), b(a.size());
  CK(cudaMemcpy(a.data(), g.out, a.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(b.data(), ours, b.size() * 2, cudaMemcpyDeviceToHost));
  const auto f = [](std::uint16_t v) {
    const std::uint32_t u = std::uint32_t{v} << 16;
    float x;
    std::memcpy(&x, &u, 4);
    return x;
  };
  double worst = 0, peak = 0;
  std::size_t nonfinite = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(f(b[i]))) ++nonfinite;
    worst = std::max(worst, std::fabs(double(f(a[i])) - f(b[i])));
    peak = std::max(peak, std::fabs(double(f(a[i]))));
  }
  const auto median_us = [](auto&& fn) {
    for (int i = 0; i < 3; ++i) fn();
    CK(cudaDeviceSynchronize());
    return median_timed_us(nullptr, 15, fn);
  };
  // Joules per call over ~1 s of back-to-back calls (NVML's energy counter), 0 without a meter.
  const auto joules = [&](auto&& fn, double us) {
    if (!meter.available()) return 0.0;
    const int calls = std::max(1, static_cast<int>(1e6 / std::max(us, 1.0)));
    const auto before = meter.read();
    for (int i = 0; i < calls; ++i) fn();
    CK(cudaDeviceSynchronize());
    const auto after = meter.read();
    return before && after ? (after->joules - before->joules) / calls : 0.0;
  };
  const double lt_us = median_us(run_lt), ours_us = median_us(run_ours);
  double unsplit_us = ours_us;  // the same kernel with whole tiles only, where the plan shares tiles
  if (shared) {
    zipage::cuda::fp8::gemm_sm90_args one = args;
    one.splits = 1;
    unsplit_us = median_us([&] { zipage::cuda::fp8::gemm_sm90(one, nullptr); });
  }
  // Determinism: after the timed runs, ours again must give the first run's bits.
  std::vector<std::uint16_t> again(b.size());
  run_ours();
  CK(cudaMemcpy(again.data(), ours, again.size() * 2, cudaMemcpyDeviceToHost));
  std::size_t changed = 0;
  for (std::size_t i = 0; i < b.size(); ++i) changed += again[i] != b[i];
  std::size_t at = 0;  // where the largest difference from cuBLASLt is
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::fabs(double(f(a[i])) - f(b[i])) == worst) {
      at = i;
      break;
    }
  const double lt_j = joules(run_lt, lt_us), ours_j = joules(run_ours, ours_us);
  const double flop = 2.0 * m * n * static_cast<double>(k);
  std::printf("| %s | %d x %d | %d | %.1f (%.2f waves), %.0f TFLOP/s, %.2f mJ | %.1f (%d-token tiles, %d CTAs, %d of %d tiles "
              "whole; %.1f whole only), %.0f TFLOP/s, %.2f mJ | %.2fx | "
              "%.2fx | %.3g of %.3g%s (row %zu, col %zu); %zu values changed on a rerun |\n",
              name, n, k, m, lt_us, h.wavesCount, flop / lt_us / 1e6, lt_j * 1e3, ours_us, plan.tile_rows, plan.ctas,
              plan.dp_tiles, plan.tiles, unsplit_us, flop / ours_us / 1e6,
              ours_j * 1e3, lt_us / ours_us, ours_j > 0 ? lt_j / ours_j : 0.0, worst, peak,
              nonfinite ? (" (" + std::to_string(nonfinite) + " non-finite)").c_str() : "", at / n, at % n, changed);
  cudaFree(ours);
  cudaFree(counters);
}

// --sm90-graph: GPU time per call of each kernel, in a graph of calls cycling over weight copies (> 160 MB in all).
// scaling (--sm90-scaling): ours with 128-token tiles and stream-K planned for all, 3/4, 1/2 and 1/4 of the
// multiprocessors instead of its plans. If the kernel is bound by the L2's total bandwidth, fewer CTAs each run
// faster (and multicast, which cuts the L2's reads, would pay); if by each multiprocessor's own rate, time scales
// with 1 / CTAs.
void graph_sm90(cublasLtHandle_t lt, const char* name, int n, int k, int m, bool scaling = false) {
  gemm_case g(lt, m, n, k);
  const int mp = zipage::cuda::fp8::padded_rows(m);
  const std::size_t wbytes = std::size_t(n) * k;
  const int copies = static_cast<int>(std::max<std::size_t>(2, ((std::size_t{160} << 20) + wbytes - 1) / wbytes));
  std::vector<std::uint8_t*> ws(copies);
  for (int i = 0; i < copies; ++i) {
    CK(cudaMalloc(&ws[i], wbytes));
    fill_codes<<<1024, 256>>>(ws[i], wbytes, 11u + i);
  }
  void* ours = nullptr;
  int* counters = nullptr;
  CK(cudaMalloc(&ours, std::size_t(n) * mp * 2));
  CK(cudaMalloc(&counters, sizeof(int) * zipage::cuda::fp8::gemm_sm90_max_split_tiles));
  CK(cudaMemset(counters, 0, sizeof(int) * zipage::cuda::fp8::gemm_sm90_max_split_tiles));
  CK(cudaDeviceSynchronize());
  const auto h = g.heuristic();
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const int calls = 2 * copies;
  // µs per call: a graph of `calls` launches of `one(weight)`, replayed 3 times untimed and 10 times timed (median).
  const auto per_call = [&](auto&& one) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; ++i) one(ws[i % copies]);
    CK(cudaStreamEndCapture(st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(exec, st));
    CK(cudaStreamSynchronize(st));
    const double us = median_timed_us(st, 10, [&] { CK(cudaGraphLaunch(exec, st)); }) / calls;
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    return us;
  };
  const float alpha = 1.0f, beta = 0.0f;
  const double lt_us = per_call([&](std::uint8_t* w) {
    LT(cublasLtMatmul(g.lt, g.desc, &alpha, w, g.a, g.x, g.b, &beta, g.out, g.c, g.out, g.c, &h.algo, g.workspace,
                      g.workspace_bytes, st));
  });
  // Our kernel's plans: 64-token tiles whole, in 2, 4, 8 equal splits and stream-K; 128-token tiles whole and
  // stream-K (over the last rounds where they are not whole). "auto" marks the plan gemm_sm90 picks unasked.
  struct variant {
    int tile_rows, splits, sms = 0;
  };
  const zipage::cuda::fp8::gemm_sm90_args asked{g.x, g.xs_scale, g.w, g.ws_scale, ours, m, n, k, 0, g.workspace,
                                                g.workspace_bytes, counters};
  const auto auto_plan = zipage::cuda::fp8::gemm_sm90_plan_for(asked);
  double best = 1e30;
  std::string best_name, row;
  constexpr int sk = zipage::cuda::fp8::gemm_sm90_stream_k;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const std::vector<variant> variants =
      scaling ? std::vector<variant>{{128, sk, sms}, {128, sk, 3 * sms / 4}, {128, sk, sms / 2}, {128, sk, sms / 4}}
              : std::vector<variant>{{64, 1}, {64, 2}, {64, 4}, {64, 8}, {64, sk}, {128, 1}, {128, sk}};
  for (const variant v : variants) {
    zipage::cuda::fp8::gemm_sm90_args args = asked;
    args.tile_rows = v.tile_rows, args.splits = v.splits, args.sms = v.sms;
    const auto plan = zipage::cuda::fp8::gemm_sm90_plan_for(args);
    if (plan.workspace_bytes() > g.workspace_bytes || (v.splits > 1 && plan.ctas != plan.tiles * v.splits)) continue;
    const double us = per_call([&](std::uint8_t* w) {
      args.w_codes = w;
      zipage::cuda::fp8::gemm_sm90(args, st);
    });
    char name_buf[64], buf[128];
    std::snprintf(name_buf, sizeof name_buf, "%d/%s", v.tile_rows,
                  v.splits == sk ? "stream-K" : v.splits == 1 ? "whole" : (std::to_string(v.splits) + " splits").c_str());
    if (scaling)
      std::snprintf(name_buf, sizeof name_buf, "%d CTAs (%.0f TFLOP/s, %.2f per CTA)", plan.ctas,
                    2.0 * m * n * double(k) / us / 1e6, 2.0 * m * n * double(k) / us / 1e6 / plan.ctas);
    const bool is_auto = plan.tile_rows == auto_plan.tile_rows && plan.ctas == auto_plan.ctas &&
                         plan.dp_tiles == auto_plan.dp_tiles;
    std::snprintf(buf, sizeof buf, "%s%s%s: %.1f", row.empty() ? "" : ", ", name_buf, is_auto ? " (auto)" : "", us);
    row += buf;
    if (us < best) best = us, best_name = name_buf;
  }
  const double gbs = double(wbytes) / (lt_us * 1e-6) / 1e9;
  std::printf("| %s | %d x %d | %d | %d | %.1f (%.0f GB/s of weight) | %s | %s | %.2fx |\n", name, n, k, m, copies,
              lt_us, gbs, row.c_str(), best_name.c_str(), lt_us / best);
  for (auto* w : ws) cudaFree(w);
  cudaFree(ours);
  cudaFree(counters);
  CK(cudaStreamDestroy(st));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ms;
  bool split = false, sm90 = false, sm90_graph = false, sm90_scaling = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--split-tail") split = true;
    else if (std::string(argv[i]) == "--sm90") sm90 = true;
    else if (std::string(argv[i]) == "--sm90-graph") sm90_graph = true;
    else if (std::string(argv[i]) == "--sm90-scaling") sm90_graph = sm90_scaling = true;
    else ms.push_back(std::atoi(argv[i]));
  }
  if (ms.empty()) ms = {512, 662, 704, 1024};
  for (const int m : ms)
    if (m <= 0) {
      std::fprintf(stderr, "bench_fp8_gemm_configs: rows must be positive, got %d\n", m);
      return 2;
    }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 0;
  }
  cublasLtHandle_t lt;
  LT(cublasLtCreate(&lt));
  const struct {
    const char* name;
    int n, k;
  } shapes[] = {{"o", 4096, 4096}, {"q|k|v", 6144, 4096}, {"gate|up", 24576, 4096}, {"down", 4096, 12288}};
  if (sm90_graph) {
    std::printf("| GEMM | N x K | M | weight copies | cuBLASLt, us per call | fp8::gemm_sm90 by tile rows / plan, us per call | "
                "fastest | cuBLASLt / fastest |\n|---|---|---:|---:|---|---|---:|---:|\n");
    for (const auto& s : shapes)
      for (const int m : ms) graph_sm90(lt, s.name, s.n, s.k, m, sm90_scaling);
    cublasLtDestroy(lt);
    return 0;
  }
  if (sm90) {
    const zipage::cuda::energy_meter meter;
    std::printf("| GEMM | N x K | M | cuBLASLt heuristic | fp8::gemm_sm90 | time ratio (cuBLASLt / ours) | energy ratio | "
                "max |ours - cuBLASLt| of max |out| |\n|---|---|---:|---|---|---:|---:|---|\n");
    for (const auto& s : shapes)
      for (const int m : ms) compare_sm90(lt, meter, s.name, s.n, s.k, m);
    cublasLtDestroy(lt);
    return 0;
  }
  if (split) {
    std::printf("| GEMM | N x K | M = head + tail | whole, us | head alone, us | head + tail on 2 streams, us | head + "
                "2 half-K tails on 3 streams + add, us | whole / split |\n|---|---|---|---|---:|---:|---|---:|\n");
    for (const auto& s : shapes)
      for (const int m : ms) split_tail(lt, s.name, s.n, s.k, m, 512);
    cublasLtDestroy(lt);
    return 0;
  }
  std::printf("| GEMM | N x K | M | cuBLASLt heuristic, us | fastest configuration, us | its TFLOP/s | speed-up |\n"
              "|---|---|---:|---|---|---:|---:|\n");
  for (const auto& s : shapes)
    for (const int m : ms) survey(lt, s.name, s.n, s.k, m);
  cublasLtDestroy(lt);
  return 0;
}
