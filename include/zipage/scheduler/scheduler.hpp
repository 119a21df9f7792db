#pragma once
// Continuous batching, planned on the host: which requests run this step, and who gives way when the
// KV pool runs out. Pure host code over sequences and the block manager, testable without a model.
//
// The scheduler (with its block manager) is the only writer of request and cache state: schedule()
// plans a step (admissions, chunks, preemptions, swaps, compressions, with their blocks and slots);
// update(plan, out) applies what running it produced (lengths, the new tokens, finished requests,
// compression points, prefix blocks, landed compactions); cancel() drops a request. The engine and the
// executor read requests, and write only their output (text, log-probabilities).
#include <algorithm>
#include <cstdint>
#include <concepts>
#include <deque>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "zipage/kv/block_manager.hpp"
#include "zipage/request/sequence.hpp"
#include "zipage/scheduler/step_plan.hpp"

namespace zipage {

// Queues, query slots, and the ways a request gives way, shared by the built-in schedulers.
class scheduler_base {
 public:
  scheduler_base(scheduler_config cfg, block_pool& pool) : cfg_(cfg), blocks_(pool, cfg.geometry.block_size) {
    cfg_.validate();
    for (int slot = 0; slot < cfg_.num_query_slots; ++slot) free_slots_.push_back(slot);
  }

  [[nodiscard]] const scheduler_config& config() const { return cfg_; }
  [[nodiscard]] int block_size() const { return cfg_.geometry.block_size; }
  [[nodiscard]] int num_waiting() const { return static_cast<int>(waiting_.size()); }
  [[nodiscard]] int num_running() const { return static_cast<int>(running_.size()); }
  [[nodiscard]] int num_swapped() const { return static_cast<int>(swapped_.size()); }
  [[nodiscard]] int num_slots_in_use() const { return cfg_.num_query_slots - static_cast<int>(free_slots_.size()); }
  [[nodiscard]] std::int64_t num_preemptions() const { return preemptions_; }
  [[nodiscard]] std::int64_t num_swaps() const { return swaps_; }
  // Prompt tokens whose KV was taken from the prefix cache instead of being computed.
  [[nodiscard]] std::int64_t num_prefix_hit_tokens() const { return prefix_hit_tokens_; }
  [[nodiscard]] bool has_unfinished() const { return !waiting_.empty() || !running_.empty() || !swapped_.empty(); }

  // Whether a request could ever run: what it holds once (re)started fits the pool.
  [[nodiscard]] bool admissible(const sequence& s) const { return blocks_to_start(s) <= blocks_.pool().num_blocks(); }

  // The blocks s holds at most before it can next sample: all its tokens, but a recomputed request at its
  // compression point is compressed after its second to last token (sequence::num_to_prefill), so it never
  // holds its last one uncompressed. (Counting that token rejected a request whose prompt filled the pool
  // when it gave way just before its first compression, though it had run in that pool.)
  [[nodiscard]] int blocks_to_start(const sequence& s) const {
    const int bs = cfg_.geometry.block_size;
    const int fed_first = s.num_tokens() - 1;
    if (cfg_.compresses() && s.num_generated() > 0 && !s.is_compressed() && maybe_compression_point(fed_first))
      return std::max(blocks_for_tokens(fed_first, bs), cfg_.geometry.budget_blocks() + 1);
    return blocks_for_tokens(s.num_tokens(), bs);
  }

  // The policy's compression point, or true when its rule throws (the request then fails in update()).
  [[nodiscard]] bool maybe_compression_point(int kv_len) const {
    try {
      return cfg_.compression_point(kv_len);
    } catch (...) {
      return true;
    }
  }

  void add(sequence* s) {
    s->status = request_status::waiting;
    enqueue(waiting_, s);
  }

  // Whether a comes before b in every queue: arrival order, or (priority, arrival) under
  // scheduling_order::priority.
  [[nodiscard]] bool precedes(const sequence& a, const sequence& b) const {
    if (cfg_.order == scheduling_order::priority && a.params.priority != b.params.priority)
      return a.params.priority < b.params.priority;
    return a.id < b.id;
  }

