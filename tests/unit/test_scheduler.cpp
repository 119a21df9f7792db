// The scheduler on its own: sequences advanced by hand, no model.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "zipage/scheduler/scheduler.hpp"
#include "zipage/scheduler/zipage_scheduler.hpp"

using namespace zipage;

namespace {

template <class Scheduler>
struct basic_fixture {
  block_pool pool;
  Scheduler sched;
  std::vector<std::unique_ptr<sequence>> seqs;

  basic_fixture(int blocks, scheduler_config cfg) : pool(blocks), sched(cfg, pool) {}

  sequence* add(int prompt_len, token_id fill = 7, int priority = 0) {
    auto s = std::make_unique<sequence>();
    s->id = static_cast<request_id>(seqs.size());
    s->tokens.assign(static_cast<std::size_t>(prompt_len), fill);
    s->prompt_len = prompt_len;
    s->params.priority = priority;
    s->params.max_tokens = 1 << 20;  // requests stop only when a test finishes them
    sched.add(s.get());
    seqs.push_back(std::move(s));
    return seqs.back().get();
  }

  // What the engine does after running a plan: every sampling entry gets token 9, and compressions
  // land at once (kept: B blocks); scheduler.update advances the sequences.
  void advance(const step_plan& plan) {
    step_output out;
    for (const auto& job : plan.compress)
      out.compactions.push_back({job.seq->id, sched.config().geometry.keep_tokens(), {}});
    for (const auto& e : plan.batch)
      if (e.samples()) out.sampled.push_back({9});
    CHECK(sched.update(plan, out).empty());
  }

  // A running request is done (as if it had stopped): it leaves with its blocks and slot.
  void finish(sequence* s) { sched.cancel(s); }
};
using fixture = basic_fixture<fcfs_scheduler>;
using zfixture = basic_fixture<zipage_scheduler>;

}  // namespace

TEST_CASE("admission is FCFS and limited by the step token budget") {
  fixture f(100, {.max_num_seqs = 8, .max_batched_tokens = 10, .geometry = {.block_size = 4}});
  sequence* a = f.add(4);
  sequence* b = f.add(5);
  sequence* c = f.add(3);
  auto plan = f.sched.schedule();
  CHECK(plan.batch[0].tokens > 1);
  REQUIRE(plan.batch.size() == 2);  // 4 + 5 fit, + 3 would be 12 > 10
  CHECK(plan.batch[0].seq == a);
  CHECK(plan.batch[1].seq == b);
  CHECK(plan.num_tokens() == 9);
  f.advance(plan);
  plan = f.sched.schedule();  // c is admitted before anyone decodes: prefill first
  REQUIRE(plan.batch.size() == 1);
  CHECK(plan.batch[0].seq == c);
  f.advance(plan);
  plan = f.sched.schedule();
  CHECK(plan.batch.at(0).tokens == 1);
  CHECK(plan.batch.size() == 3);
}

TEST_CASE("admission waits for free blocks and for a free running slot") {
  fixture f(3, {.max_num_seqs = 8, .max_batched_tokens = 100, .geometry = {.block_size = 4}});
  f.add(8);  // 2 blocks
  sequence* b = f.add(8);  // 2 more: does not fit in the 1 left
  auto plan = f.sched.schedule();
  REQUIRE(plan.batch.size() == 1);
  CHECK(f.sched.num_waiting() == 1);
  CHECK(b->status == request_status::waiting);

  fixture g(100, {.max_num_seqs = 1, .max_batched_tokens = 100, .geometry = {.block_size = 4}});
  g.add(2);
  g.add(2);
  CHECK(g.sched.schedule().batch.size() == 1);
}

TEST_CASE("decode preempts the newest request when blocks run out, and it resumes later") {
  fixture f(4, {.max_num_seqs = 8, .max_batched_tokens = 100, .geometry = {.block_size = 4}});
  sequence* old_seq = f.add(4);
  sequence* new_seq = f.add(4);
  auto plan = f.sched.schedule();
  REQUIRE(plan.batch.size() == 2);
  f.advance(plan);  // both hold 1 full block and one pending token each
  plan = f.sched.schedule();  // each needs a second block: 2 of 2 free
  CHECK(plan.batch.at(0).tokens == 1);
  CHECK(plan.batch.size() == 2);
  CHECK(f.pool.num_free() == 0);
  f.advance(plan);
  for (int i = 0; i < 3; ++i) {  // fill the second blocks
    plan = f.sched.schedule();
    CHECK(plan.batch.size() == 2);
    CHECK(plan.preempted.empty());
    f.advance(plan);
  }
  // Both now need a third block and none is free: the newest gives way, the oldest continues.
  plan = f.sched.schedule();
  REQUIRE(plan.preempted.size() == 1);
  CHECK(plan.preempted[0] == new_seq);
  REQUIRE(plan.batch.size() == 1);
  CHECK(plan.batch[0].seq == old_seq);
  CHECK(new_seq->status == request_status::waiting);
  CHECK(new_seq->num_computed == 0);
  CHECK(new_seq->kv_len == 0);
  CHECK(new_seq->table.empty());
  CHECK(new_seq->num_preemptions == 1);
  CHECK(f.sched.num_preemptions() == 1);

  // When the old request finishes, the preempted one is prefilled again with all its tokens but the last,
  // which it then decodes on its own, as the first time (so it reaches its compression points alike).
  f.finish(old_seq);
  plan = f.sched.schedule();
  CHECK(plan.batch[0].tokens > 1);
  REQUIRE(plan.batch.size() == 1);
  CHECK(plan.batch[0].seq == new_seq);
  CHECK(plan.num_tokens() == new_seq->num_tokens() - 1);
  CHECK_FALSE(plan.batch[0].samples());
  f.advance(plan);
  plan = f.sched.schedule();
  REQUIRE(plan.batch.size() == 1);
  CHECK(plan.batch[0].tokens == 1);
  CHECK(plan.batch[0].samples());
}

