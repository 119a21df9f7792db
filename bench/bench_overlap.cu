// Overlap inside a decode step (issue 14 part 3): does running one nano-batch's attention beside the other's
// GEMMs on two streams approach max(GEMM, attention) instead of their sum?
//
// One decoder layer of the Qwen3-8B shape (hidden 4096, 32/8 heads of 128, FFN 12288; bf16 weights and
// activations, bf16 KV, block 16, shuffled pages, KV lengths uniform in [2048, 2304]: the compressed steady
// state at budget 2048) for a decode batch of B sequences, timed as CUDA graphs of L layers (weights shared by
// the layers: 400 MB, far above L2):
//   gemm      the seven linears (q, k, v, o, gate, up, down) at M = B, cuBLASLt as the engine calls them;
//   attn      the paged decode attention of the B sequences;
//   serial    gemm then attn on one stream (what a step does today);
//   nano2     two nano-batches of B/2: A's attention runs on a second stream beside B's GEMMs and the other
//             way round (compute stream: A.qkv, B.post(l-1)+B.qkv, A.post+A.qkv(l+1), ...; attention stream:
//             A.attn, B.attn, ... joined by events), captured into one graph;
//   nano2_hp  nano2 with the attention stream at the higher priority;
//   nano2_smN nano2 with every GEMM asking cuBLASLt for N SMs (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET), leaving the
//             others to the attention beside it;
//   green_aN  nano2 with the SMs partitioned by green contexts: the attention stream's context gets N SMs, the GEMM
//             stream's the rest (eager launches, no graph); attn_aN / gemm_aN: each alone in its partition.
// Per-layer times (us) and the ratio of each to the ceiling max(gemm, attn) measured in the same run.
//
//   bench_overlap [--benchmark_filter=...]   (prints a Markdown summary at the end)
#include <benchmark/benchmark.h>
#include <cublasLt.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_buffers.hpp"
#include "zipage/backend/cuda/attention.hpp"
#include "zipage/backend/cuda/common.cuh"
#include "zipage/backend/cuda/event_timer.cuh"
#include "zipage/cuda/device.hpp"

namespace {

namespace zc = zipage::cuda;
#define CK(expr) ZIPAGE_CUDA_CHECK(expr)
#define LT(expr)                                                                                 \
  do {                                                                                           \
    const cublasStatus_t s_ = (expr);                                                            \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                             \
      throw std::runtime_error("cuBLASLt error " + std::to_string(int(s_)) + " in " #expr);     \
  } while (0)

template <class T>
using dbuf = zipage::testing::device_buffer<T>;
using zipage::testing::median;

constexpr int kHidden = 4096, kQHeads = 32, kKvHeads = 8, kHeadDim = 128, kFfn = 12288;
constexpr int kBlock = 16, kLayers = 8;
constexpr std::size_t kWorkspace = std::size_t(32) << 20;

__global__ void fill_bf16(std::uint16_t* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 15;
    x *= 0x2c1b3c6du;
    x ^= x >> 12;
    const float f = ((x & 0xffff) / 65536.0f * 2.0f - 1.0f) * 0.05f;
    p[i] = __bfloat16_as_ushort(__float2bfloat16_rn(f));
  }
}
void fill(void* p, std::size_t n, std::uint32_t seed) {
  fill_bf16<<<2048, 256>>>(static_cast<std::uint16_t*>(p), n, seed);
  CK(cudaGetLastError());
}

// out [m][n] = x [m][k] · w [n][k]ᵀ, bf16 in and out, fp32 accumulate: the engine's cuBLASLt call (column-major
// view: out^T = w · x^T), with the heuristic's first algorithm.
struct gemm_plan {
  cublasLtMatmulDesc_t desc{};
  cublasLtMatrixLayout_t a{}, b{}, c{};
  cublasLtMatmulAlgo_t algo{};
};
gemm_plan make_plan(cublasLtHandle_t lt, int m, int n, int k, int sms) {
  gemm_plan p;
  LT(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  if (sms > 0) {
    const std::int32_t v = sms;
    LT(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &v, sizeof v));
  }
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  LT(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  LT(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  LT(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, k, n, k));
  LT(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, k, m, k));
  LT(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_16BF, n, m, n));
  cublasLtMatmulPreference_t pref;
  LT(cublasLtMatmulPreferenceCreate(&pref));
  const std::size_t ws = kWorkspace;
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  cublasLtMatmulHeuristicResult_t r{};
  int got = 0;
  LT(cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.a, p.b, p.c, p.c, pref, 1, &r, &got));
  LT(cublasLtMatmulPreferenceDestroy(pref));
  if (got == 0) {
    std::fprintf(stderr, "no cuBLASLt algorithm for %dx%dx%d\n", m, n, k);
    std::exit(1);
  }
  p.algo = r.algo;
  return p;
}

