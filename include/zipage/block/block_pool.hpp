#pragma once
// Fixed-size KV blocks handed out by id. A block may be referenced by several requests (prefix sharing),
// so it returns to the free list only when its last reference is released.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/types.hpp"

namespace zipage {

class block_pool {
 public:
  explicit block_pool(int num_blocks) : ref_counts_(static_cast<std::size_t>(num_blocks), 0) {
    check(num_blocks > 0, "block_pool: the KV pool needs at least one block, got ", num_blocks);
    for (block_id b = 0; b < num_blocks; ++b) free_.push_back(b);
  }

  [[nodiscard]] int num_blocks() const { return static_cast<int>(ref_counts_.size()); }
  [[nodiscard]] int num_free() const { return static_cast<int>(free_.size()); }
  [[nodiscard]] int num_used() const { return num_blocks() - num_free(); }
  [[nodiscard]] int peak_used() const { return peak_used_; }
  [[nodiscard]] bool can_allocate(int n) const { return n <= num_free(); }

  // Takes the block that has been free longest (FIFO), so recently released blocks, whose contents a
  // prefix cache may still want, are reused last.
  [[nodiscard]] block_id allocate() {
    check(!free_.empty(), "block_pool: out of blocks (", num_blocks(), " in use)");
    const block_id b = free_.front();
    free_.pop_front();
    ref_counts_[static_cast<std::size_t>(b)] = 1;
    peak_used_ = std::max(peak_used_, num_used());
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
    ++ref_counts_[static_cast<std::size_t>(b)];
  }

  void release(block_id b) {
    check_live(b, "release");
    if (--ref_counts_[static_cast<std::size_t>(b)] == 0) free_.push_back(b);
  }

  void release(std::span<const block_id> blocks) {
    for (block_id b : blocks) release(b);
  }

  [[nodiscard]] int ref_count(block_id b) const {
    check(in_range(b), "block_pool: block id ", b, " out of range");
    return ref_counts_[static_cast<std::size_t>(b)];
  }

  // Sum of all reference counts; tests use it to prove every retain met its release.
  [[nodiscard]] std::int64_t total_references() const {
    std::int64_t total = 0;
    for (int c : ref_counts_) total += c;
    return total;
  }

 private:
  [[nodiscard]] bool in_range(block_id b) const { return b >= 0 && b < num_blocks(); }
  void check_live(block_id b, const char* what) const {
    check(in_range(b), "block_pool: ", what, " of block id ", b, " out of range");
    check(ref_counts_[static_cast<std::size_t>(b)] > 0, "block_pool: ", what, " of free block ", b);
  }

  std::vector<int> ref_counts_;
  std::deque<block_id> free_;
  int peak_used_ = 0;
};

}  // namespace zipage
