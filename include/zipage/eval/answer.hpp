#pragma once
// Answer extraction and comparison for accuracy evaluation (zipage-eval accuracy / math).
//
//  * extract_hash_answer: the text after the LAST "####", whitespace-stripped, up to the end of that line
//    (GSM8K's reference format and the reasoning testbed's; the testbed compares it exactly).
//  * extract_boxed: the content of the LAST \boxed{...} (or \fbox{...}) with balanced nested braces, or
//    the token after "\boxed " when no brace follows.
//  * extract_math_answer: \boxed{} first, else "####".
//  * normalize_math_answer / math_answers_equal: the usual math-benchmark normalisation — no "$", \left/\right, \! and
//    other spacing, spaces, \text{...} units (a \text{} group, with its ^2, that ends the answer after a value; any
//    other \text{X} is X) and trailing unit words, ^\circ, "%", trailing "."; \dfrac/\tfrac are \frac, \frac12 is
//    \frac{1}{2}, \sqrt2 is \sqrt{2}; "x = 5" and "x_1 = 5" are 5; thousands separators dropped; a mixed number
//    (3\frac12, 3 1/2) is one fraction, \frac{7}{2}; then numbers (integers, decimals, a/b, \frac{a}{b}, 1.5e3,
//    1.5\times10^{3}) compare as numbers, so 0.5 == \frac12 == 1/2, 5.0 == 5 and 1.5e3 == 1500: two whole numbers
//    exactly, any other pair within numeric_relative_tolerance (0.3333 == 1/3). Closed forms of numbers (\frac, \sqrt,
//    ^, \pi, e, |x|, + - * /, parentheses, \sin and the other functions, \log_2 8, \binom{5}{2}, 5!) compare by value
//    (\frac{\sqrt2}{2} == \frac{1}{\sqrt2}, \sin(\pi) == 0, \frac{6!}{2!4!} == 15); expressions with
//    variables by value at fixed non-whole points (\frac{x}{7}+\frac{2}{7} == \frac{x+2}{7}, x^2 != |x|); equations as
//    one relation up to a constant factor (y = 2x + 1 == 2x - y + 1 = 0); a percentage x% or "x percent" is x or x/100
//    (25% == 0.25); a whole answer in number words is its number (twenty-one == 21); tuples, intervals and matrices
//    compare element by element, in order, with the same brackets ([0, \frac12) == [0, 0.5), != (0, 0.5)); sets, unions
//    and bare lists as sets, in any order, a set as a bare list of its elements (\{1, 2\} == \{2, 1\} == "2, 1", "1, 2"
//    == "2, 1"), a set of one as its element (\{5\} == 5; \{\} == \emptyset == \varnothing). A choice "(A) 5" equals
//    5, A and (A). Anything else compares as normalised strings.
//  * Also evaluated: \gcd(a, b) and \operatorname{lcm}(a, b) (\text{lcm}, \mathrm{lcm}) of whole numbers,
//    \lfloor x \rfloor and \lceil x \rceil; in an answer with \sin ... \csc, x^\circ is x\pi/180 (\sin 30^\circ ==
//    \frac12; elsewhere 30^\circ == 30). "x \in [a, b]" is [a, b]; one \pm (or \mp) in an entry is both answers
//    (1 \pm \sqrt{2} == "1+\sqrt{2}, 1-\sqrt{2}"); a one-character subscript in braces is that character (52_{8} ==
//    52_8); an inequality in one variable is its interval ("x \le 3" == "(-\infty, 3]", "-1 < x \le 4" == "(-1, 4]"),
//    several joined by "or" their union; "|z| = 5" is 5; "52_8" equals "52" (the digits, not the value 42).
//  * Complex numbers (complex_equal): i is the imaginary unit only when both answers parse as numbers and i alone (no
//    other letter, no "=", no "%") and one at least has i: 3+4i == 4i+3, i^2 == -1, \frac{1}{2}+\frac{\sqrt3}{2}i ==
//    0.5+0.866i (real and imaginary parts each within numeric_relative_tolerance). With other letters i is a variable.
#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace zipage::eval {

// Two numbers, not both whole, are equal when they differ by at most this share of the larger magnitude: Qwen2.5-Math's
// grader (math_equal's isclose(rel_tol=1e-4)), so a decimal rounded to four or five digits (0.3333, 3.1416) equals
// the exact value. Two whole numbers compare exactly instead (Qwen's would take 1000000 for 1000001).
inline constexpr long double numeric_relative_tolerance = 1e-4L;

namespace detail {

inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

inline void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  for (std::size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
}

// The index just past the '}' that closes the '{' at `open`, or npos when it is never closed.
inline std::size_t close_brace(std::string_view s, std::size_t open) {
  int depth = 0;
  for (std::size_t i = open; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size() && (s[i + 1] == '{' || s[i + 1] == '}')) {
      ++i;  // an escaped brace does not count
      continue;
    }
    if (s[i] == '{') ++depth;
    else if (s[i] == '}' && --depth == 0) return i + 1;
  }
  return std::string_view::npos;
}

// A command name ends at the first non-letter: "\boxed{" is \boxed, "\boxedx" is not.
inline bool command_at(std::string_view s, std::size_t pos, std::string_view name) {
  if (s.substr(pos, name.size()) != name) return false;
  const std::size_t end = pos + name.size();
  return end >= s.size() || !std::isalpha(static_cast<unsigned char>(s[end]));
}

// Replaces every \cmd{X} (balanced) by X; with keep = false drops it entirely.
inline void unwrap_command(std::string& s, std::string_view cmd, bool keep) {
  for (std::size_t pos = s.find(cmd); pos != std::string::npos; pos = s.find(cmd, pos)) {
    if (!command_at(s, pos, cmd)) {
      pos += cmd.size();
      continue;
    }
    std::size_t open = pos + cmd.size();
    while (open < s.size() && s[open] == ' ') ++open;
    if (open >= s.size() || s[open] != '{') {
      pos += cmd.size();
      continue;
    }
    const std::size_t end = close_brace(s, open);
    if (end == std::string::npos) return;
    const std::string inner = keep ? s.substr(open + 1, end - open - 2) : std::string{};
    s.replace(pos, end - pos, inner);
  }
}

// One argument of \frac or \sqrt written without braces: a single character (\frac12, \sqrt2) or a
// braced group. Returns the argument's text and advances `i`; nullopt when there is none.
inline std::optional<std::string> latex_argument(const std::string& s, std::size_t& i) {
  while (i < s.size() && s[i] == ' ') ++i;
  if (i >= s.size()) return std::nullopt;
  if (s[i] == '{') {
    const std::size_t end = close_brace(s, i);
    if (end == std::string::npos) return std::nullopt;
    std::string arg = s.substr(i + 1, end - i - 2);
    i = end;
    return arg;
  }
  if (s[i] == '\\' || s[i] == '}') return std::nullopt;
  return std::string(1, s[i++]);
}

// \frac12 -> \frac{1}{2}, \frac1{x} -> \frac{1}{x}, \binom52 -> \binom{5}{2}, \sqrt2 -> \sqrt{2}, \sqrt[3]8 ->
// \sqrt[3]{8} (the index was read as the argument: \sqrt{[}3]8). Arguments nested deeper than max_brace_depth are
// left as written: a model's output may nest \frac thousands deep, which would overflow the stack here and take time
// quadratic in the depth.
inline constexpr int max_brace_depth = 64;

// The constants the answer parsers (closed_form, complex_form) evaluate \pi and Euler's e to.
inline constexpr long double pi = 3.141592653589793238462643383279502884L;
inline constexpr long double euler = 2.718281828459045235360287471352662498L;

// A parser's recursion depth, counted while the guard lives: past max_brace_depth a group, sign or function does not
// parse (a model's output may nest thousands deep: no stack overflow).
struct nesting {
  int& depth;
  explicit nesting(int& d) : depth(++d) {}
  ~nesting() { --depth; }
  nesting(const nesting&) = delete;
  nesting& operator=(const nesting&) = delete;
  [[nodiscard]] bool too_deep() const { return depth > max_brace_depth; }
};

inline std::string brace_arguments(const std::string& s, int depth = 0) {
  if (depth >= max_brace_depth) return s;
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    const bool binom = command_at(s, i, "\\binom");
    const bool frac = binom || command_at(s, i, "\\frac"), sqrt = command_at(s, i, "\\sqrt");
    if (!frac && !sqrt) {
      out += s[i++];
      continue;
    }
    const std::size_t start = i;
    i += binom ? 6 : 5;  // \frac and \sqrt are five characters, \binom six
    std::size_t j = i;
    std::string index;  // \sqrt[3]{x}'s "[3]", kept as written
    if (sqrt && j < s.size() && s[j] == '[') {
      const std::size_t close = s.find(']', j);
      if (close == std::string::npos) {
        out.append(s, start, i - start);
        continue;
      }
      index.append("[").append(brace_arguments(s.substr(j + 1, close - j - 1), depth + 1)).append("]");
      j = close + 1;
    }
    auto a = latex_argument(s, j);
    std::optional<std::string> b;
    if (a && frac) b = latex_argument(s, j);
    if (!a || (frac && !b)) {  // leave it as written
      out.append(s, start, i - start);
      continue;
    }
    out += frac ? (binom ? "\\binom{" : "\\frac{") + brace_arguments(*a, depth + 1) + "}{" +
                      brace_arguments(*b, depth + 1) + "}"
                : "\\sqrt" + index + "{" + brace_arguments(*a, depth + 1) + "}";
    i = j;
  }
  return out;
}

// An exponent of ten: [+-]digits, at most four of them. nullopt otherwise.
inline std::optional<int> parse_exponent(std::string_view s) {
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  if (s.empty() || s.size() > 4) return std::nullopt;
  int e = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    e = e * 10 + (c - '0');
  }
  return negative ? -e : e;
}

// mantissa x 10^exponent, when both parsed and the product is a finite double; nullopt otherwise.
inline std::optional<long double> times_power_of_ten(std::optional<long double> mantissa, std::optional<int> exponent) {
  if (!mantissa || !exponent) return std::nullopt;
  const long double v = *mantissa * std::pow(10.0L, static_cast<long double>(*exponent));
  if (!std::isfinite(static_cast<double>(v))) return std::nullopt;
  return v;
}

// A plain decimal number: [+-]digits[.digits] or [+-].digits, optionally in scientific notation (1.5e3, 2E-4).
inline std::optional<long double> parse_decimal(std::string_view s) {
  if (const std::size_t e = s.find_first_of("eE"); e != std::string_view::npos) {
    const auto mantissa = e > 0 && s.find_first_of("eE", e + 1) == std::string_view::npos
                              ? parse_decimal(s.substr(0, e)) : std::nullopt;
    return times_power_of_ten(mantissa, parse_exponent(s.substr(e + 1)));
  }
  if (s.empty()) return std::nullopt;
  std::size_t i = 0;
  bool negative = false;
  if (s[0] == '+' || s[0] == '-') {
    negative = s[0] == '-';
    i = 1;
  }
  long double value = 0, scale = 1;
  bool digits = false, point = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c >= '0' && c <= '9') {
      digits = true;
      if (point) {
        scale /= 10;
        value += (c - '0') * scale;
      } else {
        value = value * 10 + (c - '0');
      }
    } else if (c == '.' && !point) {
      point = true;
    } else {
      return std::nullopt;
    }
  }
  if (!digits || !std::isfinite(static_cast<double>(value))) return std::nullopt;
  return negative ? -value : value;
}

// A number: a decimal, a/b, \frac{a}{b} or -\frac{a}{b} with decimal a and b (b != 0), or a decimal times a power
// of ten (1.5\times10^{3}, 2\cdot10^-4; spaces are gone by now).
inline std::optional<long double> parse_number(std::string_view s) {
  if (auto d = parse_decimal(s)) return d;
  for (std::string_view times : {std::string_view("\\times10^"), std::string_view("\\cdot10^")}) {
    const std::size_t at = s.find(times);
    if (at == std::string_view::npos) continue;
    std::string_view power = s.substr(at + times.size());
    if (power.size() >= 2 && power.front() == '{' && power.back() == '}') power = power.substr(1, power.size() - 2);
    return times_power_of_ten(parse_decimal(s.substr(0, at)), parse_exponent(power));
  }
  bool negative = false;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  std::optional<long double> num, den;
  if (s.substr(0, 6) == "\\frac{") {
    const std::size_t a_end = close_brace(s, 5);
    if (a_end == std::string_view::npos || a_end >= s.size() || s[a_end] != '{') return std::nullopt;
    const std::size_t b_end = close_brace(s, a_end);
    if (b_end != s.size()) return std::nullopt;
    num = parse_decimal(s.substr(6, a_end - 7));
    den = parse_decimal(s.substr(a_end + 1, b_end - a_end - 2));
  } else if (const std::size_t slash = s.find('/'); slash != std::string_view::npos) {
    if (!s.empty() && (s[0] == '-' || s[0] == '+')) return std::nullopt;  // "--1/2"
    num = parse_decimal(s.substr(0, slash));
    den = parse_decimal(s.substr(slash + 1));
  }
  if (!num || !den || *den == 0) return std::nullopt;
  const long double v = *num / *den;
  return negative ? -v : v;
}

