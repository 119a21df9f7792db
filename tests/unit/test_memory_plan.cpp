// Start-up sizing of the KV memory.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "test_support.hpp"
#include "tiny_llama.hpp"
#include "zipage/engine/engine.hpp"
#include "zipage/engine/memory_plan.hpp"
#include "zipage/policy/policies.hpp"

using namespace zipage;

namespace {

model_config qwen3_8b_shape() {
  model_config c;
  c.vocab_size = 151936;
  c.hidden_size = 4096;
  c.num_layers = 36;
  c.num_q_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.ffn_size = 12288;
  return c;
}

}  // namespace

TEST_CASE("memory plan: max concurrency = bytes / (block_bytes (B+1) + query slot bytes), the rest blocks") {
  const model_config c = qwen3_8b_shape();
  memory_request r;
  r.budget_bytes = std::size_t{100} << 30;  // 100 GiB
  r.max_running = 1024;
  r.geometry = {.block_size = 256, .budget_tokens = 2048, .window = 16};  // B = 8
  r.compress = true;
  r.element_bytes = 2;  // bf16
  const memory_plan p = plan_memory(c, r);
  // K+V of one block: 2 · 36 layers · 256 tokens · 8 heads · 128 dims · 2 bytes = 36 MiB.
  CHECK(p.block_bytes == std::size_t{36} << 20);
  // One query slot: 36 layers · 16 queries · 32 heads · 128 dims · 2 bytes = 4.5 MiB.
  CHECK(p.query_slot_bytes == std::size_t{36} * 16 * 32 * 128 * 2);
  CHECK(p.blocks_per_request == 9);
  const std::size_t per_request = p.block_bytes * 9 + p.query_slot_bytes;
  CHECK(p.max_concurrency == static_cast<int>(r.budget_bytes / per_request));
  CHECK(p.max_concurrency == 311);  // 102,400 MiB / (9 · 36 MiB + 4.5 MiB) = 311.7
  CHECK(p.num_query_slots == p.max_concurrency);
  CHECK(p.num_blocks == static_cast<int>((r.budget_bytes - p.query_slot_bytes * p.num_query_slots) / p.block_bytes));
  CHECK(p.total_bytes() <= r.budget_bytes);
  CHECK(p.describe().find("max concurrency 311") != std::string::npos);

  r.max_running = 100;  // slots beyond the running cap would sit idle
  CHECK(plan_memory(c, r).num_query_slots == 100);

  r.compress = false;  // full KV: every byte is blocks, no slots, no bound
  const memory_plan full = plan_memory(c, r);
  CHECK(full.num_query_slots == 0);
  CHECK(full.blocks_per_request == 0);
  CHECK(full.num_blocks == static_cast<int>(r.budget_bytes / full.block_bytes));

  r.budget_bytes = 1000;  // too small for one block
  CHECK_THROWS_AS((void)plan_memory(c, r), zipage::error);
}

namespace {

// The CPU backend pretending to be a device with 1 GiB of which 0.2 GiB is in use.
struct metered_backend : cpu_backend {
  std::pair<std::size_t, std::size_t> memory_info() const { return {std::size_t{800} << 20, std::size_t{1} << 30}; }
};

struct metered_model {
  using backend_type = metered_backend;
  using tensor = cpu_backend::tensor;
  llama_model<cpu_backend> inner = testing::tiny_llama();
  const model_config& config() const { return inner.config(); }
  tensor forward(forward_context<metered_backend>&) { return tensor::Zero(1, config().vocab_size); }
};

}  // namespace

