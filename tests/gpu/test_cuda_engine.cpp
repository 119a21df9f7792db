// The whole engine on the GPU (zipage::cuda_backend) against the CPU reference backend.
//
//  * fp32 mode: stories260K's golden greedy tokens; token-for-token equality with the CPU engine on story
//    prompts, full KV and compressed (zipage_policy, block 16, budget 4, window 8); 64 prompts through a
//    KV pool too small for them give what each gives alone; compressed requests swapped to host memory
//    resume with identical tokens.
//  * bf16 mode (the default): agreement with the CPU engine (matching greedy prefix, reported), and the
//    tuned paged-attention kernels (head_dim 64/128, GQA, split-KV decode) inside the model's forward
//    pass against the CPU forward pass on identical batches (relative logits error, bounded).
//  * Device hooks: sampling on the device (cuda_backend::sample) gives the CPU engine's tokens in fp32
//    (greedy, sampled with top-k/top-p/min-p/repetition penalty and per-request seeds, mixed batches) and
//    host sampling's tokens in bf16; compression on the device (compress_on_device, zipage_policy, bf16)
//    gives the host path's outputs, and is timed against it (per compression).
//
// Prints SKIPPED and exits 77 where there is no CUDA device.
#define DOCTEST_CONFIG_IMPLEMENT
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "zipage/backend/cuda/attention.hpp"  // wgmma_prefill_available
#include "zipage/backend/cuda/cuda_backend.hpp"
#include "zipage/cuda/device.hpp"
#include "zipage/engine/engine.hpp"
#include "zipage/gguf/gguf.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/policy/policies.hpp"
#include "zipage/tokenizer/detokenizer.hpp"
#include "gpu_doctest_main.hpp"
#include "greedy.hpp"
#include "random_llama.hpp"
#include "stories_model.hpp"

using namespace zipage;
using zipage::testing::greedy;
using zipage::testing::random_llama;
using zipage::testing::stories;
using zipage::testing::story_prompts;

namespace {

// stories260K's known-good greedy continuation (tests/support/stories_model.hpp; test_engine checks it on the CPU).
const std::vector<token_id>& golden = zipage::testing::stories_golden;

cuda_backend fp32_backend(bool batch_invariant) {
  cuda_backend_options o;
  o.dtype = cuda_dtype::f32;
  o.batch_invariant = batch_invariant;
  return cuda_backend(o);
}

template <class Policy = full_kv>
using gpu_engine = engine<llama_model<cuda_backend>, Policy, zipage_scheduler, cuda_backend>;
template <class Policy = full_kv>
using cpu_engine = engine<llama_model<cpu_backend>, Policy>;

template <class Policy = full_kv>
gpu_engine<Policy> make_gpu(const cuda_backend& b, engine_config cfg) {
  cfg.make_detokenizer = detokenizer_factory(stories().tokenizer);
  return gpu_engine<Policy>(load_llama_gguf<cuda_backend>(stories().file, b), cfg, Policy{}, b);
}

template <class Policy = full_kv>
cpu_engine<Policy> make_cpu(engine_config cfg) {
  cfg.make_detokenizer = detokenizer_factory(stories().tokenizer);
  return cpu_engine<Policy>(load_llama_gguf<cpu_backend>(stories().file), cfg);
}

std::size_t common_prefix(const std::vector<token_id>& a, const std::vector<token_id>& b) {
  std::size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

model_config small_config(int head_dim, int q_heads, int kv_heads, bool qk_norm) {
  model_config c;
  c.vocab_size = 512;
  c.hidden_size = 256;
  c.num_layers = 2;
  c.num_q_heads = q_heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.ffn_size = 384;
  c.rope = rope_style::half;
  c.rope_theta = 1e6f;
  c.qk_norm = qk_norm;
  c.bos = 0;
  c.eos = 511;
  return c;
}

// rows x cols values offset + scale * N(0, 1) from rng.
std::vector<float> normal_values(std::mt19937& rng, int rows, int cols, float scale, float offset = 0.0f) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
  for (float& x : v) x = offset + scale * normal(rng);
  return v;
}

double rel_error(const std::vector<float>& out, const std::vector<float>& ref) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(out[i]) - ref[i];
    if (!std::isfinite(out[i])) return INFINITY;
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// The largest rel_error over the steps of two forward_steps results (same step count and shapes required).
double worst_step_error(const std::vector<std::vector<float>>& out, const std::vector<std::vector<float>>& ref) {
  REQUIRE(out.size() == ref.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    REQUIRE(out[i].size() == ref[i].size());
    worst = std::max(worst, rel_error(out[i], ref[i]));
  }
  return worst;
}

// Runs one model over fixed batches (hand-built metadata: shuffled pages, block 16) and returns the
// logits of every step: one prefill step of several sequences (ragged lengths), then decode steps of
// all of them. The same batches for every backend.
template <class Backend, class Model>
std::vector<std::vector<float>> forward_steps(Model& model, Backend backend, const std::vector<int>& prompt_lens,
                                              int decode_steps) {
  const auto& c = model.config();
  constexpr int bs = 16;
  const int max_len = *std::max_element(prompt_lens.begin(), prompt_lens.end()) + decode_steps;
  const int blocks_per_seq = (max_len + bs - 1) / bs;
  const int num_seqs = static_cast<int>(prompt_lens.size());
  const kv_cache_shape shape{c.num_layers, blocks_per_seq * num_seqs + 3, bs, c.num_kv_heads, c.head_dim};
  auto kv = backend.allocate_kv(shape);
  std::vector<std::int32_t> pool(static_cast<std::size_t>(shape.num_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::mt19937 rng(7);
  std::shuffle(pool.begin(), pool.end(), rng);
  std::vector<std::vector<std::int32_t>> pages(static_cast<std::size_t>(num_seqs));
  for (int s = 0; s < num_seqs; ++s)
    pages[static_cast<std::size_t>(s)].assign(pool.begin() + s * blocks_per_seq, pool.begin() + (s + 1) * blocks_per_seq);
  std::vector<std::vector<token_id>> tokens(static_cast<std::size_t>(num_seqs));
  std::uniform_int_distribution<int> tok(1, c.vocab_size - 1);
  for (int s = 0; s < num_seqs; ++s)
    for (int j = 0; j < max_len; ++j) tokens[static_cast<std::size_t>(s)].push_back(tok(rng));

  std::vector<std::vector<float>> logits;
  std::vector<int> done(static_cast<std::size_t>(num_seqs), 0);
  for (int step = 0; step <= decode_steps; ++step) {
    std::vector<token_id> ids;
    std::vector<std::int32_t> pos, seq, kv_len, logits_rows, indptr{0}, indices;
    std::vector<std::int64_t> slots;
    for (int s = 0; s < num_seqs; ++s) {
      const auto su = static_cast<std::size_t>(s);
      const int n = step == 0 ? prompt_lens[su] : 1;
      for (int j = 0; j < n; ++j) {
        const int p = done[su] + j;
        ids.push_back(tokens[su][static_cast<std::size_t>(p)]);
        pos.push_back(p);
        seq.push_back(s);
        kv_len.push_back(p + 1);
        slots.push_back(std::int64_t{pages[su][static_cast<std::size_t>(p / bs)]} * bs + p % bs);
      }
      done[su] += n;
      logits_rows.push_back(static_cast<std::int32_t>(ids.size()) - 1);
      indices.insert(indices.end(), pages[su].begin(), pages[su].end());
      indptr.push_back(static_cast<std::int32_t>(indices.size()));
    }
    forward_batch batch;
    batch.tokens = ids;
    batch.positions = pos;
    batch.logits_rows = logits_rows;
    batch.attention = {slots, seq, kv_len, indptr, indices, {}};
    forward_context<Backend> ctx(backend, kv, batch, c.num_q_heads);
    logits.push_back(backend.to_host(model.forward(ctx)));
  }
  return logits;
}

}  // namespace

TEST_CASE("from_host / to_host round trip, large tensors (pipelined copy) and small ones") {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-100.0f, 100.0f);
  for (const cuda_dtype t : {cuda_dtype::f32, cuda_dtype::bf16}) {
    cuda_backend_options o;
    o.dtype = t;
    const cuda_backend b(o);
    for (const auto& [rows, cols] : {std::pair{1, 7}, std::pair{3001, 4099}, std::pair{64, 151936}}) {
      std::vector<float> v(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
      for (float& x : v) x = d(rng);
      const auto back = b.to_host(b.from_host(v, rows, cols));
      REQUIRE(back.size() == v.size());
      std::size_t bad = 0;
      for (std::size_t i = 0; i < v.size(); ++i) {
        float want = v[i];
        if (t == cuda_dtype::bf16) {  // round to nearest even on 16 bits
          std::uint32_t u;
          std::memcpy(&u, &want, 4);
          u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
          std::memcpy(&want, &u, 4);
        }
        bad += back[i] != want;
      }
      CAPTURE(rows);
      CAPTURE(cols);
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("fp32: stories260K reproduces its golden greedy output (cuBLASLt and batch-invariant GEMM)") {
  const auto& tok = stories().tokenizer;
  for (const bool invariant : {false, true}) {
    CAPTURE(invariant);
    auto eng = make_gpu(fp32_backend(invariant), {});
    const auto prompt = tok.encode("Once upon a time", true);
    REQUIRE(prompt == std::vector<token_id>{1, 403, 407, 261, 378});
    const auto out = eng.generate({prompt}, greedy(static_cast<int>(golden.size()) - 4))[0];
    CHECK(out.output == std::vector<token_id>(golden.begin() + 4, golden.end()));
    const auto bos = eng.generate({{1}}, greedy(static_cast<int>(golden.size())))[0];
    CHECK(bos.output == golden);
    CHECK(bos.text.rfind("Once upon a time, there was a little girl named Lily. She loved to play outside in the park.", 0) == 0);
    CHECK(eng.pool().num_used() == 0);
  }
}

TEST_CASE("fp32: token for token the CPU engine on 16 story prompts, 120 tokens each") {
  const auto prompts = story_prompts(16);
  auto cpu = make_cpu({.block_size = 16, .num_blocks = 512});
  const auto ref = cpu.generate(prompts, greedy(120));
  for (const bool invariant : {false, true}) {
    CAPTURE(invariant);
    auto gpu = make_gpu(fp32_backend(invariant), {.block_size = 16, .num_blocks = 512});
    const auto out = gpu.generate(prompts, greedy(120));
    int equal = 0;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      CAPTURE(i);
      CHECK(out[i].output == ref[i].output);
      equal += out[i].output == ref[i].output;
    }
    MESSAGE("fp32 (", std::string(invariant ? "fixed-order GEMM" : "cuBLASLt"), "): ", equal, "/", prompts.size(),
            " outputs identical to the CPU engine");
  }
}

TEST_CASE("bf16: agreement with the CPU engine on stories260K (reported; tolerance: first token, mean prefix >= 8)") {
  const auto prompts = story_prompts(16);
  auto cpu = make_cpu({.block_size = 16, .num_blocks = 512});
  const auto ref = cpu.generate(prompts, greedy(120));
  auto gpu = make_gpu(cuda_backend{}, {.block_size = 16, .num_blocks = 512});
  const auto out = gpu.generate(prompts, greedy(120));
  std::size_t total = 0, first_equal = 0, full = 0;
  std::string prefixes;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const std::size_t n = common_prefix(out[i].output, ref[i].output);
    total += n;
    first_equal += n > 0;
    full += n == ref[i].output.size();
    prefixes += std::to_string(n) + " ";
  }
  const double mean = static_cast<double>(total) / static_cast<double>(prompts.size());
  MESSAGE("bf16 vs CPU fp32, greedy 120 tokens: matching prefixes [", prefixes, "], mean ", mean, ", ", full, "/",
          prompts.size(), " identical");
  CHECK(first_equal == prompts.size());
  CHECK(mean >= 8.0);
}

TEST_CASE("fp32: compressed run (zipage_policy, block 16, budget 4, window 8) as the CPU compressed run") {
  auto prompts = story_prompts(6);
  prompts.push_back(stories().tokenizer.encode("Once upon a time", true));
  const engine_config cfg{.block_size = 16, .num_blocks = 256, .budget_tokens = 64, .window = 8};
  auto cpu = make_cpu<zipage_policy>(cfg);
  const auto ref = cpu.generate(prompts, greedy(160));
  REQUIRE(cpu.stats().compressions > 0);
  for (const bool invariant : {true, false}) {
    CAPTURE(invariant);
    const auto b = fp32_backend(invariant);
    auto gpu = make_gpu<zipage_policy>(b, cfg);
    const auto out = gpu.generate(prompts, greedy(160));
    const auto st = gpu.stats();
    const auto k = b.counters();
    MESSAGE("compressions ", st.compressions, " (CPU ", cpu.stats().compressions, "), evicted ", st.tokens_evicted,
            ", backend compactions ", k.compactions, ", gathers ", k.gathers);
    CHECK(st.compressions == cpu.stats().compressions);
    CHECK(k.compactions == st.compressions);
    int equal = 0;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      CAPTURE(i);
      if (invariant) CHECK(out[i].output == ref[i].output);
      equal += out[i].output == ref[i].output;
      CHECK(out[i].num_compressions == ref[i].num_compressions);
    }
    MESSAGE("compressed, fp32 (", std::string(invariant ? "fixed-order GEMM" : "cuBLASLt"), "): ", equal, "/", prompts.size(),
            " outputs identical to the CPU engine");
    CHECK(gpu.pool().num_used() == 0);
  }
}

TEST_CASE("fp32: 64 prompts through a KV pool too small for them give what each gives alone") {
  const auto prompts = story_prompts(64);
  sampling_params sampled;
  sampled.temperature = 0.8f;
  sampled.top_p = 0.95f;
  sampled.max_tokens = 40;
  sampled.ignore_eos = true;
  const auto b = fp32_backend(true);
  for (const auto& params : {greedy(40), sampled}) {
    CAPTURE(params.temperature);
    std::vector<std::vector<token_id>> alone;
    {
      auto eng = make_gpu(b, {.block_size = 16, .num_blocks = 16});
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        auto p = params;
        p.seed = 1000 + i;
        alone.push_back(eng.generate({prompts[i]}, p)[0].output);
      }
    }
    auto eng = make_gpu(b, {.block_size = 16, .num_blocks = 48, .max_num_seqs = 64});
    std::vector<request_id> ids;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      auto p = params;
      p.seed = 1000 + i;
      ids.push_back(eng.add_request(prompts[i], p));
    }
    eng.run_to_completion();
    const auto st = eng.stats();
    MESSAGE("preemptions ", st.preemptions, ", peak running ", st.peak_running, ", peak blocks ", st.peak_blocks_used);
    CHECK(st.preemptions > 0);
    CHECK(st.peak_blocks_used <= 48);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      CAPTURE(i);
      CHECK(eng.take_output(ids[i]).output == alone[i]);
    }
    CHECK(eng.pool().num_used() == 0);
  }
}