// [+-]d{1,3}(,ddd)+[.d*]: a number written with thousands separators.
inline bool has_thousands_separators(std::string_view s) {
  std::size_t i = (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
  std::size_t lead = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++lead;
  if (lead < 1 || lead > 3 || i >= s.size() || s[i] != ',') return false;
  while (i < s.size() && s[i] == ',') {
    ++i;
    for (int k = 0; k < 3; ++k, ++i)
      if (i >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  if (i == s.size()) return true;
  if (s[i] != '.') return false;
  for (++i; i < s.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  return true;
}

// LaTeX spacing -> " ": "\ " (a control space), "\,", "\;", "\:", "\quad", "\qquad" and the tie "~", as they
// render, so "5\,\mathrm{cm}" is "5 cm" (a unit) and "2\,000" is "2 000" (spaces go later). A row break "\\" is
// kept whole: its second backslash does not start a control space, so "\begin{pmatrix} 1 \\ 2 \end{pmatrix}" and
// "\begin{pmatrix}1\\2\end{pmatrix}" agree.
inline std::string replace_spacing(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '~') {
      out += ' ';
      continue;
    }
    if (s[i] != '\\' || i + 1 >= s.size()) {
      out += s[i];
      continue;
    }
    const char next = s[i + 1];
    if (next == '\\') {
      out += "\\\\";
      ++i;
    } else if (next == ' ' || next == ',' || next == ';' || next == ':') {
      out += ' ';
      ++i;
    } else if (command_at(s, i, "\\quad") || command_at(s, i, "\\qquad")) {
      out += ' ';
      i += s[i + 1] == 'q' && s[i + 2] == 'q' ? 6 : 5;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The end of the text group \text{...} / \textrm{...} / \mbox{...} at `pos` (spaces allowed before the brace),
// the length of its command in `name`; npos when none starts there or it is never closed.
inline std::size_t text_group_end(std::string_view s, std::size_t pos, std::size_t& name) {
  for (std::string_view cmd : {"\\text", "\\textrm", "\\mbox"}) {
    if (!command_at(s, pos, cmd)) continue;
    std::size_t open = pos + cmd.size();
    while (open < s.size() && s[open] == ' ') ++open;
    if (open >= s.size() || s[open] != '{') return std::string_view::npos;
    name = open - pos;
    return close_brace(s, open);
  }
  return std::string_view::npos;
}

// Past an exponent "^2" / "^{2}" at `i` (a unit's: "cm^2"), else i.
inline std::size_t skip_exponent(std::string_view s, std::size_t i) {
  if (i >= s.size() || s[i] != '^') return i;
  if (i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1]))) return i + 2;
  if (i + 1 < s.size() && s[i + 1] == '{') {
    const std::size_t end = close_brace(s, i + 1);
    if (end == std::string_view::npos || end == i + 3) return i;
    for (std::size_t k = i + 2; k + 1 < end; ++k)
      if (!std::isdigit(static_cast<unsigned char>(s[k]))) return i;
    return end;
  }
  return i;
}

// The length of the word "percent" or "per cent" (any case, spaces between "per" and "cent") at `i`, 0 when none
// starts there or it is part of a longer word ("percentage", "percentile").
inline std::size_t percent_word_at(std::string_view s, std::size_t i) {
  auto letter = [&](std::size_t k) { return k < s.size() && std::isalpha(static_cast<unsigned char>(s[k])) != 0; };
  auto word = [&](std::size_t k, std::string_view w) {
    if (k + w.size() > s.size()) return false;
    for (std::size_t j = 0; j < w.size(); ++j)
      if (std::tolower(static_cast<unsigned char>(s[k + j])) != w[j]) return false;
    return true;
  };
  if ((i > 0 && letter(i - 1)) || !word(i, "per")) return 0;
  std::size_t end = i + 3;
  if (word(end, "cent")) {
    end += 4;
  } else {
    while (end < s.size() && s[end] == ' ') ++end;
    if (end == i + 3 || !word(end, "cent")) return 0;
    end += 4;
  }
  return letter(end) ? 0 : end - i;
}

// "50 percent", "50 per cent", "50\text{ percent}" -> "50%": the word after a number is the sign, so that it reads as
// 50 or 0.5 as "50\%" does (it was a unit word that went, leaving 50 only). A number is a digit or a closing brace
// ("\frac{1}{2} percent") before the spaces; elsewhere the word stays ("a percent").
inline std::string percent_words(std::string s) {
  std::size_t name = 0;
  for (std::size_t i = s.find('\\'); i != std::string::npos; i = s.find('\\', i + 1)) {
    const std::size_t end = text_group_end(s, i, name);  // a group that holds the word alone: the word
    if (end == std::string::npos) continue;
    const std::string_view content = trim(std::string_view(s).substr(i + name + 1, end - i - name - 2));
    if (!content.empty() && percent_word_at(content, 0) == content.size()) {
      std::string word(1, ' ');
      s.replace(i, end - i, word.append(content));
    }
  }
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t length = percent_word_at(s, i);
    std::size_t kept = out.size();
    while (kept > 0 && is_space(out[kept - 1])) --kept;
    if (length > 0 && kept > 0 && (std::isdigit(static_cast<unsigned char>(out[kept - 1])) || out[kept - 1] == '}')) {
      out.resize(kept);
      out += '%';
      i += length;
      continue;
    }
    out += s[i++];
  }
  return out;
}

// \text{...} (or \textrm, \mbox): the whole answer is its content ("\text{Evelyn}"); a group that ends the answer
// (with an exponent, spaces and "." after it) following a number or an expression is a unit and goes
// ("5\text{ cm}", "15\mbox{ cm}^2", "\frac{270}7\text{ degrees}"); every other group is its content, so
// "\text{A}, \text{C}" is "A, C" and "5 \text{ and } 6" is "5 and 6".
inline std::string resolve_text_groups(const std::string& s) {
  struct group {
    std::size_t start, name, end;
  };
  std::vector<group> groups;
  for (std::size_t i = 0; i < s.size(); ++i) {
    std::size_t name = 0;
    if (s[i] != '\\') continue;
    if (i + 1 < s.size() && s[i + 1] == '\\') {  // a row break "\\\\", not a command
      ++i;
      continue;
    }
    const std::size_t end = text_group_end(s, i, name);
    if (end == std::string::npos) continue;
    groups.push_back({i, name, end});
    i = end - 1;
  }
  auto content = [&](const group& g) { return s.substr(g.start + g.name + 1, g.end - g.start - g.name - 2); };
  if (groups.empty()) return s;
  const std::string_view whole = trim(s);
  if (groups.size() == 1 && whole.size() == groups[0].end - groups[0].start &&
      whole.data() == s.data() + groups[0].start)
    return content(groups[0]);
  // The last group is a unit when only an exponent, spaces and "." follow it, and what comes before it (other
  // groups read as their content) ends with a value and holds a digit or a command.
  const group& last = groups.back();
  std::size_t after = skip_exponent(s, last.end);
  while (after < s.size() && (is_space(s[after]) || s[after] == '.')) ++after;
  std::string head;
  std::size_t at = 0;
  for (std::size_t k = 0; k + 1 < groups.size(); ++k) {
    head.append(s, at, groups[k].start - at);
    head += content(groups[k]);
    at = groups[k].end;
  }
  head.append(s, at, last.start - at);
  const std::string_view before = trim(head);
  const bool value_end = !before.empty() && (std::isalnum(static_cast<unsigned char>(before.back())) ||
                                              std::string_view("})].%").find(before.back()) != std::string_view::npos);
  const bool unit = after == s.size() && value_end && before.find_first_of("0123456789\\") != std::string_view::npos;
  if (unit) return head + s.substr(skip_exponent(s, last.end));
  return head + content(last) + s.substr(last.end);
}

// The functions closed_form evaluates, as TeX commands (closed_form's function_id numbers them in this order).
inline constexpr std::array<std::string_view, 15> math_function_commands = {
    "\\sin", "\\cos", "\\tan", "\\cot", "\\sec", "\\csc", "\\arcsin", "\\arccos", "\\arctan",
    "\\sinh", "\\cosh", "\\tanh", "\\ln", "\\log", "\\exp"};

// The functions of whole numbers closed_form evaluates, written \gcd(a, b) and \lcm(a, b) (LaTeX has no \lcm: it is
// what \operatorname{lcm}, \text{lcm} and \mathrm{lcm} become).
inline constexpr std::array<std::string_view, 2> whole_function_commands = {"\\gcd", "\\lcm"};

// \operatorname{sin} (or \operatorname*{sin}, \mathrm{sin}, \text{sin}) -> "\sin ", for every function closed_form
// evaluates; the space keeps the name apart from a letter after it ("\operatorname{sin}x" is \sin x, not \sinx).
inline std::string function_commands(std::string s) {
  for (std::string_view wrapper : {"\\operatorname{", "\\operatorname*{", "\\mathrm{", "\\text{"}) {
    if (s.find(wrapper) == std::string::npos) continue;
    auto rewrite = [&](std::string_view command) {
      const std::string_view name = command.substr(1);
      replace_all(s, std::string(wrapper).append(name).append("}"), std::string("\\").append(name).append(" "));
    };
    std::for_each(math_function_commands.begin(), math_function_commands.end(), rewrite);
    std::for_each(whole_function_commands.begin(), whole_function_commands.end(), rewrite);
  }
  return s;
}

// Degrees in an answer with a trigonometric function, as normalisation writes them: closed_form reads x^{\circ} as
// x\pi/180.
inline constexpr std::string_view degree_mark = "^{\\circ}";

// Whether a normalised answer holds a trigonometric function (\sin ... \csc), whose argument in degrees
// ("\sin 30^\circ") is an angle to convert rather than a unit to drop.
inline bool has_trigonometric_function(std::string_view s) {
  for (std::size_t i = s.find('\\'); i != std::string_view::npos; i = s.find('\\', i + 1))
    for (std::size_t f = 0; f < 6; ++f)  // \sin \cos \tan \cot \sec \csc, the first six
      if (command_at(s, i, math_function_commands[f])) return true;
  return false;
}

// Whether `s` ends with a command's name ("2\cdot", "\pi"): letters after a backslash.
inline bool command_name_ends(std::string_view s) {
  std::size_t i = s.size();
  while (i > 0 && std::isalpha(static_cast<unsigned char>(s[i - 1]))) --i;
  return i < s.size() && i > 0 && s[i - 1] == '\\' && (i < 2 || s[i - 2] != '\\');
}

// A whole number of at most nine digits (so that whole * denominator + numerator fits), nullopt otherwise.
inline std::optional<long long> small_whole(std::string_view s) {
  if (s.empty() || s.size() > 9) return std::nullopt;
  long long v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

// A mixed number, MATH's way of writing 3½: a whole number, then (spaces allowed) \frac{a}{b}, or a space and a/b,
// with whole numbers 0 < a < b. Returned as one improper fraction, "3\frac{1}{2}" -> "\frac{7}{2}", so that it equals
// 7/2 and 3.5; once the spaces go, "3\frac{1}{2}" would read as a product and "3 1/2" as 31/2. nullopt for anything
// else ("3\frac{4}{2}", "2\frac{\pi}{3}", "1.5\frac{1}{2}"), which stays as written. A percentage keeps its sign:
// "12\frac{1}{2}%" -> "\frac{25}{2}%".
inline std::optional<std::string> mixed_number(std::string_view s) {
  s = trim(s);
  while (!s.empty() && s.back() == '.') s.remove_suffix(1);  // a sentence's full stop: "3\frac{1}{2}."
  const bool percent = !s.empty() && s.back() == '%';
  if (percent) s = trim(s.substr(0, s.size() - 1));
  const bool negative = !s.empty() && s[0] == '-';
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  const std::size_t digits = std::min(s.find_first_not_of("0123456789"), s.size());
  const auto whole = small_whole(s.substr(0, digits));
  std::string_view rest = s.substr(digits);
  const bool spaced = !rest.empty() && is_space(rest.front());
  rest = trim(rest);
  std::string_view num, den;
  if (rest.substr(0, 6) == "\\frac{") {
    const std::size_t a_end = close_brace(rest, 5);
    if (a_end == std::string_view::npos || a_end >= rest.size() || rest[a_end] != '{') return std::nullopt;
    if (close_brace(rest, a_end) != rest.size()) return std::nullopt;
    num = rest.substr(6, a_end - 7);
    den = rest.substr(a_end + 1, rest.size() - a_end - 2);
  } else if (const std::size_t slash = rest.find('/'); spaced && slash != std::string_view::npos) {
    num = trim(rest.substr(0, slash));
    den = trim(rest.substr(slash + 1));
  }
  const auto a = small_whole(trim(num)), b = small_whole(trim(den));
  if (!whole || !a || !b || *a == 0 || *a >= *b) return std::nullopt;
  return std::string(negative ? "-" : "") + "\\frac{" + std::to_string(*whole * *b + *a) + "}{" +
         std::to_string(*b) + "}" + (percent ? "%" : "");
}

// The start of the unit word that ends at `i`: letters, with "/" between letters ("m/s", "km/h"); i when none.
inline std::size_t unit_word_start(std::string_view s, std::size_t i) {
  auto letter = [&](std::size_t k) { return std::isalpha(static_cast<unsigned char>(s[k])) != 0; };
  std::size_t j = i;
  while (j > 0 && (letter(j - 1) || (s[j - 1] == '/' && j < i && letter(j) && j >= 2 && letter(j - 2)))) --j;
  return j;
}

// "18 dollars", "3 square feet.", "12 cm", "15 cm^2", "5 m/s": a number followed by words of letters (a "/" between
// letters allowed) -> the number.
inline std::string drop_unit_words(const std::string& s) {
  std::size_t end = s.size();
  while (end > 0 && s[end - 1] == '.') --end;
  if (end >= 2 && s[end - 2] == '^' && std::isdigit(static_cast<unsigned char>(s[end - 1])) && end >= 3 &&
      std::isalpha(static_cast<unsigned char>(s[end - 3])))
    end -= 2;  // a unit's exponent: "cm^2"
  std::size_t i = end;
  bool words = false;
  while (i > 0) {
    const std::size_t j = unit_word_start(s, i);
    if (j == i || j == 0 || s[j - 1] != ' ' || s.compare(j, i - j, "i") == 0) break;  // "3 i" is 3i, not 3
    words = true;
    i = j;
    while (i > 0 && s[i - 1] == ' ') --i;
  }
  if (!words) return s;
  std::string head(trim(std::string_view(s).substr(0, i)));
  std::string compact;
  for (char c : head)
    if (c != ',' && c != '$' && c != ' ' && c != '%') compact += c;  // "1 000 dollars", "25% of them" too
  return parse_number(compact) || mixed_number(brace_arguments(head)) ? head : s;
}

// An integer written out ([+-]digits): its digits without leading zeros, "-" first when negative and not zero;
// nullopt otherwise. Compared as text, so integers longer than long double's 19 digits stay exact.
inline std::optional<std::string> integer_digits(std::string_view s) {
  const bool negative = !s.empty() && s[0] == '-';
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  if (s.empty() || s.find_first_not_of("0123456789") != std::string_view::npos) return std::nullopt;
  s.remove_prefix(std::min(s.find_first_not_of('0'), s.size() - 1));
  std::string out(negative && s != "0" ? 1 : 0, '-');
  return out.append(s);
}

// Where an expression with variables is evaluated: at expression_points points, of which at least
// min_expression_points must be defined on both sides (\sqrt{x} is not at x < 0) for a verdict.
inline constexpr int expression_points = 16;
inline constexpr int min_expression_points = 3;

// A variable's value at point k: pseudo-random from its name and k with a fixed seed, so that x takes the same value
// on both sides and a grade never changes between runs. Never a whole number (x^2 and |x|, or (-1)^n and 1, agree at
// some of those), of either sign (\sqrt{x^2} and x agree at x > 0), and of magnitude 0.25 to 3, below 1 too
// (x^{10} + 1 and x^{10} are within the tolerance for large x).
inline long double variable_value(std::string_view name, int point) {
  std::uint64_t z = 14695981039346656037ULL;  // FNV-1a of the name, then splitmix64 with the point
  for (char c : name) z = (z ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  z += 0x9E3779B97F4A7C15ULL * static_cast<std::uint64_t>(point + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  long double magnitude = 0.25L + 2.75L * static_cast<long double>(z >> 11) / 9007199254740992.0L;
  if (magnitude == std::floor(magnitude)) magnitude += 0.125L;
  return (z & 1) != 0 ? -magnitude : magnitude;
}

// A closed form, normalised (no spaces but one after a command before a letter: "\pi r"): decimals, \pi, \frac{a}{b},
// \sqrt{x}, \sqrt[n]{x}, a^{b} (or a^d with one digit d), |x|, + - * / \cdot \times \div, parentheses and braces, and
// products written side by side when the right factor is a command, a parenthesis or a bar (2\sqrt{2}, 2\pi,
// \frac{1}{2}\pi, 3(4), 2|x|). With a point, also variables: a letter, with a subscript of letters and digits or not
// (x, a_1, a_{n}, written side by side: 2xy, x^2y, x(x+1)), whose value is variable_value; an exponent may be one
// letter (2^n). Functions (\sin x, \sin(2x), \sin^2 x, \sin^{-1} x, \log_2 8, \ln x, \exp x: see function()),
// \binom{n}{k}, {n \choose k} and n! (whole arguments only). e without a subscript is Euler's number (as Qwen's grader
// reads it), with a point or not; i is a variable like any other letter (as the imaginary unit: complex_form). Not
// parsed: \infty, "2^10" (2^1 then 0 in TeX), a number right before \frac{a}{b} of numbers ("3\frac{4}{2}": a mixed
// number or a product?), a factor after a closing command ("\sqrt{2}3", "x2"), "5!!", nesting deeper than
// max_brace_depth; without a point, any letter but e. Also \gcd(a, b, ...) and \lcm(a, b, ...) of whole numbers,
// \lfloor x \rfloor, \lceil x \rceil, and x^{\circ} (degrees, as normalisation writes them beside a trigonometric
// function) as x\pi/180.
class closed_form {
 public:
  // point < 0: numbers only.
  explicit closed_form(std::string_view s, int point = -1) : s_(s), point_(point) {}
  // The value when the whole text parses and is finite; nullopt otherwise (also for a root of a negative number or a
  // division by zero).
  std::optional<long double> value() {
    const auto v = evaluate();
    if (!v || !std::isfinite(static_cast<double>(*v))) return std::nullopt;
    return v;
  }
  // nullopt when the text does not parse; NaN when it does but has no finite value at this point (\sqrt{x} at x < 0),
  // which says nothing about the text, only about the point.
  std::optional<long double> evaluate() {
    const auto v = sum();
    if (!v || pos_ != s_.size()) return std::nullopt;
    return v;
  }
  // Whether the text (as far as it was read) has a variable.
  bool has_variables() const { return variables_; }

 private:
  static constexpr long double undefined = std::numeric_limits<long double>::quiet_NaN();
  // Not finite as a double: undefined. NaN in, NaN out also where the C library would not (pow(NaN, 0) is 1).
  static long double finite(long double v) { return std::isfinite(static_cast<double>(v)) ? v : undefined; }
  // A sum this small next to its terms is zero (rounding; see sum()); so is \sin(\pi), which is about 1e-19.
  static constexpr long double cancellation = 1e-15L;
  static long double snap(long double v, long double argument) {
    return std::fabs(v) <= cancellation * std::fmax(1, std::fabs(argument)) ? 0 : v;
  }
  // n! of a whole 0 <= n <= 170 (171! overflows a double); undefined for anything else (a negative or fractional n:
  // the gamma function is not assumed).
  static long double factorial(long double n) {
    if (std::isnan(n) || n < 0 || n != std::floor(n) || n > 170) return undefined;
    long double v = 1;
    for (int i = 2; i <= static_cast<int>(n); ++i) v *= i;
    return finite(v);
  }
  // C(n, k) of whole numbers, n >= 0: 0 when k < 0 or k > n (as SymPy's binomial); undefined for a negative or
  // fractional n or k, or a value that overflows. Exact while it stays below 2^64: each step is a binomial itself.
  static long double binomial(long double n, long double k) {
    if (std::isnan(n) || std::isnan(k) || n < 0 || n != std::floor(n) || k != std::floor(k)) return undefined;
    if (k < 0 || k > n) return 0;
    k = std::fmin(k, n - k);
    long double v = 1;
    for (long double i = 1; i <= k && std::isfinite(static_cast<double>(v)); ++i) v = v * (n - k + i) / i;
    return finite(v);
  }
  // gcd or lcm of whole numbers a, b with |a|, |b| <= max_whole_argument (beyond, a long double is no longer exact):
  // Euclid's algorithm; gcd(0, 0) = 0 and lcm(a, 0) = 0, as SymPy's. Signs go: gcd(-4, 6) = 2.
  static constexpr long double max_whole_argument = 1e18L;
  static long double gcd_or_lcm(long double a, long double b, bool lcm) {
    a = std::fabs(a);
    b = std::fabs(b);
    long double x = a, y = b;
    while (y != 0) {
      const long double remainder = std::fmod(x, y);
      x = y;
      y = remainder;
    }
    if (!lcm) return x;
    return x == 0 ? 0 : finite(a / x * b);
  }
  // The arguments of \gcd or \lcm (already eaten): "(" two or more sums separated by "," ")", all whole numbers;
  // nullopt for anything else (a variable's value is never whole), which then compares as written.
  std::optional<long double> whole_function(bool lcm) {
    if (!eat("(")) return std::nullopt;
    std::optional<long double> v;
    int count = 0;
    do {
      const auto x = sum();
      if (!x || std::isnan(*x) || *x != std::floor(*x) || std::fabs(*x) > max_whole_argument) return std::nullopt;
      v = count++ == 0 ? std::fabs(*x) : gcd_or_lcm(*v, *x, lcm);
    } while (eat(","));
    if (count < 2 || !eat(")")) return std::nullopt;
    return v;
  }
  // \lfloor x \rfloor or \lceil x \rceil (the opening command eaten), up to `close`. A value within rounding of a
  // whole number is that number first: \lfloor\log_2 8\rfloor is 3 though the logarithm comes out as 2.99...
  std::optional<long double> rounded(std::string_view close, bool up) {
    const auto x = sum();
    if (!x || !eat(close)) return std::nullopt;
    const long double nearest = std::round(*x);
    if (std::fabs(*x - nearest) <= cancellation * std::fmax(1, std::fabs(*x))) return nearest;
    return up ? std::ceil(*x) : std::floor(*x);
  }
  // The functions, as \name (the operatorname forms were rewritten to these by the normalisation).
  static constexpr const auto& function_names = math_function_commands;
  enum function_id { f_sin, f_cos, f_tan, f_cot, f_sec, f_csc, f_arcsin, f_arccos, f_arctan, f_sinh, f_cosh, f_tanh,
                     f_ln, f_log, f_exp };
  int function_at() const {
    if (pos_ >= s_.size() || s_[pos_] != '\\') return -1;
    for (std::size_t f = 0; f < function_names.size(); ++f)
      if (command_at(s_, pos_, function_names[f])) return static_cast<int>(f);
    return -1;
  }
  static long double apply(int f, long double x) {
    switch (f) {
      case f_sin: return snap(std::sin(x), x);
      case f_cos: return snap(std::cos(x), x);
      case f_tan: {  // undefined where cos is 0 (\tan\frac{\pi}{2} would be about 1e19, not two equal values)
        const long double c = snap(std::cos(x), x);
        return c == 0 ? undefined : snap(std::sin(x), x) / c;
      }
      case f_cot: {
        const long double t = snap(std::sin(x), x);
        return t == 0 ? undefined : snap(std::cos(x), x) / t;
      }
      case f_sec: {
        const long double c = snap(std::cos(x), x);
        return c == 0 ? undefined : 1 / c;
      }
      case f_csc: {
        const long double t = snap(std::sin(x), x);
        return t == 0 ? undefined : 1 / t;
      }
      case f_arcsin: return std::asin(x);  // NaN outside [-1, 1]: undefined
      case f_arccos: return std::acos(x);
      case f_arctan: return std::atan(x);
      case f_sinh: return std::sinh(x);
      case f_cosh: return std::cosh(x);
      case f_tanh: return std::tanh(x);
      case f_exp: return std::exp(x);
      default: return x > 0 ? std::log(x) : undefined;  // \ln, and \log without a base (natural, as SymPy's)
    }
  }
  // A sub- or superscript: "{...}", one digit, or one letter (with a point).
  std::optional<long double> script() {
    if (pos_ < s_.size() && s_[pos_] == '{') return group();
    if (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) return s_[pos_++] - '0';
    if (letter_next()) return variable();
    return std::nullopt;
  }
  // A function at pos_: \name, for \log a base "_b" or "_{...}", a power "^2" or "^{...}" of the value ("\sin^2 x" is
  // (\sin x)^2; "^{-1}" of a trigonometric or hyperbolic one is its inverse, \sin^{-1} x = \arcsin x, and of \ln, \log
  // or \exp does not parse), then the argument: a group in parentheses or braces (\sin(2x), \sin{x}), or factors
  // side by side up to the next operator or function (\sin 2x, \sin x^2 = \sin(x^2), \sin x\cos x).
  std::optional<long double> function(int f) {
    const nesting level(depth_);
    if (level.too_deep()) return std::nullopt;
    eat(function_names[static_cast<std::size_t>(f)]);
    std::optional<long double> base, exponent;
    if (f == f_log && eat("_") && !(base = script())) return std::nullopt;
    bool inverse = false;
    if (eat("^")) {
      inverse = s_.substr(pos_, 4) == "{-1}";
      // Only sin, cos, tan and the hyperbolic ones have an inverse here (not \cot^{-1}, \arcsin^{-1}, \ln^{-1}).
      if (inverse && !(f <= f_tan || (f >= f_sinh && f <= f_tanh))) return std::nullopt;
      if (inverse) pos_ += 4;
      else if (!(exponent = script())) return std::nullopt;
    }
    std::optional<long double> x;
    if (pos_ < s_.size() && (s_[pos_] == '(' || s_[pos_] == '{')) {
      x = s_[pos_] == '(' ? group('(', ')') : group();
    } else {
      x = signed_factor();
      while (x && factor_next(false)) {
        if (literal_ && plain_fraction_next()) return std::nullopt;
        const auto r = power();
        if (!r) return std::nullopt;
        x = finite(*x * *r);
      }
    }
    literal_ = factorial_ = false;
    if (!x || ((exponent || inverse) && pos_ < s_.size() && s_[pos_] == '^')) return std::nullopt;
    if (std::isnan(*x) || (base && std::isnan(*base))) return undefined;
    long double v;
    if (inverse && f == f_sinh) v = std::asinh(*x);
    else if (inverse && f == f_cosh) v = std::acosh(*x);  // NaN below 1: undefined
    else if (inverse && f == f_tanh) v = std::atanh(*x);
    else if (base) v = *base > 0 && *base != 1 && *x > 0 ? std::log(*x) / std::log(*base) : undefined;
    else v = apply(inverse ? f + (f_arcsin - f_sin) : f, *x);  // \sin^{-1} is \arcsin (checked above: sin, cos, tan)
    v = finite(v);
    if (!exponent || std::isnan(v)) return v;
    if (std::isnan(*exponent) || (v == 0 && *exponent <= 0)) return undefined;
    return finite(std::pow(v, *exponent));
  }
  bool eat(std::string_view token) {
    const bool command = token.size() > 1 && token[0] == '\\';
    if (command ? !command_at(s_, pos_, token) : s_.substr(pos_, token.size()) != token) return false;
    pos_ += token.size();
    if (command && pos_ < s_.size() && s_[pos_] == ' ') ++pos_;  // the space normalisation keeps: "\cdot x"
    return true;
  }
  // A letter (with a point), or Euler's e without a subscript (a number, so also without one).
  bool letter_next() const {
    if (pos_ >= s_.size() || !std::isalpha(static_cast<unsigned char>(s_[pos_]))) return false;
    return point_ >= 0 || (s_[pos_] == 'e' && (pos_ + 1 >= s_.size() || s_[pos_ + 1] != '_'));
  }
  // "{" expr "}" (or the given brackets).
  std::optional<long double> group(char open = '{', char close = '}') {
    if (!eat(std::string_view(&open, 1))) return std::nullopt;
    const auto v = sum();
    if (!v || !eat(std::string_view(&close, 1))) return std::nullopt;
    return v;
  }
  std::optional<long double> sum() {
    auto v = product();
    while (v && pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) {
      const bool minus = s_[pos_++] == '-';
      const auto r = product();
      if (!r) return std::nullopt;
      const long double total = finite(minus ? *v - *r : *v + *r);
      // Equal terms that came by other roundings cancel to zero (\sin(2x) - 2\sin x\cos x): what is left is far
      // below any written difference, and a relative tolerance could never take it for 0.
      v = std::fabs(total) <= cancellation * std::fmax(std::fabs(*v), std::fabs(*r)) ? 0 : total;
    }
    return v;
  }
  // \frac{a}{b} with a and b plain decimals at pos_: after a number, MATH's mixed number (3\frac{1}{2} is 3.5; the
  // proper ones were rewritten before) or a product; neither is assumed.
  bool plain_fraction_next() const {
    if (!command_at(s_, pos_, "\\frac")) return false;
    const std::size_t a = pos_ + 5, a_end = close_brace(s_, a);
    if (a >= s_.size() || s_[a] != '{' || a_end == std::string_view::npos || a_end >= s_.size()) return false;
    const std::size_t b_end = close_brace(s_, a_end);
    return b_end != std::string_view::npos && parse_decimal(s_.substr(a + 1, a_end - a - 2)) &&
           parse_decimal(s_.substr(a_end + 1, b_end - a_end - 2));
  }
  // Whether a factor written side by side starts at pos_: a parenthesis, \pi, \frac, \sqrt, \binom, a letter, a bar
  // (inside |...| a bar closes: "|x|y" is |x| times y, "|x|y|" does not parse), a function (unless `functions` is
  // false: \sin x\cos x is \sin x times \cos x), or a number right after a factorial (2!4!).
  bool factor_next(bool functions) const {
    if (pos_ >= s_.size()) return false;
    auto command = [&](std::string_view name) { return command_at(s_, pos_, name); };
    return s_[pos_] == '(' || command("\\pi") || command("\\frac") || command("\\sqrt") || command("\\binom") ||
           command("\\gcd") || command("\\lcm") || command("\\lfloor") || command("\\lceil") || letter_next() ||
           (s_[pos_] == '|' && bars_ == 0) || (functions && function_at() >= 0) ||
           (factorial_ && std::isdigit(static_cast<unsigned char>(s_[pos_])));
  }
  std::optional<long double> product() {
    auto v = signed_factor();
    while (v && pos_ < s_.size()) {
      const bool after_literal = literal_;
      if (eat("*") || eat("\\cdot") || eat("\\times")) {
        const auto r = signed_factor();
        if (!r) return std::nullopt;
        v = finite(*v * *r);
      } else if (eat("/") || eat("\\div")) {
        const auto r = signed_factor();
        if (!r) return std::nullopt;
        v = *r == 0 ? undefined : finite(*v / *r);
      } else if (factor_next(true)) {
        if (after_literal && plain_fraction_next()) return std::nullopt;
        const auto r = power();
        if (!r) return std::nullopt;
        v = finite(*v * *r);
      } else {
        break;
      }
    }
    return v;
  }
  std::optional<long double> signed_factor() {
    if (++depth_ > max_brace_depth) return std::nullopt;
    std::optional<long double> v;
    if (eat("-")) {
      if ((v = signed_factor())) v = -*v;
    } else if (eat("+")) {
      v = signed_factor();
    } else {
      v = power();
    }
    --depth_;
    return v;
  }
  std::optional<long double> power() {
    factorial_ = false;
    auto base = primary();
    if (base && pos_ < s_.size() && s_[pos_] == '!') {
      if (++pos_ < s_.size() && s_[pos_] == '!') return std::nullopt;  // 5!!: a double factorial, or a typo
      base = factorial(*base);
      literal_ = false;
      factorial_ = true;
    }
    if (base && eat(degree_mark)) {  // an angle in degrees: 30^{\circ} is \frac{\pi}{6}
      literal_ = factorial_ = false;
      if (pos_ < s_.size() && s_[pos_] == '^') return std::nullopt;
      return finite(*base * pi / 180);
    }
    if (!base || !eat("^")) return base;
    factorial_ = false;
    std::optional<long double> e;
    if (pos_ < s_.size() && s_[pos_] == '{') {
      e = group();
    } else if (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
      e = s_[pos_++] - '0';
      if (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '.'))
        return std::nullopt;  // "2^10": TeX's 2^1 0
    } else if (letter_next()) {
      e = variable();
    }
    literal_ = false;
    if (!e || (pos_ < s_.size() && s_[pos_] == '^')) return std::nullopt;  // a double superscript
    if (std::isnan(*base) || std::isnan(*e) || (*base == 0 && *e <= 0)) return undefined;
    return finite(std::pow(*base, *e));  // NaN for a negative base and a fractional exponent: undefined
  }
  std::optional<long double> primary() {
    if (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '.')) {
      const std::size_t start = pos_;
      while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '.')) ++pos_;
      literal_ = true;
      return parse_decimal(s_.substr(start, pos_ - start));
    }
    const auto v = letter_next() ? variable() : compound();
    literal_ = false;  // whatever the primaries inside it were
    return v;
  }
  // A letter, then "_" and a letter or digit, or "_{...}" of letters and digits; x_1 and x_{1} are one variable.
  std::optional<long double> variable() {
    std::string name(1, s_[pos_++]);
    if (eat("_")) {
      std::size_t end = pos_ + 1;
      if (pos_ < s_.size() && s_[pos_] == '{') end = close_brace(s_, pos_);
      if (end == std::string_view::npos || end > s_.size()) return std::nullopt;
      const std::string_view sub = s_[pos_] == '{' ? s_.substr(pos_ + 1, end - pos_ - 2) : s_.substr(pos_, 1);
      auto alnum = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
      if (sub.empty() || !std::all_of(sub.begin(), sub.end(), alnum)) return std::nullopt;
      name.append("_").append(sub);
      pos_ = end;
    }
    if (name == "e") return euler;  // Euler's number, as Qwen's grader (latex2sympy) reads it; e_1 is a variable
    variables_ = true;
    return variable_value(name, point_);
  }
  std::optional<long double> compound() {
    if (pos_ >= s_.size()) return std::nullopt;
    const char c = s_[pos_];
    if (const int f = function_at(); f >= 0) return function(f);
    if (eat("\\pi")) return pi;
    if (eat("\\gcd")) return whole_function(false);
    if (eat("\\lcm")) return whole_function(true);
    if (eat("\\lfloor")) return rounded("\\rfloor", false);
    if (eat("\\lceil")) return rounded("\\rceil", true);
    if (eat("\\binom")) {
      const auto n = group();
      const auto k = n ? group() : std::nullopt;
      if (!k) return std::nullopt;
      return binomial(*n, *k);
    }
    if (eat("\\frac")) {
      const auto a = group();
      const auto b = a ? group() : std::nullopt;
      if (!b) return std::nullopt;
      return *b == 0 ? undefined : finite(*a / *b);
    }
    if (eat("\\sqrt")) {
      std::optional<long double> index;
      if (pos_ < s_.size() && s_[pos_] == '[' && !(index = group('[', ']'))) return std::nullopt;
      const auto x = group();
      if (!x) return std::nullopt;
      if (std::isnan(*x) || *x < 0) return undefined;
      if (!index) return std::sqrt(*x);
      if (std::isnan(*index) || *index <= 0) return undefined;
      return finite(std::pow(*x, 1 / *index));
    }
    if (c == '(') return group('(', ')');
    if (c == '{') {  // a group, or {n \choose k}
      ++pos_;
      const auto n = sum();
      if (!n) return std::nullopt;
      std::optional<long double> k;
      if (eat("\\choose") && !(k = sum())) return std::nullopt;
      if (!eat("}")) return std::nullopt;
      return k ? binomial(*n, *k) : n;
    }
    if (c == '|') {
      ++bars_;
      const auto v = group('|', '|');
      --bars_;
      if (!v) return std::nullopt;
      return std::fabs(*v);
    }
    return std::nullopt;
  }

  std::string_view s_;
  int point_;
  std::size_t pos_ = 0;
  int depth_ = 0;
  int bars_ = 0;  // |...| open around pos_
  bool literal_ = false;  // the last primary was a number written out
  bool factorial_ = false;  // the last factor ended with "!"
  bool variables_ = false;
};

