#pragma once
// The built-in eviction policies, each a few lines composed of the scoring pieces (scoring.hpp). Tunables
// are public members; the defaults are those of the method each policy comes from. zipage_policy is the
// method's reference default; the others are the baselines it is compared with.
//
// Every score() writes keep_score [kv_heads][kv_len] (higher = keep); the engine then forces the window
// tokens and takes the top keep_tokens() per KV head. Policies with a score cache also fill cache_out.
#include <concepts>
#include <span>
#include <type_traits>
#include <string_view>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/policy/eviction_policy.hpp"
#include "zipage/policy/score_context.hpp"
#include "zipage/policy/score_recipe.hpp"
#include "zipage/policy/scoring.hpp"

namespace zipage {

// Base of a policy whose score is a score_recipe (score_recipe.hpp): Derived defines
// `score_recipe recipe() const`, and score() runs that recipe on the CPU. Backends with device
// compression run the same recipe on the device (see recipe_scored below). To compose a policy of
// your own, derive from recipe_policy<YourPolicy>; to score with arbitrary code, define score() instead
// (then the host path scores it, on every backend).
template <class Derived>
struct recipe_policy : policy_base {
  void score(const score_context& ctx, std::span<float> keep_score, std::span<float> cache_out) const {
    static_assert(requires(const Derived& p) { { p.recipe() } -> std::same_as<score_recipe>; },
                  "zipage::recipe_policy<P>: P must define `zipage::score_recipe recipe() const` (what to score; "
                  "zipage/policy/score_recipe.hpp), or derive from zipage::policy_base and define score() instead");
    scoring::run_recipe(static_cast<const Derived&>(*this).recipe(), ctx, keep_score, cache_out);
  }
};

// A policy scored exactly by its recipe: it has recipe() and its score() is recipe_policy's, not an
// override. A subclass of a built-in that overrides score() is not: its own score() must run, so the
// engine takes the host path for it (dispatch is by this check, never by conversion to a base).
template <class P>
concept recipe_scored = requires(const P& p) {
  { p.recipe() } -> std::same_as<score_recipe>;
  requires std::is_same_v<decltype(&P::score), decltype(&recipe_policy<P>::score)> ||
               requires { typename P::recipe_base; } &&
                   std::is_same_v<decltype(&P::score), decltype(&P::recipe_base::score)>;
};

// The pieces the built-in recipes share, so that a policy made of another's parts (Zipage = G-KV's
// global score + R-KV's redundancy) says so, and each part is set in one place.
namespace recipe_pieces {

// SnapKV's score: this compression's window attention, pooled with a kernel of `pool_kernel` tokens.
[[nodiscard]] inline score_recipe pooled_window(int pool_kernel) {
  score_recipe r;
  r.pooling = score_recipe::pool_when::always;
  r.pool_kernel = pool_kernel;
  return r;
}

// G-KV's global score: the decayed max (gamma) of this compression's attention and the cached scores,
// pooled only at the first compression.
[[nodiscard]] inline score_recipe global_score(float gamma, int first_pool_kernel) {
  score_recipe r;
  r.history = score_recipe::history_kind::decayed_max;
  r.gamma = gamma;
  r.pooling = score_recipe::pool_when::first_compression;
  r.pool_kernel = first_pool_kernel;
  return r;
}

// R-KV's redundancy term (measured as `kind`, weight lambda, similarity threshold tau) added to `r`.
[[nodiscard]] inline score_recipe with_redundancy(score_recipe r, score_recipe::redundancy_kind kind, float lambda, float tau) {
  r.redundancy = kind;
  r.lambda = lambda;
  r.tau = tau;
  return r;
}

}  // namespace recipe_pieces

// StreamingLLM: keep the attention sinks and the most recent tokens; no attention needed at all.
struct streaming_llm : recipe_policy<streaming_llm> {
  using recipe_base = recipe_policy<streaming_llm>;
  int sinks = 4;

  [[nodiscard]] std::string_view name() const { return "streaming_llm"; }
  [[nodiscard]] score_recipe recipe() const {
    score_recipe r;
    r.importance = score_recipe::importance_kind::recency;
    r.sinks = sinks;
    return r;
  }
};

// H2O: heavy hitters, by attention accumulated over every compression so far.
struct h2o : recipe_policy<h2o> {
  using recipe_base = recipe_policy<h2o>;
  static constexpr bool uses_score_cache = true;

  [[nodiscard]] std::string_view name() const { return "h2o"; }
  [[nodiscard]] score_recipe recipe() const {
    score_recipe r;
    r.history = score_recipe::history_kind::accumulate;
    return r;
  }
};

// SnapKV: pooled window attention, recomputed from scratch at every compression.
struct snapkv : recipe_policy<snapkv> {
  using recipe_base = recipe_policy<snapkv>;
  int pool_kernel = 5;

  [[nodiscard]] std::string_view name() const { return "snapkv"; }
  [[nodiscard]] score_recipe recipe() const { return recipe_pieces::pooled_window(pool_kernel); }
};

// R-KV: pooled window attention traded against redundancy over the whole sequence.
struct rkv : recipe_policy<rkv> {
  using recipe_base = recipe_policy<rkv>;
  float lambda = 0.1f;
  float tau = 0.4f;
  int pool_kernel = 5;

  [[nodiscard]] std::string_view name() const { return "rkv"; }
  [[nodiscard]] score_recipe recipe() const {
    return recipe_pieces::with_redundancy(recipe_pieces::pooled_window(pool_kernel), score_recipe::redundancy_kind::full_sequence,
                                          lambda, tau);
  }
};

// G-KV: global score (decayed max over compressions); pooled only at the first compression, where the
// prompt's local structure matters most and no history exists yet.
struct gkv : recipe_policy<gkv> {
  using recipe_base = recipe_policy<gkv>;
  static constexpr bool uses_score_cache = true;
  float gamma = 0.8f;
  int first_pool_kernel = 5;

  [[nodiscard]] std::string_view name() const { return "gkv"; }
  [[nodiscard]] score_recipe recipe() const { return recipe_pieces::global_score(gamma, first_pool_kernel); }
};

// Zipage (the method's reference default): G-KV's global score, pooled at the first compression,
// combined with R-KV's redundancy measured within each block (or over the whole sequence), normalised
// by one softmax over all cached tokens.
struct zipage_policy : recipe_policy<zipage_policy> {
  using recipe_base = recipe_policy<zipage_policy>;
  static constexpr bool uses_score_cache = true;
  float gamma = 0.8f;
  float lambda = 0.2f;
  float tau = 0.4f;
  int first_pool_kernel = 5;
  bool full_redundancy = false;
  int sinks = 0;

  [[nodiscard]] std::string_view name() const { return "zipage"; }
  [[nodiscard]] score_recipe recipe() const {
    score_recipe r = recipe_pieces::with_redundancy(
        recipe_pieces::global_score(gamma, first_pool_kernel),
        full_redundancy ? score_recipe::redundancy_kind::full_sequence : score_recipe::redundancy_kind::block_local, lambda, tau);
    r.sinks = sinks;
    return r;
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
