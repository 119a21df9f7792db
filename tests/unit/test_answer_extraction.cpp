// Answer extraction and normalisation for zipage-eval accuracy / math (include/zipage/eval/answer.hpp),
// and the confidence intervals of include/zipage/eval/stats.hpp.
#include <doctest/doctest.h>

#include <zipage/eval/answer.hpp>
#include <zipage/eval/stats.hpp>

#include <optional>
#include <string>
#include <vector>

using namespace zipage::eval;

namespace {
std::string or_none(const std::optional<std::string>& s) { return s ? *s : "<none>"; }
}  // namespace

TEST_CASE("#### answers: the last one, stripped, to the end of its line") {
  CHECK(or_none(extract_hash_answer("x = 3\n#### 42")) == "42");
  CHECK(or_none(extract_hash_answer("#### 1\nmore\n####   7  \ntrailing text")) == "7");
  CHECK(or_none(extract_hash_answer("a #### b #### c d \n e")) == "c d");
  CHECK(or_none(extract_hash_answer("####-12")) == "-12");
  CHECK(or_none(extract_hash_answer("#### \t x=5\t")) == "x=5");
  CHECK(or_none(extract_hash_answer("ends with ####")) == "");
  CHECK(or_none(extract_hash_answer("ends with ####\n17")) == "");  // the answer is on the #### line
  CHECK(or_none(extract_hash_answer("no marker ### 5")) == "<none>");
  CHECK(or_none(extract_hash_answer("")) == "<none>");
  CHECK(or_none(extract_hash_answer("##### 9")) == "9");  // the last four of five #'s
  CHECK(or_none(extract_hash_answer("#### 12\r\n")) == "12");
}

TEST_CASE("\\boxed{}: last box wins, nested braces balanced") {
  CHECK(or_none(extract_boxed("so \\boxed{5}.")) == "5");
  CHECK(or_none(extract_boxed("first \\boxed{1} then \\boxed{2}")) == "2");
  CHECK(or_none(extract_boxed("\\boxed{\\frac{1}{2}}")) == "\\frac{1}{2}");
  CHECK(or_none(extract_boxed("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}")) == "\\left( 3, \\frac{\\pi}{2} \\right)");
  CHECK(or_none(extract_boxed("\\boxed{{a}{b{c}}}")) == "{a}{b{c}}");
  CHECK(or_none(extract_boxed("\\boxed{ 12 }")) == "12");
  CHECK(or_none(extract_boxed("\\boxed{\\{1,2\\}}")) == "\\{1,2\\}");  // escaped braces do not count
  CHECK(or_none(extract_boxed("$\\boxed 5$")) == "5");
  CHECK(or_none(extract_boxed("\\boxed 5 apples")) == "5");
  CHECK(or_none(extract_boxed("\\fbox{7}")) == "7");
  CHECK(or_none(extract_boxed("\\boxed{1} and \\fbox{8}")) == "8");
  CHECK(or_none(extract_boxed("no box here")) == "<none>");
  CHECK(or_none(extract_boxed("\\boxed{unclosed")) == "<none>");
  CHECK(or_none(extract_boxed("\\boxed{3} then \\boxed{4")) == "<none>");  // the last box is cut off
  CHECK(or_none(extract_boxed("\\boxedx{3}")) == "<none>");
  CHECK(or_none(extract_boxed("\\boxed{}")) == "");
  // TeX skips spaces before an argument: "\\boxed {5}" was read as the token "{5}", which no answer equals.
  CHECK(or_none(extract_boxed("\\boxed {5}")) == "5");
  CHECK(or_none(extract_boxed("\\boxed\n{\\frac{1}{2}}.")) == "\\frac{1}{2}");
  CHECK(or_none(extract_boxed("\\fbox  {7}")) == "7");
  CHECK(or_none(extract_boxed("\\boxed {3")) == "<none>");
  CHECK(or_none(extract_boxed("\\boxed\n5")) == "5");
  CHECK(or_none(extract_boxed("\\boxed")) == "<none>");
  CHECK(or_none(extract_boxed("\\boxed ")) == "<none>");
  CHECK(or_none(extract_boxed("\\boxed$")) == "<none>");
}

TEST_CASE("math answers: \\boxed first, else ####") {
  CHECK(or_none(extract_math_answer("#### 3 ... \\boxed{4}")) == "4");
  CHECK(or_none(extract_math_answer("\\boxed{4} ... #### 3")) == "4");
  CHECK(or_none(extract_math_answer("reasoning\n#### 1,000")) == "1,000");
  CHECK(or_none(extract_math_answer("nothing")) == "<none>");
}

TEST_CASE("normalisation") {
  CHECK(normalize_math_answer("$18$") == "18");
  CHECK(normalize_math_answer("\\$18") == "18");
  CHECK(normalize_math_answer(" \\left( 3, \\frac{\\pi}{2} \\right) ") == "(3,\\frac{\\pi}{2})");
  CHECK(normalize_math_answer("\\dfrac{3}{56}") == "\\frac{3}{56}");
  CHECK(normalize_math_answer("\\tfrac12") == "\\frac{1}{2}");
  CHECK(normalize_math_answer("\\frac1{x}") == "\\frac{1}{x}");
  CHECK(normalize_math_answer("11\\sqrt2") == "11\\sqrt{2}");
  CHECK(normalize_math_answer("\\frac{\\sqrt3}{2}") == "\\frac{\\sqrt{3}}{2}");
  CHECK(normalize_math_answer("90^\\circ") == "90");
  CHECK(normalize_math_answer("90^{\\circ}") == "90");
  CHECK(normalize_math_answer("\\text{Evelyn}") == "Evelyn");
  CHECK(normalize_math_answer("5\\text{ cm}") == "5");
  CHECK(normalize_math_answer("12 \\mbox{inches}") == "12");
  CHECK(normalize_math_answer("18 dollars") == "18");
  CHECK(normalize_math_answer("1,000 square feet.") == "1000");
  CHECK(normalize_math_answer("x = 5") == "5");
  CHECK(normalize_math_answer("\\theta=30") == "30");
  CHECK(normalize_math_answer("5.") == "5");
  CHECK(normalize_math_answer("1,000,000") == "1000000");
  CHECK(normalize_math_answer("3, 5, 7") == "3,5,7");  // a list, not a thousands separator
  CHECK(normalize_math_answer("1,-2") == "1,-2");
  CHECK(normalize_math_answer("12,34") == "12,34");
  CHECK(normalize_math_answer("50\\%") == "50");
  CHECK(normalize_math_answer("6 - 5i") == "6-5i");     // "i" is part of the number, not a unit
  CHECK(normalize_math_answer("p - q") == "p-q");
  CHECK(normalize_math_answer("\\!2\\,000") == "2000");
  CHECK(normalize_math_answer("\\boxed{7}") == "7");
  CHECK(normalize_math_answer("y = x^2 = 4") == "y=x^2=4");  // two "=": left alone
}

TEST_CASE("equal answers") {
  CHECK(math_answers_equal("0.5", "\\frac12"));
  CHECK(math_answers_equal("\\frac{1}{2}", "1/2"));
  CHECK(math_answers_equal("1/2", ".5"));
  CHECK(math_answers_equal("\\dfrac{3}{6}", "0.5"));
  CHECK(math_answers_equal("5.0", "5"));
  CHECK(math_answers_equal("5", "005"));
  CHECK(math_answers_equal("1,000", "1000"));
  CHECK(math_answers_equal("$1,000.00$", "1000"));
  CHECK(math_answers_equal("-3", "-3.0"));
  CHECK(math_answers_equal("-\\frac{1}{4}", "-0.25"));
  CHECK(math_answers_equal("\xE2\x88\x92" "5", "-5"));  // U+2212 MINUS SIGN
  CHECK(math_answers_equal("\xE2\x88\x92\\frac{1}{4}", "-0.25"));
  CHECK_FALSE(math_answers_equal("\xE2\x88\x92" "5", "5"));
  CHECK(math_answers_equal("\\frac{-1}{4}", "-1/4"));
  CHECK(math_answers_equal("x = 5", "5"));
  CHECK(math_answers_equal("18 dollars", "18"));
  CHECK(math_answers_equal("\\text{(C)}", "(C)"));
  CHECK(math_answers_equal("50\\%", "50"));
  CHECK(math_answers_equal("90^\\circ", "90"));
  CHECK(math_answers_equal("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\frac{\\pi}{2})"));
  CHECK(math_answers_equal("11\\sqrt{2}", "11\\sqrt2"));
  CHECK(math_answers_equal("\\text{Evelyn}", "Evelyn"));

  CHECK_FALSE(math_answers_equal("5", "6"));
  CHECK_FALSE(math_answers_equal("-5", "5"));
  CHECK_FALSE(math_answers_equal("0.5", "\\frac{1}{3}"));
  CHECK_FALSE(math_answers_equal("1/0", "1/0.0"));  // not numbers; different strings
  CHECK_FALSE(math_answers_equal("1,000", "1"));
  CHECK_FALSE(math_answers_equal("3,5,7", "357"));
  CHECK_FALSE(math_answers_equal("", ""));            // an empty answer is never right
  CHECK_FALSE(math_answers_equal("p-q", "q-p"));
  CHECK_FALSE(math_answers_equal("1000000000001", "1000000000000"));
  CHECK(math_answers_equal("1/0", "1/0"));  // same string
}

TEST_CASE("a row break \\\\ is not a control space") {
  // MATH-500's matrices are written "\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}"; the "\\ " rule took the
  // second backslash of "\\\\ 0" for a control space, so the answer written without spaces differed.
  CHECK(normalize_math_answer("\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}") ==
        "\\begin{pmatrix}-1&0\\\\0&-1\\end{pmatrix}");
  CHECK(math_answers_equal("\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}",
                           "\\begin{pmatrix}-1&0\\\\0&-1\\end{pmatrix}"));
  CHECK(math_answers_equal("\\begin{pmatrix} 1/5 \\\\ -18/5 \\end{pmatrix}",
                           "\\begin{pmatrix}1/5\\\\-18/5\\end{pmatrix}"));
  CHECK_FALSE(math_answers_equal("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 12 \\end{pmatrix}"));
  CHECK(normalize_math_answer("5\\ \\text{cm}") == "5");  // a control space is still a space
  CHECK(normalize_math_answer("a\\\\\\ b") == "a\\\\b");   // "\\\\" then "\\ "
}

