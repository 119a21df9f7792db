#pragma once
// CPU reference of the compression data movement: gathering what the scorer needs out of the paged
// cache, and carrying out a compaction plan in place.
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "zipage/backend/cpu/kv_storage.hpp"
#include "zipage/core/types.hpp"
#include "zipage/compression/compaction_plan.hpp"

namespace zipage::cpu {

inline std::int64_t page_slot(std::span<const block_id> pages, int block_size, int j) {
  return std::int64_t{pages[static_cast<std::size_t>(j / block_size)]} * block_size + j % block_size;
}

// keys of one layer as [kv_heads][kv_len][head_dim]
inline void gather_keys(cpu_kv_storage& kv, int layer, std::span<const block_id> pages, int kv_len,
                        std::vector<float>& out) {
  const auto& s = kv.shape;
  const auto view = kv.layer(layer);
  out.resize(static_cast<std::size_t>(s.num_kv_heads) * kv_len * s.head_dim);
  for (int h = 0; h < s.num_kv_heads; ++h)
    for (int j = 0; j < kv_len; ++j)
      std::copy_n(view.k + view.offset(page_slot(pages, s.block_size, j), h), s.head_dim,
                  out.data() + (static_cast<std::size_t>(h) * kv_len + j) * s.head_dim);
}

// score cache of one layer as [kv_heads][kv_len]
inline void gather_scores(cpu_kv_storage& kv, int layer, std::span<const block_id> pages, int kv_len,
                          std::vector<float>& out) {
  const auto& s = kv.shape;
  out.assign(static_cast<std::size_t>(s.num_kv_heads) * kv_len, 0.0f);
  if (!s.score_cache) return;
  const float* scores = kv.layer_scores(layer);
  for (int h = 0; h < s.num_kv_heads; ++h)
    for (int j = 0; j < kv_len; ++j)
      out[static_cast<std::size_t>(h) * kv_len + j] = scores[page_slot(pages, s.block_size, j) * s.num_kv_heads + h];
}

// window queries of one layer and slot as [W][q_heads][head_dim]
inline std::span<const float> window_queries(cpu_kv_storage& kv, int layer, int slot) {
  const auto& s = kv.shape;
  const auto rows = static_cast<std::size_t>(s.window * s.query_row_stride());
  return {kv.query_rows(layer) + static_cast<std::size_t>(slot) * rows, rows};
}

// Moves every kept token of every (layer, head) to slots 0..new_len-1 in order. Kept indices ascend,
// so a token's destination never lies after its source: the move is safe in place, front to back.
inline void apply_compaction(cpu_kv_storage& kv, const compaction_plan& plan) {
  const auto& s = kv.shape;
  for (int l = 0; l < plan.num_layers; ++l) {
    const auto view = kv.layer(l);
    float* scores = s.score_cache ? kv.layer_scores(l) : nullptr;
    for (int h = 0; h < plan.num_kv_heads; ++h) {
      const auto kept = plan.kept(l, h);
      const auto kept_scores = plan.scores(l, h);
      for (int dst = 0; dst < plan.new_len; ++dst) {
        const int src = kept[static_cast<std::size_t>(dst)];
        const std::int64_t to = page_slot(plan.pages, s.block_size, dst);
        if (src != dst) {
          const std::int64_t from = page_slot(plan.pages, s.block_size, src);
          std::copy_n(view.k + view.offset(from, h), s.head_dim, view.k + view.offset(to, h));
          std::copy_n(view.v + view.offset(from, h), s.head_dim, view.v + view.offset(to, h));
        }
        if (scores && !kept_scores.empty()) scores[to * s.num_kv_heads + h] = kept_scores[static_cast<std::size_t>(dst)];
      }
    }
  }
}

}  // namespace zipage::cpu
