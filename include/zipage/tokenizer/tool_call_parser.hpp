#pragma once
// Reads tool calls out of a model's answer, as vLLM's --tool-call-parser hermes does for Qwen2.5, Qwen3, QwQ and
// Hermes models: each call is a JSON object {"name": ..., "arguments": {...}} between <tool_call> and
// </tool_call> (the last one may lack its closing tag when the answer stops there); the text before the first
// <tool_call> is the message's content. An answer whose calls do not all parse is left as content, as vLLM
// leaves it.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zipage {

inline constexpr std::string_view tool_call_open = "<tool_call>";
inline constexpr std::string_view tool_call_close = "</tool_call>";

struct parsed_tool_call {
  std::string name;
  std::string arguments;  // a JSON object's text (OpenAI's function.arguments)
};

struct tool_call_split {
  std::optional<std::string> content;  // null when empty and there are calls
  std::vector<parsed_tool_call> calls;   // empty: no tool call (the whole answer is content)
};

namespace detail {
// One call's JSON: an object with a string "name" and an object (or absent / JSON-string) "arguments".
inline std::optional<parsed_tool_call> parse_tool_call(std::string_view body) {
  const auto j = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  parsed_tool_call c{j["name"].get<std::string>(), "{}"};
  if (j.contains("arguments")) {
    const auto& a = j["arguments"];
    if (a.is_object()) {
      c.arguments = a.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    } else if (a.is_string()) {
      c.arguments = a.get<std::string>();
    } else {
      return std::nullopt;
    }
  }
  return c;
}
}  // namespace detail

inline tool_call_split split_tool_calls(std::string_view answer) {
  const std::size_t first = answer.find(tool_call_open);
  if (first == std::string_view::npos) return {std::string(answer), {}};
  tool_call_split out;
  for (std::size_t at = first; at != std::string_view::npos; at = answer.find(tool_call_open, at)) {
    const std::size_t body = at + tool_call_open.size();
    const std::size_t close = answer.find(tool_call_close, body);
    const auto call = detail::parse_tool_call(answer.substr(body, close == std::string_view::npos ? answer.npos : close - body));
    if (!call) return {std::string(answer), {}};  // not what the parser expects: all content
    out.calls.push_back(*call);
    if (close == std::string_view::npos) break;
    at = close + tool_call_close.size();
  }
  if (first > 0) out.content = std::string(answer.substr(0, first));
  return out;
}

// The streaming side: content is sent as it comes until "<tool_call>" appears (a tail that may be its start
// is held back); from there the rest is held and parsed when the answer ends (finish()).
class tool_call_stream {
 public:
  // Content that can go out now.
  std::string push(std::string_view text) {
    if (calls_started_) {
      held_ += text;
      return {};
    }
    pending_ += text;
    if (const std::size_t at = pending_.find(tool_call_open); at != std::string::npos) {
      calls_started_ = true;
      std::string out = pending_.substr(0, at);
      held_ = pending_.substr(at);
      pending_.clear();
      return out;
    }
    std::size_t keep = 0;  // the longest tail that is a proper prefix of "<tool_call>"
    for (std::size_t n = std::min(pending_.size(), tool_call_open.size() - 1); n > 0 && keep == 0; --n)
      if (tool_call_open.starts_with(std::string_view(pending_).substr(pending_.size() - n))) keep = n;
    std::string out = pending_.substr(0, pending_.size() - keep);
    pending_.erase(0, pending_.size() - keep);
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
    if (!calls_started_) {
      out.content = std::move(pending_);
      return out;
    }
    auto split = split_tool_calls(held_);
    if (split.calls.empty()) {
      out.content = std::move(held_);
    } else {
      out.calls = std::move(split.calls);
    }
    return out;
  }

 private:
  std::string pending_, held_;
  bool calls_started_ = false;
};

}  // namespace zipage
