// The hermes tool-call parser (include/zipage/tokenizer/tool_call_parser.hpp): calls read out of an answer as
// vLLM's --tool-call-parser hermes reads them, and the streaming side equal to it however the answer is cut.
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "zipage/tokenizer/tool_call_parser.hpp"

TEST_CASE("tool calls: a finished answer") {
  // Qwen3's form: content, then one call per block.
  auto s = zipage::split_tool_calls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": 2}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n</tool_call>");
  REQUIRE(s.calls.size() == 2);
  CHECK(s.content == "Let me check.\n");
  CHECK(s.calls[0].name == "get_weather");
  CHECK(s.calls[0].arguments == R"({"city":"Paris","n":2})");
  CHECK(s.calls[1].name == "add");
  CHECK(s.calls[1].arguments == "{}");
  // Only calls: content null. An unclosed last block (the answer stopped there) still parses.
  s = zipage::split_tool_calls("<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": [1]}}");
  REQUIRE(s.calls.size() == 1);
  CHECK_FALSE(s.content.has_value());
  CHECK(s.calls[0].arguments == R"({"x":[1]})");
  // Arguments given as a JSON string pass through; absent arguments are {}.
  s = zipage::split_tool_calls("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>");
  REQUIRE(s.calls.size() == 1);
  CHECK(s.calls[0].arguments == R"({"x": 1})");
  CHECK(zipage::split_tool_calls("<tool_call>{\"name\": \"f\"}</tool_call>").calls.at(0).arguments == "{}");
  // No block, or a block that is not a call: the whole answer is content.
  for (const std::string answer : {"The answer is 5.", "<tool_call>not json</tool_call>", "x <tool_call>{\"arguments\": {}}</tool_call>",
                                   "<tool_call>{\"name\": 3}</tool_call>", "<tool_call>{\"name\": \"f\", \"arguments\": 7}</tool_call>",
                                   "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>oops</tool_call>"}) {
    CAPTURE(answer);
    s = zipage::split_tool_calls(answer);
    CHECK(s.calls.empty());
    CHECK(s.content == answer);
  }
}

TEST_CASE("tool calls: a stream gives the finished answer's split however it is cut") {
  const std::vector<std::string> answers = {
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
      "plain text with < and <tool and <tool_cal", "<tool_call>bad</tool_call> tail", "<tool_call>{\"name\": \"f\"}",
      "", "<", "<tool_call>"};
  std::mt19937 rng(11);
  for (const auto& answer : answers) {
    const auto whole = zipage::split_tool_calls(answer);
    for (int trial = 0; trial < 200; ++trial) {
      zipage::tool_call_stream s;
      std::string content;
      for (std::size_t at = 0; at < answer.size();) {
        const std::size_t n = std::min<std::size_t>(answer.size() - at, 1 + rng() % 5);
        content += s.push(std::string_view(answer).substr(at, n));
        at += n;
      }
      auto end = s.finish();
      content += end.content;
      CAPTURE(answer);
      CHECK(content == whole.content.value_or(""));
      REQUIRE(end.calls.size() == whole.calls.size());
      for (std::size_t k = 0; k < end.calls.size(); ++k) {
        CHECK(end.calls[k].name == whole.calls[k].name);
        CHECK(end.calls[k].arguments == whole.calls[k].arguments);
      }
    }
  }
  // Text before a call goes out at once; a possible tag start waits.
  zipage::tool_call_stream s;
  CHECK(s.push("Sure. <tool") == "Sure. ");
  CHECK(s.push("_call>{\"name\": \"f\"}").empty());
  const auto end = s.finish();
  CHECK(end.content.empty());
  CHECK(end.calls.size() == 1);
}
