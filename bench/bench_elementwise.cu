// The decode step's small kernels on the GPU at the compressed engine's steady-state batch, against the device's
// copy bandwidth measured in the same program: what each would take at the memory limit, and how far it is.
//
// Cases (Qwen3-8B shape: hidden 4096, 32 q heads and 8 KV heads of 128, intermediate 12288; bf16 activations):
//   qkv_epilogue      q|k|v [rows][6144] -> q, k, v with q/k RMSNorm and RoPE (positions 2,048-18,431)
//   add_rms_norm_fp8  x += y, out = rmsnorm(x) and out's FP8 copy (the input of the next FP8 linear)
//   silu_mul_fp8      gate|up [rows][2 x 12288] -> silu(gate) * up and its FP8 copy
//   append_kv_fp8     k, v [rows][1024] quantised into an FP8 paged cache at scattered slots
// Each case's time is one call's device time, from CUDA events around a CUDA graph of back-to-back calls that
// rotate over disjoint buffer sets (so that the inputs come from HBM, not L2, as in the engine where a GEMM or
// the attention ran between). Counters: bytes read + written per call, GB/s and the fraction of the copy
// bandwidth (2 GiB cudaMemcpy, bytes read + written). A table at the end.
//
//   bench_elementwise [--rows=662] [--benchmark_filter=...] [--benchmark_out=file.json --benchmark_out_format=json]
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_buffers.hpp"
#include "copy_bandwidth.cuh"
#include "zipage/backend/cuda/event_timer.cuh"
#include "zipage/backend/cuda/fp8_gemm.hpp"  // padded_rows
#include "zipage/backend/cuda/ops.hpp"

