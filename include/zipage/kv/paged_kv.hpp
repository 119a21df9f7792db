#pragma once
// What an attention kernel needs to read and write the paged cache of one layer, as small copyable
// views (FlashInfer's paged_kv_t idea): raw pointers, the shape, and per-token / per-sequence
// metadata in CSR form. The same structs describe host and device memory.
#include <cstdint>
#include <span>

namespace zipage {

struct kv_cache_shape {
  int num_layers = 0;
  int num_blocks = 0;
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  // The model's query heads (0: not given; the engine always gives them, so that a backend can check a kernel's
  // head-group limit before the first step).
  int num_q_heads = 0;
  // Compression state, allocated only when a policy evicts:
  int window = 0;            // W queries recorded per query slot: [layers][slots][W][q_heads][head_dim]
  int num_query_slots = 0;
  bool score_cache = false;  // one score per cached token per KV head per layer: [layers][blocks][block_size][kv_heads]

  [[nodiscard]] std::int64_t score_elements() const {
    return score_cache ? std::int64_t{num_layers} * num_blocks * block_size * num_kv_heads : 0;
  }
  [[nodiscard]] std::int64_t query_row_stride() const { return std::int64_t{num_q_heads} * head_dim; }
  [[nodiscard]] std::int64_t query_layer_stride() const {
    return std::int64_t{num_query_slots} * window * query_row_stride();
  }

  [[nodiscard]] std::int64_t token_stride() const { return std::int64_t{num_kv_heads} * head_dim; }
  [[nodiscard]] std::int64_t layer_stride() const {
    return std::int64_t{num_blocks} * block_size * token_stride();
  }
  // Elements of K (or V) for all layers: [layers][blocks][block_size][kv_heads][head_dim].
  [[nodiscard]] std::int64_t elements_per_side() const { return layer_stride() * num_layers; }
};

// K and V of one layer: [num_blocks][block_size][kv_heads][head_dim] each.
template <class T>
struct paged_kv_layer {
  T* k = nullptr;
  T* v = nullptr;
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;

  [[nodiscard]] std::int64_t offset(std::int64_t slot, int head) const {
    return (slot * num_kv_heads + head) * head_dim;
  }
};

// Per-step attention metadata for a batch of sequences whose new tokens are laid out back to back.
struct attention_metadata {
  std::span<const std::int64_t> slot_mapping;  // [num_tokens] pool slot (block * block_size + offset) for the new K/V;
                                               // -1: a padding row (decode graphs) whose K/V go nowhere
  std::span<const std::int32_t> token_seq;     // [num_tokens] index of the token's sequence in the batch
  std::span<const std::int32_t> token_kv_len;  // [num_tokens] physical KV length the token attends to (causal, incl. itself)
  std::span<const std::int32_t> page_indptr;   // [num_seqs + 1] CSR offsets into page_indices
  std::span<const std::int32_t> page_indices;  // block ids of each sequence's page table, in order
  // [num_tokens] row (slot * W + w) of the query-window cache this token's query is recorded in, or -1.
  // Empty when nothing is recorded. No two tokens of a batch name the same row: a backend writes them in
  // parallel (batch_layout keeps only the last writer of each row).
  std::span<const std::int32_t> token_window_row;

  [[nodiscard]] int num_tokens() const { return static_cast<int>(slot_mapping.size()); }
  [[nodiscard]] int num_seqs() const { return static_cast<int>(page_indptr.size()) - 1; }
};

}  // namespace zipage
