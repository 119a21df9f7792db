#pragma once
// Reads tool calls out of a model's answer, as vLLM's --tool-call-parser does, in four of its formats:
//   hermes       Qwen2.5, Qwen3, QwQ, Hermes: each call a JSON object {"name": ..., "arguments": {...}} between
//                <tool_call> and </tool_call> (the last one may lack its closing tag when the answer stops
//                there); the text before the first <tool_call> is the message's content.
//   llama3_json  Llama 3.x and 4 (vLLM's second name for it: llama4_json): the answer is, after an optional
//                <|python_tag|>, one or more {"name": ..., "parameters" (or "arguments"): {...}} objects
//                separated by ';'.
//   mistral      Mistral: content, then [TOOL_CALLS] and a JSON array of {"name", "arguments"} objects; or, as
//                models with tokenizer v11+ write them, [TOOL_CALLS]name{...} (or name[ARGS]{...}) per call.
//   pythonic     Llama 3.2 / 4 style: the answer is a Python list of calls with keyword arguments given as
//                literals, [get_weather(city="Paris"), f(x=[1, 2.5], y=None)]; the literals become JSON.
// An answer whose calls do not all parse is left as content, as vLLM leaves it. Where vLLM's own paths
// disagree, zipage takes the stricter one so that nothing the model wrote is lost and a stream splits as the
// finished answer does: llama3_json reads calls only when the answer is nothing but calls (vLLM's streaming
// rule; its whole-answer path also takes JSON objects from inside text and drops the text), and a mistral v11
// call whose arguments are not a JSON object leaves the answer content (vLLM passes the raw text on as a call).
// pythonic accepts negative numbers (vLLM's AST walk refuses -1, a unary operation) and blanks wherever Python
// allows them (vLLM's pre-check pattern refuses f(a = 1)), and refuses positional arguments (vLLM drops them).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "zipage/tokenizer/jinja.hpp"

