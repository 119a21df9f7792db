#pragma once
// What a model's forward pass sees of one engine step: the batch's tokens and logical positions, the
// rows whose logits are wanted, and the engine's paged-attention op. The engine owns the KV cache; a
// model never touches page tables.
//
// Nano-batches (issue 14 part 3, docs/architecture.md "Overlap inside a decode step"): on a backend that can run
// attention beside its GEMMs (`overlapping_backend`) the engine may also hand a decode step's batch as two halves.
// A model that wants the overlap runs each half's layers through nano_batch(i), whose attention() returns at once
// (the backend runs it on its attention stream) and whose wait_attention() orders what follows after it; a model
// that ignores the halves runs the whole batch as before.
#include <cassert>
#include <concepts>
#include <cstdint>
#include <span>

#include "zipage/core/types.hpp"
#include "zipage/kv/paged_kv.hpp"

namespace zipage {

struct forward_batch {
  std::span<const token_id> tokens;          // [num_tokens] new tokens of all sequences, back to back
  std::span<const std::int32_t> positions;   // [num_tokens] logical position of each (for RoPE)
  std::span<const std::int32_t> logits_rows; // [num_seqs] row of each sequence's last token
  attention_metadata attention;
};

// A backend that overlaps one nano-batch's attention with the other's work. attention_async launches the
// attention of nano-batch `nano` (0 or 1) after the work issued so far and returns; wait_attention(nano) makes
// the work issued after it wait for that attention (its output, and its reads of q/k/v). nano_batch_split(n) is
// how many of a decode batch's n sequences go into the first nano-batch (0: do not split). concat_rows(a, b, out)
// stacks a's rows over b's.
template <class B>
concept overlapping_backend = requires(const B& b, typename B::kv_storage& kv, const attention_metadata& meta,
                                       const typename B::tensor& ct, typename B::tensor& t) {
  { b.nano_batch_split(1) } -> std::convertible_to<int>;
  b.attention_async(kv, 0, meta, ct, ct, ct, 1, t, 0);
  b.wait_attention(0);
  b.concat_rows(ct, ct, t);
};

// The split both built-in backends use: halves of a decode batch of at least `min_batch` sequences (min_batch
// 0: never), the first rounded down to a multiple of 16 sequences once a half has 32 or more (GEMM tiles).
[[nodiscard]] inline int nano_batch_split(int num_seqs, int min_batch) {
  if (min_batch <= 0 || num_seqs < min_batch || num_seqs < 2) return 0;
  const int half = num_seqs / 2;
  return half >= 32 ? half / 16 * 16 : half;
}

template <class Backend>
class forward_context {
 public:
  using tensor = typename Backend::tensor;

  // nano_batches: empty, or the two halves of `batch` (sequences [0, s) and [s, n)), each with its own metadata.
  forward_context(Backend& backend, typename Backend::kv_storage& kv, const forward_batch& batch, int num_q_heads,
                  std::span<const forward_batch> nano_batches = {})
      : backend_(&backend), kv_(&kv), batch_(&batch), num_q_heads_(num_q_heads), nano_(nano_batches) {
    assert(nano_.empty() || nano_.size() == 2);
  }

  [[nodiscard]] Backend& backend() const { return *backend_; }
  [[nodiscard]] std::span<const token_id> tokens() const { return batch_->tokens; }
  [[nodiscard]] std::span<const std::int32_t> positions() const { return batch_->positions; }
  [[nodiscard]] std::span<const std::int32_t> logits_rows() const { return batch_->logits_rows; }
  [[nodiscard]] int num_tokens() const { return static_cast<int>(batch_->tokens.size()); }
  // The step's batch and KV storage as the engine passed them (a tensor-parallel model hands each rank a
  // context of its own over its share of the storage: models/llama_tp.hpp).
  [[nodiscard]] const forward_batch& batch() const { return *batch_; }
  [[nodiscard]] typename Backend::kv_storage& kv() const { return *kv_; }

  // Appends this step's K/V of `layer` to the paged cache and attends. q, out: [tokens][q_heads*head_dim];
  // k, v: [tokens][kv_heads*head_dim], already rotated.
  // In a nano-batch's context the attention runs asynchronously: call wait_attention() before touching
  // q/k/v/out again.
  void attention(int layer, const tensor& q, const tensor& k, const tensor& v, tensor& out) const {
    if constexpr (overlapping_backend<Backend>) {
      if (nano_index_ >= 0) {
        backend_->attention_async(*kv_, layer, batch_->attention, q, k, v, num_q_heads_, out, nano_index_);
        return;
      }
    }
    backend_->attention(*kv_, layer, batch_->attention, q, k, v, num_q_heads_, out);
  }
  void wait_attention() const {
    if constexpr (overlapping_backend<Backend>) {
      if (nano_index_ >= 0) backend_->wait_attention(nano_index_);
    }
  }

  // 2 when the engine split this step into nano-batches (only on an overlapping_backend), else 0.
  [[nodiscard]] int num_nano_batches() const { return static_cast<int>(nano_.size()); }
  // Nano-batch i's context: its tokens, positions, logits rows (rows of its own tokens) and attention.
  [[nodiscard]] forward_context nano_batch(int i) const {
    assert(i >= 0 && i < num_nano_batches());
    forward_context half(*backend_, *kv_, nano_[static_cast<std::size_t>(i)], num_q_heads_);
    half.nano_index_ = i;
    return half;
  }

 private:
  Backend* backend_;
  typename Backend::kv_storage* kv_;
  const forward_batch* batch_;
  int num_q_heads_;
  std::span<const forward_batch> nano_;
  int nano_index_ = -1;  // which nano-batch this context is, -1 for the whole batch
};

}  // namespace zipage
