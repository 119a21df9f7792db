#pragma once
// The cache geometry of Compressed PagedAttention: tokens per KV block, the budget a compressed request
// keeps, and the window W of recent queries. One value with the method's defaults, checked once; every
// other place (engine_config's fields, scheduler_config, memory_request, the policies' should_compress /
// keep_tokens, the compressor, the step executor, the tools' flags) takes it or derives from it.
//
// The method keeps 2048 tokens per compressed request and scores with the newest W = 16 queries (the
// reference: 8 blocks of 256); zipage keeps 2048 tokens whatever the block size, 16 by default.
#include <cstdint>
#include <string>
#include <string_view>

#include "zipage/core/error.hpp"

namespace zipage {

inline constexpr int default_block_size = 16;       // tokens per KV block
inline constexpr int default_budget_tokens = 2048;  // tokens a compressed request keeps
inline constexpr int default_window = 16;           // W: recent queries that score the cache, tokens always kept
inline constexpr int reference_block_size = 256;    // the reference implementation's block (zipage-bench's default)

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

struct cache_geometry {
  int block_size = default_block_size;
  int budget_tokens = default_budget_tokens;  // a whole number of blocks: B = budget_tokens / block_size
  int window = default_window;                // W, in [1, block_size]

  // The block size alone (what a policy that never evicts uses). `owner` prefixes the field's name in the
  // message, e.g. "engine_config::" or "--" (flags).
  void validate_block_size(std::string_view owner = "cache_geometry::") const {
    check(block_size > 0, owner, "block_size must be positive, got ", block_size);
  }
  // All three: block_size > 0, budget_tokens a positive multiple of it, 1 <= window <= block_size. Each
  // error names the field as `owner` spells it.
  void validate(std::string_view owner = "cache_geometry::") const {
    validate_block_size(owner);
    (void)budget_blocks_for(budget_tokens, block_size, std::string(owner) + "budget_tokens");
    check(window >= 1 && window <= block_size, owner, "window must be in [1, block_size = ", block_size, "], got ",
          window);
  }

  // B: blocks a compressed request keeps (a validated geometry: budget_tokens is a multiple of block_size).
  [[nodiscard]] int budget_blocks() const { return budget_tokens / block_size; }
  [[nodiscard]] int keep_tokens() const { return budget_tokens; }
  // At a block boundary with more than B full blocks: B+1 in steady state, more right after a long prompt.
  [[nodiscard]] bool should_compress(int kv_len) const {
    return kv_len >= std::int64_t{budget_tokens} + block_size && kv_len % block_size == 0;
  }

  friend bool operator==(const cache_geometry&, const cache_geometry&) = default;
};

// The name policies and backends took the geometry by before it had one (the eviction_policy concept's
// should_compress(kv_len, params) / keep_tokens(params), the backends' compress_on_device).
using compression_params = cache_geometry;

}  // namespace zipage