namespace zipage {

inline constexpr std::string_view tool_call_open = "<tool_call>";
inline constexpr std::string_view tool_call_close = "</tool_call>";
inline constexpr std::string_view llama_python_tag = "<|python_tag|>";
inline constexpr std::string_view mistral_tool_calls_tag = "[TOOL_CALLS]";
inline constexpr std::string_view mistral_args_tag = "[ARGS]";

enum class tool_call_format { hermes, llama3_json, mistral, pythonic };

// --tool-call-parser's names, vLLM's.
struct named_tool_call_format {
  std::string_view name;
  tool_call_format format;
};
inline constexpr std::array<named_tool_call_format, 5> tool_call_formats{{{"hermes", tool_call_format::hermes},
                                                                          {"llama3_json", tool_call_format::llama3_json},
                                                                          {"llama4_json", tool_call_format::llama3_json},
                                                                          {"mistral", tool_call_format::mistral},
                                                                          {"pythonic", tool_call_format::pythonic}}};

inline std::optional<tool_call_format> tool_call_format_named(std::string_view name) {
  for (const auto& f : tool_call_formats)
    if (f.name == name) return f.format;
  return std::nullopt;
}

// "hermes, llama3_json, ...": for help texts and the error naming an unknown parser.
inline std::string tool_call_format_names() {
  std::string out;
  for (const auto& f : tool_call_formats) out += (out.empty() ? "" : ", ") + std::string(f.name);
  return out;
}

struct parsed_tool_call {
  std::string name;
  std::string arguments;  // a JSON object's text (OpenAI's function.arguments)
};

struct tool_call_split {
  std::optional<std::string> content;  // null when empty and there are calls
  std::vector<parsed_tool_call> calls;   // empty: no tool call (the whole answer is content)
};

// A tool call id as Mistral's tokenizers require them (9 ASCII letters or digits; vLLM draws them at random):
// derived from the response's id and the call's index, so a streamed and a whole answer name a call alike.
inline std::string mistral_tool_call_id(std::string_view response_id, std::size_t k) {
  constexpr std::string_view alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a over the id and the index
  auto mix = [&h](unsigned char c) { h = (h ^ c) * 1099511628211ull; };
  for (char c : response_id) mix(static_cast<unsigned char>(c));
  for (std::size_t v = k, n = 0; n < sizeof v; ++n, v >>= 8) mix(static_cast<unsigned char>(v & 0xFF));
  std::string id(9, '0');
  for (char& c : id) {
    h = h * 6364136223846793005ull + 1442695040888963407ull;  // spread the hash over all nine characters
    c = alphabet[(h >> 33) % alphabet.size()];
  }
  return id;
}

namespace detail {

inline bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

inline std::size_t skip_blanks(std::string_view s, std::size_t at) {
  while (at < s.size() && is_blank(s[at])) ++at;
  return at;
}

inline std::string compact_json(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

// Deeper nesting than any tool's arguments: the answer stays content rather than the parser recursing on.
inline constexpr std::size_t max_nesting = 256;

// One past the '}' or ']' that closes the JSON object or array opening at s[at] (strings skipped), or npos when
// it is not closed in s, is mismatched or nests too deep. The text is parsed as JSON afterwards.
inline std::size_t json_container_end(std::string_view s, std::size_t at) {
  std::string closers;
  bool in_string = false;
  for (std::size_t i = at; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (closers.size() == max_nesting) return std::string_view::npos;
      closers.push_back(c == '{' ? '}' : ']');
    } else if (c == '}' || c == ']') {
      if (closers.empty() || closers.back() != c) return std::string_view::npos;
      closers.pop_back();
      if (closers.empty()) return i + 1;
    }
  }
  return std::string_view::npos;
}

inline nlohmann::ordered_json parse_json(std::string_view text) {
  return nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
}

// One call's JSON: an object with a string "name" and an object (or JSON-string) arguments under "arguments"
// (or, for Llama, "parameters"). Absent arguments are {} where allowed, as the hermes parser reads them.
struct call_keys {
  bool parameters_too = false;       // llama3_json: "parameters" is the arguments' other name
  bool arguments_required = false;   // without them the object is not a call (Llama's JSON answers)
};
inline std::optional<parsed_tool_call> call_from_json(const nlohmann::ordered_json& j, call_keys keys = {}) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  parsed_tool_call c{j["name"].get<std::string>(), "{}"};
  const char* key = j.contains("arguments") ? "arguments" : keys.parameters_too && j.contains("parameters") ? "parameters" : nullptr;
  if (key == nullptr) {
    if (keys.arguments_required) return std::nullopt;
    return c;
  }
  const auto& a = j[key];
  if (a.is_object()) {
    c.arguments = compact_json(a);
  } else if (a.is_string()) {
    c.arguments = a.get<std::string>();
  } else {
    return std::nullopt;
  }
  return c;
}

inline std::optional<parsed_tool_call> parse_tool_call(std::string_view body) { return call_from_json(parse_json(body)); }

// ---- hermes ----

inline tool_call_split split_hermes(std::string_view answer) {
  const std::size_t first = answer.find(tool_call_open);
  if (first == std::string_view::npos) return {std::string(answer), {}};
  tool_call_split out;
  for (std::size_t at = first; at != std::string_view::npos; at = answer.find(tool_call_open, at)) {
    const std::size_t body = at + tool_call_open.size();
    const std::size_t close = answer.find(tool_call_close, body);
    const auto call = parse_tool_call(answer.substr(body, close == std::string_view::npos ? answer.npos : close - body));
    if (!call) return {std::string(answer), {}};  // not what the parser expects: all content
    out.calls.push_back(*call);
    if (close == std::string_view::npos) break;
    at = close + tool_call_close.size();
  }
  if (first > 0) out.content = std::string(answer.substr(0, first));
  return out;
}

// ---- llama3_json ----

// The calls when the answer is nothing but [<|python_tag|>] {call} [; {call}]... (blanks around each part).
inline std::optional<std::vector<parsed_tool_call>> llama3_json_calls(std::string_view answer) {
  std::size_t at = skip_blanks(answer, 0);
  if (answer.substr(at).starts_with(llama_python_tag)) at = skip_blanks(answer, at + llama_python_tag.size());
  std::vector<parsed_tool_call> calls;
  while (true) {
    if (at == answer.size() || answer[at] != '{') return std::nullopt;
    const std::size_t end = json_container_end(answer, at);
    if (end == std::string_view::npos) return std::nullopt;
    auto call = call_from_json(parse_json(answer.substr(at, end - at)), {.parameters_too = true, .arguments_required = true});
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
    at = skip_blanks(answer, end);
    if (at == answer.size()) return calls;
    if (answer[at] != ';') return std::nullopt;
    at = skip_blanks(answer, at + 1);
  }
}

// ---- mistral ----

// Before tokenizer v11: [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...] and nothing after the array.
inline std::optional<std::vector<parsed_tool_call>> mistral_array_calls(std::string_view after_tag) {
  const std::size_t open = skip_blanks(after_tag, 0);
  const std::size_t end = json_container_end(after_tag, open);
  if (end == std::string_view::npos || skip_blanks(after_tag, end) != after_tag.size()) return std::nullopt;
  const auto list = parse_json(after_tag.substr(open, end - open));
  if (!list.is_array() || list.empty()) return std::nullopt;
  std::vector<parsed_tool_call> calls;
  for (const auto& item : list) {
    auto call = call_from_json(item, {.arguments_required = true});
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
  }
  return calls;
}

inline bool is_function_name(std::string_view name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
  });
}

