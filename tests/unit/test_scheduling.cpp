// The scheduling policies end to end: randomised load against an unconstrained run, prefix sharing,
// cancellation and metrics.
#include <doctest/doctest.h>

#include <map>
#include <random>
#include <vector>

#include "greedy.hpp"
#include "tiny_llama.hpp"
#include "zipage/engine/engine.hpp"
#include "zipage/gguf/gguf.hpp"
#include "zipage/policy/policies.hpp"
#include "zipage/tokenizer/spm_tokenizer.hpp"

using namespace zipage;
using zipage::testing::greedy_ignoring_eos;

namespace {

struct workload {
  std::vector<std::vector<token_id>> prompts;
  std::vector<int> max_tokens;
  std::vector<int> arrival_step;
  std::vector<int> cancel_step;  // -1: never
};

// Prompts share prefixes drawn from a few templates, so the prefix cache has real work.
workload random_workload(int n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<token_id>> templates(4);
  for (auto& t : templates) {
    t.assign(static_cast<std::size_t>(std::uniform_int_distribution<int>(8, 40)(rng)), 0);
    for (auto& tok : t) tok = std::uniform_int_distribution<int>(1, 62)(rng);
  }
  workload w;
  int step = 0;
  for (int i = 0; i < n; ++i) {
    std::vector<token_id> prompt{0};
    if (rng() % 2) {
      const auto& t = templates[rng() % templates.size()];
      prompt.insert(prompt.end(), t.begin(), t.end());
    }
    const int tail = std::uniform_int_distribution<int>(1, 24)(rng);
    for (int j = 0; j < tail; ++j) prompt.push_back(std::uniform_int_distribution<int>(1, 62)(rng));
    w.prompts.push_back(prompt);
    w.max_tokens.push_back(std::uniform_int_distribution<int>(1, 64)(rng));
    step += std::uniform_int_distribution<int>(0, 1)(rng);
    w.arrival_step.push_back(step);
    w.cancel_step.push_back(rng() % 20 == 0 ? step + std::uniform_int_distribution<int>(0, 30)(rng) : -1);
  }
  return w;
}

template <class Engine>
void check_pool_balanced(const Engine& eng) {
  CHECK(eng.pool().num_used() == 0);
  CHECK(eng.pool().total_references() == 0);
  const auto st = eng.stats();
  CHECK(st.running == 0);
  CHECK(st.waiting == 0);
  CHECK(st.swapped == 0);
  CHECK(st.slots_in_use == 0);
}

}  // namespace

