#pragma once
// CPU reference of the compression data movement: gathering what the scorer needs out of the paged
// cache, and carrying out a compaction plan in place.
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "zipage/backend/cpu/kv_storage.hpp"
#include "zipage/core/error.hpp"
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

namespace zipage::cpu {

// A request's state in host memory while it is swapped out: its blocks' K, V and scores, and its
// query-window rows.
struct swap_blob {
  std::size_t num_pages = 0;
  std::vector<float> k, v, scores, queries;
};

inline void copy_block(cpu_kv_storage& kv, block_id from, block_id to) {
  const auto& s = kv.shape;
  const auto block_elems = static_cast<std::size_t>(std::int64_t{s.block_size} * s.token_stride());
  const auto score_elems = static_cast<std::size_t>(std::int64_t{s.block_size} * s.num_kv_heads);
  for (int l = 0; l < s.num_layers; ++l) {
    const auto view = kv.layer(l);
    std::copy_n(view.k + block_elems * static_cast<std::size_t>(from), block_elems, view.k + block_elems * static_cast<std::size_t>(to));
    std::copy_n(view.v + block_elems * static_cast<std::size_t>(from), block_elems, view.v + block_elems * static_cast<std::size_t>(to));
    if (s.score_cache)
      std::copy_n(kv.layer_scores(l) + score_elems * static_cast<std::size_t>(from), score_elems,
                  kv.layer_scores(l) + score_elems * static_cast<std::size_t>(to));
  }
}

namespace detail {
// Walks every piece of a request's state (per layer: each page's K, V, scores; the slot's window rows)
// and hands `move(cache_pointer, host_pointer, count)` each one, so saving and restoring share one walk.
template <class Move>
void for_each_state_piece(cpu_kv_storage& kv, std::span<const block_id> pages, int slot, swap_blob& blob, Move move) {
  const auto& s = kv.shape;
  const auto block_elems = static_cast<std::size_t>(std::int64_t{s.block_size} * s.token_stride());
  const auto score_elems = static_cast<std::size_t>(s.score_cache ? std::int64_t{s.block_size} * s.num_kv_heads : 0);
  const auto slot_elems = static_cast<std::size_t>(std::int64_t{s.window} * s.query_row_stride());
  std::size_t i = 0;
  for (int l = 0; l < s.num_layers; ++l) {
    const auto view = kv.layer(l);
    for (block_id b : pages) {
      const auto at = block_elems * static_cast<std::size_t>(b);
      move(view.k + at, blob.k.data() + i * block_elems, block_elems);
      move(view.v + at, blob.v.data() + i * block_elems, block_elems);
      if (score_elems)
        move(kv.layer_scores(l) + score_elems * static_cast<std::size_t>(b), blob.scores.data() + i * score_elems, score_elems);
      ++i;
    }
    if (slot >= 0 && !blob.queries.empty())
      move(kv.query_rows(l) + slot_elems * static_cast<std::size_t>(slot), blob.queries.data() + slot_elems * static_cast<std::size_t>(l),
           slot_elems);
  }
}
}  // namespace detail

inline swap_blob save_request_state(cpu_kv_storage& kv, std::span<const block_id> pages, int slot) {
  const auto& s = kv.shape;
  const std::size_t n = pages.size() * static_cast<std::size_t>(s.num_layers);
  swap_blob blob;
  blob.num_pages = pages.size();
  blob.k.resize(n * static_cast<std::size_t>(s.block_size * s.token_stride()));
  blob.v.resize(blob.k.size());
  blob.scores.resize(s.score_cache ? n * static_cast<std::size_t>(s.block_size * s.num_kv_heads) : 0);
  blob.queries.resize(slot >= 0 ? static_cast<std::size_t>(std::int64_t{s.num_layers} * s.window * s.query_row_stride()) : 0);
  detail::for_each_state_piece(kv, pages, slot, blob, [](const float* cache, float* host, std::size_t n_) { std::copy_n(cache, n_, host); });
  return blob;
}

// Restores into the first blob.num_pages of `pages` (the rest are fresh room for new tokens) and `slot`.
inline void restore_request_state(cpu_kv_storage& kv, std::span<const block_id> pages, int slot, swap_blob& blob) {
  check(pages.size() >= blob.num_pages, "swap-in: ", pages.size(), " pages for ", blob.num_pages, " saved");
  detail::for_each_state_piece(kv, pages.first(blob.num_pages), slot, blob,
                               [](float* cache, const float* host, std::size_t n_) { std::copy_n(host, n_, cache); });
}

}  // namespace zipage::cpu
