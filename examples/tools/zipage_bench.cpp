// zipage-bench: serving throughput of the engine on the GPU (zipage::cuda_backend, bf16) with a
// random-weight Llama/Qwen3-shaped model built directly on the device (no checkpoint needed).
//
//   zipage-bench --shape qwen3-8b --workload nano --mode full
//   zipage-bench --shape qwen3-0.6b --workload long --mode both --num-requests 64 --seconds 60
//   zipage-bench --shape path/to/Qwen3-14B/config.json --workload long --kv-cache-dtype fp8   # any config's geometry
//
// Workloads:
//   nano  nano-vllm's benchmark: 256 requests (seed 0), prompt and output lengths uniform in [100, 1024],
//         random token ids, EOS ignored; all queued at once, run to completion (or --seconds).
//   long  N requests with 128-token prompts and long outputs (--output-len), time-boxed (--seconds);
//         steady-state tok/s over the second half of the run.
// Modes: full (full KV) and compressed (--policy, zipage by default; budget 2048 = 8 blocks of 256, window 16).
//
// Reported per run: output tok/s, steps, peak running requests, preemptions, swaps, compressions, host
// time per step (wall time of engine.step() outside the forward pass: scheduling, batch layout,
// bookkeeping), forward time per step (host time in the model's forward — with CUDA graphs the record
// pass, and the capture when one is needed — plus the time the step waits for the GPU in sampling / logits
// copies), CUDA-graph replays and captures, where the compression worker spent its time (device gathers, host
// scoring, compaction), and the physical ceiling: per step max((weight bytes + KV bytes read) / copy bandwidth, the
// layers' FLOPs at their own GEMM rate (bf16 or FP8) + the vocabulary projection's on the sampled rows at the bf16
// rate), with the rates measured in the same run, summed over the steps and divided by the measured time; and a
// power-aware ceiling that also bounds each step by its energy floor (its bytes and FLOPs at dynamic joules measured
// in the same process, over the power the board's limit leaves above idle: energy_costs, measured before the runs
// and again after each, and the ceiling priced with both); both also over the steady half alone. On the bf16 CUDA
// backend every built-in policy (--policy) is scored, selected and compacted on the device in batches
// (cuda_backend::compress_on_device; the "compression worker" column shows its time and batches, and the run's line
// its time per request and share of the wall time).
#include <malloc.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../common/dtype_flags.hpp"
#include "../common/number_flags.hpp"
#include "zipage/backend/cuda/attention.hpp"  // prefill_kernel_on_device
#include "zipage/backend/cuda/cuda_backend.hpp"
#include "zipage/cuda/device.hpp"
#include "zipage/cuda/energy.hpp"
#include "zipage/engine/engine.hpp"
#include "zipage/models/hf_config.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/policy/policies.hpp"

namespace {

using namespace zipage;
using clock_type = std::chrono::steady_clock;

double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

// The preset shapes: Qwen3's dense checkpoints (their config.json's sizes; Qwen3-1.7B, 4B and 0.6B tie the vocabulary
// projection to the embedding) and a tiny one.
struct shape_preset {
  const char* name;
  int vocab, hidden, layers, q_heads, kv_heads, head_dim, ffn;
  bool tied;
};
constexpr shape_preset shape_presets[] = {
    {"qwen3-0.6b", 151936, 1024, 28, 16, 8, 128, 3072, true},   {"qwen3-1.7b", 151936, 2048, 28, 16, 8, 128, 6144, true},
    {"qwen3-4b", 151936, 2560, 36, 32, 8, 128, 9728, true},     {"qwen3-8b", 151936, 4096, 36, 32, 8, 128, 12288, false},
    {"qwen3-14b", 151936, 5120, 40, 40, 8, 128, 17408, false},  {"qwen3-32b", 151936, 5120, 64, 64, 8, 128, 25600, false},
    {"tiny", 4096, 512, 4, 8, 4, 64, 1024, true},
};

std::string preset_names() {
  std::string names;
  for (const shape_preset& p : shape_presets) names += (names.empty() ? "" : ", ") + std::string(p.name);
  return names;
}

// --shape: a preset, or a Hugging Face config.json (or a checkpoint directory holding one), whose model is built with
// random weights (vLLM's --load-format dummy): any Llama / Qwen2 / Qwen3 geometry that zipage loads.
model_config shape_config(const std::string& shape) {
  for (const shape_preset& p : shape_presets) {
    if (shape != p.name) continue;
    model_config c;
    c.rope = rope_style::half;
    c.rope_theta = 1e6f;
    c.rms_eps = 1e-6f;
    c.qk_norm = true;
    c.bos = 0;
    c.vocab_size = p.vocab, c.hidden_size = p.hidden, c.num_layers = p.layers, c.num_q_heads = p.q_heads;
    c.num_kv_heads = p.kv_heads, c.head_dim = p.head_dim, c.ffn_size = p.ffn, c.tied_embeddings = p.tied;
    c.eos = c.vocab_size - 1;
    c.max_context = 40960;  // Qwen3's max_position_embeddings
    c.architecture = "qwen3";
    return c;
  }
  std::error_code ec;
  if (!std::filesystem::exists(shape, ec))
    fail("--shape: '", shape, "' is neither a preset (", preset_names(),
         ") nor a Hugging Face config.json or checkpoint directory");
  try {
    return load_hf_config(shape);
  } catch (const std::exception& e) {
    fail("--shape ", shape, ": ", e.what());
  }
}

// Host time spent in the model's forward pass, shared between the wrapper model (owned by the engine)
// and the bench.
struct forward_clock {
  double launch = 0.0;  // host time to enqueue the forward pass (with graphs: record pass, capture)
};

// llama_model<cuda_backend> whose forward pass's host time is measured. It does not synchronise (that
// would break stream capture): the GPU time of a step shows up where the engine waits for its tokens.
struct timed_model {
  using backend_type = cuda_backend;
  using tensor = cuda_tensor;
  llama_model<cuda_backend> inner;
  cuda_backend backend;
  std::shared_ptr<forward_clock> clock;