TEST_CASE("\\text{}: a unit only at the end, after a value; elsewhere its content") {
  // Every \text{} not the whole answer was dropped as a unit: "\text{A}, \text{C}" became "," (equal to any other
  // pair of letters), "5 \text{ and } 6" became "56"; and MATH-500's "15\mbox{ cm}^2" became "15^2", not 15.
  CHECK(normalize_math_answer("\\text{A}, \\text{C}") == "A,C");
  CHECK_FALSE(math_answers_equal("\\text{A}, \\text{C}", "\\text{B}, \\text{D}"));
  CHECK_FALSE(math_answers_equal("5 \\text{ and } 6", "56"));
  CHECK(normalize_math_answer("\\text{A} or \\text{B}") == "AorB");
  CHECK(normalize_math_answer("15\\mbox{ cm}^2") == "15");
  CHECK(math_answers_equal("15\\mbox{ cm}^2", "15"));
  CHECK(math_answers_equal("864 \\mbox{ inches}^2", "864"));
  CHECK(math_answers_equal("5\\text{ cm}^{3}", "5"));
  CHECK(math_answers_equal("15 cm^2", "15"));  // a unit word's exponent too
  // Units as before.
  CHECK(normalize_math_answer("5\\text{ cm}") == "5");
  CHECK(normalize_math_answer("5\\text{ cm}.") == "5");
  CHECK(normalize_math_answer("$5$ \\text{cm}") == "5");
  CHECK(normalize_math_answer("\\frac{270}7\\text{ degrees}") == "\\frac{270}{7}");
  CHECK(normalize_math_answer("\\frac{\\pi}{2}\\text{ radians}") == "\\frac{\\pi}{2}");
  CHECK(normalize_math_answer("10^{\\circ}\\text{C}") == "10");
  CHECK(normalize_math_answer("1,000\\text{ dollars}") == "1000");
  CHECK(normalize_math_answer("\\text{5 dollars}") == "5");
  CHECK(normalize_math_answer("\\text{(C)}") == "(C)");
  CHECK(normalize_math_answer("\\text{ cm}") == "cm");  // nothing before it: not a unit
  CHECK(normalize_math_answer("5\\text{cm") == "5\\text{cm");  // never closed: left as written
}

TEST_CASE("spacing: \\, \\; \\: \\quad and ~ are spaces; {,} is a thousands separator") {
  // "\\," was deleted, not read as a space: "5\\,\\mathrm{cm}" became "5cm" (no unit left to drop) while
  // "5 \\mathrm{cm}" was 5; "~" and "{,}" were kept: "5~\\text{cm}" was "5~", "1{,}000" not a number.
  CHECK(math_answers_equal("5\\,\\mathrm{cm}", "5"));
  CHECK(math_answers_equal("5~\\text{cm}", "5"));
  CHECK(math_answers_equal("5~cm", "5"));
  CHECK(math_answers_equal("1{,}000", "1000"));
  CHECK(math_answers_equal("-12{,}345{,}678", "-12345678"));
  CHECK(math_answers_equal("1\\,000 dollars", "1000"));
  CHECK(normalize_math_answer("x = 1,\\quad y = 2") == "x=1,y=2");
  CHECK(normalize_math_answer("a\\qquad b") == "ab");
  CHECK(normalize_math_answer("\\quadrilateral") == "\\quadrilateral");  // not \\quad
  CHECK(normalize_math_answer("2\\;000") == "2000");
  CHECK(normalize_math_answer("(1{,}2)") == "(1,2)");
  CHECK_FALSE(math_answers_equal("1{,}000", "1"));
}

TEST_CASE("a deeply nested answer is graded without overflowing the stack") {
  // brace_arguments recursed once per nested \\frac / \\sqrt: a box nesting 50,000 of them (a looping model's
  // output) crashed zipage-eval with a stack overflow, losing the whole grid.
  std::string nested = "\\boxed{", sqrt = "\\boxed{";
  for (int i = 0; i < 50000; ++i) nested += "\\frac{", sqrt += "\\sqrt{";
  nested += "1";
  sqrt += "2";
  for (int i = 0; i < 50000; ++i) nested += "}{2}", sqrt += "}";
  nested += "}";
  sqrt += "}";
  const auto a = extract_math_answer(nested), b = extract_math_answer(sqrt);
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  CHECK_FALSE(math_answers_equal(*a, "0"));
  CHECK(math_answers_equal(*a, *a));
  CHECK_FALSE(math_answers_equal(*b, "2"));
  CHECK(normalize_math_answer("\\frac{\\frac12}{\\sqrt2}") == "\\frac{\\frac{1}{2}}{\\sqrt{2}}");  // shallow: as before
}

TEST_CASE("scientific notation is a number") {
  // "1.5e3", "1.5 \\times 10^{3}" compared as strings, so they were wrong against 1500 (a numeric JSON answer of
  // 1e-07 reads back in this form too).
  CHECK(math_answers_equal("1.5e3", "1500"));
  CHECK(math_answers_equal("1.5E+3", "1,500"));
  CHECK(math_answers_equal("2e-4", "0.0002"));
  CHECK(math_answers_equal("1.5 \\times 10^{3}", "1500"));
  CHECK(math_answers_equal("1.5\\times10^3", "1.5e3"));
  CHECK(math_answers_equal("-2 \\cdot 10^{-2}", "-\\frac{1}{50}"));
  CHECK(math_answers_equal("$3 \\times 10^{8}$ meters", "300000000"));
  CHECK_FALSE(math_answers_equal("1.5e3", "150"));
  CHECK_FALSE(math_answers_equal("1.5\\times10^{3}", "15000"));
  CHECK_FALSE(math_answer_value("e3").has_value());
  CHECK_FALSE(math_answer_value("3e").has_value());   // 3e (Euler's number) is no decimal
  CHECK_FALSE(math_answer_value("1e2e3").has_value());
  CHECK_FALSE(math_answer_value("1e99999").has_value());
  CHECK_FALSE(math_answer_value("2\\times10^{x}").has_value());
  CHECK_FALSE(math_answer_value("x\\times10^{3}").has_value());
  CHECK(math_answer_value("1e-07").value() == doctest::Approx(1e-7));
}

TEST_CASE("numeric values") {
  CHECK(math_answer_value("\\frac{3}{4}").value() == doctest::Approx(0.75));
  CHECK(math_answer_value("-12").value() == doctest::Approx(-12));
  CHECK(math_answer_value("2,500.5").value() == doctest::Approx(2500.5));
  CHECK_FALSE(math_answer_value("\\pi").has_value());
  CHECK_FALSE(math_answer_value("1/0").has_value());
  CHECK_FALSE(math_answer_value("1.2.3").has_value());
  CHECK_FALSE(math_answer_value("-").has_value());
}

TEST_CASE("numbers within 1e-4 relative are equal, as Qwen2.5-Math's grader; whole numbers exactly") {
  // The tolerance was 1e-15, so "0.3333" (1/3 rounded, as models write it) was wrong against \frac{1}{3}; Qwen's
  // math_equal takes isclose(rel_tol=1e-4).
  CHECK(math_answers_equal("0.3333", "1/3"));
  CHECK(math_answers_equal("0.3333", "\\frac13"));
  CHECK(math_answers_equal("\\frac{2}{3}", "0.6667"));
  CHECK(math_answers_equal("0.1111", "\\frac{1}{9}"));    // on the bound: ties are equal
  CHECK(math_answers_equal("0.5555", "\\frac{5}{9}"));
  CHECK(math_answers_equal("3.14159", "3.1416"));
  CHECK(math_answers_equal("-0.3333", "-\\frac{1}{3}"));
  CHECK(math_answers_equal("2.99999", "3"));              // a decimal against a whole number: the tolerance
  CHECK_FALSE(math_answers_equal("0.333", "1/3"));        // 1e-3 off
  CHECK_FALSE(math_answers_equal("0.3333", "-1/3"));
  CHECK_FALSE(math_answers_equal("0.0001", "0.0002"));    // relative, not absolute: small numbers are not all equal
  CHECK_FALSE(math_answers_equal("0", "0.00001"));
  CHECK(math_answers_equal("0", "-0.0"));
  // Two whole numbers compare exactly (Qwen's isclose would take 1000000 = 1000001), past long double's digits too.
  CHECK_FALSE(math_answers_equal("1000000", "1000001"));
  CHECK_FALSE(math_answers_equal("1e6", "1000001"));
  CHECK_FALSE(math_answers_equal("\\frac{2000000}{2}", "1000001"));
  CHECK_FALSE(math_answers_equal("123456789012345678901234567890", "123456789012345678901234567891"));
  CHECK(math_answers_equal("123456789012345678901234567890", "+0123456789012345678901234567890"));
  CHECK(math_answers_equal("1000000", "1,000,000.0"));
  CHECK(math_answers_equal("-0", "0"));
}

