#pragma once
// Where a model and its tokenizer meet: their vocabularies must agree before any request runs, else a
// batch fails halfway (a sampled id the tokenizer cannot decode, or a prompt id the model has no
// embedding row for).
#include <string_view>

#include "zipage/core/error.hpp"
#include "zipage/model/model_config.hpp"
#include "zipage/tokenizer/bpe_tokenizer.hpp"
#include "zipage/tokenizer/spm_tokenizer.hpp"

namespace zipage {

namespace detail {
inline void check_tokenizer_not_larger(const model_config& c, int tokenizer_vocab, std::string_view model,
                                       std::string_view tokenizer) {
  check(tokenizer_vocab <= c.vocab_size, "the tokenizer (", tokenizer, ") defines ", tokenizer_vocab,
        " tokens but the model (", model, ") has a vocabulary of ", c.vocab_size,
        ": prompts could hold ids the model has no embedding for");
}
}  // namespace detail

// SentencePiece (GGUF): the model may sample any id below its vocab_size and the decoder refuses ids it
// does not define, so both sizes must be equal.
inline void check_vocabulary_pair(const model_config& c, const spm_tokenizer& t, std::string_view model = "model",
                                  std::string_view tokenizer = "tokenizer") {
  detail::check_tokenizer_not_larger(c, t.vocab_size(), model, tokenizer);
  check(c.vocab_size <= t.vocab_size(), "the model (", model, ") has a vocabulary of ", c.vocab_size,
        " but its tokenizer (", tokenizer, ") defines only ", t.vocab_size(), " tokens: ids ", t.vocab_size(), "..",
        c.vocab_size - 1, " could be generated and not decoded");
}

// Byte-level BPE (Hugging Face): a model vocabulary padded past the tokenizer's is common (Qwen3: 151936
// rows, 151669 tokens) and those ids decode to nothing, as in the tokenizers library; a tokenizer larger
// than the model is an error.
inline void check_vocabulary_pair(const model_config& c, const bpe_tokenizer& t, std::string_view model = "model",
                                  std::string_view tokenizer = "tokenizer") {
  detail::check_tokenizer_not_larger(c, t.vocab_size(), model, tokenizer);
}

}  // namespace zipage