  [[nodiscard]] const model_config& config() const { return inner.config(); }
  const tensor& forward(forward_context<cuda_backend>& ctx) {
    const auto t0 = clock_type::now();
    const tensor& logits = inner.forward(ctx);
    clock->launch += since(t0);
    return logits;
  }
};

struct weight_stats {
  double bytes_per_step = 0;  // read by one forward pass (layer weights + the vocabulary projection)
  double params = 0;          // multiply-adds per token (layer weights + vocabulary projection)
  double vocab_params = 0;    // of which the vocabulary projection's (bf16 always; run only on the sampled rows)
  double total_bytes = 0;
};

// The rates of the compute floor: the layers' linear GEMMs in the run's weight dtype (bf16, or FP8 with block
// scales: ~1.7x the bf16 rate) and the vocabulary projection's (bf16).
struct gemm_rates {
  double linear_tflops = 0, vocab_tflops = 0;
  [[nodiscard]] double floor_seconds(double linear_flops, double vocab_flops) const {
    return linear_flops / (linear_tflops * 1e12) + vocab_flops / (vocab_tflops * 1e12);
  }
};

// fuse: q/k/v and gate/up as one GEMM each (fuse_projections, as the loaders do); off for an A/B run.
timed_model build_model(const cuda_backend& b, const model_config& c, std::uint64_t seed, bool fuse, weight_stats& ws) {
  std::uint64_t next = seed * 1000;
  auto uniform = [&](int rows, int cols, float std_dev) {
    return b.random_tensor(rows, cols, std_dev * std::sqrt(3.0f), ++next);
  };
  auto ones = [&](int n) { return b.constant_tensor(1, n, 1.0f); };
  llama_weights<cuda_backend> w;
  w.embedding = uniform(c.vocab_size, c.hidden_size, 1.0f);
  const float s_in = 1.0f / std::sqrt(static_cast<float>(c.hidden_size));
  for (int l = 0; l < c.num_layers; ++l) {
    llama_layer_weights<cuda_backend> lw;
    lw.attn_norm = ones(c.hidden_size);
    lw.ffn_norm = ones(c.hidden_size);
    lw.wq = uniform(c.q_size(), c.hidden_size, s_in);
    lw.wk = uniform(c.kv_size(), c.hidden_size, s_in);
    lw.wv = uniform(c.kv_size(), c.hidden_size, s_in);
    lw.wo = uniform(c.hidden_size, c.q_size(), 1.0f / std::sqrt(static_cast<float>(c.q_size())));
    if (c.qkv_bias) {  // Qwen2 (a config.json shape)
      lw.bq = uniform(1, c.q_size(), 0.02f);
      lw.bk = uniform(1, c.kv_size(), 0.02f);
      lw.bv = uniform(1, c.kv_size(), 0.02f);
      for (const cuda_tensor* t : {&*lw.bq, &*lw.bk, &*lw.bv}) ws.bytes_per_step += static_cast<double>(t->bytes());
    }
    if (c.qk_norm) {
      lw.q_norm = ones(c.head_dim);
      lw.k_norm = ones(c.head_dim);
    }
    lw.w_gate = uniform(c.ffn_size, c.hidden_size, s_in);
    lw.w_up = uniform(c.ffn_size, c.hidden_size, s_in);
    lw.w_down = uniform(c.hidden_size, c.ffn_size, 1.0f / std::sqrt(static_cast<float>(c.ffn_size)));
    // --quantization fp8: the linear weights become E4M3 + 128x128 block scales (as a loaded checkpoint's would).
    prepare_linear_weights(b, lw);
    for (const cuda_tensor* t : {&lw.attn_norm, &lw.ffn_norm, &lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.w_gate, &lw.w_up,
                                 &lw.w_down}) {
      ws.bytes_per_step += static_cast<double>(t->bytes());
      ws.params += static_cast<double>(t->size());
    }
    if (lw.q_norm) ws.bytes_per_step += static_cast<double>(lw.q_norm->bytes() + lw.k_norm->bytes());
    if (fuse) fuse_projections(b, lw);
    w.layers.push_back(std::move(lw));
  }
  w.final_norm = ones(c.hidden_size);
  if (!c.tied_embeddings) w.lm_head = uniform(c.vocab_size, c.hidden_size, s_in);
  const cuda_tensor& head = w.lm_head ? *w.lm_head : w.embedding;
  ws.bytes_per_step += static_cast<double>(head.bytes());
  ws.params += static_cast<double>(head.size());
  ws.vocab_params = static_cast<double>(head.size());
  ws.total_bytes = ws.bytes_per_step + (w.lm_head ? static_cast<double>(w.embedding.bytes()) : 0.0);
  b.synchronize();
  timed_model m{llama_model<cuda_backend>(c, std::move(w)), b, std::make_shared<forward_clock>()};
  return m;
}

struct options {
  std::string shape = "qwen3-0.6b";
  std::string workload = "nano";
  std::string mode = "both";
  std::string policy = "zipage";  // compressed mode: a built-in evicting policy, or "all"
  int tensor_parallel_size = 1;   // 1 only until tensor parallelism runs on several GPUs (docs/tensor-parallel.md)
  int num_requests = 0;  // 0 = the workload's default
  double seconds = 0.0;  // 0 = nano: to completion; long: 60
  int output_len = 32768;
  int prompt_len = 128;
  std::uint64_t seed = 0;
  int max_num_seqs = 256;
  int max_batched_tokens = 16384;
  int block_size = zipage::reference_block_size;  // the method's reference block (256), not the library's 16
  int budget_tokens = zipage::default_budget_tokens;
  int window = zipage::default_window;
  double gpu_memory_utilization = 0.9;
  double kv_gib = 0.0;
  int num_query_slots = 0;
  bool no_graphs = false;
  bool unfused_projections = false;  // q/k/v and gate/up as separate GEMMs (the loaders fuse them)
  bool op_timing = false;            // per-op GPU time of the decode steps (implies --no-graphs)
  bool unfused_quantize = false;     // FP8 weights: every linear quantises its own input (A/B of fuse_fp8_quantize)
  bool fused_append = false;         // FP8 KV: the swapped decode kernels append (fuse_decode_append)
  std::string fp8_decode_kernel = "automatic";  // cuda::fp8_decode_kernel by name
  std::string prefill_kernel = "automatic";  // cuda::prefill_kernel by name
  std::string fp8_gemm_kernel = "automatic";  // cuda::fp8_gemm_kernel by name
  float temperature = 0.0f;
  std::string json;
  std::string kv_cache_dtype = "auto";  // auto (bf16) | fp8 | fp8_e4m3
  std::string quantization = "auto";    // linear weights: auto / none (bf16) | fp8 | fp8_e4m3
  bool linear_bench = false;            // FP8 vs bf16 linear() TFLOP/s at the shape's GEMMs, then exit
  bool sync_compression = false;
  int overlap_min_batch = cuda_backend_options{}.overlap_min_batch;  // nano-batch overlap from this batch (0: off)
  int overlap_gemm_sms = cuda_backend_options{}.overlap_gemm_sms;    // SMs of a GEMM beside attention (0: all)
};

// The longest request the workload makes must fit the model's context (the engine would stop it there, finish_reason
// length, and the run would measure a shorter workload than asked for).
void check_workload_fits(const options& o, const model_config& c) {
  if (c.max_context <= 0) return;
  if (o.workload != "nano") {
    const long long longest = static_cast<long long>(o.prompt_len) + o.output_len;
    check(longest <= c.max_context, "--prompt-len ", o.prompt_len, " + --output-len ", o.output_len, " = ", longest,
          " tokens exceeds the model's context of ", c.max_context, " tokens (--shape ", o.shape, ")");
  }
  if (o.workload != "long")
    check(2048 <= c.max_context, "--workload nano makes requests of up to 2,048 tokens, past the model's context of ",
          c.max_context, " tokens (--shape ", o.shape, ")");
}

// A flag naming one value of a kernel enum (cuda::all_prefill_kernels, cuda::all_fp8_decode_kernels): the names it
// accepts, and the value a name it accepted stands for.
template <class E, std::size_t N>
std::vector<std::string> names_of(const E (&all)[N]) {
  std::vector<std::string> names;
  for (const E k : all) names.emplace_back(cuda::to_string(k));
  return names;
}
template <class E, std::size_t N>
E named(const E (&all)[N], const std::string& name) {
  for (const E k : all)
    if (name == cuda::to_string(k)) return k;
  return all[0];  // unreachable after CLI::IsMember(names_of(all)); all[0] is each enum's automatic
}

// One linear(x, w) call's time in µs: the median of 5 runs of 50 back-to-back calls after a warm-up, synchronised at
// both ends.
double linear_call_us(const cuda_backend& b, const cuda_tensor& x, const cuda_tensor& w, cuda_tensor& out) {
  constexpr int reps = 50;
  for (int i = 0; i < 5; ++i) b.linear(x, w, out);
  std::vector<double> runs;
  for (int r = 0; r < 5; ++r) {
    b.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) b.linear(x, w, out);
    b.synchronize();
    runs.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps);
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

// The joules of one linear(x, w) call (`us`: its time) over ~1 s of back-to-back calls, 0 when the sampler saw too
// little or NVML is not there; and the span measured.
std::pair<double, zipage::cuda::power_sampler::span> linear_call_energy(const zipage::cuda::energy_meter& meter,
                                                                       const cuda_backend& b, const cuda_tensor& x,
                                                                       const cuda_tensor& w, cuda_tensor& out,
                                                                       double us) {
  const int calls = static_cast<int>(std::ceil(1e6 / us));
  b.synchronize();
  const auto e = zipage::cuda::measure_work_energy(meter, 20, [&] {
    for (int i = 0; i < calls; ++i) b.linear(x, w, out);
    b.synchronize();
  });
  return {e.samples > 0 ? e.joules / calls : 0.0, e};
}

// FP8 linear() (activation quantisation + cuBLASLt block-scaled FP8 GEMM) against bf16 linear() (cuBLASLt bf16
// GEMM) at the shape's linear layers and M tokens, timed in the same process: host clock around `reps` calls
// after a warm-up, synchronised at both ends (median of 5 such runs). From M = 512 (662 is the compressed FP8
// engine's steady batch) also the energy per FLOP: ~1 s of back-to-back calls under a power sampler (NVML;
// "-" without it), with the mean SM clock of the FP8 loop. Nothing is asserted.
void linear_bench(const cuda_backend& b, const model_config& c) {
  struct layer {
    const char* name;
    int n, k;
  };
  const layer layers[] = {{"q/o", c.q_size(), c.hidden_size},
                          {"k/v", c.kv_size(), c.hidden_size},
                          {"q|k|v (fused)", c.q_size() + 2 * c.kv_size(), c.hidden_size},
                          {"gate/up", c.ffn_size, c.hidden_size},
                          {"gate|up (fused)", 2 * c.ffn_size, c.hidden_size},
                          {"down", c.hidden_size, c.ffn_size}};
  const zipage::cuda::energy_meter meter;
  std::printf("| layer | N x K | M | bf16 us | bf16 TFLOP/s | fp8 us | fp8 TFLOP/s | fp8 / bf16 | bf16 pJ/FLOP | fp8 pJ/FLOP "
              "| fp8 W, SM MHz |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const layer& l : layers) {
    const cuda_tensor w16 = b.random_tensor(l.n, l.k, 1.0f / std::sqrt(static_cast<float>(l.k)), 77);
    cuda_tensor w8 = w16;
    const bool fp8 = b.prepare_linear_weight(w8);
    for (const int m : {64, 256, 512, 662, 1024}) {
      const cuda_tensor x = b.random_tensor(m, l.k, 1.0f, 78);
      cuda_tensor out;
      const double flop = 2.0 * m * l.n * static_cast<double>(l.k);
      const double t16 = linear_call_us(b, x, w16, out);
      const double t8 = fp8 ? linear_call_us(b, x, w8, out) : 0.0;
      std::string pj16 = "-", pj8 = "-", clocks = "-";
      if (meter.available() && m >= 512) {
        char buf[64];
        if (const auto [joules, e] = linear_call_energy(meter, b, x, w16, out, t16); joules > 0) {
          std::snprintf(buf, sizeof buf, "%.3f", joules / flop * 1e12);
          pj16 = buf;
        }
        if (fp8)
          if (const auto [joules, e] = linear_call_energy(meter, b, x, w8, out, t8); joules > 0) {
            std::snprintf(buf, sizeof buf, "%.3f", joules / flop * 1e12);
            pj8 = buf;
            std::snprintf(buf, sizeof buf, "%.0f W, %.0f MHz", e.watts(), e.sm_mhz);
            clocks = buf;
          }
      }
      if (fp8)
        std::printf("| %s | %d x %d | %d | %.1f | %.0f | %.1f | %.0f | %.2fx | %s | %s | %s |\n", l.name, l.n, l.k, m, t16,
                    flop / t16 / 1e6, t8, flop / t8 / 1e6, t16 / t8, pj16.c_str(), pj8.c_str(), clocks.c_str());
      else
        std::printf("| %s | %d x %d | %d | %.1f | %.0f | - | - | (FP8 GEMM refused this shape) | %s | - | - |\n", l.name,
                    l.n, l.k, m, t16, flop / t16 / 1e6, pj16.c_str());
    }
  }
  if (!meter.available()) std::printf("(no energy columns: %s)\n", meter.why_unavailable().c_str());
}

// The power-aware ceiling's constants, measured in the same process before the runs (docs/benchmarks.md, "part 3
// against a power-aware ceiling"). The board's power is modelled as idle power plus a dynamic part proportional to
// the bytes read and the FLOPs run: joules per byte from a read-only stream (the cheapest way to move bytes: no
// writes, no math), joules per FLOP from the model's widest GEMM at 1,024 rows (its best efficiency), each less the
// idle power over its time. A step then takes at least its bytes' and FLOPs' dynamic joules over the power the limit
// leaves above idle. (Costs taken whole, static power included, overstate the floor: an 8-row GEMV's 243 pJ per byte
// put the engine at 107-130% of such a "ceiling" on 2026-12-03.) All 0 without NVML.
struct energy_costs {
  double joules_per_byte = 0, joules_per_flop = 0, power_limit_w = 0, idle_w = 0;
  double stream_w = 0, stream_gbs = 0;  // the read-only stream's power and bandwidth, for the record
  std::string why_not;  // when unavailable
  [[nodiscard]] bool available() const {
    return joules_per_byte > 0 && joules_per_flop > 0 && power_limit_w > idle_w && idle_w > 0;
  }
  // The energy floor of a step that reads `bytes` and runs `flops`, in seconds (0: unavailable).
  [[nodiscard]] double floor_seconds(double bytes, double flops) const {
    return available() ? (bytes * joules_per_byte + flops * joules_per_flop) / (power_limit_w - idle_w) : 0.0;
  }
};

// One step's floors, kept so that the power-aware ceiling can be priced after the run with constants measured
// before and after it (on 2026-12-04 the stream's pJ per byte moved 18% between processes and 19% between the two
// ends of one run, as the board heated, so one reading cannot be trusted alone).
struct step_cost {
  double floor_s = 0;  // max(bytes / bandwidth, FLOPs / rate): the full-clock floor
  double bytes = 0, flops = 0;
};

// The power-aware floor of steps [first, end): each step's full-clock floor or its energy floor, whichever is longer.
double power_floor_seconds(const std::vector<step_cost>& steps, std::size_t first, const energy_costs& ec) {
  double s = 0;
  for (std::size_t i = first; i < steps.size(); ++i)
    s += std::max(steps[i].floor_s, ec.floor_seconds(steps[i].bytes, steps[i].flops));
  return s;
}

void print_energy_costs(const char* when, const energy_costs& ec, const model_config& c) {
  if (ec.available())
    std::printf("energy costs (power-aware ceiling), measured %s: idle %.0f W; read-only stream %.0f GB/s at %.0f W, "
                "%.1f pJ per byte above idle; %d x %d GEMM at 1,024 rows %.3f pJ/FLOP above idle; power limit %.0f W\n",
                when, ec.idle_w, ec.stream_gbs, ec.stream_w, ec.joules_per_byte * 1e12, 2 * c.ffn_size, c.hidden_size,
                ec.joules_per_flop * 1e12, ec.power_limit_w);
  else
    std::printf("energy costs, measured %s: none (%s), so no power-aware ceiling\n", when, ec.why_not.c_str());
}

// The model's widest linear (gate|up) in the run's weight dtype (FP8 with block scales when the run's weights are
// FP8): what the compute floor's rate and the energy per FLOP are measured on.
cuda_tensor widest_linear_weight(const cuda_backend& b, const model_config& c) {
  cuda_tensor w = b.random_tensor(2 * c.ffn_size, c.hidden_size, 1.0f / std::sqrt(float(c.hidden_size)), 91);
  b.prepare_linear_weight(w);
  return w;
}

// The layers' GEMM rate for the compute floor: `w` (widest_linear_weight) at 8,192 rows, a prefill chunk's size. The
// bf16 8192^3 rate is not FP8 weights' limit (cuBLASLt's FP8 runs ~1.7x it).
double measure_linear_tflops(const cuda_backend& b, const cuda_tensor& w, int hidden_size) {
  constexpr int rows = 8192;
  const cuda_tensor x = b.random_tensor(rows, hidden_size, 1.0f, 95);
  cuda_tensor out;
  const double us = linear_call_us(b, x, w, out);
  return 2.0 * rows * static_cast<double>(w.size()) / (us * 1e-6) / 1e12;
}

// w: widest_linear_weight's.
energy_costs measure_energy_costs(const cuda_backend& b, const model_config& c, const cuda_tensor& w) {
  energy_costs e;
  const zipage::cuda::energy_meter meter;
  const std::optional<double> limit = meter.power_limit_watts();
  if (!meter.available() || !limit) {
    e.why_not = meter.available() ? "NVML gives no power limit" : meter.why_unavailable();
    return e;
  }
  b.synchronize();
  const auto idle = zipage::cuda::measure_work_energy(meter, 20, [] {
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
  });
  // ~1 s of a 1 GiB read-only stream.
  const cuda_tensor buf = b.random_tensor(32768, 16384, 1.0f, 93);
  b.read_stream(buf, 8);  // warm-up
  const double pass_s = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    b.read_stream(buf, 20);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 20;
  }();
  const int passes = std::max(1, static_cast<int>(1.0 / pass_s));
  const auto stream = zipage::cuda::measure_work_energy(meter, 20, [&] { b.read_stream(buf, passes); });
  const cuda_tensor x = b.random_tensor(1024, c.hidden_size, 1.0f, 92);
  cuda_tensor out;
  const double gemm_us = linear_call_us(b, x, w, out);
  const double gemm_j = linear_call_energy(meter, b, x, w, out, gemm_us).first;
  if (idle.samples == 0 || stream.samples == 0 || gemm_j <= 0) {
    e.why_not = "too few power samples in the 1 s measurements";
    return e;
  }
  e.idle_w = idle.watts();
  e.stream_w = stream.watts();
  const double stream_bytes = static_cast<double>(passes) * static_cast<double>(buf.bytes());
  e.stream_gbs = stream_bytes / stream.seconds / 1e9;
  e.joules_per_byte = (stream.joules - e.idle_w * stream.seconds) / stream_bytes;
  e.joules_per_flop = (gemm_j - e.idle_w * gemm_us * 1e-6) / (2.0 * 1024 * static_cast<double>(w.size()));
  e.power_limit_w = *limit;
  if (!e.available()) e.why_not = "the measured dynamic costs or the power left above idle are not positive";
  return e;
}

