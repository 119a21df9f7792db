// Paged decode (and prefill) attention on the GPU, against the device's copy bandwidth.
//
// Decode cases: batch x context x (q_heads, kv_heads), head_dim 128, block sizes 256 and 16, shuffled
// page tables, bf16 K/V with random values. Each case's time is the device time of one kernel pass
// (decode kernel + split merge), measured with CUDA events around a CUDA graph of R back-to-back
// passes (manual time). Small cases rotate over several disjoint KV sets so that they are not served
// from L2. Counters: KV bytes read per second (K and V of every attended token, read once) and its
// fraction of the device-to-device copy bandwidth (cudaMemcpy of 2 GiB, bytes read + written),
// measured first in the same program, and of a read-only streaming kernel's bandwidth (8 GiB). Prefill cases report TFLOP/s (causal: 4 * q_heads * head_dim
// flops per (query, key) pair attended). decode_fp8 cases read an FP8 KV cache (E4M3 codes + one bf16 scale
// per token and KV head, docs/fp8.md); their KV bytes count codes and scales, and the summary gives the
// speed-up over the same bf16 case.
// Energy (NVML, when the driver has it): the read-only stream's pJ per byte is printed at the start; the
// compressed steady-state cases (steady2048) add mJ_pass, pJ_B, W, SM_MHz and capped over ~2 s of back-to-back
// passes, and decode_fp8_ablation/... runs the FP8 kernel with parts of its tile work skipped (attention.cuh's
// kAblate*: no QK or PV MMAs, no E4M3 conversions, no tile work at all) to attribute its energy;
// decode_fp8_swapped/... the swapped-operand kernel (paged_decode_attention_swapped) at the same shape, and
// decode_fp8_swapped_ablation/... its own ablations (no MMAs; no MMAs or conversions; no tile work).
//
//   bench_decode_attention [--benchmark_filter=...] [--benchmark_out=file.json --benchmark_out_format=json]
// prints a Markdown summary table at the end.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <numeric>
#include <span>
#include <random>
#include <string>
#include <vector>

#include "cuda_buffers.hpp"
#include "copy_bandwidth.cuh"
#include "zipage/backend/cuda/attention.hpp"
#include "zipage/backend/cuda/cuda_backend.hpp"  // measure_gemm_tflops
#include "zipage/backend/cuda/ops.hpp"  // fill_uniform
#include "zipage/backend/cuda/common.cuh"
#include "zipage/backend/cuda/decode_kernel.cuh"  // the FP8 decode kernel's energy ablations
#include "zipage/backend/cuda/decode_swapped.cuh"  // ... and the swapped kernel's
#include "zipage/backend/cuda/event_timer.cuh"
#include "zipage/cuda/device.hpp"
#include "zipage/cuda/energy.hpp"

