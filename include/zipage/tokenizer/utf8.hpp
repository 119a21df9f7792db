#pragma once
// UTF-8 helpers for the tokenizer: classify the sequence at the front of a byte string (valid,
// cut short, or invalid) following the well-formed byte table of Unicode §3.9 (Table 3-7), and
// replace ill-formed bytes with U+FFFD the way the Unicode "maximal subpart" practice recommends.
// Model output is arbitrary bytes (byte-fallback tokens), so nothing here may assume valid input.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace zipage::utf8 {

inline constexpr std::string_view replacement_char = "\xEF\xBF\xBD";  // U+FFFD

enum class status : std::uint8_t {
  valid,       // a complete, well-formed character of `length` bytes
  incomplete,  // the first `length` bytes are a well-formed prefix, but the text ends there
  invalid,     // the first `length` bytes (>= 1) are a maximal ill-formed subpart
};

struct scan_result {
  status state;
  std::size_t length;
};

namespace detail {

// Bytes a sequence needs given its lead byte, and the allowed range of its second byte;
// the later bytes are always 0x80..0xBF. Lead bytes C0, C1 and F5..FF never occur.
struct lead_info {
  std::size_t length;  // 0 when the byte cannot start a character
  unsigned char second_lo, second_hi;
};

[[nodiscard]] constexpr lead_info classify_lead(unsigned char b) noexcept {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};  // excludes overlong forms
  if (b == 0xED) return {3, 0x80, 0x9F};  // excludes UTF-16 surrogates
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};  // excludes overlong forms
  if (b == 0xF4) return {4, 0x80, 0x8F};  // excludes code points above U+10FFFF
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  return {0, 0, 0};
}

}  // namespace detail

// Classifies the sequence at the front of `s` (which must not be empty).
[[nodiscard]] constexpr scan_result scan(std::string_view s) noexcept {
  const auto lead = detail::classify_lead(static_cast<unsigned char>(s[0]));
  if (lead.length == 0) return {status::invalid, 1};
  for (std::size_t i = 1; i < lead.length; ++i) {
    if (i >= s.size()) return {status::incomplete, i};
    const auto b = static_cast<unsigned char>(s[i]);
    const unsigned char lo = i == 1 ? lead.second_lo : 0x80;
    const unsigned char hi = i == 1 ? lead.second_hi : 0xBF;
    if (b < lo || b > hi) return {status::invalid, i};
  }
  return {status::valid, lead.length};
}

// The code point of the well-formed sequence of `length` bytes at the front of `s` (scan() said valid).
[[nodiscard]] constexpr char32_t decode_valid(std::string_view s, std::size_t length) noexcept {
  const auto b0 = static_cast<unsigned char>(s[0]);
  char32_t cp = length == 1 ? b0 : length == 2 ? b0 & 0x1Fu : length == 3 ? b0 & 0x0Fu : b0 & 0x07u;
  for (std::size_t i = 1; i < length; ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[i]) & 0x3Fu);
  return cp;
}

[[nodiscard]] constexpr bool is_valid(std::string_view s) noexcept {
  for (std::size_t pos = 0; pos < s.size();) {
    const auto r = scan(s.substr(pos));
    if (r.state != status::valid) return false;
    pos += r.length;
  }
  return true;
}

// Appends `s` to `out` with every maximal ill-formed subpart (and a cut-short tail) replaced by
// one U+FFFD. Returns the number of bytes of `s` consumed, which is s.size() unless
// `keep_incomplete_tail` is set and `s` ends inside a character: then those last bytes are left
// for the caller to complete later (the streaming decoder relies on this).
inline std::size_t append_sanitized(std::string& out, std::string_view s, bool keep_incomplete_tail) {
  std::size_t pos = 0;
  while (pos < s.size()) {
    const auto r = scan(s.substr(pos));
    if (r.state == status::incomplete && keep_incomplete_tail) return pos;
    if (r.state == status::valid) {
      out.append(s.substr(pos, r.length));
    } else {
      out.append(replacement_char);
    }
    pos += r.length;
  }
  return pos;
}

[[nodiscard]] inline std::string sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  append_sanitized(out, s, false);
  return out;
}

// Decoded bytes that may end inside a character, as streaming detokenizers produce them: callers
// append to buffer(), take() returns the complete, valid part (impossible bytes as U+FFFD) and keeps an
// unfinished tail, flush() returns everything left (an unfinished tail as U+FFFD).
class holdback {
 public:
  [[nodiscard]] std::string& buffer() noexcept { return pending_; }
  [[nodiscard]] std::string take() {
    std::string out;
    pending_.erase(0, append_sanitized(out, pending_, /*keep_incomplete_tail=*/true));
    return out;
  }
  [[nodiscard]] std::string flush() {
    std::string out = sanitize(pending_);
    pending_.clear();
    return out;
  }
  void clear() noexcept { pending_.clear(); }
  [[nodiscard]] bool empty() const noexcept { return pending_.empty(); }

 private:
  std::string pending_;
};

// Appends code point cp (at most U+10FFFF; callers check) as UTF-8.
inline void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace zipage::utf8