namespace {

// Under `order` (priority: request i has priority i % 4, so later requests often overtake earlier ones).
void random_load(scheduling_order order) {
  const workload w = random_workload(1200, 11);
  auto params_of = [&](std::size_t i) {
    sampling_params p = greedy_ignoring_eos(w.max_tokens[i]);
    if (order == scheduling_order::priority) p.priority = static_cast<int>(i % 4);
    return p;
  };
  using policy = zipage_policy;
  // Unconstrained: a pool that holds everything, a slot for everyone, no sharing, synchronous compression.
  std::vector<std::vector<token_id>> expected;
  {
    engine<llama_model<cpu_backend>, policy> eng(testing::tiny_llama(), {.block_size = 8, .num_blocks = 4000,
                                                                          .max_num_seqs = 256, .budget_tokens = 16,
                                                                          .window = 4, .num_query_slots = 256,
                                                                          .prefix_caching = false,
                                                                          .async_compression = false});
    for (std::size_t i = 0; i < w.prompts.size(); ++i)
      expected.push_back(eng.generate({w.prompts[i]}, greedy_ignoring_eos(w.max_tokens[i]))[0].output);
  }
  // Tight: 60 blocks, 6 query slots (hybrid), prefix caching, chunked prefill, async compression,
  // arrivals spread over time and random cancellations.
  engine<llama_model<cpu_backend>, policy> eng(testing::tiny_llama(), {.block_size = 8, .num_blocks = 40,
                                                                        .max_num_seqs = 24, .max_batched_tokens = 48,
                                                                        .budget_tokens = 16, .window = 4,
                                                                        .num_query_slots = 8, .scheduling = order});
  std::map<request_id, std::size_t> index_of;
  std::vector<request_id> ids(w.prompts.size(), -1);
  std::size_t next = 0;
  int cancelled = 0;
  for (int step = 0; next < w.prompts.size() || eng.has_unfinished(); ++step) {
    REQUIRE(step < 200000);
    for (; next < w.prompts.size() && w.arrival_step[next] <= step; ++next) {
      ids[next] = eng.add_request(w.prompts[next], params_of(next));
      index_of[ids[next]] = next;
    }
    for (std::size_t i = 0; i < next; ++i)
      if (w.cancel_step[i] == step && eng.cancel(ids[i])) ++cancelled;
    eng.step();
    CHECK(eng.pool().num_used() <= 40);
  }
  int finished = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto out = eng.take_output(ids[i]);
    if (out.reason == finish_reason::cancelled) continue;
    CAPTURE(i);
    REQUIRE(out.reason == finish_reason::length);
    CHECK(out.output == expected[i]);
    ++finished;
  }
  const auto st = eng.stats();
  MESSAGE("finished ", finished, ", cancelled ", cancelled, ", preemptions ", st.preemptions, ", swaps ", st.swaps,
          ", compressions ", st.compressions, ", prefix hit rate ", st.prefix_hit_rate());
  CHECK(cancelled > 0);
  CHECK(st.preemptions > 0);
  CHECK(st.compressions > 0);
  CHECK(st.prefix_hits > 0);
  CHECK(st.peak_running <= 24);
  check_pool_balanced(eng);
}

}  // namespace

TEST_CASE("randomised load: every request finishes or is cancelled cleanly, with the tokens of an unconstrained run") {
  random_load(scheduling_order::fcfs);
}

TEST_CASE("randomised load under priority order: same guarantees, tokens of an unconstrained run") {
  random_load(scheduling_order::priority);
}

TEST_CASE("compressed requests that give way are swapped to host memory and resume with identical tokens") {
  // B = 3 blocks of 8. The older request decodes from a short prompt; the newer one arrives with a
  // 40-token prompt and is compressed right after its prefill. In 7 blocks they cannot both hold their
  // peaks, so whenever the older one needs a block the newer, compressed one is swapped out — never
  // recomputed — and swapped back in later.
  std::vector<std::vector<token_id>> prompts{{0, 4, 9}, {0}};
  for (int j = 0; j < 39; ++j) prompts[1].push_back(1 + (j * 7) % 60);
  const engine_config roomy{.block_size = 8, .num_blocks = 200, .budget_tokens = 24, .window = 4,
                            .num_query_slots = 4, .prefix_caching = false, .async_compression = false};
  engine<llama_model<cpu_backend>, zipage_policy> reference(testing::tiny_llama(), roomy);
  const auto expected = reference.generate(prompts, greedy_ignoring_eos(100));
  for (const bool async : {false, true}) {
    CAPTURE(async);
    engine_config tight = roomy;
    tight.num_blocks = 7;
    tight.async_compression = async;
    engine<llama_model<cpu_backend>, zipage_policy> eng(testing::tiny_llama(), tight);
    const request_id older = eng.add_request(prompts[0], greedy_ignoring_eos(100));
    eng.step();
    const request_id newer = eng.add_request(prompts[1], greedy_ignoring_eos(100));
    eng.run_to_completion();
    const auto st = eng.stats();
    MESSAGE("swaps ", st.swaps, ", preemptions ", st.preemptions, ", compressions ", st.compressions);
    if (!async) {  // with a worker thread, when compactions land (and so who gives way) depends on timing
      CHECK(st.swaps > 0);
      CHECK(st.preemptions == 0);
    }
    CHECK(eng.take_output(older).output == expected[0].output);
    CHECK(eng.take_output(newer).output == expected[1].output);
    check_pool_balanced(eng);
  }
}

