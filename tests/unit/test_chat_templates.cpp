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
//               "teknium/OpenHermes-2.5-Mistral-7B";
//   qwen2_5     Qwen2.5-7B-Instruct's template, ggerganov/llama.cpp
//               tests/chat/templates/Qwen-Qwen2.5-7B-Instruct.jinja (qwen25_template below, verbatim);
//   qwen2       Qwen2-72B-Instruct's template as quoted (from its tokenizer_config.json) in
//               sgl-project/sglang python/sglang/lang/chat_template.py (qwen2_template below, verbatim);
//               Qwen2-7B-Instruct's is the same text.
#include <doctest/doctest.h>

#include "test_support.hpp"

#include <zipage/tokenizer/bpe_tokenizer.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

using zipage::chat_format;
using zipage::chat_message;
using msgs = std::vector<chat_message>;

// The published templates (Jinja source, as tokenizer_config.json's chat_template holds it).
static const std::string qwen25_template = R"jinja({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)jinja";

static const std::string qwen2_template =
    R"jinja({% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %})jinja";

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

TEST_CASE("chat template qwen2_5 matches Qwen2.5-7B-Instruct's template") {
  const auto f = chat_format::qwen2_5;
  const std::string sys =
      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n";
  // No system message: the template's default one comes first.
  CHECK(render(f, no_system) == sys + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  CHECK(render(f, no_system, {.add_generation_prompt = false}) == sys + "<|im_start|>user\nHi<|im_end|>\n");
  CHECK(render(f, system_user) ==
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n");
  CHECK(render(f, multi_turn) ==
        sys + "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n"
              "<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n");
  // Reasoning and whitespace stay as written.
  CHECK(render(f, thought) ==
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nR1\n</think>\n\nA1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n"
        "<|im_start|>assistant\n");
  CHECK(render(f, spaces) ==
        "<|im_start|>system\n Be brief.\n<|im_end|>\n<|im_start|>user\n\xC2\xA0Hi!\xE3\x80\x80\x1F<|im_end|>\n"
        "<|im_start|>assistant\n\xE2\x80\x83ok\xE2\x80\xA8<|im_end|>\n<|im_start|>assistant\n");
  // Tool results: <tool_response> blocks, consecutive ones in one user turn.
  CHECK(render(f, tools) ==
        sys + "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\nCalling.<|im_end|>\n"
              "<|im_start|>user\n<tool_response>\n{\"t\": \"21\xC2\xB0" "C\"}\n\n</tool_response>\n"
              "<tool_response>\na\tb\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
  CHECK(render(f, {{"tool", "r"}, {"user", "Q"}}, {.add_generation_prompt = false}) ==
        sys + "<|im_start|>user\n<tool_response>\nr\n</tool_response><|im_end|>\n<|im_start|>user\nQ<|im_end|>\n");
  // A later system message is an ordinary turn (the default still comes first).
  CHECK(render(f, {{"user", "Hi"}, {"system", "Later"}, {"assistant", "Ok"}}, {.add_generation_prompt = false}) ==
        sys + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>system\nLater<|im_end|>\n"
              "<|im_start|>assistant\nOk<|im_end|>\n");
  // The template reads messages[0] whatever the conversation: jinja2 fails on an empty one.
  CHECK(contains(error_of([&] { (void)render(f, {}); }), "chat template qwen2_5: the conversation has no messages"));
  // Another default system text (the caller's, or the one a derived checkpoint's template writes).
  CHECK(render(f, no_system, {.default_system = "Be brief."}) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  CHECK(render(f, system_user, {.default_system = "Be brief."}) == render(f, system_user));
}

TEST_CASE("chat template qwen2 matches Qwen2-Instruct's template") {
  const auto f = chat_format::qwen2;
  const std::string sys = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n";
  CHECK(render(f, no_system) == sys + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  CHECK(render(f, no_system, {.add_generation_prompt = false}) == sys + "<|im_start|>user\nHi<|im_end|>\n");
  CHECK(render(f, system_user) ==
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n");
  CHECK(render(f, multi_turn) ==
        sys + "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n"
              "<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n");
  CHECK(render(f, spaces) ==
        "<|im_start|>system\n Be brief.\n<|im_end|>\n<|im_start|>user\n\xC2\xA0Hi!\xE3\x80\x80\x1F<|im_end|>\n"
        "<|im_start|>assistant\n\xE2\x80\x83ok\xE2\x80\xA8<|im_end|>\n<|im_start|>assistant\n");
  // Qwen2's template knows no tools: a tool turn is a ChatML turn like any other.
  CHECK(render(f, tools) ==
        sys + "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\nCalling.<|im_end|>\n"
              "<|im_start|>tool\n{\"t\": \"21\xC2\xB0" "C\"}\n<|im_end|>\n<|im_start|>tool\na\tb<|im_end|>\n"
              "<|im_start|>assistant\n");
  CHECK(render(f, {{"user", "Hi"}, {"system", "Later"}}, {.add_generation_prompt = false}) ==
        sys + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>system\nLater<|im_end|>\n");
  // The default is written inside the loop over the messages: none for an empty conversation.
  CHECK(render(f, {}) == "<|im_start|>assistant\n");
  CHECK(render(f, no_system, {.default_system = ""}) ==
        "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE("chat templates: the default system message is read from the template") {
  using zipage::chat_template_default_system;
  using zipage::detect_chat_format;
  CHECK(detect_chat_format(qwen25_template) == chat_format::qwen2_5);
  CHECK(chat_template_default_system(qwen25_template) ==
        std::optional<std::string>("You are Qwen, created by Alibaba Cloud. You are a helpful assistant."));
  CHECK(detect_chat_format(qwen2_template) == chat_format::qwen2);
  CHECK(chat_template_default_system(qwen2_template) == std::optional<std::string>("You are a helpful assistant."));

  // Another text in Qwen2.5's template (as derived checkpoints have): read with Jinja's escapes.
  auto replaced = [](std::string t, std::string_view text) {
    const std::string_view from = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>";
    const auto at = t.find(from);
    REQUIRE(at != std::string::npos);
    return t.replace(at, from.size(), std::string(text) + "<|im_end|>");
  };
  const std::string math = replaced(
      qwen25_template, R"(Please reason step by step, and put your final answer within \\boxed{}. It\'s \"x\"\ty.)");
  CHECK(detect_chat_format(math) == chat_format::qwen2_5);
  CHECK(chat_template_default_system(math) ==
        std::optional<std::string>(
            "Please reason step by step, and put your final answer within \\boxed{}. It's \"x\"\ty."));
  // An escape zipage does not read, two different texts, no guard on messages[0], or the text outside
  // a string literal: not recognised, so rendered as plain chatml.
  CHECK(detect_chat_format(replaced(qwen25_template, R"(caf\xe9)")) == chat_format::chatml);
  CHECK(detect_chat_format(qwen2_template + "{{ '<|im_start|>system\\nOther.<|im_end|>\\n' }}") == chat_format::chatml);
  CHECK(detect_chat_format(qwen2_template + qwen2_template) == chat_format::qwen2);  // the same text twice
  CHECK(detect_chat_format("{{ '<|im_start|>system\\nAlways.<|im_end|>\\n' }}{% for m in messages %}{% endfor %}") ==
        chat_format::chatml);
  CHECK(detect_chat_format(
            "{% if messages[0]['role'] == 'system' %}{{ '<|im_start|>system\\nX<|im_end|>\\n' }}{% endif %}") ==
        chat_format::chatml);
  // The literal must be the whole expression, and hold the system turn only.
  const std::string guard = "{% if loop.first and messages[0]['role'] != 'system' %}";
  CHECK(detect_chat_format(guard + "{{ '<|im_start|>system\\nX<|im_end|>\\n' }}{% endif %}") == chat_format::qwen2);
  CHECK(detect_chat_format(guard + "{{ '<|im_start|>system\\nX<|im_end|>\\n' + y }}{% endif %}") ==
        chat_format::chatml);
  CHECK(detect_chat_format(guard + "{{ '<|im_start|>system\\nX<|im_end|>\\n<|im_start|>user\\nY<|im_end|>\\n' }}") ==
        chat_format::chatml);
  CHECK(detect_chat_format("{% if loop.first and messages[0]['role'] != 'system' %}<|im_start|>system\n"
                           "You are a helpful assistant.<|im_end|>\n{% endif %}") == chat_format::chatml);
  CHECK(!chat_template_default_system("{{'<|im_start|>' + message['role']}}"));

  // A tokenizer keeps its template's text and writes it.
  std::string vocab = "{";
  for (int b = 0; b < 256; ++b) {
    std::string c;
    zipage::unicode::append_utf8(c, zipage::detail::byte_to_unicode()[static_cast<std::size_t>(b)]);
    if (b > 0) vocab += ',';
    vocab += nlohmann::json(c).dump();
    vocab += ':';
    vocab += std::to_string(b);
  }
  vocab += "}";
  const std::string tokenizer_json =
      R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": )" +
      nlohmann::json(std::string(zipage::bpe_tokenizer::qwen2_pattern)).dump() +
      R"(}, "behavior": "Isolated", "invert": false},
          {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]},
          "model": {"type": "BPE", "vocab": )" + vocab + R"(, "merges": []}})";
  auto with_template = [&](const std::string& jinja) {
    return zipage::bpe_tokenizer::from_json(tokenizer_json, nlohmann::json{{"chat_template", jinja}}.dump());
  };
  const auto q25 = with_template(qwen25_template);
  CHECK(q25.chat() == chat_format::qwen2_5);
  CHECK(q25.chat_default_system() == "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  // The template itself (Jinja) and the built-in format agree; default_system is the built-in's option.
  CHECK(q25.apply_chat_template(no_system) == render(chat_format::qwen2_5, no_system));
  CHECK_THROWS_WITH((void)q25.apply_chat_template(no_system, {.default_system = "Mine."}),
                    doctest::Contains("default_system is for the built-in formats"));
  auto q25_builtin = q25;
  q25_builtin.use_builtin_chat_format(chat_format::qwen2_5);
  CHECK(q25_builtin.chat_template_name() == "qwen2_5");
  CHECK(q25.chat_template_name() == "jinja (qwen2_5)");
  CHECK(q25_builtin.apply_chat_template(no_system) == q25.apply_chat_template(no_system));
  CHECK(q25_builtin.apply_chat_template(no_system, {.default_system = "Mine."}) ==
        "<|im_start|>system\nMine.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  CHECK(with_template(qwen2_template).apply_chat_template(multi_turn, {.add_generation_prompt = false}) ==
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
        "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n");
  // jinja2's rendering of the replaced template.
  CHECK(with_template(math).apply_chat_template(no_system) ==
        "<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{}. "
        "It's \"x\"\ty.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const auto plain = with_template("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                                   "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}");
  CHECK(plain.chat() == chat_format::chatml);
  CHECK(plain.chat_default_system().empty());
}

TEST_CASE("chat templates: qwq, as QwQ-32B's template renders") {
  // Expected strings: QwQ-32B's published template rendered with jinja2 (as at the top of this file).
  CHECK(render(chat_format::qwq, {{"system", "Be brief."}, {"user", "What is 2+3?"}}) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n");
  // An earlier answer keeps what follows its last </think>, newlines at its start dropped.
  CHECK(render(chat_format::qwq, {{"user", "What is 2+3?"},
                                  {"assistant", "<think>\nadd them\n</think>\n\nThe answer is 5."},
                                  {"user", "And 2+4?"}}) ==
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\nThe answer is 5.<|im_end|>\n"
        "<|im_start|>user\nAnd 2+4?<|im_end|>\n<|im_start|>assistant\n<think>\n");
  // The last message keeps its thinking; no generation prompt.
  zipage::chat_options no_prompt;
  no_prompt.add_generation_prompt = false;
  CHECK(zipage::apply_chat_template(chat_format::qwq,
                                    msgs{{"user", "Hi"}, {"assistant", "<think>x</think>\n\nlast answer keeps its thinking"}},
                                    no_prompt) ==
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>x</think>\n\nlast answer keeps its thinking"
        "<|im_end|>\n");
  // Consecutive tool results share one user turn; a later system message is a turn of its own.
  CHECK(render(chat_format::qwq, {{"user", "Call it"}, {"tool", "{\"r\": 1}"}, {"tool", "two"}, {"system", "mid"}}) ==
        "<|im_start|>user\nCall it<|im_end|>\n<|im_start|>user\n<tool_response>\n{\"r\": 1}\n</tool_response>\n"
        "<tool_response>\ntwo\n</tool_response><|im_end|>\n<|im_start|>system\nmid<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n");
}

TEST_CASE("chat templates: detection, names and errors") {
  const chat_format all_formats[] = {chat_format::chatml, chat_format::qwen2,    chat_format::qwen2_5,
                                     chat_format::qwen3,  chat_format::qwq,      chat_format::llama3,
                                     chat_format::llama3_1, chat_format::deepseek_r1};
  // Detection from marker strings of the real templates.
  CHECK(zipage::detect_chat_format("{{ '<|start_header_id|>' + message['role'] }}") == chat_format::llama3);
  CHECK(zipage::detect_chat_format("{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}"
                                   "{{- \"Cutting Knowledge Date: December 2023\\n\" }}") == chat_format::llama3_1);
  // DeepSeek-R1-Distill-Llama keeps DeepSeek's markers.
  CHECK(zipage::detect_chat_format("{{'<\xEF\xBD\x9CUser\xEF\xBD\x9C>'}} <|start_header_id|>") ==
        chat_format::deepseek_r1);
  CHECK(zipage::detect_chat_format("{%- if enable_thinking is defined %}<|im_start|>") == chat_format::qwen3);
  // QwQ's generation prompt opens <think>; a variant that also reads enable_thinking is still QwQ.
  CHECK(zipage::detect_chat_format("{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}") ==
        chat_format::qwq);
  CHECK(zipage::detect_chat_format("{{- '<|im_start|>assistant\\n<think>\\n' }}{%- if not enable_thinking -%}") ==
        chat_format::qwq);
  CHECK(zipage::detect_chat_format("{{'<|im_start|>' + message['role']}}") == chat_format::chatml);
  CHECK(zipage::detect_chat_format("[INST] {{ message['content'] }} [/INST]") == chat_format::none);

  for (const chat_format f : all_formats) CHECK(zipage::chat_format_from_name(zipage::chat_format_name(f)) == f);
  CHECK(zipage::chat_format_default_system(chat_format::qwen2) == "You are a helpful assistant.");
  CHECK(zipage::chat_format_default_system(chat_format::qwen2_5) ==
        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  CHECK(zipage::chat_format_default_system(chat_format::chatml).empty());
  const std::string unknown = error_of([] { (void)zipage::chat_format_from_name("llama4"); });
  CHECK(contains(unknown, "unknown chat template 'llama4'"));
  CHECK(contains(unknown, "chatml, qwen2, qwen2_5, qwen3, qwq, llama3, llama3_1, deepseek_r1"));
  CHECK(contains(error_of([] { (void)zipage::chat_format_from_name("none"); }), "unknown chat template 'none'"));
  CHECK(contains(error_of([] { (void)zipage::chat_format_from_name(""); }), "unknown chat template ''"));

  CHECK(contains(error_of([] { (void)render(chat_format::none, no_system); }), "no chat template zipage knows"));
  for (const chat_format f : all_formats)
    CHECK(contains(error_of([&] { (void)render(f, {{"user", "a"}, {"robot", "b"}}); }),
                   "chat template " + std::string(zipage::chat_format_name(f)) + ": unsupported role 'robot'"));
}
