#pragma once
// What a policy sees when it scores one (layer, request): the request's cached keys and its window of
// recent queries, gathered into contiguous arrays in physical (= original, order-preserving) order.
#include <span>

#include "zipage/core/error.hpp"

namespace zipage {

// Runtime settings of Compressed PagedAttention (method defaults: 256 / 8 / 16).
struct compression_params {
  int block_size = 256;
  int budget_blocks = 8;  // B: tokens kept = B · block_size
  int window = 16;        // W: recent queries recorded per request, and recent tokens always kept

  void validate() const {
    check(block_size > 0, "compression: block_size must be positive, got ", block_size);
    check(budget_blocks > 0, "compression: budget_blocks must be positive, got ", budget_blocks);
    check(window > 0 && window <= block_size, "compression: window must be in [1, block_size = ", block_size,
          "], got ", window);
  }
  [[nodiscard]] int keep_tokens() const { return budget_blocks * block_size; }
  // At a block boundary with more than B full blocks: B+1 in steady state, more right after a long prompt.
  [[nodiscard]] bool should_compress(int kv_len) const {
    return kv_len >= (budget_blocks + 1) * block_size && kv_len % block_size == 0;
  }
};

struct score_context {
  int kv_len = 0;  // cached tokens (physical length)
  int num_kv_heads = 0;
  int num_q_heads = 0;
  int head_dim = 0;
  int block_size = 0;
  int window = 0;
  bool first_compression = true;        // never compressed before: prev_scores hold nothing
  std::span<const float> keys;          // [kv_heads][kv_len][head_dim], RoPE applied
  std::span<const float> queries;       // [window][q_heads][head_dim]; query w sits at physical position kv_len - window + w
  std::span<const float> prev_scores;   // [kv_heads][kv_len] score cache; valid for j < kv_len - block_size unless first_compression

  [[nodiscard]] int group() const { return num_q_heads / num_kv_heads; }
  [[nodiscard]] int newest_block_start() const { return kv_len - block_size; }
  [[nodiscard]] const float* key(int head, int j) const {
    return keys.data() + (static_cast<std::size_t>(head) * kv_len + j) * head_dim;
  }
  [[nodiscard]] const float* query(int w, int q_head) const {
    return queries.data() + (static_cast<std::size_t>(w) * num_q_heads + q_head) * head_dim;
  }
};

}  // namespace zipage