TEST_CASE("mixed numbers: a whole number then a proper fraction") {
  // 3\frac12 (MATH's 3 1/2) was compared as a string, so it was wrong against 7/2 and 3.5; and "3 1/2" lost its space
  // and read as 31/2 = 15.5.
  CHECK(math_answers_equal("3\\frac12", "3.5"));
  CHECK(math_answers_equal("3\\frac{1}{2}", "\\frac{7}{2}"));
  CHECK(math_answers_equal("3 \\frac{1}{2}", "7/2"));
  CHECK(math_answers_equal("3\\dfrac{1}{2}", "3\\frac12"));
  CHECK(math_answers_equal("$2\\tfrac{3}{4}$ inches", "2.75"));
  CHECK(math_answers_equal("-1\\frac{1}{4}", "-1.25"));
  CHECK(math_answers_equal("3 1/2", "3.5"));
  CHECK(math_answers_equal("3\\frac{1}{2}.", "3.5"));
  CHECK(math_answers_equal("137 \\frac{1}{2}", "137.5"));  // MATH-500's own answers: "137 \frac{1}{2}", "1\frac{4}{5}"
  CHECK(math_answers_equal("1\\frac{4}{5}", "\\frac{9}{5}"));
  CHECK(normalize_math_answer("3\\frac12") == "\\frac{7}{2}");
  // Not a product: 3\frac{1}{2} is never 3 * 1/2.
  CHECK_FALSE(math_answers_equal("3\\frac{1}{2}", "1.5"));
  CHECK_FALSE(math_answers_equal("3\\frac{1}{2}", "\\frac{3}{2}"));
  CHECK_FALSE(math_answers_equal("3 1/2", "15.5"));
  // Only a proper fraction of whole numbers after an integer: everything else stays as written.
  CHECK(normalize_math_answer("3\\frac{4}{2}") == "3\\frac{4}{2}");
  CHECK(normalize_math_answer("3\\frac{2}{2}") == "3\\frac{2}{2}");
  CHECK(normalize_math_answer("2\\frac{\\pi}{3}") == "2\\frac{\\pi}{3}");
  CHECK(normalize_math_answer("2\\frac{x}{3}") == "2\\frac{x}{3}");
  CHECK(normalize_math_answer("x\\frac{1}{2}") == "x\\frac{1}{2}");
  CHECK(normalize_math_answer("1.5\\frac{1}{2}") == "1.5\\frac{1}{2}");
  CHECK(normalize_math_answer("3-1/2") == "3-1/2");
  CHECK_FALSE(math_answers_equal("3\\frac{4}{2}", "5"));
  CHECK_FALSE(math_answers_equal("3\\frac{1}{2}", "3\\frac{1}{3}"));
}

TEST_CASE("choice prefixes: (A) 5 is the choice A and the value 5") {
  // "\textbf{(A) }5" normalised to "(A)5", equal to neither 5 nor A.
  CHECK(math_answers_equal("\\textbf{(A) }5", "5"));
  CHECK(math_answers_equal("\\text{(B)} 7", "7"));
  CHECK(math_answers_equal("\\textbf{(C) } \\frac{1}{2}", "0.5"));
  CHECK(math_answers_equal("\\textbf{(A) }5", "A"));
  CHECK(math_answers_equal("\\textbf{(A) }5", "(A)"));
  CHECK(math_answers_equal("\\textbf{(A)}", "A"));
  CHECK(math_answers_equal("(D)", "\\text{D}"));
  CHECK(math_answers_equal("\\textbf{(E) }12\\text{ cm}", "(E) 12"));
  CHECK(math_answers_equal("\\mathrm{(B)}\\ 7", "\\textbf{(B)}"));
  // Negatives: another letter or another value is wrong; a bare letter says nothing of the value.
  CHECK_FALSE(math_answers_equal("\\textbf{(A) }5", "6"));
  CHECK_FALSE(math_answers_equal("\\textbf{(A) }5", "B"));
  CHECK_FALSE(math_answers_equal("\\textbf{(A) }5", "\\textbf{(B) }5"));
  CHECK_FALSE(math_answers_equal("\\textbf{(A) }5", "\\textbf{(A) }6"));
  CHECK_FALSE(math_answers_equal("(A)", "5"));
  CHECK_FALSE(math_answers_equal("A", "B"));
  CHECK_FALSE(math_answers_equal("(a) 5", "5"));          // choices are capitals A-E
  CHECK_FALSE(math_answers_equal("(F) 5", "5"));
  CHECK_FALSE(math_answers_equal("(A)", "(A, B)"));
}

TEST_CASE("units with a slash: m/s, km/h") {
  // "\text{ m/s}" and "\mbox{cm}" after a number were dropped already; a bare "m/s" was kept ("5m/s" != 5).
  CHECK(math_answers_equal("5 m/s", "5"));
  CHECK(math_answers_equal("5\\,\\mathrm{m/s}", "5"));
  CHECK(math_answers_equal("9.8 m/s^2", "9.8"));
  CHECK(math_answers_equal("60 km/h", "60"));
  CHECK(math_answers_equal("5\\text{ m/s}", "5"));
  CHECK(math_answers_equal("5\\mbox{cm}", "5"));
  CHECK(math_answers_equal("5 \\mbox{ m/s}", "5"));
  CHECK_FALSE(math_answers_equal("5 m/s", "6"));
  CHECK_FALSE(math_answers_equal("a/b", "b/a"));
  CHECK(normalize_math_answer("m/s") == "m/s");           // no number before it: not a unit
  CHECK(normalize_math_answer("5 m//s") == "5m//s");
  CHECK(normalize_math_answer("5 /s") == "5/s");
}

TEST_CASE("confidence intervals") {
  const std::vector<double> all_right = {1, 1, 1, 1};
  auto ci = mean_ci_normal(all_right);
  CHECK(ci.mean == 1.0);
  CHECK(ci.lo == 1.0);
  CHECK(ci.hi == 1.0);

  const std::vector<double> half = {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1};  // s = 0.516398, s/4 = 0.129099
  ci = mean_ci_normal(half);
  CHECK(ci.mean == doctest::Approx(0.5));
  CHECK(ci.hi - ci.mean == doctest::Approx(1.959964 * 0.129099).epsilon(1e-5));
  CHECK(ci.mean - ci.lo == doctest::Approx(ci.hi - ci.mean));

  const std::vector<double> spread = {0.0, 0.1, 0.2, 0.9};  // mean 0.3, half-width 0.4
  ci = mean_ci_normal(spread);
  CHECK(ci.lo == 0.0);  // clipped
  CHECK(ci.hi == doctest::Approx(0.7).epsilon(1e-2));

  // Wilson: 8 of 10 -> [0.4902, 0.9433] (published tables).
  const auto w = wilson_interval(8, 10);
  CHECK(w.mean == doctest::Approx(0.8));
  CHECK(w.lo == doctest::Approx(0.4902).epsilon(1e-3));
  CHECK(w.hi == doctest::Approx(0.9433).epsilon(1e-3));
  const auto none = wilson_interval(0, 20);
  CHECK(none.lo == 0.0);
  CHECK(none.hi > 0.1);
  CHECK(none.hi < 0.2);
  CHECK(wilson_interval(0, 0).hi == 0.0);
}

TEST_CASE("math_prompt: the \\boxed{} instruction appended unless the problem already asks for a box") {
  using zipage::eval::boxed_instruction;
  using zipage::eval::math_prompt;
  // MATH-500 as Hugging Face publishes it, and GSM8K questions: no instruction yet.
  CHECK(math_prompt("What is $1+1$?") == "What is $1+1$?\n" + std::string(boxed_instruction));
  CHECK(math_prompt("He bought a lego boxed set.") == "He bought a lego boxed set.\n" + std::string(boxed_instruction));
  // The bundled sets' rows end with it: unchanged (no second instruction).
  const std::string bundled = "What is $1+1$?\n" + std::string(boxed_instruction);
  CHECK(math_prompt(bundled) == bundled);
  CHECK(math_prompt("Give the answer as \\boxed{n}.") == "Give the answer as \\boxed{n}.");
}

TEST_CASE("percentages: x% is x and x/100") {
  // "%" was dropped and nothing else: 25% was right against 25 but wrong against 0.25, which Qwen2.5-Math's grader
  // takes (it accepts the reference, its /100 and its *100).
  CHECK(math_answers_equal("25\\%", "25"));
  CHECK(math_answers_equal("25\\%", "0.25"));
  CHECK(math_answers_equal("0.25", "25%"));
  CHECK(math_answers_equal("\\frac{1}{4}", "25 \\%"));
  CHECK(math_answers_equal("12.5\\%", "\\frac{1}{8}"));
  CHECK(math_answers_equal("100\\%", "1"));
  CHECK(math_answers_equal("33.33\\%", "\\frac13"));      // within 1e-4 of 1/3
  CHECK(math_answers_equal("1,250\\%", "12.5"));
  CHECK(math_answers_equal("25\\% of the students", "0.25"));
  CHECK(math_answers_equal("\\frac{100}{3}\\%", "0.3333"));
  CHECK(math_answers_equal("12\\frac{1}{2}\\%", "0.125"));  // a mixed number as a percentage
  CHECK(normalize_math_answer("25\\%") == "25");          // normalisation still drops the sign
  CHECK(normalize_math_answer("25\\% of the students") == "25");
  // Only a percentage's own /100: no factor of 10, no *100, no /100 between two plain numbers or two percentages.
  CHECK_FALSE(math_answers_equal("25", "2.5"));
  CHECK_FALSE(math_answers_equal("25\\%", "2.5"));
  CHECK_FALSE(math_answers_equal("25\\%", "2500"));
  CHECK_FALSE(math_answers_equal("25\\%", "0.25\\%"));
  CHECK_FALSE(math_answers_equal("25", "0.25"));          // no sign on either side: 25 and 0.25 differ
  CHECK_FALSE(math_answers_equal("5", "500"));
  CHECK_FALSE(math_answers_equal("25\\%", "0.26"));
  CHECK_FALSE(math_answers_equal("1\\%", "0.1"));
  CHECK_FALSE(math_answers_equal("x\\%", "0.01x"));       // the percentage rule is for numbers
}

