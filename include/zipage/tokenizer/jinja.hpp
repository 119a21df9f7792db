#pragma once
// A Jinja2 interpreter for chat templates: the language subset that Hugging Face chat templates use,
// rendered as transformers renders them (jinja2 with trim_blocks, lstrip_blocks, the loop-controls
// extension, an immutable sandbox, and the globals raise_exception / strftime_now and the `tojson` filter
// of transformers' chat template code). So any checkpoint's own template renders the conversation, tools
// included, as vLLM and transformers would, instead of a hand-written copy per model family.
//
//   auto t = zipage::jinja::template_::parse(source);          // errors name the line
//   std::string text = t.render({{"messages", messages}, {"add_generation_prompt", true}});
//
// What is supported: {{ }}, {% %}, {# #} with '-' / '+' whitespace control; if/elif/else, for (else,
// `if` filter, tuple targets, loop.*), set (names, tuples, namespace attributes, blocks), macro (defaults,
// keyword arguments), filter blocks, break/continue, generation; literals, arithmetic, comparisons, `in`,
// `is` tests, conditional expressions, slicing, Python's str/dict/list methods that do not mutate, Jinja's
// filters and tests used by chat templates. Anything else is an error naming it and the line; mutation
// (list.append, dict.update) is refused as transformers' sandbox refuses it.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/tokenizer/jinja_value.hpp"
#include "zipage/tokenizer/unicode.hpp"