TEST_CASE("fp32: compressed requests swapped to host memory resume with identical tokens; CPU agrees") {
  const model_config c = small_config(8, 4, 2, false);
  std::vector<std::vector<token_id>> prompts{{0, 4, 9}, {0}};
  for (int j = 0; j < 39; ++j) prompts[1].push_back(1 + (j * 7) % 60);
  const engine_config roomy{.block_size = 8, .num_blocks = 200, .budget_tokens = 24, .window = 4,
                            .num_query_slots = 4, .prefix_caching = false, .async_compression = false};
  cpu_engine<zipage_policy> cpu(random_llama(cpu_backend{}, c, 3), roomy);
  const auto cpu_out = cpu.generate(prompts, greedy(100));
  const auto b = fp32_backend(true);
  gpu_engine<zipage_policy> reference(random_llama(b, c, 3), roomy, {}, b);
  const auto expected = reference.generate(prompts, greedy(100));
  CHECK(expected[0].output == cpu_out[0].output);
  CHECK(expected[1].output == cpu_out[1].output);
  for (const bool async : {false, true}) {
    CAPTURE(async);
    engine_config tight = roomy;
    tight.num_blocks = 7;
    tight.async_compression = async;
    gpu_engine<zipage_policy> eng(random_llama(b, c, 3), tight, {}, b);
    const request_id older = eng.add_request(prompts[0], greedy(100));
    eng.step();
    const request_id newer = eng.add_request(prompts[1], greedy(100));
    eng.run_to_completion();
    const auto st = eng.stats();
    MESSAGE("swaps ", st.swaps, ", preemptions ", st.preemptions, ", compressions ", st.compressions);
    if (!async) {
      CHECK(st.swaps > 0);
      CHECK(st.preemptions == 0);
    }
    CHECK(eng.take_output(older).output == expected[0].output);
    CHECK(eng.take_output(newer).output == expected[1].output);
    CHECK(eng.pool().num_used() == 0);
  }
}

// The forward pass on a GPU backend with options `o` (model seed 11) against the CPU's logits `ref` of the same
// batches: the relative error of the prefill step's logits and the worst over all steps.
struct forward_error {
  double prefill, worst;
};
forward_error gpu_forward_error(const model_config& c, const cuda_backend_options& o, const std::vector<int>& lens,
                                int decode_steps, const std::vector<std::vector<float>>& ref) {
  const cuda_backend gb(o);
  auto gpu_model = random_llama(gb, c, 11);
  const auto out = forward_steps(gpu_model, gb, lens, decode_steps);
  return {rel_error(out[0], ref[0]), worst_step_error(out, ref)};
}

TEST_CASE("bf16: tuned attention kernels inside the forward pass vs the CPU forward pass (rel. logits error < 5e-2)") {
  struct shape_case {
    int head_dim, q_heads, kv_heads;
    bool qk_norm;
  };
  for (const auto& sc : {shape_case{128, 4, 2, true}, shape_case{64, 8, 1, false}, shape_case{128, 6, 6, false}}) {
    CAPTURE(sc.head_dim);
    CAPTURE(sc.q_heads);
    CAPTURE(sc.kv_heads);
    const model_config c = small_config(sc.head_dim, sc.q_heads, sc.kv_heads, sc.qk_norm);
    // Ragged prompts (one crosses many blocks, one is a single token), then 40 decode steps.
    const std::vector<int> lens{700, 77, 1, 300};
    auto cpu_model = random_llama(cpu_backend{}, c, 11);
    const auto ref = forward_steps(cpu_model, cpu_backend{}, lens, 40);
    for (const bool fast : {true, false}) {
      CAPTURE(fast);
      cuda_backend_options o;
      o.fast_kernels = fast;
      const forward_error e = gpu_forward_error(c, o, lens, 40, ref);
      MESSAGE("bf16 ", std::string(fast ? "tuned" : "generic"), " kernels, head_dim ", sc.head_dim, ", q/kv ", sc.q_heads, "/",
              sc.kv_heads, ": prefill logits rel. error ", e.prefill, ", worst over 41 steps ", e.worst);
      CHECK(e.worst < 5e-2);
    }
  }
}

TEST_CASE("bf16: each prefill kernel inside the forward pass vs the CPU forward pass (rel. logits error < 5e-2)") {
  const bool wgmma = zipage::cuda::wgmma_prefill_available();
  if (!wgmma) {
    std::printf("SKIPPED: the wgmma prefill kernel needs an sm_90a build and a compute-capability-9.0 device\n");
    MESSAGE("SKIPPED: the wgmma prefill kernel needs an sm_90a build and a compute-capability-9.0 device");
  }
  // GQA groups 2 and 4; prompts that cross many 64-token tiles, a one-token prompt, then decode steps (which run
  // the decode kernel: the prefill of the next steps' logits depends on the cache the prefill wrote).
  for (const auto& [q_heads, kv_heads] : {std::pair{4, 2}, std::pair{8, 2}}) {
    CAPTURE(q_heads);
    const model_config c = small_config(128, q_heads, kv_heads, true);
    const std::vector<int> lens{700, 77, 1, 300};
    auto cpu_model = random_llama(cpu_backend{}, c, 11);
    const auto ref = forward_steps(cpu_model, cpu_backend{}, lens, 10);
    // (mma_sync explicitly: on Hopper the other tests' automatic runs wgmma)
    for (const auto kernel : zipage::cuda::all_prefill_kernels) {
      if (kernel == zipage::cuda::prefill_kernel::automatic || (zipage::cuda::is_wgmma(kernel) && !wgmma)) continue;
      CAPTURE(std::string(zipage::cuda::to_string(kernel)));
      cuda_backend_options o;
      o.prefill_kernel = kernel;
      const forward_error e = gpu_forward_error(c, o, lens, 10, ref);
      MESSAGE(std::string(zipage::cuda::to_string(kernel)), " prefill, q/kv ", q_heads, "/", kv_heads, ": prefill logits rel. error ",
              e.prefill, ", worst over 11 steps ", e.worst);
      CHECK(e.worst < 5e-2);
    }
  }
}