TEST_CASE("tuples, intervals and lists compare element by element") {
  // Tuples and intervals compared as normalised strings: (1, 0.5) was wrong against (1, \frac12).
  CHECK(math_answers_equal("(1, 2)", "(1,2)"));
  CHECK(math_answers_equal("(1, 0.5)", "\\left(1, \\frac{1}{2}\\right)"));
  CHECK(math_answers_equal("[0, \\frac{1}{2})", "[0, 0.5)"));
  CHECK(math_answers_equal("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, 1.5708)"));
  CHECK(math_answers_equal("(-\\infty, \\frac{1}{3}]", "(-\\infty, 0.3333]"));
  CHECK(math_answers_equal("(-\\infty, 0) \\cup (\\frac12, \\infty)", "(-\\infty,0)\\cup(0.5,\\infty)"));
  CHECK(math_answers_equal("((1, \\frac12), (3, 4))", "((1, 0.5), (3, 4.0))"));
  CHECK(math_answers_equal("(25\\%, 1)", "(0.25, 1)"));
  CHECK(math_answers_equal("\\{1, \\frac{1}{2}\\}", "\\{1, 0.5\\}"));
  CHECK(math_answers_equal("\\langle 1, \\frac{1}{2} \\rangle", "\\langle 1,0.5\\rangle"));
  CHECK(math_answers_equal("1, \\frac{1}{2}", "1, 0.5"));  // a list without brackets, in order
  CHECK(math_answers_equal("\\begin{pmatrix} \\frac12 \\\\ -3 \\end{pmatrix}",
                           "\\begin{pmatrix}0.5\\\\-3.0\\end{pmatrix}"));
  CHECK(math_answers_equal("\\begin{bmatrix} 1 & \\frac12 \\end{bmatrix}", "\\begin{pmatrix}1&0.5\\end{pmatrix}"));
  // Order (of tuples, intervals, vectors and matrices), bracket kinds and lengths matter.
  CHECK_FALSE(math_answers_equal("(1, 2)", "(2, 1)"));
  CHECK_FALSE(math_answers_equal("\\langle 1, 2 \\rangle", "\\langle 2, 1 \\rangle"));
  CHECK_FALSE(math_answers_equal("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}",
                                 "\\begin{pmatrix} 2 \\\\ 1 \\end{pmatrix}"));
  CHECK_FALSE(math_answers_equal("[1, 2]", "[2, 1]"));
  CHECK_FALSE(math_answers_equal("[0, 1)", "(0, 1)"));
  CHECK_FALSE(math_answers_equal("[0, 1]", "[0, 1)"));
  CHECK_FALSE(math_answers_equal("(1, 2)", "[1, 2]"));
  CHECK_FALSE(math_answers_equal("(1, 2)", "1, 2"));
  CHECK_FALSE(math_answers_equal("(1, 2)", "(1, 2, 3)"));
  CHECK_FALSE(math_answers_equal("(1, 0.5)", "(1, 0.51)"));
  CHECK_FALSE(math_answers_equal("\\{1, 2\\}", "(1, 2)"));
  CHECK_FALSE(math_answers_equal("(0, 1) \\cup (2, 3)", "(0, 1) \\cup [2, 3)"));
  CHECK_FALSE(math_answers_equal("(1, 2)(3, 4)", "(1, 2)(3, 4.0)"));  // not one tuple: strings
  CHECK_FALSE(math_answers_equal("\\begin{pmatrix} 1 & 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"));
  CHECK_FALSE(math_answers_equal("\\begin{pmatrix} 1 & 2 \\end{pmatrix}", "\\begin{vmatrix} 1 & 2 \\end{vmatrix}"));
}

TEST_CASE("number words: a whole answer written out is its number") {
  CHECK(math_answers_equal("five", "5"));
  CHECK(math_answers_equal("\\text{Five}", "5.0"));
  CHECK(math_answers_equal("twenty-one", "21"));
  CHECK(math_answers_equal("twenty one.", "21"));
  CHECK(math_answers_equal("zero", "0"));
  CHECK(math_answers_equal("nineteen", "19"));
  CHECK(math_answers_equal("one hundred and five", "105"));
  CHECK(math_answers_equal("three hundred", "300"));
  CHECK(math_answers_equal("two thousand three hundred forty-five", "2345"));
  CHECK(math_answers_equal("one hundred thousand", "100,000"));
  CHECK(math_answers_equal("seven million eleven", "7000011"));
  CHECK(math_answers_equal("x = seven", "7"));
  CHECK(normalize_math_answer("Twenty-One") == "21");
  CHECK_FALSE(math_answers_equal("five", "6"));
  CHECK_FALSE(math_answers_equal("twenty-one", "20"));
  CHECK_FALSE(math_answers_equal("five five", "10"));       // not a number
  CHECK_FALSE(math_answers_equal("twenty twenty", "40"));
  CHECK_FALSE(math_answers_equal("hundred", "100"));
  CHECK_FALSE(math_answers_equal("one two", "12"));
  CHECK_FALSE(math_answers_equal("fifth", "5"));            // ordinals are not counted
  CHECK_FALSE(math_answers_equal("five apples", "5"));      // only a whole answer of number words
  CHECK_FALSE(math_answers_equal("(five, 6)", "(5, 6)"));
  CHECK_FALSE(math_answers_equal("one half", "0.5"));
  CHECK(normalize_math_answer("none") == "none");
}

TEST_CASE("closed-form numbers compare by value") {
  // \frac{\sqrt{2}}{2} and \frac{1}{\sqrt{2}} compared as strings (Qwen's grader takes them through SymPy).
  CHECK(math_answers_equal("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"));
  CHECK(math_answers_equal("\\dfrac{\\sqrt2}{2}", "0.70710678"));
  CHECK(math_answers_equal("\\sqrt{8}", "2\\sqrt{2}"));
  CHECK(math_answers_equal("\\sqrt{4}", "2"));
  CHECK(math_answers_equal("2\\pi", "6.2832"));            // within 1e-4
  CHECK(math_answers_equal("\\pi", "3.1416"));
  CHECK(math_answers_equal("\\frac{\\pi}{2}", "\\frac{1}{2}\\pi"));
  CHECK(math_answers_equal("2^{10}", "1024"));
  CHECK(math_answers_equal("2^3 \\cdot 3", "24"));
  CHECK(math_answers_equal("\\sqrt[3]{27}", "3"));
  CHECK(math_answers_equal("(1 + \\sqrt{5})/2", "1.6180"));
  CHECK(math_answers_equal("\\frac{3 + \\sqrt{5}}{2}", "\\frac{(1+\\sqrt5)^2}{4}"));
  CHECK(math_answers_equal("-\\frac{\\sqrt{3}}{3}", "-\\frac{1}{\\sqrt3}"));
  CHECK(math_answers_equal("2\\frac{\\pi}{3}", "\\frac{2\\pi}{3}"));  // not a mixed number: a product
  CHECK(math_answers_equal("10 \\div 4", "2.5"));
  CHECK(math_answers_equal("4 \\times 3 - 2", "10"));
  CHECK(math_answers_equal("3(2 + 1)", "9"));
  CHECK(math_answers_equal("(\\sqrt{2})^2", "2"));
  CHECK(math_answers_equal("\\frac{1}{2}\\frac{1}{3}", "\\frac16"));   // a product of two fractions
  CHECK(math_answers_equal("2^{3}\\frac{1}{2}", "4"));
  CHECK(math_answers_equal("\\sqrt[3]8", "2"));
  // Only within the tolerance, and only when both sides are closed forms.
  CHECK_FALSE(math_answers_equal("\\sqrt{2}", "1.41"));
  CHECK_FALSE(math_answers_equal("\\sqrt{2}", "1.414"));
  CHECK_FALSE(math_answers_equal("2\\pi", "6.28"));
  CHECK_FALSE(math_answers_equal("\\pi", "3.14"));
  CHECK_FALSE(math_answers_equal("\\sqrt{8}", "3\\sqrt{2}"));
  CHECK_FALSE(math_answers_equal("2^{10}", "1025"));
  CHECK_FALSE(math_answers_equal("10^6", "1000001"));      // whole values: exactly
  CHECK_FALSE(math_answers_equal("\\sqrt{x^2}", "x"));      // variables: see "expressions with variables"
  CHECK(math_answers_equal("\\sin(\\pi)", "0"));            // functions: see "functions, binomials, factorials"
  CHECK_FALSE(math_answers_equal("\\sqrt{-4}", "2"));
  CHECK_FALSE(math_answers_equal("\\frac{1}{0}", "\\frac{2}{0}"));
  CHECK_FALSE(math_answers_equal("2^10", "1024"));          // 2^10 is 2^1 then 0: ambiguous, left as a string
  CHECK_FALSE(math_answers_equal("3\\frac{4}{2}", "6"));    // a number before \frac{a}{b}: neither product nor sum
  CHECK_FALSE(math_answers_equal("\\sqrt{2}3", "4.2426"));
  CHECK_FALSE(math_answers_equal("\\pi^{100000}", "\\pi^{100001}"));  // overflows: not a number
  CHECK(math_answers_equal("|-3|", "3"));                   // an absolute value
  CHECK(math_answers_equal("2|1 - \\sqrt{2}|", "2\\sqrt{2} - 2"));
  CHECK_FALSE(math_answers_equal("|-3|", "-3"));
}