// A normalised answer's value: a number (parse_number) or a closed form of one; nullopt otherwise.
inline std::optional<long double> number_value(std::string_view s) {
  if (auto v = parse_number(s)) return v;
  return closed_form(s).value();
}

// Whole numbers exactly, anything else within numeric_relative_tolerance (or the given one) of the larger magnitude
// (no absolute floor: 0.0001 and 0.0002 differ, as with Qwen's isclose). A pair exactly on the bound is equal whatever
// the rounding: a repeating decimal cut after four digits (0.3333 for 1/3) lies on it.
inline bool values_equal(long double x, long double y, long double tolerance = numeric_relative_tolerance) {
  if (x == std::floor(x) && y == std::floor(y)) return x == y;  // 1e6, \frac{2000000}{2}, 1000000.0, 2^{10}
  const long double bound = tolerance * std::fmax(std::fabs(x), std::fabs(y));
  return std::fabs(x - y) <= bound * (1 + 1e-9L);
}

// Two normalised answers as numbers or closed forms of numbers; integers written out compare digit by digit.
inline bool numbers_equal(std::string_view a, std::string_view b) {
  const auto ia = integer_digits(a), ib = integer_digits(b);
  if (ia && ib) return *ia == *ib;
  const auto x = number_value(a), y = number_value(b);
  return x && y && values_equal(*x, *y);
}

