#pragma once
// Log-probabilities of one logits row under the model (before penalties, temperature and sampling filters,
// as OpenAI and vLLM report them by default): the sampled token's, and the k most likely tokens'.
//
// logprob(i) = (logit(i) - max) - log(sum_j exp(logit(j) - max)), the sum in double precision in id order,
// the result rounded to float. Logits are sanitised as the sampler does (NaN counts as -inf, +inf as the
// largest float), so a row never yields NaN; a -inf logit has logprob -inf. The top k are ordered by
// descending (sanitised) logit, ties by ascending id. The device (backend/cuda/sampling.hpp) computes the
// same values, its sum in another order (within float rounding).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/types.hpp"

namespace zipage {

struct token_logprob {
  token_id id = 0;
  float logprob = 0.0f;
  friend bool operator==(const token_logprob&, const token_logprob&) = default;
};

// The sampler's view of a logit: NaN -> -inf, +inf -> the largest float.
[[nodiscard]] inline float logprob_sanitize(float x) {
  if (std::isnan(x)) return -std::numeric_limits<float>::infinity();
  if (x == std::numeric_limits<float>::infinity()) return std::numeric_limits<float>::max();
  return x;
}

// The row's maximum and log(sum exp(logit - max)), which every token's logprob shares.
struct log_normalizer {
  float max = 0.0f;
  double log_sum = 0.0;

  explicit log_normalizer(std::span<const float> row) {
    check(!row.empty(), "logprobs: empty logits row");
    max = -std::numeric_limits<float>::infinity();
    for (const float x : row) max = std::max(max, logprob_sanitize(x));
    double sum = 0.0;
    if (max != -std::numeric_limits<float>::infinity())
      for (const float x : row) sum += std::exp(static_cast<double>(logprob_sanitize(x) - max));
    log_sum = std::log(sum);  // -inf for a row with nothing finite: every logprob is then NaN
  }
  [[nodiscard]] float operator()(float logit) const {
    return static_cast<float>((logprob_sanitize(logit) - max) - log_sum);
  }
};

// The log-probability of token `tok`.
[[nodiscard]] inline float token_logprob_of(std::span<const float> row, token_id tok) {
  check(tok >= 0 && static_cast<std::size_t>(tok) < row.size(), "logprobs: token ", tok, " outside the row of ",
        row.size());
  return log_normalizer(row)(row[static_cast<std::size_t>(tok)]);
}

// The min(k, vocab) most likely tokens with their log-probabilities, most likely first. O(vocab · k) worst
// case, O(vocab) in practice (k <= 20).
[[nodiscard]] inline std::vector<token_logprob> top_logprobs(std::span<const float> row, int k) {
  check(k >= 0, "logprobs: k must be >= 0, got ", k);
  const std::size_t n = std::min(static_cast<std::size_t>(k), row.size());
  std::vector<token_logprob> top;
  if (n == 0) return top;
  top.reserve(n + 1);
  // (logit, id) ranks before (logit', id') when logit > logit', or equal and id < id' (sanitised logits).
  auto before = [&](token_id a, token_id b) {
    const float xa = logprob_sanitize(row[static_cast<std::size_t>(a)]);
    const float xb = logprob_sanitize(row[static_cast<std::size_t>(b)]);
    return xa > xb || (xa == xb && a < b);
  };
  for (std::size_t i = 0; i < row.size(); ++i) {
    const auto id = static_cast<token_id>(i);
    if (top.size() == n && !before(id, top.back().id)) continue;
    auto at = std::find_if(top.begin(), top.end(), [&](const token_logprob& t) { return before(id, t.id); });
    top.insert(at, {id, 0.0f});
    if (top.size() > n) top.pop_back();
  }
  const log_normalizer norm(row);
  for (token_logprob& t : top) t.logprob = norm(row[static_cast<std::size_t>(t.id)]);
  return top;
}

}  // namespace zipage
