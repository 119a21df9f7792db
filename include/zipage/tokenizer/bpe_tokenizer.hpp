#pragma once
// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (GPT-2 style, as Qwen2/Qwen3 and
// Llama 3 use it), with the chat templates of those model families.
//
// Encoding:
//   1. added tokens (<|im_start|>, <think>, ...) are cut out of the raw text first: at each position the
//      longest one that matches exactly (lstrip/rstrip tokens also take the whitespace beside them);
//   2. the text between them is normalized (NFC when tokenizer.json asks for it) and split by the
//      pre-tokenizer regex — Qwen2/3's
//        (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//      or Llama 3's (the same with \p{N}{1,3}) — matched by hand over code points (unicode_tables.hpp);
//   3. each piece's bytes become byte-level symbols (GPT-2's byte↔unicode map), which are merged by
//      rank, lowest first and leftmost on ties (a priority queue: O(n log n) per piece).
// Decoding maps each token's characters back to bytes (a token with a character outside the map keeps
// its UTF-8 bytes, as the tokenizers library does) and replaces invalid UTF-8 with U+FFFD;
// bpe_stream_decoder holds back a character cut between tokens until it is complete.
// Text that is not valid UTF-8 is encoded anyway: each bad byte is a symbol of its own.
//
// All const member functions are safe to call concurrently.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/json.hpp"
#include "zipage/core/types.hpp"
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
    const auto b0 = static_cast<unsigned char>(s[pos]);
    if (r.state != utf8::status::valid) {
      out.push_back({invalid, static_cast<std::uint32_t>(pos), 1});
      ++pos;
      continue;
    }
    char32_t cp = 0;
    switch (r.length) {
      case 1: cp = b0; break;
      case 2: cp = b0 & 0x1Fu; break;
      case 3: cp = b0 & 0x0Fu; break;
      default: cp = b0 & 0x07u; break;
    }
    for (std::size_t i = 1; i < r.length; ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[pos + i]) & 0x3Fu);
    out.push_back({cp, static_cast<std::uint32_t>(pos), static_cast<std::uint32_t>(r.length)});
    pos += r.length;
  }
  return out;
}

inline void append_utf8(std::string& out, char32_t cp) {
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

// ---------------------------------------------------------------------------------------------
// Chat templates
// ---------------------------------------------------------------------------------------------

// Each format renders what the model family's published Jinja template renders for plain text messages
// (tool calls and tool definitions left out); tests/unit/test_chat_templates.cpp holds the expected
// strings, rendered from the real templates.
struct chat_message {
  std::string role;  // "system", "user", "assistant"; "tool" (not deepseek_r1); "ipython" (llama3, llama3_1)
  std::string content;
};

enum class chat_format {
  none,         // the tokenizer has no (recognised) chat template
  chatml,       // plain ChatML: <|im_start|>role\n...<|im_end|>\n, nothing added (no default system prompt)
  qwen2,        // Qwen2-Instruct's ChatML: a default system message when the conversation has none
  qwen2_5,      // Qwen2.5-Instruct's: qwen2, plus tool results as <tool_response> blocks in user turns
  qwen3,        // Qwen3's ChatML: earlier answers lose their reasoning; thinking can be turned off
  llama3,       // Llama 3.0: <|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
  llama3_1,     // Llama 3.1 and later 3.x: Llama 3.0 plus an always-present system block with the
                // "Cutting Knowledge Date"/"Today Date" lines; tool results as "ipython" turns in JSON
  deepseek_r1,  // DeepSeek-R1(-Distill): <｜begin▁of▁sentence｜>system<｜User｜>...<｜Assistant｜>...<｜end▁of▁sentence｜>
};

inline std::string_view chat_format_name(chat_format f) noexcept {
  switch (f) {
    case chat_format::chatml: return "chatml";
    case chat_format::qwen2: return "qwen2";
    case chat_format::qwen2_5: return "qwen2_5";
    case chat_format::qwen3: return "qwen3";
    case chat_format::llama3: return "llama3";
    case chat_format::llama3_1: return "llama3_1";
    case chat_format::deepseek_r1: return "deepseek_r1";
    default: return "none";
  }
}

// The format named by chat_format_name (e.g. a command-line choice); an unknown name is an error.
inline chat_format chat_format_from_name(std::string_view name) {
  for (const chat_format f : {chat_format::chatml, chat_format::qwen2, chat_format::qwen2_5, chat_format::qwen3,
                              chat_format::llama3, chat_format::llama3_1, chat_format::deepseek_r1})
    if (chat_format_name(f) == name) return f;
  fail("unknown chat template '", json::printable(name),
       "' (zipage knows chatml, qwen2, qwen2_5, qwen3, llama3, llama3_1, deepseek_r1)");
}

// The default system message of qwen2 and qwen2_5 as the published templates write it (Qwen2-Instruct's,
// Qwen2.5-Instruct's); empty for the other formats. A tokenizer uses the one its own template writes.
inline std::string_view chat_format_default_system(chat_format f) noexcept {
  switch (f) {
    case chat_format::qwen2: return "You are a helpful assistant.";
    case chat_format::qwen2_5: return "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
    default: return {};
  }
}

struct chat_options {
  bool add_generation_prompt = true;  // end with the assistant's header, ready to generate
  bool enable_thinking = true;        // qwen3: false appends an empty <think>\n\n</think>\n\n
  // llama3_1: the date on the "Today Date: " line. Llama 3.1's template defaults to "26 Jul 2024";
  // Llama 3.2's writes the current date (strftime_now("%d %b %Y")) under transformers: pass it here.
  std::string date_string = "26 Jul 2024";
  // qwen2, qwen2_5: the system message written when the conversation does not start with one. Unset:
  // bpe_tokenizer::apply_chat_template uses the text its template writes, the free apply_chat_template
  // chat_format_default_system(format) ("You are a helpful assistant." for qwen2, "You are Qwen,
  // created by Alibaba Cloud. You are a helpful assistant." for qwen2_5).
  std::optional<std::string> default_system;
};

namespace detail {
inline std::string_view strip_chars(std::string_view s, std::string_view chars, bool left, bool right) {
  if (left) {
    const auto b = s.find_first_not_of(chars);
    s = b == std::string_view::npos ? std::string_view{} : s.substr(b);
  }
  if (right) {
    const auto e = s.find_last_not_of(chars);
    s = e == std::string_view::npos ? std::string_view{} : s.substr(0, e + 1);
  }
  return s;
}

// U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000 in UTF-8.
inline constexpr std::string_view py_unicode_spaces[] = {
    "\xC2\x85",     "\xC2\xA0",     "\xE1\x9A\x80", "\xE2\x80\x80", "\xE2\x80\x81", "\xE2\x80\x82",
    "\xE2\x80\x83", "\xE2\x80\x84", "\xE2\x80\x85", "\xE2\x80\x86", "\xE2\x80\x87", "\xE2\x80\x88",
    "\xE2\x80\x89", "\xE2\x80\x8A", "\xE2\x80\xA8", "\xE2\x80\xA9", "\xE2\x80\xAF", "\xE2\x81\x9F",
    "\xE3\x80\x80"};

// Python's str.strip() with no argument (Jinja's trim filter): strips the code points for which
// str.isspace() is true, ASCII and Unicode alike.
inline std::size_t py_space_prefix(std::string_view s) {
  if (s.empty()) return 0;
  const auto c = static_cast<unsigned char>(s[0]);
  if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20)) return 1;
  for (const std::string_view w : py_unicode_spaces)
    if (s.starts_with(w)) return w.size();
  return 0;
}
inline std::size_t py_space_suffix(std::string_view s) {
  if (s.empty()) return 0;
  const auto c = static_cast<unsigned char>(s.back());
  if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20)) return 1;
  for (const std::string_view w : py_unicode_spaces)
    if (s.ends_with(w)) return w.size();
  return 0;
}
inline std::string_view py_strip(std::string_view s) {
  while (const std::size_t n = py_space_prefix(s)) s.remove_prefix(n);
  while (const std::size_t n = py_space_suffix(s)) s.remove_suffix(n);
  return s;
}