// Tokenizer v11+: [TOOL_CALLS]name{...} or [TOOL_CALLS]name[ARGS]{...} per call, from the first tag to the end.
inline std::optional<std::vector<parsed_tool_call>> mistral_named_calls(std::string_view from_tag) {
  std::vector<parsed_tool_call> calls;
  std::size_t at = 0;
  while (at < from_tag.size()) {
    if (!from_tag.substr(at).starts_with(mistral_tool_calls_tag)) return std::nullopt;
    at += mistral_tool_calls_tag.size();
    const std::size_t brace = from_tag.find('{', at);
    if (brace == std::string_view::npos) return std::nullopt;
    std::string_view name = from_tag.substr(at, brace - at);
    if (name.ends_with(mistral_args_tag)) name.remove_suffix(mistral_args_tag.size());
    const std::size_t name_start = skip_blanks(name, 0);
    name = name.substr(name_start);
    while (!name.empty() && is_blank(name.back())) name.remove_suffix(1);
    const std::size_t end = json_container_end(from_tag, brace);
    if (!is_function_name(name) || end == std::string_view::npos) return std::nullopt;
    const auto arguments = parse_json(from_tag.substr(brace, end - brace));
    if (!arguments.is_object()) return std::nullopt;
    calls.push_back({std::string(name), compact_json(arguments)});
    at = skip_blanks(from_tag, end);
  }
  return calls;
}

inline tool_call_split split_mistral(std::string_view answer) {
  const std::size_t first = answer.find(mistral_tool_calls_tag);
  if (first == std::string_view::npos) return {std::string(answer), {}};
  const std::string_view after = answer.substr(first + mistral_tool_calls_tag.size());
  const std::size_t next = skip_blanks(after, 0);
  auto calls = next < after.size() && after[next] == '[' ? mistral_array_calls(after) : mistral_named_calls(answer.substr(first));
  if (!calls) return {std::string(answer), {}};
  tool_call_split out;
  out.calls = std::move(*calls);
  if (first > 0) out.content = std::string(answer.substr(0, first));
  return out;
}

// ---- pythonic ----

// Reads "[f(a=1, b='x'), g()]": a Python list of calls, each a name and keyword arguments whose values are
// literals (strings, numbers, True / False / None, lists and dicts of them), as Python's parser reads them.
class python_calls_reader {
 public:
  explicit python_calls_reader(std::string_view text) : s_(text) {}

  // The calls when the whole text (blanks after the list allowed) is such a list.
  std::optional<std::vector<parsed_tool_call>> calls() {
    if (!eat('[')) return std::nullopt;
    std::vector<parsed_tool_call> out;
    do {
      skip();
      auto call = read_call();
      if (!call) return std::nullopt;
      out.push_back(std::move(*call));
      skip();
    } while (eat(','));
    if (!eat(']')) return std::nullopt;
    skip();
    if (at_ != s_.size()) return std::nullopt;
    return out;
  }