TEST_CASE("fcfs: a prompt longer than a step is fed over consecutive prefill steps before anything new") {
  fixture f(100, {.max_num_seqs = 8, .max_batched_tokens = 4, .geometry = {.block_size = 4}});
  sequence* a = f.add(10);
  sequence* b = f.add(3);
  for (const int chunk : {4, 4, 2}) {
    const auto plan = f.sched.schedule();
    REQUIRE(plan.batch.size() == 1);
    CHECK(plan.batch[0].seq == a);
    CHECK(plan.batch[0].tokens == chunk);
    CHECK(plan.batch[0].samples() == (chunk == 2));
    f.advance(plan);
  }
  CHECK(a->num_generated() == 1);
  auto plan = f.sched.schedule();  // then b's prompt, whole
  REQUIRE(plan.batch.size() == 1);
  CHECK(plan.batch[0].seq == b);
  CHECK(plan.batch[0].tokens == 3);
  f.advance(plan);
  plan = f.sched.schedule();  // and both decode
  CHECK(plan.batch.size() == 2);
}

TEST_CASE("fcfs: a request that grew past a step while running is recomputed over several steps, not rejected") {
  // It used to need its whole recomputation in one step, so it was dropped with an error once it had
  // generated more than max_batched_tokens minus its prompt.
  fixture f(5, {.max_num_seqs = 8, .max_batched_tokens = 6, .geometry = {.block_size = 4}});
  sequence* a = f.add(4);
  sequence* b = f.add(4);
  step_plan plan;
  while (b->num_preemptions == 0) {
    plan = f.sched.schedule();
    REQUIRE(plan.rejected.empty());
    f.advance(plan);
  }
  CHECK(b->num_tokens() - 1 > 6);  // its recomputation is longer than a step
  f.finish(a);
  int fed = 0;
  while (b->num_pending() > 1) {
    plan = f.sched.schedule();
    CHECK(plan.rejected.empty());
    REQUIRE(plan.batch.size() == 1);
    CHECK(plan.batch[0].seq == b);
    CHECK(plan.batch[0].tokens <= 6);
    fed += plan.batch[0].tokens;
    f.advance(plan);
  }
  CHECK(fed == b->num_tokens() - 1);
  plan = f.sched.schedule();
  REQUIRE(plan.batch.size() == 1);
  CHECK(plan.batch[0].samples());
}

TEST_CASE("a lone request that outgrows the pool is rejected instead of looping") {
  fixture f(2, {.max_num_seqs = 8, .max_batched_tokens = 100, .geometry = {.block_size = 4}});
  sequence* s = f.add(8);
  auto plan = f.sched.schedule();
  f.advance(plan);
  plan = f.sched.schedule();  // needs a third block: preempts itself
  CHECK(plan.batch.empty());
  CHECK(plan.preempted.size() == 1);
  plan = f.sched.schedule();  // 9 tokens need 3 blocks > 2 in the pool: can never run
  REQUIRE(plan.rejected.size() == 1);
  CHECK(plan.rejected[0] == s);
  CHECK(f.pool.num_free() == 2);
  CHECK_FALSE(f.sched.has_unfinished());
}

TEST_CASE("cancelling a running request frees its blocks at once") {
  fixture f(8, {.max_num_seqs = 8, .max_batched_tokens = 100, .geometry = {.block_size = 4}});
  sequence* s = f.add(10);
  f.advance(f.sched.schedule());
  CHECK(f.pool.num_used() == 3);
  f.sched.cancel(s);
  CHECK(s->status == request_status::finished);
  CHECK(s->reason == finish_reason::cancelled);
  CHECK(f.pool.num_used() == 0);
  CHECK(f.pool.total_references() == 0);
  CHECK(f.sched.num_running() == 0);
}

TEST_CASE("scheduler config is validated") {
  block_pool pool(4);
  CHECK_THROWS_AS(fcfs_scheduler({.max_num_seqs = 0}, pool), zipage::error);
  CHECK_THROWS_AS(fcfs_scheduler({.max_batched_tokens = -1}, pool), zipage::error);
}

// ---- zipage_scheduler ----

