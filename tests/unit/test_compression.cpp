// Compressed PagedAttention invariants over randomised runs, with a probe model whose keys record the
// logical position of their token, so the cache itself shows what was kept and where.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <span>
#include <thread>
#include <vector>

#include "zipage/backend/cpu/compaction.hpp"
#include "zipage/backend/cpu/cpu_backend.hpp"
#include "zipage/compression/compression_worker.hpp"
#include "zipage/compression/compressor.hpp"
#include "zipage/engine/engine.hpp"

using namespace zipage;

namespace {

constexpr int kLayers = 2, kQHeads = 4, kKvHeads = 2, kHeadDim = 4, kVocab = 16;

// k[head] = (logical position, head, 1, 0); q and v vary with the token so attention is not uniform.
struct probe_model {
  using backend_type = cpu_backend;
  using tensor = cpu_backend::tensor;
  model_config cfg = [] {
    model_config c;
    c.vocab_size = kVocab;
    c.hidden_size = kQHeads * kHeadDim;
    c.num_layers = kLayers;
    c.num_q_heads = kQHeads;
    c.num_kv_heads = kKvHeads;
    c.head_dim = kHeadDim;
    c.ffn_size = 4;
    c.bos = 0;
    c.eos = kVocab - 1;
    return c;
  }();
  const model_config& config() const { return cfg; }

  tensor forward(forward_context<cpu_backend>& ctx) {
    const int n = ctx.num_tokens();
    tensor q(n, kQHeads * kHeadDim), k(n, kKvHeads * kHeadDim), v(n, kKvHeads * kHeadDim), out;
    for (int t = 0; t < n; ++t) {
      const float pos = static_cast<float>(ctx.positions()[static_cast<std::size_t>(t)]);
      const float tok = static_cast<float>(ctx.tokens()[static_cast<std::size_t>(t)]);
      for (int i = 0; i < q.cols(); ++i) q(t, i) = 0.01f * std::sin(tok + 1.3f * i);
      for (int h = 0; h < kKvHeads; ++h) {
        const float row[kHeadDim] = {pos, static_cast<float>(h), 1.0f, 0.0f};
        for (int d = 0; d < kHeadDim; ++d) {
          k(t, h * kHeadDim + d) = row[d];
          v(t, h * kHeadDim + d) = std::cos(tok * (d + 1) + h);
        }
      }
    }
    tensor logits = tensor::Zero(static_cast<Eigen::Index>(ctx.logits_rows().size()), kVocab);
    for (int l = 0; l < kLayers; ++l) ctx.attention(l, q, k, v, out);
    for (Eigen::Index r = 0; r < logits.rows(); ++r)
      for (int i = 0; i < kVocab; ++i) logits(r, i) = out(ctx.logits_rows()[static_cast<std::size_t>(r)], i % out.cols()) * (i + 1);
    return logits;
  }
};

// Pseudo-random scores that differ per head, so heads keep different tokens.
struct hashed_policy : policy_base {
  static constexpr bool uses_score_cache = true;
  std::string_view name() const { return "hashed"; }
  void score(const score_context& ctx, std::span<float> keep, std::span<float> cache_out) const {
    for (int h = 0; h < ctx.num_kv_heads; ++h)
      for (int j = 0; j < ctx.kv_len; ++j) {
        const float pos = ctx.key(h, j)[0];
        const float x = std::sin(pos * 12.9898f + static_cast<float>(h) * 78.233f) * 43758.547f;
        keep[static_cast<std::size_t>(h * ctx.kv_len + j)] = x - std::floor(x);
        cache_out[static_cast<std::size_t>(h * ctx.kv_len + j)] = pos;  // lets the test follow the score cache
      }
  }
};

// Logical position stored in the key of slot j of (layer, head) of a request.
float key_position(const cpu_kv_storage& kv, const sequence& s, int layer, int head, int j) {
  const auto& sh = kv.shape;
  const std::int64_t slot = std::int64_t{s.table.blocks()[static_cast<std::size_t>(j / sh.block_size)]} * sh.block_size +
                            j % sh.block_size;
  return kv.k[static_cast<std::size_t>(sh.layer_stride() * layer + (slot * sh.num_kv_heads + head) * sh.head_dim)];
}

float cached_score(const cpu_kv_storage& kv, const sequence& s, int layer, int head, int j) {
  const auto& sh = kv.shape;
  const std::int64_t slot = std::int64_t{s.table.blocks()[static_cast<std::size_t>(j / sh.block_size)]} * sh.block_size +
                            j % sh.block_size;
  return kv.scores[static_cast<std::size_t>(std::int64_t{sh.num_blocks} * sh.block_size * sh.num_kv_heads * layer +
                                            slot * sh.num_kv_heads + head)];
}

template <class Engine>
void check_invariants(const Engine& eng, const engine_config& cfg) {
  const auto& kv = eng.kv_cache();
  const int bs = cfg.block_size, budget = cfg.budget_tokens;
  for (const sequence* s : eng.requests()) {
    // Mid-compaction (the worker owns its blocks) or waiting to be compressed next step: skip.
    if (s->status != request_status::running || s->compressing || s->needs_compression) continue;
    CAPTURE(s->id);
    // The cache never exceeds B+1 blocks once compressed, and compression lands exactly on the budget.
    if (s->is_compressed()) {
      CHECK(s->kv_len >= budget);
      CHECK(s->kv_len < budget + bs);
      CHECK(s->table.num_blocks() <= cfg.budget_blocks() + 1);
    } else {
      CHECK(s->kv_len == s->num_computed);
    }
    CHECK(s->num_computed < s->num_tokens());  // mid-prefill chunks leave more than one pending
    for (int l = 0; l < kLayers; ++l)
      for (int h = 0; h < kKvHeads; ++h) {
        float prev = -1.0f;
        for (int j = 0; j < s->kv_len; ++j) {
          const float pos = key_position(kv, *s, l, h, j);
          CHECK(pos > prev);  // kept tokens stay in their original order
          CHECK(pos < static_cast<float>(s->num_computed));
          if (s->is_compressed() && j < budget) CHECK(cached_score(kv, *s, l, h, j) == pos);  // scores moved with their tokens
          prev = pos;
        }
        // The newest W tokens always survive, at the end, with their own positions.
        const int window = std::min(cfg.window, s->kv_len);
        for (int w = 0; w < window; ++w)
          CHECK(key_position(kv, *s, l, h, s->kv_len - window + w) == static_cast<float>(s->num_computed - window + w));
      }
  }
}

}  // namespace