TEST_CASE("bf16: compressed, swapping engine on a head_dim-128 model runs clean; agreement with the CPU reported") {
  const model_config c = small_config(128, 4, 2, true);
  std::vector<std::vector<token_id>> prompts;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> tok(1, c.vocab_size - 2);
  for (int i = 0; i < 12; ++i) {
    std::vector<token_id> p{0};
    for (int j = 0; j < 20 + 9 * i; ++j) p.push_back(tok(rng));
    prompts.push_back(std::move(p));
  }
  const engine_config cfg{.block_size = 16, .num_blocks = 60, .max_num_seqs = 12, .budget_tokens = 64, .window = 8};
  cpu_engine<zipage_policy> cpu(random_llama(cpu_backend{}, c, 9), cfg);
  const auto ref = cpu.generate(prompts, greedy(150));
  const cuda_backend b;
  gpu_engine<zipage_policy> gpu(random_llama(b, c, 9), cfg, {}, b);
  const auto out = gpu.generate(prompts, greedy(150));
  const auto st = gpu.stats();
  std::size_t total = 0;
  std::string prefixes;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    CHECK(out[i].output.size() == 150);
    CHECK(out[i].reason == finish_reason::length);
    const auto n = common_prefix(out[i].output, ref[i].output);
    total += n;
    prefixes += std::to_string(n) + " ";
  }
  MESSAGE("bf16 compressed: compressions ", st.compressions, ", swaps ", st.swaps, ", preemptions ", st.preemptions,
          "; matching prefixes vs CPU [", prefixes, "], mean ", double(total) / double(prompts.size()));
  CHECK(st.compressions > 0);
  CHECK(gpu.pool().num_used() == 0);
}

// ---- device sampling (cuda_backend::sample) and device compression (cuda_backend::compress_on_device)

namespace {

// kind 0: greedy; 1: sampled (temperature 0.8, top-p 0.9, top-k 40, min-p 0.05, repetition penalty 1.1);
// 2: mixed batch (every third row greedy, every third sampled without penalty, the rest as 1). Seeds per request.
sampling_params sampling_variant(int kind, std::size_t i, int max_tokens) {
  sampling_params p = greedy(max_tokens);
  if (kind == 1 || (kind == 2 && i % 3 != 0)) {
    p.temperature = 0.8f;
    p.top_p = 0.9f;
    p.top_k = 40;
    p.min_p = 0.05f;
    p.repetition_penalty = kind == 2 && i % 3 == 1 ? 1.0f : 1.1f;
  }
  p.seed = 1234 + 7 * static_cast<std::uint64_t>(i);
  p.ignore_eos = true;
  return p;
}

// Adds prompts[i] with params(i) for every i, runs them as one batch and hands each request's output over, in the
// order of the prompts.
template <class Engine, class Params>
std::vector<request_output> run_batch(Engine& eng, const std::vector<std::vector<token_id>>& prompts,
                                      const Params& params) {
  std::vector<request_id> ids;
  for (std::size_t i = 0; i < prompts.size(); ++i) ids.push_back(eng.add_request(prompts[i], params(i)));
  eng.run_to_completion();
  std::vector<request_output> out;
  for (const request_id id : ids) out.push_back(eng.take_output(id));
  return out;
}

std::int64_t total_tokens(const std::vector<request_output>& outputs) {
  std::int64_t n = 0;
  for (const request_output& o : outputs) n += static_cast<std::int64_t>(o.output.size());
  return n;
}

template <class Engine>
std::vector<std::vector<token_id>> run_variant(Engine& eng, const std::vector<std::vector<token_id>>& prompts, int kind,
                                               int max_tokens) {
  const auto variant = [&](std::size_t i) { return sampling_variant(kind, i, max_tokens); };
  std::vector<std::vector<token_id>> out;
  for (request_output& o : run_batch(eng, prompts, variant)) out.push_back(std::move(o.output));
  return out;
}

struct cpu_and_gpu_outputs {
  std::vector<request_output> cpu, gpu;
};

// The CPU engine and the GPU engine built on one engine_config, for the cases that run one batch on both and
// compare it row by row. The GPU runs fp32 with fixed-order GEMMs: its rows do not depend on the batch, so the
// CPU engine's tokens are expected exactly.
struct cpu_and_gpu_engines {
  explicit cpu_and_gpu_engines(const engine_config& cfg) : cpu(make_cpu(cfg)), gpu(make_gpu(backend, cfg)) {}

  // The batch on the CPU engine (the reference), then on the GPU engine. The backend's counters are reset in
  // between, so that afterwards they count the GPU run alone.
  template <class Params>
  cpu_and_gpu_outputs run_on_both(const std::vector<std::vector<token_id>>& prompts, const Params& params) {
    cpu_and_gpu_outputs r;
    r.cpu = run_batch(cpu, prompts, params);
    backend.reset_counters();
    r.gpu = run_batch(gpu, prompts, params);
    return r;
  }

  cpu_engine<> cpu;  // members in this order: the GPU engine is built on the backend
  const cuda_backend backend = fp32_backend(true);
  gpu_engine<> gpu;
};

const char* variant_name(int kind) { return kind == 0 ? "greedy" : kind == 1 ? "sampled" : "mixed"; }

// zipage_policy whose host scoring time is measured (the host path calls score() once per layer). It
// overrides score(), so it is never recipe-scored: every backend scores it on the host.
std::atomic<std::int64_t> g_policy_ns{0};
struct timed_zipage : zipage_policy {
  void score(const score_context& ctx, std::span<float> keep_score, std::span<float> cache_out) const {
    const auto t0 = std::chrono::steady_clock::now();
    zipage_policy::score(ctx, keep_score, cache_out);
    g_policy_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  }
};
static_assert(!recipe_scored<timed_zipage>);

// A user's subclass of zipage_policy with its own score(): keeps the oldest tokens (score = -position).
// It must be scored by its own score() on the GPU too, never as plain zipage.
std::atomic<std::int64_t> g_oldest_calls{0};
struct keep_oldest : zipage_policy {
  void score(const score_context& ctx, std::span<float> keep_score, std::span<float> cache_out) const {
    ++g_oldest_calls;
    for (int h = 0; h < ctx.num_kv_heads; ++h)
      for (int j = 0; j < ctx.kv_len; ++j) {
        keep_score[static_cast<std::size_t>(h) * ctx.kv_len + j] = -static_cast<float>(j);
        cache_out[static_cast<std::size_t>(h) * ctx.kv_len + j] = 0.0f;
      }
  }
};

// Prompts of lengths 20 + step * i (one of `longest` tokens, compressed long after the budget).
std::vector<std::vector<token_id>> random_prompts(const model_config& c, int n, int step, int longest, unsigned seed) {
  std::vector<std::vector<token_id>> prompts;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(1, c.vocab_size - 2);
  for (int i = 0; i < n; ++i) {
    std::vector<token_id> p{0};
    const int len = i + 1 < n ? 20 + step * i : longest;
    for (int j = 0; j < len; ++j) p.push_back(tok(rng));
    prompts.push_back(std::move(p));
  }
  return prompts;
}

struct compression_run {
  std::vector<request_output> out;
  engine_stats st;
  cuda_backend_counters k;
};

template <class Policy>
compression_run run_compression(const model_config& c, const engine_config& cfg,
                                const std::vector<std::vector<token_id>>& prompts, int max_tokens, bool device,
                                Policy policy = {}) {
  cuda_backend_options o;
  o.device_compression = device;
  const cuda_backend b(o);
  gpu_engine<Policy> eng(random_llama(b, c, 21), cfg, policy, b);
  b.reset_counters();
  compression_run r;
  r.out = eng.generate(prompts, greedy(max_tokens));
  r.st = eng.stats();
  r.k = b.counters();
  CHECK(eng.pool().num_used() == 0);
  return r;
}

}  // namespace

TEST_CASE("device sampling, fp32: the CPU engine's tokens (greedy, sampled with penalty, mixed batch; per-request seeds)") {
  const auto prompts = story_prompts(16);
  const engine_config cfg{.block_size = 16, .num_blocks = 512};
  constexpr int max_tokens = 100;
  auto cpu = make_cpu(cfg);
  for (int kind = 0; kind < 3; ++kind) {
    CAPTURE(kind);
    const auto ref = run_variant(cpu, prompts, kind, max_tokens);
    for (const bool invariant : {true, false}) {
      CAPTURE(invariant);
      const auto b = fp32_backend(invariant);
      auto gpu = make_gpu(b, cfg);
      b.reset_counters();
      const auto out = run_variant(gpu, prompts, kind, max_tokens);
      const auto k = b.counters();
      std::int64_t generated = 0;
      int equal = 0;
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        CAPTURE(i);
        generated += static_cast<std::int64_t>(out[i].size());
        equal += out[i] == ref[i];
        if (invariant) CHECK(out[i] == ref[i]);
      }
      CHECK(generated == static_cast<std::int64_t>(prompts.size()) * max_tokens);
      CHECK(k.device_sampled_rows == generated);  // every token drawn on the device
      CHECK(k.to_host_bytes == 0);                // no logits crossed to the host
      MESSAGE("device sampling fp32 ", std::string(variant_name(kind)), " (",
              std::string(invariant ? "fixed-order GEMM" : "cuBLASLt"), "): ", equal, "/", prompts.size(),
              " outputs identical to the CPU engine; ", k.sample_calls, " sample() calls, ",
              1e3 * k.sample_seconds / static_cast<double>(std::max<std::int64_t>(1, k.sample_calls)), " ms each");
    }
  }
}

