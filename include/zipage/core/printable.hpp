#pragma once
// Untrusted text (a file's keys, token strings, names) as error messages quote it: readable and one line. Printable
// ASCII and valid UTF-8 characters stay as they are, so a byte-level BPE token such as "Ġa" or a non-English word
// reads as written; control characters, C1 controls and bytes that are not valid UTF-8 read as \xNN.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace zipage::detail {

// The length of the valid UTF-8 character that starts s[at] (2-4 bytes, no overlong form, no surrogate, at most
// U+10FFFF, not a C1 control), or 0.
[[nodiscard]] inline std::size_t utf8_char_length(std::string_view s, std::size_t at) noexcept {
  const auto byte = [&](std::size_t i) { return static_cast<std::uint8_t>(s[i]); };
  const std::uint8_t b0 = byte(at);
  std::size_t n = 0;
  std::uint32_t cp = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) n = 2, cp = b0 & 0x1Fu;
  else if (b0 >= 0xE0 && b0 <= 0xEF) n = 3, cp = b0 & 0x0Fu;
  else if (b0 >= 0xF0 && b0 <= 0xF4) n = 4, cp = b0 & 0x07u;
  else return 0;
  if (at + n > s.size()) return 0;
  for (std::size_t i = 1; i < n; ++i) {
    if ((byte(at + i) & 0xC0u) != 0x80u) return 0;
    cp = (cp << 6) | (byte(at + i) & 0x3Fu);
  }
  const std::uint32_t min_of_length[] = {0, 0, 0xA0, 0x800, 0x10000};  // 0x80-0x9F: C1 controls, escaped
  if (cp < min_of_length[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

// `s` cut to `max_chars` characters (then "..."), with every byte that is not printable written as \xNN.
[[nodiscard]] inline std::string printable_text(std::string_view s, std::size_t max_chars = 96) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  std::size_t at = 0;
  for (std::size_t chars = 0; at < s.size() && chars < max_chars; ++chars) {
    const auto b = static_cast<std::uint8_t>(s[at]);
    if (b >= 0x20 && b < 0x7f) {
      out += s[at++];
    } else if (const std::size_t n = utf8_char_length(s, at); n > 0) {
      out.append(s.substr(at, n));
      at += n;
    } else {
      out += "\\x";
      out += hex[b >> 4];
      out += hex[b & 0x0F];
      ++at;
    }
  }
  if (at < s.size()) out += "...";
  return out;
}

}  // namespace zipage::detail
