// The chat template recogniser: any text as a tokenizer_config.json chat_template (Jinja source) gives a
// format or none; the default system message reader (quotes, escapes, if/else tags) on the same text;
// a recognised format renders a conversation.
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
  return 0;
}
