// The compression step on the GPU (backend/cuda/compression.hpp) for a Qwen3-8B-shaped model (36 layers,
// 8 KV heads, 32 query heads, head_dim 128) at the method's defaults (block 256, budget 8 blocks = 2048
// tokens, window 16), against the decode attention it is amortised over.
//
// A request is compressed from (B+1)*256 = 2304 tokens back to 2048, then decodes 256 steps (2048 ->
// 2304 tokens) before the next compression. So one compression of a batch is amortised over
//   decode = 36 layers x 256 steps x (decode attention time per layer at 2048..2304 tokens),
// the last factor by Simpson's rule over 2048 / 2176 / 2304 tokens (paged_decode_attention, attention.hpp,
// same batch, same pool). The fraction compress / decode is the overhead of compression on attention.
//
// Every built-in policy's recipe (policies.hpp) is timed at batches 1 / 4 / 16 / 64 / 128 (per request: the
// batch's time / batch); zipage also stage by stage, then with keys alike within each block (cosine ~0.55, as
// a real model's keys are: the redundancy's newest-duplicate rule runs on most tiles; random keys never reach
// it) and with an FP8 KV cache, at batches 1 / 4 / 16 (last, since each overwrites the pool's keys).
//
// Each case: bf16 K/V/queries with random values, shuffled page tables over a pool sized for the largest
// batch; the time is device time from CUDA events around a CUDA graph of R back-to-back calls (manual
// time), median of 5 replays after a warm-up. Compression cases run all 36 layers in one call (every
// stage one launch) and are also timed stage by stage (score / select / compact). Decode cases rotate
// over the 36 layers so they are not served from L2.
//
//   bench_compression [--benchmark_filter=...] [--benchmark_out=file.json --benchmark_out_format=json]
// prints a Markdown summary table at the end.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_buffers.hpp"
#include "zipage/backend/cuda/attention.hpp"
#include "zipage/backend/cuda/common.cuh"
#include "zipage/backend/cuda/compression.hpp"
#include "zipage/backend/cuda/ops.hpp"  // fill_uniform
#include "zipage/backend/cuda/event_timer.cuh"
#include "zipage/cuda/device.hpp"
#include "zipage/policy/policies.hpp"

namespace {

namespace zc = zipage::cuda;
#define CK(expr) ZIPAGE_CUDA_CHECK(expr)

constexpr int kLayers = 36, kKvHeads = 8, kQHeads = 32, kHeadDim = 128, kBlock = 256, kBudget = 8, kWindow = 16;
constexpr int kKeep = kBudget * kBlock;             // 2048
constexpr int kCompressLen = (kBudget + 1) * kBlock;  // 2304
constexpr int kPagesPerReq = kBudget + 1;
constexpr int kMaxBatch = 128;
constexpr int kSteps = kBlock;  // decode steps between two compressions


template <class T>
using dbuf = zipage::testing::device_buffer<T>;

__device__ __forceinline__ float hash_uniform(std::uint64_t i, std::uint32_t seed) {  // in [-1, 1)
  std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ static_cast<std::uint32_t>(i >> 32) * 40503u ^ seed;
  x ^= x >> 15;
  x *= 2246822519u;
  x ^= x >> 13;
  x *= 3266489917u;
  x ^= x >> 16;
  return static_cast<float>(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

// Keys alike within each (layer, physical block, KV head), as a real model's are: 0.74 x a direction of the
// block + 0.67 x noise per element, so two keys of a block have a cosine of ~0.55 (about half the pairs above
// the redundancy's 0.5 threshold, where the newest-duplicate rule runs). bf16 bits; [slots][kv_heads][D] per layer.
__global__ void fill_similar_keys(std::uint16_t* k, std::size_t n, int head_dim, int kv_heads, int block, int slots) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t d = i % head_dim, h = i / head_dim % kv_heads, slot = i / (std::size_t(head_dim) * kv_heads);
    const std::size_t layer = slot / slots, blk = slot % slots / block;
    const std::uint64_t dir = ((layer * 1000003u + blk) * kv_heads + h) * head_dim + d;
    const float x = 0.74f * hash_uniform(dir, 21u) + 0.67f * hash_uniform(i, 22u);
    k[i] = __bfloat16_as_ushort(__float2bfloat16(x));
  }
}

// E4M3 codes from a hash, NaN codes (S.1111.111) replaced by the largest finite magnitude.
__global__ void fill_e4m3(std::uint8_t* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    std::uint8_t c = static_cast<std::uint8_t>(x >> 8);
    if ((c & 0x7f) == 0x7f) c = static_cast<std::uint8_t>(c - 1);
    p[i] = c;
  }
}