TEST_CASE("chunked prefill shares a step with decodes under one token budget") {
  zfixture f(100, {.max_num_seqs = 8, .max_batched_tokens = 8, .geometry = {.block_size = 4}});
  sequence* a = f.add(3);
  auto plan = f.sched.schedule();
  REQUIRE(plan.batch.size() == 1);
  f.advance(plan);
  sequence* b = f.add(20);  // a long prompt arrives while a decodes
  plan = f.sched.schedule();
  REQUIRE(plan.batch.size() == 2);
  CHECK(plan.batch[0].seq == a);
  CHECK(plan.batch[0].tokens == 1);
  CHECK(plan.batch[1].seq == b);
  CHECK(plan.batch[1].tokens == 7);  // the rest of the budget
  CHECK_FALSE(plan.batch[1].samples());
  CHECK(plan.num_tokens() == 8);
  f.advance(plan);
  int steps = 1;
  while (b->num_generated() == 0) {
    plan = f.sched.schedule();
    CHECK(plan.batch.at(0).seq == a);  // a keeps decoding every step
    CHECK(plan.num_tokens() <= 8);
    f.advance(plan);
    ++steps;
  }
  CHECK(steps == 3);  // 20 prompt tokens at 7 per step
  CHECK(b->num_computed == 20);
}

TEST_CASE("query slots go FIFO; in hybrid mode a request without one runs until it must record its window") {
  // B = 2 blocks of 4, W = 2: the window of block 2 (positions 10, 11) is what the first compression reads.
  const scheduler_config cfg{.max_num_seqs = 8, .max_batched_tokens = 64, .geometry = {.block_size = 4, .budget_tokens = 8, .window = 2},
                             .compress = true, .num_query_slots = 1, .hybrid = true};
  zfixture f(100, cfg);
  sequence* a = f.add(3);
  sequence* b = f.add(3);
  auto plan = f.sched.schedule();
  CHECK(plan.batch.size() == 2);
  CHECK(a->query_slot == 0);
  CHECK(b->query_slot == -1);  // admitted without a slot
  CHECK(f.sched.tokens_before_slot_needed(*b, 100) == 10 - b->kv_len);
  f.advance(plan);
  for (int i = 0; i < 12; ++i) f.advance(f.sched.schedule());
  // b stopped right before position 10; a went on.
  CHECK(b->kv_len == 10);
  CHECK(a->is_compressed());  // a, with its slot, went on through its first compression
  plan = f.sched.schedule();
  for (const auto& e : plan.batch) CHECK(e.seq != b);
  // When a finishes, its slot goes to b (FIFO over running requests) and b resumes.
  f.finish(a);
  plan = f.sched.schedule();
  CHECK(b->query_slot == 0);
  REQUIRE(plan.batch.size() == 1);
  CHECK(plan.batch[0].seq == b);
}

namespace {
// Slot holders at the budget, every prompt exactly B blocks (budget 8 tokens, blocks of 4): each holds at most
// B + 1 = 3 blocks, and `leftover` blocks of the pool are beyond the 3 slot holders' 9. Runs `steps` steps of
// 12 such requests and reports what happened.
struct churn_result {
  std::int64_t preemptions = 0;
  int most_running = 0;
  int decoded = 0;    // sampled tokens
  int prefilled = 0;  // tokens fed that sampled nothing: prompts (and their recomputations)
};
churn_result run_at_budget(int leftover, int steps) {
  const scheduler_config cfg{.max_num_seqs = 16, .max_batched_tokens = 64,
                             .geometry = {.block_size = 4, .budget_tokens = 8, .window = 2},
                             .compress = true, .num_query_slots = 3, .hybrid = true};
  zfixture f(3 * 3 + leftover, cfg);
  for (int i = 0; i < 12; ++i) f.add(8);
  churn_result r;
  for (int i = 0; i < steps; ++i) {
    const step_plan plan = f.sched.schedule();
    for (const auto& e : plan.batch) {
      r.decoded += e.samples();
      r.prefilled += e.tokens - e.samples();
    }
    f.advance(plan);
    r.most_running = std::max(r.most_running, f.sched.num_running());
  }
  r.preemptions = f.sched.num_preemptions();
  return r;
}
}  // namespace

TEST_CASE("hybrid mode: a request without a slot starts only in blocks the slot holders will not need next") {
  // Two blocks beyond the slot holders' peaks: a slotless 8-token prompt fits them, but its first decode needs
  // a third, and the slot holders' next blocks are its only source: it would be preempted at once, and again
  // every time it came back (each time after a wasted prefill). It must wait for a slot instead.
  const churn_result tight = run_at_budget(2, 200);
  CHECK(tight.preemptions == 0);
  CHECK(tight.most_running == 3);
  CHECK(tight.prefilled == 3 * 7);  // each slot holder's prompt, once
  CHECK(tight.decoded >= 3 * 200 * 4 / 5 - 3);  // 4 decodes per 5 steps (one compresses), no step lost
  // Room for a whole prompt and a block of decoding beyond the slot holders' peaks: the hybrid mode still
  // uses it.
  const churn_result roomy = run_at_budget(4, 200);
  CHECK(roomy.most_running == 4);
  CHECK(roomy.decoded > tight.decoded);
}

