#pragma once
// The bundled stories260K model and its tokenizer, read once per test program. The file is
// $ZIPAGE_TEST_MODEL when set (a test binary run on another machine), else the build's ZIPAGE_TEST_MODEL.
#include <cstdlib>
#include <string>

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

}  // namespace zipage::testing
