#pragma once
// Eviction policies decide which cached tokens a request keeps once its cache reaches its budget.
//
// A policy answers three questions: what to score (score()), how many tokens to keep (keep_tokens())
// and when to compress (should_compress()). The engine does the rest, the same for every policy: it
// gathers each (layer, request) into a score_context, forces the window tokens to stay, takes the top
// keep_tokens() per KV head, and compacts the cache in place (plan, then apply).
//
// To write your own, derive from policy_base and define score(); see examples/custom_policy.
#include <concepts>
#include <span>
#include <string_view>

#include "zipage/policy/score_context.hpp"

namespace zipage {

template <class P>
concept eviction_policy = requires(const P& p, const score_context& ctx, std::span<float> keep_score,
                                   std::span<float> cache_out, const cache_geometry& params, int kv_len) {
  { p.name() } -> std::convertible_to<std::string_view>;
  { P::evicts } -> std::convertible_to<bool>;
  { P::uses_score_cache } -> std::convertible_to<bool>;
  // keep_score, cache_out: [kv_heads][kv_len]. Higher keep_score = more worth keeping. cache_out receives
  // what the score cache should remember for each token (read back as ctx.prev_scores next time); it
  // is ignored unless uses_score_cache.
  p.score(ctx, keep_score, cache_out);
  { p.should_compress(kv_len, params) } -> std::convertible_to<bool>;
  { p.keep_tokens(params) } -> std::convertible_to<int>;
};

// Defaults shared by the compressing policies: compress at a block boundary once the request holds
// budget + 1 blocks, keep budget · block_size tokens, no score cache.
struct policy_base {
  static constexpr bool evicts = true;
  static constexpr bool uses_score_cache = false;
  [[nodiscard]] bool should_compress(int kv_len, const cache_geometry& p) const { return p.should_compress(kv_len); }
  [[nodiscard]] int keep_tokens(const cache_geometry& p) const { return p.keep_tokens(); }
};

// Full KV: every token stays cached for the life of the request.
struct full_kv {
  static constexpr bool evicts = false;
  static constexpr bool uses_score_cache = false;
  [[nodiscard]] std::string_view name() const { return "full_kv"; }
  void score(const score_context&, std::span<float>, std::span<float>) const {}
  [[nodiscard]] bool should_compress(int, const cache_geometry&) const { return false; }
  [[nodiscard]] int keep_tokens(const cache_geometry& p) const { return p.keep_tokens(); }
};

}  // namespace zipage
