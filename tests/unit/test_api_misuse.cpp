// Misuse of the library API found by a probe (2026-12-05): each is refused early, naming the field, the
// request or the policy, and the engine keeps working for the other requests.
#include <doctest/doctest.h>

#include <sys/resource.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "counting_model.hpp"
#include "greedy.hpp"
#include "test_support.hpp"
#include "tiny_llama.hpp"
#include "zipage/core/host_memory.hpp"
#include "zipage/engine/engine.hpp"
#include "zipage/policy/policies.hpp"
#include "zipage/policy/scoring.hpp"

using namespace zipage;
using zipage::testing::contains;
using zipage::testing::error_of;
using zipage::testing::greedy_ignoring_eos;
using zipage::testing::tiny_llama;

namespace {

engine_config small(bool async_compression = false) {
  engine_config cfg;
  cfg.block_size = 8;
  cfg.window = 8;
  cfg.budget_tokens = 16;
  cfg.num_blocks = 64;
  cfg.async_compression = async_compression;
  return cfg;
}

// A custom model (counting_model's forward) whose config() is whatever the test makes it.
struct configured_model : zipage::testing::counting_model {
  explicit configured_model(void (*edit)(model_config&)) { edit(cfg); }
};

// A custom policy whose keep_tokens() is whatever the test says.
struct fixed_keep : policy_base {
  int keep = 0;
  std::string_view name() const { return "fixed_keep"; }
  int keep_tokens(const cache_geometry&) const { return keep; }
  void score(const score_context& ctx, std::span<float> out, std::span<float>) const {
    scoring::window_attention(ctx, out);
  }
};

// A custom policy whose keep_tokens() answers the budget when the engine is built, then `later`.
struct changing_keep : policy_base {
  int later = 0;
  mutable int calls = 0;
  std::string_view name() const { return "changing_keep"; }
  int keep_tokens(const cache_geometry& g) const { return ++calls > 1 ? later : g.budget_tokens; }
  void score(const score_context& ctx, std::span<float> out, std::span<float>) const {
    scoring::window_attention(ctx, out);
  }
};

// A custom policy whose should_compress() throws once a request's cache holds `at` tokens.
struct compress_rule_throws : policy_base {
  int at = 20;
  std::string_view name() const { return "compress_rule_throws"; }
  bool should_compress(int kv_len, const cache_geometry& g) const {
    if (kv_len == at) throw std::runtime_error("no rule for 20 tokens");
    return g.should_compress(kv_len);
  }
  void score(const score_context& ctx, std::span<float> out, std::span<float>) const {
    scoring::window_attention(ctx, out);
  }
};

// A custom policy whose score() throws something that is not a std::exception.
struct throws_int : policy_base {
  std::string_view name() const { return "throws_int"; }
  void score(const score_context&, std::span<float>, std::span<float>) const { throw 42; }
};

// Caps this process's address space at what it maps now plus `extra` while it lives, so that a test which must
// not allocate much fails with std::bad_alloc if it does, instead of calling in the OOM killer.
class address_space_cap {
 public:
  explicit address_space_cap(std::size_t extra) {
    ::getrlimit(RLIMIT_AS, &old_);
    std::ifstream status("/proc/self/status");
    std::string key;
    std::size_t kib = 0;
    while (status >> key && key != "VmSize:") status.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
    if (!(status >> kib)) return;
    rlimit cap = old_;
    cap.rlim_cur = std::min<rlim_t>(old_.rlim_cur, kib * 1024 + extra);
    ::setrlimit(RLIMIT_AS, &cap);
  }
  ~address_space_cap() { ::setrlimit(RLIMIT_AS, &old_); }
  address_space_cap(const address_space_cap&) = delete;
  address_space_cap& operator=(const address_space_cap&) = delete;

 private:
  rlimit old_{};
};

}  // namespace