TEST_CASE("randomised runs keep every compression invariant") {
  std::mt19937 rng(7);
  std::int64_t preemptions = 0;
  for (int trial = 0; trial < 12; ++trial) {
    engine_config cfg;
    cfg.block_size = std::uniform_int_distribution<int>(1, 3)(rng) * 4;  // 4, 8, 12
    const int budget_blocks = std::uniform_int_distribution<int>(1, 4)(rng);
    cfg.budget_tokens = budget_blocks * cfg.block_size;
    cfg.window = std::uniform_int_distribution<int>(1, cfg.block_size)(rng);
    cfg.num_blocks = std::uniform_int_distribution<int>(3, 8)(rng) * (budget_blocks + 1);
    cfg.max_num_seqs = 16;
    cfg.async_compression = trial % 2 == 1;
    cfg.prefix_caching = trial % 3 != 0;
    CAPTURE(trial);
    CAPTURE(cfg.async_compression);
    CAPTURE(cfg.prefix_caching);
    CAPTURE(cfg.block_size);
    CAPTURE(cfg.budget_tokens);
    CAPTURE(cfg.window);
    CAPTURE(cfg.num_blocks);
    engine<probe_model, hashed_policy> eng(probe_model{}, cfg);
    const int requests = std::uniform_int_distribution<int>(4, 12)(rng);
    for (int r = 0; r < requests; ++r) {
      std::vector<token_id> prompt(static_cast<std::size_t>(std::uniform_int_distribution<int>(1, 3 * cfg.block_size)(rng)));
      for (auto& t : prompt) t = std::uniform_int_distribution<int>(0, kVocab - 2)(rng);
      sampling_params p;
      p.seed = static_cast<std::uint64_t>(r);
      p.ignore_eos = true;
      p.max_tokens = std::uniform_int_distribution<int>(1, 12 * cfg.block_size)(rng);
      eng.add_request(prompt, p);
    }
    while (eng.has_unfinished()) {
      eng.step();
      check_invariants(eng, cfg);
      CHECK(eng.pool().num_used() <= cfg.num_blocks);
    }
    CHECK(eng.stats().compressions > 0);
    preemptions += eng.stats().preemptions;
    CHECK(eng.pool().num_used() == 0);           // no block leaks
    CHECK(eng.pool().total_references() == 0);   // reference counts balance
  }
  CHECK(preemptions > 0);  // the pools were tight enough to exercise preemption under compression
}

