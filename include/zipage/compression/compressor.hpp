#pragma once
// Turns a policy's scores into a compaction plan for one request: for each layer, gather the keys,
// window queries and score cache; let the policy score; force the W window tokens to stay; keep the
// top keep_tokens() per KV head, in their original order.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include "zipage/compression/compaction_plan.hpp"
#include "zipage/compression/compression_job.hpp"
#include "zipage/model/model_config.hpp"
#include "zipage/policy/eviction_policy.hpp"
#include "zipage/policy/policies.hpp"
#include "zipage/request/sequence.hpp"

namespace zipage {

// Indices of the k highest scores (ties to the older token; NaN counts as -inf), ascending.
inline void select_top_k(std::span<const float> scores, int k, std::vector<std::int32_t>& order,
                         std::span<std::int32_t> out) {
  order.resize(scores.size());
  std::iota(order.begin(), order.end(), 0);
  auto value = [&](std::int32_t i) {
    const float v = scores[static_cast<std::size_t>(i)];
    return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v;
  };
  auto better = [&](std::int32_t a, std::int32_t b) { return value(a) > value(b) || (value(a) == value(b) && a < b); };
  std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), better);
  std::copy_n(order.begin(), k, out.begin());
  std::sort(out.begin(), out.end());
}

template <class Policy, class Backend>
class compressor {
 public:
  compressor(const Policy& policy, cache_geometry params, const model_config& model)
      : policy_(&policy), params_(params), model_(model) {
    if constexpr (Policy::evicts) {
      params_.validate();
      // keep_tokens() depends only on the geometry: a value that cannot hold the window, or that keeps more than
      // the budget (the memory plan's B + 1 blocks per request would not hold), is refused before any request.
      const int keep = policy.keep_tokens(params_);
      check(keep >= params_.window && keep <= params_.budget_tokens, "policy ", policy.name(), ": keep_tokens() = ",
            keep, " must be in [window = ", params_.window, ", budget_tokens = ", params_.budget_tokens, "]");
    }
    if constexpr (recipe_scored<Policy>) {
      const score_recipe r = policy.recipe();
      r.validate();
      check(!r.uses_score_cache() || Policy::uses_score_cache, "policy ", policy.name(),
            ": its recipe merges scores with a history, so it must declare uses_score_cache = true");

    }
  }

  // The recipe compression runs (on the host and on a device): the policy's, its sinks cut to what the window
  // leaves of keep_tokens(). Sinks and window are both kept whatever their scores; where they add up to more than
  // is kept the window wins (its queries just scored the rest; the method keeps the newest W tokens always), where
  // ties went to the older tokens and the newest were evicted.
  [[nodiscard]] score_recipe recipe() const
    requires recipe_scored<Policy>
  {
    score_recipe r = policy_->recipe();
    r.sinks = std::min(r.sinks, std::max(0, policy_->keep_tokens(params_) - params_.window));
    return r;
  }

  [[nodiscard]] const cache_geometry& params() const { return params_; }
  [[nodiscard]] const Policy& policy() const { return *policy_; }

  // The policy's keep_tokens(), asked at every compression (on the host or the device), as the engine uses it: a
  // stateful policy may answer otherwise than it did when the engine was built, and keeping more than the budget
  // would outgrow the request's B + 1 blocks.
  [[nodiscard]] int keep_tokens() const {
    const int keep = policy_->keep_tokens(params_);
    check(keep <= params_.budget_tokens, "compression: keep_tokens() = ", keep, " is more than budget_tokens = ",
          params_.budget_tokens);
    return keep;
  }

  compaction_plan plan(Backend& backend, typename Backend::kv_storage& kv, const sequence& s, int slot) {
    return plan(backend, kv, compression_request{s.id, s.table.blocks(), s.kv_len, slot, s.num_compressions == 0});
  }

  compaction_plan plan(Backend& backend, typename Backend::kv_storage& kv, const compression_request& r) {
    const int kv_len = r.kv_len;
    const int slot = r.slot;
    const int keep = std::min(keep_tokens(), kv_len);
    check(keep >= params_.window, "compression: keeping ", keep, " tokens cannot hold the window of ", params_.window);
    compaction_plan p;
    p.request = r.id;
    p.old_len = kv_len;
    p.new_len = keep;
    p.num_layers = model_.num_layers;
    p.num_kv_heads = model_.num_kv_heads;
    p.pages = r.pages;
    const auto per_head = static_cast<std::size_t>(kv_len);
    const auto heads = static_cast<std::size_t>(model_.num_kv_heads);
    p.keep.resize(static_cast<std::size_t>(p.num_layers) * heads * static_cast<std::size_t>(keep));
    if (Policy::uses_score_cache) p.kept_scores.resize(p.keep.size());
    keep_score_.resize(heads * per_head);
    cache_out_.resize(heads * per_head);

    for (int l = 0; l < p.num_layers; ++l) {
      backend.gather_keys(kv, l, p.pages, kv_len, keys_);
      backend.gather_window_queries(kv, l, slot, queries_);
      if (Policy::uses_score_cache) backend.gather_scores(kv, l, p.pages, kv_len, prev_);
      else prev_.assign(heads * per_head, 0.0f);
      const score_context ctx{kv_len, model_.num_kv_heads, model_.num_q_heads, model_.head_dim, params_.block_size,
                              params_.window, r.first_compression, keys_, queries_, prev_};
      std::fill(cache_out_.begin(), cache_out_.end(), 0.0f);
      score(ctx);
      for (std::size_t h = 0; h < heads; ++h) {
        const std::span<float> row(keep_score_.data() + h * per_head, per_head);
        // The newest W tokens always stay: their queries are the ones that just scored everyone else.
        std::fill(row.end() - params_.window, row.end(), std::numeric_limits<float>::infinity());
        const auto out_offset = p.offset(l, static_cast<int>(h));
        const std::span<std::int32_t> kept(p.keep.data() + out_offset, static_cast<std::size_t>(keep));
        select_top_k(row, keep, order_, kept);
        if (Policy::uses_score_cache)
          for (int i = 0; i < keep; ++i)
            p.kept_scores[out_offset + static_cast<std::size_t>(i)] =
                cache_out_[h * per_head + static_cast<std::size_t>(kept[static_cast<std::size_t>(i)])];
      }
    }
    return p;
  }

 private:
  // A recipe-scored policy runs its recipe itself (the very recipe a device backend would run), so a
  // subclass that only changes recipe() is scored the same on every backend.
  void score(const score_context& ctx) {
    if constexpr (recipe_scored<Policy>) scoring::run_recipe(recipe(), ctx, keep_score_, cache_out_);
    else policy_->score(ctx, keep_score_, cache_out_);
  }

  const Policy* policy_;
  cache_geometry params_;
  model_config model_;
  std::vector<float> keys_, queries_, prev_, keep_score_, cache_out_;
  std::vector<std::int32_t> order_;
};

}  // namespace zipage