  // After the plan ran: every batch entry's tokens are computed; an entry that sampled gets its token and
  // either stops (stop_rules) or, at a compression point, is marked to be compressed by the next plan (a
  // recomputed request fed up to its last token is checked there too, as the first time); completed prompt
  // blocks become findable; compactions that finished land. Returns the requests that ended with an error
  // here (their compaction failed), to be reported.
  std::vector<request_id> update(const step_plan& plan, const step_output& out) {
    std::size_t row = 0;
    std::vector<request_id> failed;
    for (const scheduled_seq& e : plan.batch) {
      sequence& s = *e.seq;
      const bool samples = e.samples();  // before the sequence moves on
      s.kv_len += e.tokens;
      s.num_computed += e.tokens;
      if (!samples) {  // a prefill chunk short of the prompt's end, or a recomputation short of its last token
        if (s.recomputed_to_last_token() && compression_point(s)) s.needs_compression = true;
        if (s.is_finished()) failed.push_back(s.id);  // it sampled nothing here: no event of its own reports it
        continue;
      }
      check(row < out.sampled.size(), "scheduler: the step sampled ", out.sampled.size(), " tokens, fewer than the plan's");
      const sampled_token& t = out.sampled[row++];
      s.tokens.push_back(t.token);
      if (!t.error.empty()) {  // its event (process_sampled's) reports it
        fail(&s, t.error);
        continue;
      }
      if (const finish_reason reason = cfg_.stop.reason(s, t.token, t.stop_string()); reason != finish_reason::none) {
        s.reason = reason;
        s.stop_reason = cfg_.stop.stop_reason(s.params, t.token, reason, t.stop);
        finish(&s);
      } else if (compression_point(s)) {
        s.needs_compression = true;
      }
    }
    if (cfg_.prefix_caching)
      for (const auto& e : plan.batch) blocks_.register_full_blocks(*e.seq, e.tokens);
    for (request_id id : land_compactions(out.compactions)) failed.push_back(id);
    return failed;
  }

  // Cancellation: the request is dropped wherever it is, everything it held freed at once. (Its
  // compaction, if one is in flight, must have landed first: the worker writes into its blocks.)
  void cancel(sequence* s) {
    remove(s);
    s->status = request_status::finished;
    s->reason = finish_reason::cancelled;
  }

  [[nodiscard]] std::int64_t num_compressions() const { return compressions_; }
  [[nodiscard]] std::int64_t num_tokens_evicted() const { return tokens_evicted_; }

 protected:
  // A finished request leaves the running set and gives its blocks and slot back.
  void finish(sequence* s) {
    erase(running_, s);
    blocks_.deallocate(*s);
    release_slot(*s);
    s->status = request_status::finished;
  }

  // Drops a request wherever it is, freeing everything it held at once.
  void remove(sequence* s) {
    erase(waiting_, s);
    erase(running_, s);
    erase(swapped_, s);
    blocks_.deallocate(*s);
    release_slot(*s);
  }

  // Whether s is at a compression point (the policy's should_compress). A rule that throws ends the request with
  // an error instead of leaving the step half applied (the request then never ran again and the engine hung).
  bool compression_point(sequence& s) {
    try {
      return cfg_.compression_point(s.kv_len);
    } catch (...) {
      fail(&s, "the eviction policy's should_compress() failed: " + what_of(std::current_exception()));
    }
    return false;
  }

  // Ends a request with an error (it is dropped wherever it is).
  void fail(sequence* s, std::string message) {
    remove(s);
    s->status = request_status::finished;
    s->reason = finish_reason::error;
    s->error_message = std::move(message);
  }

  // Compactions that finished: the request keeps the blocks holding its new length, the tail goes back
  // to the pool through the block manager, and it may run again; a failed one ends with an error.
  std::vector<request_id> land_compactions(const std::vector<finished_compression>& done) {
    std::vector<request_id> failed;
    for (const finished_compression& d : done) {
      const auto it = std::find_if(running_.begin(), running_.end(),
                                   [&](const sequence* s) { return s->id == d.id && s->compressing; });
      if (it == running_.end()) continue;  // cancelled meanwhile (cancel() lands it first, so only defensively)
      sequence& s = **it;
      s.compressing = false;
      if (!d.error.empty()) {
        fail(&s, "compression failed: " + d.error);
        failed.push_back(s.id);
        continue;
      }
      tokens_evicted_ += s.kv_len - d.new_len;
      ++compressions_;
      blocks_.shrink(s, d.new_len);
      s.kv_len = d.new_len;
      ++s.num_compressions;
    }
    return failed;
  }

