#pragma once
// JSON Schema's multipleOf for guided_json (zipage/sampling/json_schema.hpp, guided.hpp): whether a number's
// spelling is a multiple of a decimal divisor, decided byte by byte, so that guided.hpp can run it in step with the
// DFA of the spellings (the bounds) and keep the pairs as an automaton. No regex text says it compactly: the
// spellings of the multiples of 7 form a regular language, but one whose regex is huge.
//
// A divisor with q digits after the point is p / 10^q, p an integer. x is a multiple of it iff x * 10^q / p is an
// integer: iff x's digits past the q-th after the point are zeros and N, x's digits up to the q-th after the point
// read as one integer (the fraction padded with zeros to q digits), is divisible by p. The sign does not matter.
// The tracker reads the digits and keeps N's remainder so far. p = g * m with g = 2^a * 5^b and m prime to 10: the
// remainder mod m is kept whole, the remainder mod g only up to what any digits written after it can still change
// (g divides 10^c, c = max(a, b), so digits past the c-th next do not depend on it). That keeps the automaton of a
// divisor such as 1000000 small (7 classes rather than 10^6 remainders), while every remainder mod m matters.
#include <algorithm>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "zipage/sampling/json_number_range.hpp"

namespace zipage::json_multiple_of {

// Divisors with more significant digits are refused (p must fit 64 bits with room for one more digit).
inline constexpr std::size_t max_digits = 18;

// multipleOf = p / 10^q.
struct divisor {
  std::uint64_t p = 1;
  int q = 0;
};

// multipleOf's JSON text (as nlohmann's dump writes it: 5, 0.01, 2.5e-05) as a divisor; nullopt when it is not a
// number above zero of at most max_digits significant digits (nor json_number_range's digit limits).
inline std::optional<divisor> parse(const std::string& text) {
  const auto d = json_number_range::parse_decimal(text);
  if (!d || d->negative || d->zero()) return std::nullopt;
  std::string digits = (d->integer == "0" ? "" : d->integer) + d->fraction;
  digits.erase(0, digits.find_first_not_of('0'));
  if (digits.empty() || digits.size() > max_digits) return std::nullopt;
  return divisor{std::stoull(digits), static_cast<int>(d->fraction.size())};
}

// Reads a number's spelling (JSON's, without an exponent) byte by byte.
class tracker {
 public:
  struct state {
    int fraction = -1;          // digits read after the point (at most q counted), -1 before the point
    std::uint64_t rest = 0;     // N so far mod m
    std::int32_t tail = 0;      // the class of N so far mod g (see classes_)
    friend auto operator<=>(const state&, const state&) = default;
  };

  explicit tracker(divisor d) : q_(d.q), m_(d.p), g_(1) {
    for (const std::uint64_t f : {2u, 5u}) {
      int k = 0;
      for (; m_ % f == 0; m_ /= f) g_ *= f, ++k;
      c_ = std::max(c_, k);
    }
  }

  [[nodiscard]] state start() { return {-1, 0, intern(0)}; }

  // The state after byte `b`; nullopt when no spelling that goes on this way is a multiple (a non-zero digit past
  // the q-th after the point) or `b` has no place in a spelling without an exponent.
  [[nodiscard]] std::optional<state> step(state s, unsigned char b) {
    if (b == '-') return s;
    if (b == '.') {
      if (s.fraction >= 0) return std::nullopt;
      s.fraction = 0;
      return s;
    }
    if (b < '0' || b > '9') return std::nullopt;
    const unsigned d = b - '0';
    if (s.fraction >= q_) return d == 0 ? std::optional<state>(s) : std::nullopt;
    s.rest = (s.rest * 10 + d) % m_;
    s.tail = intern((representative_[static_cast<std::size_t>(s.tail)] * 10 + d) % g_);
    if (s.fraction >= 0) ++s.fraction;
    return s;
  }

  // Whether the number read is a multiple: N (the fraction padded to q digits) is divisible by p.
  [[nodiscard]] bool multiple(const state& s) const {
    if (s.rest != 0) return false;  // 10 is invertible mod m: padding does not change divisibility by m
    const int pad = q_ - std::max(s.fraction, 0);
    return pad >= c_ || classes_[static_cast<std::size_t>(s.tail)][static_cast<std::size_t>(pad)] == 0;
  }

 private:
  static constexpr std::uint64_t none = std::numeric_limits<std::uint64_t>::max();

  int q_;
  std::uint64_t m_, g_;
  int c_ = 0;
  // A remainder t mod g as what digits written after it can do: for each count n < c, the least n-digit string w
  // (as a number) that makes t * 10^n + w divisible by g, or `none`. Two remainders with the same list are
  // indistinguishable (strings that make one divisible make the other so), and the class of t * 10 + d follows from
  // t's: the classes are the tracker's states.
  std::vector<std::vector<std::uint64_t>> classes_;
  std::vector<std::uint64_t> representative_;  // a remainder of each class
  std::map<std::vector<std::uint64_t>, std::int32_t> ids_;

  std::int32_t intern(std::uint64_t t) {
    std::vector<std::uint64_t> what(static_cast<std::size_t>(c_));
    std::uint64_t shifted = t, limit = 1;  // t * 10^n mod g; 10^n (saturated: any w < g fits past 10^19)
    for (int n = 0; n < c_; ++n) {
      const std::uint64_t w = (g_ - shifted) % g_;
      what[static_cast<std::size_t>(n)] = w < limit ? w : none;
      shifted = shifted * 10 % g_;
      limit = limit > none / 10 ? none : limit * 10;
    }
    const auto [it, added] = ids_.emplace(std::move(what), static_cast<std::int32_t>(classes_.size()));
    if (added) {
      classes_.push_back(it->first);
      representative_.push_back(t);
    }
    return it->second;
  }
};

}  // namespace zipage::json_multiple_of