struct run_result {
  std::string workload, mode, policy;
  double seconds = 0, output_tokens = 0, prompt_tokens = 0, tok_s = 0, steady_tok_s = 0;
  std::int64_t steps = 0, decode_steps = 0, prefill_steps = 0;
  int peak_running = 0, finished = 0, requests = 0;
  std::int64_t preemptions = 0, swaps = 0, compressions = 0, evicted = 0;
  std::int64_t graph_replays = 0, graph_captures = 0, nano_batch_steps = 0;
  std::int64_t swapped_decodes = 0;  // layers' decode attention launches by the swapped kernel (FP8 KV)
  std::int64_t sm90_fp8_gemms = 0;   // FP8 linears run by fp8::gemm_sm90 (eager calls and graph record passes)
  double graph_capture_s = 0;
  int max_concurrency = 0;
  double host_ms_per_step = 0, forward_ms_per_step = 0, launch_ms_per_step = 0, to_host_ms_per_step = 0;
  double decode_host_ms = 0, decode_forward_ms = 0;
  double ceiling_fraction = 0, decode_mem_ceiling_fraction = 0, floor_seconds = 0, forward_ceiling_fraction = 0;
  // Over the steady half only (the steps that end in it): issue 14's part 3 is about the steady state, which a
  // whole run's fraction overstates when its prefill (compute-bound, near the GEMM rate) is in it.
  double steady_ceiling_fraction = 0;
  // The same with the energy floor (energy_costs): max(bytes / bandwidth, FLOPs / rate, joules / power limit), priced
  // with the constants measured before the run and again after it (price_power_ceiling).
  struct power_fractions {
    double wall = 0, forward = 0, steady = 0;
  };
  power_fractions power_before, power_after;
  energy_costs costs_after;  // the constants measured right after this run
  std::vector<step_cost> step_costs;  // every step that ran tokens, in order
  std::size_t steady_first_cost = 0;  // the first of them in the steady half
  double steady_span = 0;             // the steady half's seconds
  std::vector<cuda_op_time> decode_ops;  // --op-timing: per-op GPU time summed over the decode steps
  double forward_seconds = 0;
  double gather_s = 0, compaction_s = 0, device_compress_s = 0;
  std::int64_t device_compressions = 0, device_batches = 0;
  int num_blocks = 0, num_query_slots = 0, peak_blocks = 0;
  double kv_gib = 0;
  double mean_batch_decode = 0;
  // The steady half's energy (NVML; 0 without it): mJ per generated token, mean W, mean SM MHz, share of samples
  // under the software power cap.
  double steady_mj_per_token = 0, steady_watts = 0, steady_sm_mhz = 0, steady_power_capped = 0;
};