  bool take_slot(sequence& s) {
    if (s.query_slot >= 0) return true;
    if (free_slots_.empty()) return false;
    s.query_slot = free_slots_.front();
    free_slots_.pop_front();
    return true;
  }
  void release_slot(sequence& s) {
    if (s.query_slot < 0) return;
    free_slots_.push_back(s.query_slot);
    s.query_slot = -1;
  }
  [[nodiscard]] bool has_free_slot() const { return !free_slots_.empty(); }

  enum class room { made, wait, evicted_self };

  // Frees `needed` blocks for running_[i] by evicting the newest requests not in this step's batch yet
  // (index > i), and last request i itself: an uncompressed request by recomputation (only compute is
  // lost), a compressed one by swapping it to host memory (its evicted tokens cannot be recomputed).
  // When only a compaction in flight stands in the way, request i waits a step for the blocks it frees.
  // `needed()` is asked again after every eviction: a victim that shared blocks with request i leaves them
  // to it alone, which lowers what a copy-on-write needs (counted once, request i gave way too, and the
  // two went round preempting each other).
  template <std::invocable Needed>
  room make_room(std::size_t i, Needed needed, step_plan& plan) {
    sequence* self = running_[i];
    while (!blocks_.pool().can_allocate(needed())) {
      sequence* victim = last_movable(i + 1, plan);
      if (victim == nullptr && compaction_in_flight()) return room::wait;
      if (victim == nullptr) victim = self;
      evict(victim, plan);
      if (victim == self) return room::evicted_self;
    }
    return room::made;
  }
  room make_room(std::size_t i, int needed, step_plan& plan) {
    return make_room(i, [needed] { return needed; }, plan);
  }

  [[nodiscard]] bool compaction_in_flight() const {
    return std::any_of(running_.begin(), running_.end(), [](const sequence* s) { return s->compressing; });
  }

  void evict(sequence* s, step_plan& plan) {
    if (s->is_compressed()) swap_out(s, plan);
    else preempt(s, plan);
  }

  // Recomputation: blocks freed, back to the front of the queue to be prefilled again.
  void preempt(sequence* s, step_plan& plan) {
    erase(running_, s);
    blocks_.deallocate(*s);
    release_slot(*s);
    s->num_computed = 0;
    s->kv_len = 0;
    s->num_compressions = 0;
    s->needs_compression = false;
    s->status = request_status::waiting;
    ++s->num_preemptions;
    ++preemptions_;
    // First come, first served: it is older than anything waiting, so it goes first again.
    if (cfg_.order == scheduling_order::fcfs) waiting_.push_front(s);
    else enqueue(waiting_, s);
    plan.preempted.push_back(s);
  }

  // Swap-out: the engine copies the request's blocks, scores and window queries to host memory before
  // anything reuses them; here its blocks and slot go back to the pool at once.
  void swap_out(sequence* s, step_plan& plan) {
    erase(running_, s);
    plan.swap_out.push_back({s, s->table.blocks(), s->query_slot});
    blocks_.deallocate(*s);
    release_slot(*s);
    s->status = request_status::swapped;
    ++swaps_;
    enqueue(swapped_, s);
  }

  // Brings swapped requests back, first in queue order, while blocks (for their cache and next token)
  // and a slot are free. Returns false while any stays out. Under priority order one less urgent than the
  // most urgent waiting request stays out (that one is admitted first).
  bool swap_in(step_plan& plan) {
    while (!swapped_.empty()) {
      sequence* s = swapped_.front();
      if (cfg_.order == scheduling_order::priority && !waiting_.empty() && precedes(*waiting_.front(), *s)) return false;
      const int blocks = blocks_for_tokens(s->kv_len + 1, cfg_.geometry.block_size);
      if (!blocks_.pool().can_allocate(blocks) || !has_free_slot()) return false;
      swapped_.pop_front();
      take_slot(*s);
      for (int b = 0; b < blocks; ++b) s->table.push_back(blocks_.pool().allocate());
      s->status = request_status::running;
      insert_by_age(s);
      plan.swap_in.push_back(s);
    }
    return true;
  }

