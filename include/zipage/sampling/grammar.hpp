#pragma once
// Grammar-constrained outputs (vLLM's guided_grammar / structured_outputs.grammar): a context-free grammar in GBNF,
// the EBNF that llama.cpp and xgrammar (vLLM's default backend) read, turned into a regex in the subset
// zipage/sampling/guided.hpp accepts, which guided.hpp compiles to a DFA like any guided_regex.
//
//   root   ::= "The answer is " answer "."        # a comment
//   answer ::= [0-9]+ | "(" answer ")" | word ( "-" word )*
//   word   ::= [a-z]{1,12}
//
// Supported: rules `name ::= ...` (names of letters, digits, '-' and '_'; a rule may span lines; `root` is where the
// output starts), alternation |, grouping ( ), string literals "..." with escapes \n \t \r \\ \" \xHH \uHHHH
// \UHHHHHHHH, character classes [...] and [^...] with ranges and the same escapes (ASCII members: a negated class
// also matches every non-ASCII character), `.` (any character), quantifiers * + ? {m} {m,} {m,n}, comments #.
//
// Recursion, two ways. grammar_rules keeps it exact: a rule referenced inside its own expansion becomes a call,
// (?&N), of a rule of its own, which guided.hpp compiles to a pushdown grammar (pushdown.hpp; what
// compile_guided_grammar does for a recursive grammar); every other reference is expanded in place. grammar_regex,
// for a plain DFA (structural tags' grammars), unrolls it: a rule may appear inside its own expansion at most
// `grammar_max_recursion` times (parentheses nested 4 deep with the default), alternatives that would need more are
// not generated. A grammar without recursion is one regex either way, exact. Errors name the rule or the position:
// an undefined or missing `root` rule, a syntax error, a non-ASCII class member, a grammar whose root derives nothing
// (within the recursion limit), an expansion past grammar_max_regex_bytes.
#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/sampling/regex_text.hpp"
#include "zipage/tokenizer/utf8.hpp"

namespace zipage {

inline constexpr int grammar_max_recursion = 4;
inline constexpr std::size_t grammar_max_regex_bytes = 512 * 1024;

namespace grammar_detail {

struct node {
  enum class kind { literal, char_class, any, ref, sequence, alternation, repeat } k;
  std::string text;                          // literal: bytes; char_class: the regex class; ref: the rule name
  std::vector<std::unique_ptr<node>> parts;  // sequence / alternation: the parts; repeat: the one repeated
  int min = 0, max = -1;                     // repeat: bounds (-1: none)
  std::size_t at = 0;                        // where it starts in the grammar text (for errors)
};
using node_ptr = std::unique_ptr<node>;

class parser {
 public:
  explicit parser(std::string_view text) : s_(text) {}

  // Every rule's body, by name; checks that root and every referenced rule exist.
  std::map<std::string, node_ptr, std::less<>> parse() {
    std::map<std::string, node_ptr, std::less<>> rules;
    skip_space(true);
    while (i_ < s_.size()) {
      const std::size_t start = i_;
      const std::string name = read_name();
      check(!name.empty(), "grammar: expected a rule name at ", where(start));
      skip_space(true);
      check(s_.substr(i_, 3) == "::=", "grammar: expected '::=' after the rule name '", name, "' at ", where(i_));
      i_ += 3;
      check(!rules.contains(name), "grammar: the rule '", name, "' is defined twice (", where(start), ")");
      rules.emplace(name, alternatives());
      skip_space(true);
    }
    check(rules.contains("root"), "grammar: no 'root' rule (the output starts at root ::= ...)");
    for (const auto& [name, body] : rules) check_refs(*body, rules, name);
    return rules;
  }

 private:
  std::string_view s_;
  std::size_t i_ = 0;

