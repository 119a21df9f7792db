// The scheduler on its own: sequences advanced by hand, no model.
#include <doctest/doctest.h>

#include <memory>
#include <vector>

#include "zipage/scheduler/scheduler.hpp"

using namespace zipage;

namespace {

struct fixture {
  block_pool pool;
  fcfs_scheduler sched;
  std::vector<std::unique_ptr<sequence>> seqs;

  fixture(int blocks, scheduler_config cfg) : pool(blocks), sched(cfg, pool) {}

  sequence* add(int prompt_len) {
    auto s = std::make_unique<sequence>();
    s->id = static_cast<request_id>(seqs.size());
    s->tokens.assign(static_cast<std::size_t>(prompt_len), 7);
    s->prompt_len = prompt_len;
    sched.add(s.get());
    seqs.push_back(std::move(s));
    return seqs.back().get();
  }

  // What the engine does after running a plan: every pending token is computed, one token appended.
  static void advance(const step_plan& plan) {
    for (sequence* s : plan.seqs) {
      s->kv_len += s->num_pending();
      s->num_computed = s->num_tokens();
      s->tokens.push_back(9);
    }
  }
};

}  // namespace

TEST_CASE("admission is FCFS and limited by the step token budget") {
  fixture f(100, {.max_num_seqs = 8, .max_batched_tokens = 10, .block_size = 4});
  sequence* a = f.add(4);
  sequence* b = f.add(5);
  sequence* c = f.add(3);
  auto plan = f.sched.schedule();
  CHECK(plan.phase == step_phase::prefill);
  REQUIRE(plan.seqs.size() == 2);  // 4 + 5 fit, + 3 would be 12 > 10
  CHECK(plan.seqs[0] == a);
  CHECK(plan.seqs[1] == b);
  CHECK(plan.num_tokens() == 9);
  fixture::advance(plan);
  plan = f.sched.schedule();  // c is admitted before anyone decodes: prefill first
  REQUIRE(plan.seqs.size() == 1);
  CHECK(plan.seqs[0] == c);
  fixture::advance(plan);
  plan = f.sched.schedule();
  CHECK(plan.phase == step_phase::decode);
  CHECK(plan.seqs.size() == 3);
}

TEST_CASE("admission waits for free blocks and for a free running slot") {
  fixture f(3, {.max_num_seqs = 8, .max_batched_tokens = 100, .block_size = 4});
  f.add(8);  // 2 blocks
  sequence* b = f.add(8);  // 2 more: does not fit in the 1 left
  auto plan = f.sched.schedule();
  REQUIRE(plan.seqs.size() == 1);
  CHECK(f.sched.num_waiting() == 1);
  CHECK(b->status == request_status::waiting);

  fixture g(100, {.max_num_seqs = 1, .max_batched_tokens = 100, .block_size = 4});
  g.add(2);
  g.add(2);
  CHECK(g.sched.schedule().seqs.size() == 1);
}

TEST_CASE("decode preempts the newest request when blocks run out, and it resumes later") {
  fixture f(4, {.max_num_seqs = 8, .max_batched_tokens = 100, .block_size = 4});
  sequence* old_seq = f.add(4);
  sequence* new_seq = f.add(4);
  auto plan = f.sched.schedule();
  REQUIRE(plan.seqs.size() == 2);
  fixture::advance(plan);  // both hold 1 full block and one pending token each
  plan = f.sched.schedule();  // each needs a second block: 2 of 2 free
  CHECK(plan.phase == step_phase::decode);
  CHECK(plan.seqs.size() == 2);
  CHECK(f.pool.num_free() == 0);
  fixture::advance(plan);
  for (int i = 0; i < 3; ++i) {  // fill the second blocks
    plan = f.sched.schedule();
    CHECK(plan.seqs.size() == 2);
    CHECK(plan.preempted.empty());
    fixture::advance(plan);
  }
  // Both now need a third block and none is free: the newest gives way, the oldest continues.
  plan = f.sched.schedule();
  REQUIRE(plan.preempted.size() == 1);
  CHECK(plan.preempted[0] == new_seq);
  REQUIRE(plan.seqs.size() == 1);
  CHECK(plan.seqs[0] == old_seq);
  CHECK(new_seq->status == request_status::waiting);
  CHECK(new_seq->num_computed == 0);
  CHECK(new_seq->kv_len == 0);
  CHECK(new_seq->table.empty());
  CHECK(new_seq->num_preemptions == 1);
  CHECK(f.sched.num_preemptions() == 1);

  // When the old request finishes, the preempted one is prefilled again with all its tokens.
  f.sched.finish(old_seq);
  plan = f.sched.schedule();
  CHECK(plan.phase == step_phase::prefill);
  REQUIRE(plan.seqs.size() == 1);
  CHECK(plan.seqs[0] == new_seq);
  CHECK(plan.num_tokens() == new_seq->num_tokens());
}

TEST_CASE("a lone request that outgrows the pool is rejected instead of looping") {
  fixture f(2, {.max_num_seqs = 8, .max_batched_tokens = 100, .block_size = 4});
  sequence* s = f.add(8);
  auto plan = f.sched.schedule();
  fixture::advance(plan);
  plan = f.sched.schedule();  // needs a third block: preempts itself
  CHECK(plan.phase == step_phase::idle);
  CHECK(plan.preempted.size() == 1);
  plan = f.sched.schedule();  // 9 tokens need 3 blocks > 2 in the pool: can never run
  REQUIRE(plan.rejected.size() == 1);
  CHECK(plan.rejected[0] == s);
  CHECK(f.pool.num_free() == 2);
  CHECK_FALSE(f.sched.has_unfinished());
}

TEST_CASE("removing a running request frees its blocks at once") {
  fixture f(8, {.max_num_seqs = 8, .max_batched_tokens = 100, .block_size = 4});
  sequence* s = f.add(10);
  fixture::advance(f.sched.schedule());
  CHECK(f.pool.num_used() == 3);
  f.sched.remove(s);
  CHECK(f.pool.num_used() == 0);
  CHECK(f.pool.total_references() == 0);
  CHECK(f.sched.num_running() == 0);
}

TEST_CASE("scheduler config is validated") {
  block_pool pool(4);
  CHECK_THROWS_AS(fcfs_scheduler({.max_num_seqs = 0}, pool), zipage::error);
  CHECK_THROWS_AS(fcfs_scheduler({.max_batched_tokens = -1}, pool), zipage::error);
}