  // A request at a compression point: copy-on-write for blocks it shares (a prefix), then the plan
  // carries it to the engine. Shared blocks must not be compacted in place; if no block is free for the
  // copies, preemption rules apply. Returns false when the request itself had to give way.
  bool plan_compression(std::size_t i, step_plan& plan) {
    sequence* s = running_[i];
    auto& pool = blocks_.pool();
    const auto shared_blocks = [&] {  // the copies it needs: fewer once a sharer gives way
      return static_cast<int>(std::count_if(s->table.blocks().begin(), s->table.blocks().end(),
                                            [&](block_id b) { return pool.ref_count(b) > 1; }));
    };
    const room r = make_room(i, shared_blocks, plan);
    if (r == room::evicted_self) return false;
    if (r == room::wait) return true;  // stays at its compression point; tried again next step
    compression_job job{s, {}};
    std::vector<block_id> table = s->table.take();
    for (block_id& b : table) {
      if (pool.ref_count(b) > 1) {
        const block_id fresh = pool.allocate();
        job.copies.push_back({b, fresh});
        pool.release(b);  // others still hold it, so its contents stay until the copy
        b = fresh;
      }
      pool.forget(b);  // compaction rewrites it: it no longer holds a hashable prefix
    }
    s->table.assign(std::move(table));
    s->num_hashed_blocks = 0;
    s->needs_compression = false;
    s->compressing = true;
    plan.compress.push_back(std::move(job));
    return true;
  }

  // Keeps running_ in queue order (precedes); a request coming back (recomputed or swapped in) is usually
  // among the last, so search from the back.
  void insert_by_age(sequence* s) { enqueue(running_, s); }

  void enqueue(std::deque<sequence*>& q, sequence* s) {
    auto at = q.end();
    while (at != q.begin() && precedes(*s, **std::prev(at))) --at;
    q.insert(at, s);
  }

  // Admission by claim: a request starts only when the rest of its prompt and a block of decoding fit beside the
  // blocks that the running requests ahead of it (queue order) will take within their next block of tokens, a
  // prompt's rest first. Requests behind it give way to it when it needs blocks (make_room), so they promise
  // nothing. Under compression only slot holders promise (one without a slot gives way first), and no more
  // than they ever hold: B + 1, or their prompt's end past the budget. Who starts on a claim: every request
  // under full KV; under compression one that starts without a query slot (the hybrid mode), since the slots
  // are sized for their holders' peaks.
  // Why: a request started in blocks that one ahead of it is about to need is the newest, so it is preempted
  // within steps, its prefill wasted, and admitted again at once. With prompts at the budget the hybrid mode did
  // that every step (the H200, 2026-12-04: 4,378 preemptions in 5,259 steps, a prefill chunk in most decode
  // steps); under full KV the long workload recomputed ~8 prompt tokens per token sampled
  // (zipage-scheduler-replay --full). Running requests far below their peak promise only their next block, so
  // short prompts still fill the pool while the running ones grow.
  [[nodiscard]] int blocks_promised_ahead_of(const sequence& s) const {
    const int bs = block_size();
    const int most = cfg_.geometry.budget_blocks() + 1;
    int promised = 0;
    for (const sequence* r : running_) {  // queue order: those ahead of s come first
      if (!precedes(*r, s)) break;
      if (r->compressing || r->needs_compression) continue;  // a compaction shrinks it first
      if (cfg_.compresses() && r->query_slot < 0) continue;   // without a slot it gives way first
      int tokens = r->num_to_prefill() + bs;  // what it feeds within its next block of tokens
      if (cfg_.compresses()) {                // no more than it ever holds
        const int peak = std::max(most, blocks_for_tokens(r->kv_len + r->num_to_prefill() + 1, bs));
        tokens = std::min(tokens, peak * bs - r->kv_len);
      }
      promised += blocks_.blocks_needed(*r, tokens);
    }
    return promised;
  }
  // Whether s (waiting, its slot taken if one was free) starts only on its claim.
  [[nodiscard]] bool starts_on_claim(const sequence& s) const { return !cfg_.compresses() || s.query_slot < 0; }
  // What s claims beyond the blocks it holds: the rest of its prompt and a block of decoding.
  [[nodiscard]] int claim(const sequence& s) const { return blocks_.blocks_needed(s, s.num_to_prefill() + block_size()); }
  // Whether s's claim fits now, beside `claimed` blocks that requests admitted without a slot in this step still
  // claim (under compression they promise nothing). With no running request ahead of s it always fits: the
  // others give way to it.
  [[nodiscard]] bool claim_fits(const sequence& s, int claimed = 0) const {
    if (running_.empty() || !precedes(*running_.front(), s)) return true;
    return claim(s) <= blocks_.pool().num_free() - blocks_promised_ahead_of(s) - claimed;
  }

