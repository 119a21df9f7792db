#pragma once
// Untrusted text (a file's keys, token strings, names) as error messages quote it: readable and one line. Printable
// ASCII and valid UTF-8 characters stay as they are, so a byte-level BPE token such as "Ġa" or a non-English word
// reads as written; control characters, C1 controls and bytes that are not valid UTF-8 read as \xNN.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "zipage/tokenizer/utf8.hpp"

namespace zipage::detail {

// The length of the valid UTF-8 character that starts s[at] (2-4 bytes, as utf8::scan reads them: no overlong
// form, no surrogate, at most U+10FFFF) when it is not a C1 control, or 0.
[[nodiscard]] inline std::size_t printable_char_length(std::string_view s, std::size_t at) noexcept {
  const auto r = utf8::scan(s.substr(at));
  if (r.state != utf8::status::valid || r.length < 2) return 0;
  return utf8::decode_valid(s.substr(at), r.length) < 0xA0 ? 0 : r.length;  // 0x80-0x9F: C1 controls, escaped
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
    } else if (const std::size_t n = printable_char_length(s, at); n > 0) {
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