  [[nodiscard]] std::string where(std::size_t at) const {
    std::size_t line = 1, col = 1;
    for (std::size_t j = 0; j < at && j < s_.size(); ++j) {
      if (s_[j] == '\n') ++line, col = 1;
      else ++col;
    }
    return "line " + std::to_string(line) + ", column " + std::to_string(col);
  }
  static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }
  // Spaces, and comments; newlines too when `newlines` (inside a rule they may also separate items).
  void skip_space(bool newlines) {
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == '#') {
        while (i_ < s_.size() && s_[i_] != '\n') ++i_;
      } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++i_;
      } else {
        break;
      }
    }
  }
  std::string read_name() {
    const std::size_t start = i_;
    while (i_ < s_.size() && name_char(s_[i_])) ++i_;
    return std::string(s_.substr(start, i_ - start));
  }
  // Whether a new rule starts here (name, then ::=): the end of the current rule's last sequence.
  [[nodiscard]] bool rule_start() const {
    std::size_t j = i_;
    while (j < s_.size() && name_char(s_[j])) ++j;
    if (j == i_) return false;
    while (j < s_.size() && (s_[j] == ' ' || s_[j] == '\t' || s_[j] == '\r' || s_[j] == '\n')) ++j;
    return s_.substr(j, 3) == "::=";
  }

  node_ptr make(node::kind k, std::size_t at) {
    auto n = std::make_unique<node>();
    n->k = k;
    n->at = at;
    return n;
  }

  node_ptr alternatives() {
    auto alt = make(node::kind::alternation, i_);
    alt->parts.push_back(sequence());
    while (true) {
      skip_space(true);
      if (i_ >= s_.size() || s_[i_] != '|') break;
      ++i_;
      alt->parts.push_back(sequence());
    }
    if (alt->parts.size() == 1) return std::move(alt->parts[0]);
    return alt;
  }

  node_ptr sequence() {
    auto seq = make(node::kind::sequence, i_);
    while (true) {
      skip_space(true);
      if (i_ >= s_.size() || s_[i_] == '|' || s_[i_] == ')' || rule_start()) break;
      seq->parts.push_back(quantified(primary()));
    }
    return seq;
  }

  node_ptr primary() {
    const std::size_t at = i_;
    const char c = s_[i_];
    if (c == '"') return literal();
    if (c == '[') return char_class();
    if (c == '.') {
      ++i_;
      return make(node::kind::any, at);
    }
    if (c == '(') {
      ++i_;
      auto inner = alternatives();
      skip_space(true);
      check(i_ < s_.size() && s_[i_] == ')', "grammar: '(' at ", where(at), " is not closed");
      ++i_;
      return inner;
    }
    if (name_char(c)) {
      auto r = make(node::kind::ref, at);
      r->text = read_name();
      return r;
    }
    fail("grammar: unexpected '", std::string(1, c), "' at ", where(at));
  }

  node_ptr quantified(node_ptr inner) {
    while (i_ < s_.size()) {
      const char c = s_[i_];
      int lo = 0, hi = -1;
      const std::size_t at = i_;
      if (c == '*') {
        ++i_;
      } else if (c == '+') {
        lo = 1, ++i_;
      } else if (c == '?') {
        hi = 1, ++i_;
      } else if (c == '{') {
        ++i_;
        lo = read_count(at);
        hi = lo;
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          hi = i_ < s_.size() && s_[i_] == '}' ? -1 : read_count(at);
        }
        check(i_ < s_.size() && s_[i_] == '}', "grammar: '{' at ", where(at), " needs {m}, {m,} or {m,n}");
        ++i_;
        check(hi < 0 || lo <= hi, "grammar: {", lo, ",", hi, "} at ", where(at), " has its bounds reversed");
      } else {
        break;
      }
      auto r = make(node::kind::repeat, at);
      r->min = lo;
      r->max = hi;
      r->parts.push_back(std::move(inner));
      inner = std::move(r);
    }
    return inner;
  }
  int read_count(std::size_t at) {
    int n = 0;
    const std::size_t start = i_;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      n = n * 10 + (s_[i_++] - '0');
      check(n <= 1000, "grammar: a repeat count at ", where(at), " passes 1000");
    }
    check(i_ > start, "grammar: '{' at ", where(at), " needs a number");
    return n;
  }

  // One character of a literal or class (an escape or a UTF-8 character), as a code point.
  std::uint32_t read_char() {
    const std::size_t at = i_;
    check(i_ < s_.size(), "grammar: the text ends inside a literal or class");
    auto c = static_cast<unsigned char>(s_[i_]);
    if (c != '\\') {  // a UTF-8 character whole
      const auto r = utf8::scan(s_.substr(i_));
      check(r.state == utf8::status::valid, "grammar: invalid UTF-8 at ", where(at));
      const char32_t cp = utf8::decode_valid(s_.substr(i_), r.length);
      i_ += r.length;
      return cp;
    }
    check(i_ + 1 < s_.size(), "grammar: the text ends after '\\' at ", where(at));
    const char e = s_[i_ + 1];
    i_ += 2;
    switch (e) {
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': return static_cast<unsigned char>(e);
      case 'x': return read_hex(2, at);
      case 'u': return read_hex(4, at);
      case 'U': return read_hex(8, at);
      default: fail("grammar: unknown escape '\\", std::string(1, e), "' at ", where(at));
    }
  }
  std::uint32_t read_hex(int digits, std::size_t at) {
    std::uint32_t v = 0;
    for (int k = 0; k < digits; ++k, ++i_) {
      check(i_ < s_.size() && std::isxdigit(static_cast<unsigned char>(s_[i_])), "grammar: the escape at ",
            where(at), " needs ", digits, " hex digits");
      const char h = s_[i_];
      v = v * 16 + static_cast<std::uint32_t>(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
    }
    check(v <= 0x10FFFF, "grammar: the escape at ", where(at), " is past U+10FFFF");
    return v;
  }

  node_ptr literal() {
    auto lit = make(node::kind::literal, i_);
    ++i_;  // the opening quote
    while (true) {
      check(i_ < s_.size() && s_[i_] != '\n', "grammar: the literal at ", where(lit->at), " is not closed");
      if (s_[i_] == '"') break;
      utf8::append(lit->text, read_char());
    }
    ++i_;
    return lit;
  }

  node_ptr char_class() {
    auto cls = make(node::kind::char_class, i_);
    ++i_;  // '['
    const bool negated = i_ < s_.size() && s_[i_] == '^';
    if (negated) ++i_;
    std::string members;
    auto member = [&](std::uint32_t cp) {
      if (cp >= 0x80) {
        std::string hex;
        for (std::uint32_t v = cp; v != 0; v >>= 4) hex.insert(hex.begin(), "0123456789ABCDEF"[v & 15]);
        fail("grammar: the class at ", where(cls->at), " has a non-ASCII member (U+", hex,
             "); only ASCII members are supported");
      }
      if (cp < 0x20 || cp == 0x7F) {
        members += regex_text::hex_escape(static_cast<unsigned char>(cp));
      } else {
        if (cp == ']' || cp == '\\' || cp == '^' || cp == '-' || cp == '[') members += '\\';
        members += static_cast<char>(cp);
      }
    };
    while (true) {
      check(i_ < s_.size(), "grammar: the class at ", where(cls->at), " is not closed");
      if (s_[i_] == ']') break;
      const std::uint32_t lo = read_char();
      if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
        ++i_;
        const std::uint32_t hi = read_char();
        check(lo <= hi, "grammar: the range in the class at ", where(cls->at), " is reversed");
        member(lo);
        members += '-';
        member(hi);
      } else {
        member(lo);
      }
    }
    ++i_;
    check(!members.empty() || negated, "grammar: the class at ", where(cls->at), " is empty");
    cls->text = members.empty() ? "(?:.|\\n)" : std::string(negated ? "[^" : "[") + members + "]";
    return cls;
  }

  void check_refs(const node& n, const std::map<std::string, node_ptr, std::less<>>& rules,
                  const std::string& rule) const {
    if (n.k == node::kind::ref)
      check(rules.contains(n.text), "grammar: the rule '", rule, "' uses '", n.text, "' (", where(n.at),
            "), which is not defined");
    for (const auto& p : n.parts) check_refs(*p, rules, rule);
  }
};