TEST_CASE("device sampling, fp32: frequency / presence penalties and (top) log-probabilities as the CPU engine, on the device") {
  const auto prompts = story_prompts(8);
  const engine_config cfg{.block_size = 16, .num_blocks = 512};
  constexpr int max_tokens = 60;
  auto params = [](std::size_t i) {
    sampling_params p;
    p.temperature = i % 2 ? 0.8f : 0.0f;
    p.seed = 100 + i;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    p.frequency_penalty = static_cast<float>(i % 4) * 0.4f;         // 0, 0.4, 0.8, 1.2
    p.presence_penalty = static_cast<float>(i % 3) * 0.75f - 0.5f;  // -0.5, 0.25, 1
    p.logprobs = i % 4 != 1;
    p.top_logprobs = p.logprobs ? static_cast<int>(i % 5) * 5 : 0;  // 0 .. 20
    return p;
  };
  cpu_and_gpu_engines engines(cfg);
  const cpu_and_gpu_outputs outputs = engines.run_on_both(prompts, params);
  const std::vector<request_output>& ref = outputs.cpu;
  const std::vector<request_output>& out = outputs.gpu;
  const auto k = engines.backend.counters();
  std::int64_t generated = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(i);
    const sampling_params p = params(i);
    generated += static_cast<std::int64_t>(out[i].output.size());
    CHECK(out[i].output == ref[i].output);
    REQUIRE(out[i].logprobs.size() == (p.logprobs ? out[i].output.size() : 0));
    REQUIRE(ref[i].logprobs.size() == out[i].logprobs.size());
    for (std::size_t t = 0; t < out[i].logprobs.size(); ++t) {
      worst = std::max(worst, std::abs(double(out[i].logprobs[t]) - double(ref[i].logprobs[t])));
      CHECK(std::abs(out[i].logprobs[t] - ref[i].logprobs[t]) < 1e-3f);
    }
    REQUIRE(out[i].top_logprobs.size() == (p.top_logprobs > 0 ? out[i].output.size() : 0));
    REQUIRE(ref[i].top_logprobs.size() == out[i].top_logprobs.size());
    for (std::size_t t = 0; t < out[i].top_logprobs.size(); ++t) {
      REQUIRE(out[i].top_logprobs[t].size() == static_cast<std::size_t>(p.top_logprobs));
      REQUIRE(ref[i].top_logprobs[t].size() == out[i].top_logprobs[t].size());
      for (std::size_t j = 0; j < out[i].top_logprobs[t].size(); ++j) {
        const auto& g = out[i].top_logprobs[t][j];
        const auto& h = ref[i].top_logprobs[t][j];
        CHECK(std::abs(g.logprob - h.logprob) < 1e-3f);  // rank by rank
        if (g.id != h.id) {  // ids may swap only in a near tie of the CPU's neighbouring ranks
          const auto& row = ref[i].top_logprobs[t];
          const bool near_tie = (j > 0 && std::abs(row[j - 1].logprob - h.logprob) < 1e-3f) ||
                                (j + 1 < row.size() && std::abs(row[j + 1].logprob - h.logprob) < 1e-3f);
          CHECK(near_tie);
        }
      }
    }
  }
  CHECK(k.device_sampled_rows == generated);  // requests with log-probabilities are drawn on the device too
  MESSAGE("penalties and log-probabilities on the device: worst |logprob - CPU| ", worst);
}

// vLLM's logits processors (logit_bias, allowed_token_ids, bad_words, min_tokens) are one sparse edit per row that
// the device sampler applies (sampling/logits_processors.hpp): a step with such a row keeps its logits on the GPU
// and its CUDA graph. In a batch mixed with plain requests that must give the CPU engine's tokens (fp32, fixed-order
// GEMMs), with every row drawn on the device, before and after min_tokens is reached.
TEST_CASE("logits processors on the GPU: a mixed batch gives the CPU engine's tokens, every row drawn on the device") {
  const auto prompts = story_prompts(8);
  engine_config cfg{.block_size = 16, .num_blocks = 512};
  cfg.encode_words = words_encoder(stories().tokenizer);
  cpu_and_gpu_engines engines(cfg);
  const token_id eos = engines.cpu.config().eos;
  auto params = [&](std::size_t i) {
    sampling_params p;
    p.temperature = i % 2 ? 0.9f : 0.0f;
    p.seed = 300 + i;
    p.max_tokens = 40;
    switch (i % 4) {
      case 0: p.logit_bias = {{golden[4], -100.0f}, {7, 3.0f}}; break;
      case 1: p.allowed_token_ids = std::vector<token_id>{261, 298, 376, 432, eos}; break;
      case 2: break;  // plain: sampled on the device whenever no processor row shares its step
      default:
        p.min_tokens = 6;
        p.logit_bias = {{eos, 100.0f}};  // EOS is the greedy token from the start: min_tokens holds it back
        p.bad_words = {" there", "girl"};
        p.max_tokens = i == 3 ? 40 : 80;
    }
    return p;
  };
  const cpu_and_gpu_outputs outputs = engines.run_on_both(prompts, params);
  const auto k = engines.backend.counters();
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(i);
    const std::vector<token_id>& out = outputs.gpu[i].output;
    CHECK(out == outputs.cpu[i].output);
    if (i % 4 == 3) {
      CHECK(out.size() == 7);  // six tokens held from EOS, then EOS
      CHECK(out.back() == eos);
    }
  }
  // Every row, processors or not, drawn by the device sampler from the processors' edits: no logits copied.
  CHECK(k.device_sampled_rows == total_tokens(outputs.gpu));
  CHECK(k.to_host_bytes == 0);

  // Plain requests alone again: the same.
  engines.backend.reset_counters();
  std::vector<request_id> ids;
  for (std::size_t i = 2; i < prompts.size(); i += 4) ids.push_back(engines.gpu.add_request(prompts[i], params(i)));
  engines.gpu.run_to_completion();
  std::int64_t generated = 0;
  for (const request_id id : ids) generated += static_cast<std::int64_t>(engines.gpu.take_output(id).output.size());
  CHECK(engines.backend.counters().device_sampled_rows == generated);
  CHECK(engines.backend.counters().to_host_bytes == 0);
}

TEST_CASE("structured outputs on the GPU: guided rows give the CPU engine's tokens, drawn on the device") {
  // A guide's allowed ids are one more logit edit (sampling/guided.hpp): the device sampler applies it as it
  // applies allowed_token_ids. Mixed with a plain request; every guided output is a choice / matches its regex.
  const auto prompts = story_prompts(6);
  engine_config cfg{.block_size = 16, .num_blocks = 512};  // make_cpu / make_gpu add the detokenizer
  cfg.guide_vocab = guide_vocabulary_of(stories().tokenizer);
  const std::vector<std::string> choices = {"happy", "sad", "a big red ball", "Lily"};
  const std::string re = "(cat|dog)s? [0-9]{1,3}";
  auto params = [&](std::size_t i) {
    sampling_params p;
    p.temperature = i % 2 ? 1.0f : 0.0f;
    p.seed = 500 + i;
    p.max_tokens = 40;
    if (i % 3 == 0) p.guided.choice = choices;
    if (i % 3 == 1) p.guided.regex = re;
    return p;
  };
  cpu_and_gpu_engines engines(cfg);
  const cpu_and_gpu_outputs outputs = engines.run_on_both(prompts, params);
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(i);
    const request_output& out = outputs.gpu[i];
    CAPTURE(out.text);
    CHECK(out.output == outputs.cpu[i].output);
    if (i % 3 == 0) CHECK(std::find(choices.begin(), choices.end(), out.text) != choices.end());
    if (i % 3 == 1) CHECK(compile_guided_regex(re).matches(out.text));
    if (i % 3 != 2) CHECK(out.reason == finish_reason::eos);
  }
  CHECK(engines.backend.counters().device_sampled_rows == total_tokens(outputs.gpu));
  CHECK(engines.backend.counters().to_host_bytes == 0);
}

// The backend's streams do not wait for the legacy default stream, so nothing a step reads may be copied there. A
// plain cudaMemcpy from pageable memory returns once the values are staged, and its DMA then waits for the copy
// engine: with that engine busy (here with host-to-device copies on a stream of our own; on a shared GPU, with other
// processes' copies), a fresh engine's first steps must still give what an engine on an idle device gives. (The RoPE
// table was once copied that way, which let the first step read it before it landed: 11 of 657 runs under load on
// the H200, 2026-12-03.) This case does not reproduce that race: a build with the old copy passed it 6 times of 6 on
// the H200, as it passed an earlier form with memsets on the legacy stream 28 times of 28. The race needed other
// processes' copies. lint_stream_order is the deterministic guard; this case checks the engine's own ordering.
TEST_CASE("a fresh engine's first steps do not depend on the copy engines being idle") {
  const auto prompts = story_prompts(8);
  const engine_config cfg{.block_size = 16, .num_blocks = 512};
  // The reference engine stays alive, so the engine below gets device memory of its own (not the reference's
  // freed tables, whose contents would hide a table read too early).
  const cuda_backend rb;
  auto reference = make_gpu(rb, cfg);
  const auto ref = run_variant(reference, prompts, 0, 24);
  constexpr std::size_t bytes = std::size_t{256} << 20;
  constexpr int copies = 24;  // ~6 GiB: tens of milliseconds of host-to-device traffic
  void* host = nullptr;
  void* dev = nullptr;
  cudaStream_t side = nullptr;
  REQUIRE(cudaMallocHost(&host, bytes) == cudaSuccess);
  REQUIRE(cudaMalloc(&dev, bytes) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess);
  std::memset(host, 0x5a, bytes);
  {
    const cuda_backend b;
    auto eng = make_gpu(b, cfg);
    for (int i = 0; i < copies; ++i)
      REQUIRE(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, side) == cudaSuccess);
    const auto out = run_variant(eng, prompts, 0, 24);
    const bool still_busy = cudaStreamQuery(side) == cudaErrorNotReady;
    MESSAGE("host-to-device copies ", std::string(still_busy ? "still running" : "done"), " when the engine finished (",
            copies * (bytes >> 20), " MiB queued before its first step)");
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      CAPTURE(i);
      CHECK(out[i] == ref[i]);
    }
  }
  REQUIRE(cudaStreamSynchronize(side) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(side) == cudaSuccess);
  REQUIRE(cudaFree(dev) == cudaSuccess);
  REQUIRE(cudaFreeHost(host) == cudaSuccess);
}