 private:
  using json = nlohmann::ordered_json;

  char peek(std::size_t ahead = 0) const { return at_ + ahead < s_.size() ? s_[at_ + ahead] : '\0'; }
  bool eat(char c) {
    if (peek() != c) return false;
    ++at_;
    return true;
  }
  void skip() { at_ = skip_blanks(s_, at_); }  // inside brackets Python lets blanks and newlines go anywhere

  static bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
  static bool is_digit(char c) { return c >= '0' && c <= '9'; }
  std::string_view identifier() {
    const std::size_t start = at_;
    if (is_letter(peek()) || peek() == '_')
      while (is_letter(peek()) || is_digit(peek()) || peek() == '_') ++at_;
    return s_.substr(start, at_ - start);
  }

  // name(key=value, ...): a name starting with a letter (as vLLM's pattern wants) and only keyword arguments.
  std::optional<parsed_tool_call> read_call() {
    const std::string_view name = identifier();
    if (name.empty() || !is_letter(name[0]) || !eat('(')) return std::nullopt;
    json arguments = json::object();
    skip();
    while (!eat(')')) {
      const std::string key(identifier());
      if (key.empty() || arguments.contains(key)) return std::nullopt;  // Python: a repeated keyword is an error
      skip();
      if (!eat('=')) return std::nullopt;
      auto v = value(0);
      if (!v) return std::nullopt;
      arguments[key] = std::move(*v);
      skip();
      if (eat(',')) skip();
      else if (peek() != ')') return std::nullopt;
    }
    return parsed_tool_call{std::string(name), compact_json(arguments)};
  }

  std::optional<json> value(std::size_t depth) {
    skip();
    const char c = peek();
    if (c == '[' || c == '{') return depth < max_nesting ? (c == '[' ? list(depth) : dict(depth)) : std::nullopt;
    if (c == '-' || c == '+' || c == '.' || is_digit(c)) return number();
    if (c == '\'' || c == '"' || ((c == 'r' || c == 'R' || c == 'u' || c == 'U') && (peek(1) == '\'' || peek(1) == '"')))
      return string();
    const std::string_view word = identifier();
    if (word == "True" || word == "true") return json(true);  // JSON's spellings too, as newer vLLM accepts them
    if (word == "False" || word == "false") return json(false);
    if (word == "None" || word == "null") return json(nullptr);
    return std::nullopt;  // a name, call or other expression: not a literal
  }

  std::optional<json> list(std::size_t depth) {
    ++at_;  // '['
    json out = json::array();
    skip();
    while (!eat(']')) {
      auto v = value(depth + 1);
      if (!v) return std::nullopt;
      out.push_back(std::move(*v));
      skip();
      if (eat(',')) skip();
      else if (peek() != ']') return std::nullopt;
    }
    return out;
  }

  // {key: value, ...}; keys are strings, or ints and None, which JSON writes as strings (as Python's json.dumps
  // does). A repeated key keeps its first place and its last value, as a Python dict. True / False keys are
  // refused: Python takes them for 1 and 0 (one key), which JSON's "true" would not be.
  std::optional<json> dict(std::size_t depth) {
    ++at_;  // '{'
    json out = json::object();
    skip();
    while (!eat('}')) {
      auto k = value(depth + 1);
      if (!k) return std::nullopt;
      std::string key;
      if (k->is_string()) key = k->get<std::string>();
      else if (k->is_number_integer() || k->is_null()) key = k->dump();
      else return std::nullopt;  // a float key's text would differ from Python's; a list is not hashable
      skip();
      if (!eat(':')) return std::nullopt;
      auto v = value(depth + 1);
      if (!v) return std::nullopt;
      out[key] = std::move(*v);
      skip();
      if (eat(',')) skip();
      else if (peek() != '}') return std::nullopt;
    }
    return out;
  }

