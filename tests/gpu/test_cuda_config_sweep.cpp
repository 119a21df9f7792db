// The configuration sweep (tests/support/config_sweep.hpp; test_config_sweep runs it on the CPU) on
// zipage::cuda_backend: every policy under both schedulers, random geometry (block sizes 1-16, budgets of 1-6
// blocks, windows), tight pools, running and query-slot limits, prefix caching, async compression and priority
// order, with the GPU's own choices drawn too: a small random Llama (head_dim 64 or 128, q/k norms or not, fused
// or separate projections), CUDA graphs on or off with few graphs and small graph batches (so batches outgrow
// them and the graph cache starts afresh), sampling and compression on the device or the host, nano-batches.
//  * fp32 with batch-invariant GEMMs (half the configurations): every finished request's tokens, finish reason
//    and log-probabilities equal its run alone in an unconstrained engine on the same backend;
//  * bf16 KV or FP8 KV (the others): a row's rounding depends on its batch, so each request must only finish
//    (or be cancelled), none fail, nothing leak, the engine never loop.
//
// ZIPAGE_SWEEP_CONFIGS (default 28: two per policy and scheduler), ZIPAGE_SWEEP_SEED (default 1),
// ZIPAGE_SWEEP_REQUESTS (default 40). A failure prints the configuration; it replays alone with
// ZIPAGE_SWEEP_SEED=<its seed> ZIPAGE_SWEEP_CONFIGS=1. Prints SKIPPED and exits 77 where there is no CUDA device.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <random>
#include <string>
#include "config_sweep.hpp"
#include "gpu_doctest_main.hpp"
#include "random_llama.hpp"
#include "zipage/backend/cuda/cuda_backend.hpp"
#include "zipage/engine/engine.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/policy/policies.hpp"

using namespace zipage;
using testing::sweep_case;
using testing::sweep_check;

namespace {

// The GPU's part of a configuration, drawn from the same seed after the engine's.
struct gpu_case {
  cuda_backend_options options;
  model_config model;
  bool fused = false;
  sweep_check check = sweep_check::as_alone;

  static gpu_case draw(unsigned seed) {
    std::mt19937 rng(seed * 104729u + 17);
    auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    gpu_case g;
    const bool exact = uniform(0, 1) != 0;
    g.check = exact ? sweep_check::as_alone : sweep_check::finishes;
    g.options.dtype = exact ? cuda_dtype::f32 : cuda_dtype::bf16;
    g.options.batch_invariant = exact;
    if (!exact && uniform(0, 1) != 0) g.options.kv_dtype = kv_cache_dtype::fp8_e4m3;
    g.options.cuda_graphs = uniform(0, 1) != 0;
    g.options.max_graph_batch = uniform(1, 32);
    g.options.max_graphs = uniform(1, 8);
    g.options.device_sampling = uniform(0, 3) != 0;
    g.options.device_compression = uniform(0, 3) != 0;
    g.options.overlap_min_batch = uniform(0, 2) == 0 ? uniform(2, 8) : 0;
    g.fused = uniform(0, 1) != 0;
    model_config& c = g.model;
    c.vocab_size = 64;  // the sweep's prompts use tokens 1-62; 63 is EOS
    c.hidden_size = 128;
    c.num_layers = 2;
    c.num_q_heads = 4;
    c.num_kv_heads = uniform(0, 1) != 0 ? 2 : 4;
    c.head_dim = uniform(0, 1) != 0 ? 64 : 128;
    c.ffn_size = 192;
    c.rope = rope_style::half;
    c.qk_norm = uniform(0, 1) != 0;
    c.bos = 0;
    c.eos = 63;
    return g;
  }

  [[nodiscard]] std::string describe() const {
    char text[320];
    std::snprintf(text, sizeof text,
                  "%s%s, head_dim %d, %d/%d heads, q/k norm %d, fused %d; graphs %d (max batch %d, %d kept), device "
                  "sampling %d, device compression %d, nano-batches from %d",
                  options.dtype == cuda_dtype::f32 ? "fp32 batch-invariant" : "bf16",
                  options.kv_dtype == kv_cache_dtype::fp8_e4m3 ? " + FP8 KV" : "", model.head_dim, model.num_q_heads,
                  model.num_kv_heads, model.qk_norm, fused, options.cuda_graphs, options.max_graph_batch,
                  options.max_graphs, options.device_sampling, options.device_compression, options.overlap_min_batch);
    return text;
  }
};

}  // namespace

TEST_CASE("configuration sweep on the GPU: every policy and scheduler, random geometry, kernels and device hooks") {
  testing::run_sweep(28, 40, []<class Policy, class Scheduler>(unsigned seed, long requests) {
    const sweep_case c = sweep_case::draw_for<Policy, Scheduler>(seed);
    const gpu_case g = gpu_case::draw(seed);
    const cuda_backend b(g.options);
    using engine_t = engine<llama_model<cuda_backend>, Policy, Scheduler, cuda_backend>;
    const auto make = [&](const engine_config& cfg, unsigned weights) {
      return engine_t(testing::random_llama(b, g.model, weights, g.fused), cfg, Policy{}, b);
    };
    testing::run_sweep_case(c, c.describe(Policy{}.name()) + "; " + g.describe(), requests, make, g.check);
  });
}

int main(int argc, char** argv) { return zipage::testing::gpu_doctest_main(argc, argv); }