template <class Policy>
run_result run_once(const options& o, const std::string& mode, const cuda_backend& b, const model_config& c,
                    const weight_stats& ws, double bandwidth_gbs, const gemm_rates& rates) {
  const std::size_t token_bytes = kv_bytes_per_token(c, b.kv_element_bytes(), false, b.kv_scale_bytes());
  // KV pool: the engine sizes it (vLLM's rule: gpu_memory_utilization x total memory minus what is in use
  // once the weights are loaded and a profiling forward of --max-batched-tokens tokens has grown the
  // activations), unless --kv-gib fixes it; the method's max_concurrency and as many query slots follow
  // unless --num-query-slots says otherwise.
  engine_config cfg;
  cfg.block_size = o.block_size;
  cfg.gpu_memory_utilization = o.kv_gib > 0 ? 0.0 : o.gpu_memory_utilization;
  if (o.kv_gib > 0) cfg.kv_cache_bytes = static_cast<std::size_t>(o.kv_gib * 1073741824.0);
  cfg.max_num_seqs = o.max_num_seqs;
  cfg.max_batched_tokens = o.max_batched_tokens;
  cfg.budget_tokens = o.budget_tokens;
  cfg.window = o.window;
  cfg.num_query_slots = o.num_query_slots;
  cfg.async_compression = !o.sync_compression;
  weight_stats ws_model;
  timed_model m = build_model(b, c, o.seed, !o.unfused_projections, ws_model);
  auto clock = m.clock;
  engine<timed_model, Policy, zipage_scheduler, cuda_backend> eng(std::move(m), cfg, Policy{}, b);
  const std::size_t block_bytes = eng.memory().block_bytes;

  // Requests.
  std::mt19937_64 rng(o.seed);
  const bool nano = o.workload == "nano";
  const int n = o.num_requests > 0 ? o.num_requests : (nano ? 256 : 64);
  std::uniform_int_distribution<int> len(100, 1024);
  std::uniform_int_distribution<int> tok(0, std::min(c.vocab_size - 1, 10000 - 1));
  std::vector<request_id> ids;
  double prompt_tokens = 0;
  for (int i = 0; i < n; ++i) {
    const int p = nano ? len(rng) : o.prompt_len;
    const int out = nano ? len(rng) : o.output_len;
    std::vector<token_id> prompt(static_cast<std::size_t>(p));
    for (auto& t : prompt) t = tok(rng);
    sampling_params sp;
    sp.temperature = o.temperature;
    sp.max_tokens = out;
    sp.ignore_eos = true;
    sp.seed = static_cast<std::uint64_t>(i);
    ids.push_back(eng.add_request(std::move(prompt), sp));
    prompt_tokens += p;
  }
  const double box = o.seconds > 0 ? o.seconds : (nano ? 1e9 : 60.0);

  b.reset_counters();
  run_result r;
  r.workload = o.workload;
  r.mode = mode;
  r.policy = std::string(Policy{}.name());
  r.requests = n;
  const double weight_floor = ws.bytes_per_step / (bandwidth_gbs * 1e9);
  const double kv_per_layer_token = static_cast<double>(token_bytes);  // all layers
  double floor_s = 0, decode_floor_mem = 0, decode_wall = 0, decode_host = 0, decode_fwd = 0, decode_rows = 0;
  double host_total = 0, fwd_total = 0, launch_total = 0;
  std::int64_t generated = 0;
  struct mark {  // after each step: the run's time, tokens generated, the floor summed so far, step_costs' size
    double t;
    std::int64_t generated;
    double floor_s;
    std::size_t costs;
  };
  std::vector<mark> timeline;
  // The GPU's energy counter, power and SM clock every 200 ms (NVML; nothing without it): the steady half's joules
  // per generated token, and whether the power cap held the clock down.
  const zipage::cuda::energy_meter meter;
  zipage::cuda::power_sampler power(meter, 200);
  const double power_t0 = power.now();
  const auto t_start = clock_type::now();
  double next_progress = 60.0;
  auto prev = b.counters();
  while (eng.has_unfinished()) {
    const double l0 = clock->launch;
    const auto ts = clock_type::now();
    const auto events = eng.step();
    const double wall = since(ts);
    const auto k = b.counters();
    const double gpu_wait = (k.sample_seconds - prev.sample_seconds) + (k.to_host_seconds - prev.to_host_seconds);
    const double fwd = std::min(wall, clock->launch - l0 + gpu_wait);
    const double host = wall - fwd;
    host_total += host;
    fwd_total += fwd;
    launch_total += clock->launch - l0;
    generated += static_cast<std::int64_t>(events.size());
    const auto tokens = k.attention_tokens - prev.attention_tokens;
    const auto kv_read = k.kv_tokens_read - prev.kv_tokens_read;
    const bool decode = k.decode_steps > prev.decode_steps;
    const double kv_bytes = static_cast<double>(kv_read) * kv_per_layer_token;
    const double mem = weight_floor + kv_bytes / (bandwidth_gbs * 1e9);
    // The vocabulary projection runs on the sampled rows only (one per sequence that completes a token).
    const double linear_flops = 2.0 * (ws.params - ws.vocab_params) * static_cast<double>(tokens);
    const double vocab_flops = 2.0 * ws.vocab_params * static_cast<double>(events.size());
    const double step_flops = linear_flops + vocab_flops;
    const double flops = rates.floor_seconds(linear_flops, vocab_flops);
    if (tokens > 0) {
      floor_s += std::max(mem, flops);
      r.step_costs.push_back({std::max(mem, flops), ws.bytes_per_step + kv_bytes, step_flops});
    }
    if (o.op_timing) {
      // The step's ops (it has synchronised on its tokens): decode steps' into the table, prefill steps' dropped.
      for (const cuda_op_time& t : b.take_op_times()) {
        if (!decode) continue;
        auto at = std::find_if(r.decode_ops.begin(), r.decode_ops.end(), [&](const auto& x) { return x.op == t.op; });
        if (at == r.decode_ops.end()) at = r.decode_ops.insert(r.decode_ops.end(), cuda_op_time{t.op, 0, 0.0});
        at->calls += t.calls;
        at->ms += t.ms;
      }
    }
    if (decode) {
      decode_floor_mem += mem;
      decode_wall += wall;
      decode_host += host;
      decode_fwd += fwd;
      decode_rows += static_cast<double>(tokens);
      ++r.decode_steps;
    } else if (tokens > 0) {
      ++r.prefill_steps;
    }
    prev = k;
    ++r.steps;
    const double now = since(t_start);
    timeline.push_back({now, generated, floor_s, r.step_costs.size()});
    if (now >= next_progress) {
      // A line a minute, flushed: a long box whose machine is taken back still leaves a reading in its log.
      const mark& from = *std::find_if(timeline.begin(), timeline.end(), [&](const mark& p) { return p.t >= now - 60.0; });
      std::printf("    progress: %.0f s, %lld steps, %lld tokens generated, %.0f tok/s over the last %.0f s\n", now,
                  static_cast<long long>(r.steps), static_cast<long long>(generated),
                  now > from.t ? static_cast<double>(generated - from.generated) / (now - from.t) : 0.0, now - from.t);
      std::fflush(stdout);
      next_progress += 60.0;
    }
    if (now > box) break;
  }
  r.seconds = since(t_start);
  const auto st = eng.stats();
  const auto k = b.counters();
  r.output_tokens = static_cast<double>(generated);
  r.nano_batch_steps = st.nano_batch_steps;
  r.swapped_decodes = k.swapped_decodes;
  r.sm90_fp8_gemms = k.sm90_fp8_gemms;
  r.prompt_tokens = prompt_tokens;
  r.tok_s = r.output_tokens / r.seconds;
  // Steady state: the second half of the run (time), generated tokens over time.
  {
    const double half = r.seconds / 2;
    auto it = std::find_if(timeline.begin(), timeline.end(), [&](const mark& p) { return p.t >= half; });
    if (it != timeline.end() && timeline.back().t > it->t) {
      const mark& end = timeline.back();
      const double span = end.t - it->t;
      r.steady_tok_s = static_cast<double>(end.generated - it->generated) / span;
      r.steady_ceiling_fraction = (end.floor_s - it->floor_s) / span;
      r.steady_first_cost = it->costs;
      r.steady_span = span;
      power.stop();
      const auto e = power.summary(power_t0 + it->t, power_t0 + end.t);
      if (e.samples >= 2 && e.seconds > 0) {
        // Tokens at the steady state's rate over the samples' span (a little inside the half).
        r.steady_mj_per_token = 1e3 * e.joules / (r.steady_tok_s * e.seconds);
        r.steady_watts = e.watts();
        r.steady_sm_mhz = e.sm_mhz;
        r.steady_power_capped = e.power_capped;
      }
    }
  }
  r.peak_running = st.peak_running;
  r.preemptions = st.preemptions;
  r.swaps = st.swaps;
  r.compressions = st.compressions;
  r.graph_replays = k.graph_replays;
  r.graph_captures = k.graph_captures;
  r.graph_capture_s = k.graph_capture_seconds;
  r.max_concurrency = eng.memory().max_concurrency;
  r.evicted = st.tokens_evicted;
  r.host_ms_per_step = 1e3 * host_total / static_cast<double>(std::max<std::int64_t>(1, r.steps));
  r.forward_ms_per_step = 1e3 * fwd_total / static_cast<double>(std::max<std::int64_t>(1, r.steps));
  r.launch_ms_per_step = 1e3 * launch_total / static_cast<double>(std::max<std::int64_t>(1, r.steps));
  r.to_host_ms_per_step = 1e3 * k.to_host_seconds / static_cast<double>(std::max<std::int64_t>(1, r.steps));
  r.decode_host_ms = r.decode_steps ? 1e3 * decode_host / static_cast<double>(r.decode_steps) : 0;
  r.decode_forward_ms = r.decode_steps ? 1e3 * decode_fwd / static_cast<double>(r.decode_steps) : 0;
  r.mean_batch_decode = r.decode_steps ? decode_rows / static_cast<double>(r.decode_steps) : 0;
  r.floor_seconds = floor_s;
  r.ceiling_fraction = floor_s / r.seconds;
  r.forward_seconds = fwd_total;
  r.forward_ceiling_fraction = fwd_total > 0 ? floor_s / fwd_total : 0;
  r.decode_mem_ceiling_fraction = decode_wall > 0 ? decode_floor_mem / decode_wall : 0;
  r.gather_s = k.gather_seconds;
  r.compaction_s = k.compaction_seconds;
  r.device_compress_s = k.device_compression_seconds;
  r.device_compressions = k.device_compressions;
  r.device_batches = k.device_compression_batches;
  r.num_blocks = st.num_blocks;
  r.num_query_slots = st.num_query_slots;
  r.peak_blocks = st.peak_blocks_used;
  r.kv_gib = static_cast<double>(st.num_blocks) * static_cast<double>(block_bytes) / 1073741824.0;
  for (request_id id : ids) r.finished += eng.request(id).is_finished();
  return r;
}

