// zipage's chat templates against the model families' published Jinja templates. Every expected string
// below was produced by rendering the real template with Python's jinja2 the way transformers'
// apply_chat_template does (trim_blocks, lstrip_blocks, a tojson that is json.dumps(ensure_ascii=False),
// bos_token set to the model's BOS), then written out here by hand. The templates came from:
//   llama3      meta-llama/Meta-Llama-3-8B-Instruct's template, as quoted in ggml-org/llama.cpp
//               tests/test-chat-template.cpp (case "Llama-3"), with the add_generation_prompt condition
//               of the current Hugging Face revision (that test's older copy always adds the prompt);
//   llama3_1    meta-llama/Llama-3.2-3B-Instruct's template in ggerganov/llama.cpp
//               models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja (date_string passed or, without
//               strftime_now, its "26 Jul 2024" fallback); a copy of Llama-3.1-8B-Instruct's template
//               (default date hardcoded to "26 Jul 2024", quoted in a third-party test suite) renders the
//               same text for these conversations;
//   deepseek_r1 ggml-org/llama.cpp models/templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja (the
//               revision whose generation prompt is "<｜Assistant｜><think>\n");
//   qwen3       the "chat_template" of Qwen3's tokenizer_config.json (tests/data/qwen3, the Qwen3 release);
//   chatml      the plain ChatML template, ggml-org/llama.cpp tests/test-chat-template.cpp case
//               "teknium/OpenHermes-2.5-Mistral-7B".
#include <doctest/doctest.h>

#include "test_support.hpp"

#include <zipage/tokenizer/bpe_tokenizer.hpp>

#include <string>
#include <vector>

using zipage::chat_format;
using zipage::chat_message;
using msgs = std::vector<chat_message>;

namespace {

using zipage::testing::contains;
using zipage::testing::error_of;

std::string render(chat_format f, const msgs& m, const zipage::chat_options& o = {}) {
  return zipage::apply_chat_template(f, m, o);
}

// The conversations every template is rendered with.
const msgs system_user{{"system", "You are terse."}, {"user", "What is 2+2?"}};
const msgs multi_turn{{"user", "Hello"}, {"assistant", "Hi there"}, {"user", "Who are you?"}};
const msgs no_system{{"user", "Hi"}};
// An earlier answer with its reasoning in the history.
const msgs thought{{"system", "S"}, {"user", "Q1"}, {"assistant", "<think>\nR1\n</think>\n\nA1"}, {"user", "Q2"}};
// ... and the last answer with its reasoning (rendered without a generation prompt).
const msgs thought_last{{"system", "S"},
                        {"user", "Q1"},
                        {"assistant", "<think>\nR1\n</think>\n\nA1"},
                        {"user", "Q2"},
                        {"assistant", "<think>\nR2\n</think>\n\nA2"}};
// Leading/trailing ASCII and Unicode whitespace: U+00A0, U+3000, U+001F, U+2003, U+2028.
const msgs spaces{{"system", " Be brief.\n"},
                  {"user", "\xC2\xA0Hi!\xE3\x80\x80\x1F"},
                  {"assistant", "\xE2\x80\x83ok\xE2\x80\xA8"}};
// Tool results ("21°C" has a U+00B0).
const msgs tools{{"user", "Weather?"},
                 {"assistant", "Calling."},
                 {"tool", "{\"t\": \"21\xC2\xB0" "C\"}\n"},
                 {"tool", "a\tb"}};

// DeepSeek's special tokens.
const std::string ds_bos = "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
const std::string ds_eos = "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
const std::string ds_user = "<\xEF\xBD\x9CUser\xEF\xBD\x9C>";
const std::string ds_assistant = "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>";

}  // namespace