TEST_CASE("device sampling, bf16: the same tokens as host sampling of the same device logits") {
  const auto prompts = story_prompts(16);
  const engine_config cfg{.block_size = 16, .num_blocks = 512};
  cuda_backend_options host_opts;
  host_opts.device_sampling = false;
  for (int kind = 0; kind < 3; ++kind) {
    CAPTURE(kind);
    const cuda_backend hb(host_opts);
    auto host = make_gpu(hb, cfg);
    const auto ref = run_variant(host, prompts, kind, 100);
    CHECK(hb.counters().device_sampled_rows == 0);
    // The same engine again: its outputs repeat exactly (the device-sampled engine below is a second engine).
    const auto again = run_variant(host, prompts, kind, 100);
    const cuda_backend db;
    auto dev = make_gpu(db, cfg);
    db.reset_counters();
    const auto out = run_variant(dev, prompts, kind, 100);
    CHECK(db.counters().device_sampled_rows == static_cast<std::int64_t>(prompts.size()) * 100);
    int equal = 0, repeat_equal = 0;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      CAPTURE(i);
      // Where an output departs, to tell one bad step (every departure at one position) from drift.
      const std::size_t device_departs_at = common_prefix(out[i], ref[i]);
      const std::size_t repeat_departs_at = common_prefix(again[i], ref[i]);
      CAPTURE(device_departs_at);
      CAPTURE(repeat_departs_at);
      CHECK(again[i] == ref[i]);
      CHECK(out[i] == ref[i]);
      equal += out[i] == ref[i];
      repeat_equal += again[i] == ref[i];
    }
    MESSAGE("device sampling bf16 ", std::string(variant_name(kind)), ": ", equal, "/", prompts.size(),
            " outputs identical to host sampling; the host-sampled run repeated: ", repeat_equal, "/", prompts.size());
  }
}

TEST_CASE("device compression, bf16: the host path's outputs (zipage_policy, head_dim 128, block 256), far faster") {
  const model_config c = small_config(128, 4, 2, true);
  // Lengths 20..1010, and one of 1300 (its first compression is long after the budget: 1280 -> 512).
  const auto prompts = random_prompts(c, 13, 90, 1300, 17);
  // Synchronous compression, so both runs schedule identically whatever the compression takes.
  const engine_config cfg{.block_size = 256, .num_blocks = 120, .max_num_seqs = 13, .budget_tokens = 512, .window = 16,
                          .async_compression = false};
  constexpr int max_tokens = 900;
  g_policy_ns = 0;
  const compression_run host = run_compression<timed_zipage>(c, cfg, prompts, max_tokens, false);
  const double policy_s = static_cast<double>(g_policy_ns.load()) * 1e-9;
  const compression_run dev = run_compression<zipage_policy>(c, cfg, prompts, max_tokens, true);
  REQUIRE(host.st.compressions > 0);
  CHECK(dev.st.compressions == host.st.compressions);
  CHECK(host.k.device_compressions == 0);
  CHECK(host.k.gathers > 0);
  CHECK(dev.k.device_compressions == dev.st.compressions);
  CHECK(dev.k.gathers == 0);
  int equal = 0;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(i);
    CHECK(dev.out[i].output.size() == static_cast<std::size_t>(max_tokens));
    CHECK(dev.out[i].num_compressions == host.out[i].num_compressions);
    CHECK(dev.out[i].output == host.out[i].output);
    equal += dev.out[i].output == host.out[i].output;
  }
  const auto n_host = static_cast<double>(host.st.compressions);
  const auto n_dev = static_cast<double>(std::max<std::int64_t>(1, dev.k.device_compressions));
  const double host_per = (policy_s + host.k.gather_seconds + host.k.compaction_seconds) / n_host;
  const double dev_per = dev.k.device_compression_seconds / n_dev;
  MESSAGE("device compression: ", equal, "/", prompts.size(), " outputs identical to the host path; ",
          dev.st.compressions, " compressions (", dev.st.tokens_evicted, " tokens evicted) in ",
          dev.k.device_compression_batches, " device batches; per compression: device ", 1e3 * dev_per,
          " ms, host path ", 1e3 * host_per, " ms (scoring ", 1e3 * policy_s / n_host, " ms, gathers ",
          1e3 * host.k.gather_seconds / n_host, " ms, compaction ", 1e3 * host.k.compaction_seconds / n_host,
          " ms): ", host_per / std::max(dev_per, 1e-9), "x");
  CHECK(dev_per * 5 < host_per);
}

TEST_CASE("device compression, bf16: every built-in policy gives the host path's outputs, batched, no host round trip") {
  const model_config c = small_config(64, 8, 2, true);
  const auto prompts = random_prompts(c, 10, 37, 700, 29);
  const engine_config cfg{.block_size = 16, .num_blocks = 600, .max_num_seqs = 10, .budget_tokens = 128, .window = 16,
                          .async_compression = false};
  constexpr int max_tokens = 400;
  for_each_builtin_policy([&](auto policy) {
    using P = decltype(policy);
    if constexpr (P::evicts) {
      const std::string name(policy.name());
      CAPTURE(name);
      const compression_run host = run_compression<P>(c, cfg, prompts, max_tokens, false);
      const compression_run dev = run_compression<P>(c, cfg, prompts, max_tokens, true);
      REQUIRE(host.st.compressions > 0);
      CHECK(host.k.device_compressions == 0);
      CHECK(dev.k.device_compressions == dev.st.compressions);
      CHECK(dev.k.gathers == 0);  // nothing crossed to the host
      CHECK(dev.k.device_compression_batches < dev.k.device_compressions);  // bursts were batched
      int equal = 0;
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        CAPTURE(i);
        CHECK(dev.out[i].output == host.out[i].output);
        equal += dev.out[i].output == host.out[i].output;
      }
      MESSAGE("device compression ", name, ": ", equal, "/", prompts.size(), " outputs identical to the host path; ",
              dev.st.compressions, " compressions in ", dev.k.device_compression_batches, " batches, ",
              1e3 * dev.k.device_compression_seconds / static_cast<double>(std::max<std::int64_t>(1, dev.k.device_compressions)),
              " ms per request");
    }
  });
}

TEST_CASE("device compression: a subclass that overrides score() is scored by its own score() on the GPU") {
  const model_config c = small_config(64, 8, 2, true);
  const auto prompts = random_prompts(c, 6, 37, 400, 31);
  const engine_config cfg{.block_size = 16, .num_blocks = 400, .max_num_seqs = 6, .budget_tokens = 128, .window = 16,
                          .async_compression = false};
  static_assert(!recipe_scored<keep_oldest>);
  g_oldest_calls = 0;
  const compression_run own = run_compression<keep_oldest>(c, cfg, prompts, 300, true);
  REQUIRE(own.st.compressions > 0);
  CHECK(own.k.device_compressions == 0);                       // never bound as zipage_policy
  CHECK(g_oldest_calls == own.st.compressions * c.num_layers);  // its score() ran for every layer
  // The same policy with device compression off takes the same (host) path: the same outputs.
  const compression_run host = run_compression<keep_oldest>(c, cfg, prompts, 300, false);
  for (std::size_t i = 0; i < prompts.size(); ++i) CHECK(own.out[i].output == host.out[i].output);
}

// ---- CUDA graphs for decode steps (cuda_backend::run_decode_graph)

namespace {

// One decode step of `lens.size()` sequences padded to `padded` rows (slot -1, kv_len 0, no pages), on
// pages [s * pages_per_seq, ...) of a block-16 cache; the token ids come from `salt`.
struct decode_batch {
  std::vector<token_id> ids;
  std::vector<std::int32_t> pos, seq, kv_len, rows, indptr{0}, indices, window;
  std::vector<std::int64_t> slots;
  forward_batch batch;

  decode_batch(const std::vector<int>& lens, int padded, int pages_per_seq, int salt, int vocab) {
    constexpr int bs = 16;
    for (int s = 0; s < padded; ++s) {
      const bool real = s < static_cast<int>(lens.size());
      const int p = real ? lens[static_cast<std::size_t>(s)] - 1 : 0;  // the new token's position
      ids.push_back(real ? 1 + (s * 131 + salt * 17) % (vocab - 2) : 0);
      pos.push_back(p);
      seq.push_back(s);
      kv_len.push_back(real ? p + 1 : 0);
      rows.push_back(s);
      if (real) {
        for (int b = 0; b < (p + bs) / bs; ++b) indices.push_back(s * pages_per_seq + b);
        slots.push_back(std::int64_t{s * pages_per_seq + p / bs} * bs + p % bs);
      } else {
        slots.push_back(-1);
      }
      indptr.push_back(static_cast<std::int32_t>(indices.size()));
    }
    batch.tokens = ids;
    batch.positions = pos;
    batch.logits_rows = rows;
    batch.attention = {slots, seq, kv_len, indptr, indices, {}};
  }
};

// Fills every sequence's cache with a prefill of lens[s] - 1 random tokens (eagerly).
template <class Model>
void prefill(Model& m, const cuda_backend& b, cuda_kv_storage& kv, const std::vector<int>& lens, int pages_per_seq) {
  constexpr int bs = 16;
  std::vector<token_id> ids;
  std::vector<std::int32_t> pos, seq, kv_len, rows, indptr{0}, indices;
  std::vector<std::int64_t> slots;
  for (std::size_t s = 0; s < lens.size(); ++s) {
    const int n = lens[s] - 1;
    for (int j = 0; j < n; ++j) {
      ids.push_back(1 + static_cast<int>((s * 977 + static_cast<std::size_t>(j) * 31) % 500));
      pos.push_back(j);
      seq.push_back(static_cast<std::int32_t>(s));
      kv_len.push_back(j + 1);
      slots.push_back(std::int64_t{static_cast<int>(s) * pages_per_seq + j / bs} * bs + j % bs);
    }
    rows.push_back(static_cast<std::int32_t>(ids.size()) - 1);
    for (int p = 0; p < (n + bs - 1) / bs; ++p) indices.push_back(static_cast<int>(s) * pages_per_seq + p);
    indptr.push_back(static_cast<std::int32_t>(indices.size()));
  }
  forward_batch batch;
  batch.tokens = ids;
  batch.positions = pos;
  batch.logits_rows = rows;
  batch.attention = {slots, seq, kv_len, indptr, indices, {}};
  cuda_backend ops = b;
  forward_context<cuda_backend> ctx(ops, kv, batch, m.config().num_q_heads);
  (void)m.forward(ctx);
  b.synchronize();
}

}  // namespace

