#pragma once
// Regexes of the JSON numbers inside a range: JSON Schema's minimum / maximum / exclusiveMinimum /
// exclusiveMaximum for guided_json (zipage/sampling/json_schema.hpp). The bounds are exact decimals (a double's
// shortest round-trip digits, as the schema's JSON text writes them), compared digit by digit, so 0.1 means 0.1
// and not the double nearest to it.
//
// A bounded number is written without an exponent, -?(0|[1-9][0-9]*)(\.[0-9]+)? (every JSON parser reads it
// exactly as a decimal), an integer without the fraction; "-0" and other spellings of zero with a sign are left
// out (0 is written "0"). The regex splits the range at zero: the non-negative numbers in it are written as they
// are, the negative ones as "-" and a magnitude in the mirrored range. For a magnitude range [lo, hi] the integer
// part picks one of three cases: the lower bound's integer part (the fraction then at least lo's, digit by digit),
// an integer strictly between (any fraction), or the upper bound's integer part (the fraction at most hi's).
#include <algorithm>
#include <cctype>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/sampling/regex_text.hpp"

namespace zipage::json_number_range {

// Bounds are refused beyond these (a schema's bound has no use past them, and the regex grows with the digits).
inline constexpr std::size_t max_integer_digits = 18;
inline constexpr std::size_t max_fraction_digits = 18;

// A decimal number: sign, integer digits without leading zeros ("0" for none), fraction digits without trailing
// zeros ("" for none). Zero is never negative.
struct decimal {
  bool negative = false;
  std::string integer = "0";
  std::string fraction;

  [[nodiscard]] bool zero() const { return integer == "0" && fraction.empty(); }
};

// JSON number text (as nlohmann's dump writes it: -12, 0.5, 1e-07, 1.5e+20) as a decimal; nullopt when it is
// not one or passes the digit limits.
inline std::optional<decimal> parse_decimal(const std::string& text) {
  std::size_t i = 0;
  decimal d;
  if (i < text.size() && text[i] == '-') d.negative = true, ++i;
  std::string digits;  // every mantissa digit, the point at `point` digits from the left
  std::size_t point = std::string::npos;
  for (; i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'); ++i) {
    if (text[i] == '.') {
      if (point != std::string::npos) return std::nullopt;
      point = digits.size();
    } else {
      digits += text[i];
    }
  }
  if (digits.empty()) return std::nullopt;
  if (point == std::string::npos) point = digits.size();
  long exponent = 0;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    bool negative_exponent = false;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) negative_exponent = text[i++] == '-';
    if (i == text.size()) return std::nullopt;
    for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
      exponent = exponent * 10 + (text[i] - '0');
      if (exponent > 1000) return std::nullopt;
    }
    if (negative_exponent) exponent = -exponent;
  }
  if (i != text.size()) return std::nullopt;
  // Move the point by the exponent, padding with zeros.
  long p = static_cast<long>(point) + exponent;
  if (p < 0) digits.insert(0, static_cast<std::size_t>(-p), '0'), p = 0;
  if (p > static_cast<long>(digits.size())) digits.append(static_cast<std::size_t>(p) - digits.size(), '0');
  d.integer = digits.substr(0, static_cast<std::size_t>(p));
  d.fraction = digits.substr(static_cast<std::size_t>(p));
  d.integer.erase(0, std::min(d.integer.find_first_not_of('0'), d.integer.size()));
  if (d.integer.empty()) d.integer = "0";
  while (!d.fraction.empty() && d.fraction.back() == '0') d.fraction.pop_back();
  if (d.integer.size() > max_integer_digits || d.fraction.size() > max_fraction_digits) return std::nullopt;
  if (d.zero()) d.negative = false;
  return d;
}

// -1, 0 or 1 as a < b, a == b, a > b.
inline int compare_magnitude(const decimal& a, const decimal& b) {
  if (a.integer.size() != b.integer.size()) return a.integer.size() < b.integer.size() ? -1 : 1;
  if (const int c = a.integer.compare(b.integer); c != 0) return c < 0 ? -1 : 1;
  const std::size_t n = std::max(a.fraction.size(), b.fraction.size());
  for (std::size_t i = 0; i < n; ++i) {
    const char x = i < a.fraction.size() ? a.fraction[i] : '0', y = i < b.fraction.size() ? b.fraction[i] : '0';
    if (x != y) return x < y ? -1 : 1;
  }
  return 0;
}
inline int compare(const decimal& a, const decimal& b) {
  if (a.negative != b.negative) return a.negative ? -1 : 1;
  const int m = compare_magnitude(a, b);
  return a.negative ? -m : m;
}

// One end of a range.
struct bound {
  decimal value;
  bool exclusive = false;
};

