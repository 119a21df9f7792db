#pragma once
// What a policy sees when it scores one (layer, request): the request's cached keys and its window of
// recent queries, gathered into contiguous arrays in physical (= original, order-preserving) order.
#include <span>

#include "zipage/core/cache_geometry.hpp"  // cache_geometry (compression_params), what policies are asked with
#include "zipage/core/error.hpp"

namespace zipage {

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