using zipage::testing::median;

// The model's caches, sized for kMaxBatch requests of (B+1) blocks, all layers.
struct model_pool {
  int num_blocks = kMaxBatch * kPagesPerReq + 8;
  std::size_t layer_elems = std::size_t(num_blocks) * kBlock * kKvHeads * kHeadDim;
  std::size_t score_layer = std::size_t(num_blocks) * kBlock * kKvHeads;
  int num_slots = kMaxBatch;
  std::size_t q_layer = std::size_t(num_slots) * kWindow * kQHeads * kHeadDim;
  std::uint16_t* k = nullptr;
  std::uint16_t* v = nullptr;
  float* scores = nullptr;
  std::uint16_t* q = nullptr;
  void init() {
    CK(cudaMalloc(&k, layer_elems * kLayers * 2));
    CK(cudaMalloc(&v, layer_elems * kLayers * 2));
    CK(cudaMalloc(&scores, score_layer * kLayers * 4));
    CK(cudaMalloc(&q, q_layer * kLayers * 2));
    // Uniform in [-1, 1) (zipage's own device fill, as the models built on the device use).
    const auto bf16 = zipage::cuda_dtype::bf16;
    zc::fill_uniform(bf16, k, static_cast<std::int64_t>(layer_elems) * kLayers, 1.0f, 1, nullptr);
    zc::fill_uniform(bf16, v, static_cast<std::int64_t>(layer_elems) * kLayers, 1.0f, 2, nullptr);
    zc::fill_uniform(bf16, q, static_cast<std::int64_t>(q_layer) * kLayers, 1.0f, 3, nullptr);
    zc::fill_constant(zipage::cuda_dtype::f32, scores, static_cast<std::int64_t>(score_layer) * kLayers,
                      1.0f / kCompressLen, nullptr);
    CK(cudaDeviceSynchronize());
  }
  // What K holds: random values, then (the `_similar` cases) keys alike within each block, then (the `_fp8`
  // cases, registered last) an FP8 cache. A case that needs an earlier state than the pool's reports an error.
  enum class keys { random, similar, fp8 } state = keys::random;
  void make_similar() {
    if (state != keys::random) return;
    fill_similar_keys<<<1024, 256>>>(k, layer_elems * kLayers, kHeadDim, kKvHeads, kBlock, num_blocks * kBlock);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    state = keys::similar;
  }
  // An FP8 cache (docs/fp8.md) in the first half of the K and V allocations: E4M3 codes, bf16 scales per
  // (slot, KV head). Overwrites the bf16 values, so the FP8 cases are registered last.
  std::uint16_t* k_scale = nullptr;
  std::uint16_t* v_scale = nullptr;
  void make_fp8() {
    if (state == keys::fp8) return;
    const std::size_t codes = layer_elems * kLayers;
    fill_e4m3<<<1024, 256>>>(reinterpret_cast<std::uint8_t*>(k), codes, 11u);
    fill_e4m3<<<1024, 256>>>(reinterpret_cast<std::uint8_t*>(v), codes, 12u);
    CK(cudaGetLastError());
    CK(cudaMalloc(&k_scale, score_layer * kLayers * 2));  // a bf16 each
    CK(cudaMalloc(&v_scale, score_layer * kLayers * 2));
    CK(cudaMemset(k_scale, 0x3b, score_layer * kLayers * 2));  // bf16 0x3b3b ~ 0.00285
    CK(cudaMemset(v_scale, 0x3b, score_layer * kLayers * 2));
    CK(cudaDeviceSynchronize());
    state = keys::fp8;
  }
} g_pool;

