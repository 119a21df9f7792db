#pragma once
// Continuous batching, planned on the host: which requests run this step, and who gives way when the
// KV pool runs out. Pure host code over sequences and the block manager, testable without a model.
#include <algorithm>
#include <concepts>
#include <cstdint>
#include <deque>
#include <vector>

#include "zipage/kv/block_manager.hpp"
#include "zipage/request/sequence.hpp"

namespace zipage {

struct scheduler_config {
  int max_num_seqs = 256;         // running requests at most
  int max_batched_tokens = 8192;  // tokens fed to the model in one step at most
  int block_size = 16;

  void validate() const {
    check(max_num_seqs > 0, "scheduler: max_num_seqs must be positive, got ", max_num_seqs);
    check(max_batched_tokens > 0, "scheduler: max_batched_tokens must be positive, got ", max_batched_tokens);
    check(block_size > 0, "scheduler: block_size must be positive, got ", block_size);
  }
};

enum class step_phase { idle, prefill, decode };

// The plan for one step. Sequences in `seqs` have blocks for all their pending tokens.
struct step_plan {
  step_phase phase = step_phase::idle;
  std::vector<sequence*> seqs;
  std::vector<sequence*> preempted;  // sent back to the queue while planning this step
  std::vector<sequence*> rejected;   // can never run (need more than the whole pool or step budget)

  [[nodiscard]] int num_tokens() const {
    int n = 0;
    for (const sequence* s : seqs) n += s->num_pending();
    return n;
  }
};

// What the engine needs of a scheduler.
template <class S>
concept scheduler_policy = std::constructible_from<S, scheduler_config, block_pool&> &&
    requires(S& s, const S& cs, sequence* seq) {
      s.add(seq);
      { s.schedule() } -> std::same_as<step_plan>;
      s.finish(seq);
      s.remove(seq);
      { cs.num_waiting() } -> std::convertible_to<int>;
      { cs.num_running() } -> std::convertible_to<int>;
      { cs.num_preemptions() } -> std::convertible_to<std::int64_t>;
      { cs.block_size() } -> std::convertible_to<int>;
    };

// First come, first served. A step is either a prefill of waiting requests (admitted in arrival order
// while the token budget and free blocks allow) or a decode of every running request. When a decode
// cannot get a block, the newest running request is preempted by recomputation: its blocks are freed
// and it goes back to the front of the queue, to be prefilled again (prompt and generated tokens).
class fcfs_scheduler {
 public:
  fcfs_scheduler(scheduler_config cfg, block_pool& pool) : cfg_(cfg), blocks_(pool, cfg.block_size) {
    cfg_.validate();
  }

  [[nodiscard]] int block_size() const { return cfg_.block_size; }
  [[nodiscard]] int num_waiting() const { return static_cast<int>(waiting_.size()); }
  [[nodiscard]] int num_running() const { return static_cast<int>(running_.size()); }
  [[nodiscard]] std::int64_t num_preemptions() const { return preemptions_; }
  [[nodiscard]] std::int64_t num_lossy_preemptions() const { return lossy_preemptions_; }
  [[nodiscard]] bool has_unfinished() const { return !waiting_.empty() || !running_.empty(); }
  [[nodiscard]] block_manager& blocks() { return blocks_; }

  // Whether a request could ever be admitted: its prompt fits the pool and the step token budget.
  [[nodiscard]] bool admissible(const sequence& s) const {
    return s.num_pending() <= cfg_.max_batched_tokens &&
           blocks_for_tokens(s.num_tokens(), cfg_.block_size) <= blocks_.pool().num_blocks();
  }

  void add(sequence* s) {
    s->status = request_status::waiting;
    waiting_.push_back(s);
  }

  step_plan schedule() {
    step_plan plan = schedule_prefill();
    if (plan.seqs.empty()) {
      step_plan decode = schedule_decode();
      decode.rejected = std::move(plan.rejected);
      plan = std::move(decode);
    }
    return plan;
  }

  // A finished request leaves the running set and gives its blocks back.
  void finish(sequence* s) {
    erase(running_, s);
    blocks_.deallocate(*s);
    s->status = request_status::finished;
  }

  // Drops a request wherever it is (cancellation), freeing everything it held at once.
  void remove(sequence* s) {
    erase(waiting_, s);
    erase(running_, s);
    blocks_.deallocate(*s);
  }

 private:
  step_plan schedule_prefill() {
    step_plan plan;
    int tokens = 0;
    while (!waiting_.empty() && num_running() < cfg_.max_num_seqs) {
      sequence* s = waiting_.front();
      if (!admissible(*s)) {
        // Waiting would never help: a request that outgrew the pool (or budget) is dropped, not retried.
        waiting_.pop_front();
        s->status = request_status::finished;
        plan.rejected.push_back(s);
        continue;
      }
      if (tokens + s->num_pending() > cfg_.max_batched_tokens || !blocks_.can_allocate(*s)) break;
      waiting_.pop_front();
      blocks_.allocate(*s);
      s->status = request_status::running;
      running_.push_back(s);
      tokens += s->num_pending();
      plan.seqs.push_back(s);
    }
    if (!plan.seqs.empty()) plan.phase = step_phase::prefill;
    return plan;
  }

  step_plan schedule_decode() {
    step_plan plan;
    // Oldest first, so the newest requests are the ones that give way.
    for (std::size_t i = 0; i < running_.size(); ++i) {
      sequence* s = running_[i];
      bool preempted_self = false;
      while (!blocks_.can_append(*s)) {
        sequence* victim = pick_victim(i);
        preempt(victim, plan);
        if (victim == s) {
          preempted_self = true;
          break;
        }
      }
      if (preempted_self) break;
      blocks_.may_append(*s);
      plan.seqs.push_back(s);
    }
    if (!plan.seqs.empty()) plan.phase = step_phase::decode;
    return plan;
  }

  // The newest request not yet planned (index > i), or request i itself. A compressed request cannot
  // be rebuilt by recomputation (its evicted tokens are gone), so uncompressed ones give way first; only
  // when none is left is a compressed one recomputed (counted as lossy).
  sequence* pick_victim(std::size_t i) {
    for (std::size_t k = running_.size(); k-- > i;)
      if (!running_[k]->is_compressed()) return running_[k];
    ++lossy_preemptions_;
    return running_.back();
  }

  void preempt(sequence* s, step_plan& plan) {
    erase(running_, s);
    blocks_.deallocate(*s);
    s->num_computed = 0;
    s->kv_len = 0;
    s->num_compressions = 0;
    s->status = request_status::waiting;
    ++s->num_preemptions;
    ++preemptions_;
    waiting_.push_front(s);
    plan.preempted.push_back(s);
  }

  template <class Container>
  static void erase(Container& c, sequence* s) {
    c.erase(std::remove(c.begin(), c.end(), s), c.end());
  }

  scheduler_config cfg_;
  block_manager blocks_;
  std::deque<sequence*> waiting_;
  std::deque<sequence*> running_;
  std::int64_t preemptions_ = 0;
  std::int64_t lossy_preemptions_ = 0;
};

}  // namespace zipage