namespace {

namespace zc = zipage::cuda;
using zipage::cuda_dtype;
using zipage::testing::median;
template <class T>
using dbuf = zipage::testing::device_buffer<T>;
#define CK(expr) ZIPAGE_CUDA_CHECK(expr)

constexpr int kHidden = 4096, kQHeads = 32, kKvHeads = 8, kHeadDim = 128, kFfn = 12288;
constexpr int kSets = 8;  // disjoint buffer sets per case: 8 x the largest case's ~60 MB leaves L2 behind
int g_rows = 662;         // the FP8 engine's mean decode batch at the compressed steady state (2026-12-02)
double g_copy_bytes_per_s = 0.0;

void fill(void* p, std::size_t elements, std::uint32_t seed) {
  zc::fill_uniform(cuda_dtype::bf16, p, static_cast<std::int64_t>(elements), 1.0f, seed, nullptr);
}

using zipage::testing::measure_copy_bandwidth;

struct result_row {
  std::string name;
  double seconds, bytes;
};
std::vector<result_row> g_results;

// Captures `calls` x launch(set) (set = i % kSets) into a graph and times it; reports one call.
void time_case(benchmark::State& state, const char* name, double bytes,
               const std::function<void(int, cudaStream_t)>& launch) {
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int calls = 8 * kSets;
  for (int i = 0; i < kSets; ++i) launch(i, stream);  // warm-up, outside the capture (first-launch costs)
  CK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) launch(i % kSets, stream);
  CK(cudaStreamEndCapture(stream, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  CK(cudaGraphLaunch(exec, stream));
  CK(cudaStreamSynchronize(stream));
  zc::event_timer timer;
  std::vector<double> per_call;
  for (auto _ : state) {
    const double s = timer.time(stream, [&] { CK(cudaGraphLaunch(exec, stream)); }) / calls;
    per_call.push_back(s);
    state.SetIterationTime(s);
  }
  const double s = median(per_call);
  state.counters["us"] = s * 1e6;
  state.counters["GB_s"] = bytes / s / 1e9;
  state.counters["of_copy"] = bytes / s / g_copy_bytes_per_s;
  g_results.push_back({name, s, bytes});
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamDestroy(stream));
}

// A bf16 tensor per set, random.
struct bf16_sets {
  std::vector<dbuf<std::uint16_t>> b;
  bf16_sets(std::size_t elements, std::uint32_t seed) {
    for (int i = 0; i < kSets; ++i) {
      b.emplace_back(elements);
      fill(b.back().p, elements, seed + 97 * i);
    }
  }
  void* operator[](int i) { return b[i].p; }
};

// FP8 copy buffers of a [rows][cols] output, per set.
struct fp8_copy_sets {
  std::vector<dbuf<std::uint8_t>> codes;
  std::vector<dbuf<float>> scales;
  int padded;
  fp8_copy_sets(int rows, int cols) : padded(zc::fp8::padded_rows(rows)) {
    for (int i = 0; i < kSets; ++i) {
      codes.emplace_back(std::size_t(padded) * cols);
      scales.emplace_back(std::size_t(cols / 128) * padded);
    }
  }
  zc::fp8_copy operator[](int i) { return {codes[i].p, scales[i].p, padded}; }
};

void bm_copy(benchmark::State& state) {
  for (auto _ : state) state.SetIterationTime(1.0);
  state.counters["GB_s"] = g_copy_bytes_per_s / 1e9;
}

void bm_qkv_epilogue(benchmark::State& state) {
  const int rows = g_rows, width = (kQHeads + 2 * kKvHeads) * kHeadDim;
  bf16_sets qkv(std::size_t(rows) * width, 11), q(std::size_t(rows) * kQHeads * kHeadDim, 0),
      k(std::size_t(rows) * kKvHeads * kHeadDim, 0), v(std::size_t(rows) * kKvHeads * kHeadDim, 0);
  dbuf<std::uint16_t> qn(kHeadDim), kn(kHeadDim);
  fill(qn.p, kHeadDim, 3);
  fill(kn.p, kHeadDim, 4);
  std::vector<double> inv_freq(kHeadDim / 2);
  for (int i = 0; i < kHeadDim / 2; ++i) inv_freq[i] = std::pow(1e6, -2.0 * i / kHeadDim);  // Qwen3's theta
  dbuf<double> freq(inv_freq);
  std::vector<std::int32_t> pos(rows);
  std::mt19937 rng(5);
  for (auto& p : pos) p = 2048 + static_cast<std::int32_t>(rng() % 16384);
  dbuf<std::int32_t> positions(pos);
  const double bytes = 2.0 * rows * width * 2;  // q|k|v read, q, k, v written (bf16)
  time_case(state, "qkv_epilogue", bytes, [&](int s, cudaStream_t st) {
    zc::qkv_epilogue_params p;
    p.qkv = qkv[s], p.q = q[s], p.k = k[s], p.v = v[s];
    p.q_norm = qn.p, p.k_norm = kn.p, p.positions = positions.p, p.inv_freq = freq.p;
    p.rows = rows, p.num_q_heads = kQHeads, p.num_kv_heads = kKvHeads, p.head_dim = kHeadDim;
    zc::qkv_epilogue(p, st);
  });
}

void bm_add_rms_norm_fp8(benchmark::State& state) {
  const int rows = g_rows;
  bf16_sets x(std::size_t(rows) * kHidden, 21), y(std::size_t(rows) * kHidden, 22), out(std::size_t(rows) * kHidden, 0);
  fp8_copy_sets copy(rows, kHidden);
  dbuf<std::uint16_t> w(kHidden);
  fill(w.p, kHidden, 23);
  // x, y read; x, out written (bf16); codes and scales written.
  const double bytes = 4.0 * rows * kHidden * 2 + double(copy.padded) * kHidden * (1.0 + 4.0 / 128);
  time_case(state, "add_rms_norm_fp8", bytes, [&](int s, cudaStream_t st) {
    zc::add_rms_norm(cuda_dtype::bf16, x[s], y[s], cuda_dtype::bf16, w.p, out[s], rows, kHidden, 1e-6f,
                     zipage::cuda::kernel_variant::tuned, copy[s], st);
  });
}

void bm_silu_mul_fp8(benchmark::State& state) {
  const int rows = g_rows;
  bf16_sets gate_up(std::size_t(rows) * 2 * kFfn, 31), out(std::size_t(rows) * kFfn, 0);
  fp8_copy_sets copy(rows, kFfn);
  // gate|up read, out written (bf16); codes and scales written.
  const double bytes = 3.0 * rows * kFfn * 2 + double(copy.padded) * kFfn * (1.0 + 4.0 / 128);
  time_case(state, "silu_mul_fp8", bytes, [&](int s, cudaStream_t st) {
    auto* g = static_cast<std::uint16_t*>(gate_up[s]);
    zc::silu_mul(cuda_dtype::bf16, g, g + kFfn, out[s], rows, kFfn, 2 * kFfn, zipage::cuda::kernel_variant::tuned,
                 copy[s], st);
  });
}

void bm_append_kv_fp8(benchmark::State& state) {
  const int rows = g_rows, kv_width = kKvHeads * kHeadDim;
  // A pool of rows * 2304 slots (every request's cache at its largest), the new token of request r at a slot of
  // its own blocks (256-token blocks, shuffled).
  const int block = 256, blocks_per_seq = 9, blocks = rows * blocks_per_seq;
  const std::size_t slots = std::size_t(blocks) * block;
  dbuf<std::uint8_t> kc(slots * kv_width), vc(slots * kv_width);
  dbuf<std::uint16_t> ks(slots * kKvHeads), vs(slots * kKvHeads);  // a bf16 scale per (slot, KV head)
  bf16_sets k(std::size_t(rows) * kv_width, 41), v(std::size_t(rows) * kv_width, 42);
  std::vector<int> order(blocks);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(6);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<dbuf<std::int64_t>> slot_sets;
  for (int s = 0; s < kSets; ++s) {
    std::vector<std::int64_t> sl(rows);
    for (int r = 0; r < rows; ++r)
      sl[r] = std::int64_t{order[r * blocks_per_seq + 8]} * block + (s * 7 + r) % block;
    slot_sets.emplace_back(sl);
  }
  // k, v read (bf16); codes and bf16 scales written.
  const double bytes = 2.0 * rows * kv_width * 2 + 2.0 * rows * (kv_width + 2.0 * kKvHeads);
  time_case(state, "append_kv_fp8", bytes, [&](int s, cudaStream_t st) {
    zc::append_kv_params p;
    p.kv.k_cache = kc.p, p.kv.v_cache = vc.p, p.kv.k_scale = ks.p, p.kv.v_scale = vs.p;
    p.kv.num_blocks = blocks, p.kv.block_size = block, p.kv.num_kv_heads = kKvHeads, p.kv.head_dim = kHeadDim;
    p.k = k[s], p.v = v[s], p.slots = slot_sets[s].p, p.num_tokens = rows;
    zc::append_kv(cuda_dtype::bf16, p, zipage::cuda::kernel_variant::tuned, st);
  });
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--rows=", 7) == 0) {
      g_rows = std::atoi(argv[i] + 7);
      if (g_rows < 1 || g_rows > 65536) {
        std::fprintf(stderr, "bench_elementwise: --rows must be in [1, 65536], got %s\n", argv[i] + 7);
        return 2;
      }
      continue;
    }
    args.push_back(argv[i]);
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::printf("bench_elementwise: no CUDA device, nothing measured\n");
    return 0;
  }
  g_copy_bytes_per_s = measure_copy_bandwidth();
  std::printf("device-to-device copy: %.1f GB/s (bytes read + written, 2 GiB cudaMemcpy, median of 15); rows %d\n",
              g_copy_bytes_per_s / 1e9, g_rows);
  benchmark::RegisterBenchmark("copy_bandwidth", bm_copy)->UseManualTime()->Iterations(1);
  benchmark::RegisterBenchmark("qkv_epilogue", bm_qkv_epilogue)->UseManualTime()->Iterations(20);
  benchmark::RegisterBenchmark("add_rms_norm_fp8", bm_add_rms_norm_fp8)->UseManualTime()->Iterations(20);
  benchmark::RegisterBenchmark("silu_mul_fp8", bm_silu_mul_fp8)->UseManualTime()->Iterations(20);
  benchmark::RegisterBenchmark("append_kv_fp8", bm_append_kv_fp8)->UseManualTime()->Iterations(20);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::printf("\n| op (rows %d) | us per call | MB moved | GB/s | of copy bandwidth | at copy bandwidth |\n"
              "|---|---:|---:|---:|---:|---:|\n", g_rows);
  for (const auto& r : g_results)
    std::printf("| %s | %.1f | %.1f | %.0f | %.1f%% | %.1f us |\n", r.name.c_str(), r.seconds * 1e6, r.bytes / 1e6,
                r.bytes / r.seconds / 1e9, 100.0 * r.bytes / r.seconds / g_copy_bytes_per_s,
                r.bytes / g_copy_bytes_per_s * 1e6);
  return 0;
}