// A batch: shuffled page tables (B+1 pages each), distinct query slots.
struct batch {
  int n;
  std::vector<std::int32_t> indptr, indices, slots;
  explicit batch(int n_) : n(n_) {
    std::mt19937_64 rng(42 + n);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(g_pool.num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    indptr.push_back(0);
    for (int r = 0; r < n; ++r) indptr.push_back(indptr.back() + kPagesPerReq);
    indices.assign(ids.begin(), ids.begin() + indptr.back());
    slots.resize(static_cast<std::size_t>(n));
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
  }
};

// Times a graph of `passes` calls of `fn` over the benchmark's iterations; returns median seconds per call.
double time_graph(benchmark::State& state, const std::function<void(cudaStream_t, int)>& fn, int passes) {
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  fn(stream, 0);  // warm-up; sets kernel attributes before capture
  CK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < passes; ++i) fn(stream, i);
  CK(cudaStreamEndCapture(stream, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  CK(cudaGraphLaunch(exec, stream));
  CK(cudaStreamSynchronize(stream));
  std::vector<double> per;
  {
    zc::event_timer timer;
    for (auto _ : state) {
      const double s = timer.time(stream, [&] { CK(cudaGraphLaunch(exec, stream)); }) / passes;
      per.push_back(s);
      state.SetIterationTime(s);
    }
  }
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamDestroy(stream));
  return median(per);
}

const std::vector<int> kFp8Batches = {1, 4, 16};  // the engine's steady state compresses ~3 requests at a time

std::map<std::string, double> g_results;  // "compress/<stage>/<n>[/first]", "decode/<n>/<ctx>" -> seconds

enum class stage { total, score, select, compact };
const char* stage_name(stage s) {
  switch (s) {
    case stage::total: return "total";
    case stage::score: return "score";
    case stage::select: return "select";
    case stage::compact: return "compact";
  }
  return "?";
}

zipage::score_recipe recipe_named(const std::string& name) {
  zipage::score_recipe r;
  zipage::for_each_builtin_policy([&](auto p) {
    if constexpr (zipage::recipe_scored<decltype(p)>)
      if (p.name() == name) r = p.recipe();
  });
  return r;
}

const std::vector<std::string> kPolicies = {"zipage", "streaming_llm", "h2o", "snapkv", "rkv", "gkv"};

void bm_compress(benchmark::State& state, int n, stage st, bool first, const std::string& policy,
                 model_pool::keys keys = model_pool::keys::random) {
  if (keys < g_pool.state) {
    state.SkipWithError("the pool's keys were overwritten by a later case (random, then _similar, then _fp8)");
    return;
  }
  const bool fp8 = keys == model_pool::keys::fp8;
  if (keys == model_pool::keys::similar) g_pool.make_similar();
  if (fp8) g_pool.make_fp8();
  const batch b(n);
  dbuf<std::int32_t> indptr(b.indptr), indices(b.indices), slots(b.slots),
      lens(std::vector<std::int32_t>(static_cast<std::size_t>(n), kCompressLen));
  dbuf<std::uint8_t> firsts(std::vector<std::uint8_t>(static_cast<std::size_t>(n), first ? 1 : 0));
  zc::compress_params p;
  p.kv.k_cache = g_pool.k;
  p.kv.v_cache = g_pool.v;
  p.score_cache = g_pool.scores;
  p.query_cache = g_pool.q;
  p.num_layers = kLayers;
  p.kv.num_blocks = g_pool.num_blocks;
  p.num_slots = g_pool.num_slots;
  p.kv.page_indptr = indptr.p;
  p.kv.page_indices = indices.p;
  p.kv.kv_len = lens.p;
  p.slot = slots.p;
  p.first_compression = firsts.p;
  p.num_reqs = n;
  p.max_kv_len = kCompressLen;
  p.num_q_heads = kQHeads;
  p.kv.num_kv_heads = kKvHeads;
  p.kv.head_dim = kHeadDim;
  p.kv.block_size = kBlock;
  p.window = kWindow;
  p.keep = kKeep;
  p.recipe = recipe_named(policy);
  if (!p.recipe.uses_score_cache()) p.score_cache = nullptr;
  if (fp8) {
    p.kv.k_scale = g_pool.k_scale;
    p.kv.v_scale = g_pool.v_scale;
  }
  const std::size_t ws_bytes = zc::compress_workspace_bytes(p);
  dbuf<unsigned char> ws(ws_bytes);
  // The select and compact stages need the earlier stages' output once.
  zc::compress(p, ws.p, ws_bytes, nullptr);
  CK(cudaDeviceSynchronize());
  const int passes = n >= 64 ? 3 : n >= 16 ? 5 : 20;
  const double s = time_graph(state, [&](cudaStream_t stream, int) {
    switch (st) {
      case stage::total: zc::compress(p, ws.p, ws_bytes, stream); break;
      case stage::score: zc::compress_score(p, ws.p, ws_bytes, stream); break;
      case stage::select: zc::compress_select(p, ws.p, ws_bytes, stream); break;
      case stage::compact: zc::compress_compact(p, ws.p, ws_bytes, stream); break;
    }
  }, passes);
  state.counters["ms"] = s * 1e3;
  state.counters["workspace_MB"] = ws_bytes / 1e6;
  const char* suffix = fp8 ? "_fp8" : keys == model_pool::keys::similar ? "_similar" : "";
  g_results[std::string("compress/") + policy + suffix + "/" + stage_name(st) + "/" + std::to_string(n) +
            (first ? "/first" : "")] = s;
}

void bm_decode(benchmark::State& state, int n, int ctx) {
  const batch b(n);
  dbuf<std::int32_t> indptr(b.indptr), indices(b.indices),
      lens(std::vector<std::int32_t>(static_cast<std::size_t>(n), ctx));
  dbuf<std::uint16_t> q(std::size_t(n) * kQHeads * kHeadDim), out(std::size_t(n) * kQHeads * kHeadDim);
  zc::fill_uniform(zipage::cuda_dtype::bf16, q.p, std::int64_t{n} * kQHeads * kHeadDim, 1.0f, 9, nullptr);
  zc::decode_params p;
  p.q = q.p;
  p.out = out.p;
  p.kv.page_indptr = indptr.p;
  p.kv.page_indices = indices.p;
  p.kv.kv_len = lens.p;
  p.num_seqs = n;
  p.num_q_heads = kQHeads;
  p.kv.num_kv_heads = kKvHeads;
  p.kv.head_dim = kHeadDim;
  p.kv.block_size = kBlock;
  p.max_kv_len = ctx;
  p.scale = 1.0f / std::sqrt(float(kHeadDim));
  const zc::decode_plan plan = zc::plan_decode(p);
  const std::size_t ws_bytes = zc::decode_workspace_bytes(p, plan);
  dbuf<unsigned char> ws(ws_bytes);
  const int passes = kLayers * (n >= 64 ? 2 : 8);
  const double s = time_graph(state, [&](cudaStream_t stream, int i) {
    zc::decode_params pl = p;
    const int layer = i % kLayers;
    pl.kv.k_cache = g_pool.k + std::size_t(layer) * g_pool.layer_elems;
    pl.kv.v_cache = g_pool.v + std::size_t(layer) * g_pool.layer_elems;
    zc::paged_decode_attention(pl, plan, ws.p, ws_bytes, stream);
  }, passes);
  state.counters["us"] = s * 1e6;
  state.counters["splits"] = plan.num_splits;
  g_results["decode/" + std::to_string(n) + "/" + std::to_string(ctx)] = s;
}

void print_summary(const std::vector<int>& batches) {
  std::printf("\n## Compression step vs the decode attention it is amortised over\n\n");
  std::printf("Qwen3-8B shape: %d layers, %d KV / %d query heads, head_dim %d; block %d, budget %d blocks (keep %d), "
              "window %d; compress %d -> %d tokens, then %d decode steps.\n\n",
              kLayers, kKvHeads, kQHeads, kHeadDim, kBlock, kBudget, kKeep, kWindow, kCompressLen, kKeep, kSteps);
  std::printf("zipage, stage by stage:\n\n| batch | compress (ms) | score | select | compact | first compression (ms) | decode over %d steps x %d layers (ms) | compress / decode |\n",
              kSteps, kLayers);
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  auto get = [](const std::string& k) {
    const auto it = g_results.find(k);
    return it == g_results.end() ? std::nan("") : it->second;
  };
  // Decode attention the batch's compression is amortised over: 256 steps x 36 layers, Simpson's rule
  // over 2048 / 2176 / 2304 tokens (decode is linear in length).
  auto amortised = [&](int n) {
    const std::string ns = std::to_string(n);
    const double d0 = get("decode/" + ns + "/2048"), d1 = get("decode/" + ns + "/2176"), d2 = get("decode/" + ns + "/2304");
    return (d0 + 4 * d1 + d2) / 6.0 * kLayers * kSteps;
  };
  for (int n : batches) {
    const std::string ns = std::to_string(n);
    const double tot = get("compress/zipage/total/" + ns), sc = get("compress/zipage/score/" + ns),
                 se = get("compress/zipage/select/" + ns), cp = get("compress/zipage/compact/" + ns),
                 fi = get("compress/zipage/total/" + ns + "/first");
    const double amort = amortised(n);
    std::printf("| %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.1f | %.2f%% |\n", n, tot * 1e3, sc * 1e3, se * 1e3, cp * 1e3,
                fi * 1e3, amort * 1e3, 100.0 * tot / amort);
  }
  std::printf("\n### Every built-in policy: compression time per request (ms) and its share of the decode attention it is amortised over\n\n");
  std::printf("| policy |");
  for (int n : batches) std::printf(" batch %d: ms/request | share |", n);
  std::printf("\n|---|");
  for (std::size_t i = 0; i < batches.size(); ++i) std::printf("---:|---:|");
  std::printf("\n");
  for (const std::string& pol : kPolicies) {
    std::printf("| %s |", pol.c_str());
    for (int n : batches) {
      const double t = get("compress/" + pol + "/total/" + std::to_string(n));
      std::printf(" %.3f | %.2f%% |", t * 1e3 / n, 100.0 * t / amortised(n));
    }
    std::printf("\n");
  }
  std::printf("\nzipage with keys alike within each block (cosine ~0.55), against random keys (ms):\n\n"
              "| batch | compress | select | random keys: compress | select |\n|---:|---:|---:|---:|---:|\n");
  for (int n : kFp8Batches) {
    const std::string ns = std::to_string(n);
    std::printf("| %d | %.3f | %.3f | %.3f | %.3f |\n", n, get("compress/zipage_similar/total/" + ns) * 1e3,
                get("compress/zipage_similar/select/" + ns) * 1e3, get("compress/zipage/total/" + ns) * 1e3,
                get("compress/zipage/select/" + ns) * 1e3);
  }
  std::printf("\nzipage with an FP8 KV cache (E4M3 codes, a bf16 scale per slot and KV head), stage by stage:\n\n"
              "| batch | compress (ms) | per request | score | select | compact |\n|---:|---:|---:|---:|---:|---:|\n");
  for (int n : kFp8Batches) {
    const std::string ns = std::to_string(n);
    const double tot = get("compress/zipage_fp8/total/" + ns);
    std::printf("| %d | %.3f | %.3f | %.3f | %.3f | %.3f |\n", n, tot * 1e3, tot * 1e3 / n,
                get("compress/zipage_fp8/score/" + ns) * 1e3, get("compress/zipage_fp8/select/" + ns) * 1e3,
                get("compress/zipage_fp8/compact/" + ns) * 1e3);
  }
  std::printf("\ncompress: all %d layers in one call; first compression: with max-pooling, all requests first-time.\n",
              kLayers);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (zc::device_count() == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", zc::describe_device().c_str());
    return 0;
  }
  try {
    std::printf("device: %s\n", zc::describe_device(0).c_str());
    g_pool.init();
    std::printf("pool: %.1f GiB of K+V (%d blocks x %d layers)\n",
                2.0 * g_pool.layer_elems * kLayers * 2 / (1024.0 * 1024 * 1024), g_pool.num_blocks, kLayers);
    const std::vector<int> batches = {1, 4, 16, 64, 128};
    for (int n : batches) {
      for (stage st : {stage::total, stage::score, stage::select, stage::compact})
        benchmark::RegisterBenchmark(("compress/zipage/" + std::string(stage_name(st)) + "/batch" + std::to_string(n)).c_str(),
                                     [=](benchmark::State& s) { bm_compress(s, n, st, false, "zipage"); })
            ->UseManualTime()->Iterations(5)->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("compress/zipage/total/batch" + std::to_string(n) + "/first").c_str(),
                                   [=](benchmark::State& s) { bm_compress(s, n, stage::total, true, "zipage"); })
          ->UseManualTime()->Iterations(5)->Unit(benchmark::kMillisecond);
      for (const std::string& pol : kPolicies)
        if (pol != "zipage")
          benchmark::RegisterBenchmark(("compress/" + pol + "/total/batch" + std::to_string(n)).c_str(),
                                       [=](benchmark::State& s) { bm_compress(s, n, stage::total, false, pol); })
              ->UseManualTime()->Iterations(5)->Unit(benchmark::kMillisecond);
      for (int ctx : {2048, 2176, 2304})
        benchmark::RegisterBenchmark(("decode/batch" + std::to_string(n) + "/ctx" + std::to_string(ctx)).c_str(),
                                     [=](benchmark::State& s) { bm_decode(s, n, ctx); })
            ->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
    }
    // Then keys alike within a block (the redundancy's newest-duplicate rule runs on most tiles), then FP8: each
    // overwrites the pool's keys, so they come last, in this order.
    for (int n : kFp8Batches)
      for (stage st : {stage::total, stage::select})
        benchmark::RegisterBenchmark(("compress/zipage_similar/" + std::string(stage_name(st)) + "/batch" + std::to_string(n)).c_str(),
                                     [=](benchmark::State& s) { bm_compress(s, n, st, false, "zipage", model_pool::keys::similar); })
            ->UseManualTime()->Iterations(5)->Unit(benchmark::kMillisecond);
    for (int n : kFp8Batches)
      for (stage st : {stage::total, stage::score, stage::select, stage::compact})
        benchmark::RegisterBenchmark(("compress/zipage_fp8/" + std::string(stage_name(st)) + "/batch" + std::to_string(n)).c_str(),
                                     [=](benchmark::State& s) { bm_compress(s, n, st, false, "zipage", model_pool::keys::fp8); })
            ->UseManualTime()->Iterations(5)->Unit(benchmark::kMillisecond);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    print_summary(batches);
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  return 0;
}