TEST_CASE("forced tokens outside the vocabulary are refused at add_forced_request, not at every later step") {
  engine<llama_model<cpu_backend>> eng(tiny_llama(), small());  // vocabulary 64
  const std::vector<token_id> prompt{1, 2, 3};
  const auto normal = eng.add_request(prompt, greedy_ignoring_eos(6));
  CHECK(contains(error_of([&] { (void)eng.add_forced_request(prompt, {3, 1000, 4}); }),
                 "request: forced token 1000 is outside the vocabulary of 64"));
  CHECK(contains(error_of([&] { (void)eng.add_forced_request(prompt, {-1}); }), "forced token -1"));
  eng.run_to_completion();
  CHECK(eng.take_output(normal).output.size() == 6);  // the other request was never held up
}

TEST_CASE("stop_token_ids outside the vocabulary are refused: such an id could never stop the request") {
  engine<llama_model<cpu_backend>> eng(tiny_llama(), small());
  sampling_params p = greedy_ignoring_eos(4);
  p.stop_token_ids = {5, 1000000};
  CHECK(contains(error_of([&] { (void)eng.add_request({1, 2}, p); }),
                 "request: sampling_params::stop_token_ids holds 1000000, outside the vocabulary of 64"));
  p.stop_token_ids = {63};
  CHECK_NOTHROW((void)eng.add_request({1, 2}, p));
}

TEST_CASE("a custom policy's keep_tokens() outside [window, budget] is refused when the engine is built") {
  for (int keep : {0, -5, 4, 17, 100000}) {
    CAPTURE(keep);
    fixed_keep policy;
    policy.keep = keep;
    CHECK(contains(error_of([&] { engine<llama_model<cpu_backend>, fixed_keep> eng(tiny_llama(), small(), policy); }),
                   "policy fixed_keep: keep_tokens() = " + std::to_string(keep) +
                       " must be in [window = 8, budget_tokens = 16]"));
  }
  for (int keep : {8, 16}) {
    fixed_keep policy;
    policy.keep = keep;
    engine<llama_model<cpu_backend>, fixed_keep> eng(tiny_llama(), small(), policy);
    const auto out = eng.generate({{1, 2, 3}}, greedy_ignoring_eos(40))[0];
    CHECK(out.reason == finish_reason::length);
    CHECK(out.num_compressions > 0);
  }
}

TEST_CASE("a policy whose keep_tokens() changes after the engine is built fails its requests, never over budget") {
  // Keeping 24 of a budget of 16 tokens was done silently: the request outgrew its B + 1 blocks.
  for (int later : {24, 4}) {
    CAPTURE(later);
    changing_keep policy;
    policy.later = later;
    engine<llama_model<cpu_backend>, changing_keep> eng(tiny_llama(), small(), policy);
    const auto out = eng.generate({{1, 2, 3}}, greedy_ignoring_eos(40))[0];
    CHECK(out.reason == finish_reason::error);
    CHECK(out.num_compressions == 0);
    CHECK(contains(out.error_message, later > 16 ? "compression: keep_tokens() = 24 is more than budget_tokens = 16"
                                                 : "compression: keeping 4 tokens cannot hold the window of 8"));
    CHECK(eng.stats().blocks_in_use == 0);
  }
}

TEST_CASE("a policy whose score() throws a non-std::exception fails its requests, naming the policy; no terminate") {
  for (bool async : {false, true}) {
    CAPTURE(async);
    engine<llama_model<cpu_backend>, throws_int> eng(tiny_llama(), small(async));
    const auto out = eng.generate({{1, 2, 3}}, greedy_ignoring_eos(40))[0];
    CHECK(out.reason == finish_reason::error);
    CHECK(contains(out.error_message, "compression failed: policy throws_int: an exception that is not a std::exception"));
    engine<llama_model<cpu_backend>> full(tiny_llama(), small(async));  // the process lives on
    CHECK(full.generate({{1, 2, 3}}, greedy_ignoring_eos(4))[0].output.size() == 4);
  }
}