TEST_CASE("gpu_memory_utilization sizes the KV cache from the device's memory, as vLLM does") {
  engine_config cfg;
  cfg.gpu_memory_utilization = 0.5;  // 512 MiB target, 224 MiB in use -> 288 MiB for the KV cache
  engine<metered_model, zipage_policy> eng(metered_model{}, cfg);
  CHECK(eng.memory().budget_bytes == (std::size_t{512} << 20) - (std::size_t{224} << 20));
  CHECK(eng.memory().total_bytes() <= eng.memory().budget_bytes);

  cfg.gpu_memory_utilization = 0.2;  // below what is already in use
  CHECK_THROWS_WITH_AS((engine<metered_model, zipage_policy>(metered_model{}, cfg)),
                       doctest::Contains("leaves nothing for the KV cache"), zipage::error);
  cfg.gpu_memory_utilization = 1.5;
  CHECK_THROWS_WITH_AS((engine<metered_model, zipage_policy>(metered_model{}, cfg)),
                       doctest::Contains("must be in (0, 1]"), zipage::error);
}

TEST_CASE("memory plan: describe() states the budget in tokens") {
  const model_config c = qwen3_8b_shape();
  memory_request r;
  r.budget_bytes = std::size_t{100} << 30;
  r.max_running = 1024;
  r.geometry = {.block_size = 256, .budget_tokens = 2048, .window = 16};  // B = 8
  r.compress = true;
  r.element_bytes = 2;
  const memory_plan p = plan_memory(c, r);
  CHECK(p.budget_tokens() == 2048);
  CHECK(p.describe().find("each compressed request keeps 2048 tokens (8 blocks of 256) + 1 write block") !=
        std::string::npos);
  r.compress = false;
  CHECK(plan_memory(c, r).budget_tokens() == 0);
  CHECK(plan_memory(c, r).describe().find("full KV") != std::string::npos);
}

TEST_CASE("cache geometry: one value with the method's defaults, checked once, errors naming the field") {
  const cache_geometry g;
  CHECK(g.block_size == 16);
  CHECK(g.budget_tokens == 2048);
  CHECK(g.window == 16);
  CHECK(g.budget_blocks() == 128);
  CHECK(g.keep_tokens() == 2048);
  CHECK_NOTHROW(g.validate());
  // Every config that carries a geometry starts from this one.
  CHECK(engine_config{}.geometry() == g);
  CHECK(scheduler_config{}.geometry == g);
  CHECK(memory_request{}.geometry == g);
  CHECK(engine_config{.block_size = 8, .budget_tokens = 32, .window = 4}.geometry() ==
        cache_geometry{.block_size = 8, .budget_tokens = 32, .window = 4});

  CHECK_THROWS_WITH_AS((cache_geometry{.block_size = 0}.validate("engine_config::")),
                       "engine_config::block_size must be positive, got 0", zipage::error);
  CHECK_THROWS_WITH_AS((cache_geometry{.block_size = 48}.validate()),
                       doctest::Contains("cache_geometry::budget_tokens = 2048 tokens is not a multiple of the block size 48"),
                       zipage::error);
  CHECK_THROWS_WITH_AS((cache_geometry{.block_size = 8, .budget_tokens = 32, .window = 9}.validate("scheduler_config::geometry.")),
                       "scheduler_config::geometry.window must be in [1, block_size = 8], got 9", zipage::error);
  CHECK_THROWS_WITH_AS((cache_geometry{.block_size = 8, .budget_tokens = 32, .window = 0}.validate()),
                       "cache_geometry::window must be in [1, block_size = 8], got 0", zipage::error);
  // should_compress: at a block boundary past B full blocks (B + 1 in steady state, more after a long prompt).
  const cache_geometry small{.block_size = 4, .budget_tokens = 8, .window = 2};
  CHECK(small.should_compress(12));
  CHECK_FALSE(small.should_compress(8));
  CHECK_FALSE(small.should_compress(13));
  CHECK(small.should_compress(20));

  // The scheduler checks its geometry when it compresses, only the block size when it does not.
  block_pool pool(8);
  CHECK_THROWS_WITH_AS(
      (zipage_scheduler({.geometry = {.block_size = 4, .budget_tokens = 6, .window = 2}, .compress = true, .num_query_slots = 1},
                        pool)),
      doctest::Contains("scheduler_config::geometry.budget_tokens = 6 tokens is not a multiple of the block size 4"),
      zipage::error);
  CHECK_THROWS_WITH_AS((zipage_scheduler({.geometry = {.block_size = 0}}, pool)),
                       doctest::Contains("block_size must be positive"), zipage::error);
  CHECK_NOTHROW(zipage_scheduler({.geometry = {.block_size = 4, .budget_tokens = 6, .window = 9}}, pool));
  // So does the memory plan.
  memory_request r;
  r.budget_bytes = std::size_t{1} << 30;
  r.geometry = {.block_size = 16, .budget_tokens = 40, .window = 16};
  CHECK_NOTHROW((void)plan_memory(qwen3_8b_shape(), r));
  r.compress = true;
  CHECK_THROWS_WITH_AS((void)plan_memory(qwen3_8b_shape(), r),
                       doctest::Contains("memory_request::geometry.budget_tokens = 40 tokens is not a multiple"), zipage::error);
}

