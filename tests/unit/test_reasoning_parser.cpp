// The reasoning parser (include/zipage/tokenizer/reasoning_parser.hpp): a finished answer split as vLLM's
// qwen3 / deepseek_r1 parsers split it, and the streaming split equal to it however the text is cut into
// deltas (tags split across deltas included).
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "zipage/tokenizer/reasoning_parser.hpp"

using zipage::split_reasoning;

TEST_CASE("reasoning parser: where the prompt leaves the reasoning") {
  CHECK(zipage::prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));             // QwQ, DeepSeek-R1
  CHECK_FALSE(zipage::prompt_opens_reasoning("<|im_start|>assistant\n"));                 // Qwen3, thinking on
  CHECK_FALSE(zipage::prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));  // thinking off
  CHECK_FALSE(zipage::prompt_opens_reasoning("a <think>x</think> b"));
  CHECK(zipage::prompt_opens_reasoning("<think>x</think> <think>"));
  // Closed at the end (thinking turned off: a guide starts at once), not merely closed somewhere before.
  CHECK(zipage::prompt_closes_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  CHECK(zipage::prompt_closes_reasoning("<think></think>"));
  CHECK_FALSE(zipage::prompt_closes_reasoning("<|im_start|>assistant\n"));
  CHECK_FALSE(zipage::prompt_closes_reasoning("<|im_start|>assistant\n<think>\n"));
  CHECK_FALSE(zipage::prompt_closes_reasoning("<think>x</think> b<|im_start|>assistant\n"));  // an earlier turn's
  CHECK_FALSE(zipage::prompt_closes_reasoning("</think>\n"));  // no block opened
  CHECK_FALSE(zipage::prompt_closes_reasoning("<think>x</think> <think>"));
}

TEST_CASE("reasoning parser: a finished answer") {
  auto check_split = [](std::string_view answer, bool opened, std::optional<std::string> reasoning,
                        std::optional<std::string> content) {
    const auto s = split_reasoning(answer, opened);
    CHECK(s.reasoning == reasoning);
    CHECK(s.content == content);
  };
  // Qwen3 with thinking on: the model opens the block.
  check_split("<think>\nr\n</think>\n\nThe answer is 5.", false, "\nr\n", "\n\nThe answer is 5.");
  // No block: all content (Qwen3 with thinking off, a model that does not reason).
  check_split("The answer is 5.", false, std::nullopt, "The answer is 5.");
  check_split(" <think>late</think>", false, std::nullopt, " <think>late</think>");
  // DeepSeek-R1 / QwQ: the prompt opened it.
  check_split("r</think>\n\nA", true, "r", "\n\nA");
  // Cut off before </think>: all reasoning, no content.
  check_split("still thinking", true, "still thinking", std::nullopt);
  check_split("<think>still", false, "still", std::nullopt);
  // Nothing after the block: content null; a later </think> belongs to the content.
  check_split("<think>r</think>", false, "r", std::nullopt);
  check_split("r</think>a</think>b", true, "r", "a</think>b");
  check_split("", true, "", std::nullopt);
  check_split("", false, std::nullopt, "");
}

TEST_CASE("reasoning parser: a stream gives the finished answer's split however it is cut") {
  const std::vector<std::pair<std::string, bool>> answers = {
      {"<think>\nr\n</think>\n\nThe answer is 5.", false}, {"The answer is 5.", false}, {"<thi", false},
      {"<think", false}, {"<think>", false}, {"<", false}, {"r</think>\n\nA", true}, {"still </thin", true},
      {"r</think>a</think>b", true}, {"</</th</think>x", true}, {"", true}, {"<think>a</think", false}};
  std::mt19937 rng(7);
  for (const auto& entry : answers) {
    const std::string& answer = entry.first;  // (not structured bindings: CAPTURE's lambda takes them)
    const bool opened = entry.second;
    const auto whole = split_reasoning(answer, opened);
    for (int trial = 0; trial < 200; ++trial) {
      zipage::reasoning_stream s(opened);
      std::string reasoning, content;
      for (std::size_t at = 0; at < answer.size();) {
        const std::size_t n = std::min<std::size_t>(answer.size() - at, 1 + rng() % 4);
        const auto d = s.push(std::string_view(answer).substr(at, n));
        reasoning += d.reasoning;
        content += d.content;
        at += n;
      }
      const auto rest = s.finish();
      reasoning += rest.reasoning;
      content += rest.content;
      CAPTURE(answer);
      CHECK(reasoning == whole.reasoning.value_or(""));
      CHECK(content == whole.content.value_or(""));
    }
  }
  // A tag's first characters wait for the rest instead of going out as reasoning.
  zipage::reasoning_stream s(true);
  CHECK(s.push("abc</th").reasoning == "abc");
  const auto d = s.push("ink>done");
  CHECK(d.reasoning.empty());
  CHECK(d.content == "done");
}
