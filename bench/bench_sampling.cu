// Batched GPU sampling (backend/cuda/sampling.hpp): time per batch of 256 requests x 151936 logits
// (Qwen2's vocabulary), greedy and sampled with the usual filters, fp32 and bf16 logits.
//
// Logits are random: "flat" rows are N(0, 1) (top-p 0.95 then keeps most of the vocabulary, the worst
// case for the selection), "peaked" rows are N(0, 2) plus a few tokens 10..20 above (like a trained
// model; top-p keeps few). Each case's time is the device time of one sample_tokens() call, measured with
// CUDA events around 20 back-to-back calls (manual time). Counter logits_GBps = logit bytes / time, the
// rate at which the batch's logits are consumed (a greedy batch reads them once). The "_bias4", "_allowed5" cases
// add vLLM's logits processors (zipage::logit_edits as CSR: 4 biased ids, or 5 allowed ids) to every row or, with
// "_1row", to one row of the batch: their cost against the same case without them, in the same run.
//
//   bench_sampling [--benchmark_filter=...] [--benchmark_out=file.json --benchmark_out_format=json]
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_buffers.hpp"
#include "zipage/backend/cuda/common.cuh"
#include "zipage/backend/cuda/event_timer.cuh"
#include "zipage/backend/cuda/sampling.hpp"
#include "zipage/cuda/device.hpp"
#include "zipage/sampling/logits_processors.hpp"

namespace {

namespace zc = zipage::cuda;
#define CK(expr) ZIPAGE_CUDA_CHECK(expr)

constexpr int kVocab = 151936;
constexpr int kMaxBatch = 256;
constexpr int kCalls = 20;

__device__ float hash_uniform(std::uint64_t i, std::uint32_t seed) {
  std::uint64_t x = i * 0x9E3779B97F4A7C15ull + seed;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<float>(x >> 40) * 0x1p-24f;
}

// Approximately N(0, sigma) (sum of 4 uniforms); `hot` tokens per row get +10..+20.
__global__ void fill_logits(float* f32, std::uint16_t* b16, int rows, int vocab, float sigma, int hot, std::uint32_t seed) {
  const std::size_t n = std::size_t(rows) * vocab;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int k = 0; k < 4; ++k) s += hash_uniform(4 * i + k, seed);
    float v = (s - 2.0f) * 1.7320508f * sigma;
    const std::uint64_t col = i % vocab;
    if (hot > 0 && (col * 2654435761ull + i / vocab) % (vocab / hot) == 0) v += 10.0f + 10.0f * hash_uniform(i, seed + 1);
    f32[i] = v;
    b16[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
}

template <class T>
using dbuf = zipage::testing::device_buffer<T>;

struct logits_set {
  float* f32 = nullptr;
  std::uint16_t* b16 = nullptr;
};
logits_set g_flat, g_peaked;

struct config {
  bool greedy_null = false;  // temperature == nullptr (argmax kernel, no workspace)
  float temperature = 1.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float penalty = 1.0f;
  int context = 0;  // context tokens per request for the penalty
  int edit_ids = 0;  // logits processors: ids per edited row (a bias each, or allowed with others_banned)
  bool others_banned = false;
  bool one_row = false;  // only row 0 edited
};

struct row_result {
  std::string name;
  double us, gbps;
};
std::vector<row_result> g_rows;

void bm_sample(benchmark::State& state, const std::string& name, int batch, bool bf16, bool peaked, config cfg) {
  const logits_set& L = peaked ? g_peaked : g_flat;
  std::vector<float> temp(batch, cfg.temperature), top_p(batch, cfg.top_p), min_p(batch, cfg.min_p),
      pen(batch, cfg.penalty);
  std::vector<std::int32_t> top_k(batch, cfg.top_k), indptr{0}, ids;
  std::vector<std::uint64_t> seed(batch), step(batch, 17);
  for (int r = 0; r < batch; ++r) {
    seed[r] = 1000 + r;
    for (int j = 0; j < cfg.context; ++j) ids.push_back(static_cast<std::int32_t>((r * 7919u + j * 104729u) % kVocab));
    indptr.push_back(static_cast<std::int32_t>(ids.size()));
  }
  dbuf<float> d_temp(temp), d_top_p(top_p), d_min_p(min_p), d_pen(pen);
  dbuf<std::int32_t> d_top_k(top_k), d_indptr(indptr), d_ids(ids), d_out(batch);
  zipage::logit_edit_csr csr;
  zipage::logit_edits e;
  for (int r = 0; r < batch; ++r) {
    if (cfg.edit_ids <= 0 || (cfg.one_row && r != 0)) {
      csr.append_none();
      continue;
    }
    e.clear();
    e.others_banned = cfg.others_banned;
    for (int j = 0; j < cfg.edit_ids; ++j) {  // ascending ids, as make_logit_edits gives
      e.ids.push_back(static_cast<std::int32_t>((j * 30011u + r * 13u) % 30011u + j * 30011u));
      e.adds.push_back(cfg.others_banned ? 0.0f : 2.5f);
    }
    csr.append(e);
  }
  dbuf<std::int32_t> d_e_indptr(csr.indptr), d_e_ids(csr.ids), d_e_banned(csr.others_banned);
  dbuf<float> d_e_adds(csr.adds);
  dbuf<std::uint64_t> d_seed(seed), d_step(step);
  zc::sampling_batch p;
  p.logits = bf16 ? static_cast<const void*>(L.b16) : static_cast<const void*>(L.f32);
  p.dtype = bf16 ? zc::logits_dtype::bf16 : zc::logits_dtype::f32;
  p.batch = batch;
  p.vocab = kVocab;
  p.temperature = cfg.greedy_null ? nullptr : d_temp.p;
  p.top_k = d_top_k.p;
  p.top_p = d_top_p.p;
  p.min_p = d_min_p.p;
  p.seed = d_seed.p;
  p.step = d_step.p;
  if (cfg.context > 0) {
    p.repetition_penalty = d_pen.p;
    p.context_indptr = d_indptr.p;
    p.context_ids = d_ids.p;
  }
  if (cfg.edit_ids > 0) {
    p.edit_indptr = d_e_indptr.p;
    p.edit_ids = d_e_ids.p;
    p.edit_adds = d_e_adds.p;
    p.edit_others_banned = d_e_banned.p;
  }
  p.out_tokens = d_out.p;
  const std::size_t ws_bytes = zc::sampling_workspace_bytes(batch, kVocab, cfg.greedy_null);
  dbuf<std::uint8_t> ws(ws_bytes);
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<double> times;
  {
    zc::event_timer timer;
    for (int i = 0; i < 3; ++i) zc::sample_tokens(p, ws.p, ws_bytes, stream);  // warm-up
    CK(cudaStreamSynchronize(stream));
    for (auto _ : state) {
      const double s = timer.time(stream, [&] {
        for (int i = 0; i < kCalls; ++i) zc::sample_tokens(p, ws.p, ws_bytes, stream);
      }) / kCalls;
      times.push_back(s);
      state.SetIterationTime(s);
    }
  }
  CK(cudaStreamDestroy(stream));
  std::sort(times.begin(), times.end());
  const double s = times[times.size() / 2];
  const double bytes = double(batch) * kVocab * (bf16 ? 2 : 4);
  state.counters["us"] = s * 1e6;
  state.counters["logits_GBps"] = bytes / s / 1e9;
  g_rows.push_back({name, s * 1e6, bytes / s / 1e9});
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
    const std::size_t n = std::size_t(kMaxBatch) * kVocab;
    for (auto* set : {&g_flat, &g_peaked}) {
      CK(cudaMalloc(&set->f32, n * sizeof(float)));
      CK(cudaMalloc(&set->b16, n * sizeof(std::uint16_t)));
    }
    fill_logits<<<4096, 256>>>(g_flat.f32, g_flat.b16, kMaxBatch, kVocab, 1.0f, 0, 1);
    fill_logits<<<4096, 256>>>(g_peaked.f32, g_peaked.b16, kMaxBatch, kVocab, 2.0f, 8, 2);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());

