#pragma once
// Batch layout: a step_plan as the one forward batch the model runs. The planned tokens go back to back
// with their logical positions (RoPE), their physical slots (block_table::slot), per-token causal
// lengths, the page tables in CSR form, the rows whose logits are sampled and, when queries are recorded
// (an evicting policy), the query-window row of each token in the last W positions of a block. It reads
// the requests and writes nothing of them. The buffers are kept between steps (no reallocation).
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "zipage/core/cache_geometry.hpp"
#include "zipage/model/forward_context.hpp"
#include "zipage/scheduler/step_plan.hpp"

namespace zipage {

class batch_layout {
 public:
  // record_window: queries are recorded for compression (an evicting policy: the geometry's window W).
  batch_layout(const cache_geometry& geometry, bool record_window)
      : block_size_(geometry.block_size), window_(geometry.window), record_window_(record_window) {}

  // Lays the plan's tokens out; the returned batch views this layout until the next build or pad.
  const forward_batch& build(const step_plan& plan) {
    tokens_.clear();
    positions_.clear();
    slots_.clear();
    token_seq_.clear();
    token_kv_len_.clear();
    logits_rows_.clear();
    page_indptr_.assign(1, 0);
    page_indices_.clear();
    window_rows_.clear();
    for (std::size_t i = 0; i < plan.batch.size(); ++i) {
      const scheduled_seq& e = plan.batch[i];
      const sequence& s = *e.seq;
      for (int j = 0; j < e.tokens; ++j) {
        const int logical = s.num_computed + j;
        const int physical = s.kv_len + j;
        tokens_.push_back(s.tokens[static_cast<std::size_t>(logical)]);
        positions_.push_back(logical);
        slots_.push_back(s.table.slot(physical, block_size_));
        token_seq_.push_back(static_cast<std::int32_t>(i));
        token_kv_len_.push_back(physical + 1);
        if (record_window_) window_rows_.push_back(window_row(s, physical));
      }
      if (e.samples()) logits_rows_.push_back(static_cast<std::int32_t>(tokens_.size()) - 1);
      page_indices_.insert(page_indices_.end(), s.table.blocks().begin(), s.table.blocks().end());
      page_indptr_.push_back(static_cast<std::int32_t>(page_indices_.size()));
    }
    point(logits_rows_);
    return batch_;
  }

  // Pads a pure decode batch to `padded` sequences (a decode graph's batch size): one token each that
  // writes nowhere (slot -1), attends to nothing (kv_len 0, no pages) and records no query; every row's
  // logits are computed.
  const forward_batch& pad(int padded) {
    const int real = static_cast<int>(tokens_.size());
    for (int i = real; i < padded; ++i) {
      tokens_.push_back(0);
      positions_.push_back(0);
      slots_.push_back(-1);
      token_seq_.push_back(i);
      token_kv_len_.push_back(0);
      page_indptr_.push_back(page_indptr_.back());
      if (record_window_) window_rows_.push_back(-1);
    }
    graph_rows_.resize(static_cast<std::size_t>(padded));
    std::iota(graph_rows_.begin(), graph_rows_.end(), 0);
    point(graph_rows_);
    return batch_;
  }

  [[nodiscard]] const forward_batch& batch() const { return batch_; }
  // Rows of the logits the model returns for the plan's sampling entries, in batch order (before padding).
  [[nodiscard]] std::size_t num_sampled_rows() const { return logits_rows_.size(); }

 private:
  // Queries are recorded while the write position is in the last W slots of a block, so at a block
  // boundary the window holds the last W queries of the block that just filled.
  [[nodiscard]] std::int32_t window_row(const sequence& s, int physical) const {
    const int offset = physical % block_size_ - (block_size_ - window_);
    return offset >= 0 && s.query_slot >= 0 ? s.query_slot * window_ + offset : -1;
  }

  // The forward batch views the buffers (again after they grew).
  void point(std::span<const std::int32_t> logits_rows) {
    batch_.tokens = tokens_;
    batch_.positions = positions_;
    batch_.logits_rows = logits_rows;
    batch_.attention = {slots_, token_seq_, token_kv_len_, page_indptr_, page_indices_, window_rows_};
  }

  int block_size_;
  int window_;
  bool record_window_;
  std::vector<token_id> tokens_;
  std::vector<std::int32_t> positions_, token_seq_, token_kv_len_, logits_rows_, page_indptr_, page_indices_;
  std::vector<std::int64_t> slots_;
  std::vector<std::int32_t> window_rows_;
  std::vector<std::int32_t> graph_rows_;  // logits rows of a padded decode-graph step (all of them)
  forward_batch batch_;
};

}  // namespace zipage
