// Text in, text out: load a model by path, generate for a batch of prompts, then stream one.
//   zipage-quickstart [MODEL]   (a GGUF file or a Hugging Face checkpoint directory; default: the bundled
//                                stories260K, whose directory CMake passes as ZIPAGE_MODEL_DIR)
#include <iostream>
#include <string_view>

#include <zipage/zipage.hpp>

int main(int argc, char** argv) try {
  if (argc > 1 && (std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h")) {
    std::cout << "usage: zipage-quickstart [MODEL]  (a GGUF file or a Hugging Face checkpoint directory; default: "
                 "the bundled stories260K)\n";
    return 0;
  }
  zipage::llm llm(argc > 1 ? argv[1] : ZIPAGE_MODEL_DIR "/stories260K.gguf");
  for (const auto& out : llm.generate({"Once upon a time", "The little dog"}, {.temperature = 0.0f, .max_tokens = 40}))
    std::cout << out.prompt << out.text << "\n[" << zipage::to_string(out.reason) << ", " << out.token_ids.size() << " tokens]\n";
  for (const auto& piece : llm.stream({"Lily went to the park"}))  // the checkpoint's sampling defaults
    std::cout << piece.text << std::flush;
  std::cout << "\n";
} catch (const std::exception& e) {
  std::cerr << "zipage-quickstart: " << e.what() << "\n";
  return 1;
}