// English number words making up a whole answer, case aside: "five", "Twenty-One", "twenty one", "one hundred and
// five", "two thousand three hundred forty-five", up to the billions. nullopt for anything else: ordinals ("fifth"),
// fractions ("one half"), "a hundred", "twelve hundred", "five five", words with a unit ("five apples").
inline std::optional<long long> number_words(std::string_view s) {
  std::vector<std::string> words(1);
  for (char c : s) {
    if (std::isalpha(static_cast<unsigned char>(c))) words.back() += static_cast<char>(std::tolower(c));
    else if (c != ' ' && c != '-') return std::nullopt;
    else if (!words.back().empty()) words.emplace_back();
  }
  if (words.back().empty()) words.pop_back();
  if (words.empty()) return std::nullopt;
  static constexpr std::string_view units[] = {"zero", "one", "two", "three", "four", "five", "six", "seven", "eight",
                                               "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen",
                                               "sixteen", "seventeen", "eighteen", "nineteen"};
  static constexpr std::string_view tens[] = {"twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty",
                                              "ninety"};
  auto index = [](const auto& list, std::string_view w) -> int {
    const auto it = std::find(std::begin(list), std::end(list), w);
    return it == std::end(list) ? -1 : static_cast<int>(it - std::begin(list));
  };
  std::size_t i = 0;
  auto word = [&]() -> std::string_view { return i < words.size() ? std::string_view(words[i]) : std::string_view(); };
  // 1-99: "seven", "nineteen", "forty", "forty-two".
  auto below_hundred = [&]() -> std::optional<long long> {
    if (const int t = index(tens, word()); t >= 0) {
      ++i;
      const int u = index(units, word());
      if (u >= 1 && u <= 9) return ++i, (t + 2) * 10 + u;
      return (t + 2) * 10;
    }
    const int u = index(units, word());
    if (u < 1) return std::nullopt;
    return ++i, u;
  };
  // 1-999: "three hundred", "one hundred and five", "one hundred five", or 1-99.
  auto below_thousand = [&]() -> std::optional<long long> {
    if (i + 1 < words.size() && words[i + 1] == "hundred") {
      const int u = index(units, word());
      if (u < 1 || u > 9) return std::nullopt;
      i += 2;
      const std::size_t before = i;
      const bool conjunction = word() == "and";
      if (conjunction) ++i;
      if (const auto rest = below_hundred()) return u * 100 + *rest;
      if (conjunction) return std::nullopt;  // "one hundred and" ends with nothing
      i = before;
      return u * 100;
    }
    return below_hundred();
  };
  if (words.size() == 1 && words[0] == "zero") return 0;
  long long total = 0;
  for (const auto& [name, scale] : {std::pair<std::string_view, long long>{"billion", 1000000000LL},
                                    {"million", 1000000LL}, {"thousand", 1000LL}}) {
    const std::size_t start = i;
    if (const auto v = below_thousand(); v && word() == name) {
      total += *v * scale;
      ++i;
    } else {
      i = start;
    }
  }
  if (i < words.size()) {
    if (total > 0 && word() == "and") ++i;  // "one thousand and five"
    const auto v = below_thousand();
    if (!v) return std::nullopt;
    total += *v;
  }
  if (i != words.size() || total == 0) return std::nullopt;
  return total;
}