TEST_CASE("CUDA graphs: replayed decode steps equal the eager forward bit for bit (bf16 tuned kernels, GQA, split-KV)") {
  // Context lengths whose maximum is a bucket boundary (512), so the eager plan and the graph's plan agree
  // and the comparison can be exact; 13 sequences padded to 16.
  const model_config c = small_config(128, 8, 2, true);
  const cuda_backend b;
  auto m = random_llama(b, c, 21);
  constexpr int pages_per_seq = 40;
  std::vector<int> lens{512, 300, 17, 1, 64, 129, 480, 256, 33, 2, 400, 100, 511};
  auto kv = b.allocate_kv(kv_cache_shape{c.num_layers, pages_per_seq * 16, 16, c.num_kv_heads, c.head_dim});
  prefill(m, b, kv, lens, pages_per_seq);
  REQUIRE(b.decode_graph_batch(13) == 16);

  auto step = [&](llama_model<cuda_backend>& m, int salt, std::int64_t want_captures, std::int64_t want_replays) {
    CAPTURE(salt);
    const decode_batch db(lens, 16, pages_per_seq, salt, c.vocab_size);
    cuda_backend ops = b;
    forward_context<cuda_backend> ctx(ops, kv, db.batch, c.num_q_heads);
    const std::vector<float> eager = b.to_host(m.forward(ctx));  // writes the step's K/V ...
    const std::vector<float> graphed =
        b.to_host(b.run_decode_graph(16, [&]() -> const cuda_tensor& { return m.forward(ctx); }));  // ... the same again
    REQUIRE(eager.size() == graphed.size());
    CHECK(eager.size() == std::size_t{16} * c.vocab_size);
    CHECK(std::memcmp(eager.data(), graphed.data(), eager.size() * sizeof(float)) == 0);
    const auto k = b.counters();
    CHECK(k.graph_captures == want_captures);
    CHECK(k.graph_replays == want_replays);
  };
  b.reset_counters();
  step(m, 1, 1, 0);  // captured
  step(m, 2, 1, 1);  // replayed with other tokens
  step(m, 3, 1, 2);
  // Another model object (same weights, other buffers) under the same key: its launches have other
  // pointers, so the step is captured again (the graph updated in place), never replayed stale.
  {
    auto m2 = random_llama(b, c, 21);
    step(m2, 4, 2, 2);
    step(m2, 5, 2, 3);
  }
  // A long prefill grows the first model's activation tensors; whatever addresses they get, the decode
  // graph stays exact (replayed if every pointer came back the same, captured otherwise).
  {
    std::vector<int> big(8, 400);
    auto kv2 = b.allocate_kv(kv_cache_shape{c.num_layers, pages_per_seq * 8, 16, c.num_kv_heads, c.head_dim});
    prefill(m, b, kv2, big, pages_per_seq);
  }
  {
    const auto before = b.counters();
    const decode_batch db(lens, 16, pages_per_seq, 7, c.vocab_size);
    cuda_backend ops = b;
    forward_context<cuda_backend> ctx(ops, kv, db.batch, c.num_q_heads);
    const std::vector<float> eager = b.to_host(m.forward(ctx));
    const std::vector<float> graphed =
        b.to_host(b.run_decode_graph(16, [&]() -> const cuda_tensor& { return m.forward(ctx); }));
    CHECK(std::memcmp(eager.data(), graphed.data(), eager.size() * sizeof(float)) == 0);
    const auto after = b.counters();
    CHECK(after.graph_captures + after.graph_replays == before.graph_captures + before.graph_replays + 1);
  }
  // Longer contexts fall in another bucket (a second graph); going back replays the first.
  for (int& l : lens) l = std::min(l + 100, 600);
  prefill(m, b, kv, lens, pages_per_seq);  // rewrites the caches up to the new lengths
  {
    const decode_batch db(lens, 16, pages_per_seq, 6, c.vocab_size);
    cuda_backend ops = b;
    forward_context<cuda_backend> ctx(ops, kv, db.batch, c.num_q_heads);
    (void)b.run_decode_graph(16, [&]() -> const cuda_tensor& { return m.forward(ctx); });
    b.synchronize();
    CHECK(b.counters().graph_captures >= 3);
    CHECK(b.counters().graph_updates >= 1);
  }
}

namespace {

// Greedy bf16 runs of the same prompts (100 tokens each) on a reference backend and on `b`: the mean length of
// the prefix where they agree, and b's engine stats.
struct agreement {
  double mean_prefix = 0.0;
  engine_stats stats;
};
agreement bf16_agreement(const cuda_backend& reference, const cuda_backend& b, const std::vector<std::vector<token_id>>& prompts) {
  const auto ref = make_gpu(reference, {.block_size = 16, .num_blocks = 512}).generate(prompts, greedy(100));
  auto gpu = make_gpu(b, {.block_size = 16, .num_blocks = 512});
  const auto out = gpu.generate(prompts, greedy(100));
  std::size_t total = 0;
  for (std::size_t i = 0; i < prompts.size(); ++i) total += common_prefix(out[i].output, ref[i].output);
  return {double(total) / double(prompts.size()), gpu.stats()};
}

}  // namespace

TEST_CASE("CUDA graphs: the engine with graphs gives the eager engine's tokens (fp32, fixed-order GEMM) and bf16 agrees") {
  const auto prompts = story_prompts(13);
  for (const bool graphs : {false, true}) {
    CAPTURE(graphs);
    // fp32 + fixed-order GEMM: rows do not depend on the batch, so padding cannot change a token.
    cuda_backend_options o;
    o.dtype = cuda_dtype::f32;
    o.batch_invariant = true;
    o.cuda_graphs = graphs;
    const cuda_backend b(o);
    auto gpu = make_gpu(b, {.block_size = 16, .num_blocks = 512});
    auto cpu = make_cpu({.block_size = 16, .num_blocks = 512});
    std::vector<sampling_params> ps;
    for (std::size_t i = 0; i < prompts.size(); ++i) ps.push_back(sampling_variant(static_cast<int>(i % 3), i, 60 + 9 * static_cast<int>(i)));
    std::vector<request_id> gid, cid;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      gid.push_back(gpu.add_request(prompts[i], ps[i]));
      cid.push_back(cpu.add_request(prompts[i], ps[i]));
    }
    gpu.run_to_completion();
    cpu.run_to_completion();
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      CAPTURE(i);
      CHECK(gpu.take_output(gid[i]).output == cpu.take_output(cid[i]).output);
    }
    const auto st = gpu.stats();
    const auto k = b.counters();
    MESSAGE("fp32 engine, graphs ", std::string(graphs ? "on" : "off"), ": ", st.graph_steps, " graph steps (", st.graph_padding_rows,
            " padding rows), ", k.graph_captures, " captures, ", k.graph_replays, " replays, capture time ",
            1e3 * k.graph_capture_seconds, " ms");
    if (graphs) {
      CHECK(st.graph_steps > 0);
      CHECK(k.graph_replays + k.graph_captures == st.graph_steps);
      CHECK(k.graph_replays > k.graph_captures);
      CHECK(st.graph_padding_rows > 0);
    } else {
      CHECK(st.graph_steps == 0);
    }
  }
  // bf16 with cuBLASLt: padding may change the GEMM algorithm, so tokens are compared, not required equal.
  const cuda_backend b;
  const auto bf16 = bf16_agreement(cuda_backend(cuda_backend_options{.cuda_graphs = false}), b, prompts);
  MESSAGE("bf16 engine, graphs vs eager: mean matching prefix ", bf16.mean_prefix, " of 100; ", b.counters().graph_replays,
          " replays");
  CHECK(b.counters().graph_replays > 0);
  CHECK(bf16.mean_prefix >= 8.0);
}

TEST_CASE("nano-batches: overlapped decode steps give the whole batch's tokens (fp32, fixed-order GEMM; graphs on and off) and bf16 agrees") {
  const auto prompts = story_prompts(13);
  std::vector<sampling_params> ps;
  for (std::size_t i = 0; i < prompts.size(); ++i) ps.push_back(sampling_variant(static_cast<int>(i % 3), i, 60 + 9 * static_cast<int>(i)));
  auto run = [&](const cuda_backend& b, engine_stats* st = nullptr) {
    auto gpu = make_gpu(b, {.block_size = 16, .num_blocks = 512});
    std::vector<request_id> ids;
    for (std::size_t i = 0; i < prompts.size(); ++i) ids.push_back(gpu.add_request(prompts[i], ps[i]));
    gpu.run_to_completion();
    std::vector<std::vector<token_id>> out;
    for (const request_id id : ids) out.push_back(gpu.take_output(id).output);
    if (st) *st = gpu.stats();
    return out;
  };
  for (const bool graphs : {false, true}) {
    CAPTURE(graphs);
    cuda_backend_options o;
    o.dtype = cuda_dtype::f32;
    o.batch_invariant = true;  // rows do not depend on the batch: a split cannot change a token
    o.cuda_graphs = graphs;
    o.overlap_min_batch = 0;
    const cuda_backend whole_backend(o);
    const auto whole = run(whole_backend);
    o.overlap_min_batch = 4;
    const cuda_backend b(o);
    engine_stats st;
    const auto split = run(b, &st);
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      CAPTURE(i);
      CHECK(split[i] == whole[i]);
    }
    const auto k = b.counters();
    MESSAGE("fp32, graphs ", std::string(graphs ? "on" : "off"), ": ", st.nano_batch_steps, " of ", st.decode_steps,
            " decode steps as two nano-batches; ", k.graph_captures, " captures, ", k.graph_replays, " replays");
    CHECK(st.nano_batch_steps > 0);
    CHECK(k.forward_steps == whole_backend.counters().forward_steps);  // a split step is one forward pass
    CHECK(k.kv_tokens_read == whole_backend.counters().kv_tokens_read);
    if (graphs) CHECK(k.graph_replays > k.graph_captures);
  }
  // bf16 (cuBLASLt picks kernels by M, so halves may round differently): compared, not required equal.
  const auto bf16 = bf16_agreement(cuda_backend(cuda_backend_options{.overlap_min_batch = 0}),
                                   cuda_backend(cuda_backend_options{.overlap_min_batch = 4}), prompts);
  MESSAGE("bf16 engine, nano-batches vs whole: mean matching prefix ", bf16.mean_prefix, " of 100; ",
          bf16.stats.nano_batch_steps, " split steps");
  CHECK(bf16.stats.nano_batch_steps > 0);
  CHECK(bf16.mean_prefix >= 8.0);
}