struct linear {
  int n, k;
  dbuf<std::uint16_t> w;
  linear(int n_, int k_, std::uint32_t seed) : n(n_), k(k_), w(std::size_t(n_) * k_) { fill(w.p, w.n, seed); }
};

// The layer's weights (shared by all layers of a graph) and a cuBLASLt handle.
struct model {
  cublasLtHandle_t lt{};
  linear wq{kHidden, kHidden, 1}, wk{kKvHeads * kHeadDim, kHidden, 2}, wv{kKvHeads * kHeadDim, kHidden, 3},
      wo{kHidden, kHidden, 4}, wg{kFfn, kHidden, 5}, wu{kFfn, kHidden, 6}, wd{kHidden, kFfn, 7};
  std::map<std::tuple<int, int, int, int>, gemm_plan> plans;
  int sms = 0;  // SM count target of the GEMMs issued now (0: all)
  model() { LT(cublasLtCreate(&lt)); }
  const gemm_plan& plan(int m, int n, int k) {
    auto key = std::make_tuple(m, n, k, sms);
    auto it = plans.find(key);
    if (it == plans.end()) it = plans.emplace(key, make_plan(lt, m, n, k, sms)).first;
    return it->second;
  }
  void gemm(const linear& l, const void* x, void* out, int m, void* ws, cudaStream_t s) {
    const gemm_plan& p = plan(m, l.n, l.k);
    const float alpha = 1.0f, beta = 0.0f;
    LT(cublasLtMatmul(lt, p.desc, &alpha, l.w.p, p.a, x, p.b, &beta, out, p.c, out, p.c, &p.algo, ws, kWorkspace, s));
  }
};
model* g_model = nullptr;
dbuf<std::uint16_t>* g_k = nullptr;  // KV pools [blocks][16][8][128]
dbuf<std::uint16_t>* g_v = nullptr;
std::size_t g_pool_blocks = 0;

// One nano-batch (or the whole batch): activations, page table and attention plan.
struct half_batch {
  int m = 0;
  dbuf<std::uint16_t> x, q, kv, attn, ffn, out;
  dbuf<std::int32_t> indptr, indices, lens;
  dbuf<std::uint8_t> ws, attn_ws;
  zc::decode_params p;
  zc::decode_plan plan;
  std::size_t attn_ws_bytes = 0;