TEST_CASE("expressions with variables compare by value at fixed points") {
  // Any answer with a variable compared as a normalised string: 2x was wrong against 2\cdot x, and so were
  // \frac{x}{7}+\frac{2}{7} against \frac{x+2}{7} and (x+1)^2 against x^2+2x+1, which Qwen's grader takes (SymPy).
  CHECK(math_answers_equal("2x", "2\\cdot x"));
  CHECK(math_answers_equal("2 \\times x", "x + x"));
  CHECK(math_answers_equal("\\frac{x}{7}+\\frac{2}{7}", "\\frac{x+2}{7}"));
  CHECK(math_answers_equal("(x+1)^2", "x^2 + 2x + 1"));
  CHECK(math_answers_equal("x^2 - 1", "(x-1)(x+1)"));
  CHECK(math_answers_equal("\\frac{x^2-1}{x-1}", "x+1"));
  CHECK(math_answers_equal("\\pi r^2", "r^2\\pi"));           // a command, a space, a letter: \pi times r
  CHECK(math_answers_equal("\\frac{1}{x}", "x^{-1}"));
  CHECK(math_answers_equal("2^n", "2^{n}"));
  CHECK(math_answers_equal("\\frac{n(n+1)}{2}", "\\frac{n^2+n}{2}"));
  CHECK(math_answers_equal("5x^{2}y", "5yx^2"));
  CHECK(math_answers_equal("a_1 + a_{2}", "a_2 + a_1"));         // subscripts: a_1 is a_{1}
  CHECK(math_answers_equal("\\sqrt{x^2}", "|x|"));
  CHECK(math_answers_equal("|x - 1|", "|1 - x|"));
  CHECK(math_answers_equal("\\sqrt{x}\\sqrt{x}", "x"));        // where \sqrt{x} is defined
  CHECK(math_answers_equal("6 - 5i", "-5i + 6"));                // i and e are letters like any other
  CHECK(math_answers_equal("x - x", "0"));
  CHECK(math_answers_equal("0.3333x", "\\frac{x}{3}"));          // a decimal: the numbers' 1e-4
  CHECK(math_answers_equal("(x + 1, 2y)", "(1 + x, y + y)"));   // inside tuples and sets too
  CHECK(math_answers_equal("\\{x, 2x\\}", "\\{x + x, x\\}"));
  // False positives guarded: points of either sign, never whole, some below 1 in magnitude; different letters are
  // different variables; no 1e-4 without a decimal; words are no products.
  CHECK_FALSE(math_answers_equal("x^2", "|x|"));                 // equal at 0 and +-1 only
  CHECK_FALSE(math_answers_equal("\\sqrt{x^2}", "x"));           // equal for x > 0 only
  CHECK_FALSE(math_answers_equal("x^{10} + 1", "x^{10}"));        // within 1e-4 for large x only
  CHECK_FALSE(math_answers_equal("(-1)^n", "1"));                // equal at even n only; undefined elsewhere
  CHECK_FALSE(math_answers_equal("x + 1", "y + 1"));
  CHECK_FALSE(math_answers_equal("X", "x"));
  CHECK_FALSE(math_answers_equal("2x", "2x + 1"));
  CHECK_FALSE(math_answers_equal("x + 10000", "x + 10001"));     // 1e-4 apart at x near 1: exact coefficients
  CHECK_FALSE(math_answers_equal("0.333x", "\\frac{x}{3}"));
  CHECK_FALSE(math_answers_equal("p-q", "q-p"));
  CHECK_FALSE(math_answers_equal("\\frac{1}{x - x}", "\\frac{2}{x - x}"));  // defined nowhere: strings
  CHECK_FALSE(math_answers_equal("Evelyn", "Evlyen"));           // words, not products of six variables
  CHECK_FALSE(math_answers_equal("no", "on"));
  CHECK_FALSE(math_answers_equal("xy", "yx"));                   // two letters alone read as a word
  CHECK_FALSE(math_answers_equal("5 and 6", "6 and 5"));
  CHECK_FALSE(math_answers_equal("x2", "2x"));                   // a digit after a letter does not parse
  CHECK(math_answers_equal("\\sin x", "\\sin(x)"));              // functions: see "functions, binomials, ..."
  CHECK_FALSE(math_answers_equal("x\\%", "0.01x"));
  CHECK(normalize_math_answer("2 \\cdot x") == "2\\cdot x");  // the space keeps \cdot apart from x
  CHECK(normalize_math_answer("2 \\cdot 3") == "2\\cdot3");
  CHECK(math_answers_equal("A \\cup B", "B \\cup A"));        // was "A\\cupB", no union
}

TEST_CASE("equations: one relation up to a constant factor; x = value against a value") {
  // y = 2x + 1 normalised to 2x + 1 (the name dropped) and 2x + 1 = y stayed a string, so the two were unequal, and
  // y = 2x + 1 was equal to z = 2x + 1.
  CHECK(math_answers_equal("y = 2x + 1", "2x + 1 = y"));
  CHECK(math_answers_equal("y = 2x + 1", "2x - y + 1 = 0"));    // a factor of -1
  CHECK(math_answers_equal("y = 2x + 1", "2y = 4x + 2"));        // a factor of 2
  CHECK(math_answers_equal("x + 2y - 3 = 0", "y = \\frac{3 - x}{2}"));
  CHECK(math_answers_equal("x = 3", "3 = x"));
  CHECK(math_answers_equal("x^2 + y^2 = 4", "y^2 = 4 - x^2"));
  CHECK_FALSE(math_answers_equal("y = 2x + 1", "y = 2x + 2"));
  CHECK_FALSE(math_answers_equal("y = 2x + 1", "z = 2x + 1"));   // another variable
  CHECK_FALSE(math_answers_equal("y = 2x + 1", "y = 2x + 1 + x^2 - x^2 + 0.5"));
  CHECK_FALSE(math_answers_equal("y = x^2", "y^2 = x^4"));       // y = -x^2 too: not a constant factor
  CHECK_FALSE(math_answers_equal("x = 3", "x = 4"));
  CHECK_FALSE(math_answers_equal("x = x + 1", "y = y + 2"));    // no relation of the variables: strings
  // A name and a value: the value, whatever the name, as before and as Qwen's grader; subscripted names too.
  CHECK(math_answers_equal("x = 3", "3"));
  CHECK(math_answers_equal("k = 5", "n = 5"));
  CHECK(math_answers_equal("y = 2x + 1", "2x + 1"));
  CHECK(math_answers_equal("x_1 = \\frac{1}{2}", "0.5"));
  CHECK(math_answers_equal("a_{n} = 2n + 1", "1 + 2n"));
  CHECK(normalize_math_answer("x_{1} = 3") == "3");
  CHECK_FALSE(math_answers_equal("2x + 1 = y", "2x + 1"));      // no name on the left: an equation, not a value
  CHECK_FALSE(math_answers_equal("x + y = 3", "3"));
  // Inside a list, names count: x = 1 against x = 1.0, never y = 1; a named value against a bare one by the value.
  CHECK(math_answers_equal("x = 1, y = 2", "x = 1.0, y = \\frac{4}{2}"));
  CHECK(math_answers_equal("x = 2, x = 3", "3, 2"));
  CHECK(math_answers_equal("(y = 2x, y = -2x)", "(2x - y = 0, y + 2x = 0)"));
  CHECK_FALSE(math_answers_equal("x = 1, y = 2", "y = 1, x = 2"));
  CHECK_FALSE(math_answers_equal("x = 1, y = 2", "x = 2, y = 1"));
}

TEST_CASE("math_answers_equal is symmetric: equations whose lhs - rhs is about constant on one side only") {
  // Found by reading for tests/fuzz/fuzz_answer.cpp's symmetry check: the lines x = -10^6 and x = -1000 / 0.027.
  // The first one's lhs - rhs (-1000 - 0.001x) is constant within the tolerance at every point, so "cannot be told";
  // but only the second argument's was looked at, so one order took the two as one relation (their ratio is
  // constant within the tolerance too) and the other did not.
  const char* a = "2y = 2y + 1000 + 0.001x";
  const char* b = "y = y + 1000 + 0.027x";
  CHECK_FALSE(math_answers_equal(a, b));
  CHECK_FALSE(math_answers_equal(b, a));
  CHECK(math_answers_equal(a, b) == math_answers_equal(b, a));
  CHECK(math_answers_equal(a, a));
  CHECK(math_answers_equal(b, b));
  CHECK(math_answers_equal(b, "2y = 2y + 2000 + 0.054x"));  // a factor of 2: one relation, either way
  CHECK(math_answers_equal("2y = 2y + 2000 + 0.054x", b));
}

TEST_CASE("sets, unions and bare lists compare as sets: any order, repetition aside") {
  // Every structure compared in order, so a set or a list of all solutions written in another order than the
  // reference's was wrong: \{2, 1\} against \{1, 2\}, "-2, 1" against "1, -2".
  CHECK(math_answers_equal("\\{1, 2, 3\\}", "\\{3, 1, 2\\}"));
  CHECK(math_answers_equal("\\{\\frac12, 3\\}", "\\{3, 0.5\\}"));  // elements by the scalar rules
  CHECK(math_answers_equal("\\{1, 2\\}", "\\{2, 1, 1\\}"));         // multiplicity as a set
  CHECK(math_answers_equal("-2, 1", "1, -2"));                      // MATH's "all the solutions, separated by commas"
  CHECK(math_answers_equal("1, -2, \\frac{1}{3}", "0.3333, 1, -2"));
  CHECK(math_answers_equal("(2, 1), (1, 2)", "(1, 2), (2, 1)"));    // a list of pairs: the pairs in any order
  CHECK(math_answers_equal("(0, 1) \\cup (2, 3)", "(2, 3) \\cup (0, 1)"));
  CHECK(math_answers_equal("x = 1, y = 2", "y = 2, x = 1"));
  CHECK(math_answers_equal("\\{(1, 2), (3, 4)\\}", "\\{(3, 4), (1, 2.0)\\}"));
  // Still element by element: the same elements, each of the other set matched, the pairs inside in order.
  CHECK_FALSE(math_answers_equal("\\{1, 2\\}", "\\{1, 3\\}"));
  CHECK_FALSE(math_answers_equal("\\{1, 2\\}", "\\{1, 2, 3\\}"));
  CHECK_FALSE(math_answers_equal("\\{1, 2, 3\\}", "\\{1, 2\\}"));
  CHECK_FALSE(math_answers_equal("\\{1, 2\\}", "\\{1, 1.00001\\}"));   // both near 1: 2 is unmatched
  CHECK_FALSE(math_answers_equal("(2, 1), (1, 2)", "(1, 2), (1, 2)"));
  CHECK_FALSE(math_answers_equal("\\{(1, 2), (3, 4)\\}", "\\{(2, 1), (4, 3)\\}"));
  CHECK_FALSE(math_answers_equal("(0, 1) \\cup (2, 3)", "(0, 1) \\cup [2, 3)"));
  CHECK_FALSE(math_answers_equal("x = 1, y = 2", "y = 1, x = 2"));
  // A set in braces and a bare list are both sets (they were other kinds: \{1, 2\} != 1, 2); tuples are neither.
  CHECK(math_answers_equal("\\{1, 2\\}", "1, 2"));
  CHECK(math_answers_equal("\\{1, 2\\}", "2, 1"));
  CHECK(math_answers_equal("-2, \\frac{1}{2}", "\\left\\{ 0.5, -2 \\right\\}"));
  CHECK(math_answers_equal("\\{(1, 2), (3, 4)\\}", "(3, 4), (1, 2)"));
  CHECK_FALSE(math_answers_equal("\\{1, 2\\}", "1, 3"));
  CHECK_FALSE(math_answers_equal("\\{1, 2\\}", "1, 2, 3"));
  CHECK_FALSE(math_answers_equal("\\{(1, 2), (3, 4)\\}", "(2, 1), (3, 4)"));
  CHECK_FALSE(math_answers_equal("\\{1, 2\\}", "(1, 2)"));
  CHECK_FALSE(math_answers_equal("\\{1, 2\\}", "(2, 1)"));
  CHECK_FALSE(math_answers_equal("1, 2", "(1, 2)"));
  CHECK_FALSE(math_answers_equal("\\{1, 2\\}", "[1, 2]"));
  CHECK_FALSE(math_answers_equal("\\{0, 1\\}", "(0, 1) \\cup (1, 2)"));
  // A looping model's list of thousands of entries is compared in order only (max_set_pairs), and quickly.
  std::string up, down;
  for (int i = 0; i < 3000; ++i) {
    if (i > 0) up += ',', down += ',';
    up += std::to_string(i);
    down += std::to_string(2999 - i);
  }
  CHECK_FALSE(math_answers_equal(up, down));
  CHECK_FALSE(math_answers_equal(up, up + ",0"));  // equal as sets, but past the cap: in order, and longer
  CHECK(math_answers_equal("\\{" + up + "\\}", "\\{" + up + "\\}"));
}