TEST_CASE("fused projections: split_columns, swiglu and stack_rows on the device as on the CPU") {
  std::mt19937 rng(23);
  auto values = [&](int rows, int cols) { return normal_values(rng, rows, cols, 1.0f); };
  const cpu_backend host;
  for (const cuda_dtype dt : {cuda_dtype::bf16, cuda_dtype::f32}) {
    const cuda_backend b(cuda_backend_options{.dtype = dt});
    // The kernel's 16-byte words (256 | 128 | 128), 4-byte words (fp32 5 | 3 | 3, 7 | 2 | 3) and 2-byte words (bf16 5 | 3 | 3, 7 | 2 | 3).
    for (const std::vector<int>& widths : {std::vector<int>{256, 128, 128}, {5, 3, 3}, {7, 2, 3}}) {
      CAPTURE(std::string(to_string(dt)));
      CAPTURE(widths[0]);
      const int rows = 37, cols = widths[0] + widths[1] + widths[2];
      const auto x_host = values(rows, cols);
      const cuda_tensor x = b.from_host(x_host, rows, cols);
      // The reference: the device's own (rounded) values, cut on the CPU.
      const cpu::matrix x_cpu = host.from_host(b.to_host(x), rows, cols);
      cuda_tensor q, k, v;
      cuda_tensor* outs[] = {&q, &k, &v};
      b.split_columns(x, widths, outs);
      cpu::matrix cq, ck, cv;
      cpu::matrix* couts[] = {&cq, &ck, &cv};
      host.split_columns(x_cpu, widths, couts);
      CHECK(b.to_host(q) == host.to_host(cq));
      CHECK(b.to_host(k) == host.to_host(ck));
      CHECK(b.to_host(v) == host.to_host(cv));
      CHECK(q.cols() == widths[0]);
    }
    // swiglu of [gate | up] on the device is the device's silu_mul(gate, up), bit for bit.
    const int rows = 19, ffn = 264;
    const auto gate_host = values(rows, ffn), up_host = values(rows, ffn);
    std::vector<float> gu_host;
    for (int r = 0; r < rows; ++r) {
      gu_host.insert(gu_host.end(), gate_host.begin() + r * ffn, gate_host.begin() + (r + 1) * ffn);
      gu_host.insert(gu_host.end(), up_host.begin() + r * ffn, up_host.begin() + (r + 1) * ffn);
    }
    const cuda_tensor gate = b.from_host(gate_host, rows, ffn), up = b.from_host(up_host, rows, ffn);
    const cuda_tensor gate_up = b.from_host(gu_host, rows, 2 * ffn);
    cuda_tensor act, expected;
    b.swiglu(gate_up, act);
    b.silu_mul(gate, up, expected);
    CHECK(b.to_host(act) == b.to_host(expected));
    CHECK_THROWS_WITH_AS(b.swiglu(gate_up, const_cast<cuda_tensor&>(gate_up)), doctest::Contains("may not alias"), error);
    // stack_rows: the parts' rows, in order.
    const cuda_tensor w1 = b.from_host(values(6, 40), 6, 40), w2 = b.from_host(values(3, 40), 3, 40);
    const cuda_tensor* parts[] = {&w1, &w2};
    const auto stacked = b.stack_rows(parts);
    REQUIRE(stacked);
    auto both = b.to_host(w1);
    const auto second = b.to_host(w2);
    both.insert(both.end(), second.begin(), second.end());
    CHECK(b.to_host(*stacked) == both);
    const int bad[] = {5, 3, 3};
    cuda_tensor a1, a2, a3;
    cuda_tensor* three[] = {&a1, &a2, &a3};
    CHECK_THROWS_WITH_AS(b.split_columns(*stacked, bad, three), doctest::Contains("add up to 11, not the row of 40"), error);
  }
}

TEST_CASE("fused projections: qkv_epilogue in one kernel gives the separate ops' bits (bf16: head_dim 128/64/48, biases, q/k norms, both RoPE styles, llama3 scaling, q/k/v heads sharing a warp; head_dim 40 falls back)") {
  std::mt19937 rng(41);
  auto values = [&](int rows, int cols, float scale, float offset = 0.0f) {
    return normal_values(rng, rows, cols, scale, offset);
  };
  struct shape {
    int d, hq, hkv;
    bool bias, norm;
    rope_style style;
    bool scaled;
  };
  const cuda_backend b;  // bf16, tuned kernels
  for (const shape& g : {shape{128, 32, 8, false, true, rope_style::half, false}, shape{64, 8, 1, true, false, rope_style::half, false},
                         shape{48, 4, 2, true, true, rope_style::half, true}, shape{128, 4, 4, false, true, rope_style::interleaved, false},
                         shape{64, 4, 2, true, true, rope_style::interleaved, true}, shape{40, 4, 2, false, true, rope_style::half, false},
                         // q, k and v heads sharing a warp (the kernel runs two heads per warp at 128, four at 64)
                         shape{128, 3, 1, true, true, rope_style::half, false}, shape{64, 5, 1, true, true, rope_style::interleaved, false}}) {
    CAPTURE(g.d);
    CAPTURE(g.hq);
    CAPTURE(g.bias);
    CAPTURE(g.norm);
    CAPTURE(static_cast<int>(g.style));
    CAPTURE(g.scaled);
    const int rows = 53, qw = g.hq * g.d, kvw = g.hkv * g.d;
    std::vector<std::int32_t> pos(static_cast<std::size_t>(rows));
    std::uniform_int_distribution<int> p(0, 40000);
    for (auto& x : pos) x = p(rng);
    const cuda_tensor qkv = b.from_host(values(rows, qw + 2 * kvw, 2.0f), rows, qw + 2 * kvw);
    const cuda_tensor bq = b.from_host(values(1, qw, 0.5f), 1, qw), bk = b.from_host(values(1, kvw, 0.5f), 1, kvw),
                      bv = b.from_host(values(1, kvw, 0.5f), 1, kvw);
    const cuda_tensor qn = b.from_host(values(1, g.d, 0.1f, 1.0f), 1, g.d), kn = b.from_host(values(1, g.d, 0.1f, 1.0f), 1, g.d);
    qkv_epilogue<cuda_tensor> e;
    e.num_q_heads = g.hq;
    e.num_kv_heads = g.hkv;
    e.head_dim = g.d;
    if (g.bias) e.q_bias = &bq, e.k_bias = &bk, e.v_bias = &bv;
    if (g.norm) e.q_norm = &qn, e.k_norm = &kn;
    e.rms_eps = 1e-6f;
    e.positions = pos;
    e.rope_theta = 1e6f;
    e.style = g.style;
    if (g.scaled) {
      e.scaling.type = rope_scaling_type::llama3;
      e.scaling.factor = 8.0f;
    }
    cuda_tensor q, k, v;
    b.qkv_epilogue(qkv, e, q, k, v);
    cuda_tensor q2, k2, v2;
    const int widths[] = {qw, kvw, kvw};
    cuda_tensor* outs[] = {&q2, &k2, &v2};
    b.split_columns(qkv, widths, outs);
    if (g.bias) {
      b.add_bias(q2, bq);
      b.add_bias(k2, bk);
      b.add_bias(v2, bv);
    }
    if (g.norm) {
      b.rms_norm(q2, qn, 1e-6f, q2);
      b.rms_norm(k2, kn, 1e-6f, k2);
    }
    b.rope(q2, pos, g.d, 1e6f, g.style, e.scaling);
    b.rope(k2, pos, g.d, 1e6f, g.style, e.scaling);
    const auto hq = b.to_host(q), hq2 = b.to_host(q2), hk = b.to_host(k), hk2 = b.to_host(k2);
    int differ = 0;
    for (std::size_t i = 0; i < hq.size(); ++i) differ += hq[i] != hq2[i];
    for (std::size_t i = 0; i < hk.size(); ++i) differ += hk[i] != hk2[i];
    CHECK(differ == 0);
    CHECK(b.to_host(v) == b.to_host(v2));
  }
}

TEST_CASE("add_rms_norm: one kernel gives add's then rms_norm's bits (bf16: warp and block kernels; out = y; fallback widths)") {
  std::mt19937 rng(43);
  auto values = [&](int rows, int cols, float scale, float offset = 0.0f) {
    return normal_values(rng, rows, cols, scale, offset);
  };
  for (const cuda_dtype dt : {cuda_dtype::bf16, cuda_dtype::f32}) {
    const cuda_backend b(cuda_backend_options{.dtype = dt});
    for (const int cols : {256, 1024, 4096, 200}) {  // warp kernel, warp kernel at its limit, block kernel, fallback
      CAPTURE(std::string(to_string(dt)));
      CAPTURE(cols);
      const int rows = 37;
      const auto xv = values(rows, cols, 3.0f), yv = values(rows, cols, 1.0f);
      const cuda_tensor w = b.from_host(values(1, cols, 0.1f, 1.0f), 1, cols);
      // Fused, with the output in y's place (as llama_model calls it).
      cuda_tensor x1 = b.from_host(xv, rows, cols), y1 = b.from_host(yv, rows, cols);
      b.add_rms_norm(x1, y1, w, 1e-6f, y1);
      // Separate.
      cuda_tensor x2 = b.from_host(xv, rows, cols), y2 = b.from_host(yv, rows, cols), out2;
      b.add(x2, y2);
      b.rms_norm(x2, w, 1e-6f, out2);
      CHECK(b.to_host(x1) == b.to_host(x2));
      CHECK(b.to_host(y1) == b.to_host(out2));
    }
    cuda_tensor x = b.from_host(values(2, 64, 1.0f), 2, 64);
    const cuda_tensor w = b.from_host(values(1, 64, 0.1f, 1.0f), 1, 64);
    CHECK_THROWS_WITH_AS(b.add_rms_norm(x, x, w, 1e-6f, x), doctest::Contains("may not be x"), error);
  }
}