// A normalised answer with its percent sign taken off: a single "%" at the end makes it a percentage; any other "%"
// is dropped (normalize_math_answer drops them all).
struct percent_split {
  std::string text;
  bool percentage;
};
inline percent_split split_percent(std::string_view s) {
  const bool percentage = !s.empty() && s.back() == '%' && s.find('%') == s.size() - 1;
  std::string text;
  for (char c : s)
    if (c != '%') text += c;
  return {std::move(text), percentage};
}

// Text that reads as words rather than as a product of variables: two letters or more and nothing else ("no",
// "Evelyn", "AB"), or a run of three or more letters outside a command ("5and6"). Read as products, two words with
// the same letters ("Evelyn", "Evlyen") would be equal.
inline bool reads_as_words(std::string_view s) {
  auto letter = [&](std::size_t i) { return std::isalpha(static_cast<unsigned char>(s[i])) != 0; };
  bool only_letters = true;
  std::size_t run = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\') {  // a command's name is no word
      only_letters = false;
      run = 0;
      while (i + 1 < s.size() && letter(i + 1)) ++i;
      continue;
    }
    run = letter(i) ? run + 1 : 0;
    if (run >= 3) return true;
    only_letters = only_letters && run > 0;
  }
  return only_letters && s.size() >= 2;  // one letter is a variable
}

// A normalised answer read as a closed form at every point: its values (NaN where it is undefined) and whether it has
// a variable (without one, every point has the same value). nullopt when it does not parse or reads as words.
struct expression_samples {
  std::array<long double, expression_points> at;
  bool variables;
};
inline std::optional<expression_samples> sample_expression(std::string_view s) {
  if (s.empty() || reads_as_words(s)) return std::nullopt;
  expression_samples out{};
  for (int k = 0; k < expression_points; ++k) {
    closed_form form(s, k);
    const auto v = form.evaluate();
    if (!v) return std::nullopt;
    out.at[k] = *v;
    if (k == 0 && !(out.variables = form.has_variables())) {
      out.at.fill(*v);
      break;
    }
  }
  return out;
}

// How close two values of expressions with variables must be: within numeric_relative_tolerance when either is
// written with a decimal (0.3333x for \frac{x}{3}, rounded as a number would be); else all that may differ is
// rounding, and a relative 1e-4 would take x + 10000 for x + 10001 (two whole numbers compare exactly, but their
// values at a point are not whole).
inline constexpr long double exact_expression_tolerance = 1e-9L;
inline long double expression_tolerance(std::string_view a, std::string_view b) {
  auto decimal = [](std::string_view s) {
    for (std::size_t i = s.find('.'); i != std::string_view::npos; i = s.find('.', i + 1))
      if ((i > 0 && std::isdigit(static_cast<unsigned char>(s[i - 1]))) ||
          (i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1]))))
        return true;
    return false;
  };
  return decimal(a) || decimal(b) ? numeric_relative_tolerance : exact_expression_tolerance;
}

// Two normalised answers, one at least with a variable, as functions: equal when their values agree (values_equal,
// within expression_tolerance) at every point where both are defined, and both are at min_expression_points or more.
// Points, not algebra: 2x == 2\cdot x == x+x, \frac{x}{7}+\frac{2}{7} == \frac{x+2}{7}, (x+1)^2 == x^2+2x+1,
// \sqrt{x^2} == |x|; x^2 != |x| and \sqrt{x^2} != x (they differ at some points), x+1 != y+1.
inline bool expressions_equal(std::string_view a, std::string_view b) {
  const auto x = sample_expression(a);
  if (!x) return false;
  const auto y = sample_expression(b);
  if (!y || (!x->variables && !y->variables)) return false;
  const long double tolerance = expression_tolerance(a, b);
  int defined = 0;
  for (int k = 0; k < expression_points; ++k) {
    if (!std::isfinite(x->at[k]) || !std::isfinite(y->at[k])) continue;
    if (!values_equal(x->at[k], y->at[k], tolerance)) return false;
    ++defined;
  }
  return defined >= min_expression_points;
}

// An equation "lhs=rhs": one "=", not part of "<=", ">=", "!=" or ":=", with something on either side.
struct equation {
  std::string_view lhs, rhs;
};
inline std::optional<equation> split_equation(std::string_view s) {
  const std::size_t eq = s.find('=');
  if (eq == std::string_view::npos || eq == 0 || eq + 1 == s.size() || s.find('=', eq + 1) != std::string_view::npos)
    return std::nullopt;
  if (std::string_view("<>!:").find(s[eq - 1]) != std::string_view::npos) return std::nullopt;
  return equation{trim(s.substr(0, eq)), trim(s.substr(eq + 1))};
}

// The left side of "x = 5" when it names the answer rather than being half of an equation: one or two characters
// starting with a letter ("x", "AB"), a command ("\theta"), or a letter with a subscript ("x_1", "a_{n}"), or the
// absolute value of one ("|z|").
inline bool answer_name(std::string_view lhs) {
  lhs = trim(lhs);
  if (lhs.size() >= 3 && lhs.front() == '|' && lhs.back() == '|') lhs = trim(lhs.substr(1, lhs.size() - 2));  // |z|
  if (lhs.empty()) return false;
  const bool command = lhs[0] == '\\';
  if (!std::isalpha(static_cast<unsigned char>(command && lhs.size() > 1 ? lhs[1] : lhs[0]))) return false;
  if (command || lhs.size() <= 2) return true;
  if (lhs[1] != '_') return false;
  std::string_view sub = lhs.substr(2);
  if (sub.size() >= 2 && sub.front() == '{' && sub.back() == '}') sub = sub.substr(1, sub.size() - 2);
  return !sub.empty() &&
         std::all_of(sub.begin(), sub.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; });
}

// "x = 5": a name and a value without variables (or one that does not parse: "x = 1,2").
inline bool names_a_value(const equation& e) {
  if (!answer_name(e.lhs)) return false;
  const auto rhs = sample_expression(e.rhs);
  return !rhs || !rhs->variables;
}

// Two equations as one relation: lhs - rhs of one is a nonzero constant times the other's (y = 2x + 1, 2x + 1 = y,
// 2x - y + 1 = 0 and 2y = 4x + 2 are one line; Qwen's grader takes a factor of -1 only). The factor is the ratio at a
// point, the same (values_equal) at every point where both are defined and not both zero; zero on one side only is a
// difference. nullopt when that cannot be told: a side that does not parse, an equation without a variable or whose
// lhs - rhs is a constant ("x = x + 1"; either equation's, within the tolerance, so that the verdict does not depend
// on the order), fewer than min_expression_points such points.
inline std::optional<bool> equations_proportional(const equation& a, const equation& b) {
  const auto al = sample_expression(a.lhs), ar = sample_expression(a.rhs);
  const auto bl = sample_expression(b.lhs), br = sample_expression(b.rhs);
  if (!al || !ar || !bl || !br || !(al->variables || ar->variables) || !(bl->variables || br->variables))
    return std::nullopt;
  const long double tolerance = std::max(expression_tolerance(a.lhs, a.rhs), expression_tolerance(b.lhs, b.rhs));
  int points = 0;
  long double factor = 0, first_a = 0, first_b = 0;
  bool a_varies = false, b_varies = false;
  for (int k = 0; k < expression_points; ++k) {
    const long double da = al->at[k] - ar->at[k], db = bl->at[k] - br->at[k];
    if (!std::isfinite(da) || !std::isfinite(db) || (da == 0 && db == 0)) continue;
    if (da == 0 || db == 0) return false;
    if (points++ == 0) {
      factor = da / db;
      first_a = da;
      first_b = db;
      continue;
    }
    if (!values_equal(da / db, factor, tolerance)) return false;
    a_varies = a_varies || !values_equal(da, first_a, tolerance);
    b_varies = b_varies || !values_equal(db, first_b, tolerance);
  }
  if (points < min_expression_points || !a_varies || !b_varies) return std::nullopt;
  return true;
}

// A normalised answer as a complex number, i being the imaginary unit: numbers, i, \pi, Euler's e, + - * / \cdot
// \times \div, products side by side (3i, 2\sqrt{3}i, i\sqrt{2}), \frac{a}{b}, \sqrt{x} (the principal root:
// \sqrt{-4} is 2i), a^{b} or a^d, parentheses and braces, x^{\circ} (degrees), and \sin \cos \tan \exp \ln of a group
// in parentheses or braces or of one factor (\cos\frac{\pi}{3}; "\sin\frac{\pi}{3}i" is neither sin(\pi/3) i nor
// sin(\pi i/3) and does not parse). Any other letter or command does not parse: conservative, so that an answer with
// variables is never read as complex (see complex_equal).
class complex_form {
 public:
  using number = std::complex<long double>;
  explicit complex_form(std::string_view s) : s_(s) {}
  // The value when the whole text parses and is finite; nullopt otherwise (also for a division by zero).
  std::optional<number> value() {
    const auto v = sum();
    if (!v || pos_ != s_.size() || !finite(*v)) return std::nullopt;
    return v;
  }
  // Whether the text (as far as it was read) has the imaginary unit.
  bool has_unit() const { return unit_; }