// The regex of a node, nullopt when it derives no string within the recursion limit.
class emitter {
 public:
  // `called` (optional): recursion becomes a call; the names of the rules called, by (?&N)'s N, grow into it (the
  // caller puts the rule being emitted, at its own index, first).
  emitter(const std::map<std::string, node_ptr, std::less<>>& rules, int max_recursion,
          std::vector<std::string>* called = nullptr)
      : rules_(rules), max_recursion_(max_recursion), called_(called) {}

  std::optional<std::string> emit_rule(const std::string& name) { return reference(name); }

  std::optional<std::string> emit(const node& n) {
    switch (n.k) {
      case node::kind::literal: return regex_text::quote(n.text);
      case node::kind::char_class: return n.text;
      case node::kind::any: return std::string("(?:.|\\n)");
      case node::kind::ref: return reference(n.text);
      case node::kind::sequence: {
        std::string out;
        for (const auto& p : n.parts) {
          auto r = emit(*p);
          if (!r) return std::nullopt;
          out += *r;
          grow(out.size());
        }
        return out;
      }
      case node::kind::alternation: {
        std::vector<std::string> alts;  // those that derive something within the recursion limit
        for (const auto& p : n.parts)
          if (auto r = emit(*p)) alts.push_back(std::move(*r));
        if (alts.empty()) return std::nullopt;
        std::string out = regex_text::alternation(std::move(alts));
        grow(out.size());
        return out;
      }
      case node::kind::repeat: {
        auto r = emit(*n.parts[0]);
        if (!r || r->empty()) return n.min == 0 || r ? std::optional<std::string>("") : std::nullopt;
        std::string q;
        if (n.min == 0 && n.max == -1) q = "*";
        else if (n.min == 1 && n.max == -1) q = "+";
        else if (n.min == 0 && n.max == 1) q = "?";
        else if (n.max == -1) q = "{" + std::to_string(n.min) + ",}";
        else if (n.min == n.max) q = "{" + std::to_string(n.min) + "}";
        else q = "{" + std::to_string(n.min) + "," + std::to_string(n.max) + "}";
        return "(?:" + *r + ")" + q;
      }
    }
    return std::nullopt;
  }