namespace detail {

inline std::string digit_class(char lo, char hi) {
  if (lo == hi) return std::string(1, lo);
  return std::string("[") + lo + "-" + hi + "]";
}
using regex_text::alternation;
inline std::string any_digits(std::size_t n) {
  return n == 0 ? "" : n == 1 ? "[0-9]" : "[0-9]{" + std::to_string(n) + "}";
}

// Digit strings of one length from lo to hi (lo <= hi, the same length).
inline std::string same_length(const std::string& lo, const std::string& hi) {
  if (lo.empty()) return "";
  if (lo[0] == hi[0]) return lo[0] + same_length(lo.substr(1), hi.substr(1));
  const std::size_t n = lo.size() - 1;
  const bool lo_full = lo.find_first_not_of('0', 1) == std::string::npos;  // lo[0] followed by every suffix
  const bool hi_full = hi.find_first_not_of('9', 1) == std::string::npos;
  std::vector<std::string> alts;
  if (!lo_full) alts.push_back(lo[0] + same_length(lo.substr(1), std::string(n, '9')));
  const char first = static_cast<char>(lo_full ? lo[0] : lo[0] + 1);
  const char last = static_cast<char>(hi_full ? hi[0] : hi[0] - 1);
  if (first <= last) alts.push_back(digit_class(first, last) + any_digits(n));
  if (!hi_full) alts.push_back(hi[0] + same_length(std::string(n, '0'), hi.substr(1)));
  return alternation(alts);
}

// Non-negative integers from lo to hi as written in JSON (no leading zeros); hi nullopt: no end.
inline std::string integer_range(const std::string& lo, const std::optional<std::string>& hi) {
  std::vector<std::string> alts;
  const std::size_t last = hi ? hi->size() : lo.size();
  for (std::size_t d = lo.size(); d <= last; ++d) {
    const std::string from = d == lo.size() ? lo : "1" + std::string(d - 1, '0');
    const std::string to = hi && d == hi->size() ? *hi : std::string(d, '9');
    alts.push_back(same_length(from, to));
  }
  if (!hi) alts.push_back("[1-9][0-9]{" + std::to_string(lo.size()) + ",}");  // every longer integer
  return alternation(alts);
}

inline std::string increment(std::string s) {
  for (std::size_t i = s.size(); i-- > 0;) {
    if (s[i] != '9') {
      ++s[i];
      return s;
    }
    s[i] = '0';
  }
  return "1" + s;
}
inline std::string decrement(std::string s) {  // s > 0
  for (std::size_t i = s.size(); i-- > 0;) {
    if (s[i] != '0') {
      --s[i];
      break;
    }
    s[i] = '9';
  }
  if (s.size() > 1 && s[0] == '0') s.erase(0, 1);
  return s;
}

// Fraction digit strings f (the digits after the point, read as 0.f) within [lo, hi] (each end optional: lo
// absent is 0 inclusive, hi absent none; exclusive ends left out), from position i on, the prefix so far equal to
// lo's (tight_lo) and to hi's (tight_hi). `empty_ok`: whether the string may end here (false right after the point).
struct fraction_range {
  std::string lo, hi;  // digits, no trailing zeros
  bool lo_exclusive = false, hi_exclusive = false, has_hi = false;

  // nullopt: no string matches.
  [[nodiscard]] std::optional<std::string> from(std::size_t i, bool tight_lo, bool tight_hi, bool empty_ok) const {
    tight_hi = tight_hi && has_hi;
    if (!tight_lo && !tight_hi) return std::string(empty_ok ? "[0-9]*" : "[0-9]+");
    const bool past_lo = i >= lo.size(), past_hi = i >= hi.size();
    // Past the end of a tight bound's digits the string equals that bound so far, and can only add zeros (equal)
    // or, for lo, a non-zero digit (above it): closed forms, since the recursion would not end.
    if (tight_lo && tight_hi && past_lo && past_hi) {  // equal to both: only zeros, if both ends include it
      if (lo_exclusive || hi_exclusive) return std::nullopt;
      return std::string(empty_ok ? "0*" : "0+");
    }
    if (tight_lo && !tight_hi && past_lo)
      return std::string(lo_exclusive ? "0*[1-9][0-9]*" : (empty_ok ? "[0-9]*" : "[0-9]+"));
    if (tight_hi && !tight_lo && past_hi) {
      if (hi_exclusive) return std::nullopt;
      return std::string(empty_ok ? "0*" : "0+");
    }
    std::vector<std::string> alts;
    // Ending here: the value is the prefix, below lo's unless past lo's digits, above hi's never here.
    const bool end_lo_ok = !tight_lo || (past_lo && !lo_exclusive);
    if (empty_ok && end_lo_ok) alts.push_back("");
    const char l = tight_lo ? (past_lo ? '0' : lo[i]) : '0';
    const char h = tight_hi ? (past_hi ? '0' : hi[i]) : '9';
    if (l > h) return alts.empty() ? std::nullopt : std::optional<std::string>(alternation(alts));  // ""
    // The first digit: equal to lo's (stays tight below), equal to hi's (stays tight above), or strictly between.
    if (l == h) {
      if (auto rest = from(i + 1, tight_lo, tight_hi, true)) alts.push_back(std::string(1, l) + *rest);
    } else {
      if (tight_lo) {
        if (auto rest = from(i + 1, true, false, true)) alts.push_back(std::string(1, l) + *rest);
      }
      const char first = static_cast<char>(tight_lo ? l + 1 : l), last = static_cast<char>(tight_hi ? h - 1 : h);
      if (first <= last) alts.push_back(digit_class(first, last) + "[0-9]*");
      if (tight_hi) {
        if (auto rest = from(i + 1, false, true, true)) alts.push_back(std::string(1, h) + *rest);
      }
    }
    if (alts.empty()) return std::nullopt;
    return alternation(alts);  // an empty alternative (ending here) makes the group optional
  }
};

// The fraction part of a number (nothing, or "\." and digits) whose digits lie within the range.
inline std::optional<std::string> fraction_part(const fraction_range& r, bool integer_only) {
  const bool none_ok = [&] {  // no fraction: the value 0.
    if (!r.lo.empty() || r.lo_exclusive) return false;  // 0 >= lo only when lo is 0, inclusive
    return !r.has_hi || !r.hi.empty() || !r.hi_exclusive;
  }();
  if (integer_only) return none_ok ? std::optional<std::string>("") : std::nullopt;
  const auto digits = r.from(0, true, true, false);
  if (!digits) return none_ok ? std::optional<std::string>("") : std::nullopt;
  const std::string with = "\\." + *digits;
  return none_ok ? "(?:" + with + ")?" : with;
}

}  // namespace detail

