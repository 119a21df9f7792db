#pragma once
// A request's page table: the blocks that hold its KV, in order, and how many physical slots are filled.
// Physical slot i of the request lives in blocks[i / block_size] at offset i % block_size.
#include <utility>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/types.hpp"

namespace zipage {

[[nodiscard]] constexpr int blocks_for_tokens(int tokens, int block_size) {
  return (tokens + block_size - 1) / block_size;
}

class block_table {
 public:
  [[nodiscard]] const std::vector<block_id>& blocks() const { return blocks_; }
  [[nodiscard]] int num_blocks() const { return static_cast<int>(blocks_.size()); }
  [[nodiscard]] bool empty() const { return blocks_.empty(); }
  [[nodiscard]] int capacity(int block_size) const { return num_blocks() * block_size; }

  // Flat slot index into the pool ([blocks][block_size]) of the request's physical slot i.
  [[nodiscard]] std::int64_t slot(int physical_index, int block_size) const {
    const int which = physical_index / block_size;
    check(physical_index >= 0 && which < num_blocks(), "block_table: slot ", physical_index,
          " is outside the ", num_blocks(), " blocks held");
    return static_cast<std::int64_t>(blocks_[static_cast<std::size_t>(which)]) * block_size +
           physical_index % block_size;
  }

  void push_back(block_id b) { blocks_.push_back(b); }
  void assign(std::vector<block_id> blocks) { blocks_ = std::move(blocks); }
  // Hands the blocks to the caller (who releases them) and leaves the table empty.
  [[nodiscard]] std::vector<block_id> take() { return std::exchange(blocks_, {}); }

 private:
  std::vector<block_id> blocks_;
};

}  // namespace zipage
