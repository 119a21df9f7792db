// zipage's Jinja interpreter (include/zipage/tokenizer/jinja.hpp) against Python's jinja2 as transformers
// renders chat templates: tests/data/jinja/cases.jsonl holds templates, contexts and jinja2's text or error
// (tests/chat/make_jinja_cases.py writes it), and the checks below pin what a chat template must not be able
// to do to the process (run away, nest without bound) and how errors name their line.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>
#include <string>
#include <vector>

#include "zipage/gguf/writer.hpp"
#include "zipage/tokenizer/bpe_tokenizer.hpp"
#include "zipage/tokenizer/jinja.hpp"

namespace {
namespace jinja = zipage::jinja;

std::vector<std::pair<std::string, jinja::value>> variables_of(const nlohmann::ordered_json& context) {
  std::vector<std::pair<std::string, jinja::value>> vars;
  for (auto it = context.begin(); it != context.end(); ++it) vars.emplace_back(it.key(), jinja::value::from_json(it.value()));
  return vars;
}

jinja::render_options fixed_clock() {  // make_jinja_cases.py's strftime_now: 2024-07-26 09:05:03
  std::tm tm{};
  tm.tm_year = 124;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  tm.tm_hour = 9;
  tm.tm_min = 5;
  tm.tm_sec = 3;
  tm.tm_wday = 5;
  tm.tm_yday = 207;
  return {.now = tm};
}

std::string render(std::string_view source, const nlohmann::ordered_json& context = nlohmann::ordered_json::object()) {
  return jinja::template_::parse(source).render(variables_of(context), fixed_clock());
}

std::string error_of(std::string_view source, const nlohmann::ordered_json& context = nlohmann::ordered_json::object()) {
  try {
    (void)render(source, context);
  } catch (const zipage::error& e) {
    return e.what();
  }
  return "(no error)";
}
}  // namespace

TEST_CASE("jinja: every case renders as jinja2 renders it, or fails where jinja2 fails") {
  std::ifstream in(std::string(ZIPAGE_TEST_DATA_DIR) + "/jinja/cases.jsonl");
  REQUIRE(in.good());
  int cases = 0, errors = 0;
  for (std::string line; std::getline(in, line);) {
    const auto c = nlohmann::ordered_json::parse(line);
    const std::string source = c["template"];
    const std::string where = "template: " + source;
    CAPTURE(where);
    ++cases;
    if (c.contains("error")) {
      ++errors;
      const std::string expected = c["error"];
      CAPTURE(expected);
      CHECK_THROWS_AS(render(source, c["context"]), zipage::error);
    } else {
      std::string got;
      CHECK_NOTHROW(got = render(source, c["context"]));
      CHECK(got == c["text"].get<std::string>());
    }
  }
  CHECK(cases >= 80);
  CHECK(errors >= 20);
}

TEST_CASE("jinja: errors name the line and what is wrong") {
  CHECK(error_of("a\n{{ x|no_such_filter }}") == "chat template line 2: no filter named 'no_such_filter'");
  CHECK(error_of("\n\n{% if true %}") == "chat template line 3: the template ends before {% endif %}");
  CHECK(error_of("{% for x in y %}\n{% if x %}{% endfor %}") ==
        "chat template line 2: unexpected '{% endfor %}': the open block ends with {% endif %}");
  CHECK(error_of("a {% endif %}") == "chat template line 1: unexpected '{% endif %}': no block is open");
  CHECK(error_of("{{ raise_exception('Only user and assistant roles are supported') }}") ==
        "chat template: Only user and assistant roles are supported");
  CHECK(error_of("{{ missing.attr }}") == "chat template line 1: 'missing' is undefined");
  CHECK(error_of("{{ l.append(1) }}", {{"l", nlohmann::ordered_json::array()}}) ==
        "chat template line 1: access to attribute 'append' of 'list' object is unsafe.");
  CHECK(error_of("{% do x %}").find("unknown or unsupported statement '{% do %}'") != std::string::npos);
  CHECK(error_of("{{ 'unclosed }}").find("a string literal is not closed") != std::string::npos);
  CHECK(error_of("{{ 99999999999999999999 }}").find("out of range") != std::string::npos);
}

