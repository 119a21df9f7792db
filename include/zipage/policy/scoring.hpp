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

// Redundancy of the n tokens [begin, begin + n) of head h measured against each other only; writes
// out[begin .. begin + n) of that head's row.
inline void range_redundancy(const score_context& ctx, int h, int begin, int n, float tau, std::span<float> out) {
  const int d = ctx.head_dim;
  std::vector<double> unit(static_cast<std::size_t>(n) * d);  // cosine similarity = dot of unit keys
  for (int m = 0; m < n; ++m) {
    const float* k = ctx.key(h, begin + m);
    const double norm = std::sqrt(dot(k, k, d)) + key_norm_eps;
    for (int i = 0; i < d; ++i) unit[static_cast<std::size_t>(m) * d + i] = k[i] / norm;
  }
  std::vector<double> r(n, 0.0), column(n);
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
    for (int m = 0; m < n; ++m) r[m] += column[m];
  }
  // Dividing by tau * n turns the summed similarity into a tempered mean before the softmax.
  for (double& v : r) v /= static_cast<double>(tau) * n;
  softmax_in_place(r);
  const std::size_t row = static_cast<std::size_t>(h) * ctx.kv_len + begin;
  for (int m = 0; m < n; ++m) out[row + m] = static_cast<float>(r[m]);
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

// R-KV redundancy, "lightning" variant: similarity only within each block of block_size tokens, so the
// cost is linear in kv_len. Per block of n tokens (the last one may be shorter, n = kv_len mod block_size):
//   r_m = sum_{c != m} cos(k_m, k_c), minus the term of each column c whose newest duplicate (largest m
//   with cos > 0.5) is m;   R = softmax over the block of r / (tau * n).
inline void block_redundancy(const score_context& ctx, float tau, std::span<float> out) {
  detail::check_redundancy(ctx, tau, out);
  check(ctx.block_size > 0, "scoring: block_size must be positive, got ", ctx.block_size);
  for (int h = 0; h < ctx.num_kv_heads; ++h) {
    for (int begin = 0; begin < ctx.kv_len; begin += ctx.block_size) {
      detail::range_redundancy(ctx, h, begin, std::min(ctx.block_size, ctx.kv_len - begin), tau, out);
    }
  }
}

// R-KV redundancy over the whole sequence as one block (quadratic in kv_len): finds duplicates across
// blocks too. R = softmax over all kv_len tokens of r / (tau * kv_len).
inline void full_redundancy(const score_context& ctx, float tau, std::span<float> out) {
  detail::check_redundancy(ctx, tau, out);
  for (int h = 0; h < ctx.num_kv_heads; ++h) detail::range_redundancy(ctx, h, 0, ctx.kv_len, tau, out);
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

}  // namespace zipage::scoring