// A JSON string literal as Python's json.dumps(s, ensure_ascii=False) writes it (transformers' tojson).
inline std::string py_json_string(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          static constexpr char hex[] = "0123456789abcdef";
          out += "\\u00";
          out += hex[static_cast<unsigned char>(ch) >> 4];
          out += hex[static_cast<unsigned char>(ch) & 15];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
  return out;
}

inline void check_role(const chat_message& m, std::initializer_list<std::string_view> roles, chat_format f) {
  check(std::find(roles.begin(), roles.end(), m.role) != roles.end(), "chat template ", chat_format_name(f),
        ": unsupported role '", json::printable(m.role), "'");
}

// Qwen3's template (tools left out): earlier turns' reasoning is dropped, the turns after the last user
// query keep theirs in <think> blocks.
inline std::string qwen3_chat(std::span<const chat_message> msgs, const chat_options& o) {
  std::string out;
  const std::size_t n = msgs.size();
  if (n > 0 && msgs[0].role == "system") out += "<|im_start|>system\n" + msgs[0].content + "<|im_end|>\n";
  std::size_t last_query = n == 0 ? 0 : n - 1;
  for (std::size_t k = n; k-- > 0;) {
    const auto& m = msgs[k];
    if (m.role == "user" && !(m.content.starts_with("<tool_response>") && m.content.ends_with("</tool_response>"))) {
      last_query = k;
      break;
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    const auto& m = msgs[i];
    check_role(m, {"system", "user", "assistant", "tool"}, chat_format::qwen3);
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string_view content = m.content;
      std::string_view reasoning;
      if (const auto close = m.content.find("</think>"); close != std::string::npos) {
        const std::string_view all = m.content;
        content = strip_chars(all.substr(all.rfind("</think>") + 8), "\n", true, false);
        std::string_view before = strip_chars(all.substr(0, close), "\n", false, true);
        if (const auto open = before.rfind("<think>"); open != std::string_view::npos) before = before.substr(open + 7);
        reasoning = strip_chars(before, "\n", true, false);
      }
      if (i > last_query && (i + 1 == n || !reasoning.empty())) {
        out += "<|im_start|>assistant\n<think>\n";
        out += strip_chars(reasoning, "\n", true, true);
        out += "\n</think>\n\n";
        out += strip_chars(content, "\n", true, false);
      } else {
        out += "<|im_start|>assistant\n";
        out += content;
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i == 0 || msgs[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (i + 1 == n || msgs[i + 1].role != "tool") out += "<|im_end|>\n";
    }
  }
  if (o.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!o.enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return out;
}
}  // namespace detail

inline std::string apply_chat_template(chat_format format, std::span<const chat_message> messages,
                                       const chat_options& options = {}) {
  std::string out;
  switch (format) {
    case chat_format::qwen3: return detail::qwen3_chat(messages, options);
    case chat_format::qwen2:
    case chat_format::qwen2_5:
      // Qwen2's template writes its default only inside the loop over the messages (none for an empty
      // conversation); Qwen2.5's reads messages[0] unconditionally, which fails on an empty one.
      check(format == chat_format::qwen2 || !messages.empty(), "chat template ", chat_format_name(format),
            ": the conversation has no messages");
      if (!messages.empty() && messages[0].role != "system") {
        out += "<|im_start|>system\n";
        out += options.default_system ? std::string_view(*options.default_system) : chat_format_default_system(format);
        out += "<|im_end|>\n";
      }
      [[fallthrough]];
    case chat_format::chatml:
      for (std::size_t i = 0; i < messages.size(); ++i) {
        const auto& m = messages[i];
        detail::check_role(m, {"system", "user", "assistant", "tool"}, format);
        if (format == chat_format::qwen2_5 && m.role == "tool") {  // consecutive results share one user turn
          if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
          out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
          if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
        } else {
          out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
        }
      }
      if (options.add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;
    case chat_format::llama3:
      // Every turn as is, content trimmed; the BOS comes with the first turn.
      for (std::size_t i = 0; i < messages.size(); ++i) {
        const auto& m = messages[i];
        detail::check_role(m, {"system", "user", "assistant", "ipython", "tool"}, format);
        if (i == 0) out += "<|begin_of_text|>";
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
        out += detail::py_strip(m.content);
        out += "<|eot_id|>";
      }
      if (options.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    case chat_format::llama3_1: {
      // The system block is always there (a leading system message's text, trimmed, after the date
      // lines); tool results are "ipython" turns holding the content as a JSON string, untrimmed.
      std::size_t first = 0;
      std::string_view system;
      if (!messages.empty() && messages[0].role == "system") {
        system = detail::py_strip(messages[0].content);
        first = 1;
      }
      out += "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
             "Cutting Knowledge Date: December 2023\nToday Date: ";
      out += options.date_string;
      out += "\n\n";
      out += system;
      out += "<|eot_id|>";
      for (std::size_t i = first; i < messages.size(); ++i) {
        const auto& m = messages[i];
        detail::check_role(m, {"system", "user", "assistant", "ipython", "tool"}, format);
        if (m.role == "tool" || m.role == "ipython") {
          out += "<|start_header_id|>ipython<|end_header_id|>\n\n" + detail::py_json_string(m.content);
        } else {
          out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
          out += detail::py_strip(m.content);
        }
        out += "<|eot_id|>";
      }
      if (options.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    }
    case chat_format::deepseek_r1: {
      // The last system message is the system prompt; answers keep only what follows their last
      // </think> (the newlines after it included).
      std::string system;
      for (const auto& m : messages)
        if (m.role == "system") system = m.content;
      out += "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>" + system;
      for (const auto& m : messages) {
        detail::check_role(m, {"system", "user", "assistant"}, format);
        if (m.role == "user") {
          out += "<\xEF\xBD\x9CUser\xEF\xBD\x9C>" + m.content;
        } else if (m.role == "assistant") {
          std::string_view content = m.content;
          if (const auto p = content.rfind("</think>"); p != std::string_view::npos) content = content.substr(p + 8);
          out += "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>";
          out += content;
          out += "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
        }
      }
      if (options.add_generation_prompt) out += "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C><think>\n";
      return out;
    }
    default: fail("apply_chat_template: the tokenizer has no chat template zipage knows");
  }
}

namespace detail {
// The content of the `{% ... %}` tag opening at `open` (its '-'/'+' markers and outer spaces dropped).
inline std::string_view jinja_tag(std::string_view t, std::size_t open) {
  const std::size_t close = t.find("%}", open);
  if (close == std::string_view::npos) return {};
  return strip_chars(t.substr(open + 2, close - open - 2), " \t\n-+", true, true);
}

// Where the `{% ... %}` tag that directly precedes the `{{` expression holding position `pos` opens:
// only spaces, '-' and that `{{` may stand between the tag and `pos`. npos when there is none.
inline std::size_t tag_before_output(std::string_view t, std::size_t pos) {
  std::size_t i = pos;
  while (i > 0 && (t[i - 1] == ' ' || t[i - 1] == '\n' || t[i - 1] == '\t' || t[i - 1] == '-')) --i;
  if (i < 2 || t.substr(i - 2, 2) != "{{") return std::string_view::npos;
  i -= 2;
  while (i > 0 && (t[i - 1] == ' ' || t[i - 1] == '\n' || t[i - 1] == '\t')) --i;
  if (i < 2 || t.substr(i - 2, 2) != "%}") return std::string_view::npos;
  return t.rfind("{%", i - 2);
}

// A Jinja string literal's body (between its quotes) as Jinja reads it, for the escapes plain text
// uses: \n \t \r \\ \' \"; nullopt for any other (or a raw CR, which Jinja would normalise).
inline std::optional<std::string> jinja_unescape(std::string_view body) {
  std::string out;
  for (std::size_t i = 0; i < body.size(); ++i) {
    if (body[i] == '\r') return std::nullopt;
    if (body[i] != '\\') {
      out += body[i];
      continue;
    }
    if (++i == body.size()) return std::nullopt;
    switch (body[i]) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': case '\'': case '"': out += body[i]; break;
      default: return std::nullopt;
    }
  }
  return out;
}

// `if ... messages[0]... <op> ...'system'...`: the test on the first message's role.
inline bool first_role_test(std::string_view tag, std::string_view op) {
  return tag.starts_with("if ") && tag.find("messages[0]") != std::string_view::npos &&
         tag.find(op) != std::string_view::npos && tag.find("system") != std::string_view::npos;
}
}  // namespace detail

// The default system message of a Qwen2/Qwen2.5-style ChatML template: the string literal
// '<|im_start|>system\nTEXT<|im_end|>\n' written by a `{{ '...' }}` that stands right after either
// `{% if ... messages[0]... != 'system' %}` (Qwen2-Instruct) or the `{% else %}` of
// `{% if messages[0]... == 'system' %}` (Qwen2.5-Instruct), the whole of that `{{ }}`. Returns TEXT
// (which holds no other turn) as Jinja reads it when the
// template has exactly one such text and writes no system text any other way; nullopt otherwise
// (such a template is rendered as plain chatml).
inline std::optional<std::string> chat_template_default_system(std::string_view t) {
  static constexpr std::string_view head = "<|im_start|>system\\n", tail = "<|im_end|>\\n";
  std::optional<std::string> found;
  for (std::size_t at = t.find(head); at != std::string_view::npos; at = t.find(head, at + 1)) {
    if (at == 0 || (t[at - 1] != '\'' && t[at - 1] != '"')) continue;  // not the start of a literal
    const char quote = t[at - 1];
    std::size_t end = at;  // the closing quote
    while (end < t.size() && t[end] != quote) end += t[end] == '\\' ? 2 : 1;
    if (end >= t.size()) continue;
    const std::string_view body = t.substr(at, end - at);
    if (body.size() < head.size() + tail.size() || !body.ends_with(tail)) continue;
    const std::string_view text = body.substr(head.size(), body.size() - head.size() - tail.size());
    // the literal must be the whole `{{ ... }}` expression
    const std::size_t after = t.find_first_not_of(" \t\n-", end + 1);
    const bool alone = after != std::string_view::npos && t.substr(after, 2) == "}}";
    const std::size_t tag = alone ? detail::tag_before_output(t, at - 1) : std::string_view::npos;
    bool guarded = tag != std::string_view::npos && text.find("<|im_") == std::string_view::npos &&
                   detail::first_role_test(detail::jinja_tag(t, tag), "!=");
    if (!guarded && tag != std::string_view::npos && tag > 0 && text.find("<|im_") == std::string_view::npos &&
        detail::jinja_tag(t, tag) == "else") {
      // the if of this else: the tag before it, with one output expression between them
      const std::size_t if_tag = t.rfind("{%", tag - 1);
      guarded = if_tag != std::string_view::npos && detail::first_role_test(detail::jinja_tag(t, if_tag), "==");
    }
    if (!guarded) return std::nullopt;  // a system text written in some other case: not Qwen2's scheme
    auto value = detail::jinja_unescape(text);
    if (!value || (found && *found != *value)) return std::nullopt;
    found = std::move(value);
  }
  return found;
}

// Recognises the chat template of a tokenizer_config.json by its markers.
inline chat_format detect_chat_format(std::string_view jinja_template) {
  if (jinja_template.find("<\xEF\xBD\x9CUser\xEF\xBD\x9C>") != std::string_view::npos) return chat_format::deepseek_r1;
  if (jinja_template.find("<|start_header_id|>") != std::string_view::npos)
    return jinja_template.find("Cutting Knowledge Date") != std::string_view::npos ? chat_format::llama3_1
                                                                                   : chat_format::llama3;
  if (jinja_template.find("<|im_start|>") != std::string_view::npos) {
    if (jinja_template.find("enable_thinking") != std::string_view::npos) return chat_format::qwen3;
    if (!chat_template_default_system(jinja_template)) return chat_format::chatml;
    return jinja_template.find("<tool_response>") != std::string_view::npos ? chat_format::qwen2_5 : chat_format::qwen2;
  }
  return chat_format::none;
}

// ---------------------------------------------------------------------------------------------
// bpe_tokenizer
// ---------------------------------------------------------------------------------------------

// An added token of tokenizer.json's "added_tokens".
struct bpe_added_token {
  std::string content;
  token_id id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
};

namespace detail {

// GPT-2's byte → unicode map: printable Latin-1 bytes stand for themselves, the other 68 bytes (controls,
// space, DEL, NBSP, soft hyphen) for U+0100 + i in byte order.
inline const std::array<char32_t, 256>& byte_to_unicode() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[static_cast<std::size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

// The inverse: code point (< 0x144) → byte, or -1.
inline const std::array<std::int16_t, 0x144>& unicode_to_byte() {
  static const std::array<std::int16_t, 0x144> table = [] {
    std::array<std::int16_t, 0x144> t{};
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_to_unicode()[static_cast<std::size_t>(b)]] = static_cast<std::int16_t>(b);
    return t;
  }();
  return table;
}

struct bpe_string_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

}  // namespace detail

class bpe_tokenizer {
 public:
  // The pre-tokenizer regexes zipage implements (matched by hand, see pre_tokenize()).
  static constexpr std::string_view qwen2_pattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  static constexpr std::string_view llama3_pattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

  // A directory with tokenizer.json and (optionally) tokenizer_config.json.
  static bpe_tokenizer from_dir(const std::filesystem::path& dir) {
    std::error_code ec;
    const auto cfg = dir / "tokenizer_config.json";
    return from_files(dir / "tokenizer.json", std::filesystem::is_regular_file(cfg, ec) ? cfg : std::filesystem::path{});
  }
  static bpe_tokenizer from_files(const std::filesystem::path& tokenizer_json, const std::filesystem::path& config_json = {}) {
    const std::string text = json::read_text_file(tokenizer_json, "tokenizer");
    const std::string cfg = config_json.empty() ? std::string() : json::read_text_file(config_json, "tokenizer config");
    return from_json(text, cfg, tokenizer_json.string(), config_json.string());
  }
  // tokenizer_config may be empty (no chat template, eos/bos from tokenizer.json only).
  static bpe_tokenizer from_json(std::string_view tokenizer_json, std::string_view tokenizer_config = {},
                                 std::string source = "tokenizer.json", std::string config_source = "tokenizer_config.json") {
    bpe_tokenizer t;
    t.load(json::parse(tokenizer_json, source), source);
    if (!tokenizer_config.empty()) t.load_config(json::parse(tokenizer_config, config_source), config_source);
    return t;
  }

  // Token ids of `text`; added tokens are recognised in it (special ones only when `parse_special`).
  [[nodiscard]] std::vector<token_id> encode(std::string_view text, bool add_bos = false, bool parse_special = true) const {
    std::vector<token_id> out;
    if (add_bos) {
      check(bos_ >= 0, "encode: BOS requested but the tokenizer has no BOS token");
      out.push_back(bos_);
    }
    std::size_t pos = 0;  // start of the text not yet encoded
    for (std::size_t i = 0; i < text.size();) {
      const bpe_added_token* a = match_added(text, i, parse_special);
      if (a == nullptr) {
        ++i;
        continue;
      }
      std::size_t seg_end = i, next = i + a->content.size();
      if (a->lstrip)
        while (seg_end > pos && is_ascii_space(text[seg_end - 1])) --seg_end;
      if (a->rstrip)
        while (next < text.size() && is_ascii_space(text[next])) ++next;
      encode_text(text.substr(pos, seg_end - pos), out);
      out.push_back(a->id);
      pos = i = next;
    }
    encode_text(text.substr(pos), out);
    return out;
  }

  // Text of the ids: invalid UTF-8 becomes U+FFFD; ids the tokenizer does not know produce nothing (as in
  // the tokenizers library; a model's vocabulary is often padded past the tokenizer's).
  [[nodiscard]] std::string decode(std::span<const token_id> ids, bool skip_special = false) const {
    std::string bytes;
    for (token_id id : ids) append_token_bytes(bytes, id, skip_special);
    return utf8::sanitize(bytes);
  }

  // Appends the bytes of one token (possibly part of a UTF-8 character).
  void append_token_bytes(std::string& out, token_id id, bool skip_special = false) const {
    if (id < 0 || static_cast<std::size_t>(id) >= tokens_.size()) return;
    const token_entry& e = tokens_[static_cast<std::size_t>(id)];
    if (e.special && skip_special) return;
    if (e.raw) {
      out += e.text;
      return;
    }
    for (const unicode::unit& u : unicode::decode_units(e.text))
      out.push_back(static_cast<char>(detail::unicode_to_byte()[u.cp]));
  }

  // The pieces the pre-tokenizer splits (already normalized) text into.
  [[nodiscard]] std::vector<std::string_view> pre_tokenize(std::string_view text) const {
    std::vector<std::string_view> pieces;
    const auto units = unicode::decode_units(text);
    for (std::size_t i = 0; i < units.size();) {
      const std::size_t j = match_piece(units, i);
      const std::size_t end = j < units.size() ? units[j].begin : text.size();
      pieces.push_back(text.substr(units[i].begin, end - units[i].begin));
      i = j;
    }
    return pieces;
  }
  [[nodiscard]] std::string normalize(std::string_view text) const { return nfc_ ? unicode::nfc(text) : std::string(text); }

  // The id of a token given as tokenizer.json spells it (byte-level form, e.g. "Ġworld") or of an added token.
  [[nodiscard]] std::optional<token_id> find(std::string_view token) const {
    if (const auto it = added_index_.find(token); it != added_index_.end()) return it->second;
    if (const auto it = vocab_.find(token); it != vocab_.end()) return it->second;
    return std::nullopt;
  }
  // The token as tokenizer.json spells it ("" for ids it does not define).
  [[nodiscard]] std::string_view token_text(token_id id) const {
    check(id >= 0 && static_cast<std::size_t>(id) < tokens_.size(), "token_text: token id ", id, " is out of range [0, ",
          tokens_.size(), ")");
    return tokens_[static_cast<std::size_t>(id)].text;
  }
  [[nodiscard]] bool is_special(token_id id) const noexcept {
    return id >= 0 && static_cast<std::size_t>(id) < tokens_.size() && tokens_[static_cast<std::size_t>(id)].special;
  }
  [[nodiscard]] const std::vector<bpe_added_token>& added_tokens() const noexcept { return added_; }

  // One past the largest id the tokenizer defines.
  [[nodiscard]] std::int32_t vocab_size() const noexcept { return static_cast<std::int32_t>(tokens_.size()); }
  [[nodiscard]] std::size_t num_merges() const noexcept { return merges_.size(); }
  [[nodiscard]] token_id bos() const noexcept { return bos_; }
  [[nodiscard]] token_id eos() const noexcept { return eos_; }
  [[nodiscard]] bool add_bos() const noexcept { return add_bos_; }
  [[nodiscard]] bool normalizes_nfc() const noexcept { return nfc_; }
  [[nodiscard]] int max_digits() const noexcept { return max_digits_; }

  [[nodiscard]] chat_format chat() const noexcept { return chat_; }
  // qwen2, qwen2_5: the default system message the checkpoint's template writes (empty otherwise).
  [[nodiscard]] const std::string& chat_default_system() const noexcept { return chat_default_system_; }
  // The conversation in the checkpoint's chat format; qwen2/qwen2_5 write the template's own default
  // system message unless `o.default_system` is set.
  [[nodiscard]] std::string apply_chat_template(std::span<const chat_message> messages, const chat_options& o = {}) const {
    if ((chat_ == chat_format::qwen2 || chat_ == chat_format::qwen2_5) && !o.default_system) {
      chat_options with = o;
      with.default_system = chat_default_system_;
      return zipage::apply_chat_template(chat_, messages, with);
    }
    return zipage::apply_chat_template(chat_, messages, o);
  }

 private:
  struct token_entry {
    std::string text;     // as tokenizer.json spells it
    bool raw = false;     // decode as the UTF-8 of `text` (a character outside the byte map, as the library does)
    bool special = false;
    bool added = false;
  };
  struct merge_info {
    std::int32_t rank;
    token_id id;
  };
  struct symbol {
    token_id id;
    std::int32_t prev, next;
  };
  struct candidate {
    std::int32_t rank, left;  // left symbol index
    token_id left_id, right_id, merged;
  };
  struct later {  // min-heap on (rank, left)
    bool operator()(const candidate& a, const candidate& b) const noexcept {
      return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
    }
  };

  bpe_tokenizer() = default;

  static bool is_ascii_space(char c) noexcept { return c == ' ' || (c >= '\t' && c <= '\r'); }
  static std::uint64_t pair_key(token_id a, token_id b) noexcept {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
  }

  // ---- loading ----

  void load(const json::value& root, const std::string& src) {
    check(root.is_object(), src, ": must be a JSON object, got ", json::type_name(root));
    const json::value& model = json::require(root, "model", src);
    check(model.is_object(), src, ": 'model' must be an object");
    const std::string msrc = src + ": model";
    const std::string& type = json::as_string(json::require(model, "type", msrc), msrc, "type");
    check(type == "BPE", src, ": model type '", json::printable(type), "' is not supported (zipage reads BPE)");
    check(!json::find(model, "dropout") || json::as_number(model.at("dropout"), msrc, "dropout") == 0.0, src,
          ": BPE dropout is not supported");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const json::value* v = json::find(model, key);
      check(v == nullptr || json::as_string(*v, msrc, key).empty(), src, ": model.", key, " is not supported");
    }
    check(!json::get_bool(model, "byte_fallback", msrc, false), src, ": byte_fallback BPE is not supported");
    ignore_merges_ = json::get_bool(model, "ignore_merges", msrc, false);
    read_normalizer(root, src);
    read_pre_tokenizer(root, src);
    if (const json::value* dec = json::find(root, "decoder")) {
      check(dec->is_object() && dec->value("type", "") == "ByteLevel", src,
            ": decoder must be ByteLevel, got ", json::printable(dec->dump(), 80));
    }
    // Ids are bounded by what the file declares (vocab entries + added tokens: ids below twice that plus
    // 1024, room for the gaps real files leave), so the id table stays proportional to the file and a 4 KB
    // file cannot name an id of 2^26 and make it take gigabytes.
    {
      const json::value* vocab = json::find(model, "vocab");
      const json::value* added = json::find(root, "added_tokens");
      declared_ = (vocab && vocab->is_object() ? vocab->size() : 0) + (added && added->is_array() ? added->size() : 0);
      max_id_ = 2 * declared_ + 1024;
    }
    read_vocab(model, src);
    read_added_tokens(root, src);
    read_merges(model, src);
    read_post_processor(root, src);
  }

  void read_normalizer(const json::value& root, const std::string& src) {
    const json::value* n = json::find(root, "normalizer");
    if (n == nullptr) return;
    const bool is_nfc = n->is_object() && n->value("type", "") == "NFC";
    check(is_nfc, src, ": normalizer ", json::printable(n->dump(), 80), " is not supported (zipage implements NFC or none)");
    nfc_ = true;
  }

  void read_pre_tokenizer(const json::value& root, const std::string& src) {
    const json::value& pt = json::require(root, "pre_tokenizer", src);
    const std::string shown = json::printable(pt.dump(), 200);
    bool ok = pt.is_object() && pt.value("type", "") == "Sequence" && pt.contains("pretokenizers") &&
              pt["pretokenizers"].is_array() && pt["pretokenizers"].size() == 2;
    if (ok) {
      const auto& split = pt["pretokenizers"][0];
      const auto& bl = pt["pretokenizers"][1];
      ok = split.is_object() && split.value("type", "") == "Split" && split.value("behavior", "") == "Isolated" &&
           !split.value("invert", false) && split.contains("pattern") && split["pattern"].is_object() &&
           split["pattern"].contains("Regex") && split["pattern"]["Regex"].is_string() && bl.is_object() &&
           bl.value("type", "") == "ByteLevel" && !bl.value("add_prefix_space", false) && !bl.value("use_regex", true);
      if (ok) {
        const auto& re = split["pattern"]["Regex"].get_ref<const std::string&>();
        if (re == qwen2_pattern) max_digits_ = 1;
        else if (re == llama3_pattern) max_digits_ = 3;
        else ok = false;
      }
    }
    check(ok, src, ": pre_tokenizer ", shown,
          " is not supported (zipage implements the Split + ByteLevel sequences of Qwen2/Qwen3 and Llama 3)");
  }

  // True when every character of `s` is one of the byte map's 256 (all below U+0144).
  static bool in_byte_map(std::string_view s) noexcept {
    const auto& to_byte = detail::unicode_to_byte();
    for (std::size_t i = 0; i < s.size();) {
      const auto b0 = static_cast<unsigned char>(s[i]);
      char32_t cp;
      if (b0 < 0x80) {
        cp = b0;
        i += 1;
      } else if ((b0 & 0xE0) == 0xC0 && i + 1 < s.size()) {
        cp = (char32_t{b0} & 0x1F) << 6 | (static_cast<unsigned char>(s[i + 1]) & 0x3F);
        i += 2;
      } else {
        return false;  // three bytes or more: above U+07FF
      }
      if (cp >= to_byte.size() || to_byte[cp] < 0) return false;
    }
    return true;
  }

  void define(token_id id, std::string text, const std::string& src) {
    check(id >= 0 && id < (1 << 30), src, ": token id ", id, " is out of range");
    check(static_cast<std::size_t>(id) < max_id_, src, ": token id ", id, " is out of range: the file declares ",
          declared_, " tokens (model.vocab + added_tokens), so ids must be below 2 x ", declared_, " + 1024 = ", max_id_);
    if (static_cast<std::size_t>(id) >= tokens_.size()) tokens_.resize(static_cast<std::size_t>(id) + 1);
    token_entry& e = tokens_[static_cast<std::size_t>(id)];
    check(e.text.empty(), src, ": token id ", id, " is given to both '", json::printable(e.text), "' and '",
          json::printable(text), "'");
    check(!text.empty(), src, ": token id ", id, " has an empty string");
    e.raw = !in_byte_map(text);
    e.text = std::move(text);
  }

  void read_vocab(const json::value& model, const std::string& src) {
    const json::value& vocab = json::require(model, "vocab", src + ": model");
    check(vocab.is_object() && !vocab.empty(), src, ": model.vocab must be a non-empty object");
    vocab_.reserve(vocab.size());
    tokens_.reserve(vocab.size() + 1024);
    for (const auto& [piece, id_value] : vocab.items()) {
      const bool plain = id_value.is_number_unsigned() && id_value.get<std::uint64_t>() < (1u << 30);
      const auto id = plain ? static_cast<token_id>(id_value.get<std::uint64_t>())  // fast path; else a named error
                            : static_cast<token_id>(json::as_int(id_value, src, "model.vocab['" + json::printable(piece) + "']",
                                                                 0, (1 << 30) - 1));
      define(id, piece, src);
      vocab_.emplace(piece, id);
    }
    const auto& b2u = detail::byte_to_unicode();
    for (int b = 0; b < 256; ++b) {
      std::string s;
      unicode::append_utf8(s, b2u[static_cast<std::size_t>(b)]);
      const auto it = vocab_.find(s);
      check(it != vocab_.end(), src, ": the vocab lacks the byte-level token '", s, "' for byte ", b,
            " (every byte needs one)");
      byte_token_[static_cast<std::size_t>(b)] = it->second;
    }
  }

  void read_added_tokens(const json::value& root, const std::string& src) {
    const json::value* added = json::find(root, "added_tokens");
    if (added == nullptr) return;
    check(added->is_array(), src, ": added_tokens must be an array");
    for (std::size_t i = 0; i < added->size(); ++i) {
      const json::value& a = (*added)[i];
      const std::string where = src + ": added_tokens[" + std::to_string(i) + "]";
      check(a.is_object(), where, " must be an object");
      bpe_added_token t;
      t.id = static_cast<token_id>(json::as_int(json::require(a, "id", where), where, "id", 0, (1 << 30) - 1));
      t.content = json::as_string(json::require(a, "content", where), where, "content");
      check(!t.content.empty(), where, ": empty content");
      t.special = json::get_bool(a, "special", where, false);
      t.lstrip = json::get_bool(a, "lstrip", where, false);
      t.rstrip = json::get_bool(a, "rstrip", where, false);
      check(!json::get_bool(a, "single_word", where, false), where, ": single_word added tokens are not supported");
      const auto in_vocab = vocab_.find(t.content);
      if (in_vocab != vocab_.end()) {
        // An added token that is also a vocab entry (as some exporters list them): same id required.
        check(in_vocab->second == t.id, where, ": '", json::printable(t.content), "' has id ", t.id,
              " but the vocab gives it ", in_vocab->second);
      } else {
        define(t.id, t.content, where);
      }
      // Decoded like any token (define() set `raw`): through the byte map when every character is in it.
      token_entry& e = tokens_[static_cast<std::size_t>(t.id)];
      e.special = t.special;
      e.added = true;
      check(added_index_.emplace(t.content, t.id).second, where, ": '", json::printable(t.content), "' is listed twice");
      added_.push_back(std::move(t));
    }
    // Candidates by first byte, longest first, so the longest match at a position wins.
    for (std::size_t i = 0; i < added_.size(); ++i)
      added_by_first_[static_cast<unsigned char>(added_[i].content[0])].push_back(static_cast<std::uint32_t>(i));
    for (auto& v : added_by_first_)
      std::stable_sort(v.begin(), v.end(),
                       [&](std::uint32_t a, std::uint32_t b) { return added_[a].content.size() > added_[b].content.size(); });
  }

  void read_merges(const json::value& model, const std::string& src) {
    const json::value& merges = json::require(model, "merges", src + ": model");
    check(merges.is_array(), src, ": model.merges must be an array");
    merges_.reserve(merges.size());
    std::string left, right;
    for (std::size_t i = 0; i < merges.size(); ++i) {
      const json::value& m = merges[i];
      auto where = [&] { return src + ": model.merges[" + std::to_string(i) + "]"; };
      if (m.is_string()) {  // "left right" (older files)
        const auto& s = m.get_ref<const std::string&>();
        const auto sp = s.find(' ');
        if (!(sp != std::string::npos && sp > 0 && sp + 1 < s.size() && s.find(' ', sp + 1) == std::string::npos))
          fail(where(), ": '", json::printable(s), "' is not two tokens separated by one space");
        left = s.substr(0, sp);
        right = s.substr(sp + 1);
      } else {  // ["left", "right"]
        if (!(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()))
          fail(where(), " must be a string pair, got ", json::printable(m.dump(), 80));
        left = m[0].get_ref<const std::string&>();
        right = m[1].get_ref<const std::string&>();
      }
      const auto l = vocab_.find(left), r = vocab_.find(right);
      if (l == vocab_.end() || r == vocab_.end())
        fail(where(), ": '", json::printable(left), "' or '", json::printable(right), "' is not in the vocab");
      left += right;
      const auto lr = vocab_.find(left);
      if (lr == vocab_.end()) fail(where(), ": the merged token '", json::printable(left), "' is not in the vocab");
      // A repeated pair keeps its first (best) rank, as the library does.
      merges_.try_emplace(pair_key(l->second, r->second), merge_info{static_cast<std::int32_t>(i), lr->second});
    }
  }

  void read_post_processor(const json::value& root, const std::string& src) {
    if (const json::value* pp = json::find(root, "post_processor")) {
      if (const auto id = template_bos(*pp, src)) {
        bos_ = *id;
        add_bos_ = true;
      }
    }
  }

  // The special token a TemplateProcessing puts before a single sequence, if any.
  std::optional<token_id> template_bos(const json::value& pp, const std::string& src) const {
    if (!pp.is_object()) return std::nullopt;
    const std::string type = pp.value("type", "");
    if (type == "Sequence" && pp.contains("processors") && pp["processors"].is_array()) {
      for (const auto& p : pp["processors"])
        if (const auto id = template_bos(p, src)) return id;
      return std::nullopt;
    }
    if (type != "TemplateProcessing" || !pp.contains("single") || !pp["single"].is_array() || pp["single"].empty())
      return std::nullopt;
    const auto& first = pp["single"][0];
    if (!first.is_object() || !first.contains("SpecialToken")) return std::nullopt;
    const auto& st = first["SpecialToken"];
    check(st.is_object() && st.contains("id") && st["id"].is_string(), src, ": post_processor SpecialToken lacks an id");
    const auto& name = st["id"].get_ref<const std::string&>();
    const auto found = find(name);
    check(found.has_value(), src, ": post_processor adds '", json::printable(name), "', which is not a token");
    return found;
  }

  // tokenizer_config.json: bos/eos tokens, add_bos_token, chat template.
  void load_config(const json::value& cfg, const std::string& src) {
    check(cfg.is_object(), src, ": must be a JSON object, got ", json::type_name(cfg));
    auto token_field = [&](const char* key) -> std::optional<token_id> {
      const json::value* v = json::find(cfg, key);
      if (v == nullptr) return std::nullopt;
      const json::value* content = v->is_object() ? json::find(*v, "content") : v;  // {"content": ...} in older files
      check(content != nullptr, src, ": field '", key, "' has no content");
      const std::string& s = json::as_string(*content, src, key);
      const auto id = find(s);
      check(id.has_value(), src, ": ", key, " '", json::printable(s), "' is not a token of the tokenizer");
      return id;
    };
    if (const auto id = token_field("eos_token")) eos_ = *id;
    if (const auto id = token_field("bos_token")) bos_ = *id;
    if (const json::value* v = json::find(cfg, "add_bos_token")) add_bos_ = json::as_bool(*v, src, "add_bos_token");
    check(!add_bos_ || bos_ >= 0, src, ": add_bos_token is true but there is no bos_token");
    auto use_template = [&](const std::string& jinja) {
      chat_ = detect_chat_format(jinja);
      chat_default_system_.clear();
      if (chat_ == chat_format::qwen2 || chat_ == chat_format::qwen2_5)
        chat_default_system_ = *chat_template_default_system(jinja);  // detection found it
    };
    if (const json::value* t = json::find(cfg, "chat_template")) {
      if (t->is_string()) {
        use_template(t->get_ref<const std::string&>());
      } else {
        check(t->is_array(), src, ": chat_template must be a string or a list of {name, template}");
        for (const auto& entry : *t)
          if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
              entry["template"].is_string())
            use_template(entry["template"].get_ref<const std::string&>());
      }
    }
  }

  // ---- encoding ----

  const bpe_added_token* match_added(std::string_view text, std::size_t i, bool parse_special) const {
    for (std::uint32_t k : added_by_first_[static_cast<unsigned char>(text[i])]) {
      const bpe_added_token& a = added_[k];
      if (a.special && !parse_special) continue;
      if (text.compare(i, a.content.size(), a.content) == 0) return &a;
    }
    return nullptr;
  }

  void encode_text(std::string_view raw, std::vector<token_id>& out) const {
    if (raw.empty()) return;
    const std::string text = normalize(raw);
    for (std::string_view piece : pre_tokenize(text)) encode_piece(piece, out);
  }

  // One pre-tokenized piece → BPE tokens.
  void encode_piece(std::string_view piece, std::vector<token_id>& out) const {
    if (piece.size() == 1) {
      out.push_back(byte_token_[static_cast<unsigned char>(piece[0])]);
      return;
    }
    if (ignore_merges_) {
      std::string chars;
      for (char c : piece) unicode::append_utf8(chars, detail::byte_to_unicode()[static_cast<unsigned char>(c)]);
      if (const auto it = vocab_.find(chars); it != vocab_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    check(piece.size() < static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()), "encode: piece too long");
    std::vector<symbol> syms(piece.size());
    for (std::size_t i = 0; i < piece.size(); ++i) {
      const auto idx = static_cast<std::int32_t>(i);
      syms[i] = {byte_token_[static_cast<unsigned char>(piece[i])], idx - 1, idx + 1};
    }
    syms.back().next = -1;
    std::priority_queue<candidate, std::vector<candidate>, later> queue;
    auto push = [&](std::int32_t left) {
      if (left < 0) return;
      const std::int32_t right = syms[static_cast<std::size_t>(left)].next;
      if (right < 0) return;
      const token_id a = syms[static_cast<std::size_t>(left)].id, b = syms[static_cast<std::size_t>(right)].id;
      const auto it = merges_.find(pair_key(a, b));
      if (it != merges_.end()) queue.push({it->second.rank, left, a, b, it->second.id});
    };
    for (std::int32_t i = 0; i + 1 < static_cast<std::int32_t>(syms.size()); ++i) push(i);
    while (!queue.empty()) {
      const candidate c = queue.top();
      queue.pop();
      symbol& l = syms[static_cast<std::size_t>(c.left)];
      // Stale when the left symbol was merged away or changed, or its right neighbour changed.
      if (l.id != c.left_id || l.next < 0 || syms[static_cast<std::size_t>(l.next)].id != c.right_id) continue;
      symbol& r = syms[static_cast<std::size_t>(l.next)];
      l.id = c.merged;
      l.next = r.next;
      if (r.next >= 0) syms[static_cast<std::size_t>(r.next)].prev = c.left;
      r.id = -1;  // dead
      push(l.prev);
      push(c.left);
    }
    for (std::int32_t i = 0; i >= 0; i = syms[static_cast<std::size_t>(i)].next)
      out.push_back(syms[static_cast<std::size_t>(i)].id);
  }

  // ---- the pre-tokenizer regex, by hand ----

  enum class cls : std::uint8_t { letter, number, newline, space, other };

  static cls classify(char32_t cp) noexcept {
    if (cp == '\r' || cp == '\n') return cls::newline;
    if (unicode::is_letter(cp)) return cls::letter;
    if (unicode::is_number(cp)) return cls::number;
    if (unicode::is_space(cp)) return cls::space;
    return cls::other;
  }

  // Case-insensitive letter of the contractions ('s 't 're 've 'm 'll 'd); U+017F ſ folds to s.
  static char fold(char32_t cp) noexcept {
    if (cp == 0x17F) return 's';
    if (cp < 0x80) return static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
    return 0;
  }

  // End (unit index) of the regex match starting at unit i. Every position starts a match: letters,
  // numbers, whitespace and everything else each have an alternative.
  std::size_t match_piece(const std::vector<unicode::unit>& u, std::size_t i) const {
    const std::size_t n = u.size();
    auto c = [&](std::size_t k) { return classify(u[k].cp); };
    auto run = [&](std::size_t k, auto pred) {
      while (k < n && pred(c(k))) ++k;
      return k;
    };
    const cls ci = c(i);
    // 1. (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if (u[i].cp == '\'' && i + 1 < n) {
      const char a = fold(u[i + 1].cp);
      if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
      if (i + 2 < n) {
        const char b = fold(u[i + 2].cp);
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
      }
    }
    auto is_letter = [](cls k) { return k == cls::letter; };
    // 2. [^\r\n\p{L}\p{N}]?\p{L}+
    if (ci == cls::letter) return run(i + 1, is_letter);
    if (ci != cls::newline && ci != cls::number && i + 1 < n && c(i + 1) == cls::letter) return run(i + 2, is_letter);
    // 3. \p{N} (Qwen) or \p{N}{1,3} (Llama 3)
    if (ci == cls::number) {
      std::size_t j = i + 1;
      while (j < n && j - i < static_cast<std::size_t>(max_digits_) && c(j) == cls::number) ++j;
      return j;
    }
    // 4. ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    std::size_t j = i;
    if (u[i].cp == ' ' && i + 1 < n && c(i + 1) == cls::other) j = i + 1;
    if (c(j) == cls::other) {
      j = run(j + 1, [](cls k) { return k == cls::other; });
      return run(j, [](cls k) { return k == cls::newline; });
    }
    // Whitespace from here on.
    const std::size_t end = run(i, [](cls k) { return k == cls::space || k == cls::newline; });
    // 5. \s*[\r\n]+ : up to the last newline of the whitespace run.
    for (std::size_t k = end; k > i; --k)
      if (c(k - 1) == cls::newline) return k;
    // 6. \s+(?!\S) : the run, less its last character when a non-space follows.
    if (end == n) return end;
    if (end - i >= 2) return end - 1;
    // 7. \s+
    return end;
  }

  std::vector<token_entry> tokens_;  // by id
  std::size_t declared_ = 0;  // vocab entries + added tokens
  std::size_t max_id_ = 0;    // every id is below it (2 x declared_ + 1024)
  std::unordered_map<std::string, token_id, detail::bpe_string_hash, std::equal_to<>> vocab_;
  std::unordered_map<std::string, token_id, detail::bpe_string_hash, std::equal_to<>> added_index_;
  std::unordered_map<std::uint64_t, merge_info> merges_;
  std::vector<bpe_added_token> added_;
  std::array<std::vector<std::uint32_t>, 256> added_by_first_;
  std::array<token_id, 256> byte_token_{};
  bool nfc_ = false;
  bool ignore_merges_ = false;
  int max_digits_ = 1;
  token_id bos_ = -1, eos_ = -1;
  bool add_bos_ = false;
  chat_format chat_ = chat_format::none;
  std::string chat_default_system_;  // qwen2, qwen2_5: parsed from the template
};

// Turns generated tokens into printable text one token at a time; output is always valid UTF-8 (a
// character split across tokens is held until complete; bytes that can never form one become U+FFFD).
// The concatenation of all push() results and flush() equals tokenizer.decode(ids, skip_special).
class bpe_stream_decoder {
 public:
  explicit bpe_stream_decoder(const bpe_tokenizer& tokenizer, bool skip_special = true)
      : tok_(&tokenizer), skip_special_(skip_special) {}

  std::string push(token_id id) {
    tok_->append_token_bytes(pending_.buffer(), id, skip_special_);
    return pending_.take();
  }
  std::string flush() { return pending_.flush(); }
  void reset() { pending_.clear(); }
  [[nodiscard]] bool has_pending() const noexcept { return !pending_.empty(); }

 private:
  const bpe_tokenizer* tok_;
  bool skip_special_;
  utf8::holdback pending_;
};

}  // namespace zipage