TEST_CASE("jinja: a runaway template ends in an error, not a hang or a crash") {
  // Exponential macro recursion, a string doubled in a loop, deep nesting, 64-bit overflow.
  CHECK(error_of("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}")
            .find("steps") != std::string::npos);
  CHECK(error_of("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}").find("recurses more than 64 levels") !=
        std::string::npos);
  CHECK(error_of("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}")
            .find("MiB") != std::string::npos);
  CHECK(error_of("{{ 'x' * 100000000000 }}").find("MiB") != std::string::npos);
  CHECK(error_of("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}").find("nested too deeply") !=
        std::string::npos);
  CHECK(error_of("{{ " + std::string(300, '-') + "1 }}").find("nested too deeply") != std::string::npos);
  std::string chain = "{{ 1";
  for (int i = 0; i < 300; ++i) chain += " + 1";
  CHECK(error_of(chain + " }}").find("nested too deeply") != std::string::npos);
  std::string blocks;
  for (int i = 0; i < 300; ++i) blocks += "{% if true %}";
  CHECK(error_of(blocks).find("nested too deeply") != std::string::npos);
  CHECK(error_of("{{ 9223372036854775807 + 1 }}").find("integer overflow") != std::string::npos);
  CHECK(error_of("{{ 2 ** 64 }}").find("integer overflow") != std::string::npos);
  CHECK(render("{{ 2 ** 62 }} {{ -9223372036854775807 - 1 }}") == "4611686018427387904 -9223372036854775808");
  CHECK(error_of("{{ range(10000000)|length }}").find("range() is too large") != std::string::npos);
  CHECK(render("{{ [1, 2, 3][::9223372036854775807] }} {{ 'abc'[::-9223372036854775807] }}") == "[1] c");
}

TEST_CASE("jinja: a parsed template renders again with other variables, and from several threads") {
  const auto t = jinja::template_::parse("{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}");
  auto vars = [](const char* content) {
    return variables_of(nlohmann::ordered_json{{"messages", {{{"role", "user"}, {"content", content}}}}});
  };
  CHECK(t.render(vars("a")) == "user:a;");
  CHECK(t.render(vars("b")) == "user:b;");
  std::vector<std::string> out(4);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < out.size(); ++i)
    threads.emplace_back([&, i] { out[i] = t.render(vars(std::to_string(i).c_str())); });
  for (auto& th : threads) th.join();
  for (std::size_t i = 0; i < out.size(); ++i) CHECK(out[i] == "user:" + std::to_string(i) + ";");
}