// Magnitudes (non-negative numbers written without a sign) m with lo <= m (or <) and m <= hi (or <); lo and hi
// non-negative. nullopt: none.
inline std::optional<std::string> magnitude_range(const bound& lo, const std::optional<bound>& hi, bool integer_only) {
  using detail::fraction_range;
  if (hi) {
    const int c = compare(lo.value, hi->value);
    if (c > 0 || (c == 0 && (lo.exclusive || hi->exclusive))) return std::nullopt;
  }
  const std::string& li = lo.value.integer;
  const std::string any_fraction = integer_only ? "" : "(?:\\.[0-9]+)?";
  std::vector<std::string> alts;
  auto at_integer = [&](const std::string& integer, fraction_range r) {
    if (const auto f = detail::fraction_part(r, integer_only)) alts.push_back(integer + *f);
  };
  if (hi && hi->value.integer == li) {  // one integer part: the fraction between both bounds' fractions
    at_integer(li, {lo.value.fraction, hi->value.fraction, lo.exclusive, hi->exclusive, true});
  } else {
    at_integer(li, {lo.value.fraction, "", lo.exclusive, false, false});
    const std::string first = detail::increment(li);
    if (!hi) {
      alts.push_back(detail::integer_range(first, std::nullopt) + any_fraction);
    } else {
      const std::string& hi_integer = hi->value.integer;
      if (hi_integer != first) {  // integers strictly between
        alts.push_back(detail::integer_range(first, detail::decrement(hi_integer)) + any_fraction);
      }
      at_integer(hi_integer, {"", hi->value.fraction, false, hi->exclusive, true});
    }
  }
  if (alts.empty()) return std::nullopt;
  return detail::alternation(alts);
}

// JSON numbers x (integers when integer_only) with lo <= x <= hi (each end optional, exclusive ones strict), as a
// regex; nullopt when none is.
inline std::optional<std::string> number_range(const std::optional<bound>& lo, const std::optional<bound>& hi,
                                               bool integer_only) {
  const decimal zero;
  std::vector<std::string> alts;
  // x >= 0: the range's part at or above zero.
  const bool lo_above_zero = lo && !lo->value.negative;
  const bound nonneg_lo = lo_above_zero ? *lo : bound{zero, false};
  if (!(hi && (hi->value.negative || (hi->value.zero() && hi->exclusive) ||
               (hi->value.zero() && nonneg_lo.exclusive)))) {
    if (auto m = magnitude_range(nonneg_lo, hi, integer_only)) alts.push_back(*m);
  }
  // x < 0, written "-" and y = -x > 0: y from max(0 exclusive, -hi) to -lo.
  if (!lo_above_zero) {
    bound y_lo{zero, true};
    if (hi && hi->value.negative) y_lo = {decimal{false, hi->value.integer, hi->value.fraction}, hi->exclusive};
    std::optional<bound> y_hi;
    if (lo) y_hi = bound{decimal{false, lo->value.integer, lo->value.fraction}, lo->exclusive};
    if (auto m = magnitude_range(y_lo, y_hi, integer_only)) alts.push_back("-" + *m);
  }
  if (alts.empty()) return std::nullopt;
  return detail::alternation(alts);
}

}  // namespace zipage::json_number_range