  // 12, -3, 1_000, 0x1F, 0o17, 0b101, 2.5, .5, 1e-3: ints (within 64 bits) and finite floats.
  std::optional<json> number() {
    const bool negative = peek() == '-';
    if (peek() == '-' || peek() == '+') ++at_;
    const std::size_t start = at_;
    const bool prefixed = peek() == '0' && peek(1) != '\0' && std::string_view("xXoObB").find(peek(1)) != std::string_view::npos;
    while (is_letter(peek()) || is_digit(peek()) || peek() == '_' || peek() == '.' ||
           (!prefixed && (peek() == '+' || peek() == '-') && at_ > start && (s_[at_ - 1] == 'e' || s_[at_ - 1] == 'E')))
      ++at_;
    const auto token = without_underscores(s_.substr(start, at_ - start), prefixed);
    if (!token || std::none_of(token->begin(), token->end(), [](char c) { return is_digit(c); })) return std::nullopt;
    if (prefixed) {
      const char base = (*token)[1] | 0x20;
      return integer(token->substr(2), base == 'x' ? 16 : base == 'o' ? 8 : 2, negative);
    }
    if (token->find_first_of(".eE") == std::string::npos) {
      if ((*token)[0] == '0' && token->find_first_not_of('0') != std::string::npos) return std::nullopt;  // 01
      return integer(*token, 10, negative);
    }
    const std::string text = (*token)[0] == '.' ? "0" + *token : *token;  // from_chars wants a digit first
    double d = 0;
    const auto r = std::from_chars(text.data(), text.data() + text.size(), d);
    if (r.ec != std::errc() || r.ptr != text.data() + text.size() || !std::isfinite(d)) return std::nullopt;
    return json(negative ? -d : d);
  }

  // Python allows one underscore between two digits (and after a base prefix): dropped; elsewhere an error.
  static std::optional<std::string> without_underscores(std::string_view raw, bool prefixed) {
    auto digit = [prefixed](char c) { return prefixed ? std::isxdigit(static_cast<unsigned char>(c)) != 0 : is_digit(c); };
    std::string out;
    for (std::size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] != '_') {
        out += raw[i];
        continue;
      }
      const bool after = i > 0 && (digit(raw[i - 1]) || (prefixed && i == 2));
      if (!after || i + 1 == raw.size() || !digit(raw[i + 1])) return std::nullopt;
    }
    return out;
  }

  static std::optional<json> integer(const std::string& digits, int base, bool negative) {
    std::uint64_t v = 0;
    const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v, base);
    if (digits.empty() || r.ec != std::errc() || r.ptr != digits.data() + digits.size()) return std::nullopt;
    if (!negative) return json(v);
    if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) + 1) return std::nullopt;
    return json(v == 0 ? std::int64_t{0} : static_cast<std::int64_t>(0 - v));
  }

  // 'x', "x", '''x''', """x""", with an r (backslashes kept) or u prefix; escapes decoded as Python decodes them
  // (the Jinja lexer's decoder, which follows Python). b'' and f'' are no plain strings: not literals here.
  std::optional<json> string() {
    bool raw = false;
    if (peek() != '\'' && peek() != '"') {
      raw = peek() == 'r' || peek() == 'R';
      ++at_;
    }
    const char q = peek();
    const bool triple = peek(1) == q && peek(2) == q;
    const std::size_t quotes = triple ? 3 : 1;
    at_ += quotes;
    const std::size_t body = at_;
    while (true) {
      if (at_ >= s_.size()) return std::nullopt;
      const char c = s_[at_];
      if (c == q && (!triple || (peek(1) == q && peek(2) == q))) break;
      if ((c == '\n' || c == '\r') && !triple) return std::nullopt;
      at_ += c == '\\' ? 2 : 1;  // an escaped quote never ends the string, raw or not
    }
    const std::string_view text = s_.substr(body, at_ - body);
    at_ += quotes;
    if (raw) return json(std::string(text));
    try {
      return json(jinja::detail::unescape(text, 0));
    } catch (const std::exception&) {
      return std::nullopt;  // a truncated or malformed \x / \u escape
    }
  }

  std::string_view s_;
  std::size_t at_ = 0;
};

// vLLM's pattern wants the list at the answer's very start.
inline std::optional<std::vector<parsed_tool_call>> pythonic_calls(std::string_view answer) {
  return python_calls_reader(answer).calls();
}