TEST_CASE("compaction plan keeps exactly k per head, in order, window included; apply moves K, V and scores") {
  kv_cache_shape shape{1, 4, 4, 2, 2};
  shape.score_cache = true;
  cpu_kv_storage kv(shape);
  const std::vector<block_id> pages = {2, 0, 3};  // 12 tokens over scattered blocks
  auto slot = [&](int j) { return std::int64_t{pages[static_cast<std::size_t>(j / 4)]} * 4 + j % 4; };
  for (int j = 0; j < 12; ++j)
    for (int h = 0; h < 2; ++h) {
      kv.k[static_cast<std::size_t>((slot(j) * 2 + h) * 2)] = static_cast<float>(100 * h + j);
      kv.v[static_cast<std::size_t>((slot(j) * 2 + h) * 2)] = static_cast<float>(-(100 * h + j));
    }
  compaction_plan plan;
  plan.new_len = 5;
  plan.old_len = 12;
  plan.num_layers = 1;
  plan.num_kv_heads = 2;
  plan.pages = pages;
  plan.keep = {0, 3, 4, 9, 11, /* head 1 */ 1, 2, 7, 8, 11};
  plan.kept_scores = {10, 13, 14, 19, 21, 31, 32, 37, 38, 41};
  cpu::apply_compaction(kv, plan);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 5; ++i) {
      const int src = plan.keep[static_cast<std::size_t>(h * 5 + i)];
      CHECK(kv.k[static_cast<std::size_t>((slot(i) * 2 + h) * 2)] == static_cast<float>(100 * h + src));
      CHECK(kv.v[static_cast<std::size_t>((slot(i) * 2 + h) * 2)] == static_cast<float>(-(100 * h + src)));
      CHECK(kv.scores[static_cast<std::size_t>(slot(i) * 2 + h)] == plan.kept_scores[static_cast<std::size_t>(h * 5 + i)]);
    }
}

TEST_CASE("top-k selection: highest scores, ties to the older token, NaN last, ascending output") {
  std::vector<std::int32_t> order, out(3);
  const std::vector<float> scores = {0.5f, NAN, 0.9f, 0.5f, 0.1f, 0.5f};
  select_top_k(scores, 3, order, out);
  CHECK(out == std::vector<std::int32_t>{0, 2, 3});
  const std::vector<float> nans = {NAN, NAN, -INFINITY};
  select_top_k(nans, 3, order, out);
  CHECK(out == std::vector<std::int32_t>{0, 1, 2});
}

TEST_CASE("compression settings are validated") {
  CHECK_THROWS_AS((cache_geometry{16, 64, 17}.validate()), zipage::error);
  CHECK_THROWS_AS((cache_geometry{16, 0, 8}.validate()), zipage::error);
  CHECK_NOTHROW((cache_geometry{16, 64, 16}.validate()));
  CHECK(cache_geometry{16, 64, 8}.should_compress(80));
  CHECK_FALSE(cache_geometry{16, 64, 8}.should_compress(64));
  CHECK_FALSE(cache_geometry{16, 64, 8}.should_compress(81));
  CHECK(cache_geometry{16, 64, 8}.should_compress(160));  // after a long prompt
}

// ---- compression_worker: batching and device dispatch (a CPU backend with a recording device hook)

