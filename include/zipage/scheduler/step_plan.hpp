#pragma once
// What a scheduler hands the engine each step, and the concept a scheduler satisfies.
#include <concepts>
#include <cstdint>
#include <utility>
#include <vector>

#include "zipage/block/block_pool.hpp"
#include "zipage/core/error.hpp"
#include "zipage/request/sequence.hpp"

namespace zipage {

// The order the queues keep (waiting, running, swapped) and so who is admitted first and who gives way.
//  fcfs:     arrival order.
//  priority: sampling_params::priority first (lower runs first, as vLLM's priority scheduling), then arrival;
//            zipage_scheduler also evicts running requests less urgent than the most urgent waiting one
//            when that one cannot start.
enum class scheduling_order { fcfs, priority };

struct scheduler_config {
  int max_num_seqs = 256;         // running requests at most
  int max_batched_tokens = 8192;  // tokens fed to the model in one step at most
  int block_size = 16;
  // Compressed PagedAttention (zero when the policy does not evict):
  int budget_blocks = 0;          // B: a compressed request holds at most B + 1 blocks
  int window = 0;                 // W: queries recorded in the last W slots of a block
  int num_query_slots = 0;        // requests that may record window queries at once
  bool hybrid = true;             // admit requests without a query slot; they run with full KV until they need one
  bool prefix_caching = false;    // share full prompt blocks between requests
  scheduling_order order = scheduling_order::fcfs;

  void validate() const {
    check(max_num_seqs > 0, "scheduler: max_num_seqs must be positive, got ", max_num_seqs);
    check(max_batched_tokens > 0, "scheduler: max_batched_tokens must be positive, got ", max_batched_tokens);
    check(block_size > 0, "scheduler: block_size must be positive, got ", block_size);
    check(budget_blocks >= 0 && window >= 0 && num_query_slots >= 0,
          "scheduler: budget_blocks, window and num_query_slots must not be negative");
    check(budget_blocks == 0 || num_query_slots > 0, "scheduler: compression needs at least one query slot");
  }
  [[nodiscard]] bool compresses() const { return budget_blocks > 0; }
};

// One sequence in this step's batch: `tokens` of its pending tokens (all of them, or a prefill chunk).
struct scheduled_seq {
  sequence* seq = nullptr;
  int tokens = 0;
  [[nodiscard]] bool samples() const { return tokens == seq->num_pending(); }  // the chunk ends the pending run
};

// Copy-on-write before a first compression: the request's shared block at table index `index` (`from`)
// is replaced by `to`, which must receive a copy of `from`'s contents before anything else runs.
struct block_copy {
  block_id from = invalid_block;
  block_id to = invalid_block;
};

struct compression_job {
  sequence* seq = nullptr;
  std::vector<block_copy> copies;
};

// A request moved to host memory: `pages` and `slot` are where its state is now, to be copied out
// before any other data movement of the step.
struct swap_out_job {
  sequence* seq = nullptr;
  std::vector<block_id> pages;
  int slot = -1;
};

struct step_plan {
  std::vector<scheduled_seq> batch;
  std::vector<sequence*> preempted;       // recomputation: blocks freed, back to the waiting queue
  std::vector<sequence*> rejected;        // can never run (needs more than the whole pool)
  std::vector<swap_out_job> swap_out;     // compressed requests moved to host memory
  std::vector<sequence*> swap_in;         // brought back into fresh blocks (and a slot)
  std::vector<compression_job> compress;  // compress now (after the copies)

  [[nodiscard]] bool idle() const { return batch.empty() && swap_out.empty() && swap_in.empty() && compress.empty(); }
  [[nodiscard]] int num_tokens() const {
    int n = 0;
    for (const auto& e : batch) n += e.tokens;
    return n;
  }
};

// What the engine needs of a scheduler.
template <class S>
concept scheduler_policy = std::constructible_from<S, scheduler_config, block_pool&> &&
    requires(S& s, const S& cs, sequence* seq, const step_plan& plan) {
      s.add(seq);
      { s.schedule() } -> std::same_as<step_plan>;
      s.commit(plan);  // after the step ran: sequences are updated
      s.land_compression(*seq, 0);  // a compaction landed: shrink the table to the new length
      s.finish(seq);
      s.remove(seq);
      { cs.admissible(*seq) } -> std::convertible_to<bool>;
      { cs.num_waiting() } -> std::convertible_to<int>;
      { cs.num_running() } -> std::convertible_to<int>;
      { cs.num_swapped() } -> std::convertible_to<int>;
      { cs.num_slots_in_use() } -> std::convertible_to<int>;
      { cs.num_preemptions() } -> std::convertible_to<std::int64_t>;
      { cs.num_swaps() } -> std::convertible_to<std::int64_t>;
      { cs.num_prefix_hit_tokens() } -> std::convertible_to<std::int64_t>;
    };

}  // namespace zipage
