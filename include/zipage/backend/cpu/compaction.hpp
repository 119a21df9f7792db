#pragma once
// CPU reference of the compression data movement: gathering what the scorer needs out of the paged
// cache, carrying out a compaction plan in place, copy-on-write and swap.
//
// Each operation is one loop written once (namespace detail) over a cache *layout*: what arrays a block
// holds and how one token head moves. f32_layout here serves the fp32 cache; fp8::fp8_layout
// (fp8_kv.hpp) serves the FP8 cache, whose blocks hold scales beside the codes. Reads of a cached head
// as fp32 go through a row reader (f32_rows here, fp8::dequantized_rows there), so the FP8 reference
// runs the same operations in the same order as the fp32 one on the dequantised values.
#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "zipage/backend/cpu/kv_storage.hpp"
#include "zipage/core/error.hpp"
#include "zipage/core/types.hpp"
#include "zipage/compression/compaction_plan.hpp"

namespace zipage::cpu {

inline std::int64_t page_slot(std::span<const block_id> pages, int block_size, int j) {
  return std::int64_t{pages[static_cast<std::size_t>(j / block_size)]} * block_size + j % block_size;
}

// The fp32 cache's row reader: a cached key or value head is its own row, read in place.
struct f32_rows {
  paged_kv_layer<const float> kv;

  [[nodiscard]] const float* key(std::int64_t slot, int head) const { return kv.k + kv.offset(slot, head); }
  [[nodiscard]] const float* value(std::int64_t slot, int head) const { return kv.v + kv.offset(slot, head); }
};

// A request's state in host memory while it is swapped out: its blocks' K, V and scores, and its
// query-window rows.
struct swap_blob {
  std::size_t num_pages = 0;
  std::vector<float> k, v, scores, queries;
};

namespace detail {
// What every cache's layer holds paged by block, K, V and (with a score cache) the scores:
// f(cache_pointer, elements_per_block, the Blob member that holds it while swapped out) for each.
template <class Blob, class Storage, class F>
void for_each_kv_block_array(Storage& kv, int l, F& f) {
  const auto& s = kv.shape;
  const auto view = kv.layer(l);
  const auto block_elems = static_cast<std::size_t>(std::int64_t{s.block_size} * s.token_stride());
  f(view.k, block_elems, &Blob::k);
  f(view.v, block_elems, &Blob::v);
  if (s.score_cache) f(kv.layer_scores(l), static_cast<std::size_t>(std::int64_t{s.block_size} * s.num_kv_heads), &Blob::scores);
}

// Moves one token head's K and V rows (values or codes) from slot `from` to slot `to` of a layer view.
template <class View>
void move_kv_head(const View& view, std::int64_t from, std::int64_t to, int h) {
  std::copy_n(view.k + view.offset(from, h), view.head_dim, view.k + view.offset(to, h));
  std::copy_n(view.v + view.offset(from, h), view.head_dim, view.v + view.offset(to, h));
}
}  // namespace detail

// The fp32 cache's layout for the loops below: its block-paged arrays (for_each_block_array) and how
// one token head moves (move_head).
struct f32_layout {
  using storage = cpu_kv_storage;
  using blob = swap_blob;

  template <class F>
  static void for_each_block_array(storage& kv, int l, F&& f) {
    detail::for_each_kv_block_array<blob>(kv, l, f);
  }
  static void move_head(const paged_kv_layer<float>& view, std::int64_t from, std::int64_t to, int h) {
    detail::move_kv_head(view, from, to, h);
  }
};

namespace detail {

// Keys of one layer as [kv_heads][kv_len][head_dim], each read as fp32 through `rows`.
template <class Rows>
void gather_keys(Rows& rows, std::span<const block_id> pages, int kv_len, std::vector<float>& out) {
  const auto& kv = rows.kv;
  out.resize(static_cast<std::size_t>(kv.num_kv_heads) * kv_len * kv.head_dim);
  for (int h = 0; h < kv.num_kv_heads; ++h)
    for (int j = 0; j < kv_len; ++j)
      std::copy_n(rows.key(page_slot(pages, kv.block_size, j), h), kv.head_dim,
                  out.data() + (static_cast<std::size_t>(h) * kv_len + j) * kv.head_dim);
}

// The score cache of one layer as [kv_heads][kv_len] (zeros without a score cache). Both caches keep
// it in fp32, laid out alike.
template <class Storage>
void gather_scores(Storage& kv, int layer, std::span<const block_id> pages, int kv_len, std::vector<float>& out) {
  const auto& s = kv.shape;
  out.assign(static_cast<std::size_t>(s.num_kv_heads) * kv_len, 0.0f);
  if (!s.score_cache) return;
  const float* scores = kv.layer_scores(layer);
  for (int h = 0; h < s.num_kv_heads; ++h)
    for (int j = 0; j < kv_len; ++j)
      out[static_cast<std::size_t>(h) * kv_len + j] = scores[page_slot(pages, s.block_size, j) * s.num_kv_heads + h];
}

// Moves every kept token of every (layer, head) to slots 0..new_len-1 in order. Kept indices ascend,
// so a token's destination never lies after its source: the move is safe in place, front to back.
template <class Layout>
void apply_compaction(typename Layout::storage& kv, const compaction_plan& plan) {
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
        if (src != dst) Layout::move_head(view, page_slot(plan.pages, s.block_size, src), to, h);
        if (scores && !kept_scores.empty()) scores[to * s.num_kv_heads + h] = kept_scores[static_cast<std::size_t>(dst)];
      }
    }
  }
}