TEST_CASE("jinja: a tokenizer renders its own template with tools, tool calls and its special tokens") {
  const std::filesystem::path qwen3 = std::string(ZIPAGE_TEST_DATA_DIR) + "/qwen3";
  const auto t = zipage::bpe_tokenizer::from_dir(qwen3);
  CHECK(t.chat_template_name() == "jinja (qwen3)");
  const auto messages = nlohmann::ordered_json::parse(R"([
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "22C"}])");
  zipage::chat_options o;
  o.tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  const std::string text = t.apply_chat_template_json(messages, o);
  // What transformers renders for this conversation with Qwen3's template (jinja2 3.1, the harness's env).
  CHECK(text ==
        "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
        "\"properties\": {\"city\": {\"type\": \"string\"}}}}}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
        "XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n22C\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
  // template_kwargs reach the template (Qwen3's enable_thinking).
  o.tools = nullptr;
  o.template_kwargs = {{"enable_thinking", false}};
  const auto one = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  CHECK(t.apply_chat_template_json(one, o) ==
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // A built-in format refuses what it cannot render instead of dropping it.
  auto builtin = t;
  builtin.use_builtin_chat_format(zipage::chat_format::qwen3);
  CHECK_THROWS_WITH((void)builtin.apply_chat_template_json(messages), doctest::Contains("not 'tool_calls'"));
  zipage::chat_options with_tools;
  with_tools.tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  CHECK_THROWS_WITH((void)builtin.apply_chat_template_json(one, with_tools), doctest::Contains("tools need the checkpoint's own"));
}

TEST_CASE("jinja: named templates: tool_use when tools are given, default otherwise (transformers' choice)") {
  const std::string dir = std::string(ZIPAGE_TEST_DATA_DIR) + "/qwen3";
  const std::string tokenizer_json = zipage::json::read_text_file(dir + "/tokenizer.json", "tokenizer");
  const auto config = nlohmann::json{{"chat_template", {{{"name", "default"}, {"template", "D:{{ messages[0].content }}"}},
                                                        {{"name", "tool_use"}, {"template", "T:{{ tools|length }}"}},
                                                        {{"name", "rag"}, {"template", "R"}}}}};
  const auto t = zipage::bpe_tokenizer::from_json(tokenizer_json, config.dump());
  const std::vector<zipage::chat_message> hi = {{"user", "hi"}};
  CHECK(t.apply_chat_template(hi) == "D:hi");
  zipage::chat_options o;
  o.tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  CHECK(t.apply_chat_template(hi, o) == "T:1");
  // A template given by the user (--chat-template FILE) replaces both.
  auto replaced = t;
  replaced.set_chat_template("U", "test");
  CHECK(replaced.apply_chat_template(hi, o) == "U");
  // Without a 'default' entry (transformers refuses such a chat too): the chat's error names what the list has;
  // tools still pick tool_use. An entry without a string template is refused at load, by index.
  const auto no_default = nlohmann::json{{"chat_template", {{{"name", "tool_use"}, {"template", "T:{{ tools|length }}"}},
                                                            {{"name", "rag"}, {"template", "R"}}}}};
  const auto nd = zipage::bpe_tokenizer::from_json(tokenizer_json, no_default.dump());
  CHECK(nd.has_chat_template());
  CHECK_THROWS_WITH((void)nd.apply_chat_template(hi),
                    doctest::Contains("names no 'default' template (it has 'tool_use', 'rag')"));
  CHECK(nd.apply_chat_template(hi, o) == "T:1");
  const auto broken = nlohmann::json{{"chat_template", {{{"name", "default"}, {"template", "D"}}, {{"name", "x"}}}}};
  CHECK_THROWS_WITH((void)zipage::bpe_tokenizer::from_json(tokenizer_json, broken.dump()),
                    doctest::Contains("chat_template[1] must be a {name, template} object with a string template"));
}

TEST_CASE("jinja: chat_template.jinja beside the tokenizer replaces the config's template; a broken one is reported") {
  const auto dir = std::filesystem::temp_directory_path() / "zipage_test_jinja_dir";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::filesystem::path qwen3 = std::string(ZIPAGE_TEST_DATA_DIR) + "/qwen3";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) std::filesystem::copy_file(qwen3 / f, dir / f);
  const std::vector<zipage::chat_message> hi = {{"user", "hi"}};
  {
    std::ofstream(dir / "chat_template.jinja") << "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}";
    const auto t = zipage::bpe_tokenizer::from_dir(dir);
    CHECK(t.chat_template_name() == "jinja");
    CHECK(t.apply_chat_template(hi) == "[user] hi\n");
  }
  {
    std::ofstream(dir / "chat_template.jinja") << "{% for m in messages %}";
    const auto t = zipage::bpe_tokenizer::from_dir(dir);  // loads: only chat needs the template
    CHECK(t.has_chat_template());
    CHECK(t.chat_template_error().find("chat_template.jinja") != std::string::npos);
    CHECK_THROWS_WITH((void)t.apply_chat_template(hi), doctest::Contains("the chat template cannot be used"));
    CHECK(t.encode("hi", false).size() == 1);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("jinja: additional_chat_templates/<name>.jinja are named templates, as transformers loads them") {
  const auto dir = std::filesystem::temp_directory_path() / "zipage_test_jinja_named_dir";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "additional_chat_templates");
  const std::filesystem::path qwen3 = std::string(ZIPAGE_TEST_DATA_DIR) + "/qwen3";
  std::filesystem::copy_file(qwen3 / "tokenizer.json", dir / "tokenizer.json");
  const std::vector<zipage::chat_message> hi = {{"user", "hi"}};
  zipage::chat_options with_tools;
  with_tools.tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  auto write = [&](const std::filesystem::path& file, const char* text) { std::ofstream(dir / file) << text; };
  // chat_template.jinja is the default; tool_use.jinja renders when tools are given; other names load unused.
  write("chat_template.jinja", "D:{{ messages[0].content }}");
  write("additional_chat_templates/tool_use.jinja", "T:{{ tools|length }}");
  write("additional_chat_templates/rag.jinja", "R");
  write("additional_chat_templates/notes.txt", "not a template");
  {
    const auto t = zipage::bpe_tokenizer::from_dir(dir);
    CHECK(t.apply_chat_template(hi) == "D:hi");
    CHECK(t.apply_chat_template(hi, with_tools) == "T:1");  // was D:hi: the folder was not read
  }
  // default.jinja in the folder replaces chat_template.jinja (transformers' dict assignment order).
  write("additional_chat_templates/default.jinja", "F:{{ messages[0].content }}");
  CHECK(zipage::bpe_tokenizer::from_dir(dir).apply_chat_template(hi) == "F:hi");
  // Named templates and no default: a chat without tools names the folder and what it has; tools still render.
  std::filesystem::remove(dir / "chat_template.jinja");
  std::filesystem::remove(dir / "additional_chat_templates/default.jinja");
  {
    const auto t = zipage::bpe_tokenizer::from_dir(dir);
    CHECK(t.has_chat_template());
    CHECK_THROWS_WITH((void)t.apply_chat_template(hi),
                      doctest::Contains("additional_chat_templates has no 'default' template and there is no other"));
    CHECK_THROWS_WITH((void)t.apply_chat_template(hi), doctest::Contains("it has 'rag', 'tool_use'"));
    CHECK(t.apply_chat_template(hi, with_tools) == "T:1");
  }
  // A broken tool_use template is reported when tools ask for it, naming the file; the default still renders.
  write("chat_template.jinja", "D");
  write("additional_chat_templates/tool_use.jinja", "{% for m in messages %}");
  {
    const auto t = zipage::bpe_tokenizer::from_dir(dir);
    CHECK(t.apply_chat_template(hi) == "D");
    CHECK_THROWS_WITH((void)t.apply_chat_template(hi, with_tools), doctest::Contains("tool_use.jinja"));
  }
  // A folder named x.jinja is not a template (transformers lists files only); a file that cannot be read is an
  // error naming it, at load (checked where permissions bite: not as root).
  std::filesystem::create_directories(dir / "additional_chat_templates/folder.jinja");
  CHECK(zipage::bpe_tokenizer::from_dir(dir).apply_chat_template(hi) == "D");
  const auto rag = dir / "additional_chat_templates/rag.jinja";
  std::filesystem::permissions(rag, std::filesystem::perms::none);
  if (!std::ifstream(rag).good())
    CHECK_THROWS_WITH((void)zipage::bpe_tokenizer::from_dir(dir),
                      doctest::Contains(("cannot open chat template '" + rag.string() + "'").c_str()));
  std::filesystem::remove_all(dir);
}

TEST_CASE("jinja: a GGUF file's tokenizer.chat_template.<name> are named templates, as llama.cpp writes them") {
  // A byte-level BPE vocabulary (the 256 byte tokens and <|im_end|>), as llama.cpp's converter writes one, with the
  // converter's named templates: the default in tokenizer.chat_template, the others in tokenizer.chat_template.<name>
  // and their names in tokenizer.chat_templates.
  auto vocabulary = [] {
    zipage::gguf::writer w;
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) {
      tokens.emplace_back();
      zipage::unicode::append_utf8(tokens.back(), zipage::detail::byte_to_unicode()[static_cast<std::size_t>(b)]);
    }
    tokens.emplace_back("<|im_end|>");
    std::vector<std::int32_t> types(tokens.size(), 1);
    types.back() = 3;
    w.set("general.architecture", "qwen2");
    w.set("tokenizer.ggml.model", "gpt2");
    w.set("tokenizer.ggml.pre", "qwen2");
    w.set("tokenizer.ggml.tokens", std::move(tokens));
    w.set("tokenizer.ggml.token_type", types);
    w.set("tokenizer.ggml.merges", std::vector<std::string>{});
    w.set("tokenizer.ggml.eos_token_id", std::uint32_t{256});
    return w;
  };
  auto load = [](zipage::gguf::writer& w) {
    return zipage::bpe_tokenizer::from_gguf(zipage::gguf::file::from_bytes(w.bytes(), "named.gguf"));
  };
  const std::vector<zipage::chat_message> hi = {{"user", "hi"}};
  zipage::chat_options with_tools;
  with_tools.tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  {
    auto w = vocabulary();
    w.set("tokenizer.chat_template", "D:{{ messages[0].content }}{{ eos_token }}");
    w.set("tokenizer.chat_template.tool_use", "T:{{ tools|length }}:{{ messages[0].content }}");
    w.set("tokenizer.chat_template.rag", "R");
    w.set("tokenizer.chat_templates", std::vector<std::string>{"tool_use", "rag"});
    const auto t = load(w);
    CHECK(t.apply_chat_template(hi) == "D:hi<|im_end|>");
    CHECK(t.apply_chat_template(hi, with_tools) == "T:1:hi");  // was D:hi<|im_end|>: the named keys were not read
    const auto one = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
    CHECK(t.apply_chat_template_json(one) == "D:hi<|im_end|>");
    CHECK(t.apply_chat_template_json(one, with_tools) == "T:1:hi");
    // A template given by the user (--chat-template FILE) replaces both.
    auto replaced = t;
    replaced.set_chat_template("U", "test");
    CHECK(replaced.apply_chat_template(hi, with_tools) == "U");
  }
  {
    // Only the default: tools render with it, as before.
    auto w = vocabulary();
    w.set("tokenizer.chat_template", "D:{{ messages[0].content }}");
    CHECK(load(w).apply_chat_template(hi, with_tools) == "D:hi");
  }
  {
    // Named templates and no tokenizer.chat_template: a chat without tools names the file and what it has; tools
    // still render. A tokenizer.chat_template.default stands in for the missing default.
    auto w = vocabulary();
    w.set("tokenizer.chat_template.tool_use", "T:{{ tools|length }}");
    w.set("tokenizer.chat_template.rag", "R");
    const auto t = load(w);
    CHECK(t.has_chat_template());
    CHECK_THROWS_WITH((void)t.apply_chat_template(hi),
                      doctest::Contains("named.gguf: no tokenizer.chat_template (the default) beside its named "
                                        "templates 'tool_use', 'rag'"));
    CHECK(t.apply_chat_template(hi, with_tools) == "T:1");
    w.set("tokenizer.chat_template.default", "F:{{ messages[0].content }}");
    CHECK(load(w).apply_chat_template(hi) == "F:hi");
    w.set("tokenizer.chat_template", "D");
    CHECK(load(w).apply_chat_template(hi) == "D");  // llama.cpp's default wins over the named one
  }
  {
    // A broken tool_use template is reported when tools ask for it, naming the key; one that is not a string is
    // refused at load, by name.
    auto w = vocabulary();
    w.set("tokenizer.chat_template", "D");
    w.set("tokenizer.chat_template.tool_use", "{% for m in messages %}");
    const auto t = load(w);
    CHECK(t.apply_chat_template(hi) == "D");
    CHECK_THROWS_WITH((void)t.apply_chat_template(hi, with_tools),
                      doctest::Contains("named.gguf: tokenizer.chat_template.tool_use"));
    w.set("tokenizer.chat_template.tool_use", std::uint32_t{7});
    CHECK_THROWS_WITH((void)load(w), doctest::Contains("tokenizer.chat_template.tool_use"));
  }
}

