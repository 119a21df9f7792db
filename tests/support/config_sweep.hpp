#pragma once
// The configuration sweep's engine (test_config_sweep on the CPU, test_cuda_config_sweep on the GPU): a random
// engine configuration per seed (block size, window, budget, pool, running and query-slot limits, hybrid
// admission, prefix caching, async compression, fcfs or priority order, the step's token budget, greedy or seeded
// sampling with penalties, top-p, min-p, stop token ids and log-probabilities drawn per request), each under a
// random open workload with cancellations. Afterwards: every request that was accepted finished (by length, EOS or
// a stop token) or was cancelled, none failed, no block or slot leaked, the engine never looped, and (as_alone)
// every finished request equals the same request's run alone in an unconstrained engine with the same geometry.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "open_load.hpp"
#include "zipage/core/error.hpp"
#include "zipage/engine/engine_config.hpp"
#include "zipage/policy/policies.hpp"
#include "zipage/sampling/sampling_params.hpp"
#include "zipage/scheduler/scheduler.hpp"
#include "zipage/scheduler/zipage_scheduler.hpp"

namespace zipage::testing {

// One configuration and the shape of its workload, drawn from a seed.
struct sweep_case {
  unsigned seed = 0;
  engine_config cfg;
  int max_prompt = 0, max_generated = 0;
  bool sampled = false;

  bool fcfs_scheduler = false;

  static sweep_case draw(unsigned seed, bool full_kv, bool fcfs_scheduler) {
    std::mt19937 rng(seed);
    auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    sweep_case c;
    c.seed = seed;
    c.fcfs_scheduler = fcfs_scheduler;
    const int block_sizes[] = {1, 2, 4, 8, 16};
    const int bs = block_sizes[uniform(0, 4)];
    const int budget_blocks = uniform(1, 6);
    c.max_prompt = uniform(4, 80);
    c.max_generated = uniform(1, 80);
    c.sampled = uniform(0, 1) != 0;
    c.cfg.block_size = bs;
    c.cfg.window = uniform(1, bs);
    c.cfg.budget_tokens = budget_blocks * bs;
    // Tight pools: a few blocks beyond one compressed request; under full KV enough for one whole request.
    c.cfg.num_blocks = uniform(budget_blocks + 2, budget_blocks + 62);
    if (full_kv) {
      const int whole_request = (c.max_prompt + c.max_generated + bs - 1) / bs;
      c.cfg.num_blocks = std::max(c.cfg.num_blocks, whole_request + 2 + uniform(0, 40));
    }
    c.cfg.max_num_seqs = uniform(1, 24);
    c.cfg.num_query_slots = uniform(0, 3) == 0 ? 0 : uniform(1, c.cfg.max_num_seqs);  // 0: the memory plan's
    if (fcfs_scheduler) c.cfg.num_query_slots = c.cfg.max_num_seqs;  // it gives every running request a slot
    if (full_kv) c.cfg.num_query_slots = 0;  // full KV has no query slots (refused: it would ignore them)
    c.cfg.hybrid = uniform(0, 3) != 0;
    c.cfg.prefix_caching = uniform(0, 1) != 0;
    c.cfg.async_compression = uniform(0, 1) != 0;
    c.cfg.scheduling = uniform(0, 1) != 0 && !fcfs_scheduler ? scheduling_order::priority : scheduling_order::fcfs;
    c.cfg.max_batched_tokens = uniform(0, 2) == 0 ? uniform(1, 16) : uniform(16, 256);
    return c;
  }

  // The draw for a policy and scheduler (full KV pools hold a whole request; fcfs gives every request a slot).
  template <class Policy, class Scheduler>
  static sweep_case draw_for(unsigned seed) {
    return draw(seed, std::is_same_v<Policy, full_kv>, std::is_same_v<Scheduler, zipage::fcfs_scheduler>);
  }

