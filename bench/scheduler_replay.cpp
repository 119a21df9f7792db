// zipage-scheduler-replay: a workload through zipage_scheduler alone, no model, at any pool shape. What a
// scheduler change does to preemptions, swaps and recomputed prefill before any device time is spent on it:
// a step here is exact host planning; only the model is replaced (every sample is a token that stops nothing,
// every compaction keeps the budget and lands `--compaction-delay` steps after it was planned, as the worker's).
//
//   zipage-scheduler-replay --pool-blocks 2969 --prompt-len 2048                 # the H200 bf16 pool, prompts at the budget
//   zipage-scheduler-replay --pool-blocks 47504 --block-size 16 --prompt-len 64:4096 --output-len 512:16384
//   zipage-scheduler-replay --full --pool-blocks 5987 --output-len 16384 --steps 18470   # full KV, the FP8 pool
//
// Prints one line per run: steps, sampled tokens, prompt tokens fed (prompts and their recomputations), the
// preemptions over the run and over its second half, swaps, compressions, the most requests running at once.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../examples/common/number_flags.hpp"
#include "zipage/scheduler/zipage_scheduler.hpp"

namespace {

// "N" or "MIN:MAX" (uniform), checked.
struct length_range {
  int lo = 0, hi = 0;
};

length_range parse_range(const std::string& text, const char* flag) {
  length_range r;
  const auto colon = text.find(':');
  try {
    std::size_t used = 0;
    r.lo = std::stoi(text.substr(0, colon), &used);
    if (used != (colon == std::string::npos ? text.size() : colon)) throw std::invalid_argument(text);
    r.hi = r.lo;
    if (colon != std::string::npos) {
      r.hi = std::stoi(text.substr(colon + 1), &used);
      if (used != text.size() - colon - 1) throw std::invalid_argument(text);
    }
  } catch (const std::exception&) {
    zipage::fail(flag, ": expected a token count N or a range MIN:MAX, got '", text, "'");
  }
  zipage::check(r.lo >= 1 && r.hi >= r.lo, flag, ": expected 1 <= MIN <= MAX, got '", text, "'");
  return r;
}

struct options {
  int pool_blocks = 2969;  // the H200's bf16 pool for Qwen3-8B at blocks of 256 (zipage-bench, 2026-12-04)
  int block_size = zipage::reference_block_size;
  int budget = zipage::default_budget_tokens;
  int window = zipage::default_window;
  int slots = 0;  // 0: pool / (B + 1), as the engine sizes them
  int max_num_seqs = 1024;
  int max_batched_tokens = 16384;
  int requests = 1024;  // waiting at the start; --refill keeps this many waiting
  bool refill = false;
  bool no_hybrid = false;
  bool full = false;  // no compression: every request keeps its whole cache (full KV)
  int steps = 6000;
  int compaction_delay = 1;
  int compactions_per_step = 0;  // 0: no limit
  std::string prompt_len = "128";
  std::string output_len = "16384";
  unsigned seed = 1;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace zipage;
  options o;
  CLI::App app{"zipage-scheduler-replay: a workload through zipage_scheduler alone, at any pool shape"};
  app.add_option("--pool-blocks", o.pool_blocks, "KV blocks in the pool")->check(zipage_cli::positive_count());
  app.add_option("--block-size", o.block_size, "tokens per block")->check(zipage_cli::positive_count());
  app.add_option("--budget", o.budget, "tokens a compressed request keeps")->check(zipage_cli::positive_count());
  app.add_option("--window", o.window, "W: recent queries that score the cache")->check(zipage_cli::positive_count());
  app.add_option("--slots", o.slots, "query slots (0: pool / (B + 1), as the engine)")->check(zipage_cli::count());
  app.add_option("--max-num-seqs", o.max_num_seqs)->check(zipage_cli::positive_count());
  app.add_option("--max-batched-tokens", o.max_batched_tokens)->check(zipage_cli::positive_count());
  app.add_option("--requests", o.requests, "requests waiting at the start")->check(zipage_cli::positive_count());
  app.add_flag("--refill", o.refill, "keep --requests waiting: a new one arrives for each that starts");
  app.add_flag("--no-hybrid", o.no_hybrid, "requests without a query slot wait");
  app.add_flag("--full", o.full, "full KV: no compression, no query slots");
  app.add_option("--steps", o.steps)->check(zipage_cli::positive_count());
  app.add_option("--compaction-delay", o.compaction_delay, "steps from a compression's plan to its landing")
      ->check(zipage_cli::count());
  app.add_option("--compactions-per-step", o.compactions_per_step, "compactions that land in one step at most (0: all)")
      ->check(zipage_cli::count());
  app.add_option("--prompt-len", o.prompt_len, "N or MIN:MAX (uniform)");
  app.add_option("--output-len", o.output_len, "N or MIN:MAX (uniform): tokens a request generates");
  app.add_option("--seed", o.seed);
  CLI11_PARSE(app, argc, argv);

