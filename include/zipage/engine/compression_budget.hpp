#pragma once
// The method's defaults for Compressed PagedAttention, and the one conversion from a budget in tokens
// (what users and the paper speak in) to whole blocks (what the pool, the scheduler and the compressor
// count). The reference keeps 2048 tokens per compressed request (8 blocks of 256) and scores with the
// newest W = 16 queries; zipage keeps 2048 tokens whatever the block size.
#include <string_view>

#include "zipage/core/error.hpp"

namespace zipage {

inline constexpr int default_budget_tokens = 2048;  // tokens a compressed request keeps
inline constexpr int default_window = 16;           // W: recent queries that score the cache, tokens always kept

// B = budget_tokens / block_size. A budget that is not a whole number of blocks is an error (not rounded),
// naming the budget as the caller knows it (`name`: a field such as "engine_config::budget_tokens" or a
// flag such as "--budget") and the nearest budgets that would work.
[[nodiscard]] inline int budget_blocks_for(int budget_tokens, int block_size,
                                           std::string_view name = "engine_config::budget_tokens") {
  check(block_size > 0, "block size must be positive, got ", block_size);
  check(budget_tokens > 0, name, " must be a positive number of tokens, got ", budget_tokens);
  if (budget_tokens % block_size != 0) {
    const int below = budget_tokens / block_size * block_size;
    const int above = below + block_size;
    if (below > 0)
      fail(name, " = ", budget_tokens, " tokens is not a multiple of the block size ", block_size,
           " (a compressed request keeps whole blocks): use ", below, " or ", above);
    fail(name, " = ", budget_tokens, " tokens is not a multiple of the block size ", block_size,
         " (a compressed request keeps whole blocks): use ", above, " or a smaller block size");
  }
  return budget_tokens / block_size;
}

}  // namespace zipage
