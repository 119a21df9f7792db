#pragma once
// Building regex text in the subset zipage/sampling/guided.hpp compiles, shared by the compilers that produce it
// (json_schema.hpp, json_number_range.hpp, grammar.hpp): a literal, quoted, and a group of alternatives.
#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace zipage::regex_text {

// "\xHH" for a byte (the regex subset's escape for control bytes).
inline std::string hex_escape(unsigned char byte) {
  static constexpr const char* digits = "0123456789ABCDEF";
  return std::string("\\x") + digits[byte >> 4] + digits[byte & 15];
}

// Regex text that matches `text` literally: punctuation escaped, control bytes as \xHH, UTF-8 characters whole.
inline std::string quote(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7F) {
      out += hex_escape(u);
      continue;
    }
    if (std::string_view(".^$|?*+()[]{}\\/-").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

// Any one of `alts` as a group, (?:a|b); an empty alternative makes the group optional, (?:a|b)?; alternatives
// that are all empty give "" (the empty string). `alts` must not be empty.
inline std::string alternation(std::vector<std::string> alts) {
  const bool has_empty = std::find(alts.begin(), alts.end(), "") != alts.end();
  alts.erase(std::remove(alts.begin(), alts.end(), ""), alts.end());
  if (alts.empty()) return "";
  std::string out = "(?:";
  for (std::size_t i = 0; i < alts.size(); ++i) out += (i ? "|" : "") + alts[i];
  return out + (has_empty ? ")?" : ")");
}

}  // namespace zipage::regex_text