    struct named {
      const char* name;
      config cfg;
    };
    const named configs[] = {
        {"greedy", {.greedy_null = true}},
        {"temperature0", {.temperature = 0.0f}},
        {"T1", {}},
        {"top_p0.95", {.top_p = 0.95f}},
        {"top_k50", {.top_k = 50}},
        {"top_k50_top_p0.95", {.top_k = 50, .top_p = 0.95f}},
        {"min_p0.05", {.min_p = 0.05f}},
        {"penalty1.2_ctx1024_top_p0.95", {.top_p = 0.95f, .penalty = 1.2f, .context = 1024}},
        {"top_p0.95_bias4", {.top_p = 0.95f, .edit_ids = 4}},
        {"top_p0.95_bias4_1row", {.top_p = 0.95f, .edit_ids = 4, .one_row = true}},
        {"top_p0.95_allowed5", {.top_p = 0.95f, .edit_ids = 5, .others_banned = true}},
        {"greedy_bias4", {.greedy_null = true, .edit_ids = 4}},
    };
    for (const bool peaked : {false, true})
      for (const named& c : configs)
        for (const bool bf16 : {false, true})
          for (const int batch : {256, 64, 1}) {
            if (batch != 256 && (bf16 || (std::string(c.name) != "greedy" && std::string(c.name) != "top_p0.95"))) continue;
            if (peaked && batch != 256) continue;
            const std::string name = std::string(peaked ? "peaked/" : "flat/") + c.name + (bf16 ? "/bf16" : "/fp32") +
                                     "/batch" + std::to_string(batch);
            benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { bm_sample(st, name, batch, bf16, peaked, c.cfg); })
                ->UseManualTime()
                ->Iterations(10)
                ->Unit(benchmark::kMicrosecond);
          }
    benchmark::RunSpecifiedBenchmarks();
    std::printf("\n## sampling, vocab %d (median of 10 x %d calls)\n\n| case | time (us) | logits GB/s |\n|---|---:|---:|\n",
                kVocab, kCalls);
    for (const row_result& r : g_rows) std::printf("| %s | %.1f | %.0f |\n", r.name.c_str(), r.us, r.gbps);
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  benchmark::Shutdown();
  return 0;
}