TEST_CASE("the word percent after a number is a percent sign") {
  // "50 percent" dropped the word as a unit and was 50 only: wrong against 0.5, which "50\\%" equals.
  CHECK(math_answers_equal("50 percent", "0.5"));
  CHECK(math_answers_equal("50 per cent", "0.5"));
  CHECK(math_answers_equal("50 Per  Cent", "\\frac12"));
  CHECK(math_answers_equal("9 \\text{ percent}", "0.09"));
  CHECK(math_answers_equal("\\text{50 percent}", "0.5"));
  CHECK(math_answers_equal("50~\\mbox{per cent}", "0.5"));
  CHECK(math_answers_equal("50percent", "0.5"));
  CHECK(math_answers_equal("12.5 percent", "\\frac18"));
  CHECK(math_answers_equal("\\frac{25}{2} percent", "0.125"));
  CHECK(math_answers_equal("25 percent of the students", "0.25"));
  CHECK(math_answers_equal("10 percent, 20 percent", "0.2, 0.1"));
  // As "%": the number itself too, no other factor; a longer word or no number before it is no sign.
  CHECK(math_answers_equal("50 percent", "50"));
  CHECK(math_answers_equal("50 percent", "50\\%"));
  CHECK(normalize_math_answer("50 percent") == "50");
  CHECK_FALSE(math_answers_equal("50 percent", "5000"));
  CHECK_FALSE(math_answers_equal("50 percent", "0.05"));
  CHECK_FALSE(math_answers_equal("50 percentage points", "0.5"));  // a unit: 50
  CHECK_FALSE(math_answers_equal("50 percentile", "0.5"));
  CHECK(normalize_math_answer("a percent") == "apercent");
}

TEST_CASE("functions, binomials and factorials evaluate") {
  // Functions, \binom, \choose and n! did not parse: every answer with one compared as a normalised string, so
  // \sin(\pi) != 0, \log_2 8 != 3, \binom{5}{2} != 10, 5! != 120 and 2\sin x\cos x != \sin(2x).
  CHECK(math_answers_equal("\\sin(\\pi)", "0"));                 // sin(pi) is ~1e-19: zero, not a small number
  CHECK(math_answers_equal("\\cos(\\pi)", "-1"));
  CHECK(math_answers_equal("\\sin\\frac{\\pi}{6}", "\\frac12"));
  CHECK(math_answers_equal("\\cos \\frac{\\pi}{3}", "0.5"));
  CHECK(math_answers_equal("\\tan\\frac{\\pi}{4}", "1"));
  CHECK(math_answers_equal("\\cot\\frac{\\pi}{4}", "1"));
  CHECK(math_answers_equal("\\sec\\frac{\\pi}{3}", "2"));
  CHECK(math_answers_equal("\\csc\\frac{\\pi}{6}", "2"));
  CHECK(math_answers_equal("\\arcsin 1", "\\frac{\\pi}{2}"));
  CHECK(math_answers_equal("\\arccos(0)", "\\frac{\\pi}{2}"));
  CHECK(math_answers_equal("4\\arctan 1", "\\pi"));
  CHECK(math_answers_equal("\\sin^{-1} x", "\\arcsin x"));
  CHECK(math_answers_equal("\\tan^{-1}(x)", "\\arctan{x}"));
  CHECK(math_answers_equal("\\cosh^2 x - \\sinh^2 x", "1"));
  CHECK(math_answers_equal("\\tanh x", "\\frac{\\sinh x}{\\cosh x}"));
  CHECK(math_answers_equal("\\log_2 8", "3"));
  CHECK(math_answers_equal("\\log_{10} 1000", "3"));
  CHECK(math_answers_equal("\\log_{2}(32)", "5"));
  CHECK(math_answers_equal("\\log x", "\\ln x"));                // no base: natural, as SymPy reads \log
  CHECK(math_answers_equal("\\ln(x^2)", "2\\ln|x|"));
  CHECK(math_answers_equal("\\log_{10} x", "\\frac{\\ln x}{\\ln 10}"));
  CHECK(math_answers_equal("\\exp(x)", "e^x"));                 // e is Euler's number
  CHECK(math_answers_equal("e^{\\ln 5}", "5"));
  CHECK(math_answers_equal("\\ln(e^2)", "2"));
  CHECK(math_answers_equal("e", "2.7183"));
  CHECK(math_answers_equal("\\frac{1}{e}", "e^{-1}"));
  CHECK(math_answers_equal("2\\sin x\\cos x", "\\sin(2x)"));
  CHECK(math_answers_equal("\\sin(2x) - 2\\sin x \\cos x", "0"));  // equal terms cancel to zero, not to 1e-19
  CHECK(math_answers_equal("\\sin^2 x + \\cos^2 x", "1"));
  CHECK(math_answers_equal("\\sin^2 x", "(\\sin x)^2"));
  CHECK(math_answers_equal("\\sin^{2}(x)", "\\sin(x)^2"));
  CHECK(math_answers_equal("\\sin{x}", "\\sin x"));
  CHECK(math_answers_equal("\\sin 2x", "\\sin(2x)"));           // factors side by side are the argument
  CHECK(math_answers_equal("\\sin x^2", "\\sin(x^2)"));
  CHECK(math_answers_equal("\\sin x + 1", "1 + \\sin(x)"));
  CHECK(math_answers_equal("\\sin x \\cdot y", "y\\sin(x)"));
  CHECK(math_answers_equal("\\operatorname{sin} x", "\\sin x"));
  CHECK(math_answers_equal("\\operatorname{arcsin}(x)", "\\sin^{-1}x"));
  CHECK(math_answers_equal("\\mathrm{ln}(3)", "\\ln 3"));
  CHECK(math_answers_equal("(\\sin x, \\cos x)", "(\\sin(x), \\cos(x))"));
  CHECK(math_answers_equal("y = \\sin x", "\\sin(x) - y = 0"));
  // Near misses: other functions, arguments, bases and powers.
  CHECK_FALSE(math_answers_equal("\\sin x", "\\cos x"));
  CHECK_FALSE(math_answers_equal("\\sin x", "x"));
  CHECK_FALSE(math_answers_equal("\\sin(2x)", "2\\sin x"));
  CHECK_FALSE(math_answers_equal("\\sin x\\cos x", "\\sin(2x)"));
  CHECK_FALSE(math_answers_equal("\\sin^2 x", "\\sin x^2"));       // (sin x)^2 against sin(x^2)
  CHECK_FALSE(math_answers_equal("\\sin^{-1} x", "\\frac{1}{\\sin x}"));
  CHECK_FALSE(math_answers_equal("\\tan x", "\\cot x"));
  CHECK_FALSE(math_answers_equal("\\sinh x", "\\sin x"));
  CHECK_FALSE(math_answers_equal("\\log_2 8", "4"));
  CHECK_FALSE(math_answers_equal("\\log_2 8", "\\log_3 8"));
  CHECK_FALSE(math_answers_equal("\\log 100", "2"));              // natural: 4.605, not log base 10
  CHECK_FALSE(math_answers_equal("\\log x", "\\log_{10} x"));
  CHECK(math_answers_equal("\\ln(x^2)", "2\\ln x"));  // where both are defined (x > 0), as \sqrt{x}\sqrt{x} = x
  CHECK_FALSE(math_answers_equal("\\sin(\\pi)", "0.0001"));       // zero is no small number
  CHECK_FALSE(math_answers_equal("\\sin 1", "0.84"));             // 0.841471: within 1e-4 only
  CHECK(math_answers_equal("\\sin 1", "0.8415"));
  CHECK_FALSE(math_answers_equal("e^2", "7.39"));
  CHECK(math_answers_equal("e^2", "7.3891"));
  CHECK_FALSE(math_answers_equal("e^{\\ln 5}", "6"));
  CHECK_FALSE(math_answers_equal("e^x", "x^e"));
  CHECK_FALSE(math_answers_equal("e_1", "e"));                    // with a subscript, e is a variable
  CHECK(math_answers_equal("6 - 5i", "-5i + 6"));
  CHECK(math_answers_equal("i^2", "-1"));  // i is the imaginary unit where no other letter is (complex numbers below)
  // Outside a function's domain: no value (a string when a number; a point left out when with variables).
  CHECK_FALSE(math_answers_equal("\\ln(-1)", "\\ln(-2)"));
  CHECK_FALSE(math_answers_equal("\\arcsin 2", "\\arcsin 3"));
  CHECK_FALSE(math_answers_equal("\\log_1 5", "\\log_1 6"));
  CHECK_FALSE(math_answers_equal("\\csc(\\pi)", "\\csc(2\\pi)"));  // 1/sin: a division by zero
  CHECK_FALSE(math_answers_equal("\\tan\\frac{\\pi}{2}", "\\tan\\frac{\\pi}{2} + 1"));  // no value, not 1e19
  CHECK(math_answers_equal("\\sin 30^\\circ", "\\frac12"));  // degrees inside a function (see "degrees" below)
  CHECK_FALSE(math_answers_equal("\\cot^{-1} x", "\\arctan\\frac{1}{x}"));  // not read: strings
  CHECK_FALSE(math_answers_equal("\\ln^{-1} x", "e^x"));
}

