// Host cost of scheduling: planning one step with many running requests, and block pool operations.
// The plan is pure host code that runs every step, so it must stay well under the ~10 ms a decode step
// of a large batch takes on the GPU (target: well under 100 µs for 1,024 running requests).
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include "zipage/scheduler/zipage_scheduler.hpp"

namespace {

using namespace zipage;

// `n` running requests mid-decode, each with a compressed-size cache, under the zipage scheduler.
struct running_set {
  block_pool pool;
  zipage_scheduler sched;
  std::vector<std::unique_ptr<sequence>> seqs;

  explicit running_set(int n)
      : pool(n * 10),
        sched({.max_num_seqs = n, .max_batched_tokens = 2 * n, .geometry = {.block_size = 256, .budget_tokens = 2048, .window = 16}, .compress = true,
               .num_query_slots = n},
              pool) {
    for (int i = 0; i < n; ++i) {
      auto s = std::make_unique<sequence>();
      s->id = i;
      s->tokens.assign(64, 1);
      s->prompt_len = 64;
      sched.add(s.get());
      seqs.push_back(std::move(s));
    }
    while (sched.num_running() < n || sched.num_waiting() > 0) advance(sched.schedule());  // prefill everyone
  }

  // What the engine does after a step; a request at its compression point drops back to the budget
  // at once, so the set stays in steady state however many iterations the benchmark runs.
  void advance(const step_plan& plan) {
    for (const auto& e : plan.batch) {
      sequence& s = *e.seq;
      s.kv_len += e.tokens;
      s.num_computed += e.tokens;
      if (e.samples()) s.tokens.push_back(2);
      if (s.kv_len == 9 * 256) {
        std::vector<block_id> blocks = s.table.take();
        pool.release(blocks.back());
        blocks.pop_back();
        s.table.assign(std::move(blocks));
        s.kv_len = 8 * 256;
        ++s.num_compressions;
      }
    }
  }
};

void plan_decode_step(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  running_set set(n);
  for (auto _ : state) {
    step_plan plan = set.sched.schedule();
    benchmark::DoNotOptimize(plan.batch.data());
    state.PauseTiming();
    set.advance(plan);  // requests move on one token, crossing block boundaries now and then
    state.ResumeTiming();
  }
  state.counters["requests"] = set.sched.num_running();
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(plan_decode_step)->Arg(64)->Arg(256)->Arg(1024)->Unit(benchmark::kMicrosecond);

void pool_allocate_release(benchmark::State& state) {
  block_pool pool(100000);
  std::vector<block_id> blocks(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) {
    for (auto& b : blocks) b = pool.allocate();
    for (block_id b : blocks) pool.release(b);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0) * 2);
}
BENCHMARK(pool_allocate_release)->Arg(1024);

void pool_prefix_lookup(benchmark::State& state) {
  block_pool pool(4096);
  std::vector<token_id> tokens(256, 7);
  std::vector<std::uint64_t> hashes;
  std::uint64_t h = 0;
  for (int i = 0; i < 1024; ++i) {
    const block_id b = pool.allocate();
    h = chain_hash(h, tokens);
    pool.register_block(b, h, tokens, true);
    hashes.push_back(h);
  }
  std::size_t i = 0;
  for (auto _ : state) {
    const auto m = pool.lookup(hashes[i++ % hashes.size()], tokens);
    pool.release(m.block);
    benchmark::DoNotOptimize(m);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(pool_prefix_lookup);

}  // namespace

BENCHMARK_MAIN();