 private:
  const std::map<std::string, node_ptr, std::less<>>& rules_;
  int max_recursion_;
  std::vector<std::string>* called_;
  std::map<std::string, int, std::less<>> open_;  // how many times each rule is being expanded

  // A rule's expansion, unless it is already open max_recursion + 1 times (its outermost expansion and
  // max_recursion nested inside it); with calls, a call where it is open at all.
  std::optional<std::string> reference(const std::string& name) {
    int& open = open_[name];  // (std::map: the reference stays valid while the recursion inserts)
    if (called_ && open > 0) {
      auto it = std::find(called_->begin(), called_->end(), name);
      if (it == called_->end()) it = called_->insert(called_->end(), name);
      return "(?&" + std::to_string(it - called_->begin()) + ")";
    }
    if (open > max_recursion_) return std::nullopt;
    ++open;
    auto r = emit(*rules_.find(name)->second);
    --open;
    return r;
  }
  static void grow(std::size_t bytes) {
    check(bytes <= grammar_max_regex_bytes, "grammar: its expansion passes ", grammar_max_regex_bytes,
          " bytes of regex; lower the recursion or simplify the grammar");
  }
};

}  // namespace grammar_detail

// The regex of the strings that `gbnf` (a GBNF grammar) derives from its root rule, recursion unrolled to
// `max_recursion` nested expansions of a rule inside itself. Throws zipage::error "grammar: ..." naming what is
// wrong.
[[nodiscard]] inline std::string grammar_regex(std::string_view gbnf, int max_recursion = grammar_max_recursion) {
  check(max_recursion >= 0, "grammar: the recursion limit must be >= 0");
  const auto rules = grammar_detail::parser(gbnf).parse();
  grammar_detail::emitter e(rules, max_recursion);
  auto re = e.emit_rule("root");
  check(re.has_value(), "grammar: 'root' derives no finite string within ", max_recursion,
        " nested expansions of a rule inside itself");
  return *re;
}

// The rules of `gbnf` as regexes with calls: rules[0] is root's, and (?&N) in any of them calls rules[N] (a rule
// the grammar references inside its own expansion; names[N] its name). A grammar without recursion gives root's
// regex alone. Throws zipage::error "grammar: ..." naming what is wrong.
struct grammar_compiled {
  std::vector<std::string> rules;
  std::vector<std::string> names;
};
[[nodiscard]] inline grammar_compiled grammar_rules(std::string_view gbnf) {
  const auto rules = grammar_detail::parser(gbnf).parse();
  grammar_compiled out;
  out.names.push_back("root");
  for (std::size_t k = 0; k < out.names.size(); ++k) {  // the called rules, each once, as calls name them
    const std::string name = out.names[k];  // a copy: emitting grows `names`
    grammar_detail::emitter e(rules, 0, &out.names);
    auto re = e.emit_rule(name);
    check(re.has_value(), "grammar: '", name, "' derives nothing");
    out.rules.push_back(std::move(*re));
  }
  return out;
}

}  // namespace zipage