TEST_CASE("jinja: ill-formed UTF-8 is one code point per maximal ill-formed subpart, and U+FFFD in ASCII-only JSON") {
  // Strings from a GGUF file or a client may hold ill-formed bytes; they must not swallow their neighbours.
  const nlohmann::ordered_json ctx = {{"bad", std::string("a\xC3" "b")},
                                      {"cut", std::string("x\xE2\x82")},
                                      {"emoji", std::string("x\xF0\x9F\x98\x80y")}};
  CHECK(render("{{ bad|length }} {{ cut|length }} {{ emoji|length }}", ctx) == "3 2 3");
  CHECK(render("{{ bad[::-1] }}", ctx) == std::string("b\xC3" "a"));
  CHECK(render("{{ bad[1] }}", ctx) == std::string("\xC3"));
  CHECK(render("{{ bad|tojson(ensure_ascii=true) }}", ctx) == "\"a\\ufffdb\"");
  CHECK(render("{{ cut|tojson(ensure_ascii=true) }}", ctx) == "\"x\\ufffd\"");
  CHECK(render("{{ emoji|tojson(ensure_ascii=true) }}", ctx) == "\"x\\ud83d\\ude00y\"");
  CHECK(render("{{ 'x\xE2\x82\xAC'|tojson(ensure_ascii=true) }}") == "\"x\\u20ac\"");
}

