#pragma once
// Glue between a tokenizer and the engine's per-request text streaming.
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zipage/concepts.hpp"
#include "zipage/request/sequence.hpp"
#include "zipage/sampling/guided.hpp"
#include "zipage/tokenizer/bpe_tokenizer.hpp"
#include "zipage/tokenizer/spm_tokenizer.hpp"

namespace zipage {

static_assert(tokenizer<spm_tokenizer> && tokenizer<bpe_tokenizer>);

// A factory for engine_config::make_detokenizer. Each request gets its own stream_decoder, primed with
// the prompt so the first generated piece is spaced as it follows the prompt. The tokenizer must
// outlive the engine.
inline auto detokenizer_factory(const spm_tokenizer& tokenizer) {
  return [&tokenizer](std::span<const token_id> prompt) -> streaming_detokenizer {
    auto decoder = std::make_shared<stream_decoder>(tokenizer);
    for (token_id t : prompt) (void)decoder->push(t);
    return [decoder](token_id t) { return decoder->push(t); };
  };
}

// The factory keeps a reference to the tokenizer, so a temporary one would dangle at the first token:
// passing an rvalue does not compile. Keep the tokenizer in a variable that outlives the engine.
auto detokenizer_factory(const spm_tokenizer&& tokenizer) = delete;

// The same for a byte-level BPE tokenizer. Its pieces carry their own spaces, so the decoder needs no
// priming with the prompt; special tokens (<|im_end|>, ...) are left out of the text.
inline auto detokenizer_factory(const bpe_tokenizer& tokenizer, bool skip_special = true) {
  return [&tokenizer, skip_special](std::span<const token_id> /*prompt*/) -> streaming_detokenizer {
    auto decoder = std::make_shared<bpe_stream_decoder>(tokenizer, skip_special);
    return [decoder](token_id t) { return decoder->push(t); };
  };
}

// A temporary tokenizer would dangle (see above): does not compile.
auto detokenizer_factory(const bpe_tokenizer&& tokenizer, bool skip_special = true) = delete;

// For engine_config::encode_words (sampling_params::bad_words): the text's ids, no BOS (as vLLM encodes bad words
// with add_special_tokens=False). The tokenizer must outlive the engine; a temporary one does not compile.
inline auto words_encoder(const spm_tokenizer& tokenizer) {
  return [&tokenizer](const std::string& text) { return tokenizer.encode(text, false); };
}
inline auto words_encoder(const bpe_tokenizer& tokenizer) {
  return [&tokenizer](const std::string& text) { return tokenizer.encode(text, false); };
}
auto words_encoder(const spm_tokenizer&& tokenizer) = delete;
auto words_encoder(const bpe_tokenizer&& tokenizer) = delete;

// For engine_config::guide_vocab (sampling_params::guided): the bytes each token adds to a request's output text, as
// the detokenizer writes it after the prompt. Special, control and unknown tokens have none (a guide never allows
// them). A SentencePiece piece's leading "\u2581" is a space here: the detokenizer drops it only for the first
// piece of a text, which a generated token is not unless the prompt shows no text (BOS alone). Holds no reference.
inline std::shared_ptr<const guide_vocabulary> guide_vocabulary_of(const spm_tokenizer& tokenizer) {
  return guide_vocabulary::make(tokenizer.vocab_size(), [&](token_id id) {
    std::string out;
    if (tokenizer.is_control(id) || tokenizer.type(id) == spm_token_type::unknown) return out;
    bool at_start = false;
    tokenizer.append_token_text(out, id, at_start);
    return out;
  });
}
inline std::shared_ptr<const guide_vocabulary> guide_vocabulary_of(const bpe_tokenizer& tokenizer) {
  return guide_vocabulary::make(tokenizer.vocab_size(), [&](token_id id) {
    std::string out;
    tokenizer.append_token_bytes(out, id, true);
    return out;
  });
}

}  // namespace zipage
