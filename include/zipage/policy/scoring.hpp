#pragma once
// The scoring pieces the built-in eviction policies are composed of (see docs: method, "Scoring").
//
// This is the CPU reference: fp32 in and out, every sum and softmax accumulated in double, so the CUDA
// kernels can be checked against it with a tight tolerance. Every function writes (or reads) scores laid
// out [kv_heads][kv_len] row-major, token j of head h at h * kv_len + j, in physical token order.
// Wrong shapes throw zipage::error. Element-wise functions allow their output to alias an input.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/policy/score_context.hpp"
#include "zipage/policy/score_recipe.hpp"

namespace zipage::scoring {

// A column's similarity above this marks the row as a duplicate of it (R-KV).
inline constexpr double duplicate_threshold = 0.5;
// Added to a key's L2 norm before dividing, so an all-zero key normalises to zero instead of NaN.
inline constexpr double key_norm_eps = 1e-8;

namespace detail {

[[nodiscard]] inline std::size_t score_count(const score_context& ctx) {
  return static_cast<std::size_t>(ctx.num_kv_heads) * static_cast<std::size_t>(ctx.kv_len);
}

inline void check_scores(const score_context& ctx, std::size_t size, const char* what) {
  check(ctx.num_kv_heads > 0 && ctx.kv_len > 0, "scoring: ", what, ": need kv_heads > 0 and kv_len > 0, got ",
        ctx.num_kv_heads, " and ", ctx.kv_len);
  check(size == score_count(ctx), "scoring: ", what, " holds ", size, " scores, expected kv_heads * kv_len = ",
        score_count(ctx));
}

inline void check_keys(const score_context& ctx) {
  check(ctx.head_dim > 0, "scoring: head_dim must be positive, got ", ctx.head_dim);
  check(ctx.keys.size() == score_count(ctx) * static_cast<std::size_t>(ctx.head_dim), "scoring: keys hold ",
        ctx.keys.size(), " floats, expected kv_heads * kv_len * head_dim");
}

inline void check_queries(const score_context& ctx) {
  check(ctx.num_kv_heads > 0 && ctx.num_q_heads % ctx.num_kv_heads == 0 && ctx.num_q_heads > 0,
        "scoring: q_heads (", ctx.num_q_heads, ") must be a positive multiple of kv_heads (", ctx.num_kv_heads, ")");
  check(ctx.window >= 1 && ctx.window <= ctx.kv_len, "scoring: window must be in [1, kv_len = ", ctx.kv_len,
        "], got ", ctx.window);
  const auto expected = static_cast<std::size_t>(ctx.window) * ctx.num_q_heads * ctx.head_dim;
  check(ctx.queries.size() == expected, "scoring: queries hold ", ctx.queries.size(), " floats, expected ",
        expected);
}

[[nodiscard]] inline double dot(const float* a, const float* b, int n) {
  double s = 0.0;
  for (int i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

[[nodiscard]] inline double dot(const double* a, const double* b, int n) {
  double s = 0.0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Softmax in place; subtracting the max first keeps exp() from overflowing on large logits.
inline void softmax_in_place(std::span<double> x) {
  const double m = *std::max_element(x.begin(), x.end());
  double sum = 0.0;
  for (double& v : x) sum += (v = std::exp(v - m));
  for (double& v : x) v /= sum;
}

// Query w of the window sits at physical position p = kv_len - window + w, so it may only attend to
// tokens [0, p]: later tokens did not exist when it was computed (causal inside the current block).
// Folds the max over h's GQA group of that query's softmax into group_max[0..p].
inline void window_query_group_max(const score_context& ctx, int h, int w, std::span<double> probs,
                                   std::span<double> group_max) {
  const int p = ctx.kv_len - ctx.window + w;
  const double scale = 1.0 / std::sqrt(static_cast<double>(ctx.head_dim));
  const auto row = probs.first(static_cast<std::size_t>(p) + 1);
  std::fill(group_max.begin(), group_max.begin() + p + 1, 0.0);
  for (int g = h * ctx.group(); g < (h + 1) * ctx.group(); ++g) {
    for (int j = 0; j <= p; ++j) row[j] = dot(ctx.query(w, g), ctx.key(h, j), ctx.head_dim) * scale;
    softmax_in_place(row);
    for (int j = 0; j <= p; ++j) group_max[j] = std::max(group_max[j], row[j]);
  }
}

// Shared shape of the two history merges: tokens that already had a score (request compressed before,
// token older than the newest block, whose tokens were never scored) merge A with it; the rest take A.
template <class Merge>
void merge_with_history(const score_context& ctx, std::span<const float> attention, std::span<float> out,
                        Merge merge) {
  check_scores(ctx, attention.size(), "attention");
  check_scores(ctx, out.size(), "output");
  const int history = ctx.first_compression ? 0 : std::max(0, ctx.newest_block_start());
  if (history > 0) check_scores(ctx, ctx.prev_scores.size(), "prev_scores");
  for (int h = 0; h < ctx.num_kv_heads; ++h) {
    for (int j = 0; j < ctx.kv_len; ++j) {
      const std::size_t i = static_cast<std::size_t>(h) * ctx.kv_len + j;
      out[i] = j < history ? merge(attention[i], ctx.prev_scores[i]) : attention[i];
    }
  }
}

// Summed similarity r of the n tokens [begin, begin + n) of head h measured against each other only;
// writes r[begin .. begin + n) of that head's row (not yet normalised).
inline void range_similarity(const score_context& ctx, int h, int begin, int n, std::span<double> r) {
  const int d = ctx.head_dim;
  std::vector<double> unit(static_cast<std::size_t>(n) * d);  // cosine similarity = dot of unit keys
  for (int m = 0; m < n; ++m) {
    const float* k = ctx.key(h, begin + m);
    const double norm = std::sqrt(dot(k, k, d)) + key_norm_eps;
    for (int i = 0; i < d; ++i) unit[static_cast<std::size_t>(m) * d + i] = k[i] / norm;
  }
  std::vector<double> column(n);
  std::fill(r.begin() + begin, r.begin() + begin + n, 0.0);
  for (int c = 0; c < n; ++c) {
    int newest_duplicate = -1;
    for (int m = 0; m < n; ++m) {
      // A token is not redundant with itself: the diagonal is zero.
      column[m] = m == c ? 0.0 : dot(&unit[static_cast<std::size_t>(m) * d], &unit[static_cast<std::size_t>(c) * d], d);
      if (column[m] > duplicate_threshold) newest_duplicate = m;
    }
    // Of a group of near-duplicates, the newest must survive eviction, so its similarity to this
    // column does not count against it.
    if (newest_duplicate >= 0) column[newest_duplicate] = 0.0;
    for (int m = 0; m < n; ++m) r[static_cast<std::size_t>(begin + m)] += column[m];
  }
}

// R = softmax over all of head h's tokens of r / divisor, written to out's row h. One softmax over the
// whole sequence, so one block's repetitiveness competes with every other block's (the reference's
// normalisation, whichever range the similarities were summed over).
inline void normalise_redundancy(const score_context& ctx, int h, std::span<double> r, double divisor,
                                 std::span<float> out) {
  for (double& v : r) v /= divisor;
  softmax_in_place(r);
  const std::size_t row = static_cast<std::size_t>(h) * ctx.kv_len;
  for (int m = 0; m < ctx.kv_len; ++m) out[row + m] = static_cast<float>(r[static_cast<std::size_t>(m)]);
}

inline void check_redundancy(const score_context& ctx, float tau, std::span<float> out) {
  check_keys(ctx);
  check_scores(ctx, out.size(), "redundancy output");
  check(tau > 0.0f, "scoring: redundancy temperature tau must be positive, got ", tau);
}

}  // namespace detail

// A[h][j]: how much the recent window attends to token j. Max over the GQA group keeps a token that any
// one query head needs; mean over the window smooths a single query's spike.
//   A[h][j] = mean_w max_{g in group(h)} softmax_{i <= p_w}(q_{w,g} . k_i / sqrt(d))[j],  p_w = kv_len - W + w
// (j > p_w contributes 0 for that w; the mean always divides by W).
inline void window_attention(const score_context& ctx, std::span<float> out) {
  detail::check_keys(ctx);
  detail::check_queries(ctx);
  detail::check_scores(ctx, out.size(), "window_attention output");
  const auto len = static_cast<std::size_t>(ctx.kv_len);
  std::vector<double> probs(len), group_max(len), sum(len);
  for (int h = 0; h < ctx.num_kv_heads; ++h) {
    std::fill(sum.begin(), sum.end(), 0.0);
    for (int w = 0; w < ctx.window; ++w) {
      detail::window_query_group_max(ctx, h, w, probs, group_max);
      for (int j = 0; j <= ctx.kv_len - ctx.window + w; ++j) sum[j] += group_max[j];
    }
    for (std::size_t j = 0; j < len; ++j) out[h * len + j] = static_cast<float>(sum[j] / ctx.window);
  }
}

// G-KV global score: a token stays important if it mattered to any past window, with old importance
// fading by gamma per compression. S_j = max(A_j, gamma * prev_j) for tokens with history, else A_j.
inline void global_score(const score_context& ctx, std::span<const float> attention, float gamma,
                         std::span<float> out) {
  detail::merge_with_history(ctx, attention, out, [gamma](float a, float prev) {
    return static_cast<float>(std::max(static_cast<double>(a), static_cast<double>(gamma) * prev));
  });
}

// H2O heavy hitters: attention received is summed over all compressions, so S_j = A_j + prev_j for
// tokens with history, else A_j.
inline void accumulated_score(const score_context& ctx, std::span<const float> attention, std::span<float> out) {
  detail::merge_with_history(ctx, attention, out, [](float a, float prev) {
    return static_cast<float>(static_cast<double>(a) + prev);
  });
}

// SnapKV pooling: keeping a token's neighbours along with it preserves local context (whole phrases).
// out_j = max of the row over [j - kernel/2, j + kernel/2] clipped to [0, len) (no padding); kernel odd.
inline void max_pool(std::span<float> scores, int heads, int len, int kernel) {
  check(kernel >= 1 && kernel % 2 == 1, "scoring: max_pool kernel must be odd and >= 1, got ", kernel);
  check(heads > 0 && len > 0 && scores.size() == static_cast<std::size_t>(heads) * len,
        "scoring: max_pool got ", scores.size(), " scores for ", heads, " heads of ", len);
  if (kernel == 1) return;
  const int radius = kernel / 2;
  std::vector<float> row(static_cast<std::size_t>(len));
  for (int h = 0; h < heads; ++h) {
    const auto dst = scores.subspan(static_cast<std::size_t>(h) * len, static_cast<std::size_t>(len));
    std::copy(dst.begin(), dst.end(), row.begin());
    for (int j = 0; j < len; ++j) {
      const int lo = std::max(0, j - radius), hi = std::min(len - 1, j + radius);
      dst[j] = *std::max_element(row.begin() + lo, row.begin() + hi + 1);
    }
  }
}

// R-KV redundancy, "lightning" variant: cosine similarity only within each block of block_size tokens
// (linear in kv_len), then one softmax over the whole sequence per KV head:
//   r_m = sum_{c != m, c in block(m)} cos(k_m, k_c), minus the term of each column c whose newest duplicate
//   (largest m with cos > 0.5) is m;   R = softmax over all kv_len tokens of r / (tau * block_size).
inline void block_redundancy(const score_context& ctx, float tau, std::span<float> out) {
  detail::check_redundancy(ctx, tau, out);
  check(ctx.block_size > 0, "scoring: block_size must be positive, got ", ctx.block_size);
  std::vector<double> r(static_cast<std::size_t>(ctx.kv_len));
  for (int h = 0; h < ctx.num_kv_heads; ++h) {
    for (int begin = 0; begin < ctx.kv_len; begin += ctx.block_size)
      detail::range_similarity(ctx, h, begin, std::min(ctx.block_size, ctx.kv_len - begin), r);
    detail::normalise_redundancy(ctx, h, r, static_cast<double>(tau) * ctx.block_size, out);
  }
}

// R-KV redundancy over the whole sequence as one block (quadratic in kv_len): finds duplicates across
// blocks too. R = softmax over all kv_len tokens of r / (tau * kv_len).
inline void full_redundancy(const score_context& ctx, float tau, std::span<float> out) {
  detail::check_redundancy(ctx, tau, out);
  std::vector<double> r(static_cast<std::size_t>(ctx.kv_len));
  for (int h = 0; h < ctx.num_kv_heads; ++h) {
    detail::range_similarity(ctx, h, 0, ctx.kv_len, r);
    detail::normalise_redundancy(ctx, h, r, static_cast<double>(tau) * ctx.kv_len, out);
  }
}

// R-KV final score: important and not redundant. F = lambda * s - (1 - lambda) * r.
inline void combine(float lambda, std::span<const float> s, std::span<const float> r, std::span<float> out) {
  check(s.size() == r.size() && s.size() == out.size(), "scoring: combine got ", s.size(), " importance, ",
        r.size(), " redundancy and ", out.size(), " output scores");
  const double l = lambda;
  for (std::size_t i = 0; i < s.size(); ++i) out[i] = static_cast<float>(l * s[i] - (1.0 - l) * r[i]);
}

// StreamingLLM attention sinks: the first tokens soak up attention mass the model needs somewhere to
// put, so evicting them hurts whatever their scores say. Sets +inf for physical tokens j < n_sinks.
inline void force_keep_sinks(const score_context& ctx, int n_sinks, std::span<float> scores) {
  detail::check_scores(ctx, scores.size(), "scores");
  const int n = std::clamp(n_sinks, 0, ctx.kv_len);
  for (int h = 0; h < ctx.num_kv_heads; ++h) {
    const auto row = scores.subspan(static_cast<std::size_t>(h) * ctx.kv_len);
    std::fill(row.begin(), row.begin() + n, std::numeric_limits<float>::infinity());
  }
}

// The CPU reference of a score_recipe (score_recipe.hpp): keep_score receives F, cache_out the score the
// score cache remembers (S, before pooling and redundancy) when the recipe merges with a history.
inline void run_recipe(const score_recipe& recipe, const score_context& ctx, std::span<float> keep_score,
                       std::span<float> cache_out) {
  detail::check_scores(ctx, keep_score.size(), "keep_score");
  if (recipe.importance == score_recipe::importance_kind::recency) {
    // Score = physical position: the newest tokens rank highest (exact in float up to 2^24 tokens).
    for (int h = 0; h < ctx.num_kv_heads; ++h)
      for (int j = 0; j < ctx.kv_len; ++j) keep_score[static_cast<std::size_t>(h) * ctx.kv_len + j] = static_cast<float>(j);
  } else {
    window_attention(ctx, keep_score);
  }
  switch (recipe.history) {
    case score_recipe::history_kind::none: break;
    case score_recipe::history_kind::decayed_max: global_score(ctx, keep_score, recipe.gamma, keep_score); break;
    case score_recipe::history_kind::accumulate: accumulated_score(ctx, keep_score, keep_score); break;
  }
  if (recipe.uses_score_cache()) {
    // What the score cache remembers is the unpooled score, taken before any pooling or combining.
    check(cache_out.size() == keep_score.size(), "scoring: cache_out holds ", cache_out.size(), " scores, expected ",
          keep_score.size());
    std::copy(keep_score.begin(), keep_score.end(), cache_out.begin());
  }
  if (recipe.pools(ctx.first_compression)) max_pool(keep_score, ctx.num_kv_heads, ctx.kv_len, recipe.pool_kernel);
  if (recipe.redundancy != score_recipe::redundancy_kind::none) {
    std::vector<float> redundancy(keep_score.size());
    if (recipe.redundancy == score_recipe::redundancy_kind::full_sequence) full_redundancy(ctx, recipe.tau, redundancy);
    else block_redundancy(ctx, recipe.tau, redundancy);
    combine(recipe.lambda, keep_score, redundancy, keep_score);
  }
  if (recipe.sinks > 0) force_keep_sinks(ctx, recipe.sinks, keep_score);
}

}  // namespace zipage::scoring
