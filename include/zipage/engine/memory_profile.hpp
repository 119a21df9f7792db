#pragma once
// The batch of the engine's profiling forward (vLLM's profile_run): before the KV pool is sized from a
// device's free memory, the model runs once over a step as large as a step can be, so its activations and
// the backend's workspaces reach their peak (they are grow-only and stay allocated) and the free memory
// read afterwards is what the pool may take. Plain host code: it only lays the batch out.
//
// The layout: `num_tokens` prompt tokens (max_batched_tokens) split as evenly as possible over `num_seqs`
// sequences (at most one per token), each one's last token a logits row (so the logits tensor and device
// sampling see as many rows as a real step can have). Every sequence's page table is block 0 repeated,
// so the attention reads and writes one throwaway block (`kv_cache_shape::num_blocks = 1`) while doing
// the work of a real prefill of those lengths (causal lengths 1..len); what it writes there is garbage
// and is never read as a result.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/types.hpp"
#include "zipage/model/forward_context.hpp"

namespace zipage {

struct profile_batch {
  std::vector<token_id> tokens;
  std::vector<std::int32_t> positions, token_seq, token_kv_len, logits_rows, page_indptr, page_indices;
  std::vector<std::int64_t> slots;

  [[nodiscard]] int num_tokens() const { return static_cast<int>(tokens.size()); }
  [[nodiscard]] int num_seqs() const { return static_cast<int>(logits_rows.size()); }

  // A view for forward_context (valid while this batch lives and is not changed); records no queries.
  [[nodiscard]] forward_batch view() const {
    forward_batch b;
    b.tokens = tokens;
    b.positions = positions;
    b.logits_rows = logits_rows;
    b.attention = {slots, token_seq, token_kv_len, page_indptr, page_indices, {}};
    return b;
  }
};

// num_tokens tokens over min(num_seqs, num_tokens) sequences (the first num_tokens % n get one more).
[[nodiscard]] inline profile_batch make_profile_batch(int num_tokens, int num_seqs, int block_size, token_id token = 0) {
  check(num_tokens > 0, "memory profile: the profiling batch needs at least one token, got ", num_tokens);
  check(num_seqs > 0, "memory profile: the profiling batch needs at least one sequence, got ", num_seqs);
  check(block_size > 0, "memory profile: block_size must be positive, got ", block_size);
  const int n = std::min(num_seqs, num_tokens);
  profile_batch b;
  const auto tokens = static_cast<std::size_t>(num_tokens);
  b.tokens.assign(tokens, token);
  b.positions.reserve(tokens);
  b.token_seq.reserve(tokens);
  b.token_kv_len.reserve(tokens);
  b.slots.reserve(tokens);
  b.logits_rows.reserve(static_cast<std::size_t>(n));
  b.page_indptr.assign(1, 0);
  for (int s = 0; s < n; ++s) {
    const int len = num_tokens / n + (s < num_tokens % n ? 1 : 0);
    for (int p = 0; p < len; ++p) {
      b.positions.push_back(p);
      b.token_seq.push_back(s);
      b.token_kv_len.push_back(p + 1);
      b.slots.push_back(p % block_size);  // block 0
    }
    b.logits_rows.push_back(static_cast<std::int32_t>(b.positions.size()) - 1);
    b.page_indices.insert(b.page_indices.end(), static_cast<std::size_t>((len + block_size - 1) / block_size), 0);
    b.page_indptr.push_back(static_cast<std::int32_t>(b.page_indices.size()));
  }
  return b;
}

}  // namespace zipage