  [[nodiscard]] std::string describe(std::string_view policy) const {
    char text[512];
    std::snprintf(text, sizeof text,
                  "seed %u: policy %.*s, %s, block size %d, window %d, budget %d, %d blocks, max_num_seqs %d, %d query "
                  "slots, hybrid %d, prefix caching %d, async compression %d, %s, max_batched_tokens %d; prompts "
                  "<= %d tokens, <= %d generated, %s",
                  seed, static_cast<int>(policy.size()), policy.data(),
                  fcfs_scheduler ? "fcfs_scheduler" : "zipage_scheduler", cfg.block_size, cfg.window, cfg.budget_tokens,
                  cfg.num_blocks, cfg.max_num_seqs, cfg.num_query_slots, cfg.hybrid, cfg.prefix_caching,
                  cfg.async_compression, cfg.scheduling == scheduling_order::priority ? "priority" : "fcfs",
                  cfg.max_batched_tokens, max_prompt, max_generated, sampled ? "sampled" : "greedy");
    return text;
  }
};

struct pending {
  std::vector<token_id> prompt;
  sampling_params params;
};

// What a sweep checks of each finished request besides that it finished: that its tokens, finish reason and
// log-probabilities equal its run alone (a backend whose rows do not depend on the batch: the CPU, the GPU in fp32
// with batch-invariant GEMMs), or nothing more (bf16 on the GPU, where a row's rounding depends on the batch).
enum class sweep_check { as_alone, finishes };

// Runs c's workload of num_requests requests on make(c.cfg, weights), each finished request checked against
// make(unconstrained config, weights) as `check` says; `description` names the configuration in failures.
// make(cfg, weights_seed) returns an engine (a prvalue: engines need not be movable).
template <class MakeEngine>
void run_sweep_case(const sweep_case& c, const std::string& description, long num_requests, MakeEngine&& make,
                    sweep_check check = sweep_check::as_alone) {
  CAPTURE(description);
  std::mt19937 rng(c.seed * 7919u + 1);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<std::vector<token_id>> templates(4);  // shared prefixes, so the prefix cache has work
  for (auto& t : templates) {
    t.resize(static_cast<std::size_t>(uniform(2, c.max_prompt)));
    for (auto& tok : t) tok = uniform(1, 62);
  }
  auto make_request = [&] {
    pending r;
    r.prompt = {0};
    if (rng() % 2) {
      const auto& t = templates[rng() % templates.size()];
      r.prompt.insert(r.prompt.end(), t.begin(), t.end());
    }
    for (int j = uniform(0, c.max_prompt); j > 0; --j) r.prompt.push_back(uniform(1, 62));
    if (static_cast<int>(r.prompt.size()) > c.max_prompt) r.prompt.resize(static_cast<std::size_t>(c.max_prompt));
    r.params.max_tokens = uniform(1, c.max_generated);
    r.params.ignore_eos = uniform(0, 3) != 0;
    r.params.temperature = c.sampled ? 0.8f : 0.0f;
    r.params.top_k = c.sampled ? uniform(0, 10) : 0;
    r.params.seed = rng();
    // The penalties count the output so far, so a recomputed or swapped request must carry it intact.
    if (uniform(0, 2) == 0) r.params.repetition_penalty = 1.0f + static_cast<float>(uniform(1, 10)) / 10.0f;
    if (uniform(0, 2) == 0) r.params.frequency_penalty = static_cast<float>(uniform(-10, 10)) / 10.0f;
    if (uniform(0, 2) == 0) r.params.presence_penalty = static_cast<float>(uniform(-10, 10)) / 10.0f;
    if (c.sampled && uniform(0, 2) == 0) r.params.top_p = static_cast<float>(uniform(5, 10)) / 10.0f;
    if (c.sampled && uniform(0, 2) == 0) r.params.min_p = static_cast<float>(uniform(0, 5)) / 10.0f;
    if (uniform(0, 3) == 0) r.params.stop_token_ids = {uniform(1, 62)};
    r.params.logprobs = uniform(0, 1) != 0;
    if (r.params.logprobs && uniform(0, 2) == 0) r.params.top_logprobs = uniform(1, 5);
    r.params.priority = c.cfg.scheduling == scheduling_order::priority ? uniform(0, 3) : 0;
    return r;
  };

  const unsigned weights = c.seed % 7 + 1;
  engine_config alone = c.cfg;  // the unconstrained reference: each request alone
  alone.num_blocks = 4000;
  alone.max_num_seqs = 4;
  alone.num_query_slots = c.cfg.num_query_slots > 0 ? 4 : 0;  // 0 under full KV, which has none
  alone.hybrid = true;
  alone.prefix_caching = false;
  alone.async_compression = false;
  alone.scheduling = scheduling_order::fcfs;
  alone.max_batched_tokens = 8192;
  auto reference = make(alone, weights);
  auto eng = make(c.cfg, weights);

  std::map<request_id, pending> in_flight;
  std::multimap<long, request_id> cancel_at;
  long added = 0, refused = 0, finished = 0, cancelled = 0, mismatched = 0, failed = 0;
  auto settle = [&](request_id id) {
    const auto it = in_flight.find(id);
    REQUIRE(it != in_flight.end());
    const auto out = eng.take_output(id);
    if (out.reason == finish_reason::cancelled) {
      ++cancelled;
    } else if (out.reason == finish_reason::length || out.reason == finish_reason::eos ||
               out.reason == finish_reason::stop_token) {
      ++finished;
      if (check == sweep_check::finishes) {
        in_flight.erase(it);
        return;
      }
      sampling_params params = it->second.params;
      params.priority = 0;  // alone, a priority orders nothing (and the fcfs reference refuses one)
      const auto expected = reference.generate({it->second.prompt}, params)[0];
      if (out.output != expected.output || out.reason != expected.reason || out.logprobs != expected.logprobs ||
          out.top_logprobs != expected.top_logprobs) {
        ++mismatched;
        CAPTURE(it->second.prompt.size());
        CAPTURE(out.num_preemptions);
        CAPTURE(out.num_compressions);
        CHECK(out.output == expected.output);
        CHECK(out.reason == expected.reason);
        CHECK(out.logprobs == expected.logprobs);  // the CPU backend computes each row alike in any batch
        CHECK(out.top_logprobs == expected.top_logprobs);
      }
    } else {
      ++failed;
      CAPTURE(out.error_message);
      CHECK(out.reason == finish_reason::length);
    }
    in_flight.erase(it);
  };

  long step = 0;
  for (; added < num_requests || eng.has_unfinished(); ++step) {
    const auto st = eng.stats();
    CAPTURE(st.running);
    CAPTURE(st.waiting);
    REQUIRE(step < 400 * num_requests + 2000);  // else the engine loops
    for (int k = uniform(0, 3); k > 0 && added < num_requests && in_flight.size() < 64; --k) {
      pending r = make_request();
      ++added;
      request_id id = -1;
      try {  // a prompt longer than the pool holds is refused at once, by name: not counted as lost
        id = eng.add_request(r.prompt, r.params);
      } catch (const error& e) {
        CHECK(std::string(e.what()).find("KV blocks; the pool has") != std::string::npos);
        ++refused;
        continue;
      }
      if (rng() % 20 == 0) cancel_at.emplace(step + uniform(0, 30), id);
      in_flight.emplace(id, std::move(r));
    }
    testing::cancel_due_and_step(eng, cancel_at, step, in_flight, settle);
    REQUIRE(eng.pool().num_used() <= c.cfg.num_blocks);
  }
  const auto st = eng.stats();
  CHECK(in_flight.empty());  // nothing lost
  CHECK(finished + cancelled + refused == num_requests);
  CHECK(failed == 0);
  CHECK(mismatched == 0);
  CHECK(eng.pool().num_used() == 0);  // nothing leaked
  CHECK(eng.pool().total_references() == 0);
  CHECK(st.running + st.waiting + st.swapped + st.slots_in_use == 0);
}

using sweep_policies = std::tuple<full_kv, streaming_llm, h2o, snapkv, rkv, gkv, zipage_policy>;

// The sweep's loop: ZIPAGE_SWEEP_CONFIGS configurations (default `configs`) of ZIPAGE_SWEEP_REQUESTS requests
// (default `requests`) from seed ZIPAGE_SWEEP_SEED (default 1). Seed s runs policy s % 7 under zipage_scheduler or
// fcfs_scheduler, switching every 7 seeds: run_case.template operator()<Policy, Scheduler>(seed, requests).
template <class RunCase>
void run_sweep(long configs, long requests, RunCase&& run_case) {
  configs = env_or("ZIPAGE_SWEEP_CONFIGS", configs);
  requests = env_or("ZIPAGE_SWEEP_REQUESTS", requests);
  const auto first = static_cast<unsigned>(env_or("ZIPAGE_SWEEP_SEED", 1));
  constexpr std::size_t num_policies = std::tuple_size_v<sweep_policies>;
  auto run_policy = [&]<class Scheduler, std::size_t... I>(unsigned seed, std::index_sequence<I...>) {
    ((seed % num_policies == I
          ? run_case.template operator()<std::tuple_element_t<I, sweep_policies>, Scheduler>(seed, requests)
          : void()),
     ...);
  };
  for (long k = 0; k < configs; ++k) {
    const unsigned seed = first + static_cast<unsigned>(k);
    constexpr auto each_policy = std::make_index_sequence<num_policies>{};
    if ((seed / num_policies) % 2 == 0) run_policy.template operator()<zipage_scheduler>(seed, each_policy);
    else run_policy.template operator()<fcfs_scheduler>(seed, each_policy);
  }
  MESSAGE(configs, " configurations of ", requests, " requests from seed ", first);
}

}  // namespace zipage::testing