 private:
  static bool finite(const number& z) {
    return std::isfinite(static_cast<double>(z.real())) && std::isfinite(static_cast<double>(z.imag()));
  }
  bool eat(std::string_view token) {
    const bool command = token.size() > 1 && token[0] == '\\';
    if (command ? !command_at(s_, pos_, token) : s_.substr(pos_, token.size()) != token) return false;
    pos_ += token.size();
    if (command && pos_ < s_.size() && s_[pos_] == ' ') ++pos_;  // the space normalisation keeps: "\cdot i"
    return true;
  }
  std::optional<number> group(char open = '{', char close = '}') {
    if (!eat(std::string_view(&open, 1))) return std::nullopt;
    const auto v = sum();
    if (!v || !eat(std::string_view(&close, 1))) return std::nullopt;
    return v;
  }
  std::optional<number> sum() {
    const nesting level(depth_);
    if (level.too_deep()) return std::nullopt;
    auto v = product();
    while (v && pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) {
      const bool minus = s_[pos_++] == '-';
      const auto r = product();
      if (!r) return std::nullopt;
      v = minus ? *v - *r : *v + *r;
    }
    return v;
  }
  // Whether a factor written side by side starts at pos_ (after a number: 3i, 2\pi, 2(1+i); after i: i\sqrt{2}).
  bool factor_next() const {
    if (pos_ >= s_.size()) return false;
    const char c = s_[pos_];
    return c == '(' || c == 'i' || c == 'e' || (c == '\\' && !command_at(s_, pos_, "\\cdot") &&
                                                !command_at(s_, pos_, "\\times") && !command_at(s_, pos_, "\\div"));
  }
  std::optional<number> product() {
    auto v = signed_factor();
    while (v && pos_ < s_.size()) {
      std::optional<number> r;
      if (eat("*") || eat("\\cdot") || eat("\\times")) {
        if (!(r = signed_factor())) return std::nullopt;
        v = *v * *r;
      } else if (eat("/") || eat("\\div")) {
        if (!(r = signed_factor()) || *r == number(0)) return std::nullopt;
        v = *v / *r;
      } else if (factor_next()) {
        if (!(r = power())) return std::nullopt;
        v = *v * *r;
      } else {
        break;
      }
    }
    return v;
  }
  std::optional<number> signed_factor() {
    const nesting level(depth_);
    if (level.too_deep()) return std::nullopt;
    if (eat("-")) {
      const auto v = signed_factor();
      return v ? std::optional<number>(-*v) : std::nullopt;
    }
    if (eat("+")) return signed_factor();
    return power();
  }
  // A whole exponent of at most max_repeated_power by repeated products, which stay exact ((1+i)^2 is 2i, not 2i
  // plus a rounding error in the real part, as std::pow through polar form would give); any other by std::pow.
  static constexpr int max_repeated_power = 64;
  static number raise(const number& base, const number& exponent) {
    const long double n = exponent.real();
    const bool repeated = exponent.imag() == 0 && n == std::floor(n) && std::fabs(n) <= max_repeated_power;
    if (!repeated) return std::pow(base, exponent);
    number v = 1;
    for (int k = 0; k < static_cast<int>(std::fabs(n)); ++k) v *= base;
    return n < 0 ? number(1) / v : v;
  }
  std::optional<number> power() {
    auto base = primary();
    if (base && eat(degree_mark)) return *base * (pi / 180);
    if (!base || !eat("^")) return base;
    std::optional<number> e;
    if (pos_ < s_.size() && s_[pos_] == '{') e = group();
    else if (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) e = number(s_[pos_++] - '0');
    else if (pos_ < s_.size() && s_[pos_] == 'i') e = primary();
    if (!e || (pos_ < s_.size() && (s_[pos_] == '^' || std::isdigit(static_cast<unsigned char>(s_[pos_])))))
      return std::nullopt;  // a double superscript, or "2^10" (TeX's 2^1 0)
    if (*base == number(0))  // 0^b: 0 for a real b > 0, else no value (0^0, 0^{-1}, 0^i)
      return e->imag() == 0 && e->real() > 0 ? std::optional<number>(0) : std::nullopt;
    return raise(*base, *e);
  }
  std::optional<number> primary() {
    if (pos_ >= s_.size()) return std::nullopt;
    const char c = s_[pos_];
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
      const std::size_t start = pos_;
      while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '.')) ++pos_;
      const auto d = parse_decimal(s_.substr(start, pos_ - start));
      return d ? std::optional<number>(*d) : std::nullopt;
    }
    if (c == 'i' || c == 'e') {
      ++pos_;
      unit_ = unit_ || c == 'i';
      return c == 'i' ? number(0, 1) : number(euler);
    }
    if (c == '(') return group('(', ')');
    if (c == '{') return group();
    if (eat("\\pi")) return number(pi);
    if (eat("\\frac")) {
      const auto a = group();
      const auto b = a ? group() : std::nullopt;
      if (!b || *b == number(0)) return std::nullopt;
      return *a / *b;
    }
    if (eat("\\sqrt")) {
      auto x = group();
      if (!x) return std::nullopt;
      // A real radicand's root: √-4 is 2i whatever the sign of the zero imaginary part (-(4) leaves -0).
      if (x->imag() == 0) x = number(x->real(), 0);
      return std::sqrt(*x);
    }
    return function();
  }
  // \sin \cos \tan \exp \ln of a group or of one factor that nothing multiplies side by side.
  std::optional<number> function() {
    static constexpr std::array<std::string_view, 5> names = {"\\sin", "\\cos", "\\tan", "\\exp", "\\ln"};
    std::size_t f = 0;
    while (f < names.size() && !eat(names[f])) ++f;
    const nesting level(depth_);
    if (f == names.size() || level.too_deep()) return std::nullopt;
    std::optional<number> x;
    if (pos_ < s_.size() && (s_[pos_] == '(' || s_[pos_] == '{')) {
      x = s_[pos_] == '(' ? group('(', ')') : group();
    } else if ((x = power()) && factor_next()) {
      return std::nullopt;
    }
    if (!x) return std::nullopt;
    switch (f) {
      case 0: return std::sin(*x);
      case 1: return std::cos(*x);
      case 2: return std::cos(*x) == number(0) ? std::nullopt : std::optional<number>(std::tan(*x));
      case 3: return std::exp(*x);
      default: return *x == number(0) ? std::nullopt : std::optional<number>(std::log(*x));
    }
  }

  std::string_view s_;
  std::size_t pos_ = 0;
  int depth_ = 0;
  bool unit_ = false;
};

// A complex number's part, zero when it is rounding next to the number's magnitude (\cos\frac{\pi}{2} + i is i, the
// cosine being about 1e-19).
inline long double complex_part(long double part, long double magnitude) {
  return std::fabs(part) <= 1e-15L * magnitude ? 0 : part;
}

// Two normalised answers as complex numbers, when the imaginary unit i is clearly meant: both parse as complex_form
// (numbers, i and functions of them; no other letter, no "=", no "%": equations were split before, and "i = 3" names
// a variable), and one at least has i. Then the real parts and the imaginary parts compare as numbers (values_equal):
// 3+4i == 4i+3, \frac{1}{2}+\frac{\sqrt{3}}{2}i == 0.5+0.866i, i^2 == -1, \frac{1}{i} == -i. nullopt otherwise, and
// the answers compare as before (i a variable like any letter).
inline std::optional<bool> complex_equal(std::string_view a, std::string_view b) {
  if (a.find('i') == std::string_view::npos && b.find('i') == std::string_view::npos) return std::nullopt;
  complex_form fa(a), fb(b);
  const auto x = fa.value();
  if (!x) return std::nullopt;
  const auto y = fb.value();
  if (!y || !(fa.has_unit() || fb.has_unit())) return std::nullopt;
  const long double mx = std::abs(*x), my = std::abs(*y);
  return values_equal(complex_part(x->real(), mx), complex_part(y->real(), my)) &&
         values_equal(complex_part(x->imag(), mx), complex_part(y->imag(), my));
}

// One answer that is no tuple or list: equal strings, equal numbers or closed forms, or a percentage x% against
// x / 100 (25% == 0.25; the sign dropped, 25% == 25 as before). Never x * 100, nor a factor of 100 between two plain
// numbers (Qwen's grader takes 500 for 5 and 0.05 for 5, which a GSM8K count would get right by mistake). Then
// equations (equations_equal), "x = value" against a value by the value, and expressions with variables by value.
inline bool equations_equal(const equation& a, const equation& b);
inline bool atom_equal(std::string_view a, std::string_view b) {
  const percent_split pa = split_percent(a), pb = split_percent(b);
  if (pa.text == pb.text || numbers_equal(pa.text, pb.text)) return true;
  if (pa.percentage != pb.percentage) {
    const auto x = number_value(pa.percentage ? pa.text : pb.text);
    const auto y = number_value(pa.percentage ? pb.text : pa.text);
    if (x && y && values_equal(*x / 100, *y)) return true;
  }
  const auto ea = split_equation(a), eb = split_equation(b);
  if (ea && eb) return equations_equal(*ea, *eb);
  if (ea || eb) return answer_name((ea ? ea : eb)->lhs) && atom_equal((ea ? ea : eb)->rhs, ea ? b : a);
  if (!pa.percentage && !pb.percentage)
    if (const auto complex = complex_equal(pa.text, pb.text)) return *complex;
  return expressions_equal(pa.text, pb.text);
}

// Two equations within an answer (an entry of a list; a whole answer's are math_answers_equal's): "x = 1" against
// "x = 1.0" by the name and the value, never "y = 1"; any other pair as one relation (equations_proportional),
// unequal when that cannot be told.
inline bool equations_equal(const equation& a, const equation& b) {
  if (names_a_value(a) && names_a_value(b)) return a.lhs == b.lhs && atom_equal(a.rhs, b.rhs);
  return equations_proportional(a, b).value_or(false);
}

// The length of the bracket at s[i] and its direction in `delta` (+1 opening, -1 closing, 0 neither): "(", "[", "{",
// "\{", "\langle" open; ")", "]", "}", "\}", "\rangle" close. A row break "\\" and other commands are skipped whole.
inline std::size_t bracket_at(std::string_view s, std::size_t i, int& delta) {
  delta = 0;
  const char c = s[i];
  if (c == '\\' && i + 1 < s.size()) {
    const char next = s[i + 1];
    if (next == '{' || next == '}') delta = next == '{' ? 1 : -1;
    if (command_at(s, i, "\\langle") || command_at(s, i, "\\rangle")) {
      delta = s[i + 1] == 'l' ? 1 : -1;
      return 7;
    }
    std::size_t end = i + 1;
    while (end < s.size() && std::isalpha(static_cast<unsigned char>(s[end]))) ++end;
    return end == i + 1 ? 2 : end - i;
  }
  if (c == '(' || c == '[' || c == '{') delta = 1;
  else if (c == ')' || c == ']' || c == '}') delta = -1;
  return 1;
}

// `s` cut at every `separator` outside all brackets ("," "&" "\\" "\cup"), each part trimmed: the one space a
// normalised answer keeps after a command ("A\cup B") is no part of the next entry.
inline std::vector<std::string_view> split_top(std::string_view s, std::string_view separator) {
  std::vector<std::string_view> parts;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i < s.size();) {
    const bool command = separator[0] == '\\' && separator != "\\\\";
    if (depth == 0 && (command ? command_at(s, i, separator) : s.substr(i, separator.size()) == separator)) {
      parts.push_back(trim(s.substr(start, i - start)));
      i += separator.size();
      start = i;
      continue;
    }
    int delta = 0;
    i += bracket_at(s, i, delta);
    depth += delta;
  }
  parts.push_back(trim(s.substr(start)));
  return parts;
}