TEST_CASE("hybrid mode: once every slot holder has compressed, nobody is preempted, whatever the prompt length") {
  // The H200 pool's shape at a smaller scale: 60 slots of B + 1 = 9 blocks of 256 and 8 blocks left over (the
  // bf16 pool there is 329 x 9 + 8), then the same budget in blocks of 16. Compactions land a step after they
  // are planned, as with the worker. From the engine's storm of 2026-12-04: prompts at or below the budget
  // were preempted every step before the hybrid admission left the slot holders' next blocks alone.
  for (const int bs : {256, 16})
    for (const int prompt : {128, 1000, 2048, 4096}) {
      CAPTURE(bs);
      CAPTURE(prompt);
      const int slots = 60, most = 2048 / bs + 1;
      const scheduler_config cfg{.max_num_seqs = 160, .max_batched_tokens = 16384,
                                 .geometry = {.block_size = bs, .budget_tokens = 2048, .window = 16},
                                 .compress = true, .num_query_slots = slots, .hybrid = true};
      zfixture f(slots * most + 2048 / bs, cfg);
      for (int i = 0; i < 160; ++i) f.add(prompt);
      std::vector<compression_job> landing;
      std::int64_t at_half = 0;
      const int steps = 4400;  // 128-token prompts reach their first compression after ~2,050 steps
      for (int t = 0; t < steps; ++t) {
        const step_plan plan = f.sched.schedule();
        step_output out;
        for (const auto& job : landing) out.compactions.push_back({job.seq->id, 2048, {}});
        landing = plan.compress;
        for (const auto& e : plan.batch)
          if (e.samples()) out.sampled.push_back({9});
        CHECK(f.sched.update(plan, out).empty());
        if (t == steps / 2) at_half = f.sched.num_preemptions();
      }
      CHECK(f.sched.num_preemptions() == at_half);
      CHECK(f.sched.num_slots_in_use() == slots);
    }
}

TEST_CASE("full KV: a request starts with a block of decoding beyond what the ones ahead will take next, so it is not preempted at once") {
  // A tight pool (24 blocks of 4) and 40 requests of 1-12 prompt tokens and 1-60 new ones: the running ones
  // grow into the pool and the newest give way. Before admission by claim a request preempted for blocks was
  // admitted again into blocks the older ones were about to take, and preempted again within a step or two
  // (1,504 prompt tokens fed for 480 sampled on one such run). Now whoever starts keeps its blocks for at least
  // a block of decoding steps, and every request finishes.
  zfixture f(24, {.max_num_seqs = 16, .max_batched_tokens = 64, .geometry = {.block_size = 4}});
  std::mt19937 rng(3);
  for (int i = 0; i < 40; ++i) {
    sequence* s = f.add(std::uniform_int_distribution<int>(1, 12)(rng));
    s->params.max_tokens = std::uniform_int_distribution<int>(1, 60)(rng);
  }
  std::vector<int> started(40, -1000);
  int steps = 0, prefilled = 0, sampled = 0;
  for (; steps < 5000 && f.sched.has_unfinished(); ++steps) {
    const step_plan plan = f.sched.schedule();
    for (const sequence* p : plan.preempted) CHECK(steps - started[static_cast<std::size_t>(p->id)] >= 4);
    for (const auto& e : plan.batch) {
      if (e.seq->num_computed == 0) started[static_cast<std::size_t>(e.seq->id)] = steps;
      prefilled += e.tokens - e.samples();
      sampled += e.samples();
    }
    f.advance(plan);
  }
  CHECK_FALSE(f.sched.has_unfinished());
  CHECK(prefilled < sampled);  // recomputation stays below the work it protects
  MESSAGE("full KV, tight pool: ", steps, " steps, ", sampled, " sampled, ", prefilled, " prompt tokens fed, ",
          f.sched.num_preemptions(), " preemptions");
}

TEST_CASE("hybrid mode: a recomputed request without a slot stops before the window of the compression it is at") {
  // B = 2 blocks of 4, W = 2. A request recomputed after generating up to 13 tokens (its cache was at 12, a
  // compression point, when it gave way) feeds 12 tokens and compresses there: that compression reads the
  // window of block 2, positions 10 and 11. Without a slot it must stop before them, not at the window
  // of block 3 (which a fresh 13-token prompt would need).
  const scheduler_config cfg{.max_num_seqs = 8, .max_batched_tokens = 64, .geometry = {.block_size = 4, .budget_tokens = 8, .window = 2},
                             .compress = true, .num_query_slots = 1, .hybrid = true};
  zfixture f(100, cfg);
  sequence* s = f.add(5);
  s->tokens.resize(13, 9);  // 8 generated: recomputed from scratch (num_computed 0, no slot)
  CHECK(s->num_to_prefill() == 12);
  CHECK(f.sched.tokens_before_slot_needed(*s, 12) == 10);
  sequence* fresh = f.add(13);
  CHECK(fresh->num_to_prefill() == 13);
  CHECK(f.sched.tokens_before_slot_needed(*fresh, 13) == 13);  // its window (14, 15) lies past its prompt
}

TEST_CASE("without hybrid mode a request waits for a query slot before it starts") {
  const scheduler_config cfg{.max_num_seqs = 8, .max_batched_tokens = 64, .geometry = {.block_size = 4, .budget_tokens = 8, .window = 2},
                             .compress = true, .num_query_slots = 1, .hybrid = false};
  zfixture f(100, cfg);
  f.add(3);
  sequence* b = f.add(3);
  const auto plan = f.sched.schedule();
  CHECK(plan.batch.size() == 1);
  CHECK(b->status == request_status::waiting);
}