TEST_CASE("pool sizes: host memory bounds a CPU pool; gpu_memory_utilization on the CPU is refused, not ignored") {
  engine_config cfg = small();
  cfg.num_blocks = INT_MAX;  // ~ 2^31 blocks: would be killed by the OOM killer allocating the bookkeeping
  CHECK(contains(error_of([&] { engine<llama_model<cpu_backend>> eng(tiny_llama(), cfg); }),
                 "(2147483647 blocks + 0 query slots, from engine_config::num_blocks), more than this machine's "
                 "available memory"));
  cfg = small();
  cfg.num_blocks = 0;
  cfg.kv_cache_bytes = std::numeric_limits<std::size_t>::max();
  CHECK(contains(error_of([&] { engine<llama_model<cpu_backend>, zipage_policy> eng(tiny_llama(), cfg); }),
                 "more than this machine's available memory"));
  cfg = small();
  cfg.num_query_slots = 1 << 28;
  cfg.max_num_seqs = 1 << 28;
  CHECK(contains(error_of([&] { engine<llama_model<cpu_backend>, zipage_policy> eng(tiny_llama(), cfg); }),
                 "from engine_config::num_blocks and engine_config::num_query_slots), more than this machine's "
                 "available memory"));
  cfg = small();
  cfg.gpu_memory_utilization = 0.5;
  CHECK(contains(error_of([&] { engine<llama_model<cpu_backend>> eng(tiny_llama(), cfg); }),
                 "engine_config::gpu_memory_utilization (0.5) sizes the pool on a backend that reports device memory"));
  cfg = small();
  cfg.max_kv_cache_bytes = std::size_t{1} << 20;
  CHECK(contains(error_of([&] { engine<llama_model<cpu_backend>, zipage_policy> eng(tiny_llama(), cfg); }),
                 "engine_config::max_kv_cache_bytes (1048576) caps the pool that gpu_memory_utilization sizes"));
  cfg = small();
  cfg.num_blocks = 0;
  cfg.kv_cache_bytes = 1000;
  CHECK(contains(error_of([&] { engine<llama_model<cpu_backend>, zipage_policy> eng(tiny_llama(), cfg); }),
                 "(engine_config::kv_cache_bytes, or what gpu_memory_utilization leaves on the device)"));
}

TEST_CASE("host memory: what a new allocation can take is MemAvailable + SwapFree, not the machine's total") {
  const char* meminfo = "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    300 kB\n"
                        "Buffers:          10 kB\nSwapTotal:        50 kB\nSwapFree:         20 kB\n";
  CHECK(available_in_meminfo(meminfo) == 320 * 1024);
  CHECK(available_in_meminfo("MemTotal: 1000 kB\nMemFree: 100 kB\n") == 0);  // no MemAvailable: the caller's fallback
  CHECK(host_available_bytes() > 0);
}

TEST_CASE("pool sizes: a CPU pool above the memory available now is refused, even below the machine's total") {
  // The check compared the plan with the machine's total memory: a pool between what is available and the total
  // was accepted and zero-filled, and the OOM killer took this process or another.
  const std::size_t total = host_memory_bytes(), available = host_available_bytes();
  if (total < available + (512u << 20)) {
    MESSAGE("skipped: less than 512 MiB of this machine's memory is in use");
    return;
  }
  engine_config cfg = small();
  cfg.num_blocks = 0;
  cfg.kv_cache_bytes = total - (64u << 20);  // far enough above what is available that other processes can't matter
  const address_space_cap cap(256u << 20);  // a plan that gets through fails with bad_alloc, not the OOM killer
  CHECK(contains(error_of([&] { engine<llama_model<cpu_backend>, zipage_policy> eng(tiny_llama(), cfg); }),
                 "from engine_config::kv_cache_bytes), more than this machine's available memory ("));
}

TEST_CASE("a custom model's config() without layers or heads, or with an EOS outside its vocabulary, is refused") {
  // Each crashed the engine's constructor (a division by zero, a segfault or a heap abort) or was accepted.
  engine_config cfg = small();
  cfg.block_size = 4;
  cfg.window = 4;
  cfg.budget_tokens = 8;
  const std::vector<std::pair<void (*)(model_config&), std::string>> cases = {
      {[](model_config& c) { c.num_layers = 0; }, "config().num_layers must be positive, got 0"},
      {[](model_config& c) { c.num_kv_heads = 0; }, "config().num_kv_heads must be positive, got 0"},
      {[](model_config& c) { c.num_q_heads = 0; }, "config().num_q_heads must be positive, got 0"},
      {[](model_config& c) { c.head_dim = 0; }, "config().head_dim must be positive, got 0"},
      {[](model_config& c) { c.vocab_size = 0; }, "config().vocab_size must be positive, got 0"},
      {[](model_config& c) { c.num_q_heads = 3, c.num_kv_heads = 2; },
       "config().num_q_heads (3) must be a multiple of num_kv_heads (2)"},
      {[](model_config& c) { c.eos = 100; }, "config().eos (100) is outside the vocabulary of 8"},
      {[](model_config& c) { c.extra_eos = {8}; }, "config().extra_eos holds 8, outside the vocabulary of 8"},
  };
  for (const auto& [edit, message] : cases) {
    CAPTURE(message);
    CHECK(contains(error_of([&] { engine<configured_model> eng(configured_model(edit), cfg); }), message));
    CHECK(contains(error_of([&] { engine<configured_model, zipage_policy> eng(configured_model(edit), cfg); }),
                   message));
  }
  engine<configured_model, zipage_policy> fine(configured_model([](model_config&) {}), cfg);
  CHECK(fine.generate({{0, 1, 2}}, greedy_ignoring_eos(12))[0].output.size() == 12);
}