// The power-aware ceiling of a finished run under `ec`'s constants (all 0 when they are unavailable).
run_result::power_fractions price_power_ceiling(const run_result& r, const energy_costs& ec) {
  run_result::power_fractions f;
  if (!ec.available()) return f;
  const double all = power_floor_seconds(r.step_costs, 0, ec);
  f.wall = all / r.seconds;
  f.forward = r.forward_seconds > 0 ? all / r.forward_seconds : 0;
  if (r.steady_span > 0) f.steady = power_floor_seconds(r.step_costs, r.steady_first_cost, ec) / r.steady_span;
  return f;
}

// --op-timing: where a decode step's GPU time goes, op by op, largest first.
void print_op_times(const run_result& r) {
  auto ops = r.decode_ops;
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.ms > b.ms; });
  double total = 0;
  for (const auto& t : ops) total += t.ms;
  const double steps = static_cast<double>(std::max<std::int64_t>(1, r.decode_steps));
  std::printf("    decode steps, GPU time by op (%lld steps, mean batch %.0f; timed ops %.2f ms per step, forward %.2f ms "
              "per step):\n    | op | calls per step | ms per step | us per call | share |\n    |---|---:|---:|---:|---:|\n",
              static_cast<long long>(r.decode_steps), r.mean_batch_decode, total / steps, r.decode_forward_ms);
  for (const auto& t : ops)
    std::printf("    | %s | %.1f | %.3f | %.1f | %.1f%% |\n", t.op.c_str(), static_cast<double>(t.calls) / steps,
                t.ms / steps, 1e3 * t.ms / static_cast<double>(std::max<std::int64_t>(1, t.calls)),
                total > 0 ? 100.0 * t.ms / total : 0.0);
}

