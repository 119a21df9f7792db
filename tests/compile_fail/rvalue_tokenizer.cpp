// A temporary tokenizer given to detokenizer_factory would dangle at the first token: it must not compile.
#include "zipage/gguf/gguf.hpp"
#include "zipage/tokenizer/detokenizer.hpp"

void wire(const zipage::gguf::file& file) {
  auto make = zipage::detokenizer_factory(zipage::spm_tokenizer::from_gguf(file));
  (void)make;
}