  // Priority order: while the most urgent waiting request cannot start for want of blocks for its first
  // chunk, of a running place, of a query slot or (starting on its claim) of room for its claim (claim_fits),
  // the least urgent running request behind it gives way
  // (as make_room: recomputation, or a swap for a compressed one). Runs before anything is scheduled.
  void preempt_for_priority(step_plan& plan) {
    if (cfg_.order != scheduling_order::priority || waiting_.empty()) return;
    const sequence& urgent = *waiting_.front();
    if (!admissible(urgent)) return;  // rejected at admission
    while (!can_start(urgent)) {
      sequence* victim = last_movable(0, plan);
      if (victim == nullptr || !precedes(urgent, *victim)) return;
      evict(victim, plan);
    }
  }

  [[nodiscard]] bool can_start(const sequence& s) const {
    if (num_running() >= cfg_.max_num_seqs) return false;
    const bool on_claim = !cfg_.compresses() || !has_free_slot();  // it would start without a slot
    if (cfg_.compresses() && on_claim && !cfg_.hybrid) return false;
    if (on_claim && !claim_fits(s)) return false;
    const int first_chunk = std::min(s.num_to_prefill(), cfg_.max_batched_tokens);
    return blocks_.pool().can_allocate(blocks_for_tokens(s.num_computed + first_chunk, cfg_.geometry.block_size));
  }

  // A request that can never run (it needs more blocks than the whole pool) ends with an error.
  void reject(sequence* s, step_plan& plan) {
    fail(s, detail::concat("request ", s->id, " needs ", blocks_to_start(*s), " KV blocks for its ", s->num_tokens(),
                           " tokens; the pool has ", blocks_.pool().num_blocks()));
    plan.rejected.push_back(s);
  }

  template <class Container>
  static void erase(Container& c, sequence* s) {
    c.erase(std::remove(c.begin(), c.end(), s), c.end());
  }

  scheduler_config cfg_;
  block_manager blocks_;
  std::deque<sequence*> waiting_;
  std::deque<sequence*> running_;  // in queue order (precedes): index 0 first (the oldest under fcfs)
  std::deque<sequence*> swapped_;
  std::deque<int> free_slots_;
  std::int64_t preemptions_ = 0;
  std::int64_t swaps_ = 0;
  std::int64_t prefix_hit_tokens_ = 0;
  std::int64_t compressions_ = 0;
  std::int64_t tokens_evicted_ = 0;