void print(const run_result& r) {
  std::printf(
      "| %s | %s | %d/%d | %.1f | %.0f | %.0f | %lld (%lld dec, mean batch %.0f) | %d | %lld | %lld | %lld | %.2f | "
      "%.2f (launch %.2f) | %.2f | %.2f / %.2f | %.1f%% of wall, %.1f%% of forward (decode mem %.1f%% of wall) | gather %.1f s, device %.2f s in %lld batches, compact %.2f s |\n",
      r.workload.c_str(), (r.mode + (r.mode == "full" ? "" : " " + r.policy)).c_str(), r.finished, r.requests, r.seconds, r.tok_s, r.steady_tok_s,
      static_cast<long long>(r.steps), static_cast<long long>(r.decode_steps), r.mean_batch_decode, r.peak_running,
      static_cast<long long>(r.preemptions), static_cast<long long>(r.swaps), static_cast<long long>(r.compressions),
      r.host_ms_per_step, r.forward_ms_per_step, r.launch_ms_per_step, r.to_host_ms_per_step, r.decode_host_ms,
      r.decode_forward_ms, 100.0 * r.ceiling_fraction, 100.0 * r.forward_ceiling_fraction,
      100.0 * r.decode_mem_ceiling_fraction, r.gather_s, r.device_compress_s,
      static_cast<long long>(r.device_batches), r.compaction_s);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"zipage-bench: engine throughput on the GPU with a random-weight model"};
  // (Checked here: an unknown workload or mode would otherwise run as long / compressed.)
  app.add_option("--shape", o.shape,
                 "a preset (" + preset_names() + ") or a Hugging Face config.json / checkpoint directory: its "
                 "geometry with random weights (vLLM's --load-format dummy)")
      ->capture_default_str();
  app.add_option("--workload", o.workload, "nano | long | both")->check(CLI::IsMember({"nano", "long", "both"}));
  app.add_option("--mode", o.mode, "full | compressed | both")->check(CLI::IsMember({"full", "compressed", "both"}));
  app.add_option("--policy", o.policy,
                 "compressed mode: streaming_llm | h2o | snapkv | rkv | gkv | zipage, or all (each in turn)")
      ->capture_default_str();
  app.add_option("--num-requests", o.num_requests, "requests (nano: 256, long: 64)")->check(zipage_cli::count());
  app.add_option("--seconds", o.seconds, "time box per run (nano: none, long: 60)")->check(zipage_cli::non_negative());
  app.add_option("--output-len", o.output_len, "long: max tokens per request")->check(zipage_cli::positive_count());
  app.add_option("--prompt-len", o.prompt_len, "long: prompt tokens")->check(zipage_cli::positive_count());
  app.add_option("--seed", o.seed, "workload and weight seed");
  app.add_option("--max-num-seqs", o.max_num_seqs)->check(zipage_cli::positive_count());
  app.add_option("--max-batched-tokens", o.max_batched_tokens)->check(zipage_cli::positive_count());
  app.add_option("--block-size", o.block_size)->check(zipage_cli::positive_count());
  app.add_option("--budget", o.budget_tokens, "compressed: tokens kept per request (a multiple of --block-size)")
      ->capture_default_str();
  app.add_option("--window", o.window)->check(zipage_cli::positive_count());
  app.add_option("--gpu-memory-utilization", o.gpu_memory_utilization,
                 "fraction of device memory for weights, activations (measured by a profiling forward at "
                 "--max-batched-tokens) and the KV pool")
      ->check(CLI::Range(0.05, 1.0));
  app.add_option("--kv-gib", o.kv_gib, "KV pool size (0: from --gpu-memory-utilization)")->check(zipage_cli::non_negative());
  app.add_option("--num-query-slots", o.num_query_slots, "compressed: query slots (0: the memory plan's max concurrency)")
      ->check(zipage_cli::count());
  app.add_flag("--no-graphs", o.no_graphs, "decode steps without CUDA graphs");
  app.add_flag("--op-timing", o.op_timing,
               "per-op GPU time of the decode steps (cuda_backend_options::op_timing; implies --no-graphs and syncs "
               "every step, so its throughput is not comparable)");
  app.add_flag("--unfused-projections", o.unfused_projections,
               "q/k/v and gate/up as separate GEMMs, as before fuse_projections (for A/B runs)");
  app.add_option("--fp8-decode-kernel", o.fp8_decode_kernel,
                 "FP8 KV: decode attention kernel: automatic (swapped where it fits and the batch fills the GPU "
                 "without splits), split_kv, swapped or swapped_e4m3_qk (cuda_backend_options::fp8_decode_kernel, for "
                 "A/B runs)")
      ->check(CLI::IsMember(names_of(cuda::all_fp8_decode_kernels)));
  app.add_option("--fp8-gemm-kernel", o.fp8_gemm_kernel,
                 "FP8 weights: the GEMM: automatic, cublaslt or sm90 (our wgmma kernel with 64-token tiles; "
                 "cuda_backend_options::fp8_gemm_kernel, for A/B runs)")
      ->check(CLI::IsMember(names_of(cuda::all_fp8_gemm_kernels)));
  app.add_flag("--no-fused-quantize", o.unfused_quantize,
               "FP8 weights: each linear quantises its input itself, instead of the norm or SwiGLU before it writing the "
               "FP8 copy (cuda_backend_options::fuse_fp8_quantize = false, for A/B runs)");
  app.add_flag("--fused-append", o.fused_append,
               "FP8 KV: the swapped decode kernels write the new K/V themselves instead of an append_kv launch before "
               "each (cuda_backend_options::fuse_decode_append, for A/B runs)");
  app.add_option("--prefill-kernel", o.prefill_kernel,
                 "prefill attention: automatic (wgmma where it runs, else mma_sync) or a kernel by name "
                 "(cuda_backend_options::prefill_kernel; the wgmma ones need bf16 K/V and an sm_90a build on an "
                 "H100/H200)")
      ->check(CLI::IsMember(names_of(cuda::all_prefill_kernels)));
  app.add_option("--temperature", o.temperature, "0 = greedy (cheapest host sampling)")
      ->check(zipage_cli::float_value(zipage_cli::non_negative()));
  app.add_option("--json", o.json, "append results as JSON lines to this file");
  zipage_cli::add_kv_cache_dtype_flag(app, o.kv_cache_dtype, "", "bf16");
  zipage_cli::add_quantization_flag(app, o.quantization, "", "bf16: the random model is no FP8 checkpoint");
  app.add_flag("--linear-bench", o.linear_bench,
               "only measure FP8 vs bf16 linear() TFLOP/s at the shape's linear layers, M = 64, 256, 512, 1024");
  app.add_flag("--sync-compression", o.sync_compression, "compress on the engine thread");
  app.add_option("--overlap-min-batch", o.overlap_min_batch,
                 "decode steps of at least this many sequences run as two overlapped nano-batches (0: off)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--overlap-gemm-sms", o.overlap_gemm_sms,
                 "GEMMs that run beside a nano-batch's attention target this many SMs (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--tensor-parallel-size,--tp", o.tensor_parallel_size,
                 "GPUs to shard the model over (as zipage-generate's); only 1 until multi-GPU tensor parallelism "
                 "is wired into the CUDA backend (docs/tensor-parallel.md)")
      ->check(CLI::IsMember({1, 2, 4, 8}));
  CLI11_PARSE(app, argc, argv);
  if (o.tensor_parallel_size != 1) {
    std::fprintf(stderr,
                 "zipage-bench: --tensor-parallel-size %d: tensor parallelism runs on the CPU only for now (zipage-generate "
                 "--device cpu --tensor-parallel-size N); the GPU collectives are not wired into the CUDA backend yet "
                 "(docs/tensor-parallel.md)\n",
                 o.tensor_parallel_size);
    return 2;
  }

  try {
    // The shape first: a bad preset or config.json is named on a machine without a GPU too.
    const model_config c = shape_config(o.shape);
    check_workload_fits(o, c);
    if (cuda::device_count() == 0) {
      std::printf("zipage-bench: no CUDA device (%s)\n", cuda::describe_device().c_str());
      return 77;
    }
    // The engine allocates the step's logits (rows x vocab floats, up to ~155 MB) afresh every step;
    // keep freed heap memory instead of returning it to the OS, so the next step's vector does not
    // page-fault its way in again.
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);

    if (o.mode != "full") (void)budget_blocks_for(o.budget_tokens, o.block_size, "--budget");
    {
      bool known = o.policy == "all";
      for (const auto name : builtin_policy_names()) known = known || (name != "full_kv" && name == o.policy);
      if (!known) throw error("--policy: unknown policy '" + o.policy + "' (streaming_llm, h2o, snapkv, rkv, gkv, zipage or all)");
    }
    cuda_backend_options bo;
    if (o.op_timing) o.no_graphs = true;  // a graph's ops are not timed one by one
    bo.cuda_graphs = !o.no_graphs;
    bo.op_timing = o.op_timing;
    bo.fuse_fp8_quantize = !o.unfused_quantize;
    bo.fuse_decode_append = o.fused_append;
    bo.fp8_decode_kernel = named(cuda::all_fp8_decode_kernels, o.fp8_decode_kernel);
    bo.prefill_kernel = named(cuda::all_prefill_kernels, o.prefill_kernel);
    bo.fp8_gemm_kernel = named(cuda::all_fp8_gemm_kernels, o.fp8_gemm_kernel);
    bo.kv_dtype = parse_kv_cache_dtype(o.kv_cache_dtype);
    bo.weight_dtype = o.linear_bench ? weight_dtype::fp8_e4m3 : parse_weight_quantization(o.quantization);
    bo.max_graph_batch = std::max(bo.max_graph_batch, o.max_num_seqs);
    bo.overlap_min_batch = o.overlap_min_batch;
    bo.overlap_gemm_sms = o.overlap_gemm_sms;
    const cuda_backend b(bo);
    const double bw = b.measure_copy_bandwidth();
    const double tflops = b.measure_gemm_tflops();
    std::printf("device: %s; copy bandwidth %.0f GB/s (2 GiB D2D, read+write), bf16 GEMM %.0f TFLOP/s (8192^3); KV cache %s; "
                "linear weights %s\n",
                cuda::describe_device(0).c_str(), bw, tflops, to_string(bo.kv_dtype),
                fp8_weights(bo.weight_dtype, false) ? "fp8_e4m3 + 128x128 block scales" : "bf16");
    if (o.linear_bench) {
      linear_bench(b, c);
      return 0;
    }
    weight_stats ws;
    {
      // Weight statistics from one build (freed again before the runs build their own).
      timed_model probe = build_model(b, c, o.seed, !o.unfused_projections, ws);
    }
    gemm_rates rates{0, tflops};
    energy_costs ec;
    {  // the weight is freed before the runs size their KV pools
      const cuda_tensor gate_up = widest_linear_weight(b, c);
      rates.linear_tflops = measure_linear_tflops(b, gate_up, c.hidden_size);
      ec = measure_energy_costs(b, c, gate_up);
    }
    // As soon as a run returns (its engine, and so its KV pool, freed), the constants again, and the run's
    // power-aware ceiling priced with both readings.
    const auto price_after_run = [&](run_result r) {
      const cuda_tensor gate_up = widest_linear_weight(b, c);
      r.costs_after = measure_energy_costs(b, c, gate_up);
      r.power_before = price_power_ceiling(r, ec);
      r.power_after = price_power_ceiling(r, r.costs_after);
      return r;
    };
    std::printf("compute floor: the layers' GEMMs at %.0f TFLOP/s (%d x %d at 8,192 rows, %s weights), the vocabulary "
                "projection at the bf16 rate on the sampled rows\n",
                rates.linear_tflops, 2 * c.ffn_size, c.hidden_size,
                fp8_weights(bo.weight_dtype, false) ? "FP8" : "bf16");
    print_energy_costs("before the runs", ec, c);
    std::printf("weights: %s; q/k/v and gate/up %s; FP8 activation quantisation %s; prefill attention %s; decode "
                "attention %s%s\n",
                b.describe_weights().c_str(),
                o.unfused_projections ? "as separate GEMMs (--unfused-projections)" : "fused (one GEMM each)",
                o.unfused_quantize ? "in each linear (--no-fused-quantize)" : "written by the op before each linear",
                cuda::to_string(cuda::prefill_kernel_on_device(bo.prefill_kernel, c.head_dim,
                                                               bo.kv_dtype == kv_cache_dtype::fp8_e4m3)),
                bo.kv_dtype == kv_cache_dtype::fp8_e4m3 ? o.fp8_decode_kernel.c_str() : "split_kv",
                bo.kv_dtype != kv_cache_dtype::fp8_e4m3 ? ""
                : o.fused_append                        ? ", the swapped kernels append the new K/V (--fused-append)"
                                                        : ", append_kv launched before it");
    std::printf("shape %s: %d layers, hidden %d, q/kv heads %d/%d, head_dim %d, ffn %d, vocab %d; weights read per "
                "step %.2f GB (%.2f B params incl. vocabulary projection)\n",
                o.shape.c_str(), c.num_layers, c.hidden_size, c.num_q_heads, c.num_kv_heads, c.head_dim, c.ffn_size,
                c.vocab_size, ws.bytes_per_step / 1e9, ws.params / 1e9);
    std::printf("| workload | mode | finished | s | out tok/s | steady tok/s | steps | peak running | preempt | swaps | "
                "compress | host ms/step | forward ms/step | to_host ms/step | decode host/forward ms | ceiling | "
                "compression worker |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    std::fflush(stdout);  // the constants above reach the log before a long box starts
    std::vector<std::string> workloads = o.workload == "both" ? std::vector<std::string>{"nano", "long"}
                                                              : std::vector<std::string>{o.workload};
    std::vector<std::string> modes = o.mode == "both" ? std::vector<std::string>{"full", "compressed"}
                                                      : std::vector<std::string>{o.mode};
    std::vector<run_result> results;
    for (const auto& w : workloads)
      for (const auto& m : modes) {
        options oo = o;
        oo.workload = w;
        std::vector<run_result> runs;
        if (m == "full") runs.push_back(price_after_run(run_once<full_kv>(oo, m, b, c, ws, bw, rates)));
        for_each_builtin_policy([&](auto policy) {
          using P = decltype(policy);
          if constexpr (P::evicts)
            if (m != "full" && (o.policy == "all" || o.policy == policy.name()))
              runs.push_back(price_after_run(run_once<P>(oo, m, b, c, ws, bw, rates)));
        });
        for (const run_result& r : runs) {
        const energy_costs& ec_after = r.costs_after;
        print(r);
        std::printf("    KV pool %d blocks of %d (%.1f GiB), max concurrency %d, %d query slots, peak blocks %d, "
                    "graphs: %lld replays, %lld captures (%.2f s), evicted %lld tokens, "
                    "prompt tokens %.0f, output tokens %.0f; floor %.2f s of %.2f s forward, %.2f s wall",
                    r.num_blocks, o.block_size, r.kv_gib, r.max_concurrency, r.num_query_slots, r.peak_blocks,
                    static_cast<long long>(r.graph_replays), static_cast<long long>(r.graph_captures), r.graph_capture_s,
                    static_cast<long long>(r.evicted), r.prompt_tokens, r.output_tokens, r.floor_seconds,
                    r.forward_seconds, r.seconds);
        if (r.compressions > 0)
          std::printf("; compression: %lld requests, %.2f ms per request (device %.2f ms in batches of %.1f, host "
                      "gathers %.3f ms), %.2f%% of the run's wall time",
                      static_cast<long long>(r.compressions), 1e3 * r.compaction_s / static_cast<double>(r.compressions),
                      1e3 * r.device_compress_s / static_cast<double>(std::max<std::int64_t>(1, r.device_compressions)),
                      static_cast<double>(r.device_compressions) / static_cast<double>(std::max<std::int64_t>(1, r.device_batches)),
                      1e3 * r.gather_s / static_cast<double>(r.compressions), 100.0 * r.compaction_s / r.seconds);
        std::printf("; nano-batch overlap: %lld of %lld decode steps (from batch %d, GEMM SMs %d); swapped FP8 decode "
                    "kernel in %lld layer launches (%lld decode steps x %d layers); FP8 GEMM %s, fp8::gemm_sm90 in %lld "
                    "launches\n",
                    static_cast<long long>(r.nano_batch_steps), static_cast<long long>(r.decode_steps), o.overlap_min_batch,
                    o.overlap_gemm_sms, static_cast<long long>(r.swapped_decodes),
                    static_cast<long long>(r.decode_steps), c.num_layers, o.fp8_gemm_kernel.c_str(),
                    static_cast<long long>(r.sm90_fp8_gemms));
        if (r.steady_watts > 0)
          std::printf("    energy, steady half: %.2f mJ per output token, %.0f W mean, SM clock %.0f MHz mean, %.0f%% of "
                      "samples under the software power cap\n",
                      r.steady_mj_per_token, r.steady_watts, r.steady_sm_mhz, 100.0 * r.steady_power_capped);
        print_energy_costs("after the run", ec_after, c);
        const struct {
          const char* when;
          const energy_costs* e;
          const run_result::power_fractions* f;
        } readings[] = {{"before", &ec, &r.power_before}, {"after", &ec_after, &r.power_after}};
        for (const auto& [when, e, f] : readings)
          if (e->available())
            std::printf("    power-aware ceiling, constants measured %s the run (max of bytes / bandwidth, FLOPs / rate, "
                        "dynamic joules at %.1f pJ/B and %.3f pJ/FLOP / (%.0f - %.0f W)): %.1f%% of wall, %.1f%% of "
                        "forward, steady half %.1f%%\n",
                        when, e->joules_per_byte * 1e12, e->joules_per_flop * 1e12, e->power_limit_w, e->idle_w,
                        100.0 * f->wall, 100.0 * f->forward, 100.0 * f->steady);
        if (r.steady_ceiling_fraction > 0)
          std::printf("    steady half: %.1f%% of the per-step ceiling over wall\n", 100.0 * r.steady_ceiling_fraction);
        if (!r.decode_ops.empty()) print_op_times(r);
        results.push_back(r);
        if (!o.json.empty()) {
          std::ofstream js(o.json, std::ios::app);
          char buf[2048];
          std::snprintf(buf, sizeof buf,
                        "{\"shape\":\"%s\",\"workload\":\"%s\",\"mode\":\"%s\",\"requests\":%d,\"prompt_len\":%d,\"finished\":%d,"
                        "\"seconds\":%.3f,\"output_tokens\":%.0f,\"tok_s\":%.1f,\"steady_tok_s\":%.1f,\"steps\":%lld,"
                        "\"peak_running\":%d,\"preemptions\":%lld,\"swaps\":%lld,\"compressions\":%lld,"
                        "\"host_ms_per_step\":%.3f,\"forward_ms_per_step\":%.3f,\"ceiling_fraction\":%.4f,\"forward_ceiling_fraction\":%.4f,"
                        "\"bandwidth_gbs\":%.0f,\"gemm_tflops\":%.0f,\"linear_gemm_tflops\":%.0f,\"device_compress_s\":%.2f,\"gather_s\":%.2f,"
                        "\"graphs\":%s,\"graph_replays\":%lld,\"graph_captures\":%lld,\"max_concurrency\":%d,"
                        "\"kv_gib\":%.1f,\"steady_s\":%.1f,\"policy\":\"%s\",\"compaction_s\":%.3f,"
                        "\"device_batches\":%lld,\"kv_cache_dtype\":\"%s\",\"overlap_min_batch\":%d,"
                        "\"nano_batch_steps\":%lld,\"decode_steps\":%lld,\"quantization\":\"%s\",\"fused_projections\":%s,\"fused_quantize\":%s,"
                        "\"steady_mj_per_token\":%.3f,\"steady_watts\":%.1f,\"steady_sm_mhz\":%.0f,\"steady_power_capped\":%.3f,"
                        "\"fp8_decode_kernel\":\"%s\",\"swapped_decodes\":%lld,\"fp8_gemm_kernel\":\"%s\",\"sm90_fp8_gemms\":%lld,"
                        "\"power_ceiling_fraction\":%.4f,\"power_forward_ceiling_fraction\":%.4f,"
                        "\"steady_ceiling_fraction\":%.4f,\"steady_power_ceiling_fraction\":%.4f,"
                        "\"pj_per_byte\":%.2f,\"pj_per_flop\":%.4f,\"power_limit_w\":%.0f,\"idle_w\":%.0f,"
                        "\"steady_power_ceiling_fraction_after\":%.4f,\"pj_per_byte_after\":%.2f,\"pj_per_flop_after\":%.4f,"
                        "\"idle_w_after\":%.0f}\n",
                        o.shape.c_str(), r.workload.c_str(), r.mode.c_str(), r.requests,
                        r.workload == "long" ? o.prompt_len : 0,  // the nano workload's prompts vary
                        r.finished, r.seconds,
                        r.output_tokens, r.tok_s, r.steady_tok_s, static_cast<long long>(r.steps), r.peak_running,
                        static_cast<long long>(r.preemptions), static_cast<long long>(r.swaps),
                        static_cast<long long>(r.compressions), r.host_ms_per_step, r.forward_ms_per_step,
                        r.ceiling_fraction, r.forward_ceiling_fraction, bw, tflops, rates.linear_tflops, r.device_compress_s, r.gather_s,
                        o.no_graphs ? "false" : "true", static_cast<long long>(r.graph_replays),
                        static_cast<long long>(r.graph_captures), r.max_concurrency, r.kv_gib, r.seconds / 2,
                        r.policy.c_str(), r.compaction_s, static_cast<long long>(r.device_batches), to_string(b.kv_dtype()),
                        o.overlap_min_batch, static_cast<long long>(r.nano_batch_steps),
                        static_cast<long long>(r.decode_steps), o.quantization.c_str(),
                        o.unfused_projections ? "false" : "true", o.unfused_quantize ? "false" : "true",
                        r.steady_mj_per_token, r.steady_watts, r.steady_sm_mhz, r.steady_power_capped,
                        o.fp8_decode_kernel.c_str(), static_cast<long long>(r.swapped_decodes),
                        o.fp8_gemm_kernel.c_str(), static_cast<long long>(r.sm90_fp8_gemms),
                        r.power_before.wall, r.power_before.forward, r.steady_ceiling_fraction,
                        r.power_before.steady, ec.joules_per_byte * 1e12,
                        ec.joules_per_flop * 1e12, ec.power_limit_w, ec.idle_w, r.power_after.steady,
                        ec_after.joules_per_byte * 1e12, ec_after.joules_per_flop * 1e12, ec_after.idle_w);
          js << buf;
        }
        }
      }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zipage-bench: error: %s\n", e.what());
    return 1;
  }
}
