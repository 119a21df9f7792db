// zipage-eval: the problem sets (JSONL) and how each task judges an answer.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "../common/text_lines.hpp"
#include "eval_common.hpp"
#include "zipage/core/error.hpp"
#include "zipage/core/json.hpp"
#include "zipage/eval/answer.hpp"

namespace zipage_eval {

namespace {

namespace json = zipage::json;

// Calls row(object, "file:line") for every non-blank line of a JSONL file.
template <class Row>
void for_each_row(const std::string& path, Row&& row) {
  std::ifstream in = zipage_cli::open_lines(path, "data file");
  int line_no = 0;
  for (std::string raw; std::getline(in, raw);) {
    ++line_no;
    const std::string_view line = zipage_cli::without_cr(raw);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    const std::string src = path + ":" + std::to_string(line_no);
    const json::value v = json::parse(line, src);
    zipage::check(v.is_object(), src, ": a row must be a JSON object, got ", json::type_name(v));
    row(v, src);
  }
}

}  // namespace

// Rows {"id", "level", "prompt", "answer", "trace"?, "prompt_tokens"?, "trace_tokens"?} (scripts' generator).
std::vector<problem> read_accuracy_set(const std::string& path, const std::vector<std::string>& levels, int limit) {
  std::vector<problem> out;
  std::set<std::string> ids, seen_levels;
  for_each_row(path, [&](const json::value& v, const std::string& src) {
    problem p;
    p.source = src;
    p.id = json::as_string(json::require(v, "id", src), src, "id");
    p.level = json::as_string(json::require(v, "level", src), src, "level");
    p.prompt = json::as_string(json::require(v, "prompt", src), src, "prompt");
    p.answer = json::as_string(json::require(v, "answer", src), src, "answer");
    zipage::check(!p.prompt.empty(), src, ": field 'prompt' is empty");
    zipage::check(!p.answer.empty(), src, ": field 'answer' is empty");
    // The answer read from an output is stripped and ends at its line, so a reference that is not could never match.
    const bool one_stripped_line = zipage::eval::detail::trim(p.answer) == p.answer &&
                                   p.answer.find_first_of("\r\n") == std::string::npos;
    zipage::check(one_stripped_line, src, ": field 'answer' = '", json::printable(p.answer),
                  "' has spaces around it or a line break; the answer after '####' is compared stripped and on one "
                  "line, so this row could never be right");
    if (const json::value* t = json::find(v, "trace")) (void)json::as_string(*t, src, "trace");
    (void)json::get_int(v, "prompt_tokens", src, 0, 0);
    (void)json::get_int(v, "trace_tokens", src, 0, 0);
    zipage::check(ids.insert(p.id).second, src, ": field 'id' = '", json::printable(p.id), "' repeats an earlier row");
    seen_levels.insert(p.level);
    if (!levels.empty() && std::find(levels.begin(), levels.end(), p.level) == levels.end()) return true;
    out.push_back(std::move(p));
    return true;  // every row is checked, whatever --limit keeps
  });
  for (const auto& l : levels) {
    std::string known;
    for (const auto& s : seen_levels) known += (known.empty() ? "" : ", ") + s;
    zipage::check(seen_levels.count(l) > 0, "--levels: no row of '", path, "' has level '", l, "' (levels: ", known, ")");
  }
  if (limit > 0 && static_cast<int>(out.size()) > limit) out.resize(static_cast<std::size_t>(limit));
  zipage::check(!out.empty(), "data file '", path, "' has no problem", levels.empty() ? "" : " at the chosen --levels");
  return out;
}

// GSM8K rows {"question", "answer": "... #### N"}, or MATH-500 / AIME / AMC rows {"problem", "answer" (a string or a
// number)}; the \boxed{} instruction is appended to a question or problem that does not already ask for a box
// (zipage::eval::math_prompt).
std::vector<problem> read_math_set(const std::string& path, int limit) {
  std::vector<problem> out;
  const std::string stem = std::filesystem::path(path).stem().string();
  for_each_row(path, [&](const json::value& v, const std::string& src) {
    problem p;
    p.source = src;
    p.level = stem;
    p.id = stem + "-" + std::to_string(out.size());
    if (const json::value* q = json::find(v, "question")) {
      p.prompt = json::as_string(*q, src, "question");
      zipage::check(!p.prompt.empty(), src, ": field 'question' is empty");
      p.prompt = zipage::eval::math_prompt(p.prompt);
      const std::string& solution = json::as_string(json::require(v, "answer", src), src, "answer");
      const auto final = zipage::eval::extract_hash_answer(solution);
      zipage::check(final && !final->empty(), src, ": field 'answer' has no '#### <answer>' line (GSM8K format)");
      p.answer = *final;
    } else {
      zipage::check(json::find(v, "problem") != nullptr, src, ": missing field 'problem' (or 'question')");
      p.prompt = json::as_string(json::require(v, "problem", src), src, "problem");
      zipage::check(!p.prompt.empty(), src, ": field 'problem' is empty");
      p.prompt = zipage::eval::math_prompt(p.prompt);
      // A number is its JSON text: 42, 0.5, -3, 1e-07, 18446744073709551615 (graded as numbers). An integer past
      // 2^64 is parsed as a double, which does not keep its digits (2^53 and up, in a double, are whole numbers).
      const json::value& a = json::require(v, "answer", src);
      p.answer = a.is_number() ? a.dump() : json::as_string(a, src, "answer");
      zipage::check(!a.is_number_float() || std::fabs(a.get<double>()) < 9007199254740992.0, src, ": field 'answer' = ",
                    p.answer, " is a number too large to keep its digits in JSON; write the answer as a string");
    }
    zipage::check(!p.answer.empty(), src, ": field 'answer' is empty");
    out.push_back(std::move(p));
    return true;
  });
  if (limit > 0 && static_cast<int>(out.size()) > limit) out.resize(static_cast<std::size_t>(limit));
  zipage::check(!out.empty(), "data file '", path, "' has no problem");
  return out;
}

// The testbed: the text after the last "####", exact string match.
task accuracy_task() {
  return {[](const std::string& out) { return zipage::eval::extract_hash_answer(out); },
          [](const std::string& got, const problem& p) { return got == p.answer; },
          "text after the last '####' up to the end of its line, stripped; exact match"};
}

// Math benchmarks: the last \boxed{} (else "####"), normalised, numbers compared as numbers.
task math_task() {
  return {[](const std::string& out) { return zipage::eval::extract_math_answer(out); },
          [](const std::string& got, const problem& p) { return zipage::eval::math_answers_equal(got, p.answer); },
          "last \\boxed{} (else '####'), normalised (zipage/eval/answer.hpp)"};
}

}  // namespace zipage_eval