namespace zipage::jinja {

namespace detail {

// ---------------------------------------------------------------------------------------------
// Lexer: text, {{ output }}, {% block %} segments with Jinja's whitespace rules applied
// ---------------------------------------------------------------------------------------------
enum class tok : std::uint8_t { name, string, integer, number, op };
struct token {
  tok type;
  std::string text;  // a name, an operator, a string literal's decoded value, a number's digits
};
struct segment {
  enum class kind : std::uint8_t { text, output, block } type;
  std::string text;  // text segments
  std::vector<token> tokens;  // output and block segments
  int line = 1;
};

[[noreturn]] inline void syntax_error(int line, std::string_view what) {
  fail("chat template line ", line, ": ", what);
}

inline bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
inline bool is_digit(char c) { return c >= '0' && c <= '9'; }
inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// A string literal's body with Python's escapes decoded (unknown escapes kept, as Python keeps them).
inline std::string unescape(std::string_view body, int line) {
  std::string out;
  for (std::size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out += body[i];
      continue;
    }
    const char c = body[++i];
    auto hex = [&](std::size_t digits) {
      if (i + digits >= body.size()) syntax_error(line, "a truncated \\x/\\u escape");
      std::uint32_t cp = 0;
      for (std::size_t k = 0; k < digits; ++k) {
        const char h = body[i + 1 + k];
        cp = cp * 16 + static_cast<std::uint32_t>(is_digit(h) ? h - '0' : (h | 32) - 'a' + 10);
        if (!is_digit(h) && !((h | 32) >= 'a' && (h | 32) <= 'f')) syntax_error(line, "a bad \\x/\\u escape");
      }
      i += digits;
      unicode::append_utf8(out, cp);
    };
    switch (c) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case 'a': out += '\a'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case '\n': break;  // a line continuation
      case 'x': hex(2); break;
      case 'u': hex(4); break;
      case 'U': hex(8); break;
      default:
        if (c >= '0' && c <= '7') {
          std::uint32_t cp = static_cast<std::uint32_t>(c - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k)
            cp = cp * 8 + static_cast<std::uint32_t>(body[++i] - '0');
          unicode::append_utf8(out, cp);
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

class lexer {
 public:
  explicit lexer(std::string_view source) {
    // Jinja normalises line endings to \n and drops one trailing newline (keep_trailing_newline off).
    for (std::size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<segment> run() {
    std::vector<segment> out;
    bool line_starting = true;  // the last tag ended a line (lstrip_blocks strips a lone tag's indent)
    std::size_t pos = 0;
    while (pos < src_.size()) {
      const std::size_t open = find_tag(pos);
      std::string text = src_.substr(pos, open - pos);
      if (open == src_.size()) {
        push_text(out, std::move(text));
        break;
      }
      const char type = src_[open + 1];  // '{', '%', '#'
      std::size_t p = open + 2;
      const char sign = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p] : '\0';
      if (sign) ++p;
      if (sign == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (sign != '+' && type != '{') {  // lstrip_blocks: a block or comment tag alone on its line
        const std::size_t nl = text.rfind('\n');
        const std::size_t from = nl == std::string::npos ? 0 : nl + 1;
        if ((nl != std::string::npos || line_starting) &&
            text.find_first_not_of(" \t\f\v", from) == std::string::npos)
          text.resize(from);
      }
      push_text(out, std::move(text));
      const int line = line_at(open);
      if (type == '#') {
        const std::size_t close = src_.find("#}", p);
        if (close == std::string::npos) syntax_error(line, "a comment is not closed");
        const bool signed_end = close > p && (src_[close - 1] == '-' || src_[close - 1] == '+');  // -#} / +#}
        pos = finish_tag(signed_end ? close - 1 : close, close + 2, '#', line_starting);
        continue;
      }
      segment seg{type == '{' ? segment::kind::output : segment::kind::block, {}, {}, line};
      p = tokenize(p, type == '{' ? '}' : '%', seg.tokens, line);
      if (seg.type == segment::kind::block && seg.tokens.size() == 1 && seg.tokens[0].text == "raw" &&
          seg.tokens[0].type == tok::name) {
        pos = raw_block(out, p, line, line_starting);
        continue;
      }
      const std::size_t close = p;  // at the closing '-'? '}}' or '%}'
      const std::size_t end = close + (src_[close] == '-' || src_[close] == '+' ? 3 : 2);
      pos = finish_tag(close, end, type, line_starting);
      out.push_back(std::move(seg));
    }
    return out;
  }

 private:
  std::string src_;

  // The line of `pos`; tags are visited in order, so counting resumes where the last call stopped.
  int line_at(std::size_t pos) {
    if (pos < counted_to_) counted_to_ = 0, counted_lines_ = 1;
    counted_lines_ += static_cast<int>(std::count(src_.begin() + static_cast<std::ptrdiff_t>(counted_to_),
                                                  src_.begin() + static_cast<std::ptrdiff_t>(pos), '\n'));
    counted_to_ = pos;
    return counted_lines_;
  }
  std::size_t counted_to_ = 0;
  int counted_lines_ = 1;

  std::size_t find_tag(std::size_t from) const {
    for (std::size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1))
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return src_.size();
  }

  static void push_text(std::vector<segment>& out, std::string text) {
    if (text.empty()) return;
    if (!out.empty() && out.back().type == segment::kind::text) {
      out.back().text += text;
    } else {
      out.push_back({segment::kind::text, std::move(text), {}, 0});
    }
  }

  // After a tag whose closing delimiter spans [close, end): '-' strips the whitespace that follows;
  // trim_blocks drops the newline right after a block or comment tag (not after '+' or an output tag).
  std::size_t finish_tag(std::size_t close, std::size_t end, char type, bool& line_starting) const {
    const char sign = src_[close] == '-' || src_[close] == '+' ? src_[close] : '\0';
    std::size_t pos = end;
    if (sign == '-') {
      while (pos < src_.size() && is_space(src_[pos])) ++pos;
    } else if (sign != '+' && type != '{' && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    line_starting = pos > end && src_[pos - 1] == '\n';
    return pos;
  }

  // {% raw %} ... {% endraw %}: the text between, as is (whitespace control on the tags applies).
  std::size_t raw_block(std::vector<segment>& out, std::size_t p, int line, bool& line_starting) {
    const std::size_t body = finish_tag(p, p + (src_[p] == '-' || src_[p] == '+' ? 3 : 2), '%', line_starting);
    for (std::size_t i = src_.find("{%", body); i != std::string::npos; i = src_.find("{%", i + 2)) {
      std::size_t k = i + 2;
      const bool strip = k < src_.size() && src_[k] == '-';
      if (k < src_.size() && (src_[k] == '-' || src_[k] == '+')) ++k;
      while (k < src_.size() && is_space(src_[k])) ++k;
      if (src_.compare(k, 6, "endraw") != 0) continue;
      k += 6;
      while (k < src_.size() && is_space(src_[k])) ++k;
      if (k >= src_.size()) break;
      std::string text = src_.substr(body, i - body);
      if (strip)
        while (!text.empty() && is_space(text.back())) text.pop_back();
      push_text(out, std::move(text));
      const std::size_t end = k + (src_[k] == '-' || src_[k] == '+' ? 3 : 2);
      return finish_tag(k, end, '%', line_starting);
    }
    syntax_error(line, "{% raw %} without {% endraw %}");
  }

  // Tokens from `p` up to the tag's closing delimiter (only outside brackets, as Jinja balances them);
  // returns the delimiter's position.
  std::size_t tokenize(std::size_t p, char closer, std::vector<token>& out, int line) const {
    int depth = 0;
    for (;;) {
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (p >= src_.size()) syntax_error(line, closer == '}' ? "'{{' is not closed" : "'{%' is not closed");
      const char c = src_[p];
      if (depth == 0) {
        if ((c == '-' || c == '+') && p + 2 < src_.size() && src_[p + 1] == closer && src_[p + 2] == '}') return p;
        if (c == closer && p + 1 < src_.size() && src_[p + 1] == '}') return p;
      }
      if (is_name_start(c)) {
        std::size_t e = p;
        while (e < src_.size() && (is_name_start(src_[e]) || is_digit(src_[e]))) ++e;
        out.push_back({tok::name, src_.substr(p, e - p)});
        p = e;
      } else if (is_digit(c)) {
        std::size_t e = p;
        bool is_float = false;
        while (e < src_.size() && (is_digit(src_[e]) || src_[e] == '_')) ++e;
        if (e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1])) {
          is_float = true;
          ++e;
          while (e < src_.size() && (is_digit(src_[e]) || src_[e] == '_')) ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
          std::size_t k = e + 1;
          if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
          if (k < src_.size() && is_digit(src_[k])) {
            is_float = true;
            e = k;
            while (e < src_.size() && is_digit(src_[e])) ++e;
          }
        }
        std::string digits;
        for (std::size_t k = p; k < e; ++k)
          if (src_[k] != '_') digits += src_[k];
        out.push_back({is_float ? tok::number : tok::integer, digits});
        p = e;
      } else if (c == '\'' || c == '"') {
        std::size_t e = p + 1;
        while (e < src_.size() && src_[e] != c) e += src_[e] == '\\' ? 2 : 1;
        if (e >= src_.size()) syntax_error(line, "a string literal is not closed");
        std::string s = unescape(std::string_view(src_).substr(p + 1, e - p - 1), line);
        // adjacent literals join ('a' 'b' is 'ab')
        if (!out.empty() && out.back().type == tok::string && last_was_string_) {
          out.back().text += s;
        } else {
          out.push_back({tok::string, std::move(s)});
        }
        p = e + 1;
        last_was_string_ = true;
        continue;
      } else {
        static constexpr std::string_view ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%",
                                                   "~",  "<",  ">",  "(",  ")",  "[",  "]", "{", "}", ".", ",",
                                                   ":",  "|",  "="};
        std::string_view found;
        for (const std::string_view op : ops)
          if (src_.compare(p, op.size(), op) == 0) {
            found = op;
            break;
          }
        if (found.empty()) syntax_error(line, std::string("unexpected character '") + c + "'");
        if (found == "(" || found == "[" || found == "{") ++depth;
        if (found == ")" || found == "]" || found == "}") {
          if (depth == 0) syntax_error(line, std::string("unexpected '") + std::string(found) + "'");
          --depth;
        }
        out.push_back({tok::op, std::string(found)});
        p += found.size();
      }
      last_was_string_ = false;
    }
  }
  mutable bool last_was_string_ = false;
};

// ---------------------------------------------------------------------------------------------
// Syntax tree
// ---------------------------------------------------------------------------------------------
struct expr;
using expr_ptr = std::shared_ptr<const expr>;
using keyword_args = std::vector<std::pair<std::string, expr_ptr>>;

struct expr {
  enum class kind : std::uint8_t {
    literal, name, attr, item, slice, call, filter, test, not_, neg, pos, binary, compare, and_, or_, cond,
    list, tuple, dict
  };
  kind type;
  int line = 0;
  value literal;
  std::string name;  // name / attribute / filter / test / binary operator
  // attr, item: [object(, index)]; slice: [object, start, stop, step] (null when absent); call: [callee,
  // args...]; filter/test: [input, args...] (a filter block's input is null); cond: [then, test, else];
  // compare: operands; list/tuple: items; dict: key, value, key, value...
  std::vector<expr_ptr> args;
  keyword_args kwargs;
  std::vector<std::string> ops;  // compare: "==", "!=", "<", "<=", ">", ">=", "in", "not in"
  int depth = 1;                 // of the tree below (bounded, so evaluating it cannot exhaust the stack)
};

inline constexpr int max_nesting = 256;  // expression depth and block nesting a template may have

struct stmt;
using stmt_ptr = std::shared_ptr<const stmt>;
using body = std::vector<stmt_ptr>;

struct stmt {
  enum class kind : std::uint8_t { text, output, if_, for_, set, set_block, macro, filter_block, break_, continue_, scope };
  kind type;
  int line = 0;
  std::string text;                                 // text; macro name
  expr_ptr value;                                   // output / set value / for iterable / filter chain
  std::vector<std::pair<expr_ptr, body>> branches;  // if: (test, body)...; else: (null, body)
  std::vector<std::string> targets;                 // for / set names; set ns.attr: {ns, attr}
  bool attribute_target = false;
  expr_ptr loop_filter;                             // for ... if test
  body main, otherwise;                             // for body / else; macro, set_block, filter, scope body
  std::vector<std::pair<std::string, expr_ptr>> params;  // macro (default or null)
};

// Filters and tests the interpreter knows. An unknown one is an error when rendering reaches it (Jinja
// reports those inside conditional blocks at run time too, and templates keep such branches for other
// engines).
inline bool known_filter(std::string_view f) {
  static constexpr std::string_view names[] = {
      "abs", "attr", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape", "first",
      "float", "forceescape", "format", "indent", "int", "items", "join", "last", "length", "list", "lower",
      "map", "max", "min", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select",
      "selectattr", "sort", "string", "sum", "title", "tojson", "trim", "unique", "upper", "wordcount", "batch"};
  return std::find(std::begin(names), std::end(names), f) != std::end(names);
}
inline bool known_test(std::string_view t) {
  static constexpr std::string_view names[] = {
      "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even", "false", "filter",
      "float", "ge", "gt", "greaterthan", "in", "integer", "iterable", "le", "lessthan", "lower", "lt",
      "mapping", "ne", "none", "number", "odd", "sameas", "sequence", "string", "test", "true", "undefined",
      "upper", "==", "!=", "<", "<=", ">", ">="};
  return std::find(std::begin(names), std::end(names), t) != std::end(names);
}

// ---------------------------------------------------------------------------------------------
// Parser (Jinja's grammar and operator precedence)
// ---------------------------------------------------------------------------------------------
class parser {
 public:
  explicit parser(std::vector<segment> segs) : segs_(std::move(segs)) {}

  body parse_template() {
    body out = parse_body({});
    if (seg_ < segs_.size()) syntax_error(segs_[seg_].line, "unexpected '" + segs_[seg_].tokens[0].text + "'");
    return out;
  }

 private:
  std::vector<segment> segs_;
  std::size_t seg_ = 0;
  const std::vector<token>* toks_ = nullptr;
  std::size_t pos_ = 0;
  int line_ = 0;

  // ---- statements ----
  static std::shared_ptr<stmt> make_stmt(stmt::kind k, int line) {
    auto st = std::make_shared<stmt>();
    st->type = k;
    st->line = line;
    return st;
  }

  // Statements until a block tag whose first word is in `ends` (left unconsumed).
  body parse_body(std::initializer_list<std::string_view> ends) {
    body out;
    while (seg_ < segs_.size()) {
      segment& s = segs_[seg_];
      if (s.type == segment::kind::text) {
        auto st = make_stmt(stmt::kind::text, s.line);
        st->text = std::move(s.text);
        out.push_back(std::move(st));
        ++seg_;
        continue;
      }
      begin(s);
      if (s.type == segment::kind::output) {
        ++seg_;
        auto st = make_stmt(stmt::kind::output, line_);
        st->value = parse_tuple_expr();
        expect_end();
        out.push_back(std::move(st));
        continue;
      }
      if (toks_->empty() || (*toks_)[0].type != tok::name) syntax_error(line_, "a block tag needs a statement name");
      const std::string& word = (*toks_)[0].text;
      if (std::find(ends.begin(), ends.end(), word) != ends.end()) return out;
      if (word.starts_with("end") || word == "elif" || word == "else")
        syntax_error(line_, "unexpected '{% " + word + " %}'" +
                                (ends.size() == 0 ? std::string(": no block is open")
                                                  : ": the open block ends with {% " + std::string(*(ends.end() - 1)) + " %}"));
      ++seg_;
      pos_ = 1;
      out.push_back(parse_statement(word));
    }
    if (ends.size() != 0)
      syntax_error(segs_.empty() ? 1 : segs_.back().line,
                   "the template ends before {% " + std::string(*(ends.end() - 1)) + " %}");  // the closing tag
    return out;
  }

  void begin(const segment& s) {
    toks_ = &s.tokens;
    pos_ = 0;
    line_ = s.line;
  }

  // At the block tag that parse_body stopped at: its first word; consumes it and positions after it.
  std::string take_end_tag() {
    begin(segs_[seg_]);
    ++seg_;
    pos_ = 1;
    return (*toks_)[0].text;
  }

  stmt_ptr parse_statement(const std::string& word) {
    const nesting guard(this);
    const int line = line_;
    auto st = std::make_shared<stmt>();
    st->line = line;
    if (word == "if") {
      st->type = stmt::kind::if_;
      expr_ptr test = parse_expression();
      expect_end();
      for (;;) {
        body b = parse_body({"elif", "else", "endif"});
        st->branches.emplace_back(test, std::move(b));
        const std::string end = take_end_tag();
        if (end == "endif") break;
        if (end == "elif") {
          test = parse_expression();
          expect_end();
          continue;
        }
        expect_end();
        body e = parse_body({"endif"});
        st->branches.emplace_back(nullptr, std::move(e));
        take_end_tag();
        break;
      }
      expect_end();
    } else if (word == "for") {
      st->type = stmt::kind::for_;
      st->targets = parse_targets();
      expect_name("in");
      st->value = parse_tuple_expr(/*allow_cond=*/false);
      if (skip_name("if")) st->loop_filter = parse_expression();
      if (skip_name("recursive")) syntax_error(line_, "recursive loops are not supported");
      expect_end();
      st->main = parse_body({"else", "endfor"});
      if (take_end_tag() == "else") {
        expect_end();
        st->otherwise = parse_body({"endfor"});
        take_end_tag();
      }
      expect_end();
    } else if (word == "set") {
      if (peek_op(1, ".")) {
        st->attribute_target = true;
        std::string ns = expect_name_token();
        advance();  // '.'
        st->targets = {std::move(ns), expect_name_token()};
      } else {
        st->targets = parse_targets();
      }
      if (skip_op("=")) {
        st->type = stmt::kind::set;
        st->value = parse_tuple_expr();
        expect_end();
      } else {
        if (st->attribute_target || st->targets.size() != 1) syntax_error(line_, "a {% set %} block sets one name");
        st->type = stmt::kind::set_block;
        if (at_op("|")) st->value = parse_filter_chain(nullptr);
        expect_end();
        st->main = parse_body({"endset"});
        take_end_tag();
        expect_end();
      }
    } else if (word == "macro") {
      st->type = stmt::kind::macro;
      st->text = expect_name_token();
      expect_op("(");
      while (!skip_op(")")) {
        if (!st->params.empty()) expect_op(",");
        if (skip_op(")")) break;
        std::string p = expect_name_token();
        expr_ptr def = skip_op("=") ? parse_expression() : nullptr;
        st->params.emplace_back(std::move(p), std::move(def));
      }
      expect_end();
      st->main = parse_body({"endmacro"});
      take_end_tag();
      if (pos_ < toks_->size() && (*toks_)[pos_].type == tok::name) ++pos_;  // {% endmacro name %}
      expect_end();
    } else if (word == "filter") {
      st->type = stmt::kind::filter_block;
      st->value = parse_filter_chain(nullptr, /*leading_pipe=*/false);
      expect_end();
      st->main = parse_body({"endfilter"});
      take_end_tag();
      expect_end();
    } else if (word == "generation") {  // transformers' marker of the assistant's tokens: its body as is
      st->type = stmt::kind::scope;
      expect_end();
      st->main = parse_body({"endgeneration"});
      take_end_tag();
      expect_end();
    } else if (word == "break" || word == "continue") {
      st->type = word == "break" ? stmt::kind::break_ : stmt::kind::continue_;
      expect_end();
    } else {
      syntax_error(line, "unknown or unsupported statement '{% " + word + " %}'");
    }
    return st;
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    const bool paren = skip_op("(");
    do {
      names.push_back(expect_name_token());
    } while (skip_op(","));
    if (paren) expect_op(")");
    return names;
  }

  // ---- token helpers ----
  [[nodiscard]] const token* peek(std::size_t ahead = 0) const {
    return pos_ + ahead < toks_->size() ? &(*toks_)[pos_ + ahead] : nullptr;
  }
  [[nodiscard]] bool at_op(std::string_view op) const {
    const token* t = peek();
    return t && t->type == tok::op && t->text == op;
  }
  [[nodiscard]] bool peek_op(std::size_t ahead, std::string_view op) const {
    const token* t = peek(ahead);
    return t && t->type == tok::op && t->text == op;
  }
  [[nodiscard]] bool at_name(std::string_view n) const {
    const token* t = peek();
    return t && t->type == tok::name && t->text == n;
  }
  void advance() { ++pos_; }
  bool skip_op(std::string_view op) {
    if (!at_op(op)) return false;
    ++pos_;
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!at_name(n)) return false;
    ++pos_;
    return true;
  }
  [[noreturn]] void unexpected(std::string_view wanted) const {
    const token* t = peek();
    syntax_error(line_, "expected " + std::string(wanted) + ", got " + (t ? "'" + t->text + "'" : "the end of the tag"));
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) unexpected("'" + std::string(op) + "'");
  }
  void expect_name(std::string_view n) {
    if (!skip_name(n)) unexpected("'" + std::string(n) + "'");
  }
  std::string expect_name_token() {
    const token* t = peek();
    if (!t || t->type != tok::name) unexpected("a name");
    ++pos_;
    return t->text;
  }
  void expect_end() const {
    if (pos_ != toks_->size()) unexpected("the end of the tag");
  }

