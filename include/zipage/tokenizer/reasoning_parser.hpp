#pragma once
// Splits a reasoning model's answer into its reasoning (the <think> ... </think> block) and its content, as
// vLLM's --reasoning-parser qwen3 / deepseek_r1 do for the OpenAI API's `reasoning_content`: whole (a
// finished answer) or incrementally (a stream, where a tag may arrive split across deltas).
//
// Where the reasoning starts depends on the prompt: DeepSeek-R1's and QwQ's templates open the <think> block
// in the generation prompt, so the answer starts inside it; Qwen3's model writes <think> itself, and with
// thinking turned off its template closes an empty block in the prompt. prompt_opens_reasoning() reads that
// from the rendered prompt, so one parser serves all of them.
#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace zipage {

inline constexpr std::string_view think_open = "<think>";
inline constexpr std::string_view think_close = "</think>";

// Whether the rendered prompt ends inside an open <think> block (its last <think> has no </think> after it).
inline bool prompt_opens_reasoning(std::string_view prompt) {
  const std::size_t open = prompt.rfind(think_open);
  return open != std::string_view::npos && prompt.find(think_close, open) == std::string_view::npos;
}

// Whether the rendered prompt ends with a closed <think> block and nothing but whitespace after it (Qwen3's template
// with thinking turned off writes "<think>\n\n</think>\n\n"): the answer starts after the reasoning.
inline bool prompt_closes_reasoning(std::string_view prompt) {
  const std::size_t close = prompt.rfind(think_close);
  if (close == std::string_view::npos) return false;
  const std::size_t open = prompt.rfind(think_open);
  return open != std::string_view::npos && open < close &&
         prompt.find_first_not_of(" \t\r\n", close + think_close.size()) == std::string_view::npos;
}

struct reasoning_split {
  std::optional<std::string> reasoning;  // null: the answer has no reasoning
  std::optional<std::string> content;    // null: nothing after the reasoning (vLLM's content: null)
};

// A finished answer. Starting inside the block (`opened`) or with "<think>", the reasoning runs to the first
// "</think>" (to the end when there is none: a cut-off answer is all reasoning); the content is what follows,
// verbatim. Otherwise the whole answer is content.
inline reasoning_split split_reasoning(std::string_view answer, bool opened) {
  if (!opened) {
    if (!answer.starts_with(think_open)) return {std::nullopt, std::string(answer)};
    answer.remove_prefix(think_open.size());
  }
  const std::size_t close = answer.find(think_close);
  if (close == std::string_view::npos) return {std::string(answer), std::nullopt};
  std::string_view content = answer.substr(close + think_close.size());
  return {std::string(answer.substr(0, close)), content.empty() ? std::nullopt : std::optional<std::string>(content)};
}

// The same split over a stream of text deltas: push() returns what can be sent now as reasoning and as
// content, holding back a tail that may be the start of a tag; finish() releases what is held. The
// concatenations of the outputs equal split_reasoning() of the whole text (empty where that gives null).
class reasoning_stream {
 public:
  struct delta {
    std::string reasoning, content;
  };

  explicit reasoning_stream(bool opened) : mode_(opened ? mode::reasoning : mode::start) {}

  delta push(std::string_view text) {
    pending_ += text;
    delta out;
    for (;;) {
      if (mode_ == mode::start) {
        if (pending_.size() < think_open.size() && std::string_view(think_open).starts_with(pending_)) return out;
        if (pending_.starts_with(think_open)) {
          pending_.erase(0, think_open.size());
          mode_ = mode::reasoning;
        } else {
          mode_ = mode::content;
        }
        continue;
      }
      if (mode_ == mode::content) {
        out.content += pending_;
        pending_.clear();
        return out;
      }
      // reasoning: up to </think>, holding back a tail that could be its beginning
      if (const std::size_t close = pending_.find(think_close); close != std::string::npos) {
        out.reasoning += pending_.substr(0, close);
        pending_.erase(0, close + think_close.size());
        mode_ = mode::content;
        continue;
      }
      const std::size_t keep = partial_tag_tail(pending_);
      out.reasoning += pending_.substr(0, pending_.size() - keep);
      pending_.erase(0, pending_.size() - keep);
      return out;
    }
  }

  delta finish() {
    delta out;
    (mode_ == mode::content || mode_ == mode::start ? out.content : out.reasoning) += pending_;
    pending_.clear();
    return out;
  }

  [[nodiscard]] bool in_reasoning() const noexcept { return mode_ == mode::reasoning; }

 private:
  enum class mode { start, reasoning, content };
  mode mode_;
  std::string pending_;

  // The length of the longest tail of `s` that is a proper prefix of "</think>".
  static std::size_t partial_tag_tail(std::string_view s) {
    for (std::size_t n = std::min(s.size(), think_close.size() - 1); n > 0; --n)
      if (think_close.starts_with(s.substr(s.size() - n))) return n;
    return 0;
  }
};

}  // namespace zipage