namespace {

// cpu_backend plus the device_compressor hook: records each batch, and either declines (the host path
// then runs) or "compresses" (nothing moves; the worker reports min(keep, kv_len)).
struct recording_backend : zipage::cpu_backend {
  mutable std::vector<int> batches;
  mutable std::vector<zipage::score_recipe> recipes;
  bool accept = true;
  bool compress_on_device(kv_storage&, std::span<const zipage::device_compression_job> jobs,
                          const zipage::score_recipe& recipe, const zipage::cache_geometry&, int) const {
    batches.push_back(static_cast<int>(jobs.size()));
    recipes.push_back(recipe);
    for (const auto& j : jobs) CHECK(static_cast<int>(j.pages.size()) * 4 >= j.kv_len);
    return accept;
  }
};
static_assert(zipage::device_compressor<recording_backend>);

struct own_score_policy : zipage::zipage_policy {  // overrides score(): never recipe-scored
  void score(const zipage::score_context& ctx, std::span<float> keep, std::span<float> cache) const {
    zipage::zipage_policy::score(ctx, keep, cache);
  }
};

struct worker_fixture {
  zipage::model_config model;
  zipage::kv_cache_shape shape;
  std::vector<std::unique_ptr<zipage::sequence>> seqs;

  worker_fixture() {
    model.num_layers = 2;
    model.num_q_heads = 4;
    model.num_kv_heads = 2;
    model.head_dim = 8;
    shape = {.num_layers = 2, .num_blocks = 64, .block_size = 4, .num_kv_heads = 2, .head_dim = 8, .num_q_heads = 4,
             .window = 2, .num_query_slots = 8, .score_cache = true};
    for (int i = 0; i < 7; ++i) {
      auto s = std::make_unique<zipage::sequence>();
      s->id = static_cast<zipage::request_id>(i);
      s->kv_len = 12;  // 3 blocks of 4, budget 2 blocks -> keep 8
      s->query_slot = i;
      for (int b = 0; b < 3; ++b) s->table.push_back(3 * i + b);
      seqs.push_back(std::move(s));
    }
  }
  std::vector<zipage::sequence*> all() {
    std::vector<zipage::sequence*> v;
    for (auto& s : seqs) v.push_back(s.get());
    return v;
  }
};

}  // namespace

TEST_CASE("compression_worker batches one step's requests for the device hook, max_batch at a time") {
  worker_fixture f;
  const zipage::cache_geometry params{.block_size = 4, .budget_tokens = 8, .window = 2};
  for (const bool threaded : {false, true}) {
    CAPTURE(threaded);
    recording_backend backend;
    zipage::cpu_kv_storage kv(f.shape);
    zipage::zipage_policy policy;
    policy.gamma = 0.5f;
    {
      zipage::compression_worker<zipage::zipage_policy, recording_backend> w(backend, kv, policy, params, f.model,
                                                                             threaded, 3);
      const auto seqs = f.all();
      w.submit(seqs);
      std::vector<zipage::finished_compression> done;
      while (done.size() < seqs.size()) {
        auto got = threaded ? w.wait_finished() : w.take_finished();
        done.insert(done.end(), got.begin(), got.end());
      }
      CHECK(w.in_flight() == 0);
      for (const auto& d : done) {
        CHECK(d.error.empty());
        CHECK(d.new_len == 8);
      }
    }
    // 7 requests, at most 3 per batch: every request went to the device, in few batches.
    int total = 0;
    for (const int b : backend.batches) {
      CHECK(b <= 3);
      total += b;
    }
    CHECK(total == 7);
    if (!threaded) CHECK(backend.batches == std::vector<int>{3, 3, 1});
    CHECK(backend.recipes.front().gamma == 0.5f);  // the policy's own parameters reach the device
  }
}

