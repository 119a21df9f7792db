// The math grader of zipage-eval (zipage/eval/answer.hpp) on arbitrary model output. The input is a model's output
// and a reference answer, split at the first NUL (else at the first line break; else the whole input is both):
// every public entry point runs on them — the final answer's extraction (####, \boxed{}, both), the prompt,
// normalisation, the value, and math_answers_equal on the raw pair and on the extracted answer, in both orders.
// Nothing here throws by design, so any exception escaping is a finding, as are a crash, a sanitizer report or a hang.
// Properties (each a finding when broken): math_answers_equal is symmetric (the grader's rules are written as "=",
// and nothing in them depends on which side is the reference); an answer whose normalised form is not empty equals
// itself ("equal strings" come first); extract_math_answer is extract_boxed, else extract_hash_answer; math_prompt
// keeps the problem as its beginning.
#include "fuzz_common.hpp"

#include <optional>
#include <string>
#include <string_view>

#include "zipage/eval/answer.hpp"

namespace {

namespace ev = zipage::eval;

// Compares a and b both ways; they must agree. Returns the verdict.
bool equal_both_ways(std::string_view a, std::string_view b) {
  const bool ab = ev::math_answers_equal(a, b);
  const bool ba = ev::math_answers_equal(b, a);
  zipage_fuzz::require(ab == ba);
  return ab;
}

// One answer on its own: normalisation, value, and equality with itself when it normalises to something.
void one_answer(std::string_view x) {
  const std::string n = ev::normalize_math_answer(x);
  (void)ev::math_answer_value(x);
  if (!n.empty()) zipage_fuzz::require(ev::math_answers_equal(x, x));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input = zipage_fuzz::text(data, size);
  std::size_t cut = input.find('\0');
  if (cut == std::string_view::npos) cut = input.find('\n');
  const std::string_view output = cut == std::string_view::npos ? input : input.substr(0, cut);
  const std::string_view reference = cut == std::string_view::npos ? input : input.substr(cut + 1);

  // Extraction from the whole input (a long output with line breaks) and from the output part.
  for (std::string_view text : {input, output}) {
    const auto hash = ev::extract_hash_answer(text);
    const auto boxed = ev::extract_boxed(text);
    const auto final_answer = ev::extract_math_answer(text);
    zipage_fuzz::require(final_answer == (boxed ? boxed : hash));
  }
  const std::string prompt = ev::math_prompt(output);
  zipage_fuzz::require(std::string_view(prompt).substr(0, output.size()) == output);

  one_answer(output);
  one_answer(reference);
  (void)equal_both_ways(output, reference);
  // zipage-eval's math grading: the extracted final answer against the reference.
  if (const auto got = ev::extract_math_answer(output)) {
    one_answer(*got);
    (void)equal_both_ways(*got, reference);
  }
  return 0;
}