  try {
    const length_range prompts = parse_range(o.prompt_len, "--prompt-len");
    const length_range outputs = parse_range(o.output_len, "--output-len");
    const cache_geometry geometry{.block_size = o.block_size, .budget_tokens = o.budget, .window = o.window};
    geometry.validate("--");
    const int slots = o.full ? 0 : o.slots > 0 ? o.slots : o.pool_blocks / (geometry.budget_blocks() + 1);
    check(o.full || slots > 0, "--pool-blocks ", o.pool_blocks, " holds no compressed request (",
          geometry.budget_blocks() + 1, " blocks each)");
    const scheduler_config cfg{.max_num_seqs = o.max_num_seqs, .max_batched_tokens = o.max_batched_tokens,
                               .geometry = geometry, .compress = !o.full, .num_query_slots = slots,
                               .hybrid = !o.no_hybrid};
    block_pool pool(o.pool_blocks);
    zipage_scheduler sched(cfg, pool);

    std::mt19937 rng(o.seed);
    std::vector<std::unique_ptr<sequence>> seqs;
    const auto arrive = [&] {
      auto s = std::make_unique<sequence>();
      s->id = static_cast<request_id>(seqs.size());
      const int p = std::uniform_int_distribution<int>(prompts.lo, prompts.hi)(rng);
      s->tokens.assign(static_cast<std::size_t>(p), 7);
      s->prompt_len = p;
      s->params.max_tokens = std::uniform_int_distribution<int>(outputs.lo, outputs.hi)(rng);
      sched.add(s.get());
      seqs.push_back(std::move(s));
    };
    for (int i = 0; i < o.requests; ++i) arrive();

    // Planned compactions, oldest first, with the step each was planned at: they land `compaction_delay` steps
    // later, at most `compactions_per_step` a step (the worker compacts one bounded batch at a time).
    std::deque<std::pair<int, request_id>> landing;
    std::int64_t sampled = 0, fed = 0, preempted_at_half = 0;
    int most_running = 0, steps = 0, idle = 0;  // idle: steps that fed no token
    for (; steps < o.steps && sched.has_unfinished(); ++steps) {
      const step_plan plan = sched.schedule();
      step_output out;
      for (const auto& job : plan.compress) landing.emplace_back(steps, job.seq->id);
      while (!landing.empty() && landing.front().first + o.compaction_delay <= steps &&
             (o.compactions_per_step == 0 || std::ssize(out.compactions) < o.compactions_per_step)) {
        out.compactions.push_back({landing.front().second, geometry.keep_tokens(), {}});
        landing.pop_front();
      }
      idle += plan.batch.empty();
      for (const auto& e : plan.batch) {
        fed += e.tokens;
        if (e.samples()) out.sampled.push_back({9});
      }
      sampled += static_cast<std::int64_t>(out.sampled.size());
      for (const auto& id : sched.update(plan, out)) fail("request ", id, "'s compaction failed");
      most_running = std::max(most_running, sched.num_running());
      if (steps == o.steps / 2) preempted_at_half = sched.num_preemptions();
      if (o.refill)
        while (sched.num_waiting() < o.requests) arrive();
    }
    std::int64_t finished = 0;
    for (const auto& s : seqs) finished += s->is_finished();
    std::printf(
        "pool %d blocks of %d, budget %d, %d query slots%s%s; prompts %s, outputs %s: %d steps, %lld tokens sampled, "
        "%lld prompt tokens fed (first prefills and recomputations), %lld preemptions (%lld in the second half), %lld swaps, "
        "%lld compressions, %d running at most, %d steps fed no token, %lld of %zu requests finished\n",
        o.pool_blocks, o.block_size, o.budget, slots, o.no_hybrid ? " (no hybrid)" : "",
        o.full ? ", full KV" : "", o.prompt_len.c_str(),
        o.output_len.c_str(), steps, static_cast<long long>(sampled), static_cast<long long>(fed - sampled),
        static_cast<long long>(sched.num_preemptions()),
        static_cast<long long>(sched.num_preemptions() - preempted_at_half), static_cast<long long>(sched.num_swaps()),
        static_cast<long long>(sched.num_compressions()), most_running, idle, static_cast<long long>(finished), seqs.size());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zipage-scheduler-replay: error: %s\n", e.what());
    return 1;
  }
}
