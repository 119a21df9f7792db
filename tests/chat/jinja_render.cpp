// Renders Jinja templates with zipage's interpreter for jinja_corpus_diff.py and jinja_expr_diff.py: reads
// the template from TEMPLATE_FILE, then one JSON object of template variables per input line; or, with "-"
// for the file, one {"template", "context"} object per line. Writes one {"text"} or {"error"} per line.
// strftime_now reads a fixed clock (2024-07-26 00:00:00), as the harnesses' jinja2 does.
#include <nlohmann/json.hpp>

#include <ctime>
#include <iostream>
#include <optional>
#include <string>

#include "zipage/core/json.hpp"
#include "zipage/tokenizer/jinja.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: jinja_render TEMPLATE_FILE < variables.jsonl\n       jinja_render - < cases.jsonl\n";
    return 2;
  }
  const bool per_line = std::string(argv[1]) == "-";
  std::optional<zipage::jinja::template_> t;
  std::string parse_error;
  try {
    if (!per_line) t = zipage::jinja::template_::parse(zipage::json::read_text_file(argv[1], "template"));
  } catch (const std::exception& e) {
    parse_error = e.what();
  }
  std::tm fixed{};
  fixed.tm_year = 124;
  fixed.tm_mon = 6;
  fixed.tm_mday = 26;
  fixed.tm_wday = 5;
  fixed.tm_yday = 207;
  for (std::string line; std::getline(std::cin, line);) {
    auto in = nlohmann::ordered_json::parse(line);
    nlohmann::json out;
    try {
      if (per_line) {
        t.reset();
        t = zipage::jinja::template_::parse(in.at("template").get<std::string>());
        in = in.at("context");
      }
      if (!t) throw std::runtime_error(parse_error);
      std::vector<std::pair<std::string, zipage::jinja::value>> vars;
      for (auto it = in.begin(); it != in.end(); ++it) vars.emplace_back(it.key(), zipage::jinja::value::from_json(it.value()));
      out["text"] = t->render(vars, {.now = fixed});
    } catch (const std::exception& e) {
      out["error"] = e.what();
    }
    std::cout << out.dump() << "\n";
  }
  return 0;
}
