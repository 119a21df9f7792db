// Renders conversations with zipage's chat template for a tokenizer directory, for jinja_diff.py: one JSON
// object per input line {"messages": [{role, content}], "add_generation_prompt", "enable_thinking"}, one
// {"text"} or {"error"} per output line. With "builtin" after the directory: zipage's built-in rendering of
// the family the template is recognised as, instead of the template itself.
#include <nlohmann/json.hpp>

#include <iostream>
#include <string>
#include <vector>

#include "zipage/tokenizer/bpe_tokenizer.hpp"

int main(int argc, char** argv) {
  if (argc != 2 && !(argc == 3 && std::string(argv[2]) == "builtin")) {
    std::cerr << "usage: render_chat TOKENIZER_DIR [builtin] < conversations.jsonl\n";
    return 2;
  }
  auto tokenizer = zipage::bpe_tokenizer::from_dir(argv[1]);
  if (argc == 3) tokenizer.use_builtin_chat_format(tokenizer.chat());
  for (std::string line; std::getline(std::cin, line);) {
    const auto in = nlohmann::json::parse(line);
    std::vector<zipage::chat_message> messages;
    for (const auto& m : in.at("messages")) messages.push_back({m.at("role"), m.at("content")});
    zipage::chat_options options;
    options.add_generation_prompt = in.at("add_generation_prompt");
    options.enable_thinking = in.at("enable_thinking").get<bool>();
    nlohmann::json out;
    try {
      out["text"] = tokenizer.apply_chat_template(messages, options);
    } catch (const std::exception& e) {
      out["error"] = e.what();
    }
    std::cout << out.dump() << "\n";
  }
  return 0;
}