TEST_CASE("chat template llama3 (Llama 3.0) matches Meta-Llama-3-8B-Instruct's template") {
  const auto f = chat_format::llama3;
  CHECK(render(f, system_user) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(render(f, multi_turn) ==
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWho are you?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(render(f, no_system) ==
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(render(f, no_system, {.add_generation_prompt = false}) ==
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
  // Reasoning is not special to Llama: it stays as written.
  CHECK(render(f, thought) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nQ1<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n<think>\nR1\n</think>\n\nA1<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nQ2<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // Jinja's trim is Python's str.strip(): Unicode whitespace goes too.
  CHECK(render(f, spaces) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nok<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // Any role is a header of its own, content trimmed.
  CHECK(render(f, tools) ==
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWeather?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nCalling.<|eot_id|>"
        "<|start_header_id|>tool<|end_header_id|>\n\n{\"t\": \"21\xC2\xB0" "C\"}<|eot_id|>"
        "<|start_header_id|>tool<|end_header_id|>\n\na\tb<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // No messages: the template writes no BOS (it comes with the first turn).
  CHECK(render(f, {}) == "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST_CASE("chat template llama3_1 (Llama 3.1/3.2) matches Llama-3.2-3B-Instruct's template") {
  const auto f = chat_format::llama3_1;
  CHECK(render(f, system_user) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(render(f, system_user, {.date_string = "01 Jan 2025"}) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 01 Jan 2025\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // Without a system message the system block is still there, empty after the date lines.
  CHECK(render(f, multi_turn) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWho are you?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(render(f, no_system) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(render(f, thought_last, {.add_generation_prompt = false}) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nS<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nQ1<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n<think>\nR1\n</think>\n\nA1<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nQ2<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n<think>\nR2\n</think>\n\nA2<|eot_id|>");
  CHECK(render(f, spaces) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nok<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // Tool results are "ipython" turns whose content is written as a JSON string (a string is iterable
  // to Jinja, so the template's tojson branch takes it), not trimmed.
  CHECK(render(f, tools) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWeather?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nCalling.<|eot_id|>"
        "<|start_header_id|>ipython<|end_header_id|>\n\n" R"("{\"t\": \"21)" "\xC2\xB0" R"(C\"}\n")" "<|eot_id|>"
        "<|start_header_id|>ipython<|end_header_id|>\n\n" R"("a\tb")" "<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // JSON escapes of control characters, quotes and backslashes; a later system message is an ordinary turn.
  CHECK(render(f, {{"user", "Hi"}, {"ipython", "x\x01\"\\y\xC3\xA9"}, {"system", "  late system  "}},
               {.add_generation_prompt = false, .date_string = "01 Jan 2025"}) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 01 Jan 2025\n\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>ipython<|end_header_id|>\n\n" R"("x\u0001\"\\y)" "\xC3\xA9\"<|eot_id|>"
        "<|start_header_id|>system<|end_header_id|>\n\nlate system<|eot_id|>");
}

TEST_CASE("chat template deepseek_r1 matches DeepSeek-R1-Distill-Qwen-32B's template") {
  const auto f = chat_format::deepseek_r1;
  CHECK(render(f, system_user) == ds_bos + "You are terse." + ds_user + "What is 2+2?" + ds_assistant + "<think>\n");
  CHECK(render(f, multi_turn) ==
        ds_bos + ds_user + "Hello" + ds_assistant + "Hi there" + ds_eos + ds_user + "Who are you?" + ds_assistant +
            "<think>\n");
  CHECK(render(f, no_system) == ds_bos + ds_user + "Hi" + ds_assistant + "<think>\n");
  CHECK(render(f, no_system, {.add_generation_prompt = false}) == ds_bos + ds_user + "Hi");
  // An answer keeps what follows its last </think>, the newlines after it included.
  CHECK(render(f, thought) ==
        ds_bos + "S" + ds_user + "Q1" + ds_assistant + "\n\nA1" + ds_eos + ds_user + "Q2" + ds_assistant + "<think>\n");
  CHECK(render(f, thought_last, {.add_generation_prompt = false}) ==
        ds_bos + "S" + ds_user + "Q1" + ds_assistant + "\n\nA1" + ds_eos + ds_user + "Q2" + ds_assistant + "\n\nA2" +
            ds_eos);
  // Nothing is trimmed.
  CHECK(render(f, spaces) == ds_bos + " Be brief.\n" + ds_user + "\xC2\xA0Hi!\xE3\x80\x80\x1F" + ds_assistant +
                                 "\xE2\x80\x83ok\xE2\x80\xA8" + ds_eos + ds_assistant + "<think>\n");
  // The last system message is the system prompt, wherever it is.
  CHECK(render(f, {{"system", "A"}, {"user", "Q"}, {"system", "B"}, {"assistant", "r</think>x</think>y"}},
               {.add_generation_prompt = false}) == ds_bos + "B" + ds_user + "Q" + ds_assistant + "y" + ds_eos);
  CHECK(render(f, {}) == ds_bos + ds_assistant + "<think>\n");
  // The template's tool-output blocks are not implemented: a tool turn is refused, not mis-rendered.
  CHECK(contains(error_of([&] { (void)render(f, tools); }), "chat template deepseek_r1: unsupported role 'tool'"));
}

TEST_CASE("chat template qwen3 matches Qwen3's template, thinking on and off") {
  const auto f = chat_format::qwen3;
  CHECK(render(f, system_user) ==
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n");
  CHECK(render(f, system_user, {.enable_thinking = false}) ==
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  CHECK(render(f, multi_turn) ==
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n"
        "<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n");
  CHECK(render(f, no_system) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  // Answers before the last user query lose their reasoning; the one after it keeps it.
  CHECK(render(f, thought) ==
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n");
  const std::string last =
      "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
      "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\nR2\n</think>\n\nA2<|im_end|>\n";
  CHECK(render(f, thought_last, {.add_generation_prompt = false}) == last);
  // enable_thinking only changes the generation prompt.
  CHECK(render(f, thought_last, {.add_generation_prompt = false, .enable_thinking = false}) == last);
  // The last answer after the last query gets a <think> block even without reasoning; nothing is trimmed.
  CHECK(render(f, spaces) ==
        "<|im_start|>system\n Be brief.\n<|im_end|>\n<|im_start|>user\n\xC2\xA0Hi!\xE3\x80\x80\x1F<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n\xE2\x80\x83ok\xE2\x80\xA8<|im_end|>\n<|im_start|>assistant\n");
  CHECK(render(f, tools) ==
        "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\nCalling.<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n{\"t\": \"21\xC2\xB0" "C\"}\n\n</tool_response>\n<tool_response>\na\tb\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n");
  // Tool steps after the last query keep their reasoning; newlines around it are trimmed.
  const msgs steps{{"user", "Q"},
                   {"assistant", "<think>\nr\n</think>\n\ncall"},
                   {"tool", "42"},
                   {"assistant", "\n\n<think>\n\nr2\n\n</think>\n\n\nA"}};
  CHECK(render(f, steps, {.add_generation_prompt = false}) ==
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\ncall<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\nr2\n</think>\n\nA<|im_end|>\n");
  CHECK(render(f, msgs(steps.begin(), steps.begin() + 3), {.enable_thinking = false}) ==
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\ncall<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST_CASE("chat template chatml matches the plain ChatML template") {
  const auto f = chat_format::chatml;
  CHECK(render(f, system_user) ==
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n");
  CHECK(render(f, multi_turn) ==
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n"
        "<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n");
  CHECK(render(f, no_system) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  CHECK(render(f, no_system, {.add_generation_prompt = false}) == "<|im_start|>user\nHi<|im_end|>\n");
  // Reasoning and whitespace stay as written; a tool turn is a turn like any other.
  CHECK(render(f, thought) ==
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nR1\n</think>\n\nA1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n"
        "<|im_start|>assistant\n");
  CHECK(render(f, spaces) ==
        "<|im_start|>system\n Be brief.\n<|im_end|>\n<|im_start|>user\n\xC2\xA0Hi!\xE3\x80\x80\x1F<|im_end|>\n"
        "<|im_start|>assistant\n\xE2\x80\x83ok\xE2\x80\xA8<|im_end|>\n<|im_start|>assistant\n");
  CHECK(render(f, tools) ==
        "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\nCalling.<|im_end|>\n"
        "<|im_start|>tool\n{\"t\": \"21\xC2\xB0" "C\"}\n<|im_end|>\n<|im_start|>tool\na\tb<|im_end|>\n"
        "<|im_start|>assistant\n");
}

TEST_CASE("chat templates: detection, names and errors") {
  // Detection from marker strings of the real templates.
  CHECK(zipage::detect_chat_format("{{ '<|start_header_id|>' + message['role'] }}") == chat_format::llama3);
  CHECK(zipage::detect_chat_format("{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}"
                                   "{{- \"Cutting Knowledge Date: December 2023\\n\" }}") == chat_format::llama3_1);
  // DeepSeek-R1-Distill-Llama keeps DeepSeek's markers.
  CHECK(zipage::detect_chat_format("{{'<\xEF\xBD\x9CUser\xEF\xBD\x9C>'}} <|start_header_id|>") ==
        chat_format::deepseek_r1);
  CHECK(zipage::detect_chat_format("{%- if enable_thinking is defined %}<|im_start|>") == chat_format::qwen3);
  CHECK(zipage::detect_chat_format("{{'<|im_start|>' + message['role']}}") == chat_format::chatml);
  CHECK(zipage::detect_chat_format("[INST] {{ message['content'] }} [/INST]") == chat_format::none);

  for (const chat_format f :
       {chat_format::chatml, chat_format::qwen3, chat_format::llama3, chat_format::llama3_1, chat_format::deepseek_r1})
    CHECK(zipage::chat_format_from_name(zipage::chat_format_name(f)) == f);
  const std::string unknown = error_of([] { (void)zipage::chat_format_from_name("llama4"); });
  CHECK(contains(unknown, "unknown chat template 'llama4'"));
  CHECK(contains(unknown, "chatml, qwen3, llama3, llama3_1, deepseek_r1"));
  CHECK(contains(error_of([] { (void)zipage::chat_format_from_name("none"); }), "unknown chat template 'none'"));
  CHECK(contains(error_of([] { (void)zipage::chat_format_from_name(""); }), "unknown chat template ''"));

  CHECK(contains(error_of([] { (void)render(chat_format::none, no_system); }), "no chat template zipage knows"));
  for (const chat_format f :
       {chat_format::chatml, chat_format::qwen3, chat_format::llama3, chat_format::llama3_1, chat_format::deepseek_r1})
    CHECK(contains(error_of([&] { (void)render(f, {{"user", "a"}, {"robot", "b"}}); }),
                   "chat template " + std::string(zipage::chat_format_name(f)) + ": unsupported role 'robot'"));
}