TEST_CASE("a request preempted at its compression point is recomputed and compressed at the same point") {
  // B = 2 blocks of 8: a request compresses when its cache reaches 24 tokens. A more urgent request
  // arrives exactly then and takes A's place, so A gives way by recomputation before its compression
  // is planned. Recomputed, A must feed its tokens up to (not including) the last one, compress there as it
  // would have, and only then decode the last token: anything else changes what it keeps and so its tokens.
  // With prefix caching A's own blocks are still cached when it comes back, but the block holding the
  // window queries of that compression must be computed again (the queries are not cached).
  const std::vector<token_id> a_prompt{0, 5, 9, 13, 2, 7, 11, 3, 8, 1};
  std::vector<token_id> b_prompt{0};
  for (int j = 0; j < 16; ++j) b_prompt.push_back(1 + (j * 5) % 60);
  for (const bool caching : {false, true}) {
    CAPTURE(caching);
    // One running place: the urgent request takes it and leaves A's blocks in the pool (and, with prefix
    // caching, findable).
    engine_config cfg{.block_size = 8, .num_blocks = 200, .max_num_seqs = 1, .budget_tokens = 16, .window = 4,
                      .num_query_slots = 1, .prefix_caching = caching, .async_compression = false,
                      .scheduling = scheduling_order::priority};
    sampling_params a_params = greedy_ignoring_eos(40);
    a_params.priority = 5;
    engine<llama_model<cpu_backend>, zipage_policy> reference(testing::tiny_llama(), cfg);
    const auto expected = reference.generate({a_prompt}, a_params)[0];
    const auto ref_stats = reference.stats();

    engine<llama_model<cpu_backend>, zipage_policy> eng(testing::tiny_llama(), cfg);
    const request_id a = eng.add_request(a_prompt, a_params);
    for (int i = 0; i < 100 && !eng.request(a).needs_compression; ++i) eng.step();
    REQUIRE(eng.request(a).needs_compression);
    REQUIRE(eng.request(a).kv_len == 24);
    sampling_params b_params = greedy_ignoring_eos(1);
    b_params.priority = 0;
    const request_id b = eng.add_request(b_prompt, b_params);
    eng.run_to_completion();
    const auto st = eng.stats();
    CHECK(st.preemptions >= 1);
    CHECK(eng.take_output(b).reason == finish_reason::length);
    const auto out = eng.take_output(a);
    CHECK(out.num_preemptions >= 1);
    // The same compressions at the same points: the same tokens evicted, the same tokens generated.
    CHECK(out.num_compressions == expected.num_compressions);
    CHECK(st.tokens_evicted == ref_stats.tokens_evicted);
    CHECK(out.output == expected.output);
    check_pool_balanced(eng);
  }
}

TEST_CASE("cancellation frees a request's blocks and slot at once, wherever it is") {
  engine<llama_model<cpu_backend>, zipage_policy> eng(testing::tiny_llama(), {.block_size = 8, .num_blocks = 40,
                                                                               .budget_tokens = 16, .window = 4,
                                                                               .num_query_slots = 2});
  const auto a = eng.add_request(std::vector<token_id>(20, 3), greedy_ignoring_eos(200));
  const auto b = eng.add_request(std::vector<token_id>(20, 5), greedy_ignoring_eos(200));
  const auto c = eng.add_request(std::vector<token_id>(20, 7), greedy_ignoring_eos(200));  // no slot: hybrid
  for (int i = 0; i < 40; ++i) eng.step();
  const int used = eng.pool().num_used();
  CHECK(eng.stats().slots_in_use == 2);
  CHECK(eng.cancel(a));
  CHECK(eng.pool().num_used() < used);
  CHECK(eng.cancel(c));
  CHECK(eng.cancel(b));
  CHECK_FALSE(eng.has_unfinished());
  check_pool_balanced(eng);
}

