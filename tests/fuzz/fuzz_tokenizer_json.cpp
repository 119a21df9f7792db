// tokenizer.json + tokenizer_config.json → bpe_tokenizer: the input is the two files separated by the first
// NUL byte (no NUL: tokenizer.json alone). A tokenizer that loads encodes and decodes a fixed text, its
// ids inside its vocabulary, and applies its chat template.
#include "fuzz_common.hpp"

#include "zipage/tokenizer/bpe_tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto input = zipage_fuzz::text(data, size);
  const auto nul = input.find('\0');
  const auto tokenizer_json = input.substr(0, nul);
  const auto config_json = nul == std::string_view::npos ? std::string_view{} : input.substr(nul + 1);
  zipage_fuzz::expect_only_zipage_errors([&] {
    const auto t = zipage::bpe_tokenizer::from_json(tokenizer_json, config_json);
    for (const bool special : {false, true}) {
      const auto ids = t.encode("Hello world! <|im_start|>  12345 \xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\n\n", false, special);
      for (auto id : ids) zipage_fuzz::require(id >= 0 && id < t.vocab_size());
      (void)t.decode(ids);
      (void)t.decode(ids, true);
    }
    if (t.has_chat_template()) {
      const std::vector<zipage::chat_message> messages = {{"system", "s"}, {"user", "u"}, {"assistant", "a"}, {"user", "v"}};
      zipage_fuzz::expect_only_zipage_errors([&] { (void)t.apply_chat_template(messages); });
    }
  });
  return 0;
}
