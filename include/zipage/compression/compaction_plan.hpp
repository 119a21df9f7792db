#pragma once
// Plan, then apply: choosing the tokens to keep (scoring, top-k) yields a compaction_plan; a separate
// step moves the data. Every KV head keeps exactly new_len tokens, so all heads share one page table
// and one physical length while slot s of head h may hold a different token than slot s of head h'.
#include <cstdint>
#include <span>
#include <vector>

#include "zipage/core/types.hpp"

namespace zipage {

struct compaction_plan {
  request_id request = 0;
  int old_len = 0;  // physical tokens before
  int new_len = 0;  // physical tokens after (the same for every layer and head)
  int num_layers = 0;
  int num_kv_heads = 0;
  std::vector<block_id> pages;          // the request's page table when planned
  std::vector<std::int32_t> keep;       // [layers][kv_heads][new_len] source slot of each kept token, ascending
  std::vector<float> kept_scores;       // [layers][kv_heads][new_len] score-cache values; empty without a score cache

  [[nodiscard]] std::size_t offset(int layer, int head) const {
    return (static_cast<std::size_t>(layer) * num_kv_heads + head) * new_len;
  }
  [[nodiscard]] std::span<const std::int32_t> kept(int layer, int head) const {
    return {keep.data() + offset(layer, head), static_cast<std::size_t>(new_len)};
  }
  [[nodiscard]] std::span<const float> scores(int layer, int head) const {
    if (kept_scores.empty()) return {};
    return {kept_scores.data() + offset(layer, head), static_cast<std::size_t>(new_len)};
  }
};

}  // namespace zipage