TEST_CASE("a compressed request that must give way is swapped out, then swapped back before new admissions") {
  // B = 1 block of 4: a compressed request holds 1 to 2 blocks. The pool has 3.
  const scheduler_config cfg{.max_num_seqs = 8, .max_batched_tokens = 64, .geometry = {.block_size = 4, .budget_tokens = 4, .window = 2},
                             .compress = true, .num_query_slots = 4};
  zfixture f(3, cfg);
  sequence* x = f.add(2);  // older, uncompressed for a while
  sequence* c = f.add(7);  // newer, compressed after its first decode
  int swapped_out = 0;
  for (int i = 0; i < 50 && swapped_out == 0; ++i) {
    const auto plan = f.sched.schedule();
    for (const auto& job : plan.swap_out) {
      ++swapped_out;
      CHECK(job.seq == c);
      CHECK(job.seq->is_compressed());  // never recomputed: its evicted tokens are gone
      CHECK(job.pages.size() <= 2);     // at most B + 1 blocks travel
      CHECK(job.slot >= 0);             // and its window queries
      CHECK(job.seq->table.empty());
      CHECK(job.seq->query_slot == -1);
      CHECK(job.seq->status == request_status::swapped);
    }
    f.advance(plan);
  }
  REQUIRE(swapped_out == 1);
  CHECK(f.sched.num_swapped() == 1);
  CHECK(f.sched.num_swaps() == 1);
  // A new arrival must not overtake the swapped request.
  sequence* late = f.add(2);
  auto plan = f.sched.schedule();
  CHECK(late->status == request_status::waiting);
  f.advance(plan);
  f.finish(x);
  plan = f.sched.schedule();
  REQUIRE(plan.swap_in.size() == 1);
  CHECK(plan.swap_in[0] == c);
  CHECK(c->status == request_status::running);
  CHECK(c->query_slot >= 0);
  CHECK(c->table.num_blocks() == blocks_for_tokens(c->kv_len + 1, 4));
  CHECK(late->status == request_status::running);  // admitted once nobody is left outside
}

TEST_CASE("prefix caching: a later request reuses full prompt blocks, never the one holding its last token") {
  zfixture f(32, {.max_num_seqs = 8, .max_batched_tokens = 64, .geometry = {.block_size = 4}, .prefix_caching = true});
  sequence* a = f.add(10, 3);
  f.advance(f.sched.schedule());  // a's two full blocks are registered
  sequence* b = f.add(10, 3);
  auto plan = f.sched.schedule();
  CHECK(b->num_prefix_hit_tokens == 8);
  CHECK(b->table.blocks()[0] == a->table.blocks()[0]);
  CHECK(b->table.blocks()[1] == a->table.blocks()[1]);
  CHECK(b->table.blocks()[2] != a->table.blocks()[2]);
  CHECK(f.pool.ref_count(a->table.blocks()[0]) == 2);
  bool b_prefilled = false;
  for (const auto& e : plan.batch)
    if (e.seq == b) b_prefilled = e.tokens == 2;  // only the last 2 prompt tokens are computed
  CHECK(b_prefilled);
  sequence* c = f.add(8, 3);  // all full blocks, but the last token's block is computed anyway
  f.advance(plan);
  f.sched.schedule();
  CHECK(c->num_prefix_hit_tokens == 4);
}

TEST_CASE("first compression of a request sharing its prefix copies the shared blocks first") {
  const scheduler_config cfg{.max_num_seqs = 8, .max_batched_tokens = 64, .geometry = {.block_size = 4, .budget_tokens = 8, .window = 2},
                             .compress = true, .num_query_slots = 4, .prefix_caching = true};
  zfixture f(40, cfg);
  sequence* a = f.add(9, 5);
  f.advance(f.sched.schedule());
  sequence* b = f.add(9, 5);
  step_plan plan;
  while (plan.compress.empty()) {
    plan = f.sched.schedule();
    if (plan.compress.empty()) f.advance(plan);
  }
  const auto& job = plan.compress[0];
  CHECK(job.seq == a);  // a reached 12 tokens first
  REQUIRE(job.copies.size() == 2);  // its two prompt blocks are shared with b
  for (const auto& c : job.copies) {
    CHECK(f.pool.ref_count(c.from) == 1);  // only b holds the originals now
    CHECK(f.pool.ref_count(c.to) == 1);
    CHECK(std::find(b->table.blocks().begin(), b->table.blocks().end(), c.from) != b->table.blocks().end());
  }
  for (block_id blk : a->table.blocks()) CHECK_FALSE(f.pool.is_registered(blk));  // compaction will rewrite them
  CHECK(a->compressing);
  for (const auto& e : plan.batch) CHECK(e.seq != a);
}

