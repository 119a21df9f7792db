// The tool-call parsers (include/zipage/tokenizer/tool_call_parser.hpp): calls read out of an answer as vLLM's
// --tool-call-parser hermes, llama3_json, mistral and pythonic read them, and the streaming side equal to the
// whole-answer split however the answer is cut.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <optional>
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

namespace {

using zipage::tool_call_format;

struct want_call {
  std::string name, arguments;
};

// The split of a finished answer: content (nullopt: null) and calls, each checked.
void check_split(const std::string& answer, tool_call_format f, const std::optional<std::string>& content,
                 const std::vector<want_call>& calls) {
  CAPTURE(answer);
  const auto s = zipage::split_tool_calls(answer, f);
  CHECK(s.content == content);
  REQUIRE(s.calls.size() == calls.size());
  for (std::size_t k = 0; k < calls.size(); ++k) {
    CHECK(s.calls[k].name == calls[k].name);
    CHECK(s.calls[k].arguments == calls[k].arguments);
  }
}

// An answer that is not calls in format f: all of it is content, no call.
void check_content(const std::string& answer, tool_call_format f) { check_split(answer, f, answer, {}); }

// Streams the answer cut at the given positions; the content pieces and the ending must add up to the split.
void check_stream_cuts(const std::string& answer, tool_call_format f, const std::vector<std::size_t>& cuts) {
  const auto whole = zipage::split_tool_calls(answer, f);
  zipage::tool_call_stream s(f);
  std::string content;
  std::size_t at = 0;
  for (std::size_t cut : cuts) {
    content += s.push(std::string_view(answer).substr(at, cut - at));
    at = cut;
  }
  content += s.push(std::string_view(answer).substr(at));
  const auto end = s.finish();
  content += end.content;
  CHECK(content == whole.content.value_or(""));
  REQUIRE(end.calls.size() == whole.calls.size());
  for (std::size_t k = 0; k < end.calls.size(); ++k) {
    CHECK(end.calls[k].name == whole.calls[k].name);
    CHECK(end.calls[k].arguments == whole.calls[k].arguments);
  }
}

// Every single cut position, every pair of cut positions (short answers), one byte at a time, and random cuts.
void check_stream(const std::string& answer, tool_call_format f) {
  CAPTURE(answer);
  for (std::size_t i = 0; i <= answer.size(); ++i) {
    check_stream_cuts(answer, f, {i});
    if (answer.size() <= 40)
      for (std::size_t j = i; j <= answer.size(); ++j) check_stream_cuts(answer, f, {i, j});
  }
  std::vector<std::size_t> bytes;
  for (std::size_t i = 1; i < answer.size(); ++i) bytes.push_back(i);
  check_stream_cuts(answer, f, bytes);
  std::mt19937 rng(static_cast<unsigned>(answer.size()));
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<std::size_t> cuts;
    for (std::size_t at = 1 + rng() % 6; at < answer.size(); at += 1 + rng() % 6) cuts.push_back(at);
    check_stream_cuts(answer, f, cuts);
  }
}

}  // namespace

TEST_CASE("tool-call parsers: the names --tool-call-parser takes") {
  CHECK(zipage::tool_call_format_named("hermes") == tool_call_format::hermes);
  CHECK(zipage::tool_call_format_named("llama3_json") == tool_call_format::llama3_json);
  CHECK(zipage::tool_call_format_named("llama4_json") == tool_call_format::llama3_json);
  CHECK(zipage::tool_call_format_named("mistral") == tool_call_format::mistral);
  CHECK(zipage::tool_call_format_named("pythonic") == tool_call_format::pythonic);
  CHECK_FALSE(zipage::tool_call_format_named("Hermes").has_value());
  CHECK_FALSE(zipage::tool_call_format_named("").has_value());
  CHECK_FALSE(zipage::tool_call_format_named("llama3").has_value());
  CHECK(zipage::tool_call_format_names() == "hermes, llama3_json, llama4_json, mistral, pythonic");
}