TEST_CASE("fused projections: the fused model's logits equal the unfused model's (fp32 fixed-order GEMM: bit for bit; bf16: close)") {
  const std::vector<int> lens = {37, 5, 64, 17};
  for (const bool qk_norm : {true, false}) {
    CAPTURE(qk_norm);
    const model_config c = small_config(128, 4, 2, qk_norm);
    {
      const cuda_backend b = fp32_backend(true);
      auto fused = random_llama(b, c, 29, true);
      auto unfused = random_llama(b, c, 29, false);
      REQUIRE(fused.weights().layers[0].wqkv.has_value());
      REQUIRE(fused.weights().layers[0].w_gate_up.has_value());
      const auto got = forward_steps(fused, b, lens, 6);
      const auto want = forward_steps(unfused, b, lens, 6);
      for (std::size_t s = 0; s < want.size(); ++s) {
        CAPTURE(s);
        CHECK(got[s] == want[s]);
      }
    }
    {
      const cuda_backend b;
      auto fused = random_llama(b, c, 29, true);
      auto unfused = random_llama(b, c, 29, false);
      const auto got = forward_steps(fused, b, lens, 6);
      const auto want = forward_steps(unfused, b, lens, 6);
      double worst = 0.0;
      for (std::size_t s = 0; s < want.size(); ++s) worst = std::max(worst, rel_error(got[s], want[s]));
      MESSAGE("bf16, qk_norm ", qk_norm, ": fused vs unfused logits, worst step rel. error ", worst);
      CHECK(worst < 2e-2);
    }
  }
}

TEST_CASE("op timing: eager ops are timed by name and counted per call; nothing is timed when it is off") {
  const model_config c = small_config(128, 4, 2, true);  // q 512, k/v 256 each: the fused q|k|v is 1024 x 256
  cuda_backend_options o;
  o.op_timing = true;
  o.cuda_graphs = false;
  const cuda_backend b(o);
  auto model = random_llama(b, c, 31, true);
  (void)forward_steps(model, b, {12, 5}, 2);  // one prefill step, two decode steps
  const auto times = b.take_op_times();
  auto find = [&](const std::string& op) -> const cuda_op_time* {
    for (const auto& t : times)
      if (t.op == op) return &t;
    return nullptr;
  };
  struct expected {
    const char* op;
    std::int64_t calls;
  };
  // Per forward: layer 0's attn_norm and the final norm; per layer a residual add + ffn_norm, and (layer 0) the
  // residual add + layer 1's attn_norm, the last layer's residual alone; one fused q|k|v GEMM, one epilogue (cut,
  // q/k norms, RoPE) and one SwiGLU per layer; attention on each layer (prefill once, then decode twice).
  // (bf16: the cut, the q/k norms and RoPE are one qkv_epilogue kernel; each residual add but the last is fused with
  // the RMSNorm after it.)
  for (const expected& e : {expected{"rms_norm", 6}, expected{"add_rms_norm", 9}, expected{"add", 3},
                            expected{"linear bf16 1024x256", 6}, expected{"qkv_epilogue", 6},
                            expected{"swiglu", 6}, expected{"attention prefill", 2}, expected{"attention decode", 4},
                            expected{"append_kv", 6}, expected{"embedding", 3}}) {
    CAPTURE(e.op);
    const cuda_op_time* t = find(e.op);
    REQUIRE(t != nullptr);
    CHECK(t->calls == e.calls);
    CHECK(t->ms > 0.0);
  }
  CHECK(find("silu_mul") == nullptr);  // the fused model runs swiglu instead
  CHECK(find("rope") == nullptr);      // ... and RoPE inside the epilogue
  CHECK(find("split_columns") == nullptr);
  CHECK(b.take_op_times().empty());    // taken once

  const cuda_backend quiet(cuda_backend_options{.cuda_graphs = false});
  auto model2 = random_llama(quiet, c, 31, true);
  (void)forward_steps(model2, quiet, {12, 5}, 1);
  CHECK(quiet.take_op_times().empty());
}

namespace {

// Qwen3-8B's shape (151,936-token vocabulary) with weights drawn on the device (no host copies).
model_config qwen3_8b_shape() {
  model_config c;
  c.vocab_size = 151936, c.hidden_size = 4096, c.num_layers = 36, c.num_q_heads = 32, c.num_kv_heads = 8;
  c.head_dim = 128, c.ffn_size = 12288, c.tied_embeddings = false, c.qk_norm = true;
  c.rope = rope_style::half;
  c.rope_theta = 1e6f;
  c.bos = 0;
  c.eos = c.vocab_size - 1;
  c.max_context = 40960;
  return c;
}

llama_model<cuda_backend> device_random_llama(const cuda_backend& b, const model_config& c, std::uint64_t seed) {
  std::uint64_t next = seed * 1000;
  auto uniform = [&](int rows, int cols, float std_dev) { return b.random_tensor(rows, cols, std_dev * std::sqrt(3.0f), ++next); };
  auto ones = [&](int n) { return b.constant_tensor(1, n, 1.0f); };
  const float s_in = 1.0f / std::sqrt(static_cast<float>(c.hidden_size));
  llama_weights<cuda_backend> w;
  w.embedding = uniform(c.vocab_size, c.hidden_size, 1.0f);
  for (int l = 0; l < c.num_layers; ++l) {
    llama_layer_weights<cuda_backend> lw;
    lw.attn_norm = ones(c.hidden_size);
    lw.ffn_norm = ones(c.hidden_size);
    lw.wq = uniform(c.q_size(), c.hidden_size, s_in);
    lw.wk = uniform(c.kv_size(), c.hidden_size, s_in);
    lw.wv = uniform(c.kv_size(), c.hidden_size, s_in);
    lw.wo = uniform(c.hidden_size, c.q_size(), 1.0f / std::sqrt(static_cast<float>(c.q_size())));
    lw.q_norm = ones(c.head_dim);
    lw.k_norm = ones(c.head_dim);
    lw.w_gate = uniform(c.ffn_size, c.hidden_size, s_in);
    lw.w_up = uniform(c.ffn_size, c.hidden_size, s_in);
    lw.w_down = uniform(c.hidden_size, c.ffn_size, 1.0f / std::sqrt(static_cast<float>(c.ffn_size)));
    fuse_projections(b, lw);  // as the loaders do: the activation peak includes the fused outputs
    w.layers.push_back(std::move(lw));
  }
  w.final_norm = ones(c.hidden_size);
  w.lm_head = uniform(c.vocab_size, c.hidden_size, s_in);
  return llama_model<cuda_backend>(c, std::move(w));
}

}  // namespace

// The memory plan subtracts the activation peak: the engine runs a profiling forward of max_batched_tokens
// tokens before it sizes the pool from gpu_memory_utilization, so the largest step then fits in what is left.
// Qwen3-8B's shape in bf16 (16 GB of weights), max_batched_tokens 32768, utilization 0.9, the method's
// defaults (block 256, budget 2048, W 16): one step of 8 x 4096 prompt tokens (compressed right after
// prefill), then 256 requests decoding together (the logits and sampling at max_num_seqs rows).
TEST_CASE("memory plan: max_batched_tokens 32768 at gpu_memory_utilization 0.9 runs without an allocation failure (Qwen3-8B shape)") {
  const model_config c = qwen3_8b_shape();
  const cuda_backend b;
  constexpr double gib = 1024.0 * 1024.0 * 1024.0;
  engine_config cfg{.block_size = 256, .gpu_memory_utilization = 0.9, .max_num_seqs = 256, .max_batched_tokens = 32768};
  REQUIRE(cfg.budget_tokens == 2048);
  REQUIRE(cfg.window == 16);
  auto model = device_random_llama(b, c, 3);
  b.synchronize();
  const auto [free_before, total] = b.memory_info();
  // What the pool would get without profiling: 0.9 x total - (weights and everything in use now).
  const std::size_t unprofiled = device_kv_budget(cfg.gpu_memory_utilization, {free_before, total});
  gpu_engine<zipage_policy> eng(std::move(model), cfg, {}, b);
  const memory_plan& plan = eng.memory();
  MESSAGE(plan.describe());
  MESSAGE("device ", total / gib, " GiB; in use before the engine ", (total - free_before) / gib,
          " GiB; pool without profiling ", unprofiled / gib, " GiB, with profiling ", plan.budget_bytes / gib,
          " GiB (activation peak of 32768 tokens: ", (unprofiled - std::min(unprofiled, plan.budget_bytes)) / gib, " GiB)");
  CHECK(plan.budget_tokens() == 2048);
  // The 32768-token step's activations (the MLP alone: 2 x 32768 x 12288 bf16 = 1.5 GiB) left the pool.
  CHECK(plan.budget_bytes + (std::size_t{1} << 30) < unprofiled);

  // One step of max_batched_tokens prompt tokens.
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> tok(1, 30000);
  std::vector<request_id> ids;
  for (int i = 0; i < 8; ++i) {
    std::vector<token_id> p(4096);
    for (auto& t : p) t = tok(rng);
    sampling_params sp;
    sp.temperature = 0.6f;
    sp.top_k = 20;
    sp.top_p = 0.95f;
    sp.max_tokens = 24;
    sp.ignore_eos = true;
    sp.seed = static_cast<std::uint64_t>(i);
    ids.push_back(eng.add_request(std::move(p), sp));
  }
  const auto first = eng.step();
  CHECK(first.size() == 8);  // all 8 x 4096 tokens prefilled in the first step
  for (request_id id : ids) CHECK(eng.request(id).num_computed == 4096);
  eng.run_to_completion();
  for (request_id id : ids) {
    const auto out = eng.take_output(id);
    CHECK(out.reason == finish_reason::length);
    CHECK(out.output.size() == 24);
    CHECK(out.num_compressions >= 1);
  }

  // max_num_seqs requests decoding together.
  for (int i = 0; i < 256; ++i) {
    std::vector<token_id> p(64);
    for (auto& t : p) t = tok(rng);
    sampling_params sp;
    sp.temperature = 0.0f;
    sp.max_tokens = 16;
    sp.ignore_eos = true;
    ids.push_back(eng.add_request(std::move(p), sp));
  }
  eng.run_to_completion();
  const auto st = eng.stats();
  CHECK(st.peak_running == 256);
  b.synchronize();
  const auto [free_after, total_after] = b.memory_info();
  const double used_after = static_cast<double>(total_after - free_after);
  MESSAGE("in use after the runs: ", used_after / gib, " GiB of ", total_after / gib, " GiB (",
          100.0 * used_after / static_cast<double>(total_after), "%); ", st.compressions, " compressions, ",
          st.graph_steps, " graph steps");
  // Everything the runs added beyond the planned 90% (decode graphs, compression scratch) stays small.
  CHECK(used_after <= 0.9 * static_cast<double>(total_after) + 2.0 * gib);
}

int main(int argc, char** argv) { return zipage::testing::gpu_doctest_main(argc, argv); }