// The answer as all content, or as its calls when the whole answer is calls.
inline tool_call_split split_whole_answer(std::string_view answer, std::optional<std::vector<parsed_tool_call>> calls) {
  if (!calls) return {std::string(answer), {}};
  return {std::nullopt, std::move(*calls)};
}

}  // namespace detail

inline tool_call_split split_tool_calls(std::string_view answer, tool_call_format format = tool_call_format::hermes) {
  switch (format) {
    case tool_call_format::llama3_json: return detail::split_whole_answer(answer, detail::llama3_json_calls(answer));
    case tool_call_format::mistral: return detail::split_mistral(answer);
    case tool_call_format::pythonic: return detail::split_whole_answer(answer, detail::pythonic_calls(answer));
    case tool_call_format::hermes: break;
  }
  return detail::split_hermes(answer);
}

// The streaming side: content is sent as it comes until a tool call may have started, and from there the rest
// is held and parsed when the answer ends (finish()). hermes and mistral: from the first <tool_call> /
// [TOOL_CALLS] (a tail that may be its start is held back); llama3_json and pythonic, whose calls are the whole
// answer: from the start while the answer begins as a call would ({ or <|python_tag|> after blanks; [).
// Whatever the cuts, the content sent plus finish()'s equals split_tool_calls' content.
class tool_call_stream {
 public:
  explicit tool_call_stream(tool_call_format format = tool_call_format::hermes) : format_(format) {}

  // Content that can go out now.
  std::string push(std::string_view text) {
    text_ += text;
    const std::size_t hold = held_from();
    std::string out = text_.substr(sent_, hold - sent_);
    sent_ = hold;
    return out;
  }
  // At the end: the calls (empty when there were none or they do not parse) and the content still held
  // (all of the held text when the calls do not parse).
  struct ending {
    std::string content;
    std::vector<parsed_tool_call> calls;
  };
  ending finish() {
    ending out;
    auto split = split_tool_calls(text_, format_);
    const std::string content = split.calls.empty() ? std::move(text_) : split.content.value_or("");
    if (sent_ < content.size()) out.content = content.substr(sent_);
    out.calls = std::move(split.calls);
    return out;
  }

 private:
  // Where the text that may belong to a call starts (text_.size() when none may): all before it is content.
  std::size_t held_from() {
    if (plain_) return text_.size();
    switch (format_) {
      case tool_call_format::hermes: return tag_from(tool_call_open);
      case tool_call_format::mistral: return tag_from(mistral_tool_calls_tag);
      case tool_call_format::llama3_json: return whole_answer_from(opens_llama3_json());
      case tool_call_format::pythonic: return whole_answer_from(text_.empty() ? std::optional<bool>() : text_[0] == '[');
    }
    return text_.size();
  }

  // The first tag, or the longest tail that is a proper prefix of it. Text before sent_ was ruled out already.
  std::size_t tag_from(std::string_view tag) const {
    if (const std::size_t at = text_.find(tag, sent_); at != std::string::npos) return at;
    const std::size_t from = std::max(sent_, text_.size() - std::min(text_.size(), tag.size() - 1));
    for (std::size_t p = from; p < text_.size(); ++p)
      if (tag.starts_with(std::string_view(text_).substr(p))) return p;
    return text_.size();
  }

  // opens: whether the answer begins as its format's calls do (nullopt: too little text to tell yet).
  std::size_t whole_answer_from(std::optional<bool> opens) {
    if (!opens || *opens) return 0;
    plain_ = true;  // decided by the answer's start: all content, now and later
    return text_.size();
  }
  std::optional<bool> opens_llama3_json() const {
    const std::string_view rest = std::string_view(text_).substr(detail::skip_blanks(text_, 0));
    if (rest.empty()) return std::nullopt;
    if (rest[0] == '{' || rest.starts_with(llama_python_tag)) return true;
    if (llama_python_tag.starts_with(rest)) return std::nullopt;
    return false;
  }

  tool_call_format format_;
  std::string text_;    // all pushed so far
  std::size_t sent_ = 0;  // how much of it push() returned
  bool plain_ = false;    // llama3_json / pythonic: the answer does not start as calls do
};

}  // namespace zipage
