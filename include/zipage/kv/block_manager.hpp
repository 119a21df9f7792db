#pragma once
// Grows and shrinks requests' page tables against the shared block pool (nano-vllm's naming:
// can_allocate / allocate / can_append / may_append / deallocate).
#include "zipage/block/block_pool.hpp"
#include "zipage/kv/block_table.hpp"
#include "zipage/request/sequence.hpp"

namespace zipage {

class block_manager {
 public:
  block_manager(block_pool& pool, int block_size) : pool_(&pool), block_size_(block_size) {
    check(block_size > 0, "block_manager: block_size must be positive, got ", block_size);
  }

  [[nodiscard]] int block_size() const { return block_size_; }
  [[nodiscard]] block_pool& pool() const { return *pool_; }

  // Blocks the sequence must gain so that all its pending tokens have a slot.
  [[nodiscard]] int blocks_needed(const sequence& s) const {
    const int total = blocks_for_tokens(s.kv_len + s.num_pending(), block_size_);
    return std::max(0, total - s.table.num_blocks());
  }

  // Prefill (or recompute): room for every pending token.
  [[nodiscard]] bool can_allocate(const sequence& s) const { return pool_->can_allocate(blocks_needed(s)); }
  void allocate(sequence& s) { grow(s); }

  // Decode: room for one more token (a new block only at a block boundary).
  [[nodiscard]] bool can_append(const sequence& s) const { return pool_->can_allocate(blocks_needed(s)); }
  void may_append(sequence& s) { grow(s); }

  void deallocate(sequence& s) {
    for (block_id b : s.table.take()) pool_->release(b);
  }

 private:
  void grow(sequence& s) {
    for (int n = blocks_needed(s); n > 0; --n) s.table.push_back(pool_->allocate());
  }

  block_pool* pool_;
  int block_size_;
};

}  // namespace zipage