TEST_CASE("budget in tokens: the method's defaults, whole blocks, early clear errors") {
  engine_config cfg;
  CHECK(cfg.budget_tokens == 2048);
  CHECK(cfg.window == 16);
  CHECK(cfg.budget_blocks() == 128);  // block 16
  cfg.block_size = 256;
  CHECK(cfg.budget_blocks() == 8);  // the reference: 8 blocks of 256
  CHECK(cfg.compression().keep_tokens() == 2048);

  CHECK(budget_blocks_for(2048, 64) == 32);
  CHECK_THROWS_WITH_AS((void)budget_blocks_for(2000, 256, "--budget"),
                       "--budget = 2000 tokens is not a multiple of the block size 256 (a compressed request keeps "
                       "whole blocks): use 1792 or 2048",
                       zipage::error);
  CHECK_THROWS_WITH_AS((void)budget_blocks_for(100, 256), doctest::Contains("use 256 or a smaller block size"),
                       zipage::error);
  CHECK_THROWS_WITH_AS((void)budget_blocks_for(0, 16), doctest::Contains("must be a positive number of tokens"),
                       zipage::error);

  // The engine refuses a bad budget or window before it builds anything, for an evicting policy only.
  engine_config bad{.block_size = 48, .num_blocks = 64};
  CHECK_THROWS_WITH_AS((engine<llama_model<cpu_backend>, zipage_policy>(testing::tiny_llama(), bad)),
                       doctest::Contains("engine_config::budget_tokens = 2048 tokens is not a multiple of the block size 48"),
                       zipage::error);
  CHECK_NOTHROW((engine<llama_model<cpu_backend>, full_kv>(testing::tiny_llama(), bad)));
  engine_config wide{.block_size = 8, .num_blocks = 64, .budget_tokens = 32, .window = 16};
  CHECK_THROWS_WITH_AS((engine<llama_model<cpu_backend>, zipage_policy>(testing::tiny_llama(), wide)),
                       doctest::Contains("window must be in [1, block_size = 8], got 16"), zipage::error);
  engine<llama_model<cpu_backend>, zipage_policy> ok(testing::tiny_llama(), {.block_size = 8, .num_blocks = 64,
                                                                             .budget_tokens = 32, .window = 4});
  CHECK(ok.memory().blocks_per_request == 5);
  CHECK(ok.memory().budget_tokens() == 32);
}