TEST_CASE("tool calls: llama3_json") {
  const auto f = tool_call_format::llama3_json;
  // Llama 3.1's form: "parameters"; <|python_tag|> before the call is optional; blanks around are dropped.
  check_split(R"({"name": "get_weather", "parameters": {"city": "Paris", "days": 3}})", f, std::nullopt,
              {{"get_weather", R"({"city":"Paris","days":3})"}});
  check_split("<|python_tag|>{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n", f, std::nullopt, {{"f", R"({"x":1})"}});
  check_split("\n <|python_tag|> {\"name\": \"f\", \"parameters\": {}}", f, std::nullopt, {{"f", "{}"}});
  // Several calls separated by ';'; nested arguments; braces and quotes inside strings; unicode as written
  // and as \u escapes.
  check_split(R"({"name": "a", "parameters": {"q": {"deep": [1, {"k": "}{"}]}}}; {"name": "b", "parameters": {"s": "Zürich \"x\""}};{"name": "c", "parameters": {"e": "\u00e9\ud83d\ude00"}})",
              f, std::nullopt,
              {{"a", R"({"q":{"deep":[1,{"k":"}{"}]}})"}, {"b", R"({"s":"Zürich \"x\""})"}, {"c", "{\"e\":\"é😀\"}"}});
  // Arguments given as a JSON string pass through (as hermes reads them).
  check_split(R"({"name": "f", "arguments": "{\"x\": 1}"})", f, std::nullopt, {{"f", R"({"x": 1})"}});
  // Not calls: plain text, JSON that is no call (no name, no arguments: a JSON answer the user asked for), text
  // around the JSON, bad separators, broken JSON, a tag alone, and one bad call among good ones.
  for (const std::string answer :
       {"The weather is fine.", "", "   ", "{\"name\": \"Bob\", \"age\": 3}", "{\"parameters\": {}}",
        "{\"name\": 3, \"parameters\": {}}", "{\"name\": \"f\", \"parameters\": [1]}",
        "Sure: {\"name\": \"f\", \"parameters\": {}}", "{\"name\": \"f\", \"parameters\": {}} done",
        "{\"name\": \"f\", \"parameters\": {}};", "{\"name\": \"f\", \"parameters\": {}} {\"name\": \"g\", \"parameters\": {}}",
        "{\"name\": \"f\", \"parameters\": {}", "{\"name\": \"f\", \"parameters\": {x}}", "<|python_tag|>",
        "<|python_tag|>print(1)", "{\"name\": \"f\", \"parameters\": {}}; {\"oops\": 1}", "[{\"name\": \"f\", \"parameters\": {}}]"}) {
    check_content(answer, f);
  }
}

TEST_CASE("tool calls: mistral") {
  const auto f = tool_call_format::mistral;
  // Before tokenizer v11: one JSON array; the text before [TOOL_CALLS] is content (null when empty).
  check_split(R"([TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}])", f, std::nullopt,
              {{"get_weather", R"({"city":"Paris"})"}});
  check_split("Let me look.[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"l\": [1, {\"m\": null}]}}, "
              "{\"name\": \"b\", \"arguments\": {\"s\": \"日本 ]}\"}}]\n",
              f, "Let me look.", {{"a", R"({"l":[1,{"m":null}]})"}, {"b", R"({"s":"日本 ]}"})"}});
  // v11+: [TOOL_CALLS]name{...} per call, [ARGS] between name and arguments as the tokens spell it.
  check_split(R"([TOOL_CALLS]add{"a": 3.5, "b": 4})", f, std::nullopt, {{"add", R"({"a":3.5,"b":4})"}});
  check_split("Both: [TOOL_CALLS]get_weather[ARGS]{\"city\": \"Köln\"}[TOOL_CALLS]get_time{\"tz\": {\"name\": \"CET\"}}", f,
              "Both: ", {{"get_weather", R"({"city":"Köln"})"}, {"get_time", R"({"tz":{"name":"CET"}})"}});
  // Not calls: no tag, a broken array, items that are no calls, an empty array, text after the array, a second
  // tag after an array, v11 calls without a name, with arguments that are no object or with text after them.
  for (const std::string answer :
       {"No tools needed.", "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}", "[TOOL_CALLS] [{\"name\": \"f\"}]",
        "[TOOL_CALLS] [1, 2]", "[TOOL_CALLS] []", "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}] and more",
        "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}][TOOL_CALLS] [{\"name\": \"g\", \"arguments\": {}}]",
        "[TOOL_CALLS]{\"a\": 1}", "[TOOL_CALLS]f{\"a\": }", "[TOOL_CALLS]f[ARGS]{\"a\": 1} trailing",
        "[TOOL_CALLS]f", "[TOOL_CALLS]", "x [TOOL_CALLS]my tool{\"a\": 1}"}) {
    check_content(answer, f);
  }
  // Call ids: nine letters or digits, as Mistral's tokenizers require, the same for the same response and call.
  const std::string id = zipage::mistral_tool_call_id("chatcmpl-abc", 0);
  CHECK(id.size() == 9);
  CHECK(std::all_of(id.begin(), id.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }));
  CHECK(id == zipage::mistral_tool_call_id("chatcmpl-abc", 0));
  CHECK(id != zipage::mistral_tool_call_id("chatcmpl-abc", 1));
  CHECK(id != zipage::mistral_tool_call_id("chatcmpl-abd", 0));
}