// Copy-on-write: every block-paged array of every layer, block `from` to block `to`.
template <class Layout>
void copy_block(typename Layout::storage& kv, block_id from, block_id to) {
  const auto f = static_cast<std::size_t>(from), t = static_cast<std::size_t>(to);
  for (int l = 0; l < kv.shape.num_layers; ++l)
    Layout::for_each_block_array(kv, l, [&](auto* base, std::size_t n, auto) { std::copy_n(base + n * f, n, base + n * t); });
}

// Walks every piece of a request's state (per layer: each page's block arrays; the slot's window rows)
// and hands `move(cache_pointer, host_pointer, count)` each one, so saving and restoring share one walk.
template <class Layout, class Move>
void for_each_state_piece(typename Layout::storage& kv, std::span<const block_id> pages, int slot,
                          typename Layout::blob& blob, Move move) {
  const auto& s = kv.shape;
  const auto slot_elems = static_cast<std::size_t>(std::int64_t{s.window} * s.query_row_stride());
  for (int l = 0; l < s.num_layers; ++l) {
    const std::size_t first = static_cast<std::size_t>(l) * pages.size();  // this layer's first page in the blob
    Layout::for_each_block_array(kv, l, [&](auto* base, std::size_t n, auto member) {
      for (std::size_t p = 0; p < pages.size(); ++p)
        move(base + n * static_cast<std::size_t>(pages[p]), (blob.*member).data() + (first + p) * n, n);
    });
    if (slot >= 0 && !blob.queries.empty())
      move(kv.query_rows(l) + slot_elems * static_cast<std::size_t>(slot), blob.queries.data() + slot_elems * static_cast<std::size_t>(l),
           slot_elems);
  }
}

template <class Layout>
typename Layout::blob save_request_state(typename Layout::storage& kv, std::span<const block_id> pages, int slot) {
  const auto& s = kv.shape;
  const std::size_t n = pages.size() * static_cast<std::size_t>(s.num_layers);
  typename Layout::blob blob;
  blob.num_pages = pages.size();
  Layout::for_each_block_array(kv, 0, [&](auto*, std::size_t per_block, auto member) { (blob.*member).resize(n * per_block); });
  blob.queries.resize(slot >= 0 ? static_cast<std::size_t>(std::int64_t{s.num_layers} * s.window * s.query_row_stride()) : 0);
  for_each_state_piece<Layout>(kv, pages, slot, blob, [](const auto* cache, auto* host, std::size_t n_) { std::copy_n(cache, n_, host); });
  return blob;
}

// Restores into the first blob.num_pages of `pages` (the rest are fresh room for new tokens) and `slot`.
template <class Layout>
void restore_request_state(typename Layout::storage& kv, std::span<const block_id> pages, int slot, typename Layout::blob& blob) {
  check(pages.size() >= blob.num_pages, "swap-in: ", pages.size(), " pages for ", blob.num_pages, " saved");
  for_each_state_piece<Layout>(kv, pages.first(blob.num_pages), slot, blob,
                               [](auto* cache, const auto* host, std::size_t n_) { std::copy_n(host, n_, cache); });
}

}  // namespace detail

// keys of one layer as [kv_heads][kv_len][head_dim]
inline void gather_keys(cpu_kv_storage& kv, int layer, std::span<const block_id> pages, int kv_len,
                        std::vector<float>& out) {
  f32_rows rows{std::as_const(kv).layer(layer)};
  detail::gather_keys(rows, pages, kv_len, out);
}

// score cache of one layer as [kv_heads][kv_len]
inline void gather_scores(cpu_kv_storage& kv, int layer, std::span<const block_id> pages, int kv_len,
                          std::vector<float>& out) {
  detail::gather_scores(kv, layer, pages, kv_len, out);
}

// window queries of one layer and slot as [W][q_heads][head_dim] (the FP8 cache keeps them fp32 too)
template <class Storage>
std::span<const float> window_queries(Storage& kv, int layer, int slot) {
  const auto& s = kv.shape;
  const auto rows = static_cast<std::size_t>(s.window * s.query_row_stride());
  return {kv.query_rows(layer) + static_cast<std::size_t>(slot) * rows, rows};
}

inline void apply_compaction(cpu_kv_storage& kv, const compaction_plan& plan) { detail::apply_compaction<f32_layout>(kv, plan); }

inline void copy_block(cpu_kv_storage& kv, block_id from, block_id to) { detail::copy_block<f32_layout>(kv, from, to); }

inline swap_blob save_request_state(cpu_kv_storage& kv, std::span<const block_id> pages, int slot) {
  return detail::save_request_state<f32_layout>(kv, pages, slot);
}

// Restores into the first blob.num_pages of `pages` (the rest are fresh room for new tokens) and `slot`.
inline void restore_request_state(cpu_kv_storage& kv, std::span<const block_id> pages, int slot, swap_blob& blob) {
  detail::restore_request_state<f32_layout>(kv, pages, slot, blob);
}

}  // namespace zipage::cpu