TEST_CASE("profiling batch: max_batched_tokens prompt tokens over at most one sequence per token, on block 0") {
  const profile_batch b = make_profile_batch(1000, 7, 16);
  CHECK(b.num_tokens() == 1000);
  CHECK(b.num_seqs() == 7);
  const forward_batch v = b.view();
  CHECK(v.attention.num_tokens() == 1000);
  CHECK(v.attention.num_seqs() == 7);
  CHECK(v.attention.token_window_row.empty());
  int start = 0;
  for (int s = 0; s < 7; ++s) {
    const int len = 1000 / 7 + (s < 1000 % 7 ? 1 : 0);  // 143 x 6, then 142
    CHECK(b.logits_rows[static_cast<std::size_t>(s)] == start + len - 1);
    CHECK(b.page_indptr[static_cast<std::size_t>(s) + 1] - b.page_indptr[static_cast<std::size_t>(s)] == (len + 15) / 16);
    for (int p = 0; p < len; ++p) {
      const auto i = static_cast<std::size_t>(start + p);
      CHECK(b.token_seq[i] == s);
      CHECK(b.positions[i] == p);
      CHECK(b.token_kv_len[i] == p + 1);
      CHECK(b.slots[i] == p % 16);
    }
    start += len;
  }
  CHECK(std::all_of(b.page_indices.begin(), b.page_indices.end(), [](std::int32_t x) { return x == 0; }));
  CHECK(make_profile_batch(5, 256, 16).num_seqs() == 5);  // never more sequences than tokens
  CHECK_THROWS_AS((void)make_profile_batch(0, 1, 16), zipage::error);
}

namespace {

// A device that reports 1 GiB, of which 100 MiB are weights and 4 KiB per token of the largest forward
// it has seen are activations (what grow-only buffers keep); and a model that records its forwards and
// runs real paged attention on the CPU.
struct profile_log {
  int forwards = 0;
  int peak_tokens = 0;
  int first_tokens = 0, first_rows = 0;
  int memory_reads = 0;
  int memory_reads_before_first_forward = -1;
};
profile_log g_profile;

struct profiled_backend : cpu_backend {
  std::pair<std::size_t, std::size_t> memory_info() const {
    ++g_profile.memory_reads;
    const std::size_t total = std::size_t{1} << 30;
    const std::size_t used = (std::size_t{100} << 20) + static_cast<std::size_t>(g_profile.peak_tokens) * 4096;
    return {total - used, total};
  }
};

struct profiled_model {
  using backend_type = profiled_backend;
  using tensor = cpu_backend::tensor;
  model_config cfg = testing::tiny_llama().config();
  const model_config& config() const { return cfg; }
  tensor forward(forward_context<profiled_backend>& ctx) {
    const int n = ctx.num_tokens();
    if (g_profile.forwards++ == 0) {
      g_profile.first_tokens = n;
      g_profile.first_rows = static_cast<int>(ctx.logits_rows().size());
      g_profile.memory_reads_before_first_forward = g_profile.memory_reads;
    }
    g_profile.peak_tokens = std::max(g_profile.peak_tokens, n);
    const tensor q = tensor::Constant(n, cfg.q_size(), 0.1f), kv = tensor::Constant(n, cfg.kv_size(), 0.2f);
    tensor out;
    for (int l = 0; l < cfg.num_layers; ++l) ctx.attention(l, q, kv, kv, out);
    CHECK(out.rows() == n);
    CHECK(std::all_of(out.data(), out.data() + out.size(), [](float x) { return std::abs(x - 0.2f) < 1e-5f; }));
    return tensor::Zero(static_cast<Eigen::Index>(ctx.logits_rows().size()), cfg.vocab_size);
  }
};

}  // namespace

