#pragma once
// Unicode for the byte-level BPE tokenizer (bpe_tokenizer.hpp): UTF-8 decoding into code units, the
// character classes its pre-tokenizer regex needs (letters, numbers, whitespace; unicode_tables.hpp), and
// NFC normalisation (canonical decomposition, reordering by combining class, composition; Hangul by rule).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/tokenizer/unicode_tables.hpp"
#include "zipage/tokenizer/utf8.hpp"

namespace zipage {

// ---------------------------------------------------------------------------------------------
// Unicode: character classes for the pre-tokenizer, NFC
// ---------------------------------------------------------------------------------------------

namespace unicode {

// A decoded character of possibly invalid UTF-8: a bad byte is a unit of its own with cp == invalid.
inline constexpr char32_t invalid = 0xFFFFFFFFu;

struct unit {
  char32_t cp;
  std::uint32_t begin;  // byte offset in the text
  std::uint32_t size;   // bytes
};

inline std::vector<unit> decode_units(std::string_view s) {
  check(s.size() < std::numeric_limits<std::uint32_t>::max(), "tokenizer: text of ", s.size(), " bytes is too long");
  std::vector<unit> out;
  out.reserve(s.size());
  for (std::size_t pos = 0; pos < s.size();) {
    const auto r = utf8::scan(s.substr(pos));
    if (r.state != utf8::status::valid) {
      out.push_back({invalid, static_cast<std::uint32_t>(pos), 1});
      ++pos;
      continue;
    }
    const char32_t cp = utf8::decode_valid(s.substr(pos), r.length);
    out.push_back({cp, static_cast<std::uint32_t>(pos), static_cast<std::uint32_t>(r.length)});
    pos += r.length;
  }
  return out;
}

inline void append_utf8(std::string& out, char32_t cp) { utf8::append(out, cp); }

namespace detail {
template <std::size_t N>
bool in_ranges(const tables::range (&r)[N], char32_t cp) noexcept {
  const auto it = std::upper_bound(std::begin(r), std::end(r), cp, [](char32_t c, const tables::range& x) { return c < x.lo; });
  return it != std::begin(r) && cp <= std::prev(it)->hi;
}
}  // namespace detail

// \p{L}
inline bool is_letter(char32_t cp) noexcept {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return cp != invalid && detail::in_ranges(tables::letters, cp);
}
// \p{N}
inline bool is_number(char32_t cp) noexcept {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return cp != invalid && detail::in_ranges(tables::numbers, cp);
}
// \s: the White_Space property (what Oniguruma and Rust's regex use for \s).
inline bool is_space(char32_t cp) noexcept {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

inline std::uint8_t combining_class(char32_t cp) noexcept {
  if (cp < tables::nfc_quick_limit || cp == invalid) return 0;
  const auto& t = tables::combining_classes;
  const auto it = std::upper_bound(std::begin(t), std::end(t), cp,
                                   [](char32_t c, const tables::ccc_range& x) { return c < x.lo; });
  return it != std::begin(t) && cp <= std::prev(it)->hi ? std::prev(it)->ccc : 0;
}

namespace detail {
inline constexpr char32_t s_base = 0xAC00, l_base = 0x1100, v_base = 0x1161, t_base = 0x11A7;
inline constexpr char32_t l_count = 19, v_count = 21, t_count = 28, n_count = v_count * t_count, s_count = 11172;

inline void decompose(char32_t cp, std::vector<char32_t>& out) {
  if (cp >= s_base && cp < s_base + s_count) {  // Hangul syllable: algorithmic
    const char32_t s = cp - s_base;
    out.push_back(l_base + s / n_count);
    out.push_back(v_base + (s % n_count) / t_count);
    if (s % t_count != 0) out.push_back(t_base + s % t_count);
    return;
  }
  const auto& t = tables::decompositions;
  const auto it = std::lower_bound(std::begin(t), std::end(t), cp,
                                   [](const tables::decomposition& d, char32_t c) { return d.cp < c; });
  if (cp == invalid || it == std::end(t) || it->cp != cp) {
    out.push_back(cp);
    return;
  }
  decompose(it->first, out);
  if (it->second != 0) decompose(it->second, out);
}

inline std::optional<char32_t> compose(char32_t a, char32_t b) {
  if (a >= l_base && a < l_base + l_count && b >= v_base && b < v_base + v_count)
    return s_base + ((a - l_base) * v_count + (b - v_base)) * t_count;
  if (a >= s_base && a < s_base + s_count && (a - s_base) % t_count == 0 && b > t_base && b < t_base + t_count)
    return a + (b - t_base);
  const auto& t = tables::compositions;
  const auto it = std::lower_bound(std::begin(t), std::end(t), std::pair{a, b},
                                   [](const tables::composition& c, std::pair<char32_t, char32_t> k) {
                                     return c.first != k.first ? c.first < k.first : c.second < k.second;
                                   });
  if (it != std::end(t) && it->first == a && it->second == b) return it->composite;
  return std::nullopt;
}
}  // namespace detail

// Unicode Normalization Form C. Invalid UTF-8 bytes pass through unchanged.
inline std::string nfc(std::string_view s) {
  bool quick = true;
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0xCC) {  // lead bytes of U+0300 and above
      quick = false;
      break;
    }
  if (quick) return std::string(s);
  const auto units = decode_units(s);
  // Canonical decomposition, then canonical ordering of each run of non-starters (stable by class).
  std::vector<char32_t> d;
  d.reserve(units.size() + 8);
  std::vector<std::uint8_t> bytes_of_invalid;  // raw byte of each `invalid` in order
  for (const unit& u : units) {
    if (u.cp == invalid) {
      d.push_back(invalid);
      bytes_of_invalid.push_back(static_cast<std::uint8_t>(s[u.begin]));
    } else {
      detail::decompose(u.cp, d);
    }
  }
  for (std::size_t i = 0; i < d.size();) {
    if (combining_class(d[i]) == 0) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < d.size() && combining_class(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + static_cast<std::ptrdiff_t>(i), d.begin() + static_cast<std::ptrdiff_t>(j),
                     [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  // Canonical composition: a character joins the last starter unless blocked by one in between.
  std::vector<char32_t> c;
  c.reserve(d.size());
  std::ptrdiff_t starter = -1;
  int last_class = -1;
  for (char32_t cp : d) {
    const int cls = combining_class(cp);
    if (starter >= 0 && cp != invalid && c[static_cast<std::size_t>(starter)] != invalid) {
      const bool adjacent = static_cast<std::ptrdiff_t>(c.size()) - 1 == starter;
      const bool blocked = !adjacent && (last_class == 0 || last_class >= cls);
      if (!blocked) {
        if (const auto composed = detail::compose(c[static_cast<std::size_t>(starter)], cp)) {
          c[static_cast<std::size_t>(starter)] = *composed;
          continue;
        }
      }
    }
    if (cls == 0) starter = static_cast<std::ptrdiff_t>(c.size());
    last_class = cls;
    c.push_back(cp);
  }
  std::string out;
  out.reserve(s.size());
  std::size_t next_invalid = 0;
  for (char32_t cp : c) {
    if (cp == invalid) out.push_back(static_cast<char>(bytes_of_invalid[next_invalid++]));
    else append_utf8(out, cp);
  }
  return out;
}

}  // namespace unicode

}  // namespace zipage