  expr_ptr node(expr::kind k, std::vector<expr_ptr> args = {}, std::string name = {}) const {
    auto e = std::make_shared<expr>();
    e->type = k;
    e->line = line_;
    e->args = std::move(args);
    e->name = std::move(name);
    return seal(std::move(e));
  }
  // Records the node's depth; a template nested deeper than max_nesting is refused.
  expr_ptr seal(std::shared_ptr<expr> e) const {
    int d = 0;
    for (const auto& a : e->args)
      if (a) d = std::max(d, a->depth);
    for (const auto& [k, a] : e->kwargs) d = std::max(d, a->depth);
    e->depth = d + 1;
    if (e->depth > max_nesting) syntax_error(line_, "the expression is nested too deeply");
    return e;
  }

  // ---- expressions ----
  // An expression, or a tuple of them when commas separate several (`{{ a, b }}`, `set x = 1, 2`).
  expr_ptr parse_tuple_expr(bool allow_cond = true) {
    std::vector<expr_ptr> items;
    bool comma = false;
    for (;;) {
      items.push_back(allow_cond ? parse_expression() : parse_or());
      if (!skip_op(",")) break;
      comma = true;
      if (!peek() || at_name("if")) break;
    }
    if (!comma) return items[0];
    return node(expr::kind::tuple, std::move(items));
  }

