#pragma once
// The bundled stories260K model and its tokenizer, read once per test program. The file is
// $ZIPAGE_TEST_MODEL when set (a test binary run on another machine), else the build's ZIPAGE_TEST_MODEL.
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

#include "zipage/core/types.hpp"
#include "zipage/gguf/gguf.hpp"
#include "zipage/tokenizer/spm_tokenizer.hpp"

namespace zipage::testing {

inline std::string stories_model_path() {
  const char* env = std::getenv("ZIPAGE_TEST_MODEL");
  return env != nullptr && env[0] != '\0' ? env : ZIPAGE_TEST_MODEL;
}

struct stories_model {
  gguf::file file = gguf::file::open(stories_model_path());
  spm_tokenizer tokenizer = spm_tokenizer::from_gguf(file);
};

inline stories_model& stories() {
  static stories_model m;
  return m;
}

// Known-good greedy continuation of stories260K (from its publisher's reference run): the prompt
// "Once upon a time" is the first four ids, the rest are generated.
inline const std::vector<token_id> stories_golden = {403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317,
                                                     426, 338, 401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282,
                                                     295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352};

// Each text encoded with BOS, in order.
inline std::vector<std::vector<token_id>> encode_stories(std::initializer_list<const char*> texts) {
  std::vector<std::vector<token_id>> prompts;
  for (const char* text : texts) prompts.push_back(stories().tokenizer.encode(text, true));
  return prompts;
}

// n short story openings ("Once upon a time, <subject> <action>."), cycling through 8 subjects and 8 actions.
inline std::vector<std::vector<token_id>> story_prompts(int n) {
  const char* subjects[] = {"a little girl", "a big dog", "the old man", "a happy cat",
                            "Tom", "a small bird", "the princess", "a red car"};
  const char* actions[] = {"went to the park", "found a box", "wanted to play", "was very sad",
                           "saw a tree", "liked to sing", "had a ball", "ran home"};
  std::vector<std::vector<token_id>> prompts;
  for (int i = 0; i < n; ++i) {
    const std::string text = std::string("Once upon a time, ") + subjects[i % 8] + " " + actions[(i / 8 + i) % 8] + ".";
    prompts.push_back(stories().tokenizer.encode(text, true));
  }
  return prompts;
}

}  // namespace zipage::testing