TEST_CASE("a policy whose should_compress() throws fails that request; the engine does not hang, others finish") {
  // step() threw from the middle of the scheduler's update and left the request running with nothing to
  // run: has_unfinished() stayed true and run_to_completion() never returned.
  for (bool async : {false, true}) {
    CAPTURE(async);
    engine<llama_model<cpu_backend>, compress_rule_throws> eng(tiny_llama(), small(async));
    const auto reference = engine<llama_model<cpu_backend>, zipage_policy>(tiny_llama(), small(async))
                               .generate({{1, 2, 3}}, greedy_ignoring_eos(12))[0];
    const auto fails = eng.add_request({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, greedy_ignoring_eos(40));
    const auto other = eng.add_request({1, 2, 3}, greedy_ignoring_eos(12));  // stops at 15 tokens
    std::vector<step_event> ends;
    for (int i = 0; i < 200 && eng.has_unfinished(); ++i)
      for (const auto& e : eng.step())
        if (e.finished) ends.push_back(e);
    REQUIRE_FALSE(eng.has_unfinished());
    const auto failed = eng.take_output(fails);
    CHECK(failed.reason == finish_reason::error);
    CHECK(failed.error_message == "the eviction policy's should_compress() failed: no rule for 20 tokens");
    CHECK(failed.output.size() == 11);  // the token sampled as the cache reached 20
    CHECK(eng.take_output(other).output == reference.output);
    CHECK(ends.size() == 2);  // one finished event each
    CHECK(eng.stats().blocks_in_use == 0);
  }
}

TEST_CASE("a non-zero priority under fcfs order is refused at add_request, naming the field (as vLLM)") {
  // It was accepted and ignored: the request ran in arrival order.
  engine<llama_model<cpu_backend>> eng(tiny_llama(), small());  // scheduling_order::fcfs, the default
  sampling_params p = greedy_ignoring_eos(4);
  for (int priority : {3, -1}) {
    p.priority = priority;
    CHECK(contains(error_of([&] { (void)eng.add_request({1, 2}, p); }),
                   "request: sampling_params::priority = " + std::to_string(priority) +
                       " needs engine_config::scheduling = scheduling_order::priority"));
    CHECK(contains(error_of([&] { (void)eng.add_forced_request({1, 2}, {3}, p); }), "sampling_params::priority"));
  }
  CHECK(eng.stats().waiting == 0);
  p.priority = 0;
  CHECK(eng.generate({{1, 2}}, p)[0].output.size() == 4);
  engine_config cfg = small();
  cfg.scheduling = scheduling_order::priority;
  engine<llama_model<cpu_backend>> by_priority(tiny_llama(), cfg);
  p.priority = 3;
  CHECK(by_priority.generate({{1, 2}}, p)[0].output.size() == 4);
}

// --- Found by a probe of the library API (2026-12-07) ---

namespace {

// A counting_model whose forward misuses forward_context::attention as `how` says: a layer outside the model's
// one, or q / k narrower than their heads.
struct misusing_model : zipage::testing::counting_model {
  enum class misuse { layer, narrow_q, narrow_k } how;
  explicit misusing_model(misuse m) : how(m) {}
  tensor forward(forward_context<backend_type>& ctx) {
    tensor x, attn, last;
    ctx.backend().embedding(tensor::Identity(8, 8), ctx.tokens(), x);
    const tensor k = how == misuse::narrow_k ? tensor(x.leftCols(2)) : tensor(x.leftCols(4));
    const tensor q = how == misuse::narrow_q ? tensor(x.leftCols(6)) : x;
    ctx.attention(how == misuse::layer ? 3 : 0, q, k, x.leftCols(4), attn);
    ctx.backend().gather_rows(x, ctx.logits_rows(), last);
    return tensor::Zero(last.rows(), 8);
  }
};

// A counting_model that returns its logits transposed ([vocab][rows]: as many numbers, the wrong shape).
struct transposed_logits_model : zipage::testing::counting_model {
  tensor forward(forward_context<backend_type>& ctx) {
    tensor logits = counting_model::forward(ctx);
    return logits.transpose();
  }
};

}  // namespace

TEST_CASE("a detokenizer that throws fails its own request; the others finish with the text of a clean run") {
  // The exception left step() between running the plan and applying it: every later step ran the same plan
  // again and threw again, so no request ever finished, and requests earlier in the batch had the step's text
  // added twice. Now the request whose detokenizer threw ends with an error and the rest go on.
  const auto detokenizer_of = [](bool throwing) {
    return [throwing](std::span<const token_id> prompt) -> streaming_detokenizer {
      const bool fails = throwing && prompt.size() == 5;  // the request with the 5-token prompt
      return [fails, n = 0](token_id t) mutable -> std::string {
        if (fails && ++n == 3) throw std::out_of_range("token id out of range");
        return "<" + std::to_string(t) + ">";
      };
    };
  };
  const std::vector<std::vector<token_id>> prompts{{1, 2, 3}, {4, 5}, {1, 2, 3, 4, 5}, {6}};
  for (bool async : {false, true}) {
    CAPTURE(async);
    engine_config clean_cfg = small(async), cfg = small(async);
    clean_cfg.make_detokenizer = detokenizer_of(false);
    cfg.make_detokenizer = detokenizer_of(true);
    const auto clean = engine<llama_model<cpu_backend>>(tiny_llama(), clean_cfg).generate(prompts, greedy_ignoring_eos(10));
    engine<llama_model<cpu_backend>> eng(tiny_llama(), cfg);
    std::vector<request_id> ids;
    for (const auto& p : prompts) ids.push_back(eng.add_request(p, greedy_ignoring_eos(10)));
    int finished = 0;
    for (int i = 0; i < 100 && eng.has_unfinished(); ++i)
      for (const auto& e : eng.step()) finished += e.finished ? 1 : 0;
    REQUIRE_FALSE(eng.has_unfinished());
    CHECK(finished == 4);
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      CAPTURE(i);
      const auto out = eng.take_output(ids[i]);
      if (i == 2) {
        CHECK(out.reason == finish_reason::error);
        CHECK(contains(out.error_message, "the detokenizer failed on token "));
        CHECK(contains(out.error_message, "token id out of range"));
      } else {
        CHECK(out.output == clean[i].output);
        CHECK(out.text == clean[i].text);
      }
    }
    CHECK(eng.stats().blocks_in_use == 0);
  }
}

