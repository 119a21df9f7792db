#pragma once
// Grows and shrinks requests' page tables against the shared block pool (nano-vllm's naming:
// can_allocate / allocate / can_append / may_append / deallocate), and matches and registers prompt
// prefixes in the pool's prefix cache.
#include <algorithm>
#include <cstdint>
#include <span>

#include "zipage/block/block_pool.hpp"
#include "zipage/kv/block_table.hpp"
#include "zipage/request/sequence.hpp"

namespace zipage {

// Hash of a block's tokens chained onto the hash of everything before it, so equal hashes mean equal
// prefixes (the pool still compares tokens to rule out collisions).
[[nodiscard]] inline std::uint64_t chain_hash(std::uint64_t prev, std::span<const token_id> tokens) {
  std::uint64_t h = prev ^ 0x9e3779b97f4a7c15ull;
  for (token_id t : tokens) {
    h ^= static_cast<std::uint64_t>(static_cast<std::uint32_t>(t)) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
  }
  return h;
}

class block_manager {
 public:
  block_manager(block_pool& pool, int block_size) : pool_(&pool), block_size_(block_size) {
    check(block_size > 0, "block_manager: block_size must be positive, got ", block_size);
  }

  [[nodiscard]] int block_size() const { return block_size_; }
  [[nodiscard]] block_pool& pool() const { return *pool_; }

  // Blocks the sequence must gain so that its next `tokens` tokens have a slot.
  [[nodiscard]] int blocks_needed(const sequence& s, int tokens) const {
    const int total = blocks_for_tokens(s.kv_len + tokens, block_size_);
    return std::max(0, total - s.table.num_blocks());
  }
  [[nodiscard]] int blocks_needed(const sequence& s) const { return blocks_needed(s, s.num_pending()); }

  // Prefill (or recompute): room for every pending token, or for a chunk of them.
  [[nodiscard]] bool can_allocate(const sequence& s) const { return can_allocate(s, s.num_pending()); }
  [[nodiscard]] bool can_allocate(const sequence& s, int tokens) const { return pool_->can_allocate(blocks_needed(s, tokens)); }
  void allocate(sequence& s) { allocate(s, s.num_pending()); }
  void allocate(sequence& s, int tokens) {
    for (int n = blocks_needed(s, tokens); n > 0; --n) s.table.push_back(pool_->allocate());
  }

  // Decode: room for one more token (a new block only at a block boundary).
  [[nodiscard]] bool can_append(const sequence& s) const { return can_allocate(s, 1); }
  void may_append(sequence& s) { allocate(s, 1); }

  // After a compaction: keeps the blocks that hold the first `tokens` slots and releases the rest.
  void shrink(sequence& s, int tokens) {
    std::vector<block_id> blocks = s.table.take();
    const auto kept = std::min(blocks.size(), static_cast<std::size_t>(blocks_for_tokens(tokens, block_size_)));
    for (std::size_t b = kept; b < blocks.size(); ++b) pool_->release(blocks[b]);
    blocks.resize(kept);
    s.table.assign(std::move(blocks));
  }

  void deallocate(sequence& s) {
    for (block_id b : s.table.take()) pool_->release(b);
    s.num_hashed_blocks = 0;
    s.prefix_hash = 0;
  }

  struct prefix_result {
    int reused_tokens = 0;
    bool pending = false;  // the next block of this prefix is being computed this step: wait for it
  };

  // At admission of a request with an empty table: takes cached blocks for its leading full blocks —
  // never the block holding the last token its prefill feeds (sequence::num_to_prefill: the prompt's last,
  // or a recomputed request's second to last), which must be computed to give logits and, for a request
  // compressed right there, to record the window queries (they are not cached with the blocks).
  prefix_result match_prefix(sequence& s) {
    if (!s.table.empty() || s.kv_len != 0) return {};
    const int candidates = (s.num_to_prefill() - 1) / block_size_;
    std::uint64_t hash = 0;
    int matched = 0;
    bool pending = false;
    for (; matched < candidates; ++matched) {
      const auto tokens = block_tokens(s, matched);
      const std::uint64_t h = chain_hash(hash, tokens);
      const auto m = pool_->lookup(h, tokens);
      pending = m.pending;
      if (m.block == invalid_block) break;
      s.table.push_back(m.block);
      hash = h;
    }
    const int reused = matched * block_size_;
    s.num_computed = s.kv_len = reused;
    s.num_hashed_blocks = matched;
    s.prefix_hash = hash;
    s.num_prefix_hit_tokens += reused;
    return {reused, pending};
  }

  // At allocation for a step that will compute `tokens` more: blocks this step completes become
  // findable at once, as pending, so requests admitted right after wait for them instead of computing
  // the same prefix in parallel.
  void register_planned_blocks(sequence& s, int tokens) { register_blocks(s, s.num_computed + tokens, false); }

  // After a step that computed `tokens` of s: every completed block of an uncompressed request is
  // findable, and the ones this step filled (registered as pending when planned) are ready.
  void register_full_blocks(sequence& s, int tokens) {
    if (s.is_finished()) return;
    register_blocks(s, s.num_computed, true);
    const int first = std::max(0, (s.num_computed - tokens) / block_size_);
    for (int b = first; b < s.num_hashed_blocks; ++b) pool_->mark_ready(s.table.blocks()[static_cast<std::size_t>(b)]);
  }

 private:
  void register_blocks(sequence& s, int computed_tokens, bool ready) {
    if (s.is_compressed() || s.kv_len != s.num_computed) return;
    const int full = std::min(computed_tokens / block_size_, s.table.num_blocks());
    for (; s.num_hashed_blocks < full; ++s.num_hashed_blocks) {
      const auto tokens = block_tokens(s, s.num_hashed_blocks);
      s.prefix_hash = chain_hash(s.prefix_hash, tokens);
      pool_->register_block(s.table.blocks()[static_cast<std::size_t>(s.num_hashed_blocks)], s.prefix_hash, tokens, ready);
    }
  }

  [[nodiscard]] std::span<const token_id> block_tokens(const sequence& s, int block) const {
    return {s.tokens.data() + static_cast<std::size_t>(block) * static_cast<std::size_t>(block_size_),
            static_cast<std::size_t>(block_size_)};
  }

  block_pool* pool_;
  int block_size_;
};

}  // namespace zipage