namespace {

namespace zc = zipage::cuda;
#define CK(expr) ZIPAGE_CUDA_CHECK(expr)

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMaxCaseBytes = 60.0 * kGiB;  // K + V of one case
constexpr int kRaggedCtx = -1;  // context label of the ragged cases (lengths uniform in 1-16384)
constexpr int kSteadyCtx = -2;  // ... of the compressed steady-state cases (lengths uniform in 2048-2304)
constexpr int kHeadDim = 128;

double g_copy_bytes_per_s = 0.0;
double g_read_bytes_per_s = 0.0;  // read-only stream (a second, tighter ceiling for decode)
double g_gemm_flops_per_s = 0.0;  // bf16 cuBLASLt GEMM, 8192^3 (the ceiling prefill attention is read against)

// One pool of random bf16 K and V, shared by all cases (a case reinterprets its first blocks).
struct kv_pool {
  void* k = nullptr;
  void* v = nullptr;
  std::size_t bytes_per_side = 0;
  std::uint16_t* k_scale = nullptr;  // FP8 cases: one bf16 scale per (token, KV head) of the pool read as codes
  std::uint16_t* v_scale = nullptr;
} g_pool;


// bf16 uniform in [-1, 1) (zipage's own device fill).
void fill_random(void* p, std::size_t elements, std::uint32_t seed) {
  zipage::cuda::fill_uniform(zipage::cuda_dtype::bf16, p, static_cast<std::int64_t>(elements), 1.0f, seed, nullptr);
}

template <class T>
using dbuf = zipage::testing::device_buffer<T>;

using zipage::testing::median;

// Device-to-device copy bandwidth: 2 GiB, bytes read + written, median of 15.
using zipage::testing::measure_copy_bandwidth;

// Read-only bandwidth over `bytes` of the pool: median of 15.
double measure_read_bandwidth(const void* src, std::size_t bytes) {
  dbuf<unsigned> sink(1);
  zc::event_timer timer;
  std::vector<double> times;
  for (int i = 0; i < 18; ++i) {
    const double s = timer.time(nullptr, [&] { zc::read_stream(src, bytes, sink.p, nullptr); });
    if (i >= 3) times.push_back(s);
  }
  return bytes / median(times);
}

// The read-only stream's energy per byte, the floor a memory-bound kernel's energy is read against: the stream
// kernel back to back for ~2 s under a power sampler (NVML), printed; nothing without NVML.
void print_read_stream_energy(const void* src, std::size_t bytes) {
  const zc::energy_meter meter;
  if (!meter.available()) {
    std::printf("read-only stream energy: not measured (%s)\n", meter.why_unavailable().c_str());
    return;
  }
  const int launches = static_cast<int>(std::ceil(2.0 * g_read_bytes_per_s / static_cast<double>(bytes)));
  dbuf<unsigned> sink(1);
  CK(cudaDeviceSynchronize());
  const auto e = zc::measure_work_energy(meter, 20, [&] {
    for (int i = 0; i < launches; ++i) zc::read_stream(src, bytes, sink.p, nullptr);
    CK(cudaDeviceSynchronize());
  });
  if (e.samples == 0) return;
  const double total = static_cast<double>(launches) * static_cast<double>(bytes);
  std::printf("read-only stream energy: %.1f pJ per byte (%.0f W, %.0f GB/s, SM %.0f MHz, %.0f%% of samples "
              "power-capped)\n", e.joules / total * 1e12, e.watts(), total / e.seconds / 1e9, e.sm_mhz,
              100 * e.power_capped);
}

// The energy of one pass: `graph` (of `passes` passes, `seconds_per_pass` each) replayed back to back for ~2 s
// while a power sampler reads NVML every 20 ms. Counters mJ_pass (joules per pass), W (mean power), SM_MHz (mean
// SM clock) and capped (share of samples under the software power cap); none when NVML is not there.
// Returns the joules of one pass (0: not measured).
double measure_energy(benchmark::State& state, cudaGraphExec_t graph, cudaStream_t stream, int passes,
                      double seconds_per_pass) {
  static const zc::energy_meter meter;
  if (!meter.available()) return 0;
  const int launches = static_cast<int>(std::clamp(std::ceil(2.0 / (seconds_per_pass * passes)), 1.0, 20000.0));
  CK(cudaStreamSynchronize(stream));
  const zc::power_sampler::span e = zc::measure_work_energy(meter, 20, [&] {
    for (int i = 0; i < launches; ++i) CK(cudaGraphLaunch(graph, stream));
    CK(cudaStreamSynchronize(stream));
  });
  if (e.samples == 0) return 0;  // too short a span to read the counter against
  const double joules_per_pass = e.joules / (static_cast<double>(launches) * passes);
  state.counters["mJ_pass"] = 1e3 * joules_per_pass;
  state.counters["W"] = e.watts();
  state.counters["SM_MHz"] = e.sm_mhz;
  state.counters["capped"] = e.power_capped;
  return joules_per_pass;
}

// Times `graph` (R passes) `state.iterations()` times; returns the median seconds of one pass.
double time_graph(benchmark::State& state, cudaGraphExec_t graph, cudaStream_t stream, int passes) {
  zc::event_timer timer;
  CK(cudaGraphLaunch(graph, stream));  // warm-up
  CK(cudaStreamSynchronize(stream));
  std::vector<double> per_pass;
  for (auto _ : state) {
    const double s = timer.time(stream, [&] { CK(cudaGraphLaunch(graph, stream)); }) / passes;
    per_pass.push_back(s);
    state.SetIterationTime(s);
  }
  return median(per_pass);
}

struct summary_row {
  std::string kind;
  int batch, ctx, qh, kvh, bs, splits, stages;
  double seconds, bytes, flops;
  const char* kernel = "";  // prefill rows: cuda::to_string(prefill_kernel)
};
std::map<std::string, summary_row> g_rows;

// ---- decode
// The FP8 decode kernel (head_dim 128, 4 stages, one split) with the tile work that ABLATE's bits name skipped
// (attention.cuh's kAblate*; outputs wrong on purpose), launched as paged_decode_attention launches it.
template <int ABLATE>
void launch_fp8_ablation(const zc::decode_params& p, cudaStream_t stream) {
  namespace d = zipage::cuda::detail;
  using cfg = d::decode_config<128, 4, true>;
  d::opt_in_smem<d::paged_decode_kernel<128, 4, true, ABLATE>>(cfg::kSmemBytes);
  const int chunk = std::max(1, (p.max_kv_len + d::kKvTile - 1) / d::kKvTile) * d::kKvTile;  // the whole cache
  const d::decode_args a = d::make_decode_args(p, 1, chunk);
  const dim3 grid(1, static_cast<unsigned>(p.kv.num_kv_heads * a.head_chunks), static_cast<unsigned>(p.num_seqs));
  d::paged_decode_kernel<128, 4, true, ABLATE><<<grid, cfg::kThreads, cfg::kSmemBytes, stream>>>(a);
  CK(cudaGetLastError());
}

// bm_decode's `ablate` value for the swapped-operand kernel (paged_decode_attention_swapped) instead.
constexpr int kSwappedKernel = 1 << 8;
// ... and for the swapped kernel (3 stages) with the tile work that the low bits name skipped (kAblate*).
constexpr int kSwappedAblation = 1 << 9;
// ... and for fp8_decode_kernel::swapped_e4m3_qk (the wgmma QK product).
constexpr int kSwappedE4m3Qk = 1 << 10;

template <int ABLATE>
void launch_swapped_ablation(const zc::decode_params& p, cudaStream_t stream) {
  namespace d = zipage::cuda::detail;
  constexpr int S = d::kSwappedStages;
  d::opt_in_smem<d::paged_decode_swapped_kernel<S, ABLATE>>(d::kSwappedSmemBytes<S>);
  const d::decode_args a = d::make_decode_args(p, 1, 0);
  const dim3 grid(1, static_cast<unsigned>(p.kv.num_kv_heads), static_cast<unsigned>(p.num_seqs));
  d::paged_decode_swapped_kernel<S, ABLATE><<<grid, 128, d::kSwappedSmemBytes<S>, stream>>>(a);
  CK(cudaGetLastError());
}

void launch_decode(const zc::decode_params& p, const zc::decode_plan& plan, void* ws, std::size_t ws_bytes,
                   int ablate, cudaStream_t stream) {
  namespace d = zipage::cuda::detail;
  switch (ablate) {
    case kSwappedKernel: return zc::paged_decode_attention_swapped(p, stream);  // its default depth, 3 stages
    case kSwappedKernel | 4: return zc::paged_decode_attention_swapped(p, stream, 4);
    case kSwappedE4m3Qk:
      return zc::paged_decode_attention_swapped(p, stream, 0, zc::fp8_decode_kernel::swapped_e4m3_qk);
    case kSwappedAblation | d::kAblateQkMma | d::kAblatePvMma:
      return launch_swapped_ablation<d::kAblateQkMma | d::kAblatePvMma>(p, stream);
    case kSwappedAblation | d::kAblateQkMma | d::kAblatePvMma | d::kAblateConvert:
      return launch_swapped_ablation<d::kAblateQkMma | d::kAblatePvMma | d::kAblateConvert>(p, stream);
    case kSwappedAblation | d::kAblateTile: return launch_swapped_ablation<d::kAblateTile>(p, stream);
    case d::kAblateNone: return zc::paged_decode_attention(p, plan, ws, ws_bytes, stream);
    case d::kAblateQkMma: return launch_fp8_ablation<d::kAblateQkMma>(p, stream);
    case d::kAblatePvMma: return launch_fp8_ablation<d::kAblatePvMma>(p, stream);
    case d::kAblateQkMma | d::kAblatePvMma: return launch_fp8_ablation<d::kAblateQkMma | d::kAblatePvMma>(p, stream);
    case d::kAblateConvert: return launch_fp8_ablation<d::kAblateConvert>(p, stream);
    case d::kAblateQkMma | d::kAblatePvMma | d::kAblateConvert:
      return launch_fp8_ablation<d::kAblateQkMma | d::kAblatePvMma | d::kAblateConvert>(p, stream);
    case d::kAblateTile: return launch_fp8_ablation<d::kAblateTile>(p, stream);
    default: std::fprintf(stderr, "no ablation %d\n", ablate); std::abort();
  }
}

// lens: the KV length of each sequence (ragged allowed). ablate > 0: an FP8 energy ablation (launch_fp8_ablation) or
// the swapped kernel (kSwappedKernel; | 4: at 4 stages) instead of the library's split-KV kernel, timed and metered
// the same way.
void bm_decode(benchmark::State& state, std::vector<int> lens, int qh, int kvh, int bs, std::string key, int ctx_label,
               int stages = 0, int force_splits = 0, bool fp8 = false, int ablate = 0) {
  const int batch = static_cast<int>(lens.size());
  const std::size_t token_bytes = std::size_t(kvh) * kHeadDim * (fp8 ? 1 : 2);  // one side (codes for FP8)
  std::vector<std::int32_t> indptr{0};
  for (int l : lens) indptr.push_back(indptr.back() + (l + bs - 1) / bs);
  const std::size_t case_blocks = static_cast<std::size_t>(indptr.back());
  double kv_bytes = 0;
  for (int l : lens) kv_bytes += 2.0 * l * (token_bytes + (fp8 ? std::size_t(kvh) * 2 : 0));  // (+ bf16 scales)
  const std::size_t pool_blocks = g_pool.bytes_per_side / (token_bytes * bs);
  if (case_blocks > pool_blocks) {
    state.SkipWithError("KV does not fit the pool");
    return;
  }
  // Rotate over disjoint KV sets until ~1 GiB is touched (defeats the 60 MB L2 for small cases).
  const int rot = static_cast<int>(std::clamp<double>(std::ceil(kGiB / kv_bytes), 1.0,
                                                      std::min<double>(32.0, double(pool_blocks / std::max<std::size_t>(case_blocks, 1)))));
  std::mt19937_64 rng(1234 + case_blocks);
  std::vector<std::int32_t> indices(case_blocks * rot);
  for (int r = 0; r < rot; ++r) {
    // Blocks of rotation r: a random subset of the pool (shuffled page table).
    std::vector<std::int32_t> ids(rot == 1 ? pool_blocks : case_blocks);
    std::iota(ids.begin(), ids.end(), static_cast<std::int32_t>(rot == 1 ? 0 : r * case_blocks));
    std::shuffle(ids.begin(), ids.end(), rng);
    std::copy_n(ids.begin(), case_blocks, indices.begin() + r * case_blocks);
  }
  dbuf<std::int32_t> d_indptr(indptr), d_indices(indices), d_len(std::vector<std::int32_t>(lens.begin(), lens.end()));
  dbuf<std::uint16_t> q(std::size_t(batch) * qh * kHeadDim), out(std::size_t(batch) * qh * kHeadDim);
  fill_random(q.p, std::size_t(batch) * qh * kHeadDim, 99);

  zc::decode_params p;
  p.q = q.p;
  p.out = out.p;
  p.kv.k_cache = g_pool.k;
  p.kv.v_cache = g_pool.v;
  if (fp8) {
    p.kv.k_scale = g_pool.k_scale;
    p.kv.v_scale = g_pool.v_scale;
  }
  p.kv.page_indptr = d_indptr.p;
  p.kv.kv_len = d_len.p;
  p.num_seqs = batch;
  p.num_q_heads = qh;
  p.kv.num_kv_heads = kvh;
  p.kv.head_dim = kHeadDim;
  p.kv.block_size = bs;
  p.max_kv_len = *std::max_element(lens.begin(), lens.end());
  p.scale = 1.0f / std::sqrt(float(kHeadDim));
  const zc::decode_plan plan = zc::plan_decode(p, force_splits, stages);
  const std::size_t ws_bytes = zc::decode_workspace_bytes(p, plan);
  dbuf<std::uint8_t> ws(ws_bytes);

  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  p.kv.page_indices = d_indices.p;
  launch_decode(p, plan, ws.p, ws_bytes, ablate, stream);  // sets kernel attributes before capture
  CK(cudaStreamSynchronize(stream));

  // R passes per graph: enough for ~2 ms of work (estimate at 4 TB/s), a multiple of the rotation.
  const double est = kv_bytes / 4.0e12;
  int passes = static_cast<int>(std::clamp(std::ceil(2e-3 / est), 1.0, 2000.0));
  passes = (passes + rot - 1) / rot * rot;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < passes; ++i) {
    p.kv.page_indices = d_indices.p + (i % rot) * case_blocks;
    launch_decode(p, plan, ws.p, ws_bytes, ablate, stream);
  }
  CK(cudaStreamEndCapture(stream, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  const double s = time_graph(state, exec, stream, passes);
  if (ctx_label == kSteadyCtx && ((force_splits == 0 && stages == 0) || ablate > 0))
    if (const double joules = measure_energy(state, exec, stream, passes, s); joules > 0)
      state.counters["pJ_B"] = joules / kv_bytes * 1e12;  // against the read-only stream's (printed at the start)
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamDestroy(stream));

  state.counters["KV_GBps"] = kv_bytes / s / 1e9;
  state.counters["frac_copy"] = kv_bytes / s / g_copy_bytes_per_s;
  state.counters["frac_read"] = kv_bytes / s / g_read_bytes_per_s;
  state.counters["splits"] = plan.num_splits;
  state.counters["passes"] = passes;
  state.counters["stages"] = plan.stages;
  const bool steady_sweep = ctx_label == kSteadyCtx && (force_splits > 0 || stages > 0) && ablate == 0;
  g_rows[key] = {ablate > 0     ? "ablation"
                 : steady_sweep ? (fp8 ? "steady_fp8" : "steady_bf16")
                 : fp8        ? "fp8"
                 : force_splits ? "splits"
                 : stages     ? "sweep"
                              : "decode",
                 batch, ctx_label, qh, kvh, bs, plan.num_splits, plan.stages, s, kv_bytes, 0.0};
}

// ---- prefill: `seqs` fresh prompts of `n` tokens each (causal), or chunks of n after `cached` tokens.
void bm_prefill(benchmark::State& state, int seqs, int n, int cached, int qh, int kvh, int bs, std::string key,
                zc::prefill_kernel kernel) {
  const int len = cached + n;
  const std::size_t token_bytes = std::size_t(kvh) * kHeadDim * 2;
  const int pages_per_seq = (len + bs - 1) / bs;
  const std::size_t pool_blocks = g_pool.bytes_per_side / (token_bytes * bs);
  std::vector<std::int32_t> ids(pool_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937_64 rng(77);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(std::size_t(seqs) * pages_per_seq);
  std::vector<std::int32_t> page_indptr{0}, q_indptr{0}, token_len;
  for (int s = 0; s < seqs; ++s) {
    page_indptr.push_back(page_indptr.back() + pages_per_seq);
    q_indptr.push_back(q_indptr.back() + n);
    for (int i = 0; i < n; ++i) token_len.push_back(cached + i + 1);
  }
  const int tokens = seqs * n;
  dbuf<std::int32_t> d_pi(page_indptr), d_idx(ids), d_qi(q_indptr), d_tl(token_len);
  dbuf<std::uint16_t> q(std::size_t(tokens) * qh * kHeadDim), out(std::size_t(tokens) * qh * kHeadDim);
  fill_random(q.p, std::size_t(tokens) * qh * kHeadDim, 5);
  zc::prefill_params p;
  p.q = q.p;
  p.out = out.p;
  p.kv.k_cache = g_pool.k;
  p.kv.v_cache = g_pool.v;
  p.q_indptr = d_qi.p;
  p.token_kv_len = d_tl.p;
  p.kv.page_indptr = d_pi.p;
  p.kv.page_indices = d_idx.p;
  p.num_tokens = tokens;
  p.num_seqs = seqs;
  p.num_q_heads = qh;
  p.kv.num_kv_heads = kvh;
  p.kv.head_dim = kHeadDim;
  p.kv.block_size = bs;
  p.scale = 1.0f / std::sqrt(float(kHeadDim));
  p.kernel = kernel;
  double pairs = 0;
  for (int l : token_len) pairs += l;
  const double flops = 4.0 * pairs * qh * kHeadDim;

  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  zc::paged_prefill_attention(p, stream);
  CK(cudaStreamSynchronize(stream));
  const int passes = 3;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < passes; ++i) zc::paged_prefill_attention(p, stream);
  CK(cudaStreamEndCapture(stream, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  const double s = time_graph(state, exec, stream, passes);
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamDestroy(stream));
  state.counters["TFLOPs"] = flops / s / 1e12;
  g_rows[key] = {"prefill", seqs, len, qh, kvh, bs, n, 0, s, 0.0, flops, zc::to_string(kernel)};
}

void bm_copy(benchmark::State& state) {
  for (auto _ : state) state.SetIterationTime(1.0);
  state.counters["copy_GBps"] = g_copy_bytes_per_s / 1e9;
  state.counters["read_GBps"] = g_read_bytes_per_s / 1e9;
}

// A case's context column: its length, or how its lengths were drawn (ragged and steady-state cases).
std::string ctx_name(int ctx) {
  return ctx == kRaggedCtx ? "ragged 1-16384" : ctx == kSteadyCtx ? "2048-2304" : std::to_string(ctx);
}

void print_summary() {
  std::printf("\n## decode (head_dim %d, bf16 KV; copy bandwidth %.0f GB/s read+write, read-only %.0f GB/s)\n\n",
              kHeadDim, g_copy_bytes_per_s / 1e9, g_read_bytes_per_s / 1e9);
  std::printf("| batch | context | q/kv heads | block | splits | time (us) | KV GB/s | of copy bw | of read bw |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& [key, r] : g_rows)
    if (r.kind == "decode")
      std::printf("| %d | %s | %d/%d | %d | %d | %.1f | %.0f | %.1f%% | %.1f%% |\n", r.batch, ctx_name(r.ctx).c_str(), r.qh, r.kvh, r.bs, r.splits, r.seconds * 1e6,
                  r.bytes / r.seconds / 1e9, 100.0 * r.bytes / r.seconds / g_copy_bytes_per_s,
                  100.0 * r.bytes / r.seconds / g_read_bytes_per_s);
  std::printf("\n## decode, FP8 KV (E4M3 codes + per token-head bf16 scales; KV bytes count both)\n\n");
  std::printf("| batch | context | q/kv heads | block | splits | time (us) | KV GB/s | of copy bw | bf16 time (us) | speed-up |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& [key, r] : g_rows) {
    if (r.kind != "fp8") continue;
    double bf16_s = 0.0;
    for (const auto& [k2, b] : g_rows)
      if (b.kind == "decode" && b.batch == r.batch && b.ctx == r.ctx && b.qh == r.qh && b.kvh == r.kvh && b.bs == r.bs)
        bf16_s = b.seconds;
    std::printf("| %d | %s | %d/%d | %d | %d | %.1f | %.0f | %.1f%% | %.1f | %.2fx |\n", r.batch, ctx_name(r.ctx).c_str(),
                r.qh, r.kvh, r.bs,
                r.splits, r.seconds * 1e6, r.bytes / r.seconds / 1e9, 100.0 * r.bytes / r.seconds / g_copy_bytes_per_s,
                bf16_s * 1e6, bf16_s > 0 ? bf16_s / r.seconds : 0.0);
  }
  std::printf("\n## decode at the compressed steady state under forced plans (32/8 heads, 256-token blocks, lengths "
              "2048-2304)\n\n| KV | batch | splits | stages | time (us) | KV GB/s | of copy bw | vs automatic plan |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& [key, r] : g_rows) {
    if (r.kind != "steady_fp8" && r.kind != "steady_bf16") continue;
    const bool fp8 = r.kind == "steady_fp8";
    double auto_s = 0.0;
    for (const auto& [k2, b] : g_rows)
      if (b.kind == (fp8 ? "fp8" : "decode") && b.ctx == kSteadyCtx && b.batch == r.batch) auto_s = b.seconds;
    std::printf("| %s | %d | %d | %d | %.1f | %.0f | %.1f%% | %.3fx |\n", fp8 ? "fp8" : "bf16", r.batch, r.splits,
                r.stages, r.seconds * 1e6, r.bytes / r.seconds / 1e9, 100.0 * r.bytes / r.seconds / g_copy_bytes_per_s,
                auto_s > 0 ? auto_s / r.seconds : 0.0);
  }
  std::printf("\n## decode pipeline depth sweep\n\n| batch | context | q/kv heads | block | stages | splits | time (us) | KV GB/s | of copy bw |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& [key, r] : g_rows)
    if (r.kind == "sweep")
      std::printf("| %d | %d | %d/%d | %d | %d | %d | %.1f | %.0f | %.1f%% |\n", r.batch, r.ctx, r.qh, r.kvh, r.bs, r.stages,
                  r.splits, r.seconds * 1e6, r.bytes / r.seconds / 1e9, 100.0 * r.bytes / r.seconds / g_copy_bytes_per_s);
  std::printf("\n## decode split-count sweep (the automatic plan's choice is in the first table)\n\n");
  std::printf("| batch | context | q/kv heads | block | splits | time (us) | KV GB/s | of copy bw |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& [key, r] : g_rows)
    if (r.kind == "splits")
      std::printf("| %d | %d | %d/%d | %d | %d | %.1f | %.0f | %.1f%% |\n", r.batch, r.ctx, r.qh, r.kvh, r.bs, r.splits,
                  r.seconds * 1e6, r.bytes / r.seconds / 1e9, 100.0 * r.bytes / r.seconds / g_copy_bytes_per_s);
  std::printf("\n## prefill (head_dim %d, causal; bf16 GEMM %.0f TFLOP/s, 8192^3, measured in this run)\n\n", kHeadDim,
              g_gemm_flops_per_s / 1e12);
  std::printf("| seqs | kv len | new tokens/seq | q/kv heads | block | kernel | time (ms) | TFLOP/s | of GEMM | vs mma.sync |\n"
              "|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|\n");
  for (const auto& [key, r] : g_rows) {
    if (r.kind != "prefill") continue;
    double base_s = 0.0;
    for (const auto& [k2, b] : g_rows)
      if (b.kind == "prefill" && std::string(b.kernel) == "mma_sync" && b.batch == r.batch && b.ctx == r.ctx && b.splits == r.splits && b.qh == r.qh &&
          b.kvh == r.kvh && b.bs == r.bs)
        base_s = b.seconds;
    const double tflops = r.flops / r.seconds / 1e12;
    std::printf("| %d | %d | %d | %d/%d | %d | %s | %.3f | %.1f | %.1f%% | %.2fx |\n", r.batch, r.ctx, r.splits, r.qh, r.kvh,
                r.bs, r.kernel, r.seconds * 1e3, tflops,
                100.0 * tflops * 1e12 / g_gemm_flops_per_s, base_s > 0 ? base_s / r.seconds : 0.0);
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
    g_copy_bytes_per_s = measure_copy_bandwidth();
    std::printf("device-to-device copy: %.1f GB/s (bytes read + written, 2 GiB cudaMemcpy, median of 15)\n",
                g_copy_bytes_per_s / 1e9);
    g_gemm_flops_per_s = zipage::cuda_backend(zipage::cuda_backend_options{}).measure_gemm_tflops() * 1e12;
    std::printf("bf16 GEMM (cuBLASLt, 8192^3, median of 5): %.0f TFLOP/s\n", g_gemm_flops_per_s / 1e12);

    g_pool.bytes_per_side = static_cast<std::size_t>(kMaxCaseBytes / 2) + (std::size_t(64) << 20);
    CK(cudaMalloc(&g_pool.k, g_pool.bytes_per_side));
    CK(cudaMalloc(&g_pool.v, g_pool.bytes_per_side));
    fill_random(g_pool.k, g_pool.bytes_per_side / 2, 1);
    fill_random(g_pool.v, g_pool.bytes_per_side / 2, 2);
    CK(cudaDeviceSynchronize());
    g_read_bytes_per_s = measure_read_bandwidth(g_pool.k, std::size_t(8) << 30);
    print_read_stream_energy(g_pool.k, std::size_t(8) << 30);
    // FP8 cases read the pool's bytes as E4M3 codes (random bits; NaN codes do not change the timing) with
    // one scale per (token, KV head): bytes_per_side / head_dim scales cover every token of the pool.
    {
      const std::size_t scale_bytes = g_pool.bytes_per_side / kHeadDim * 2;  // a bf16 each
      CK(cudaMalloc(&g_pool.k_scale, scale_bytes));
      CK(cudaMalloc(&g_pool.v_scale, scale_bytes));
      CK(cudaMemset(g_pool.k_scale, 0x3c, scale_bytes));  // bf16 0x3c3c ~ 0.0115
      CK(cudaMemset(g_pool.v_scale, 0x3c, scale_bytes));
    }
    std::printf("read-only stream: %.1f GB/s (8 GiB, 16-byte loads, median of 15)\n", g_read_bytes_per_s / 1e9);

    benchmark::RegisterBenchmark("copy_bandwidth", bm_copy)->UseManualTime()->Iterations(1);
    const std::pair<int, int> heads[] = {{16, 8}, {32, 8}, {28, 4}, {12, 2}};
    int order = 0;
    for (int bs : {256, 16})
      for (auto [qh, kvh] : heads)
        for (int batch : {1, 16, 64, 256, 512})
          for (int ctx : {512, 2048, 2304, 8192, 16384, 32768}) {
            const double bytes = 2.0 * batch * double(ctx) * kvh * kHeadDim * 2;
            if (bytes > kMaxCaseBytes) continue;
            char name[128], key[32];
            std::snprintf(name, sizeof name, "decode/bs%d/q%d_kv%d/batch%d/ctx%d", bs, qh, kvh, batch, ctx);
            std::snprintf(key, sizeof key, "d%05d", order++);
            benchmark::RegisterBenchmark(name, [=](benchmark::State& st) {
              bm_decode(st, std::vector<int>(std::size_t(batch), ctx), qh, kvh, bs, key, ctx);
            })->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
          }
    // FP8 KV against the same bf16 cases above.
    for (int bs : {256, 16})
      for (auto [qh, kvh] : {std::pair{32, 8}, std::pair{16, 8}})
        for (int batch : {16, 64, 128, 256, 512})
          for (int ctx : {2048, 8192, 16384}) {
            const double bytes = 2.0 * batch * double(ctx) * kvh * kHeadDim * 2;
            if (bytes > kMaxCaseBytes) continue;
            char name[128], key[32];
            std::snprintf(name, sizeof name, "decode_fp8/bs%d/q%d_kv%d/batch%d/ctx%d", bs, qh, kvh, batch, ctx);
            std::snprintf(key, sizeof key, "f%05d", order++);
            benchmark::RegisterBenchmark(name, [=](benchmark::State& st) {
              bm_decode(st, std::vector<int>(std::size_t(batch), ctx), qh, kvh, bs, key, ctx, 0, 0, true);
            })->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
          }
    // The swapped-operand kernel at the FP8 shapes above with 32/8 heads and 256-token blocks, against the split-KV
    // kernel under its automatic plan (decode_fp8/..., whose splits counter is one input of
    // fp8_decode_kernel::automatic's rule, resolve_fp8_decode_kernel).
    for (int batch : {16, 64, 128, 256, 512})
      for (int ctx : {2048, 8192, 16384}) {
        if (2.0 * batch * double(ctx) * 8 * kHeadDim * 2 > kMaxCaseBytes) continue;
        char name[128], key[32];
        std::snprintf(name, sizeof name, "decode_fp8_swapped/bs256/q32_kv8/batch%d/ctx%d", batch, ctx);
        std::snprintf(key, sizeof key, "w%05d", order++);
        benchmark::RegisterBenchmark(name, [=](benchmark::State& st) {
          bm_decode(st, std::vector<int>(std::size_t(batch), ctx), 32, 8, 256, key, ctx, 3, 1, true, kSwappedKernel);
        })->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
      }
    // Ragged batches: lengths uniform in [1, 2 * mean].
    for (int bs : {256, 16})
      for (int batch : {64, 256}) {
        std::mt19937_64 rng(batch + bs);
        std::vector<int> lens(static_cast<std::size_t>(batch));
        for (auto& l : lens) l = std::uniform_int_distribution<int>(1, 16384)(rng);
        char name[128], key[32];
        std::snprintf(name, sizeof name, "decode/bs%d/q32_kv8/batch%d/ragged1-16384", bs, batch);
        std::snprintf(key, sizeof key, "r%05d", order++);
        benchmark::RegisterBenchmark(name, [=](benchmark::State& st) { bm_decode(st, lens, 32, 8, bs, key, kRaggedCtx); })
            ->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
      }
    // The compressed engine's steady state on Qwen3-8B (docs/benchmarks.md, 2026-12-02 16:08): every request at its
    // 2,048-token budget plus up to 256 new tokens, 256-token blocks; FP8 KV at the FP8 pool's 662 requests and
    // bf16 KV at the bf16 pool's 329 (each pool ~105-110 GiB). What the engine's decode attention should reach.
    // Then the same batches under forced plans (splits 1-4 x stages 2-4: decode_steady_plans/...), against the
    // automatic plan: whether another split count fills the last wave better than plan_decode's cost model says.
    for (const auto& [batch, fp8] : {std::pair{662, true}, std::pair{329, false}}) {
      std::mt19937_64 rng(static_cast<unsigned>(batch));
      std::vector<int> lens(static_cast<std::size_t>(batch));
      for (auto& l : lens) l = std::uniform_int_distribution<int>(2048, 2304)(rng);
      char name[128], key[32];
      std::snprintf(name, sizeof name, "%s/bs256/q32_kv8/batch%d/steady2048-2304", fp8 ? "decode_fp8" : "decode",
                    batch);
      std::snprintf(key, sizeof key, "%c%05d", fp8 ? 'f' : 'd', order++);
      benchmark::RegisterBenchmark(name, [=](benchmark::State& st) {
        bm_decode(st, lens, 32, 8, 256, key, kSteadyCtx, 0, 0, fp8);
      })->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
      for (int splits : {1, 2, 3, 4})
        for (int stages : {2, 3, 4}) {
          std::snprintf(name, sizeof name, "decode_steady_plans/%s/batch%d/splits%d/stages%d", fp8 ? "fp8" : "bf16",
                        batch, splits, stages);
          std::snprintf(key, sizeof key, "p%05d", order++);
          benchmark::RegisterBenchmark(name, [=](benchmark::State& st) {
            bm_decode(st, lens, 32, 8, 256, key, kSteadyCtx, stages, splits, fp8);
          })->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
        }
      // The FP8 kernel's energy ablations at the same shape (one split, 4 stages, as the automatic plan): which
      // part of its energy above the read-only stream's goes to the MMAs, the E4M3 conversions or the rest.
      namespace d = zipage::cuda::detail;
      const std::pair<int, const char*> ablations[] = {
          {d::kAblateQkMma, "no_qk_mma"},
          {d::kAblatePvMma, "no_pv_mma"},
          {d::kAblateQkMma | d::kAblatePvMma, "no_mma"},
          {d::kAblateConvert, "no_convert"},
          {d::kAblateQkMma | d::kAblatePvMma | d::kAblateConvert, "no_mma_no_convert"},
          {d::kAblateTile, "no_tile_work"}};
      // The swapped-operand kernel at the same shape (docs/architecture.md): 4 stages x 3 CTAs per multiprocessor,
      // and 3 x 4 (its default).
      for (const int stages : fp8 ? std::vector<int>{4, 3} : std::vector<int>{}) {
        std::snprintf(name, sizeof name, "decode_fp8_swapped/batch%d/steady2048-2304/stages%d", batch, stages);
        std::snprintf(key, sizeof key, "a%05d", order++);
        benchmark::RegisterBenchmark(name, [=](benchmark::State& st) {
          bm_decode(st, lens, 32, 8, 256, key, kSteadyCtx, 4, 1, true, stages == 4 ? kSwappedKernel | 4 : kSwappedKernel);
        })->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
      }
      // fp8_decode_kernel::swapped_e4m3_qk (3 stages): the QK product as FP8 MMAs, against stages3 above.
      if (fp8) {
        std::snprintf(name, sizeof name, "decode_fp8_swapped/batch%d/steady2048-2304/e4m3_qk", batch);
        std::snprintf(key, sizeof key, "a%05d", order++);
        benchmark::RegisterBenchmark(name, [=](benchmark::State& st) {
          bm_decode(st, lens, 32, 8, 256, key, kSteadyCtx, 4, 1, true, kSwappedE4m3Qk);
        })->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
      }
      // The swapped kernel over the same bytes with fewer KV heads per token row (kv8 x 662 sequences, kv2 x 2,648,
      // kv1 x 5,296; 4 query heads per KV head, the same lengths repeated): a CTA reads its head's 128 bytes of each
      // token row, so with one KV head its tile is 8 KB of contiguous memory and with eight it is 64 pieces 1 KB
      // apart. Whether the cache layout's scatter costs DRAM energy (docs/benchmarks.md, 2026-12-03 20:05). Each
      // layout also with the tile work compiled out (".../no_tile_work": the staged copies alone), which splits the
      // kernel's energy above the read-only stream into the staged pipeline's over contiguous tiles (kv1), what the
      // scatter adds to it (kv8 against kv1) and the tile math (the whole kernel against its own no_tile_work).
      for (const int kvh : fp8 ? std::vector<int>{8, 2, 1} : std::vector<int>{}) {
        std::vector<int> rep;
        for (int r = 0; r < 8 / kvh; ++r) rep.insert(rep.end(), lens.begin(), lens.end());
        for (const bool tile_work : {true, false}) {
          std::snprintf(name, sizeof name, "decode_fp8_swapped_layout/q%d_kv%d/batch%d/steady2048-2304%s", 4 * kvh,
                        kvh, static_cast<int>(rep.size()), tile_work ? "" : "/no_tile_work");
          std::snprintf(key, sizeof key, "a%05d", order++);
          const int kernel = tile_work ? kSwappedKernel : kSwappedAblation | d::kAblateTile;
          benchmark::RegisterBenchmark(name, [=](benchmark::State& st) {
            bm_decode(st, rep, 4 * kvh, kvh, 256, key, kSteadyCtx, 4, 1, true, kernel);
          })->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
        }
      }
      // The swapped kernel's own ablations (3 stages): how much of its energy above the read-only stream's is the
      // MMAs, the conversions, or the staged pipeline itself.
      for (const auto& [ablate, what] : fp8 ? std::span(ablations) : std::span<const std::pair<int, const char*>>{}) {
        if (ablate != (d::kAblateQkMma | d::kAblatePvMma) && ablate != d::kAblateTile &&
            ablate != (d::kAblateQkMma | d::kAblatePvMma | d::kAblateConvert))
          continue;
        std::snprintf(name, sizeof name, "decode_fp8_swapped_ablation/batch%d/steady2048-2304/%s", batch, what);
        std::snprintf(key, sizeof key, "a%05d", order++);
        benchmark::RegisterBenchmark(name, [=](benchmark::State& st) {
          bm_decode(st, lens, 32, 8, 256, key, kSteadyCtx, 4, 1, true, kSwappedAblation | ablate);
        })->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
      }
      for (const auto& [ablate, what] : fp8 ? std::span(ablations) : std::span<const std::pair<int, const char*>>{}) {
        std::snprintf(name, sizeof name, "decode_fp8_ablation/batch%d/steady2048-2304/%s", batch, what);
        std::snprintf(key, sizeof key, "a%05d", order++);
        benchmark::RegisterBenchmark(name, [=](benchmark::State& st) {
          bm_decode(st, lens, 32, 8, 256, key, kSteadyCtx, 4, 1, true, ablate);
        })->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
      }
    }
    // Pipeline depth sweep on a few shapes.
    struct sweep_case {
      int batch, ctx, qh, kvh, bs;
    };
    const sweep_case sweeps[] = {{64, 8192, 32, 8, 256},  {64, 8192, 32, 8, 16},  {256, 16384, 16, 8, 16},
                                 {1, 32768, 32, 8, 16},   {16, 2048, 28, 4, 256}, {512, 2048, 12, 2, 16}};
    for (const auto& c : sweeps)
      for (int stages : {2, 3, 4}) {
        char name[128], key[32];
        std::snprintf(name, sizeof name, "decode_stages%d/bs%d/q%d_kv%d/batch%d/ctx%d", stages, c.bs, c.qh, c.kvh,
                      c.batch, c.ctx);
        std::snprintf(key, sizeof key, "s%05d", order++);
        benchmark::RegisterBenchmark(name, [=](benchmark::State& st) {
          bm_decode(st, std::vector<int>(static_cast<std::size_t>(c.batch), c.ctx), c.qh, c.kvh, c.bs, key, c.ctx, stages);
        })->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
      }
    // Split-count sweep on small batches (latency-bound; informs plan_decode's cost model).
    const sweep_case split_cases[] = {{1, 8192, 12, 2, 16},  {1, 32768, 32, 8, 16}, {16, 2048, 28, 4, 256},
                                      {16, 512, 16, 8, 256}, {4, 16384, 32, 8, 16}};
    for (const auto& c : split_cases)
      for (int splits : {1, 2, 4, 8, 16, 32, 64, 128, 256}) {
        if (splits * 64 > c.ctx) continue;
        char name[128], key[32];
        std::snprintf(name, sizeof name, "decode_splits%d/bs%d/q%d_kv%d/batch%d/ctx%d", splits, c.bs, c.qh, c.kvh,
                      c.batch, c.ctx);
        std::snprintf(key, sizeof key, "t%05d", order++);
        benchmark::RegisterBenchmark(name, [=](benchmark::State& st) {
          bm_decode(st, std::vector<int>(static_cast<std::size_t>(c.batch), c.ctx), c.qh, c.kvh, c.bs, key, c.ctx, 0,
                    splits);
        })->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
      }
    struct prefill_case {
      int seqs, n, cached, qh, kvh, bs;
    };
    const prefill_case pcs[] = {{1, 4096, 0, 32, 8, 16},  {1, 8192, 0, 32, 8, 16},  {1, 16384, 0, 32, 8, 16},
                                {4, 4096, 0, 32, 8, 16},  {1, 8192, 0, 32, 8, 256}, {1, 8192, 0, 16, 8, 16},
                                {1, 8192, 0, 28, 4, 16},  {2, 2048, 8192, 32, 8, 16}};
    for (const auto& c : pcs) {
      char name[128], key[32];
      std::snprintf(name, sizeof name, "prefill/bs%d/q%d_kv%d/seqs%d/new%d/cached%d", c.bs, c.qh, c.kvh, c.seqs, c.n,
                    c.cached);
      std::snprintf(key, sizeof key, "p%05d", order++);
      benchmark::RegisterBenchmark(name, [=](benchmark::State& st) {
        bm_prefill(st, c.seqs, c.n, c.cached, c.qh, c.kvh, c.bs, key, zc::prefill_kernel::mma_sync);
      })->UseManualTime()->Iterations(5)->Unit(benchmark::kMillisecond);
      if (!zc::wgmma_prefill_available()) continue;
      for (const auto k : zc::all_prefill_kernels) {
        if (!zc::is_wgmma(k)) continue;
        std::snprintf(name, sizeof name, "prefill_%s/bs%d/q%d_kv%d/seqs%d/new%d/cached%d", zc::to_string(k), c.bs, c.qh,
                      c.kvh, c.seqs, c.n, c.cached);
        std::snprintf(key, sizeof key, "p%05d", order++);
        benchmark::RegisterBenchmark(name, [=](benchmark::State& st) {
          bm_prefill(st, c.seqs, c.n, c.cached, c.qh, c.kvh, c.bs, key, k);
        })->UseManualTime()->Iterations(5)->Unit(benchmark::kMillisecond);
      }
    }
    if (!zc::wgmma_prefill_available())
      std::printf("prefill on wgmma: skipped (needs an sm_90a build and a compute-capability-9.0 device)\n");
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    print_summary();
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  return 0;
}