TEST_CASE("tool calls: pythonic") {
  const auto f = tool_call_format::pythonic;
  check_split(R"([get_weather(city="Paris", unit="c")])", f, std::nullopt, {{"get_weather", R"({"city":"Paris","unit":"c"})"}});
  check_split("[f(), g(x=1)]\n", f, std::nullopt, {{"f", "{}"}, {"g", R"({"x":1})"}});
  // Every literal: strings with escapes and prefixes, numbers, the constants (Python's and JSON's spellings),
  // lists and dicts, nested; blanks and newlines anywhere inside the brackets; trailing commas.
  check_split(R"PY([search(q='it\'s "x"\n\t\u00e9\x41\101', raw=r'\d+\'', tri='''a
'b"''', dq="Zürich 😀", u=u'x', i=42, neg=-7, big=1_000_000, hx=0x1F, oc=0o17, bn=0b101, fl=2.5, half=.5,
    sci=1e-3, ex=-2.5E+2, t=True, fa=False, n=None, jt=true, jn=null,
  l=[1, [2, 'x'], {}], d={'a': {'b': [None]}, 1: 'one', None: 'n'}, e=[], tr=[1, 2,],)])PY",
              f, std::nullopt,
              {{"search", R"({"q":"it's \"x\"\n\téAA","raw":"\\d+\\'","tri":"a\n'b\"","dq":"Zürich 😀","u":"x","i":42,)"
                          R"("neg":-7,"big":1000000,"hx":31,"oc":15,"bn":5,"fl":2.5,"half":0.5,"sci":0.001,"ex":-250.0,)"
                          R"("t":true,"fa":false,"n":null,"jt":true,"jn":null,"l":[1,[2,"x"],{}],)"
                          R"("d":{"a":{"b":[null]},"1":"one","null":"n"},"e":[],"tr":[1,2]})"}});
  // A repeated dict key keeps its first place and its last value, as a Python dict.
  check_split("[f(d={'a': 1, 'b': 2, 'a': 3})]", f, std::nullopt, {{"f", R"({"d":{"a":3,"b":2}})"}});
  // Not calls: text, the list not at the start or followed by text, an
  // empty list, a trailing comma in the list, positional arguments, names and expressions as values, tuples,
  // bytes, f-strings, complex numbers, 01, a float too large, bad underscores, a repeated keyword, a method
  // call, an unterminated string, a newline in a one-line string, a list, float or bool as a dict key, a bad \x
  // escape, unclosed or unseparated calls, bare dots and signs, a list of no calls.
  for (const std::string answer :
       {"Paris is sunny.", "", " [f(a=1)]", "Sure: [f(a=1)]", "[f(a=1)] done", "[]", "[f(a=1), ]", "[f(1)]",
        "[f(a=b)]", "[f(a=1+2)]", "[f(a=(1, 2))]", "[f(a=b'x')]", "[f(a=f'x')]", "[f(a=1j)]", "[f(a=01)]",
        "[f(a=1e999)]", "[f(a=1__0)]", "[f(a=1_)]", "[f(a=1, a=2)]", "[obj.method(a=1)]", "[_f(a=1)]",
        "[f(a='x)]", "[f(a='x\ny')]", "[f(a={[1]: 2})]", "[f(a={1.5: 2})]", "[f(a={True: 2})]", "[f(a='\\x4')]", "[f(a=1)",
        "[f(a=1) g(b=2)]", "[f a=1]", "[f(a=.)]", "[f(a=-)]", "[f(a=...)]", "[1, 2]", "['x']"}) {
    check_content(answer, f);
  }
  // Nesting deeper than any arguments: content, without recursing that deep.
  check_content("[f(a=" + std::string(100000, '[') + std::string(100000, ']') + ")]", f);
  check_content("[f(a=" + std::string(100000, '{') + ")]", f);
}

