#pragma once
// Confidence intervals for pass@1 (zipage-eval accuracy / math).
//
//  * mean_ci_normal: pass@1 with n samples per problem is the mean over problems of each problem's share of
//    correct samples; its 95% interval is the normal approximation over problems, mean ± z·s/√N (s the
//    sample standard deviation of the per-problem shares), clipped to [0, 1]. Problems, not samples, are
//    the independent units: samples of one problem are correlated.
//  * wilson_interval: a binary outcome per problem (greedy pass@1), Wilson's score interval.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>

namespace zipage::eval {

struct interval {
  double mean = 0, lo = 0, hi = 0;
};

inline constexpr double z95 = 1.959963984540054;

inline interval mean_ci_normal(std::span<const double> values, double z = z95) {
  interval r;
  const auto n = static_cast<double>(values.size());
  if (values.empty()) return r;
  for (double v : values) r.mean += v / n;
  if (values.size() < 2) return {r.mean, r.mean, r.mean};
  double ss = 0;
  for (double v : values) ss += (v - r.mean) * (v - r.mean);
  const double half = z * std::sqrt(ss / (n - 1.0) / n);
  r.lo = std::clamp(r.mean - half, 0.0, 1.0);
  r.hi = std::clamp(r.mean + half, 0.0, 1.0);
  return r;
}

inline interval wilson_interval(std::size_t successes, std::size_t trials, double z = z95) {
  if (trials == 0) return {};
  const double n = static_cast<double>(trials), p = static_cast<double>(successes) / n, z2 = z * z;
  const double center = (p + z2 / (2 * n)) / (1 + z2 / n);
  const double half = z / (1 + z2 / n) * std::sqrt(p * (1 - p) / n + z2 / (4 * n * n));
  return {p, std::max(0.0, center - half), std::min(1.0, center + half)};
}

}  // namespace zipage::eval