TEST_CASE("a custom model's attention call with a layer outside the cache or q / k of the wrong width is refused") {
  // They wrote past the pool's layers or a token's heads: heap corruption (malloc aborts), or silent garbage.
  using misuse = misusing_model::misuse;
  for (const auto& [how, what] : {std::pair{misuse::layer, "attention: layer 3 is outside the KV cache's 1 layers"},
                                  std::pair{misuse::narrow_q, "q has 6 columns, not 2 heads x head_dim 4 = 8"},
                                  std::pair{misuse::narrow_k, "k has 2 columns, not 1 heads x head_dim 4 = 4"}}) {
    CAPTURE(what);
    engine<misusing_model> eng(misusing_model(how), small());
    CHECK(contains(error_of([&] { (void)eng.generate({{0, 1, 2}}, greedy_ignoring_eos(4)); }), what));
  }
}

TEST_CASE("logits of the wrong shape are refused even when their size is right") {
  engine<transposed_logits_model> eng(transposed_logits_model{}, small());
  // 8 rows x 8 columns would pass as 8 x 8; one request gives 8 x 1, transposed 1 x 8 -> 8 x 1.
  CHECK(contains(error_of([&] { (void)eng.generate({{0, 1, 2}}, greedy_ignoring_eos(4)); }),
                 "engine: the model returned logits of 8 x 1, not 1 rows"));
}

