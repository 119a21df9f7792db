#pragma once
// sampling_params::bad_words in token form, encoded and checked in one place for everything that needs them: the
// engine, when it queues a request that gives only the words, and a front end (zipage-serve) that must refuse a bad
// word before it answers and then hands the same ids to the engine (prepared_request.hpp), so a
// request's words are encoded once.
#include <algorithm>
#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/types.hpp"
#include "zipage/sampling/sampling_params.hpp"

namespace zipage {

using word_encoder = std::function<std::vector<token_id>(const std::string& text)>;

// The ids of some bad words (vLLM's _bad_words_token_ids), the words they were made from and the vocabulary they
// were checked against. Only encode_checked_bad_words makes one, so an engine given one can trust its ids as it
// trusts its own encoding, after checking that the words and the vocabulary are the request's and its own.
class encoded_bad_words {
 public:
  [[nodiscard]] const std::vector<std::string>& words() const { return words_; }
  [[nodiscard]] const std::vector<std::vector<token_id>>& ids() const { return ids_; }
  [[nodiscard]] int vocab_size() const { return vocab_size_; }

 private:
  encoded_bad_words(std::vector<std::string> words, std::vector<std::vector<token_id>> ids, int vocab_size)
      : words_(std::move(words)), ids_(std::move(ids)), vocab_size_(vocab_size) {}
  friend encoded_bad_words encode_checked_bad_words(const std::vector<std::string>&, const word_encoder&, int);

  std::vector<std::string> words_;
  std::vector<std::vector<token_id>> ids_;
  int vocab_size_ = 0;
};

// `words` encoded as vLLM encodes bad words (encode_bad_words; `encode`: text -> ids without special tokens), every
// id checked against a vocabulary of vocab_size. Throws zipage::error naming the field and the word: one that
// encodes to nothing, or to an id the model cannot sample (a tokenizer that defines more tokens than its model).
[[nodiscard]] inline encoded_bad_words encode_checked_bad_words(const std::vector<std::string>& words,
                                                                const word_encoder& encode, int vocab_size) {
  check(vocab_size > 0, "bad words: the vocabulary size must be positive, got ", vocab_size);
  std::vector<std::vector<token_id>> ids = encode_bad_words(words, encode);
  for (const auto& word_ids : ids)
    for (const token_id t : word_ids) {
      if (t >= 0 && t < vocab_size) continue;
      // Rare (the tools refuse such tokenizer and model pairs at load), so the word is found by encoding again
      // here rather than by keeping each id's word on the common path.
      for (std::size_t i = 0; i < words.size(); ++i)
        for (const auto& own : encode_bad_words(std::vector<std::string>{words[i]}, encode))
          check(std::find(own.begin(), own.end(), t) == own.end(), "sampling: bad_words[", i, "] (\"", words[i],
                "\") encodes to token id ", t, ", outside the vocabulary of ", vocab_size);
      fail("sampling: bad_words encode to token id ", t, ", outside the vocabulary of ", vocab_size);
    }
  return {words, std::move(ids), vocab_size};
}

}  // namespace zipage