TEST_CASE("compression_worker: a policy with its own score() and a declined batch take the host path") {
  worker_fixture f;
  const zipage::cache_geometry params{.block_size = 4, .budget_tokens = 8, .window = 2};
  {
    recording_backend backend;
    zipage::cpu_kv_storage kv(f.shape);
    own_score_policy policy;
    zipage::compression_worker<own_score_policy, recording_backend> w(backend, kv, policy, params, f.model, false);
    w.submit(f.all());
    const auto done = w.take_finished();
    CHECK(done.size() == 7);
    CHECK(backend.batches.empty());  // never offered to the device: its score() must run
    for (const auto& d : done) CHECK(d.new_len == 8);
  }
  {
    recording_backend backend;
    backend.accept = false;
    zipage::cpu_kv_storage kv(f.shape);
    zipage::zipage_policy policy;
    zipage::compression_worker<zipage::zipage_policy, recording_backend> w(backend, kv, policy, params, f.model, false);
    w.submit(f.all());
    const auto done = w.take_finished();
    CHECK(backend.batches == std::vector<int>{7});
    CHECK(done.size() == 7);
    for (const auto& d : done) {
      CHECK(d.error.empty());
      CHECK(d.new_len == 8);  // the host path planned and compacted each one
    }
  }
}

namespace {
// hashed_policy that takes its time, so an engine can be destroyed while a compression runs.
struct slow_policy : hashed_policy {
  int sleep_ms = 150;
  void score(const score_context& ctx, std::span<float> keep, std::span<float> cache_out) const {
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    hashed_policy::score(ctx, keep, cache_out);
  }
};
}  // namespace

TEST_CASE("an engine destroyed while its worker compresses waits for the worker first (no use after free)") {
  // Under AddressSanitizer (CI) a worker reading a freed sequence or KV storage would abort this test.
  engine_config cfg;
  cfg.block_size = 4;
  cfg.budget_tokens = 8;
  cfg.window = 2;
  cfg.num_blocks = 64;
  cfg.async_compression = true;
  bool saw_compressing = false;
  {
    engine<probe_model, slow_policy> eng(probe_model{}, cfg);
    for (int r = 0; r < 2; ++r) {
      sampling_params p;
      p.ignore_eos = true;
      p.max_tokens = 64;
      eng.add_request(std::vector<token_id>(static_cast<std::size_t>(5 + 3 * r), static_cast<token_id>(1 + r)), p);
    }
    for (int i = 0; i < 200 && !saw_compressing; ++i) {
      eng.step();
      for (const sequence* s : eng.requests()) saw_compressing = saw_compressing || s->compressing;
    }
  }  // destroyed here, while a compression is queued or running
  CHECK(saw_compressing);
}