TEST_CASE("sinks and a window that add up to more than the tokens kept: the window stays, the sinks give way") {
  // Both were forced with the same +inf and ties went to the older tokens: compression kept the sinks and evicted
  // the newest tokens, whose queries had just scored the rest (streaming_llm{.sinks = 8} at budget 8, window 4 kept
  // positions 0-7). The sinks are now cut to what the window leaves of keep_tokens().
  const engine_config cfg = small();  // budget 16, window 8: room for 8 sinks
  const llama_model<cpu_backend> model = tiny_llama();
  const streaming_llm hundred{.sinks = 100}, three{.sinks = 3};  // (a compressor keeps a pointer to its policy)
  CHECK(compressor<streaming_llm, cpu_backend>(hundred, cfg.geometry(), model.config()).recipe().sinks == 8);
  CHECK(compressor<streaming_llm, cpu_backend>(three, cfg.geometry(), model.config()).recipe().sinks == 3);
  const auto run = [&](int sinks) {
    engine<llama_model<cpu_backend>, streaming_llm> eng(tiny_llama(), cfg, streaming_llm{.sinks = sinks});
    return eng.generate({{1, 2, 3}, {4, 5, 6, 7, 8}}, greedy_ignoring_eos(60));
  };
  const auto at_most = run(8), beyond = run(100);
  for (std::size_t i = 0; i < at_most.size(); ++i) CHECK(beyond[i].output == at_most[i].output);
}

TEST_CASE("allowed_token_ids of end ids only, with min_tokens, are refused: no token could be sampled") {
  // A row with every logit -inf sampled token 0, outside the allowed set.
  engine<zipage::testing::counting_model> eng(zipage::testing::counting_model{}, small());
  sampling_params p;
  p.temperature = 0.0f;
  p.max_tokens = 4;
  p.min_tokens = 3;
  p.allowed_token_ids = std::vector<token_id>{7};  // the model's EOS
  CHECK(contains(error_of([&] { (void)eng.add_request({0, 1}, p); }),
                 "sampling_params::allowed_token_ids holds only end-of-sequence or stop ids"));
  p.allowed_token_ids = std::vector<token_id>{7, 5};
  p.stop_token_ids = {5};
  CHECK(contains(error_of([&] { (void)eng.add_request({0, 1}, p); }), "min_tokens = 3"));
  p.allowed_token_ids = std::vector<token_id>{7, 3};
  const auto out = eng.generate({{0, 1}}, p)[0];
  CHECK(std::all_of(out.output.begin(), out.output.end(), [](token_id t) { return t == 7 || t == 3; }));
}

TEST_CASE("query slots above max_num_seqs, or with a policy that never evicts, are refused, not left unused") {
  engine_config cfg = small();
  cfg.max_num_seqs = 4;
  cfg.num_query_slots = 5;
  CHECK(contains(error_of([&] { engine<llama_model<cpu_backend>, zipage_policy> eng(tiny_llama(), cfg); }),
                 "engine_config::num_query_slots (5) is more than engine_config::max_num_seqs (4)"));
  cfg.num_query_slots = 4;  // one per running request: the plan holds exactly these
  engine<llama_model<cpu_backend>, zipage_policy> eng(tiny_llama(), cfg);
  CHECK(eng.memory().num_query_slots == 4);
  CHECK(eng.generate({{1, 2, 3}}, greedy_ignoring_eos(40))[0].output.size() == 40);
  CHECK(contains(error_of([&] { engine<llama_model<cpu_backend>, full_kv> full(tiny_llama(), cfg); }),
                 "engine_config::num_query_slots (4) is for compression, and this engine's policy never evicts"));
  cfg.num_query_slots = 0;
  engine<llama_model<cpu_backend>, full_kv> full(tiny_llama(), cfg);
  CHECK(full.memory().num_query_slots == 0);
}
