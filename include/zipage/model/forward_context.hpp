#pragma once
// What a model's forward pass sees of one engine step: the batch's tokens and logical positions, the
// rows whose logits are wanted, and the engine's paged-attention op. The engine owns the KV cache; a
// model never touches page tables.
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

template <class Backend>
class forward_context {
 public:
  using tensor = typename Backend::tensor;

  forward_context(Backend& backend, typename Backend::kv_storage& kv, const forward_batch& batch, int num_q_heads)
      : backend_(&backend), kv_(&kv), batch_(&batch), num_q_heads_(num_q_heads) {}

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
  void attention(int layer, const tensor& q, const tensor& k, const tensor& v, tensor& out) const {
    backend_->attention(*kv_, layer, batch_->attention, q, k, v, num_q_heads_, out);
  }

 private:
  Backend* backend_;
  typename Backend::kv_storage* kv_;
  const forward_batch* batch_;
  int num_q_heads_;
};

}  // namespace zipage