// An inequality in one named variable as the interval of its solutions: "x < 3" -> "(-\infty,3)", "x \ge -1" ->
// "[-1,\infty)", "2 < x \le 5" -> "(2,5]", "5 \ge x > 2" -> "(2,5]" (relations: < > <= >= \lt \gt \le \leq
// \leqslant \ge \geq \geqslant, U+2264 and U+2265; a chain of two only when both point the same way). nullopt for
// anything else, a relation between two names included.
struct relation_token {
  std::size_t pos, size;
  bool less, strict;
};
// The relation at s[i], if one starts there.
inline std::optional<relation_token> relation_at(std::string_view s, std::size_t i) {
  if (s[i] == '<' || s[i] == '>') {
    const bool eq = i + 1 < s.size() && s[i + 1] == '=';
    return relation_token{i, eq ? 2u : 1u, s[i] == '<', !eq};
  }
  if (s.substr(i, 3) == "\xE2\x89\xA4" || s.substr(i, 3) == "\xE2\x89\xA5")
    return relation_token{i, 3, s[i + 2] == '\xA4', false};
  using t = std::tuple<const char*, bool, bool>;  // the command, less, strict (longest names first)
  for (const auto& [name, less, strict] : {t{"\\leqslant", true, false}, t{"\\geqslant", false, false},
                                           t{"\\leq", true, false}, t{"\\geq", false, false}, t{"\\le", true, false},
                                           t{"\\ge", false, false}, t{"\\lt", true, true}, t{"\\gt", false, true}})
    if (command_at(s, i, name)) return relation_token{i, std::string_view(name).size(), less, strict};
  return std::nullopt;
}
// The relations outside all brackets (bracket_at's: commands, \{ and \langle count, and are skipped whole).
inline std::vector<relation_token> top_level_relations(std::string_view s) {
  std::vector<relation_token> out;
  int depth = 0;
  for (std::size_t i = 0; i < s.size();) {
    if (const auto r = depth == 0 ? relation_at(s, i) : std::nullopt) {
      out.push_back(*r);
      i += r->size;
      continue;
    }
    int delta = 0;
    i += bracket_at(s, i, delta);
    depth += delta;
  }
  return out;
}
inline bool inequality_variable(std::string_view side) {
  side = trim(side);
  // Not |x|: |x| < 3 is (-3, 3) of x, not an interval of |x| to compare.
  return answer_name(side) && side.substr(0, 6) != "\\infty" && side.find_first_of("-|") == std::string_view::npos;
}
// `variable`, when set: the name the inequality bounds.
inline std::optional<std::string> inequality_interval(std::string_view s, std::string_view* variable = nullptr) {
  const auto rel = top_level_relations(s);
  if (rel.empty() || rel.size() > 2) return std::nullopt;
  std::vector<std::string_view> sides;
  std::size_t start = 0;
  for (const auto& r : rel) {
    sides.push_back(trim(s.substr(start, r.pos - start)));
    start = r.pos + r.size;
  }
  sides.push_back(trim(s.substr(start)));
  if (std::any_of(sides.begin(), sides.end(), [](std::string_view x) { return x.empty(); })) return std::nullopt;
  auto interval = [](std::string_view lo, bool lo_open, std::string_view hi, bool hi_open) {
    std::string out(1, lo_open ? '(' : '[');  // appended piece by piece: GCC 12 warns on rvalue string +
    out.append(lo).append(",").append(hi) += hi_open ? ')' : ']';
    return out;
  };
  if (rel.size() == 1) {
    const bool left = inequality_variable(sides[0]), right = inequality_variable(sides[1]);
    if (left == right) return std::nullopt;
    // "x < b" and "b > x" both bound x from above.
    const bool upper = rel[0].less == left;
    const std::string_view bound = left ? sides[1] : sides[0];
    if (variable != nullptr) *variable = left ? sides[0] : sides[1];
    return upper ? interval("-\\infty", true, bound, rel[0].strict) : interval(bound, rel[0].strict, "\\infty", true);
  }
  if (rel[0].less != rel[1].less || !inequality_variable(sides[1]) || inequality_variable(sides[0]) ||
      inequality_variable(sides[2]))
    return std::nullopt;
  if (variable != nullptr) *variable = sides[1];
  if (rel[0].less) return interval(sides[0], rel[0].strict, sides[2], rel[1].strict);
  return interval(sides[2], rel[1].strict, sides[0], rel[0].strict);
}

// Inequalities joined by "or" (a word, \lor or \vee) as the union of their intervals: "x < -1 \text{ or } x > 2" ->
// "(-\infty,-1)\cup(2,\infty)"; one inequality as its interval. nullopt unless every part is an inequality of the
// same variable.
inline std::optional<std::string> inequalities_as_intervals(std::string_view s) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    std::size_t skip = 0;
    const bool word_before = i > 0 && std::isalnum(static_cast<unsigned char>(s[i - 1]));
    if (s.substr(i, 2) == "or" && !word_before &&
        (i + 2 >= s.size() || !std::isalnum(static_cast<unsigned char>(s[i + 2]))))
      skip = 2;
    for (std::string_view cmd : {"\\lor", "\\vee"})
      if (command_at(s, i, cmd)) skip = cmd.size();
    if (skip == 0) continue;
    parts.push_back(s.substr(start, i - start));
    start = i + skip;
    i += skip - 1;
  }
  parts.push_back(s.substr(start));
  std::string out;
  std::string_view first_name;
  for (const std::string_view part : parts) {
    std::string_view name;
    const auto interval = inequality_interval(part, &name);
    if (!interval || (!first_name.empty() && name != first_name)) return std::nullopt;  // one variable throughout
    first_name = name;
    if (!out.empty()) out += "\\cup";
    out += *interval;
  }
  return out;
}

// A normalised answer made of parts: a matrix (\begin{pmatrix} or {bmatrix}, rows by "\\", cells by "&"), a tuple,
// interval, set or vector with at least two entries ("(1,2)", "[0,1)", "\{1,2\}", "\langle1,2\rangle"), a list
// without brackets ("1,2"), or a union of sets ("(0,1)\cup(2,3)"). `kind` names the brackets, which must agree.
struct structure {
  std::string kind;
  std::vector<std::string_view> items;
  std::vector<std::size_t> row_sizes;  // a matrix's
};
inline std::optional<structure> split_structure(std::string_view s) {
  for (std::string_view env : {"pmatrix", "bmatrix"}) {
    const std::string begin = "\\begin{" + std::string(env) + "}";
    if (s.substr(0, begin.size()) != begin) continue;
    for (std::string_view end_env : {"pmatrix", "bmatrix"}) {
      const std::string end = "\\end{" + std::string(end_env) + "}";
      if (s.size() < begin.size() + end.size() || s.substr(s.size() - end.size()) != end) continue;
      const std::string_view inner = s.substr(begin.size(), s.size() - begin.size() - end.size());
      if (inner.find("\\end{") != std::string_view::npos) return std::nullopt;  // not one matrix
      structure m{"matrix", {}, {}};
      for (std::string_view row : split_top(inner, "\\\\")) {
        if (row.empty()) continue;  // a trailing "\\"
        const auto cells = split_top(row, "&");
        m.items.insert(m.items.end(), cells.begin(), cells.end());
        m.row_sizes.push_back(cells.size());
      }
      return m;
    }
  }
  // Brackets around the whole answer: the one that opens at 0 closes at the end.
  int delta = 0;
  if (!s.empty()) {
    const std::size_t open = bracket_at(s, 0, delta);
    const std::string_view opener = s.substr(0, open);
    if (delta == 1 && opener != "{") {
      int depth = 0;
      std::size_t i = 0, closer = 0;
      for (; i < s.size(); i += closer) {
        closer = bracket_at(s, i, delta);
        depth += delta;
        if (depth == 0) break;
      }
      if (i + closer == s.size()) {
        const std::string_view close = s.substr(i);
        const bool interval = (opener == "(" || opener == "[") && (close == ")" || close == "]");
        const bool pair = (opener == "\\{" && close == "\\}") || (opener == "\\langle" && close == "\\rangle");
        auto items = split_top(s.substr(open, i - open), ",");
        if ((interval || pair) && items.size() >= 2)
          return structure{std::string(opener) + std::string(close), std::move(items), {}};
      }
    }
  }
  if (auto items = split_top(s, ","); items.size() >= 2) return structure{",", items, {}};
  if (auto parts = split_top(s, "\\cup"); parts.size() >= 2) return structure{"\\cup", parts, {}};
  return std::nullopt;
}

// A set "\{1, 2\}", a union "(0,1)\cup(2,3)" and a bare list "1, 2" (MATH's "enter all the solutions, separated by
// commas") say nothing by their order; tuples, intervals, vectors and matrices do.
inline bool unordered_kind(std::string_view kind) { return kind == "\\{\\}" || kind == "," || kind == "\\cup"; }
inline bool set_or_list(std::string_view kind) { return kind == "\\{\\}" || kind == ","; }

// Pairs of elements compared at most when two sets are matched: a model that loops may write a list of thousands of
// entries, and every pair of two such lists would take seconds.
inline constexpr std::size_t max_set_pairs = 4096;

inline bool answers_equal(std::string_view a, std::string_view b, int depth);

// "52_8" against "52": a numeral with its base as a subscript (2 to 36; digits and capital letters) is the same
// numeral written without it (MATH's "express in base 8", answered without the subscript). Not against its decimal
// value (52_8 != 42): the question asked for the digits.
inline bool same_numeral_but_base(std::string_view a, std::string_view b) {
  auto digits = [](std::string_view x) -> std::optional<std::string_view> {
    const std::size_t u = x.rfind('_');
    if (u == std::string_view::npos || u == 0) return std::nullopt;
    std::string_view base = x.substr(u + 1);
    if (base.size() >= 2 && base.front() == '{' && base.back() == '}') base = base.substr(1, base.size() - 2);
    const auto decimal = [](char c) { return c >= '0' && c <= '9'; };
    if (base.empty() || base.size() > 2 || !std::all_of(base.begin(), base.end(), decimal)) return std::nullopt;
    const int radix = std::stoi(std::string(base));
    const std::string_view numeral = x.substr(0, u);
    const bool ok = radix >= 2 && radix <= 36 && !numeral.empty() &&
                    std::all_of(numeral.begin(), numeral.end(), [&](char c) {
                      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'Z' ? c - 'A' + 10 : 99;
                      return d < radix;
                    });
    return ok ? std::optional<std::string_view>(numeral) : std::nullopt;
  };
  const auto da = digits(a), db = digits(b);
  if (da && !db) return *da == b;
  if (db && !da) return *db == a;
  return false;
}

// Two sets of normalised elements as sets: every element of each equals some element of the other, so neither order
// nor repetition counts ({1, 2} == {2, 1, 1}). Equality within the tolerance is not transitive, so this is not a
// matching of one to one: {1, 1.00001} == {1}, as 1 == 1.00001. Past max_set_pairs, only in order.
inline bool same_set(const std::vector<std::string_view>& a, const std::vector<std::string_view>& b, int depth) {
  if (a.size() == b.size()) {
    bool in_order = true;
    for (std::size_t i = 0; i < a.size() && in_order; ++i) in_order = answers_equal(a[i], b[i], depth);
    if (in_order) return true;
  }
  if (a.size() * b.size() > max_set_pairs) return false;
  std::vector<char> b_matched(b.size(), 0);
  for (const std::string_view x : a) {
    bool matched = false;
    for (std::size_t j = 0; j < b.size(); ++j) {
      if (!answers_equal(x, b[j], depth)) continue;
      matched = true;
      b_matched[j] = 1;
    }
    if (!matched) return false;
  }
  return std::all_of(b_matched.begin(), b_matched.end(), [](char m) { return m != 0; });
}

// The element of a set of one, "\{5\}" -> "5" (split_structure's sets have two or more); nullopt for anything else.
inline std::optional<std::string_view> single_set_element(std::string_view s) {
  if (s.size() < 4 || s.substr(0, 2) != "\\{" || s.substr(s.size() - 2) != "\\}") return std::nullopt;
  int depth = 0, delta = 0;
  std::size_t i = 0;
  for (std::size_t step = 0; i < s.size(); i += step) {
    step = bracket_at(s, i, delta);
    depth += delta;
    if (depth == 0) break;
  }
  if (i + 2 != s.size()) return std::nullopt;  // the first brace closes before the end: "\{1\}\cup\{2\}"
  const std::string_view inner = trim(s.substr(2, s.size() - 4));
  if (inner.empty() || split_top(inner, ",").size() != 1) return std::nullopt;
  return inner;
}

// Two normalised answers: equal strings; else, when both are made of parts of the same kind and shape, part by part:
// sets, unions and bare lists as sets (same_set), the others in order (as Qwen's compare_lists, but with the
// brackets checked); else as one answer (atom_equal).
inline bool answers_equal(std::string_view a, std::string_view b, int depth = 0) {
  if (a == b) return true;
  if (depth < max_brace_depth) {
    const auto sa = split_structure(a), sb = split_structure(b);
    if (sa && sb) {
      // A set in braces and a bare list (MATH's "all the solutions") are both sets: \{1, 2\} == 2, 1.
      const bool sets = set_or_list(sa->kind) && set_or_list(sb->kind);
      if ((sa->kind != sb->kind && !sets) || sa->row_sizes != sb->row_sizes) return false;
      if (unordered_kind(sa->kind)) return same_set(sa->items, sb->items, depth + 1);
      if (sa->items.size() != sb->items.size()) return false;
      for (std::size_t i = 0; i < sa->items.size(); ++i)
        if (!answers_equal(sa->items[i], sb->items[i], depth + 1)) return false;
      return true;
    }
    // A set of one is a set as the others are: \{5\} == 5 (a bare list of one), == \{5.0\}, == "5, 5".
    const auto ea = single_set_element(a), eb = single_set_element(b);
    if ((ea && sb && set_or_list(sb->kind)) || (eb && sa && set_or_list(sa->kind)))
      return same_set({ea ? *ea : *eb}, ea ? sb->items : sa->items, depth + 1);
    // A set's element that is a set itself stays one: \{\{5\}\} != 5 (but == \{5\}, both sides unwrapped).
    const bool nested = (ea && !eb && ea->substr(0, 2) == "\\{") || (eb && !ea && eb->substr(0, 2) == "\\{");
    if ((ea || eb) && !sa && !sb && !nested) return answers_equal(ea ? *ea : a, eb ? *eb : b, depth + 1);
  }
  return atom_equal(a, b);
}