TEST_CASE("cancelling requests in every state (waiting, running, swapped, compressing), then destroying the engine mid-compression") {
  // Under AddressSanitizer (CI) a worker or a step touching a cancelled request's freed state would abort
  // this test; afterwards nothing may be leaked (blocks, references, query slots).
  engine_config cfg;
  cfg.block_size = 4;
  cfg.budget_tokens = 8;  // B = 2: a compressed request holds at most 3 blocks
  cfg.window = 2;
  cfg.num_blocks = 8;     // tight: requests wait for blocks, mid-prefill ones are recomputed
  cfg.max_num_seqs = 6;
  cfg.num_query_slots = 4;
  cfg.async_compression = true;
  slow_policy policy;
  policy.sleep_ms = 5;
  std::mt19937 rng(11);
  std::set<std::string> cancelled_in;
  {
    engine<probe_model, slow_policy> eng(probe_model{}, cfg, policy);
    std::vector<request_id> ids;
    for (int r = 0; r < 24; ++r) {
      // Prompts of 12 to 20 tokens: compressed right after their prefill, so compactions are often in flight.
      std::vector<token_id> prompt(static_cast<std::size_t>(std::uniform_int_distribution<int>(12, 20)(rng)));
      for (auto& t : prompt) t = std::uniform_int_distribution<int>(0, kVocab - 2)(rng);
      sampling_params p;
      p.seed = static_cast<std::uint64_t>(r);
      p.ignore_eos = true;
      p.max_tokens = std::uniform_int_distribution<int>(24, 64)(rng);
      ids.push_back(eng.add_request(prompt, p));
    }
    // The first request seen in each state is cancelled there.
    const auto state_of = [](const sequence& s) -> std::string {
      if (s.compressing) return "compressing";
      switch (s.status) {
        case request_status::waiting: return s.num_preemptions > 0 ? "waiting (preempted)" : "waiting";
        case request_status::running: return s.num_computed < s.prompt_len ? "running (prefill)" : "running";
        case request_status::swapped: return "swapped";
        case request_status::finished: return "finished";
      }
      return "?";
    };
    for (int i = 0; i < 5000 && eng.has_unfinished(); ++i) {
      eng.step();
      for (const sequence* s : eng.requests()) {
        const std::string state = state_of(*s);
        if (state == "finished" || cancelled_in.count(state) > 0) continue;
        const request_id id = s->id;
        CAPTURE(state);
        REQUIRE(eng.cancel(id));
        cancelled_in.insert(state);
        const sequence& c = eng.request(id);
        CHECK(c.is_finished());
        CHECK(c.reason == finish_reason::cancelled);
        CHECK(c.table.empty());         // its blocks went back at once
        CHECK(c.query_slot == -1);      // and its query slot
        CHECK_FALSE(c.compressing);     // a compaction in flight landed first
        CHECK_FALSE(eng.cancel(id));    // only once
        break;                          // requests() is a snapshot: cancel one per step
      }
    }
    eng.run_to_completion();
    for (request_id id : ids) {
      const request_output out = eng.take_output(id);
      CHECK((out.reason == finish_reason::length || out.reason == finish_reason::cancelled));
    }
    CHECK(eng.pool().num_used() == 0);
    CHECK(eng.pool().total_references() == 0);
    CHECK(eng.stats().slots_in_use == 0);
  }
  {
    // Swapped: an older request decodes from a short prompt; a newer one arrives with an 11-token prompt
    // and is compressed at its first token. In 5 blocks they cannot both hold their peaks (B + 1 = 3
    // each), so when the older one needs a block the newer, compressed one is swapped out.
    engine_config tight = cfg;
    tight.num_blocks = 5;
    engine<probe_model, slow_policy> eng(probe_model{}, tight, policy);
    sampling_params p;
    p.ignore_eos = true;
    p.max_tokens = 200;
    const request_id older = eng.add_request({1, 2, 3}, p);
    eng.step();
    const request_id newer = eng.add_request(std::vector<token_id>(11, 5), p);
    bool swapped = false;
    for (int i = 0; i < 2000 && eng.has_unfinished() && !swapped; ++i) {
      eng.step();
      swapped = eng.request(newer).status == request_status::swapped;
    }
    REQUIRE(swapped);
    CHECK(eng.cancel(newer));
    cancelled_in.insert("swapped");
    const sequence& c = eng.request(newer);
    CHECK(c.reason == finish_reason::cancelled);
    CHECK(c.table.empty());
    CHECK(c.query_slot == -1);
    CHECK(eng.stats().swapped == 0);
    eng.run_to_completion();
    CHECK(eng.take_output(older).reason == finish_reason::length);
    CHECK(eng.take_output(newer).reason == finish_reason::cancelled);
    CHECK(eng.pool().num_used() == 0);
    CHECK(eng.pool().total_references() == 0);
    CHECK(eng.stats().slots_in_use == 0);
  }
  for (const char* state : {"waiting", "running", "swapped", "compressing"}) CHECK(cancelled_in.count(state) == 1);
  {
    // Then an engine goes out of scope with a compression in flight (the worker is joined first).
    slow_policy slow;
    slow.sleep_ms = 100;
    engine<probe_model, slow_policy> eng(probe_model{}, cfg, slow);
    for (int r = 0; r < 3; ++r) {
      sampling_params p;
      p.ignore_eos = true;
      p.max_tokens = 64;
      eng.add_request(std::vector<token_id>(static_cast<std::size_t>(5 + 3 * r), static_cast<token_id>(1 + r)), p);
    }
    bool in_flight = false;
    for (int i = 0; i < 200 && !in_flight; ++i) {
      eng.step();
      in_flight = eng.stats().compressing > 0;
    }
    CHECK(in_flight);
    // A request whose compaction is in flight is cancelled (cancel waits for the worker), and another
    // request's compaction is left running when the engine is destroyed.
    for (const sequence* s : eng.requests())
      if (s->compressing) {
        CHECK(eng.cancel(s->id));
        break;
      }
    for (int i = 0; i < 200 && eng.stats().compressing == 0 && eng.has_unfinished(); ++i) eng.step();
  }  // destroyed here, typically while a compression is queued or running
}
