#pragma once
// Fixed-size KV blocks handed out by id. A block may be referenced by several requests (prefix sharing),
// so it returns to the free list only when its last reference is released.
//
// Prefix cache: a full block can be registered under the chained hash of its tokens. When its last
// reference goes, it joins the free list still holding its contents and hash, so a later request with
// the same prefix can take it back (lookup). allocate() reuses the block that has been free longest
// and only then forgets its hash: cached blocks are evicted in LRU order.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/types.hpp"

namespace zipage {

class block_pool {
 public:
  explicit block_pool(int num_blocks) {
    check(num_blocks > 0, "block_pool: the KV pool needs at least one block, got ", num_blocks);
    const auto n = static_cast<std::size_t>(num_blocks);
    ref_counts_.assign(n, 0);
    prev_.assign(n, invalid_block);
    next_.assign(n, invalid_block);
    cached_.resize(n);
    for (block_id b = 0; b < num_blocks; ++b) push_free(b);
  }

  [[nodiscard]] int num_blocks() const { return static_cast<int>(ref_counts_.size()); }
  [[nodiscard]] int num_free() const { return num_free_; }
  [[nodiscard]] int num_used() const { return num_blocks() - num_free(); }
  [[nodiscard]] int peak_used() const { return peak_used_; }
  [[nodiscard]] bool can_allocate(int n) const { return n <= num_free(); }

  [[nodiscard]] block_id allocate() {
    check(num_free_ > 0, "block_pool: out of blocks (", num_blocks(), " in use)");
    const block_id b = head_;
    unlink_free(b);
    forget(b);  // its old contents are about to be overwritten
    ref_counts_[index(b)] = 1;
    note_use();
    return b;
  }

  [[nodiscard]] std::vector<block_id> allocate(int n) {
    check(can_allocate(n), "block_pool: asked for ", n, " blocks, ", num_free(), " free");
    std::vector<block_id> out;
    out.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) out.push_back(allocate());
    return out;
  }

  void retain(block_id b) {
    check_live(b, "retain");
    ++ref_counts_[index(b)];
  }

  void release(block_id b) {
    check_live(b, "release");
    if (--ref_counts_[index(b)] == 0) {
      if (!cached_[index(b)].ready) forget(b);  // its contents will never be computed now
      push_free(b);
    }
  }

  void release(std::span<const block_id> blocks) {
    for (block_id b : blocks) release(b);
  }

  [[nodiscard]] int ref_count(block_id b) const {
    check(in_range(b), "block_pool: block id ", b, " out of range");
    return ref_counts_[index(b)];
  }

  // Sum of all reference counts; tests use it to prove every retain met its release.
  [[nodiscard]] std::int64_t total_references() const {
    std::int64_t total = 0;
    for (int c : ref_counts_) total += c;
    return total;
  }

  // ---- prefix cache ----

  // Makes a full block findable by the chained hash of its tokens. A block registered before the step
  // that computes it is `pending` until mark_ready: a request that finds it then waits a step instead
  // of computing the same prefix again. A hash already taken keeps its first owner.
  void register_block(block_id b, std::uint64_t hash, std::span<const token_id> tokens, bool ready) {
    check_live(b, "register");
    if (by_hash_.contains(hash) || cached_[index(b)].registered) return;
    cached_[index(b)] = {true, ready, hash, {tokens.begin(), tokens.end()}};
    by_hash_.emplace(hash, b);
  }

  void mark_ready(block_id b) {
    if (cached_[index(b)].registered) cached_[index(b)].ready = true;
  }

  // Drops a block's hash (its contents are about to change, e.g. compaction).
  void forget(block_id b) {
    auto& c = cached_[index(b)];
    if (!c.registered) return;
    by_hash_.erase(c.hash);
    c = {};
  }

  [[nodiscard]] bool is_registered(block_id b) const { return cached_[index(b)].registered; }

  struct prefix_match {
    block_id block = invalid_block;  // referenced once more for the caller, when found and ready
    bool pending = false;            // found, but its step has not run yet
  };

  // The cached block holding exactly `tokens` under `hash` (taken off the free list if it was there).
  // The token comparison guards against hash collisions.
  [[nodiscard]] prefix_match lookup(std::uint64_t hash, std::span<const token_id> tokens) {
    ++lookups_;
    const auto it = by_hash_.find(hash);
    if (it == by_hash_.end()) return {};
    const block_id b = it->second;
    const auto& entry = cached_[index(b)];
    if (!std::equal(entry.tokens.begin(), entry.tokens.end(), tokens.begin(), tokens.end())) return {};
    if (!entry.ready) return {invalid_block, true};
    if (ref_counts_[index(b)] == 0) {
      unlink_free(b);
      note_use();
    }
    ++ref_counts_[index(b)];
    ++hits_;
    return {b, false};
  }

  [[nodiscard]] std::int64_t prefix_lookups() const { return lookups_; }
  [[nodiscard]] std::int64_t prefix_hits() const { return hits_; }

 private:
  struct cache_entry {
    bool registered = false;
    bool ready = true;
    std::uint64_t hash = 0;
    std::vector<token_id> tokens;
  };

  [[nodiscard]] static std::size_t index(block_id b) { return static_cast<std::size_t>(b); }
  [[nodiscard]] bool in_range(block_id b) const { return b >= 0 && b < num_blocks(); }
  void check_live(block_id b, const char* what) const {
    check(in_range(b), "block_pool: ", what, " of block id ", b, " out of range");
    check(ref_counts_[index(b)] > 0, "block_pool: ", what, " of free block ", b);
  }
  void note_use() { peak_used_ = std::max(peak_used_, num_used()); }

  // The free list is intrusive and doubly linked, so a cached block can leave it from the middle in O(1).
  void push_free(block_id b) {
    prev_[index(b)] = tail_;
    next_[index(b)] = invalid_block;
    if (tail_ != invalid_block) next_[index(tail_)] = b;
    else head_ = b;
    tail_ = b;
    ++num_free_;
  }
  void unlink_free(block_id b) {
    const block_id p = prev_[index(b)], n = next_[index(b)];
    if (p != invalid_block) next_[index(p)] = n;
    else head_ = n;
    if (n != invalid_block) prev_[index(n)] = p;
    else tail_ = p;
    prev_[index(b)] = next_[index(b)] = invalid_block;
    --num_free_;
  }

  std::vector<int> ref_counts_;
  std::vector<block_id> prev_, next_;
  block_id head_ = invalid_block, tail_ = invalid_block;
  int num_free_ = 0;
  int peak_used_ = 0;
  std::vector<cache_entry> cached_;
  std::unordered_map<std::uint64_t, block_id> by_hash_;
  std::int64_t lookups_ = 0, hits_ = 0;
};

}  // namespace zipage
