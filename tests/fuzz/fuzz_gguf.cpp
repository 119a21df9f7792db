// GGUF reader: header, metadata (every value type, nested arrays), tensor table, alignment and data
// section; then what the engine reads from it (the llama / qwen config, the SentencePiece or byte-level BPE
// tokenizer, the sampling settings) and every tensor's conversion to fp32.
#include "fuzz_common.hpp"

#include "zipage/gguf/gguf.hpp"
#include "zipage/models/gguf_generation.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/tokenizer/bpe_tokenizer.hpp"
#include "zipage/tokenizer/spm_tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  zipage_fuzz::expect_only_zipage_errors([&] {
    const auto f = zipage::gguf::file::from_bytes(zipage_fuzz::bytes(data, size), "fuzz.gguf");
    for (const auto& key : f.keys()) (void)f.find(key);
    for (const auto& t : f.tensors())
      zipage_fuzz::expect_only_zipage_errors([&] { (void)f.to_f32(t); });
    zipage_fuzz::expect_only_zipage_errors([&] {
      const auto c = zipage::llama_config_from_gguf(f);
      (void)c.q_size();
      (void)c.kv_size();
    });
    zipage_fuzz::expect_only_zipage_errors([&] {
      const auto tok = zipage::spm_tokenizer::from_gguf(f);
      const auto ids = tok.encode("Hello world, \xC3\xA9t\xC3\xA9 <s> 12345", true);
      for (auto id : ids) zipage_fuzz::require(id >= 0 && id < tok.vocab_size());
      (void)tok.decode(ids);
    });
    zipage_fuzz::expect_only_zipage_errors([&] {
      const auto tok = zipage::bpe_tokenizer::from_gguf(f);
      const auto ids = tok.encode("Hello world, \xC3\xA9t\xC3\xA9 <|im_end|> 12345", tok.add_bos());
      for (auto id : ids) zipage_fuzz::require(id >= 0 && id < tok.vocab_size());
      (void)tok.decode(ids);
    });
    zipage_fuzz::expect_only_zipage_errors([&] {
      zipage::sampling_params p = zipage::generation_defaults_from_gguf(f).defaults();
      p.validate();
    });
  });
  return 0;
}
