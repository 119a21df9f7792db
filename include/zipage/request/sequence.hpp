#pragma once
// One request as the engine tracks it: its tokens (prompt + generated), its page table, and how far
// its KV has been computed. Logical positions (token indices, used for RoPE) are kept apart from
// physical KV slots so that eviction can shrink the cache without renumbering the tokens.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "zipage/core/types.hpp"
#include "zipage/kv/block_table.hpp"
#include "zipage/sampling/logprobs.hpp"
#include "zipage/sampling/sampling_params.hpp"

namespace zipage {

enum class request_status { waiting, running, swapped, finished };

enum class finish_reason { none, eos, length, stop_string, stop_token, cancelled, error };

[[nodiscard]] constexpr const char* to_string(finish_reason r) {
  switch (r) {
    case finish_reason::none: return "none";
    case finish_reason::eos: return "eos";
    case finish_reason::length: return "length";
    case finish_reason::stop_string: return "stop_string";
    case finish_reason::stop_token: return "stop_token";
    case finish_reason::cancelled: return "cancelled";
    case finish_reason::error: return "error";
  }
  return "unknown";
}

// vLLM's stop_reason: what ended a request that stopped before its length, when it was not the model's own EOS.
// The id of the token that ended it (a sampling_params::stop_token_ids entry, or an EOS id other than the
// model's default one: stop_rules::default_eos), or the stop string (a sampling_params::stop entry) that
// matched; none (std::monostate) for the model's EOS, for length, for a cancelled or failed request. Set by
// the scheduler with finish_reason (stop_rules::stop_reason).
using stopped_by = std::variant<std::monostate, token_id, std::string>;

// Turns generated tokens into text one token at a time (stateful: holds partial UTF-8 characters).
using streaming_detokenizer = std::function<std::string(token_id)>;

struct sequence {
  request_id id = 0;
  std::vector<token_id> tokens;  // prompt followed by generated tokens; index = logical position
  int prompt_len = 0;
  sampling_params params;

  request_status status = request_status::waiting;
  finish_reason reason = finish_reason::none;
  stopped_by stop_reason{};   // which stop token or stop string, when reason says it stopped on one
  std::string error_message;  // set when reason == error

  block_table table;
  int num_computed = 0;  // logical tokens whose K/V went through the model
  int kv_len = 0;        // physical slots in use; equals num_computed until eviction drops tokens

  int num_preemptions = 0;
  int query_slot = -1;        // row block of the query-window cache, while running under an evicting policy
  int num_compressions = 0;
  bool needs_compression = false;  // reached a compression point; the scheduler plans it next step
  bool compressing = false;        // a compaction is in flight: left out of every batch until it lands

  // Prefix cache bookkeeping: how many leading full blocks are registered, and the chained hash of the
  // last of them.
  int num_hashed_blocks = 0;
  std::uint64_t prefix_hash = 0;
  int num_prefix_hit_tokens = 0;

  std::vector<token_id> forced_tokens;  // teacher forcing: emit these instead of sampling (evaluation)
  token_rules rules;                    // params' bad words and the EOS ids min_tokens masks, as tokens (engine-made)
  std::vector<float> logprobs;          // log-probability of each emitted token, when params.logprobs
  // The params.top_logprobs most likely tokens of each emitted token's step (when > 0), most likely first.
  std::vector<std::vector<token_logprob>> top_logprobs;
  std::string output_text;              // detokenized generated text (for stop strings and results)
  // Bytes of output_text handed out in step events; the rest is held back while a stop string completed by
  // later tokens could still cut it (output_processor.hpp: take_streamable).
  std::size_t streamed_text_size = 0;
  streaming_detokenizer detokenizer;    // may be empty when the engine has no tokenizer

  [[nodiscard]] int num_tokens() const { return static_cast<int>(tokens.size()); }
  [[nodiscard]] int num_generated() const { return num_tokens() - prompt_len; }
  [[nodiscard]] token_id last_token() const { return tokens.back(); }
  // Tokens the next forward pass must feed: all uncomputed ones (prefill / recompute) or the last one.
  [[nodiscard]] int num_pending() const { return num_tokens() - num_computed; }
  // Tokens the next chunk may feed. A request recomputed after preemption stops short of its last token
  // and decodes that one in a step of its own, as it did the first time: so it meets every compression
  // point at the same cache length, keeps the same tokens, and generates what it would have.
  [[nodiscard]] int num_to_prefill() const {
    return num_generated() > 0 && num_pending() > 1 ? num_pending() - 1 : num_pending();
  }
  // A recomputed request has fed every token but its last: where, the first time, it checked for compression.
  [[nodiscard]] bool recomputed_to_last_token() const { return num_generated() > 0 && num_pending() == 1; }
  [[nodiscard]] bool is_finished() const { return status == request_status::finished; }
  [[nodiscard]] bool is_compressed() const { return num_compressions > 0; }
};

}  // namespace zipage