TEST_CASE("gpu_memory_utilization: a profiling forward of max_batched_tokens runs before free memory is read") {
  g_profile = {};
  engine_config cfg{.block_size = 16, .gpu_memory_utilization = 0.125, .max_num_seqs = 8, .max_batched_tokens = 4096,
                    .budget_tokens = 64, .window = 8};
  engine<profiled_model, zipage_policy> eng(profiled_model{}, cfg);
  CHECK(g_profile.forwards == 1);
  CHECK(g_profile.first_tokens == 4096);
  CHECK(g_profile.first_rows == 8);  // one logits row per sequence, max_num_seqs of them
  CHECK(g_profile.memory_reads_before_first_forward == 0);
  // 128 MiB target - (100 MiB weights + 4096 tokens x 4 KiB of activations) = 12 MiB for the KV cache.
  CHECK(eng.memory().budget_bytes == (std::size_t{12} << 20));

  // A cap (what max_num_seqs requests could ever fill) applies after the profile.
  g_profile = {};
  cfg.max_kv_cache_bytes = std::size_t{10} << 20;
  engine<profiled_model, zipage_policy> capped(profiled_model{}, cfg);
  CHECK(g_profile.forwards == 1);
  CHECK(capped.memory().budget_bytes == (std::size_t{10} << 20));

  // The engine still runs afterwards.
  const auto out = capped.generate({{1, 2, 3}}, sampling_params{.temperature = 0.0f, .max_tokens = 4});
  CHECK(out[0].output.size() == 4);

  // No profiling when the pool is fixed or not sized from the device.
  g_profile = {};
  engine<profiled_model, zipage_policy> fixed(profiled_model{}, {.block_size = 16, .num_blocks = 64,
                                                                 .gpu_memory_utilization = 0.5, .budget_tokens = 64,
                                                                 .window = 8});
  engine<profiled_model, zipage_policy> host(profiled_model{}, {.block_size = 16, .budget_tokens = 64, .window = 8});
  CHECK(g_profile.forwards == 0);
  CHECK(g_profile.memory_reads == 0);
}

TEST_CASE("memory plan: sizes derived from the config are checked, never wrapped (issue 13)") {
  // Each field is a valid int; the K/V bytes of one token (2 x layers x kv_heads x head_dim x 4) are 2^64,
  // which wrapped to 0 and made plan_memory divide by zero.
  zipage::model_config c;
  c.vocab_size = 16;
  c.hidden_size = 16;
  c.num_layers = 1 << 30;
  c.num_q_heads = 1 << 20;
  c.num_kv_heads = 1 << 20;
  c.head_dim = 1 << 10;
  c.ffn_size = 16;
  zipage::memory_request r;
  r.budget_bytes = std::size_t{64} << 20;
  r.geometry.block_size = 16;
  const auto e = zipage::testing::error_of([&] { (void)zipage::plan_memory(c, r); });
  CHECK(zipage::testing::contains(e, "is too large"));
  CHECK(zipage::testing::contains(e, "KV cache"));
  CHECK(zipage::testing::contains(zipage::testing::error_of([&] { c.validate(); }), "is too large"));
  // A fixed pool whose byte count overflows is refused too.
  c.num_layers = 1 << 20;
  c.num_q_heads = c.num_kv_heads = 1 << 10;
  r.num_blocks = 1 << 30;
  CHECK(zipage::testing::contains(zipage::testing::error_of([&] { (void)zipage::plan_memory(c, r); }),
                                  "memory plan: num_blocks x block bytes"));
}

TEST_CASE("kv_shape_for: the model's query heads always, compression state only with an evicting policy") {
  const model_config c = qwen3_8b_shape();
  const cache_geometry g;
  memory_plan m;
  m.num_blocks = 100;
  m.num_query_slots = 7;
  // Full KV: the heads (what a backend checks a decode kernel's head-group limit against), no query-window cache.
  const kv_cache_shape full = kv_shape_for(c, g, m, false, false);
  CHECK(full.num_blocks == 100);
  CHECK(full.num_q_heads == 32);
  CHECK(full.num_kv_heads == 8);
  CHECK(full.window == 0);
  CHECK(full.num_query_slots == 0);
  CHECK(full.query_layer_stride() == 0);
  CHECK_FALSE(full.score_cache);
  const kv_cache_shape evicting = kv_shape_for(c, g, m, true, true);
  CHECK(evicting.num_q_heads == 32);
  CHECK(evicting.window == g.window);
  CHECK(evicting.num_query_slots == 7);
  CHECK(evicting.query_layer_stride() == std::int64_t{7} * g.window * 32 * 128);
  CHECK(evicting.score_cache);
}