TEST_CASE("binomials and factorials") {
  CHECK(math_answers_equal("\\binom{5}{2}", "10"));
  CHECK(math_answers_equal("\\dbinom{5}{2}", "10"));
  CHECK(math_answers_equal("\\tbinom52", "10"));
  CHECK(math_answers_equal("{5 \\choose 2}", "10"));
  CHECK(math_answers_equal("\\binom{5}{2}", "\\binom{5}{3}"));   // equal by value
  CHECK(math_answers_equal("\\binom{52}{5}", "2598960"));
  CHECK(math_answers_equal("\\binom{5}{7}", "0"));
  CHECK(math_answers_equal("\\frac{\\binom{4}{2}}{\\binom{6}{3}}", "\\frac{3}{10}"));
  CHECK(math_answers_equal("5!", "120"));
  CHECK(math_answers_equal("0!", "1"));
  CHECK(math_answers_equal("\\frac{6!}{2!4!}", "15"));
  CHECK(math_answers_equal("\\frac{6!}{2! \\cdot 4!}", "\\binom{6}{2}"));
  CHECK(math_answers_equal("(2 + 1)!", "6"));
  CHECK(math_answers_equal("-3!", "-6"));
  CHECK(math_answers_equal("3!^2", "36"));
  CHECK(math_answers_equal("20!", "2432902008176640000"));
  CHECK(math_answers_equal("\\frac{10!}{8!}", "90"));
  CHECK(math_answers_equal("2 \\cdot 5!", "240"));
  CHECK_FALSE(math_answers_equal("\\binom{5}{2}", "\\binom{5}{1}"));
  CHECK_FALSE(math_answers_equal("\\binom{6}{2}", "\\binom{5}{2}"));
  CHECK_FALSE(math_answers_equal("\\binom{5}{2}", "11"));
  CHECK_FALSE(math_answers_equal("{5 \\choose 2}", "\\frac{5}{2}"));
  CHECK_FALSE(math_answers_equal("5!", "24"));
  CHECK_FALSE(math_answers_equal("5!", "5"));
  CHECK_FALSE(math_answers_equal("\\frac{6!}{2!4!}", "\\frac{6!}{2!3!}"));
  CHECK_FALSE(math_answers_equal("(-1)!", "(-2)!"));             // no value: strings
  CHECK_FALSE(math_answers_equal("2.5!", "3.323"));               // the gamma function is not assumed
  CHECK_FALSE(math_answers_equal("171!", "172!"));                // overflows: not a number
  CHECK_FALSE(math_answers_equal("\\binom{-1}{2}", "1"));
  CHECK_FALSE(math_answers_equal("\\binom{2.5}{1}", "2.5"));
  CHECK_FALSE(math_answers_equal("n!", "(n + 1)!"));             // undefined at the points: strings
  CHECK(math_answers_equal("n!", "n!"));
}

TEST_CASE("malformed functions, binomials and factorials fall back to strings") {
  for (const char* s : {"\\sin", "\\sin^", "\\sin^{}", "\\sin()", "\\sin{}", "\\log_", "\\log_{}8", "\\log_2",
                        "\\binom{5}", "\\binom{}{}", "\\binom", "{5\\choose}", "{\\choose 2}", "5!!", "!5", "!",
                        "\\sin^{-1}", "\\sin^2(x)^2", "\\sin\\sin\\sin", "\\exp^{-1}x", "\\sin 3\\frac{1}{2}",
                        "\\operatorname{sin}", "\\ln|", "\\sin(x", "\\binom{5}{2", "e^", "\\tan^{-1}", "x!!"}) {
    CAPTURE(s);
    CHECK(math_answers_equal(s, s));
    CHECK_FALSE(math_answers_equal(s, "0"));
    CHECK_FALSE(math_answers_equal(s, "1"));
  }
  CHECK_FALSE(math_answers_equal("5!!", "15"));                  // a double factorial: not read
  CHECK_FALSE(math_answers_equal("5!!", "120"));
  CHECK_FALSE(math_answers_equal("\\binom{5}", "5"));
  // Every prefix of a well-formed answer is graded without a crash (ASan; tests/fuzz/fuzz_answer.cpp fuzzes more).
  for (const std::string s : {"\\frac{6!}{2!4!}", "\\log_{10}(x^2+1)", "\\sin^{-1}\\frac{\\sqrt{3}}{2}",
                              "{n \\choose k}+\\dbinom{n}{k}", "e^{\\ln 5}\\cos^2 x", "\\operatorname{tanh}{2x}!"}) {
    for (std::size_t n = 0; n <= s.size(); ++n) {
      CAPTURE(s.substr(0, n));
      CHECK(math_answers_equal(s.substr(0, n), s.substr(0, n)) == (n > 0));
      (void)math_answers_equal(s.substr(0, n), s);
      (void)math_answers_equal(s.substr(0, n), "1, 2");
    }
  }
  // A deep chain of functions is cut at the nesting limit, not on the stack.
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += "\\sin";
  CHECK_FALSE(math_answers_equal(deep + " x", "\\sin x"));
}

TEST_CASE("gcd and lcm of whole numbers, floor and ceiling evaluate") {
  CHECK(math_answers_equal("\\gcd(12, 18)", "6"));
  CHECK(math_answers_equal("6", "\\gcd(12,18)"));
  CHECK_FALSE(math_answers_equal("\\gcd(12, 18)", "3"));
  CHECK(math_answers_equal("\\operatorname{gcd}(-4, 6)", "2"));  // signs go
  CHECK(math_answers_equal("\\gcd(0, 5)", "5"));
  CHECK(math_answers_equal("\\operatorname{lcm}(4, 6)", "12"));
  CHECK(math_answers_equal("\\text{lcm}(4,6)", "12"));
  CHECK(math_answers_equal("\\mathrm{lcm}(4, 6)", "\\operatorname{lcm}(6, 4)"));
  CHECK(math_answers_equal("\\operatorname{lcm}(2, 3, 4)", "12"));  // more than two arguments
  CHECK_FALSE(math_answers_equal("\\operatorname{lcm}(4, 6)", "24"));
  CHECK(math_answers_equal("2\\gcd(4, 6) + 1", "5"));  // inside an expression
  CHECK(math_answers_equal("\\gcd(2^{10}, 96)", "32"));
  // Arguments that are not whole numbers: not evaluated, compared as written.
  CHECK_FALSE(math_answers_equal("\\gcd(1.5, 3)", "1.5"));
  CHECK_FALSE(math_answers_equal("\\gcd(x, y)", "\\gcd(y, x)"));
  CHECK(math_answers_equal("\\gcd(a,b)", "\\gcd(a, b)"));
  CHECK_FALSE(math_answers_equal("\\gcd(4)", "4"));

  CHECK(math_answers_equal("\\lfloor 3.7 \\rfloor", "3"));
  CHECK(math_answers_equal("\\left\\lfloor \\frac{7}{2} \\right\\rfloor", "3"));
  CHECK(math_answers_equal("\\lceil 3.2 \\rceil", "4"));
  CHECK(math_answers_equal("\\left\\lceil \\frac{7}{2} \\right\\rceil", "4"));
  CHECK(math_answers_equal("\\lfloor -3.5 \\rfloor", "-4"));
  CHECK(math_answers_equal("\\lceil -3.5 \\rceil", "-3"));
  CHECK_FALSE(math_answers_equal("\\lfloor 3.7 \\rfloor", "4"));
  CHECK_FALSE(math_answers_equal("\\lceil 3.2 \\rceil", "3"));
  CHECK(math_answers_equal("\\lfloor \\log_2 8 \\rfloor", "3"));  // 2.999... of rounding is 3
  CHECK(math_answers_equal("\\lceil \\sqrt{16} \\rceil", "4"));
  CHECK(math_answers_equal("\\lfloor \\sqrt{17} \\rfloor + \\lceil \\sqrt{17} \\rceil", "9"));
  CHECK(math_answers_equal("2\\lfloor x \\rfloor", "\\lfloor x\\rfloor + \\lfloor x\\rfloor"));  // with a variable
  CHECK_FALSE(math_answers_equal("\\lfloor x \\rfloor", "\\lceil x \\rceil"));
  CHECK_FALSE(math_answers_equal("\\lfloor 3.7", "3"));  // never closed
}

TEST_CASE("degrees: dropped from an answer, converted inside a trigonometric function") {
  for (const char* degrees : {"30^\\circ", "30^{\\circ}", "30\xC2\xB0", "30 degrees", "30\\degree"}) {
    CAPTURE(degrees);
    CHECK(math_answers_equal(degrees, "30"));
    CHECK(math_answers_equal("30", degrees));
    CHECK_FALSE(math_answers_equal(degrees, "31"));
  }
  CHECK(math_answers_equal("\\sin 30^\\circ", "\\frac{1}{2}"));
  CHECK(math_answers_equal("\\frac{1}{2}", "\\sin 30^\\circ"));
  CHECK(math_answers_equal("\\cos(60^{\\circ})", "\\frac12"));
  CHECK(math_answers_equal("\\sin 30\xC2\xB0", "0.5"));
  CHECK(math_answers_equal("\\tan 45^\\circ + 1", "2"));
  CHECK(math_answers_equal("\\sin^2 30^\\circ", "\\frac14"));
  CHECK(math_answers_equal("\\cos 60^\\circ", "\\cos\\frac{\\pi}{3}"));
  CHECK(math_answers_equal("2\\sin 15^\\circ\\cos 15^\\circ", "\\frac{1}{2}"));
  CHECK_FALSE(math_answers_equal("\\sin 30^\\circ", "\\sin 30"));  // 30 radians
  CHECK_FALSE(math_answers_equal("\\sin 30", "\\frac12"));
  CHECK_FALSE(math_answers_equal("\\cos 60^\\circ", "\\frac{\\sqrt3}{2}"));
  CHECK_FALSE(math_answers_equal("\\sin 30^{\\circ}^2", "\\frac14"));  // a double superscript
  CHECK(normalize_math_answer("\\sin 30^\\circ") == "\\sin30^{\\circ}");
  CHECK(normalize_math_answer("30^\\circ") == "30");
  CHECK(normalize_math_answer("\\arctan 1 + 45^\\circ") == "\\arctan1+45");  // an inverse takes no angle: dropped
}