// A multiple-choice answer, normalised: "(A)5" is the letter A with the value 5; "(A)" and "A" a letter alone.
// Letters A-E only (AMC's), capitals only.
struct choice {
  char letter;
  std::string value;  // empty for a letter alone
};
inline std::optional<choice> split_choice(const std::string& s) {
  auto letter = [](char c) { return c >= 'A' && c <= 'E'; };
  if (s.size() == 1 && letter(s[0])) return choice{s[0], {}};
  if (s.size() >= 3 && s[0] == '(' && letter(s[1]) && s[2] == ')') return choice{s[1], s.substr(3)};
  return std::nullopt;
}

// "(A) 5" is right against 5, A and (A), wrong against 6, B and (B) 5; a letter alone says nothing of the value.
inline bool choices_equal(const std::string& a, const std::string& b) {
  const auto ca = split_choice(a), cb = split_choice(b);
  if (ca && cb)
    return ca->letter == cb->letter &&
           (ca->value.empty() || cb->value.empty() || answers_equal(ca->value, cb->value));
  if (!ca && !cb) return false;
  const choice& c = ca ? *ca : *cb;
  return !c.value.empty() && answers_equal(c.value, ca ? b : a);
}

}  // namespace detail

// The instruction the math sets end their problems with (Qwen2.5-Math's and DeepSeek-R1's evaluation prompt).
inline constexpr std::string_view boxed_instruction =
    "Please reason step by step, and put your final answer within \\boxed{}.";

// A math problem as the model is asked it: the text, then (on a line of its own) the \boxed{} instruction unless
// the text already asks for a \boxed answer (the MATH-500 / AIME / AMC files of ../shared/data/math carry it;
// GSM8K questions and MATH-500 as Hugging Face publishes it do not).
inline std::string math_prompt(std::string_view problem) {
  std::string p(problem);
  if (p.find("\\boxed") == std::string::npos) p.append("\n").append(boxed_instruction);
  return p;
}

// The testbed's rule: the text after the last "####", stripped, up to the end of its line. nullopt when
// there is no "####".
inline std::optional<std::string> extract_hash_answer(std::string_view text) {
  const std::size_t pos = text.rfind("####");
  if (pos == std::string_view::npos) return std::nullopt;
  std::string_view rest = text.substr(pos + 4);
  while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
  if (const std::size_t nl = rest.find('\n'); nl != std::string_view::npos) rest = rest.substr(0, nl);
  return std::string(detail::trim(rest));
}

// The content of the last \boxed{...} / \fbox{...} (nested braces balanced; spaces or a line break may come
// before the brace, as TeX allows), or the token after "\boxed " ("\boxed 5" -> "5"). nullopt when there is none
// or the last one is never closed.
inline std::optional<std::string> extract_boxed(std::string_view text) {
  std::size_t pos = std::string_view::npos, name = 0;
  for (std::string_view cmd : {std::string_view("\\boxed"), std::string_view("\\fbox")}) {
    for (std::size_t p = text.rfind(cmd); p != std::string_view::npos; p = p == 0 ? std::string_view::npos : text.rfind(cmd, p - 1)) {
      if (!detail::command_at(text, p, cmd)) continue;
      if (pos == std::string_view::npos || p > pos) {
        pos = p;
        name = cmd.size();
      }
      break;
    }
  }
  if (pos == std::string_view::npos) return std::nullopt;
  std::size_t i = pos + name;
  while (i < text.size() && detail::is_space(text[i])) ++i;  // TeX skips spaces before an argument: "\boxed {5}"
  if (i < text.size() && text[i] == '{') {
    const std::size_t end = detail::close_brace(text, i);
    if (end == std::string_view::npos) return std::nullopt;
    return std::string(detail::trim(text.substr(i + 1, end - i - 2)));
  }
  if (i == pos + name) return std::nullopt;  // "\boxed$": no argument
  std::size_t end = i;
  while (end < text.size() && !detail::is_space(text[end]) && text[end] != '$') ++end;
  if (end == i) return std::nullopt;
  return std::string(text.substr(i, end - i));
}

// \boxed{} first, else "####".
inline std::optional<std::string> extract_math_answer(std::string_view text) {
  if (auto boxed = extract_boxed(text)) return boxed;
  return extract_hash_answer(text);
}

namespace detail {

// One "\\pm" in a normalised answer -> both answers it stands for, as a list: "1\\pm\\sqrt{19}" ->
// "1+\\sqrt{19},1-\\sqrt{19}", so that it equals the two roots written out in any order. Each entry of a list or of a
// set "\\{...\\}" with one "\\pm" (wherever in the entry: "\\frac{-1\\pm\\sqrt{5}}{2}") becomes two; an entry with more
// than one, or with "\\mp", stays as written (which signs go together is not for the grader to guess).
inline std::string expand_plus_minus(const std::string& s) {
  if (s.find("\\pm") == std::string::npos && s.find("\\mp") == std::string::npos) return s;
  const bool set = s.size() >= 4 && s.compare(0, 2, "\\{") == 0 && s.compare(s.size() - 2, 2, "\\}") == 0;
  const std::string_view inside = set ? std::string_view(s).substr(2, s.size() - 4) : std::string_view(s);
  std::string out;
  for (const std::string_view entry : split_top(inside, ",")) {
    if (!out.empty()) out += ',';
    // One \pm or \mp in the entry (\mp's two answers are \pm's, in the other order).
    const std::size_t pm = entry.find("\\pm"), mp = entry.find("\\mp");
    const std::size_t at = std::min(pm, mp);
    const std::string_view sign_command = at == pm ? "\\pm" : "\\mp";
    const bool one = at != std::string_view::npos && command_at(entry, at, sign_command) &&
                     entry.find("\\pm", at + 1) == std::string_view::npos &&
                     entry.find("\\mp", at + 1) == std::string_view::npos;
    if (!one) {
      out += entry;
      continue;
    }
    for (const char sign : {'+', '-'}) {
      out.append(entry.substr(0, at)).append(1, sign);
      std::size_t rest = at + 3;
      if (rest < entry.size() && entry[rest] == ' ') ++rest;  // the space kept after a command before a letter
      out.append(entry.substr(rest)).append(sign == '+' ? "," : "");
    }
  }
  return set ? "\\{" + out + "\\}" : out;
}

// A subscript of one character in braces is that character: "4210_{5}" is 4210_5, "a_{n}" is a_n.
inline std::string short_subscripts(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    out += s[i];
    if (s[i] == '_' && i + 3 < s.size() && s[i + 1] == '{' && std::isalnum(static_cast<unsigned char>(s[i + 2])) &&
        s[i + 3] == '}') {
      out += s[i + 2];
      i += 3;
    }
  }
  return out;
}

// normalize_math_answer's work, but a percent sign ("\%" or "%") is kept as "%", for math_answers_equal to read
// 25% as 25 or 0.25; with drop_name false, "x = 5" stays an equation.
inline std::string normalize_keeping_percent(std::string_view answer, bool drop_name = true) {
  std::string s(detail::trim(answer));
  s = detail::function_commands(std::move(s));  // \operatorname{sin} -> \sin
  // Wrappers whose content is the answer (\text{...} below, once the spacing is gone).
  for (std::string_view cmd : {"\\boxed", "\\textbf", "\\mathrm", "\\mathbf"}) detail::unwrap_command(s, cmd, true);
  for (std::string_view junk : {"\\left", "\\right", "\\!", "\\displaystyle", "\\$", "$"})
    detail::replace_all(s, junk, "");
  detail::replace_all(s, "{,}", ",");  // LaTeX's thousands separator: "1{,}000"
  detail::replace_all(s, "\xE2\x88\x92", "-");  // U+2212 MINUS SIGN, as models and web text write it
  // Degrees are dropped (30^\circ is 30), but kept as one mark, ^{\circ}, where a trigonometric function may take them
  // as its argument's unit (\sin 30^\circ is \frac{1}{2}: closed_form reads x^{\circ} as x\pi/180).
  const bool angles = detail::has_trigonometric_function(s);
  for (std::string_view degrees : {"^{\\circ}", "^\\circ", "\xC2\xB0", "\\degree"})
    detail::replace_all(s, degrees, angles ? detail::degree_mark : "");
  if (!angles) detail::replace_all(s, "\\circ", "");
  detail::replace_all(s, "\\%", "%");
  detail::replace_all(s, "\\dfrac", "\\frac");
  detail::replace_all(s, "\\tfrac", "\\frac");
  detail::replace_all(s, "\\dbinom", "\\binom");
  detail::replace_all(s, "\\tbinom", "\\binom");
  s = detail::replace_spacing(s);
  s = detail::percent_words(std::move(s));
  s = detail::resolve_text_groups(s);  // units: "5\text{ cm}" -> "5"; "\text{Evelyn}" -> "Evelyn"
  s = std::string(detail::trim(s));
  s = detail::drop_unit_words(s);
  // "x = 5" -> "5" (a name on the left of a single "=").
  const std::size_t eq = s.find('=');
  if (drop_name && eq != std::string::npos && s.find('=', eq + 1) == std::string::npos &&
      detail::answer_name(std::string_view(s).substr(0, eq)))
    s = std::string(detail::trim(std::string_view(s).substr(eq + 1)));
  // "x \in [-2, 7]" -> "[-2, 7]", as "x = 5" is 5.
  const std::size_t in = s.find("\\in");
  if (drop_name && in != std::string::npos && detail::command_at(s, in, "\\in") &&
      detail::answer_name(std::string_view(s).substr(0, in)))
    s = std::string(detail::trim(std::string_view(s).substr(in + 3)));
  // "x \le 3" -> "(-\infty,3]", as "x \in (-\infty, 3]"; "x < 0 or x > 1" -> "(-\infty,0)\cup(1,\infty)".
  if (drop_name)
    if (auto intervals = detail::inequalities_as_intervals(s)) s = std::move(*intervals);
  std::string_view words = detail::trim(s);  // "Twenty-one." -> "21"
  while (!words.empty() && words.back() == '.') words.remove_suffix(1);
  if (const auto n = detail::number_words(words)) s = std::to_string(*n);
  s = detail::brace_arguments(s);
  if (auto mixed = detail::mixed_number(s)) s = std::move(*mixed);
  std::string compact;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (!detail::is_space(s[i])) {
      compact += s[i];
    } else if (detail::command_name_ends(compact) && i + 1 < s.size() &&
               std::isalpha(static_cast<unsigned char>(s[i + 1]))) {
      compact += ' ';  // "2 \cdot x" is 2\cdot x, not the command \cdotx
    }
  }
  while (!compact.empty() && compact.back() == '.') compact.pop_back();
  const bool percent = !compact.empty() && compact.back() == '%';
  if (detail::has_thousands_separators(std::string_view(compact).substr(0, compact.size() - percent))) {
    std::string plain;
    for (char c : compact)
      if (c != ',') plain += c;
    compact = plain;
  }
  for (std::string_view empty : {"\\{\\}", "\\varnothing", "\\O"})  // the empty set, one way: \emptyset
    if (compact == empty) compact = "\\emptyset";
  return detail::expand_plus_minus(detail::short_subscripts(compact));
}

}  // namespace detail

inline std::string normalize_math_answer(std::string_view answer) {
  std::string s = detail::normalize_keeping_percent(answer);
  s.erase(std::remove(s.begin(), s.end(), '%'), s.end());
  return s;
}

// The normalised answer as a number when it is one (integer, decimal, a/b, \frac{a}{b}).
inline std::optional<long double> math_answer_value(std::string_view answer) {
  return detail::parse_number(normalize_math_answer(answer));
}

// The model's answer against the reference, both normalised: equal strings, numbers and closed forms of numbers
// (within numeric_relative_tolerance, whole numbers exactly), expressions with variables at fixed points, equations
// as relations, a percentage against its / 100, tuples, intervals and matrices part by part in order, sets and lists
// in any order, choices by letter and value. Rules and examples: docs/accuracy.md, "Grading rules of math".
inline bool math_answers_equal(std::string_view a, std::string_view b) {
  const std::string na = detail::normalize_keeping_percent(a), nb = detail::normalize_keeping_percent(b);
  if (na.find_first_not_of('%') == std::string::npos || nb.find_first_not_of('%') == std::string::npos) return false;
  // Two equations are one relation or not, the name on the left included (y = 2x + 1 is 2x + 1 = y, not z = 2x + 1);
  // but "x = 5" against "y = 5" is the value 5 both times, as before (and in Qwen's grader).
  if (a.find('=') != std::string_view::npos && b.find('=') != std::string_view::npos) {
    const std::string ea = detail::normalize_keeping_percent(a, false);
    const std::string eb = detail::normalize_keeping_percent(b, false);
    const auto qa = detail::split_equation(ea), qb = detail::split_equation(eb);
    if (qa && qb && !(detail::names_a_value(*qa) && detail::names_a_value(*qb)))
      if (const auto same = detail::equations_proportional(*qa, *qb)) return *same;
  }
  return detail::answers_equal(na, nb) || detail::choices_equal(na, nb) || detail::same_numeral_but_base(na, nb);
}

}  // namespace zipage::eval
