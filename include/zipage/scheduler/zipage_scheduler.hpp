#pragma once
// The Zipage scheduler: the policies that let one engine hold hundreds of long-thinking requests.
//  - Query slots are handed FIFO to running requests at the start of every step. In hybrid mode a
//    request without a slot still runs, with full KV in leftover blocks, until it would have to record
//    the window queries of the block at which it will be compressed; then it waits for a slot.
//  - Each step first serves running requests oldest first (a decode token, or the next chunk of a
//    prompt), then admits waiting ones FIFO, all under one token budget: prefill chunks and decodes
//    share a step, so a long prompt never stalls decoding. A request that would start without a slot
//    (and under full KV every one) starts only on a claim: room for its prompt and a block of decoding
//    beside what the running requests ahead of it take next (scheduler_base::claim_fits), so it is not
//    admitted only to give way within steps.
//  - Compressions are planned here (copy-on-write of shared prefix blocks first).
//  - When blocks run out, newer requests give way: uncompressed ones by recomputation, compressed ones
//    by swapping to host memory; swapped requests come back before any new admission.
//  - scheduling_order::priority orders every queue by (priority, arrival) instead of arrival, and the
//    most urgent waiting request makes less urgent running ones give way when it cannot start.
//    "Oldest"/"newest" below then read "most"/"least urgent".
#include <algorithm>

#include "zipage/scheduler/scheduler.hpp"

namespace zipage {

class zipage_scheduler : public scheduler_base {
 public:
  using scheduler_base::scheduler_base;

  step_plan schedule() {
    step_plan plan;
    preempt_for_priority(plan);
    hand_out_slots();
    const bool all_back = swap_in(plan);
    int budget = cfg_.max_batched_tokens;
    serve_running(plan, budget);
    hand_out_slots();  // slots freed by requests that gave way go to running requests before new ones
    if (all_back || waiting_goes_first()) admit_waiting(plan, budget);
    if (plan.idle() && plan.preempted.empty() && !compaction_in_flight()) break_stall(plan);
    return plan;
  }

  // Tokens of s, from its next one, that can run before one needs a query slot it does not have.
  [[nodiscard]] int tokens_before_slot_needed(const sequence& s, int tokens) const {
    if (!cfg_.compresses() || s.query_slot >= 0) return tokens;
    const int bs = cfg_.geometry.block_size;
    const int start = s.kv_len;
    // Window queries matter only for the block at which the request will be compressed: the first
    // block at or past the budget that also holds (or follows) the last token its prefill feeds — the
    // prompt's last, or a recomputed request's second to last (see sequence::num_to_prefill). A request
    // without a slot is uncompressed, so its logical and physical positions agree.
    const int last_fed = s.num_computed + s.num_to_prefill() - 1;
    const int block = std::max({cfg_.geometry.budget_blocks(), last_fed / bs, start / bs});
    const int first = std::max(start, block * bs + bs - cfg_.geometry.window);
    return std::min(tokens, first - start);
  }

 private:
  // Nothing could run although requests hold blocks (say, prompts mid-prefill filled the pool): the
  // newest one that can move gives way, so the others can go on. Not when one gave way in this plan
  // already: the blocks and slot it freed let the others go on next step.
  void break_stall(step_plan& plan) {
    for (auto it = running_.rbegin(); it != running_.rend(); ++it)
      if (!(*it)->compressing && (*it)->status == request_status::running) {
        evict(*it, plan);
        return;
      }
  }

  void hand_out_slots() {
    if (!cfg_.compresses()) return;
    for (sequence* s : running_)
      if (s->query_slot < 0 && !take_slot(*s)) return;
  }

  // Decodes (and compressions) first, oldest first: they may make newer requests give way. Then the
  // next chunks of prompts being prefilled, which take only what is left of the budget and of the
  // free blocks, so a long prompt never holds decoding back.
  void serve_running(step_plan& plan, int& budget) {
    for (std::size_t i = 0; i < running_.size();) {
      sequence* s = running_[i];
      if (s->compressing || s->num_pending() > 1) {
        ++i;
        continue;
      }
      if (s->needs_compression) {
        if (plan_compression(i, plan)) ++i;
        continue;
      }
      if (budget == 0 || tokens_before_slot_needed(*s, 1) == 0) {  // out of budget, or waiting for a query slot
        ++i;
        continue;
      }
      const room r = make_room(i, blocks_.blocks_needed(*s, 1), plan);
      if (r == room::evicted_self) continue;  // running_[i] is the next request now
      if (r == room::made) schedule(*s, 1, plan, budget);
      ++i;
    }
    for (sequence* s : running_) {
      if (s->compressing || s->num_pending() <= 1) continue;
      const int tokens = affordable_chunk(*s, budget);
      if (tokens > 0) schedule(*s, tokens, plan, budget);
    }
  }

  // The longest next chunk of s that fits the budget, the free blocks and its query slot.
  [[nodiscard]] int affordable_chunk(const sequence& s, int budget) const {
    int tokens = tokens_before_slot_needed(s, std::min(s.num_to_prefill(), budget));
    const int room = (s.table.num_blocks() + blocks_.pool().num_free()) * cfg_.geometry.block_size - s.kv_len;
    return std::max(0, std::min(tokens, room));
  }

  void schedule(sequence& s, int tokens, step_plan& plan, int& budget) {
    blocks_.allocate(s, tokens);
    if (cfg_.prefix_caching) blocks_.register_planned_blocks(s, tokens);
    plan.batch.push_back({&s, tokens});
    budget -= tokens;
  }

  // Under priority order a waiting request more urgent than every swapped one need not wait for them.
  [[nodiscard]] bool waiting_goes_first() const {
    return cfg_.order == scheduling_order::priority && !waiting_.empty() && !swapped_.empty() &&
           precedes(*waiting_.front(), *swapped_.front());
  }

  void admit_waiting(step_plan& plan, int& budget) {
    int claimed = 0;  // what requests admitted without a slot in this step still claim
    while (!waiting_.empty() && budget > 0 && num_running() < cfg_.max_num_seqs) {
      sequence* s = waiting_.front();
      if (!swapped_.empty() && !precedes(*s, *swapped_.front())) return;  // swapped requests come back first
      if (!admissible(*s)) {
        waiting_.pop_front();
        reject(s, plan);
        continue;
      }
      if (cfg_.compresses() && !take_slot(*s) && !cfg_.hybrid) return;
      if (cfg_.prefix_caching && blocks_.match_prefix(*s).pending) {
        undo_admission(*s);  // its prefix is being computed this step: reuse it next step
        return;
      }
      if (starts_on_claim(*s) && !claim_fits(*s, claimed)) {
        undo_admission(*s);
        return;
      }
      const int tokens = affordable_chunk(*s, budget);
      if (tokens == 0) {
        undo_admission(*s);
        return;
      }
      waiting_.pop_front();
      prefix_hit_tokens_ += s->kv_len;  // what match_prefix reused
      s->status = request_status::running;
      insert_by_age(s);  // a recomputed request keeps its seniority: newer ones give way to it
      schedule(*s, tokens, plan, budget);
      if (cfg_.compresses() && s->query_slot < 0) claimed += claim(*s);
    }
  }

  // A request that could not start after all keeps nothing: matched prefix blocks and slot go back.
  void undo_admission(sequence& s) {
    blocks_.deallocate(s);
    s.num_prefix_hit_tokens -= s.kv_len;
    s.num_computed = s.kv_len = 0;
    release_slot(s);
  }
};

}  // namespace zipage