TEST_CASE("complex numbers: i is the imaginary unit where no other letter is") {
  CHECK(math_answers_equal("3+4i", "4i+3"));
  CHECK(math_answers_equal("2 - i", "2-i"));
  CHECK(math_answers_equal("-i", "\\frac{1}{i}"));
  CHECK(math_answers_equal("\\frac{1}{2}+\\frac{\\sqrt{3}}{2}i", "0.5+0.866i"));  // each part within the tolerance
  CHECK(math_answers_equal("0.5+0.866i", "\\frac{1}{2}+\\frac{\\sqrt{3}}{2}i"));
  CHECK(math_answers_equal("i\\sqrt{2}", "\\sqrt{2}i"));
  CHECK(math_answers_equal("i\\sqrt{2}", "\\sqrt{-2}"));  // the principal root
  CHECK(math_answers_equal("-\\sqrt{-4}", "-2i"));
  CHECK(math_answers_equal("(1+i)^2", "2i"));
  CHECK(math_answers_equal("i^3", "-i"));
  CHECK(math_answers_equal("i^{-1}", "-i"));
  CHECK(math_answers_equal("\\frac{5}{1-2i}", "1+2i"));
  CHECK(math_answers_equal("\\frac{3}{5}+\\frac{4}{5}i", "0.6+0.8i"));
  CHECK(math_answers_equal("e^{i\\pi}", "-1"));
  CHECK(math_answers_equal("e^{i\\pi/3}", "\\cos\\frac{\\pi}{3}+i\\sin\\frac{\\pi}{3}"));
  CHECK(math_answers_equal("\\cos 60^\\circ + i\\sin 60^\\circ", "\\frac{1+i\\sqrt3}{2}"));
  CHECK(math_answers_equal("3 i", "3i"));  // "i" is no unit word
  CHECK(math_answers_equal("3", "3+0i"));
  CHECK(math_answers_equal("0^2 + i", "i"));
  CHECK_FALSE(math_answers_equal("0^0 + i", "1 + i"));  // no value: strings
  CHECK(math_answers_equal("1+i, 1-i", "1-i, 1+i"));  // entries of a list
  CHECK_FALSE(math_answers_equal("3+4i", "3-4i"));
  CHECK_FALSE(math_answers_equal("3+4i", "3+4.01i"));
  CHECK_FALSE(math_answers_equal("3+4i", "4+4i"));
  CHECK_FALSE(math_answers_equal("3+4i", "3"));
  CHECK_FALSE(math_answers_equal("3i", "3"));
  CHECK_FALSE(math_answers_equal("i", "1"));
  CHECK_FALSE(math_answers_equal("i", "-1"));
  CHECK_FALSE(math_answers_equal("3+4i", "3+4j"));  // j is a variable
  CHECK_FALSE(math_answers_equal("3+4i", "5"));     // not the modulus
  CHECK_FALSE(math_answers_equal("\\frac{1}{0i}", "\\frac{1}{0i}+1"));  // no value: strings
  // With another letter, or in an equation, i is a variable as before.
  CHECK(math_answers_equal("x+i", "i+x"));
  CHECK_FALSE(math_answers_equal("x i^2", "-x"));
  CHECK(math_answers_equal("i = 3", "3"));  // "i = 3" names the value 3
  CHECK_FALSE(math_answers_equal("\\text{Evelyn}", "\\text{Evlyen}"));
}

TEST_CASE("a set of one element is a set like the others") {
  CHECK(math_answers_equal("\\{5\\}", "5"));
  CHECK(math_answers_equal("5", "\\{5\\}"));
  CHECK(math_answers_equal("\\{5\\}", "\\{5.0\\}"));
  CHECK(math_answers_equal("\\{ \\frac12 \\}", "0.5"));
  CHECK(math_answers_equal("\\{5\\}", "5, 5"));  // as \{5, 5\} == \{5\}
  CHECK(math_answers_equal("\\left\\{ 5 \\right\\}", "x = 5"));
  CHECK_FALSE(math_answers_equal("\\{5\\}", "6"));
  CHECK_FALSE(math_answers_equal("\\{5\\}", "1, 5"));
  CHECK_FALSE(math_answers_equal("\\{5\\}", "\\{1, 5\\}"));
  CHECK_FALSE(math_answers_equal("\\{5\\}", "(5, 5)"));  // a tuple is no set
  CHECK_FALSE(math_answers_equal("\\{1\\} \\cup \\{2\\}", "1"));
  CHECK_FALSE(math_answers_equal("\\{\\{5\\}\\}", "5"));  // a set of a set
  CHECK(math_answers_equal("\\{\\{5\\}\\}", "\\{\\{5.0\\}\\}"));
  CHECK(math_answers_equal("\\{\\}", "\\emptyset"));  // the empty set, however written
  CHECK(math_answers_equal("\\varnothing", "\\{ \\}"));
  CHECK_FALSE(math_answers_equal("\\emptyset", "\\{0\\}"));
}

TEST_CASE("inequalities in one variable are the intervals of their solutions") {
  CHECK(math_answers_equal("x < 3", "(-\\infty, 3)"));
  CHECK(math_answers_equal("x \\le 3", "(-\\infty,3]"));
  CHECK(math_answers_equal("x \\geq -\\frac{1}{2}", "[-\\frac12, \\infty)"));
  CHECK(math_answers_equal("x>2", "x \\in (2, \\infty)"));
  CHECK(math_answers_equal("3 > x", "x < 3"));
  CHECK(math_answers_equal("-1 < x \\le 4", "(-1, 4]"));
  CHECK(math_answers_equal("4 \\ge x > -1", "(-1,4]"));
  CHECK(math_answers_equal("x \\leqslant 0.5", "(-\\infty, \\frac{1}{2}]"));
  CHECK(math_answers_equal("t \\gt 1", "(1,\\infty)"));
  CHECK(math_answers_equal("x \xE2\x89\xA5 2", "[2,\\infty)"));
  CHECK(math_answers_equal("x <= 7", "(-\\infty, 7]"));
  CHECK_FALSE(math_answers_equal("x < 3", "(-\\infty, 3]"));     // open against closed
  CHECK_FALSE(math_answers_equal("x > 3", "(-\\infty, 3)"));     // the other side
  CHECK_FALSE(math_answers_equal("-1 < x > 4", "(-1, 4)"));      // a chain pointing both ways is no interval
  CHECK_FALSE(math_answers_equal("x < y", "(-\\infty, y)"));
  CHECK_FALSE(math_answers_equal("|x| < 3", "(-\\infty, 3)"));   // an absolute value is no variable    // two names: no variable to solve for
  CHECK(math_answers_equal("x < -1 \\text{ or } x > 2", "(-\\infty, -1) \\cup (2, \\infty)"));
  CHECK(math_answers_equal("x \\le 0 \\lor x \\ge 1", "(-\\infty,0]\\cup[1,\\infty)"));
  CHECK_FALSE(math_answers_equal("x < -1 \\text{ or } x > 2", "(-\\infty, -1) \\cup [2, \\infty)"));
  CHECK_FALSE(math_answers_equal("x < -1 \\text{ or } y > 2", "(-\\infty, -1) \\cup (2, \\infty)"));  // two names
  CHECK(normalize_math_answer("2 < x < 5") == "(2,5)");
  CHECK(normalize_math_answer("a < b") == "a<b");
}

TEST_CASE("a numeral with its base as a subscript is the numeral without it; |z| = 5 names the value 5") {
  CHECK(math_answers_equal("52_8", "52"));
  CHECK(math_answers_equal("52", "52_{8}"));
  CHECK(math_answers_equal("1A_{16}", "1A"));
  CHECK(math_answers_equal("10110_2", "10110"));
  CHECK_FALSE(math_answers_equal("52_8", "42"));    // the digits were asked for, not the value
  CHECK_FALSE(math_answers_equal("19_8", "19"));    // 9 is no base-8 digit
  CHECK_FALSE(math_answers_equal("52_8", "52_9"));
  CHECK_FALSE(math_answers_equal("a_2", "a"));       // a subscripted name, not a numeral
  CHECK(math_answers_equal("|z| = 5", "5"));
  CHECK(math_answers_equal("|x|=5", "|x| = 5"));
  CHECK_FALSE(math_answers_equal("|z| = 5", "6"));
}

TEST_CASE("x \\in S, \\pm and one-character subscripts") {
  CHECK(math_answers_equal("x \\in [-2,7]", "[-2, 7]"));
  CHECK(math_answers_equal("[-2, 7]", "x \\in [-2,7]"));
  CHECK(math_answers_equal("x \\in (2, \\infty)", "(2,\\infty)"));
  CHECK_FALSE(math_answers_equal("x \\in [-2,7]", "[-2, 8]"));
  CHECK_FALSE(math_answers_equal("x \\in [-2,7]", "(-2, 7)"));
  CHECK(math_answers_equal("1 \\pm \\sqrt{19}", "1-\\sqrt{19}, 1+\\sqrt{19}"));
  CHECK(math_answers_equal("3 \\pm 2 \\sqrt{2}", "3+2\\sqrt2, 3-2\\sqrt2"));
  CHECK(math_answers_equal("\\frac{-1\\pm\\sqrt5}{2}", "\\frac{-1-\\sqrt5}{2}, \\frac{-1+\\sqrt5}{2}"));
  CHECK(math_answers_equal("\\{1\\pm\\sqrt{5},-2\\}", "-2, 1-\\sqrt5, 1+\\sqrt5"));
  CHECK(math_answers_equal("x = \\pm 3", "3, -3"));
  CHECK(math_answers_equal("\\pm i", "i, -i"));
  CHECK_FALSE(math_answers_equal("1 \\pm \\sqrt{19}", "1+\\sqrt{19}"));  // one root of two
  CHECK_FALSE(math_answers_equal("\\pm 3", "3"));
  CHECK(math_answers_equal("2 \\mp \\sqrt{3}", "2+\\sqrt3, 2-\\sqrt3"));  // \mp: the same two answers
  CHECK(math_answers_equal("\\mp 5", "\\pm 5"));
  CHECK_FALSE(math_answers_equal("1 \\pm 2 \\mp 3", "1+2-3, 1-2+3"));  // paired signs: not guessed
  CHECK_FALSE(math_answers_equal("1 \\pm 2 \\pm 3", "1+2+3, 1-2-3"));  // which signs go together: not guessed
  CHECK(normalize_math_answer("1 \\pm \\sqrt{19}") == "1+\\sqrt{19},1-\\sqrt{19}");
  CHECK(math_answers_equal("4210_{5}", "4210_5"));
  CHECK(math_answers_equal("a_{n}+1", "1+a_n"));
  CHECK_FALSE(math_answers_equal("52_8", "52_9"));
}