TEST_CASE("a compression whose shared blocks stop being shared once a sharer gives way needs no copies, and does not evict itself") {
  // a's prompt blocks are shared with b, and the pool is full when a reaches its compression point: the
  // copies it would need (2) cannot be made, but once b gives way nothing is shared any more. Counting the
  // copies once, before b left, made a give way too, and both went round again (a livelock: the engine ran
  // 40,000 prefill steps with two requests running).
  const scheduler_config cfg{.max_num_seqs = 8, .max_batched_tokens = 64, .geometry = {.block_size = 4, .budget_tokens = 8, .window = 2},
                             .compress = true, .num_query_slots = 4, .prefix_caching = true};
  zfixture f(4, cfg);
  sequence* a = f.add(9, 5);
  f.advance(f.sched.schedule());
  sequence* b = f.add(9, 5);
  step_plan plan;
  for (int step = 0; step < 8 && plan.compress.empty(); ++step) {
    plan = f.sched.schedule();
    CHECK(std::find(plan.preempted.begin(), plan.preempted.end(), a) == plan.preempted.end());
    if (plan.compress.empty()) f.advance(plan);
  }
  REQUIRE(plan.compress.size() == 1);
  const auto& job = plan.compress[0];
  CHECK(job.seq == a);
  CHECK(job.copies.empty());  // b gave way, so a's blocks are its own
  CHECK(std::find(plan.preempted.begin(), plan.preempted.end(), b) != plan.preempted.end());
  for (block_id blk : a->table.blocks()) CHECK(f.pool.ref_count(blk) == 1);
  f.advance(plan);
  CHECK_FALSE(a->compressing);
  CHECK(a->kv_len == 8);
  const std::size_t length = a->tokens.size();
  for (int step = 0; step < 20; ++step) f.advance(f.sched.schedule());  // and a goes on decoding
  CHECK(a->num_preemptions == 0);
  CHECK(a->tokens.size() > length + 10);
}

TEST_CASE("a slot freed by a request that gave way goes to a running request waiting for one, not back to it") {
  // One slot. b holds it; a, more urgent, started without it and waits for it at its window. b then needs a
  // block that only a holds, so b gives way (nothing behind it can). b came back at once and took the slot
  // again, and the two went round for ever (a livelock: 60,000 prefill steps with two requests running).
  const scheduler_config cfg{.max_num_seqs = 8, .max_batched_tokens = 64,
                             .geometry = {.block_size = 4, .budget_tokens = 8, .window = 2}, .compress = true,
                             .num_query_slots = 1, .order = scheduling_order::priority};
  zfixture f(5, cfg);
  sequence* b = f.add(4, 6, 1);
  f.advance(f.sched.schedule());
  sequence* a = f.add(12, 5, 0);
  for (int step = 0; step < 40 && a->num_compressions == 0; ++step) f.advance(f.sched.schedule());
  CHECK(a->num_compressions == 1);
  CHECK(a->num_preemptions == 0);
  CHECK(b->num_preemptions <= 1);
}

TEST_CASE("a request that filled the pool and gave way just before its first compression is not rejected when it comes back") {
  // Its prompt fills the pool; it gives way at its compression point (an urgent request arrives). Recomputed,
  // it is compressed after its second to last token, so its last one never needs a block of its own; counting
  // it rejected the request.
  const scheduler_config cfg{.max_num_seqs = 8, .max_batched_tokens = 64,
                             .geometry = {.block_size = 4, .budget_tokens = 4, .window = 2}, .compress = true,
                             .num_query_slots = 2, .order = scheduling_order::priority};
  zfixture f(5, cfg);
  sequence* a = f.add(20, 5, 1);
  f.advance(f.sched.schedule());
  REQUIRE(a->needs_compression);
  sequence* urgent = f.add(8, 6, 0);
  step_plan plan = f.sched.schedule();
  CHECK(a->num_preemptions == 1);
  CHECK(plan.rejected.empty());
  f.advance(plan);
  f.finish(urgent);
  for (int step = 0; step < 10 && a->num_compressions == 0; ++step) {
    plan = f.sched.schedule();
    CHECK(plan.rejected.empty());
    f.advance(plan);
  }
  CHECK(a->reason == finish_reason::none);
  CHECK(a->num_compressions == 1);
}

TEST_CASE("priority order: the most urgent waiting request starts first; less urgent running ones give way") {
  // Two batch requests (priority 5) fill the pool: 7-token prompts, started with room for a block of decoding
  // each (their claims), then grown into it; an urgent one (priority 0) arrives.
  for (const auto order : {scheduling_order::fcfs, scheduling_order::priority}) {
    CAPTURE(static_cast<int>(order));
    zfixture f(6, {.max_num_seqs = 8, .max_batched_tokens = 100, .geometry = {.block_size = 4}, .prefix_caching = false,
                   .order = order});
    sequence* old_low = f.add(7, 7, 5);
    sequence* new_low = f.add(7, 7, 5);
    auto plan = f.sched.schedule();
    REQUIRE(plan.batch.size() == 2);
    f.advance(plan);
    for (int i = 0; i < 2; ++i) {  // tokens 8 and 9: the second takes each one's third block
      plan = f.sched.schedule();
      CHECK(plan.batch.size() == 2);
      f.advance(plan);
    }
    CHECK(f.pool.num_free() == 0);
    sequence* urgent = f.add(4, 7, 0);
    plan = f.sched.schedule();
    if (order == scheduling_order::fcfs) {
      CHECK(plan.preempted.empty());
      CHECK(urgent->status == request_status::waiting);
    } else {
      REQUIRE(plan.preempted.size() == 1);
      CHECK(plan.preempted[0] == new_low);  // the least urgent, and of those the newest
      CHECK(urgent->status == request_status::running);
      CHECK(std::any_of(plan.batch.begin(), plan.batch.end(), [&](const scheduled_seq& e) { return e.seq == urgent; }));
      CHECK(old_low->status == request_status::running);
      // The preempted request waits behind nothing more urgent than itself, and comes back when room frees up.
      f.advance(plan);
      f.finish(urgent);
      f.finish(old_low);
      plan = f.sched.schedule();
      CHECK(std::any_of(plan.batch.begin(), plan.batch.end(), [&](const scheduled_seq& e) { return e.seq == new_low; }));
    }
  }
}