TEST_CASE("jinja: str methods take Python's maxsplit with whitespace and the start / end of find, count, startswith") {
  // jinja2's output for each (Python 3 str methods). The whitespace rsplit used to split from the left and drop
  // the rest's trailing space, and find & co ignored start / end: silently other prompts.
  CHECK(render(R"({{ " a b c ".rsplit(maxsplit=1) }}|{{ "a  b c ".rsplit(None, 1) }}|{{ "a b c ".split(maxsplit=1) }})"
               R"(|{{ "a b  ".split(None, 0) }}|{{ "  a b".rsplit(None, 0) }}|{{ "é ü  ö".rsplit(None, 1) }})") ==
        "[' a b', 'c']|['a  b', 'c']|['a', 'b c ']|['a b  ']|['  a b']|['é ü', 'ö']");
  CHECK(render(R"({{ "abcabc".find("c", 3) }}|{{ "abcabc".find("c", 3, 4) }}|{{ "abcabc".rfind("a", 0, 3) }})"
               R"(|{{ "abcabc".index("b", 2) }}|{{ "abcabc".count("a", 1) }}|{{ "abc".startswith("b", 1) }})"
               R"(|{{ "abc".endswith("b", 0, 2) }})") == "5|-1|0|4|1|True|True");
  CHECK(render(R"({{ "abc".find("", 4) }}|{{ "abc".find("", 2, 1) }}|{{ "abc".count("", 1) }})"
               R"(|{{ "abc".startswith("", 5) }}|{{ "abc".find("a", -10, -2) }}|{{ "日本日本".find("本", 2) }})") ==
        "-1|-1|3|False|0|3");
  CHECK(error_of(R"({{ "abc".find("c", "1") }})").find("slice indices must be integers or None") != std::string::npos);
}

TEST_CASE("jinja: int, float and round filters as jinja2's: float strings, base, no hex floats, exact rounding") {
  // int(value, base), else int(float(value)), else the default; float() refuses hexadecimal; round is Python's.
  CHECK(render(R"({{ "3.7"|int }}|{{ "-3.7"|int }}|{{ "1e3"|int }}|{{ "10"|int(base=2) }}|{{ "0x1A"|int }})"
               R"(|{{ "0x1A"|int(0, 16) }}|{{ "inf"|int }}|{{ "0x1A"|float }})") == "3|-3|1000|2|0|26|0|0.0");
  CHECK(render(R"({{ 2.675|round(2) }}|{{ 1.005|round(2) }}|{{ 0.375|round(2) }}|{{ 2.5|round }})"
               R"(|{{ -0.001|round(2) }}|{{ 12345.6789|round(-2) }})") == "2.67|1.0|0.38|2.0|-0.0|12300.0");
}
