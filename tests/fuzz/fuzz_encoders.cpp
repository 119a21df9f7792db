// The tokenizers' encoders on arbitrary bytes (invalid UTF-8 included): the Qwen3 byte-level BPE from
// tests/data/qwen3 and the bundled model's SentencePiece vocabulary. Every id is inside the vocabulary;
// byte-level BPE is lossless, so decoding gives back the NFC-normalised text (valid UTF-8 input).
#include "fuzz_common.hpp"

#include <string>

#include "zipage/gguf/gguf.hpp"
#include "zipage/tokenizer/bpe_tokenizer.hpp"
#include "zipage/tokenizer/spm_tokenizer.hpp"
#include "zipage/tokenizer/utf8.hpp"

namespace {
const zipage::bpe_tokenizer& qwen3() {
  static const auto t = zipage::bpe_tokenizer::from_dir(std::string(ZIPAGE_TEST_DATA_DIR) + "/qwen3");
  return t;
}
const zipage::spm_tokenizer& stories() {
  static const auto t = zipage::spm_tokenizer::from_gguf(zipage::gguf::file::open(ZIPAGE_TEST_MODEL));
  return t;
}
}  // namespace

// Loaded once before fuzzing (the 11 MB Qwen3 tokenizer takes seconds under ASan: not part of the first
// input's time budget).
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  (void)qwen3();
  (void)stories();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto text = zipage_fuzz::text(data, size);
  const auto& bpe = qwen3();
  const auto ids = bpe.encode(text, false, /*parse_special=*/false);
  for (auto id : ids) zipage_fuzz::require(id >= 0 && id < bpe.vocab_size());
  const std::string back = bpe.decode(ids);
  if (zipage::utf8::sanitize(text) == text) zipage_fuzz::require(back == bpe.normalize(text));
  (void)bpe.encode(text, false, true);
  (void)bpe.pre_tokenize(bpe.normalize(zipage::utf8::sanitize(text)));

  const auto& spm = stories();
  const auto pieces = spm.encode(text, size % 2 == 0);
  for (auto id : pieces) zipage_fuzz::require(id >= 0 && id < spm.vocab_size());
  (void)spm.decode(pieces);
  return 0;
}