  expr_ptr parse_expression() {
    expr_ptr e = parse_or();
    while (skip_name("if")) {
      expr_ptr test = parse_or();
      expr_ptr otherwise = skip_name("else") ? parse_expression() : nullptr;
      e = node(expr::kind::cond, {e, test, otherwise});
    }
    return e;
  }
  expr_ptr parse_or() {
    expr_ptr e = parse_and();
    while (skip_name("or")) e = node(expr::kind::or_, {e, parse_and()});
    return e;
  }
  expr_ptr parse_and() {
    expr_ptr e = parse_not();
    while (skip_name("and")) e = node(expr::kind::and_, {e, parse_not()});
    return e;
  }
  expr_ptr parse_not() {
    if (skip_name("not")) {
      const nesting guard(this);
      return node(expr::kind::not_, {parse_not()});
    }
    return parse_compare();
  }
  // Bounds the parser's own recursion (brackets, unary operators, blocks) by max_nesting.
  struct nesting {
    explicit nesting(parser* p) : p_(p) {
      if (++p_->nesting_ > max_nesting) syntax_error(p_->line_, "the template is nested too deeply");
    }
    ~nesting() { --p_->nesting_; }
    nesting(const nesting&) = delete;
    nesting& operator=(const nesting&) = delete;
    parser* p_;
  };
  int nesting_ = 0;
  expr_ptr parse_compare() {
    expr_ptr first = parse_math1();
    std::vector<expr_ptr> operands{first};
    std::vector<std::string> ops;
    for (;;) {
      const token* t = peek();
      if (t && t->type == tok::op && (t->text == "==" || t->text == "!=" || t->text == "<" || t->text == "<=" ||
                                      t->text == ">" || t->text == ">=")) {
        ops.push_back(t->text);
        advance();
      } else if (at_name("in")) {
        ops.emplace_back("in");
        advance();
      } else if (at_name("not") && peek(1) && peek(1)->type == tok::name && peek(1)->text == "in") {
        ops.emplace_back("not in");
        pos_ += 2;
      } else {
        break;
      }
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto e = std::make_shared<expr>();
    e->type = expr::kind::compare;
    e->line = line_;
    e->args = std::move(operands);
    e->ops = std::move(ops);
    return seal(std::move(e));
  }
  expr_ptr binary_loop(expr_ptr (parser::*next)(), std::initializer_list<std::string_view> ops) {
    expr_ptr e = (this->*next)();
    for (;;) {
      const token* t = peek();
      if (!t || t->type != tok::op || std::find(ops.begin(), ops.end(), t->text) == ops.end()) return e;
      std::string op = t->text;
      advance();
      e = node(expr::kind::binary, {e, (this->*next)()}, std::move(op));
    }
  }
  expr_ptr parse_math1() { return binary_loop(&parser::parse_concat, {"+", "-"}); }
  expr_ptr parse_concat() { return binary_loop(&parser::parse_math2, {"~"}); }
  expr_ptr parse_math2() { return binary_loop(&parser::parse_pow, {"*", "/", "//", "%"}); }
  expr_ptr parse_pow() { return binary_loop(&parser::parse_unary_filtered, {"**"}); }
  expr_ptr parse_unary_filtered() { return parse_unary(true); }
  expr_ptr parse_unary(bool with_filter) {
    const nesting guard(this);
    expr_ptr e;
    if (skip_op("-")) {
      e = node(expr::kind::neg, {parse_unary(false)});
    } else if (skip_op("+")) {
      e = node(expr::kind::pos, {parse_unary(false)});
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filter_expr(e) : e;
  }

  expr_ptr parse_primary() {
    const nesting guard(this);
    const token* t = peek();
    if (!t) unexpected("an expression");
    auto lit = [&](value v) {
      auto e = std::make_shared<expr>();
      e->type = expr::kind::literal;
      e->line = line_;
      e->literal = std::move(v);
      return e;
    };
    switch (t->type) {
      case tok::name: {
        advance();
        if (t->text == "true" || t->text == "True") return lit(value(true));
        if (t->text == "false" || t->text == "False") return lit(value(false));
        if (t->text == "none" || t->text == "None") return lit(value::none());
        return node(expr::kind::name, {}, t->text);
      }
      case tok::string: advance(); return lit(value(t->text));
      case tok::integer: {
        advance();
        std::int64_t v = 0;
        const auto r = std::from_chars(t->text.data(), t->text.data() + t->text.size(), v);
        if (r.ec != std::errc() || r.ptr != t->text.data() + t->text.size())
          syntax_error(line_, "the integer " + t->text.substr(0, 40) + " is out of range");
        return lit(value(v));
      }
      case tok::number: {
        advance();
        double v = 0;
        const auto r = std::from_chars(t->text.data(), t->text.data() + t->text.size(), v);
        if (r.ec != std::errc()) syntax_error(line_, "the number " + t->text.substr(0, 40) + " is out of range");
        return lit(value(v));
      }
      case tok::op: break;
    }
    if (skip_op("(")) {
      if (skip_op(")")) return node(expr::kind::tuple);
      std::vector<expr_ptr> items{parse_expression()};
      bool comma = false;
      while (skip_op(",")) {
        comma = true;
        if (at_op(")")) break;
        items.push_back(parse_expression());
      }
      expect_op(")");
      return comma ? node(expr::kind::tuple, std::move(items)) : items[0];
    }
    if (skip_op("[")) {
      std::vector<expr_ptr> items;
      while (!skip_op("]")) {
        if (!items.empty()) expect_op(",");
        if (skip_op("]")) break;
        items.push_back(parse_expression());
      }
      return node(expr::kind::list, std::move(items));
    }
    if (skip_op("{")) {
      std::vector<expr_ptr> items;
      while (!skip_op("}")) {
        if (!items.empty()) expect_op(",");
        if (skip_op("}")) break;
        items.push_back(parse_expression());
        expect_op(":");
        items.push_back(parse_expression());
      }
      return node(expr::kind::dict, std::move(items));
    }
    unexpected("an expression");
  }

  expr_ptr parse_postfix(expr_ptr e) {
    for (;;) {
      if (skip_op(".")) {
        const token* t = peek();
        if (t && t->type == tok::name) {
          advance();
          e = node(expr::kind::attr, {e}, t->text);
        } else if (t && t->type == tok::integer) {
          advance();
          auto idx = std::make_shared<expr>();
          idx->type = expr::kind::literal;
          std::int64_t v = 0;
          if (std::from_chars(t->text.data(), t->text.data() + t->text.size(), v).ec != std::errc())
            syntax_error(line_, "the index " + t->text.substr(0, 40) + " is out of range");
          idx->literal = value(v);
          e = node(expr::kind::item, {e, idx});
        } else {
          unexpected("an attribute name");
        }
      } else if (skip_op("[")) {
        e = parse_subscript(e);
      } else if (at_op("(")) {
        e = parse_call(e);
      } else {
        return e;
      }
    }
  }

  expr_ptr parse_subscript(expr_ptr object) {
    expr_ptr parts[3];
    int part = 0;
    bool slice = false;
    for (;;) {
      if (at_op("]")) break;
      if (skip_op(":")) {
        slice = true;
        if (++part > 2) unexpected("']'");
        continue;
      }
      if (parts[part]) unexpected("':' or ']'");
      parts[part] = parse_expression();
    }
    expect_op("]");
    if (!slice) {
      if (!parts[0]) unexpected("an index");
      return node(expr::kind::item, {std::move(object), parts[0]});
    }
    return node(expr::kind::slice, {std::move(object), parts[0], parts[1], parts[2]});
  }

  // `(args)` after a callee, a filter or a test: positional then keyword arguments.
  void parse_call_args(std::vector<expr_ptr>& positional, keyword_args& keywords) {
    expect_op("(");
    bool first = true;
    while (!skip_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (skip_op(")")) break;
      if (peek() && peek()->type == tok::name && peek_op(1, "=")) {
        std::string k = peek()->text;
        pos_ += 2;
        keywords.emplace_back(std::move(k), parse_expression());
      } else {
        if (!keywords.empty()) syntax_error(line_, "a positional argument follows a keyword argument");
        positional.push_back(parse_expression());
      }
    }
  }
  expr_ptr parse_call(expr_ptr callee) {
    auto e = std::make_shared<expr>();
    e->type = expr::kind::call;
    e->line = line_;
    e->args.push_back(std::move(callee));
    parse_call_args(e->args, e->kwargs);
    return seal(std::move(e));
  }

  expr_ptr parse_filter_expr(expr_ptr e) {
    for (;;) {
      if (at_op("|")) {
        e = parse_filter_chain(e, true, /*one=*/true);
      } else if (skip_name("is")) {
        const bool negated = skip_name("not");
        std::string name = expect_name_token();
        auto t = std::make_shared<expr>();
        t->type = expr::kind::test;
        t->line = line_;
        t->name = std::move(name);
        t->args.push_back(e);
        const token* n = peek();
        if (at_op("(")) {
          parse_call_args(t->args, t->kwargs);
        } else if (n && (n->type == tok::string || n->type == tok::integer || n->type == tok::number ||
                         (n->type == tok::name && n->text != "else" && n->text != "or" && n->text != "and") ||
                         at_op("[") || at_op("{"))) {
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = negated ? node(expr::kind::not_, {seal(t)}) : seal(t);
      } else if (at_op("(")) {
        e = parse_call(e);
      } else {
        return e;
      }
    }
  }

  // `| name(args) | name ...` applied to `input` (null: a filter block's body); `leading_pipe` false for
  // {% filter name %}; `one` stops after one filter (parse_filter_expr loops itself).
  expr_ptr parse_filter_chain(expr_ptr input, bool leading_pipe = true, bool one = false) {
    if (leading_pipe) expect_op("|");
    for (;;) {
      std::string name = expect_name_token();
      auto f = std::make_shared<expr>();
      f->type = expr::kind::filter;
      f->line = line_;
      f->name = std::move(name);
      f->args.push_back(input);
      if (at_op("(")) parse_call_args(f->args, f->kwargs);
      input = seal(std::move(f));
      if (one || !skip_op("|")) return input;
    }
  }
};

}  // namespace detail

// Options of one rendering.
struct render_options {
  // strftime_now's clock; unset: the local time now (transformers' datetime.now()).
  std::optional<std::tm> now{};
};

// A parsed template; render() may be called any number of times, from several threads.
class template_ {
 public:
  static template_ parse(std::string_view source) {
    template_ t;
    t.body_ = std::make_shared<const detail::body>(detail::parser(detail::lexer(source).run()).parse_template());
    return t;
  }
  [[nodiscard]] std::string render(const std::vector<std::pair<std::string, value>>& variables,
                                   const render_options& options = {}) const;

 private:
  std::shared_ptr<const detail::body> body_;
};

}  // namespace zipage::jinja

#include "zipage/tokenizer/jinja_render.hpp"