TEST_CASE("tool calls: every parser's stream gives the finished answer's split wherever it is cut") {
  const std::vector<std::pair<tool_call_format, std::vector<std::string>>> cases = {
      {tool_call_format::hermes,
       {"Let me check.\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": \"é\"}}\n</tool_call>", "a <tool_cal b",
        "<tool_call>x</tool_call>"}},
      {tool_call_format::llama3_json,
       {"{\"name\": \"f\", \"parameters\": {\"x\": \"ü\"}}; {\"name\": \"g\", \"parameters\": {}}",
        "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}", "  <|python_ta", "<|python_tag|>nope", " <b>hi</b>",
        "Plain answer.", "{\"name\": \"Bob\"}", "\n\n", ""}},
      {tool_call_format::mistral,
       {"Sure.[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": [1]}}]", "[TOOL_CALLS]f[ARGS]{\"a\": 1}[TOOL_CALLS]g{}",
        "[TOOL_CALLS] [broken", "x [TOOL_CALL y [TOOL", "[TOOL_CALLS", "no calls at all", ""}},
      {tool_call_format::pythonic,
       {"[get_weather(city='Paris'), f(x=[1, {'a': None}])]", "[f(1)]", "[", "Text first [f(a=1)]", "[f(a='ü')] tail",
        "", "a"}},
  };
  for (const auto& c : cases) {  // no structured binding: CAPTURE's lambda may not capture one (clang 14)
    const auto f = c.first;
    CAPTURE(static_cast<int>(f));
    for (const auto& answer : c.second) check_stream(answer, f);
  }
}

TEST_CASE("tool calls: what a stream lets out before the end") {
  // llama3_json and pythonic: an answer that does not start as calls do streams as it comes; one that does
  // is held whole.
  zipage::tool_call_stream llama(tool_call_format::llama3_json);
  CHECK(llama.push("  ").empty());
  CHECK(llama.push("Hi {") == "  Hi {");
  CHECK(llama.push("x}") == "x}");
  zipage::tool_call_stream call(tool_call_format::llama3_json);
  CHECK(call.push("<|python").empty());
  CHECK(call.push("_tag|>{\"name\": \"f\", \"parameters\": {}}").empty());
  auto end = call.finish();
  CHECK(end.content.empty());
  REQUIRE(end.calls.size() == 1);
  CHECK(end.calls[0].name == "f");
  zipage::tool_call_stream py(tool_call_format::pythonic);
  CHECK(py.push("[f(").empty());
  CHECK(py.push("a=1)] no").empty());
  end = py.finish();
  CHECK(end.content == "[f(a=1)] no");
  CHECK(end.calls.empty());
  zipage::tool_call_stream text(tool_call_format::pythonic);
  CHECK(text.push("Sure") == "Sure");
  // mistral: content before [TOOL_CALLS] goes out at once; a possible tag start waits.
  zipage::tool_call_stream m(tool_call_format::mistral);
  CHECK(m.push("One moment [TOOL") == "One moment ");
  CHECK(m.push("_CALLS]f{\"a\": 1}").empty());
  end = m.finish();
  CHECK(end.content.empty());
  REQUIRE(end.calls.size() == 1);
  CHECK(end.calls[0].arguments == R"({"a":1})");
}

TEST_CASE("tool calls: random answers built from the formats' pieces split alike streamed or whole") {
  // Pieces of every format, so that near-calls of all kinds come up; each answer is streamed with random cuts.
  const std::vector<std::string> pieces = {
      "[", "]", "{", "}", "(", ")", "'", "\"", "\\", "=", ",", ":", ";", " ", "\n", "f", "get_x", "a=1", "\"name\"",
      "\"arguments\"", "\"parameters\"", "None", "-2.5", "0x1F", "é", "<tool_call>", "</tool_call>", "[TOOL_CALLS]",
      "[ARGS]", "<|python_tag|>", "{\"name\": \"f\", \"parameters\": {}}", "f(a='x')", "{\"name\": \"g\", \"arguments\": {}}"};
  std::mt19937 rng(7);
  for (const auto f : {tool_call_format::hermes, tool_call_format::llama3_json, tool_call_format::mistral, tool_call_format::pythonic}) {
    CAPTURE(static_cast<int>(f));
    for (int n = 0; n < 400; ++n) {
      std::string answer;
      for (std::size_t k = rng() % 12; k > 0; --k) answer += pieces[rng() % pieces.size()];
      CAPTURE(answer);
      std::vector<std::size_t> cuts;
      for (std::size_t at = 1 + rng() % 4; at < answer.size(); at += 1 + rng() % 4) cuts.push_back(at);
      check_stream_cuts(answer, f, cuts);
      const auto s = zipage::split_tool_calls(answer, f);
      if (s.calls.empty()) CHECK(s.content == answer);  // no call: the answer is all content, unchanged
    }
  }
}
