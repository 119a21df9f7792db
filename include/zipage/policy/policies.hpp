#pragma once
// The built-in eviction policies, each a few lines composed of the scoring pieces (scoring.hpp). Tunables
// are public members; the defaults are those of the method each policy comes from. zipage_policy is the
// method's reference default; the others are the baselines it is compared with.
//
// Every score() writes keep_score [kv_heads][kv_len] (higher = keep); the engine then forces the window
// tokens and takes the top keep_tokens() per KV head. Policies with a score cache also fill cache_out.
#include <algorithm>
#include <span>
#include <string_view>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/policy/eviction_policy.hpp"
#include "zipage/policy/score_context.hpp"
#include "zipage/policy/scoring.hpp"

namespace zipage {

namespace detail {
// What the score cache remembers must be the unpooled score, taken before any pooling or combining.
inline void store_score_cache(std::span<const float> scores, std::span<float> cache_out) {
  check(cache_out.size() == scores.size(), "policy: cache_out holds ", cache_out.size(), " scores, expected ",
        scores.size());
  std::copy(scores.begin(), scores.end(), cache_out.begin());
}
}  // namespace detail

// StreamingLLM: keep the attention sinks and the most recent tokens; no attention needed at all.
struct streaming_llm : policy_base {
  int sinks = 4;

  [[nodiscard]] std::string_view name() const { return "streaming_llm"; }
  void score(const score_context& ctx, std::span<float> keep_score, std::span<float> /*cache_out*/) const {
    scoring::detail::check_scores(ctx, keep_score.size(), "keep_score");
    // Score = physical position: the newest tokens rank highest (exact in float up to 2^24 tokens).
    for (int h = 0; h < ctx.num_kv_heads; ++h) {
      const auto row = keep_score.subspan(static_cast<std::size_t>(h) * ctx.kv_len);
      for (int j = 0; j < ctx.kv_len; ++j) row[j] = static_cast<float>(j);
    }
    scoring::force_keep_sinks(ctx, sinks, keep_score);
  }
};

// H2O: heavy hitters, by attention accumulated over every compression so far.
struct h2o : policy_base {
  static constexpr bool uses_score_cache = true;

  [[nodiscard]] std::string_view name() const { return "h2o"; }
  void score(const score_context& ctx, std::span<float> keep_score, std::span<float> cache_out) const {
    scoring::window_attention(ctx, keep_score);
    scoring::accumulated_score(ctx, keep_score, keep_score);
    detail::store_score_cache(keep_score, cache_out);
  }
};

// SnapKV: pooled window attention, recomputed from scratch at every compression.
struct snapkv : policy_base {
  int pool_kernel = 5;

  [[nodiscard]] std::string_view name() const { return "snapkv"; }
  void score(const score_context& ctx, std::span<float> keep_score, std::span<float> /*cache_out*/) const {
    scoring::window_attention(ctx, keep_score);
    scoring::max_pool(keep_score, ctx.num_kv_heads, ctx.kv_len, pool_kernel);
  }
};

// R-KV: pooled window attention traded against redundancy over the whole sequence.
struct rkv : policy_base {
  float lambda = 0.1f;
  float tau = 0.4f;
  int pool_kernel = 5;

  [[nodiscard]] std::string_view name() const { return "rkv"; }
  void score(const score_context& ctx, std::span<float> keep_score, std::span<float> /*cache_out*/) const {
    scoring::window_attention(ctx, keep_score);
    scoring::max_pool(keep_score, ctx.num_kv_heads, ctx.kv_len, pool_kernel);
    std::vector<float> redundancy(keep_score.size());
    scoring::full_redundancy(ctx, tau, redundancy);
    scoring::combine(lambda, keep_score, redundancy, keep_score);
  }
};

// G-KV: global score (decayed max over compressions); pooled only at the first compression, where the
// prompt's local structure matters most and no history exists yet.
struct gkv : policy_base {
  static constexpr bool uses_score_cache = true;
  float gamma = 0.8f;
  int first_pool_kernel = 5;

  [[nodiscard]] std::string_view name() const { return "gkv"; }
  void score(const score_context& ctx, std::span<float> keep_score, std::span<float> cache_out) const {
    scoring::window_attention(ctx, keep_score);
    scoring::global_score(ctx, keep_score, gamma, keep_score);
    detail::store_score_cache(keep_score, cache_out);
    if (ctx.first_compression) scoring::max_pool(keep_score, ctx.num_kv_heads, ctx.kv_len, first_pool_kernel);
  }
};

// Zipage (the method's reference default): G-KV's global score, pooled at the first compression,
// combined with R-KV's redundancy measured within each block (or over the whole sequence).
struct zipage_policy : policy_base {
  static constexpr bool uses_score_cache = true;
  float gamma = 0.8f;
  float lambda = 0.2f;
  float tau = 0.4f;
  int first_pool_kernel = 5;
  bool full_redundancy = false;
  int sinks = 0;

  [[nodiscard]] std::string_view name() const { return "zipage"; }
  void score(const score_context& ctx, std::span<float> keep_score, std::span<float> cache_out) const {
    scoring::window_attention(ctx, keep_score);
    scoring::global_score(ctx, keep_score, gamma, keep_score);
    detail::store_score_cache(keep_score, cache_out);
    if (ctx.first_compression) scoring::max_pool(keep_score, ctx.num_kv_heads, ctx.kv_len, first_pool_kernel);
    std::vector<float> redundancy(keep_score.size());
    if (full_redundancy) {
      scoring::full_redundancy(ctx, tau, redundancy);
    } else {
      scoring::block_redundancy(ctx, tau, redundancy);
    }
    scoring::combine(lambda, keep_score, redundancy, keep_score);
    if (sinks > 0) scoring::force_keep_sinks(ctx, sinks, keep_score);
  }
};

static_assert(eviction_policy<full_kv>);
static_assert(eviction_policy<streaming_llm>);
static_assert(eviction_policy<h2o>);
static_assert(eviction_policy<snapkv>);
static_assert(eviction_policy<rkv>);
static_assert(eviction_policy<gkv>);
static_assert(eviction_policy<zipage_policy>);

// Calls f(P{}) once for every built-in policy type P, in the order of builtin_policy_names(); lets a
// tool pick a policy by name and instantiate the engine for its type.
template <class F>
void for_each_builtin_policy(F&& f) {
  f(full_kv{});
  f(streaming_llm{});
  f(h2o{});
  f(snapkv{});
  f(rkv{});
  f(gkv{});
  f(zipage_policy{});
}

// The name() of every built-in policy.
[[nodiscard]] inline std::vector<std::string_view> builtin_policy_names() {
  return {"full_kv", "streaming_llm", "h2o", "snapkv", "rkv", "gkv", "zipage"};
}

}  // namespace zipage
