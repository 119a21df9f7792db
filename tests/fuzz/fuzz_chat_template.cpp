// The chat template code on any text as a tokenizer_config.json chat_template (Jinja source): the recogniser
// gives a format or none; the default system message reader (quotes, escapes, if/else tags) reads it; a
// recognised format renders a conversation; and the Jinja interpreter parses the text and renders a
// conversation with tools, tool calls and a tool result through it. Only zipage errors may come out.
#include "fuzz_common.hpp"

#include "zipage/tokenizer/bpe_tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto text = zipage_fuzz::text(data, size);
  zipage_fuzz::expect_only_zipage_errors([&] {
    const auto format = zipage::detect_chat_format(text);
    (void)zipage::chat_template_default_system(text);
    zipage_fuzz::require(zipage::chat_format_from_name(zipage::chat_format_name(format)) == format ||
                         format == zipage::chat_format::none);
    (void)zipage::chat_format_from_name(text);
    if (format == zipage::chat_format::none) return;
    const std::vector<zipage::chat_message> messages = {{"user", std::string(text.substr(0, 64))}, {"assistant", "ok"}};
    zipage::chat_options o;
    o.enable_thinking = size % 2 == 0;
    (void)zipage::apply_chat_template(format, messages, o);
  });
  zipage_fuzz::expect_only_zipage_errors([&] {
    const auto t = zipage::jinja::template_::parse(text);
    const auto messages = nlohmann::ordered_json::parse(R"([
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "reasoning_content": "Call the tool.",
       "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "n": 1.5}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "22C"},
      {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]}])");
    zipage::chat_options o;
    o.enable_thinking = size % 2 == 0;
    o.tools = nlohmann::ordered_json::parse(
        R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
    o.template_kwargs = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
    (void)zipage::render_chat_template(t, messages, o);
  });
  return 0;
}
