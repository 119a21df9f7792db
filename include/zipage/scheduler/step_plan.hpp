#pragma once
// One step as values: what the scheduler plans (step_plan), what running it produced (step_output), and
// the rules update() applies to it (scheduler_config: when a request compresses, when it stops). The
// concept a scheduler satisfies is in zipage/concepts.hpp.
//
//   plan = scheduler.schedule();  out = executor.run(plan);  scheduler.update(plan, out);
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "zipage/block/block_pool.hpp"
#include "zipage/compression/compression_job.hpp"
#include "zipage/core/cache_geometry.hpp"
#include "zipage/core/error.hpp"
#include "zipage/request/sequence.hpp"

namespace zipage {

// The order the queues keep (waiting, running, swapped) and so who is admitted first and who gives way.
//  fcfs:     arrival order.
//  priority: sampling_params::priority first (lower runs first, as vLLM's priority scheduling), then arrival;
//            zipage_scheduler also evicts running requests less urgent than the most urgent waiting one
//            when that one cannot start.
enum class scheduling_order { fcfs, priority };

// When a request stops at the token it just generated. scheduler.update decides with reason(); output
// processing asks is_eos / token_reason which tokens end a request whatever their text (an EOS is not
// detokenised; stop strings are looked for only in text a stop token or EOS did not end).
struct stop_rules {
  token_id eos = -1;               // the model's end of sequence (unless sampling_params::ignore_eos)
  std::vector<token_id> extra_eos; // further end-of-turn ids
  int max_context = 0;             // a request stops (length) at this many tokens, prompt included; 0 = no limit
  // The model's own EOS, for stop_reason: ending on it reports none (vLLM's eos_token_id, the tokenizer's);
  // -1 = eos. engine_config::tokenizer_eos sets it where the tokenizer's EOS is not the config's.
  token_id default_eos = -1;

  [[nodiscard]] bool is_eos(const sampling_params& p, token_id t) const {
    return !p.ignore_eos && (t == eos || std::find(extra_eos.begin(), extra_eos.end(), t) != extra_eos.end());
  }
  // A stop token id or EOS, or none.
  [[nodiscard]] finish_reason token_reason(const sampling_params& p, token_id t) const {
    if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), t) != p.stop_token_ids.end())
      return finish_reason::stop_token;
    return is_eos(p, t) ? finish_reason::eos : finish_reason::none;
  }
  // Why s stops at t, its newest token (s.tokens already ends with it), or none; the first that applies:
  // a stop token id, EOS, a stop string its text completed (found by output processing), max_tokens, the context.
  [[nodiscard]] finish_reason reason(const sequence& s, token_id t, bool stop_string) const {
    if (const finish_reason r = token_reason(s.params, t); r != finish_reason::none) return r;
    if (stop_string) return finish_reason::stop_string;
    if (s.num_generated() >= s.params.max_tokens || (max_context > 0 && s.num_tokens() >= max_context))
      return finish_reason::length;
    return finish_reason::none;
  }
  // vLLM's stop_reason for a request that stopped at t for `r` (reason()): t's id for a stop token or an EOS
  // other than the model's own (default_eos, or eos), and for the model's own one too where the request ignores
  // EOS and names it in stop_token_ids (as vLLM checks its eos_token_id only without ignore_eos); `stop`, the
  // stop string that matched, for stop_string; none otherwise.
  [[nodiscard]] stopped_by stop_reason(const sampling_params& p, token_id t, finish_reason r,
                                       const std::string& stop) const {
    if (r == finish_reason::stop_string) return stop;
    if (r != finish_reason::eos && r != finish_reason::stop_token) return {};
    if (t == (default_eos >= 0 ? default_eos : eos) && !p.ignore_eos) return {};
    return t;
  }
};

struct scheduler_config {
  int max_num_seqs = 256;         // running requests at most
  int max_batched_tokens = 8192;  // tokens fed to the model in one step at most
  // Block size, budget (B = budget_tokens / block_size: a compressed request holds at most B + 1 blocks)
  // and window (W: queries recorded in the last W slots of a block). The budget and the window are used
  // only when `compress`.
  cache_geometry geometry{};
  bool compress = false;          // Compressed PagedAttention (an evicting policy)
  int num_query_slots = 0;        // requests that may record window queries at once
  bool hybrid = true;             // admit requests without a query slot; they run with full KV until they need one
  bool prefix_caching = false;    // share full prompt blocks between requests
  scheduling_order order = scheduling_order::fcfs;
  stop_rules stop{};              // when a request stops (update)
  // The eviction policy's rule for a compression point (its should_compress(kv_len, geometry)); empty: the
  // method's, cache_geometry::should_compress (a block boundary with more than B full blocks). Asked
  // only when compresses().
  std::function<bool(int kv_len)> compress_at{};

  void validate() const {
    check(max_num_seqs > 0, "scheduler_config::max_num_seqs must be positive, got ", max_num_seqs);
    check(max_batched_tokens > 0, "scheduler_config::max_batched_tokens must be positive, got ", max_batched_tokens);
    if (compress) geometry.validate("scheduler_config::geometry.");
    else geometry.validate_block_size("scheduler_config::geometry.");
    check(num_query_slots >= 0, "scheduler_config::num_query_slots must not be negative, got ", num_query_slots);
    check(!compress || num_query_slots > 0, "scheduler: compression needs at least one query slot");
  }
  [[nodiscard]] bool compresses() const { return compress; }
  // Whether a request with kv_len cached tokens is at a compression point: the one place this is decided.
  [[nodiscard]] bool compression_point(int kv_len) const {
    if (!compresses()) return false;
    if (compress_at) return compress_at(kv_len);
    return geometry.should_compress(kv_len);
  }
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

// A token sampled for one batch entry, and the stop string its text completed, if any (output processing looked;
// the output text is already cut before it). Stop strings are never empty, so an empty `stop` means none matched.
struct sampled_token {
  token_id token = 0;
  std::string stop{};  // the sampling_params::stop entry that matched; empty: none
  std::string error{};  // why the token's text could not be made (its request ends with this error); empty: none
  [[nodiscard]] bool stop_string() const noexcept { return !stop.empty(); }
};

// What running a plan produced, for scheduler.update.
struct step_output {
  std::vector<sampled_token> sampled;              // one per batch entry that samples (scheduled_seq::samples), in batch order
  std::vector<finished_compression> compactions;   // compressions the worker finished (any step's)
};

}  // namespace zipage