  half_batch(int m_, int first_seq, std::mt19937_64& rng)
      : m(m_), x(std::size_t(m_) * kHidden), q(std::size_t(m_) * kHidden), kv(std::size_t(m_) * 2 * kKvHeads * kHeadDim),
        attn(std::size_t(m_) * kHidden), ffn(std::size_t(m_) * 2 * kFfn), out(std::size_t(m_) * kHidden), ws(kWorkspace) {
    fill(x.p, x.n, 11 + first_seq);
    fill(q.p, q.n, 12 + first_seq);
    std::vector<std::int32_t> ip{0}, ln;
    for (int s = 0; s < m; ++s) {
      ln.push_back(std::uniform_int_distribution<int>(2048, 2304)(rng));
      ip.push_back(ip.back() + (ln.back() + kBlock - 1) / kBlock);
    }
    std::vector<std::int32_t> ids(g_pool_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(static_cast<std::size_t>(ip.back()));
    indptr = dbuf<std::int32_t>(ip);
    indices = dbuf<std::int32_t>(ids);
    lens = dbuf<std::int32_t>(ln);
    p.q = q.p;
    p.out = attn.p;
    p.kv.k_cache = g_k->p;
    p.kv.v_cache = g_v->p;
    p.kv.page_indptr = indptr.p;
    p.kv.page_indices = indices.p;
    p.kv.kv_len = lens.p;
    p.num_seqs = m;
    p.num_q_heads = kQHeads;
    p.kv.num_kv_heads = kKvHeads;
    p.kv.head_dim = kHeadDim;
    p.kv.block_size = kBlock;
    p.max_kv_len = *std::max_element(ln.begin(), ln.end());
    p.scale = 1.0f / std::sqrt(float(kHeadDim));
    plan = zc::plan_decode(p, 0, 0);
    attn_ws_bytes = zc::decode_workspace_bytes(p, plan);
    attn_ws = dbuf<std::uint8_t>(attn_ws_bytes);
  }
  half_batch(half_batch&&) = default;

  // q/k/v of this layer (reads x).
  void pre(cudaStream_t s) {
    model& md = *g_model;
    md.gemm(md.wq, x.p, q.p, m, ws.p, s);
    md.gemm(md.wk, x.p, kv.p, m, ws.p, s);
    md.gemm(md.wv, x.p, kv.p + std::size_t(m) * kKvHeads * kHeadDim, m, ws.p, s);
  }
  void attention(cudaStream_t s) { zc::paged_decode_attention(p, plan, attn_ws.p, attn_ws_bytes, s); }
  // o, gate, up, down of this layer (reads attn; writes x for the next layer).
  void post(cudaStream_t s) {
    model& md = *g_model;
    md.gemm(md.wo, attn.p, out.p, m, ws.p, s);
    md.gemm(md.wg, out.p, ffn.p, m, ws.p, s);
    md.gemm(md.wu, out.p, ffn.p + std::size_t(m) * kFfn, m, ws.p, s);
    md.gemm(md.wd, ffn.p, x.p, m, ws.p, s);
  }
};

// Two green contexts splitting the SMs: `attn_sms` (rounded by the driver) for attention, the rest for GEMMs; a
// stream in each. ok = false (with the driver's error) where the driver cannot.
struct green_split {
  bool ok = false;
  std::string error;
  CUcontext attn_ctx{}, gemm_ctx{};
  cudaStream_t attn{}, gemm{};
  int attn_sms = 0, gemm_sms = 0;
};
green_split make_green_split(int attn_sms) {
  green_split g;
  auto ok = [&](CUresult r, const char* what) {
    if (r == CUDA_SUCCESS) return true;
    const char* msg = nullptr;
    cuGetErrorString(r, &msg);
    g.error = std::string(what) + ": " + (msg ? msg : "?");
    return false;
  };
  CUdevice dev;
  CUdevResource all{}, part{}, rest{};
  unsigned groups = 1;
  CUdevResourceDesc d_part{}, d_rest{};
  CUgreenCtx g_part{}, g_rest{};
  CUstream s_part{}, s_rest{};
  if (!ok(cuDeviceGet(&dev, 0), "cuDeviceGet") || !ok(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource") ||
      !ok(cuDevSmResourceSplitByCount(&part, &groups, &all, &rest, 0, static_cast<unsigned>(attn_sms)), "cuDevSmResourceSplitByCount") ||
      !ok(cuDevResourceGenerateDesc(&d_part, &part, 1), "cuDevResourceGenerateDesc") ||
      !ok(cuDevResourceGenerateDesc(&d_rest, &rest, 1), "cuDevResourceGenerateDesc") ||
      !ok(cuGreenCtxCreate(&g_part, d_part, dev, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate") ||
      !ok(cuGreenCtxCreate(&g_rest, d_rest, dev, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate") ||
      !ok(cuGreenCtxStreamCreate(&s_part, g_part, CU_STREAM_NON_BLOCKING, 0), "cuGreenCtxStreamCreate") ||
      !ok(cuGreenCtxStreamCreate(&s_rest, g_rest, CU_STREAM_NON_BLOCKING, 0), "cuGreenCtxStreamCreate") ||
      !ok(cuCtxFromGreenCtx(&g.attn_ctx, g_part), "cuCtxFromGreenCtx") || !ok(cuCtxFromGreenCtx(&g.gemm_ctx, g_rest), "cuCtxFromGreenCtx"))
    return g;
  g.attn = reinterpret_cast<cudaStream_t>(s_part);
  g.gemm = reinterpret_cast<cudaStream_t>(s_rest);
  g.attn_sms = static_cast<int>(part.sm.smCount);
  g.gemm_sms = static_cast<int>(rest.sm.smCount);
  g.ok = true;
  return g;
}

enum class mode { gemm, attn, serial, nano2, nano2_hp, green, green_attn, green_gemm };
const char* name_of(mode m) {
  switch (m) {
    case mode::gemm: return "gemm";
    case mode::attn: return "attn";
    case mode::serial: return "serial";
    case mode::nano2: return "nano2";
    case mode::nano2_hp: return "nano2_hp";
    case mode::green: return "green";
    case mode::green_attn: return "green_attn";
    case mode::green_gemm: return "green_gemm";
  }
  return "?";
}

std::map<int, std::map<std::string, double>> g_us;  // batch -> mode -> us per layer
constexpr int kSmTargets[] = {16, 32, 48, 66, 88};

void bm_layer(benchmark::State& state, int batch, mode md, int sms = 0) {
  g_model->sms = sms;
  std::mt19937_64 rng(batch);
  const bool nano = md == mode::nano2 || md == mode::nano2_hp;
  std::vector<half_batch> parts;
  parts.reserve(2);
  if (nano) {
    parts.emplace_back(batch / 2, 0, rng);
    parts.emplace_back(batch - batch / 2, batch / 2, rng);
  } else {
    parts.emplace_back(batch, 0, rng);
  }
  int lo = 0, hi = 0;
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t cs, as;
  CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithPriority(&as, cudaStreamNonBlocking, md == mode::nano2_hp ? hi : lo));
  cudaEvent_t fork, join, ready[2], done[2];
  for (cudaEvent_t* e : {&fork, &join, &ready[0], &ready[1], &done[0], &done[1]})
    CK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));

  auto record_layers = [&] {
    if (!nano) {
      for (int l = 0; l < kLayers; ++l) {
        half_batch& b = parts[0];
        if (md != mode::attn) b.pre(cs);
        if (md != mode::gemm) b.attention(cs);
        if (md != mode::attn) b.post(cs);
      }
      return;
    }
    CK(cudaEventRecord(fork, cs));
    CK(cudaStreamWaitEvent(as, fork, 0));
    half_batch &A = parts[0], &B = parts[1];
    A.pre(cs);
    for (int l = 0; l < kLayers; ++l) {
      CK(cudaEventRecord(ready[0], cs));          // A's q/k/v of layer l are done
      CK(cudaStreamWaitEvent(as, ready[0], 0));
      A.attention(as);
      CK(cudaEventRecord(done[0], as));
      if (l > 0) {                                // B's o/MLP of layer l-1 beside A's attention
        CK(cudaStreamWaitEvent(cs, done[1], 0));
        B.post(cs);
      }
      B.pre(cs);
      CK(cudaEventRecord(ready[1], cs));
      CK(cudaStreamWaitEvent(as, ready[1], 0));
      B.attention(as);
      CK(cudaEventRecord(done[1], as));
      CK(cudaStreamWaitEvent(cs, done[0], 0));    // A's o/MLP (and next q/k/v) beside B's attention
      A.post(cs);
      if (l + 1 < kLayers) A.pre(cs);
    }
    CK(cudaStreamWaitEvent(cs, done[1], 0));
    B.post(cs);
    CK(cudaEventRecord(join, as));
    CK(cudaStreamWaitEvent(cs, join, 0));
  };

  record_layers();  // eager warm-up: plans, kernel attributes
  CK(cudaDeviceSynchronize());
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
  record_layers();
  CK(cudaStreamEndCapture(cs, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  zc::event_timer timer;
  CK(cudaGraphLaunch(exec, cs));
  CK(cudaStreamSynchronize(cs));
  std::vector<double> per_layer;
  for (auto _ : state) {
    const double s = timer.time(cs, [&] { CK(cudaGraphLaunch(exec, cs)); }) / kLayers;
    per_layer.push_back(s);
    state.SetIterationTime(s);
  }
  const double s = median(per_layer);
  g_us[batch][sms ? std::string(name_of(md)) + "_sm" + std::to_string(sms) : std::string(name_of(md))] = s * 1e6;
  g_model->sms = 0;
  state.counters["us_per_layer"] = s * 1e6;
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  for (cudaEvent_t e : {fork, join, ready[0], ready[1], done[0], done[1]}) CK(cudaEventDestroy(e));
  CK(cudaStreamDestroy(cs));
  CK(cudaStreamDestroy(as));
}

// nano2's schedule with each stream in its own green context (current context switched per launch), timed eagerly
// (events on the primary context's legacy-free stream around the whole pass; no graph).
void bm_green_run(benchmark::State& state, int batch, int attn_sms, mode md);
void bm_green(benchmark::State& state, int batch, int attn_sms, mode md) {
  CUcontext primary{};
  cuCtxGetCurrent(&primary);
  try {
    bm_green_run(state, batch, attn_sms, md);
  } catch (const std::exception& e) {
    cuCtxSetCurrent(primary);
    cudaGetLastError();
    state.SkipWithError(e.what());
  }
}
void bm_green_run(benchmark::State& state, int batch, int attn_sms, mode md) {
  static std::map<int, green_split> splits;  // green contexts live for the program
  auto it = splits.find(attn_sms);
  if (it == splits.end()) it = splits.emplace(attn_sms, make_green_split(attn_sms)).first;
  green_split& g = it->second;
  if (!g.ok) {
    state.SkipWithError(("green contexts: " + g.error).c_str());
    return;
  }
  CUcontext primary{};
  cuCtxGetCurrent(&primary);
  std::mt19937_64 rng(batch);
  std::vector<half_batch> parts;
  parts.reserve(2);
  parts.emplace_back(batch / 2, 0, rng);
  parts.emplace_back(batch - batch / 2, batch / 2, rng);
  cudaEvent_t ready[2], done[2], start, stop;
  for (cudaEvent_t* e : {&ready[0], &ready[1], &done[0], &done[1]}) CK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&stop));
  auto on = [&](CUcontext c) { cuCtxSetCurrent(c); };
  half_batch &A = parts[0], &B = parts[1];
  auto pass = [&] {
    if (md == mode::green_attn) {
      on(g.attn_ctx);
      for (int l = 0; l < kLayers; ++l) A.attention(g.attn), B.attention(g.attn);
      return;
    }
    if (md == mode::green_gemm) {
      on(g.gemm_ctx);
      for (int l = 0; l < kLayers; ++l) A.pre(g.gemm), A.post(g.gemm), B.pre(g.gemm), B.post(g.gemm);
      return;
    }
    on(g.gemm_ctx);
    A.pre(g.gemm);
    for (int l = 0; l < kLayers; ++l) {
      on(g.gemm_ctx);
      CK(cudaEventRecord(ready[0], g.gemm));
      on(g.attn_ctx);
      CK(cudaStreamWaitEvent(g.attn, ready[0], 0));
      A.attention(g.attn);
      CK(cudaEventRecord(done[0], g.attn));
      on(g.gemm_ctx);
      if (l > 0) {
        CK(cudaStreamWaitEvent(g.gemm, done[1], 0));
        B.post(g.gemm);
      }
      B.pre(g.gemm);
      CK(cudaEventRecord(ready[1], g.gemm));
      on(g.attn_ctx);
      CK(cudaStreamWaitEvent(g.attn, ready[1], 0));
      B.attention(g.attn);
      CK(cudaEventRecord(done[1], g.attn));
      on(g.gemm_ctx);
      CK(cudaStreamWaitEvent(g.gemm, done[0], 0));
      A.post(g.gemm);
      if (l + 1 < kLayers) A.pre(g.gemm);
    }
    CK(cudaStreamWaitEvent(g.gemm, done[1], 0));
    B.post(g.gemm);
  };
  // Timed on the GEMM stream (the attention stream joins it at the end of the pass).
  auto timed = [&] {
    on(g.gemm_ctx);
    cudaStream_t t = md == mode::green_attn ? g.attn : g.gemm;
    if (md == mode::green_attn) on(g.attn_ctx);
    CK(cudaEventRecord(start, t));
    pass();
    on(md == mode::green_attn ? g.attn_ctx : g.gemm_ctx);
    CK(cudaEventRecord(stop, t));
    CK(cudaEventSynchronize(stop));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, start, stop));
    return ms * 1e-3;
  };
  timed();  // warm-up (plans, kernel attributes and modules in both contexts)
  std::vector<double> per_layer;
  for (auto _ : state) {
    const double s = timed() / kLayers;
    per_layer.push_back(s);
    state.SetIterationTime(s);
  }
  cuCtxSetCurrent(primary);
  const double s = median(per_layer);
  g_us[batch][std::string(name_of(md)) + "_a" + std::to_string(attn_sms)] = s * 1e6;
  state.counters["us_per_layer"] = s * 1e6;
  state.counters["attn_sms"] = g.attn_sms;
  state.counters["gemm_sms"] = g.gemm_sms;
  for (cudaEvent_t e : {ready[0], ready[1], done[0], done[1], start, stop}) CK(cudaEventDestroy(e));
}

constexpr int kGreenAttnSms[] = {88, 96, 100, 104, 120};

void print_summary() {
  std::printf("\n## one Qwen3-8B decoder layer, decode batch B, KV 2048-2304 (us per layer)\n\n");
  std::printf("| B | gemm | attn | ceiling max | serial | nano2 | nano2_hp |");
  for (int t : kSmTargets) std::printf(" nano2_sm%d |", t);
  std::printf(" serial / ceiling | best nano / ceiling | best nano / serial | best |\n|");
  for (std::size_t i = 0; i < 11 + std::size(kSmTargets); ++i) std::printf("---:|");
  std::printf("\n");
  for (auto& [b, m] : g_us) {
    const double ceil = std::max(m["gemm"], m["attn"]);
    std::string best_name = "nano2";
    for (const auto& [name, us] : m)
      if (name.rfind("nano2", 0) == 0 && us > 0 && us < m[best_name]) best_name = name;
    const double best = m[best_name];
    std::printf("| %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |", b, m["gemm"], m["attn"], ceil, m["serial"], m["nano2"],
                m["nano2_hp"]);
    for (int t : kSmTargets) std::printf(" %.1f |", m["nano2_sm" + std::to_string(t)]);
    std::printf(" %.1f%% | %.1f%% | %.2fx | %s |\n", 100.0 * ceil / m["serial"], 100.0 * ceil / best, m["serial"] / best,
                best_name.c_str());
  }
  std::printf("\n## green contexts: attention on N SMs, GEMMs on the rest (eager; us per layer)\n\n");
  std::printf("| B | attn SMs | attention alone | GEMMs alone | both, nano2 schedule | serial (graph, all SMs) | green / serial |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  for (auto& [b, m] : g_us)
    for (int a : kGreenAttnSms) {
      const std::string k = "_a" + std::to_string(a);
      if (m.count("green" + k) == 0) continue;
      std::printf("| %d | %d | %.1f | %.1f | %.1f | %.1f | %.2fx |\n", b, a, m["green_attn" + k], m["green_gemm" + k],
                  m["green" + k], m["serial"], m["serial"] / m["green" + k]);
    }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (zc::device_count() == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", zc::describe_device().c_str());
    return 0;
  }
  std::printf("device: %s\n", zc::describe_device(0).c_str());
  try {
    // KV pool: 8 GiB per side (262,144 blocks of 16 tokens), room for 1,024 sequences of 2,304 tokens; each
    // nano-batch draws its pages at random from all of it.
    g_pool_blocks = (std::size_t(8) << 30) / (std::size_t(kBlock) * kKvHeads * kHeadDim * 2);
    dbuf<std::uint16_t> k(g_pool_blocks * kBlock * kKvHeads * kHeadDim), v(g_pool_blocks * kBlock * kKvHeads * kHeadDim);
    fill(k.p, k.n, 21);
    fill(v.p, v.n, 22);
    g_k = &k;
    g_v = &v;
    model md;
    g_model = &md;
    CK(cudaDeviceSynchronize());
    for (int batch : {256, 512, 768, 1024})
      for (mode m : {mode::gemm, mode::attn, mode::serial, mode::nano2, mode::nano2_hp}) {
        const std::string name = "layer/B" + std::to_string(batch) + "/" + name_of(m);
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { bm_layer(st, batch, m); })
            ->UseManualTime()->Iterations(20)->Unit(benchmark::kMicrosecond);
        if (m != mode::nano2) continue;
        for (int sms : kSmTargets) {
          const std::string n2 = name + "_sm" + std::to_string(sms);
          benchmark::RegisterBenchmark(n2.c_str(), [=](benchmark::State& st) { bm_layer(st, batch, m, sms); })
              ->UseManualTime()->Iterations(20)->Unit(benchmark::kMicrosecond);
        }
      }
    for (int batch : {512, 1024})
      for (int a : kGreenAttnSms)
        for (mode m : {mode::green_attn, mode::green_gemm, mode::green}) {
          const std::string name = "green/B" + std::to_string(batch) + "/a" + std::to_string(a) + "/" + name_of(m);
          benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { bm_green(st, batch, a, m); })
              ->UseManualTime()->Iterations(10)->Unit(benchmark::kMicrosecond);
        }
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    print_summary();
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  return 0;
}