 private:
  // The last running request from index `first` on that can give way. A request mid-compaction cannot
  // move (the worker owns its blocks), nor one swapped in by this very plan (its state is not back in its
  // blocks yet).
  sequence* last_movable(std::size_t first, const step_plan& plan) const {
    for (std::size_t k = running_.size(); k-- > first;) {
      sequence* s = running_[k];
      if (!s->compressing && std::find(plan.swap_in.begin(), plan.swap_in.end(), s) == plan.swap_in.end()) return s;
    }
    return nullptr;
  }
};

// First come, first served, like nano-vllm: a step is either a prefill of waiting requests (whole
// prompts, admitted in arrival order while the token budget and free blocks allow) or a decode of every
// running request. When a decode cannot get a block, the newest request gives way (make_room). A prompt
// longer than a step, or a recomputation that grew past one, is fed over consecutive prefill steps, a step's
// worth at a time, before anything new (nano-vllm refuses it instead: max_num_batched_tokens >= max_model_len).
class fcfs_scheduler : public scheduler_base {
 public:
  static constexpr bool slot_per_running_request = true;

  fcfs_scheduler(scheduler_config cfg, block_pool& pool) : scheduler_base(cfg, pool) {
    check(cfg_.order == scheduling_order::fcfs,
          "fcfs_scheduler: serves requests in arrival order only; use zipage_scheduler for priority order");
    check(!cfg_.compresses() || cfg_.num_query_slots >= cfg_.max_num_seqs,
          "fcfs_scheduler: with compression every running request needs a query slot (num_query_slots >= "
          "max_num_seqs); use zipage_scheduler for hybrid slots");
  }

  step_plan schedule() {
    step_plan plan;
    if (swapped_.empty() || swap_in(plan)) {
      continue_prefills(plan);
      if (plan.batch.empty() && plan.preempted.empty()) schedule_prefill(plan);
    }
    if (plan.batch.empty()) schedule_decode(plan);
    return plan;
  }

 private:
  // Running requests still short of their last prompt token (fed over several steps) get the next
  // step's worth, oldest first; one that cannot get blocks makes newer ones give way, or gives way itself.
  void continue_prefills(step_plan& plan) {
    int tokens = 0;
    for (std::size_t i = 0; i < running_.size() && tokens < cfg_.max_batched_tokens;) {
      sequence* s = running_[i];
      if (s->compressing || s->num_pending() <= 1) {
        ++i;
        continue;
      }
      const int chunk = std::min(s->num_to_prefill(), cfg_.max_batched_tokens - tokens);
      const room r = make_room(i, blocks_.blocks_needed(*s, chunk), plan);
      if (r == room::evicted_self) continue;
      if (r == room::made) {
        blocks_.allocate(*s, chunk);
        plan.batch.push_back({s, chunk});
        tokens += chunk;
      }
      ++i;
    }
  }

  void schedule_prefill(step_plan& plan) {
    int tokens = 0;
    while (!waiting_.empty() && num_running() < cfg_.max_num_seqs) {
      sequence* s = waiting_.front();
      if (!admissible(*s)) {
        // Waiting would never help: a request that outgrew the pool is dropped, not retried.
        waiting_.pop_front();
        reject(s, plan);
        continue;
      }
      // Blocks for the whole prompt must be free, even when it is fed over several steps: the prefill steps
      // that follow feed only it, and one started without them would give way when it ran out, again and again.
      const int prompt = s->num_to_prefill();
      const int chunk = tokens == 0 ? std::min(prompt, cfg_.max_batched_tokens) : prompt;
      if (tokens + chunk > cfg_.max_batched_tokens || !blocks_.can_allocate(*s, prompt)) break;
      waiting_.pop_front();
      if (cfg_.compresses()) take_slot(*s);
      blocks_.allocate(*s, chunk);
      s->status = request_status::running;
      running_.push_back(s);
      tokens += chunk;
      plan.batch.push_back({s, chunk});
    }
  }

  void schedule_decode(step_plan& plan) {
    for (std::size_t i = 0; i < running_.size();) {
      sequence* s = running_[i];
      if (s->compressing || s->num_pending() > 1) {  // a prefill fed over several steps waits for blocks
        ++i;
        continue;
      }
      if (s->needs_compression) {
        if (plan_compression(i, plan)) ++i;  // else running_[i] is now the next request
        continue;
      }
      const room r = make_room(i, blocks_.blocks_needed(*s, 1), plan);
      if (r == room::evicted_self) continue;
      if (r == room::made) {
        blocks_.may_append(*s);
        plan.batch.push_back({s, 1});
      }
      ++i;
    }
  }
};

}  // namespace zipage