TEST_CASE("128 requests sharing a long system prompt: same outputs with and without prefix caching, far fewer blocks") {
  const auto file = gguf::file::open(ZIPAGE_TEST_MODEL);
  const auto tok = spm_tokenizer::from_gguf(file);
  const std::string system =
      "Once upon a time, in a small town, there lived a kind old woman who loved to tell stories to the children. "
      "Every evening they sat by the fire and listened. She told them about brave knights, clever foxes, and "
      "magic trees that could talk. The children loved her very much. One evening, a little boy asked her for ";
  std::vector<std::vector<token_id>> prompts;
  const char* asks[] = {"a story about a dog.", "a story about the sea.", "a funny story.", "a story about a cat."};
  for (int i = 0; i < 128; ++i) prompts.push_back(tok.encode(system + asks[i % 4] + " Number " + std::to_string(i) + ".", true));
  REQUIRE(prompts[0].size() > 80);

  auto run = [&](auto policy, bool sharing) {
    using P = decltype(policy);
    engine<llama_model<cpu_backend>, P> eng(load_llama_gguf(file), {.block_size = 16, .num_blocks = 2048,
                                                                     .max_num_seqs = 128, .max_batched_tokens = 16384,
                                                                     .budget_tokens = 96, .window = 8,
                                                                     .prefix_caching = sharing});
    auto out = eng.generate(prompts, greedy_ignoring_eos(48));
    return std::make_pair(std::move(out), eng.stats());
  };
  for (int with_compression = 0; with_compression < 2; ++with_compression) {
    CAPTURE(with_compression);
    auto [plain, plain_stats] = with_compression ? run(zipage_policy{}, false) : run(full_kv{}, false);
    auto [shared, shared_stats] = with_compression ? run(zipage_policy{}, true) : run(full_kv{}, true);
    for (std::size_t i = 0; i < prompts.size(); ++i) CHECK(shared[i].output == plain[i].output);
    MESSAGE("peak blocks without sharing ", plain_stats.peak_blocks_used, ", with ", shared_stats.peak_blocks_used,
            "; prefix hit rate ", shared_stats.prefix_hit_rate());
    CHECK(shared_stats.prefix_hit_rate() > 0.5);
    if (with_compression) {
      // The first compression un-shares the prefix (copy-on-write), so sharing saves blocks only
      // before it; the saving is smaller, but still there.
      CHECK(shared_stats.compressions > 0);
      CHECK(shared_stats.peak_blocks_used < plain_stats.peak_blocks_used);
    } else {
      CHECK(shared_stats.peak_blocks_used * 2 < plain_stats.peak_blocks_used);
    }
  }
}

namespace {
// Scoring that always fails: every request ends with an error at its first compression.
struct failing_policy : policy_base {
  std::string_view name() const { return "failing"; }
  void score(const score_context&, std::span<float>, std::span<float>) const { fail("scoring failed on purpose"); }
};
}  // namespace

TEST_CASE("a request whose compression fails ends with a finished error event (streams do not wait forever)") {
  for (const bool async : {false, true}) {
    CAPTURE(async);
    engine<llama_model<cpu_backend>, failing_policy> eng(testing::tiny_llama(),
                                                          {.block_size = 8, .num_blocks = 40, .budget_tokens = 16,
                                                           .window = 4, .async_compression = async});
    const request_id a = eng.add_request({0, 5, 9}, greedy_ignoring_eos(60));
    const request_id b = eng.add_request({0, 7}, greedy_ignoring_eos(60));
    std::map<request_id, finish_reason> ended;
    for (int i = 0; i < 500 && eng.has_unfinished(); ++i)
      for (const auto& ev : eng.step())
        if (ev.finished) ended[ev.id] = ev.reason;
    for (const auto& ev : eng.step())  // a failure landed in the last step is reported by the next one
      if (ev.finished) ended[ev.id] = ev.reason;
    CHECK_FALSE(eng.has_unfinished());
    CHECK(ended.size() == 2);
    CHECK(ended[a] == finish_reason::error);
    CHECK(ended[b] == finish_reason::error);
    const auto out = eng.take_output(a);
    CHECK(out.error_message.find("scoring failed on purpose") != std::string::npos);
    check_pool_balanced(eng);
  }
}