TEST_CASE("priority order, hybrid mode: an urgent request starts without a slot at once, and the next slot is its") {
  // Three batch slot holders (priority 5) at the budget, two blocks left over: an urgent prompt (priority 0) fits
  // them but not with a block of decoding. No one runs ahead of it, so it claims nothing and starts without a
  // slot; when it needs a block a less urgent slot holder gives way, and the slot that frees comes to it.
  const scheduler_config cfg{.max_num_seqs = 16, .max_batched_tokens = 64,
                             .geometry = {.block_size = 4, .budget_tokens = 8, .window = 2},
                             .compress = true, .num_query_slots = 3, .hybrid = true,
                             .order = scheduling_order::priority};
  zfixture f(3 * 3 + 2, cfg);
  for (int i = 0; i < 3; ++i) f.add(8, 7, 5);
  for (int i = 0; i < 10; ++i) f.advance(f.sched.schedule());  // all three decoding, compressed at least once
  sequence* urgent = f.add(8, 7, 0);
  f.advance(f.sched.schedule());
  CHECK(urgent->status == request_status::running);
  for (int i = 0; i < 3 && urgent->query_slot < 0; ++i) {
    CHECK(urgent->status == request_status::running);
    f.advance(f.sched.schedule());
  }
  CHECK(urgent->query_slot >= 0);
  CHECK(f.sched.num_swaps() >= 1);  // a compressed slot holder gave way
}

TEST_CASE("priority order: the waiting queue is ordered by priority, then arrival; ties stay FIFO") {
  zfixture f(100, {.max_num_seqs = 1, .max_batched_tokens = 100, .geometry = {.block_size = 4}, .prefix_caching = false,
                   .order = scheduling_order::priority});
  std::vector<sequence*> seqs;
  for (const int p : {3, 1, 2, 1, 0}) seqs.push_back(f.add(4, 7, p));
  // One running place: each request runs alone until finished, in (priority, arrival) order.
  std::vector<sequence*> served;
  for (int i = 0; i < 5; ++i) {
    const auto plan = f.sched.schedule();
    REQUIRE(plan.batch.size() == 1);
    served.push_back(plan.batch[0].seq);
    f.finish(plan.batch[0].seq);
  }
  CHECK(served == std::vector<sequence*>{seqs[4], seqs[1], seqs[3], seqs[2], seqs[0]});
}

TEST_CASE("fcfs_scheduler refuses priority order with a clear error") {
  block_pool pool(8);
  CHECK_THROWS_WITH(fcfs_scheduler({.order = scheduling_order::priority}, pool),
                    doctest::Contains("use zipage_scheduler for priority order"));
}

TEST_CASE("update: lengths and tokens advance, requests stop by the stop rules, compression points are marked, compactions land") {
  // B = 2 blocks of 4, W = 2; EOS 3, an extra end-of-turn 4, a context of 40 tokens.
  scheduler_config cfg{.max_num_seqs = 8, .max_batched_tokens = 64, .geometry = {.block_size = 4, .budget_tokens = 8, .window = 2},
                       .compress = true, .num_query_slots = 8};
  cfg.stop = {3, {4}, 40};
  zfixture f(100, cfg);
  sequence* eos = f.add(3);
  sequence* extra = f.add(3);
  sequence* stop_token = f.add(3);
  sequence* stop_string = f.add(3);
  sequence* max_tokens = f.add(3);
  sequence* ignore = f.add(3);
  sequence* grows = f.add(11);  // reaches 12 = (B + 1) blocks of 4: a compression point
  stop_token->params.stop_token_ids = {5};
  max_tokens->params.max_tokens = 1;
  ignore->params.ignore_eos = true;
  auto plan = f.sched.schedule();
  REQUIRE(plan.batch.size() == 7);
  step_output out;
  out.sampled = {{3}, {4}, {5}, {6, "z"}, {7}, {3}, {8}};
  CHECK(f.sched.update(plan, out).empty());
  CHECK(eos->reason == finish_reason::eos);
  CHECK(extra->reason == finish_reason::eos);
  CHECK(stop_token->reason == finish_reason::stop_token);
  CHECK(stop_string->reason == finish_reason::stop_string);
  CHECK(max_tokens->reason == finish_reason::length);
  for (const sequence* s : {eos, extra, stop_token, stop_string, max_tokens}) {
    CHECK(s->is_finished());
    CHECK(s->table.empty());
    CHECK(s->query_slot == -1);
    CHECK(s->num_tokens() == 4);  // the stopping token is kept
  }
  CHECK_FALSE(ignore->is_finished());  // EOS ignored
  CHECK(ignore->kv_len == 3);
  CHECK(ignore->num_tokens() == 4);
  CHECK(grows->kv_len == 11);
  CHECK_FALSE(grows->needs_compression);
  plan = f.sched.schedule();
  out.sampled = {{9}, {9}};
  f.sched.update(plan, out);
  CHECK(grows->kv_len == 12);
  CHECK(grows->needs_compression);  // B + 1 full blocks at a block boundary
  plan = f.sched.schedule();
  REQUIRE(plan.compress.size() == 1);
  CHECK(grows->compressing);
  // The compaction lands through update: the table shrinks to the new length; the tail goes back.
  const int used = f.pool.num_used();
  out.sampled = {{9}};
  out.compactions = {{grows->id, 8, {}}};
  CHECK(f.sched.update(plan, out).empty());
  CHECK_FALSE(grows->compressing);
  CHECK(grows->kv_len == 8);
  CHECK(grows->table.num_blocks() == 2);
  CHECK(f.pool.num_used() == used - 1);
  CHECK(f.sched.num_compressions() == 1);
  CHECK(f.sched.num_tokens_evicted() == 4);
  // A failed compaction ends its request with an error; a request stops at the model's context (length).
  std::vector<request_id> failed;
  for (int i = 0; i < 100 && f.sched.has_unfinished(); ++i) {
    plan = f.sched.schedule();
    out.sampled.assign(plan.batch.size(), {9});
    out.compactions.clear();
    for (const auto& job : plan.compress)
      out.compactions.push_back({job.seq->id, 8, job.seq == grows ? "boom" : ""});
    for (request_id id : f.sched.update(plan, out)) failed.push_back(id);
  }
  CHECK(failed == std::vector<request_id>{grows->id});
  CHECK(grows->reason == finish_reason::error);
  CHECK(grows->error_message == "compression failed: boom");
  CHECK(grows->table.empty());
  CHECK(ignore->reason == finish_reason::length);
  CHECK(ignore->num_tokens() == 40);
  CHECK(ignore->is_compressed());
  CHECK(f.pool.num_used() == 0);
}

TEST_CASE("update: stop_reason is vLLM's: the stop token's id or the stop string; none for the model's EOS or length") {
  // EOS 3, an extra end-of-turn 4. Each request stops on its first sampled token.
  for (const token_id default_eos : {-1, 4}) {
    CAPTURE(default_eos);
    scheduler_config cfg{.max_num_seqs = 8, .max_batched_tokens = 64, .geometry = {.block_size = 4}};
    cfg.stop = {3, {4}, 0, default_eos};  // default_eos 4: the tokenizer's EOS is the extra id, not the config's
    fixture f(100, cfg);
    sequence* eos = f.add(3);
    sequence* extra = f.add(3);
    sequence* stop_token = f.add(3);
    sequence* stop_string = f.add(3);
    sequence* max_tokens = f.add(3);
    sequence* named_eos = f.add(3);  // ignore_eos, and EOS named as a stop token id: vLLM reports its id
    sequence* eos_listed = f.add(3);  // EOS also among its stop ids, EOS not ignored: still the model's EOS
    stop_token->params.stop_token_ids = {5};
    stop_string->params.stop = {"xy", "z"};
    max_tokens->params.max_tokens = 1;
    named_eos->params.ignore_eos = true;
    named_eos->params.stop_token_ids = {3};
    eos_listed->params.stop_token_ids = {3, 4};
    auto plan = f.sched.schedule();
    REQUIRE(plan.batch.size() == 7);
    step_output out;
    out.sampled = {{3}, {4}, {5}, {6, "z"}, {7}, {3}, {3}};
    CHECK(f.sched.update(plan, out).empty());
    // As the server writes it: the id, the string in quotes, or null.
    auto shown = [](const stopped_by& r) -> std::string {
      if (const auto* id = std::get_if<token_id>(&r)) return std::to_string(*id);
      if (const auto* text = std::get_if<std::string>(&r)) return '"' + *text + '"';
      return "null";
    };
    const bool tokenizer_eos = default_eos == 4;
    CHECK(eos->reason == finish_reason::eos);
    CHECK(shown(eos->stop_reason) == (tokenizer_eos ? "3" : "null"));
    CHECK(shown(extra->stop_reason) == (tokenizer_eos ? "null" : "4"));
    CHECK(shown(stop_token->stop_reason) == "5");
    CHECK(stop_string->reason == finish_reason::stop_string);
    CHECK(shown(stop_string->stop_reason) == "\"z\"");
    CHECK(max_tokens->reason == finish_reason::length);
    CHECK(shown(max_tokens->stop_reason) == "null");
    CHECK(named_eos->reason == finish_reason::stop_token);
    CHECK(shown(named_eos->stop_reason) == "3");
    CHECK(eos_listed->reason == finish_reason::stop_token);
    CHECK(shown(eos_listed->stop_reason) == (tokenizer_eos ? "3" : "null"));
  }
}
