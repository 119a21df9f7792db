#pragma once
// Structured outputs (vLLM's guided_choice, guided_regex, guided_json, guided_grammar and structural_tag): the whole
// generated text must be one of a list of strings, match a regular expression, be JSON that a JSON Schema describes
// (json_schema.hpp compiles the schema to regexes), a string a GBNF grammar derives (grammar.hpp) or text with
// structures where triggers occur (structural_tag.hpp, which embeds small automata in the syntax tree). Each
// compiles to a DFA over bytes, equivalent states merged, of at most guided_max_dfa_states states; a grammar or
// schema that recurses compiles to a pushdown grammar instead (pushdown.hpp: rules, each such a DFA whose states may
// call rules), exact at any depth. At each step the tokens that may come next are those whose bytes keep the text a
// prefix of a match, found by a walk of the vocabulary's byte trie that prunes dead prefixes, and EOS may come only
// at a whole match. A DFA state's allowed set is computed once per guide (memoised, thread-safe: the state depends
// only on the bytes generated so far); a pushdown guide keeps each top frame's part (pushdown.hpp). Either is kept
// as the shorter list (guide_tokens): the allowed ids, or the others when most are allowed. make_logit_edits
// (logits_processors.hpp) turns it into an allowed-ids edit, or a ban of the others, which both the CPU and the CUDA
// samplers apply.
//
// Regex subset (whole-output match, as vLLM/outlines: ^ and $ are implicit, and allowed only at the ends):
// literals (UTF-8 characters whole), escapes \d \w \s \D \W \S \n \t \r \f \v \xHH \uHHHH and escaped
// punctuation, classes [a-z0-9_] and [^...] (ASCII members; a negated class also matches every non-ASCII
// character), `.` (any character but \n), groups (...), (?:...), (?P<name>...), (?<name>...), alternation |,
// quantifiers * + ? {m} {m,} {m,n} (lazy forms allowed: the language is the same). Backreferences, lookaround,
// word boundaries, inline flags and possessive quantifiers are errors naming them. (?%N) is a syntax tree the
// caller builds beside the text (a JSON schema's multipleOf automaton, json_schema_node); where the caller gives
// none (guided_regex, a schema's pattern) it is an error as any other (?...) group; (?&N), likewise, a call of rule
// N of a pushdown grammar (grammar.hpp's and json_schema.hpp's rules).
#include <algorithm>
#include <array>
#include <bitset>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/types.hpp"
#include "zipage/sampling/byte_dfa.hpp"
#include "zipage/sampling/pushdown.hpp"
#include "zipage/sampling/sampling_params.hpp"
#include "zipage/tokenizer/utf8.hpp"
#if !defined(__CUDACC__)
#include "zipage/sampling/grammar.hpp"
#include "zipage/sampling/json_schema.hpp"
#endif

namespace zipage {

namespace guided_detail {

using byte_set = std::bitset<256>;

// A small automaton over bytes that a syntax tree embeds whole (structural_tag.hpp's free text: text in which none
// of some strings occurs, built as an Aho-Corasick automaton rather than as regex text). State 0 is the start; a
// state may be unable to reach an accepting one (determinize prunes it).
struct byte_automaton {
  std::vector<std::vector<byte_dfa::range>> edges;  // per state, sorted disjoint byte ranges
  std::vector<std::uint8_t> accepting;
};

// The regex's syntax tree (and the trees the other compilers build).
struct node {
  // automaton: the language of `machine`, embedded as it is. call: the text of the pushdown grammar's rule `rule`
  // (a call edge of the DFA, which a pushdown guide follows with its stack; pushdown.hpp).
  enum kind_t { set, concat, alt, repeat, automaton, call } kind = concat;  // an empty concat is the empty string
  byte_set bytes{};
  std::vector<node> kids{};
  int min = 0, max = 0;  // repeat: max -1 = unbounded
  std::shared_ptr<const byte_automaton> machine{};
  std::int32_t rule = -1;  // call
};

inline node literal(std::string_view s) {
  node n{node::concat};
  for (const char c : s) {
    node b{node::set};
    b.bytes.set(static_cast<unsigned char>(c));
    n.kids.push_back(std::move(b));
  }
  return n;
}
inline node byte_range(int lo, int hi) {
  node n{node::set};
  for (int b = lo; b <= hi; ++b) n.bytes.set(static_cast<std::size_t>(b));
  return n;
}
inline node seq(std::vector<node> kids) { return node{node::concat, {}, std::move(kids)}; }
// Any well-formed UTF-8 character of 2 to 4 bytes (no overlong forms, no surrogates, nothing past U+10FFFF).
inline node non_ascii_char() {
  const auto cont = [] { return byte_range(0x80, 0xBF); };
  node alt{node::alt};
  alt.kids.push_back(seq({byte_range(0xC2, 0xDF), cont()}));
  alt.kids.push_back(seq({byte_range(0xE0, 0xE0), byte_range(0xA0, 0xBF), cont()}));
  alt.kids.push_back(seq({byte_range(0xE1, 0xEC), cont(), cont()}));
  alt.kids.push_back(seq({byte_range(0xED, 0xED), byte_range(0x80, 0x9F), cont()}));
  alt.kids.push_back(seq({byte_range(0xEE, 0xEF), cont(), cont()}));
  alt.kids.push_back(seq({byte_range(0xF0, 0xF0), byte_range(0x90, 0xBF), cont(), cont()}));
  alt.kids.push_back(seq({byte_range(0xF1, 0xF3), cont(), cont(), cont()}));
  alt.kids.push_back(seq({byte_range(0xF4, 0xF4), byte_range(0x80, 0x8F), cont(), cont()}));
  return alt;
}
// A character class: its ASCII members, and whether every non-ASCII character belongs too.
inline node char_class(const byte_set& ascii, bool non_ascii) {
  node s{node::set, ascii};
  if (!non_ascii) return s;
  node alt{node::alt};
  alt.kids.push_back(std::move(s));
  alt.kids.push_back(non_ascii_char());
  return alt;
}

class regex_parser {
 public:
  static constexpr int max_repeat = 1000;
  static constexpr int max_depth = 200;  // groups nested deeper are refused (the parser recurses)

  // `embedded` (optional) gives the syntax tree (?%N) stands for. `calls` (optional: a grammar's rules, none for a
  // user's regex) is how many rules (?&N) may call, N < calls.
  explicit regex_parser(std::string_view re, std::function<node(std::size_t)> embedded = {}, std::size_t calls = 0)
      : re_(re), embedded_(std::move(embedded)), calls_(calls) {}

  node parse() {
    if (at('^')) ++i_;
    node n = alternation();
    if (i_ < re_.size()) {
      if (re_[i_] == ')') error("unbalanced ')'");
      error("unexpected '", re_[i_], "'");
    }
    return n;
  }

 private:
  std::string_view re_;
  std::function<node(std::size_t)> embedded_;
  std::size_t calls_ = 0;
  std::size_t i_ = 0;
  int depth_ = 0;

  template <class... A>
  [[noreturn]] void error(const A&... what) const {
    fail(what..., " at offset ", i_, " of \"", re_, "\"");
  }
  [[nodiscard]] bool at(char c) const { return i_ < re_.size() && re_[i_] == c; }
  [[nodiscard]] bool at_end_anchor() const { return at('$') && i_ + 1 == re_.size(); }

  node alternation() {
    node first = concatenation();
    if (!at('|')) return first;
    node alt{node::alt};
    alt.kids.push_back(std::move(first));
    while (at('|')) {
      ++i_;
      alt.kids.push_back(concatenation());
    }
    return alt;
  }

  node concatenation() {
    node n{node::concat};
    while (i_ < re_.size() && !at('|') && !at(')')) {
      if (at_end_anchor()) {
        ++i_;
        break;
      }
      if (at('^') || at('$')) error("anchor '", re_[i_], "' inside the regex (only at its ends)");
      node a = atom();
      n.kids.push_back(quantified(std::move(a)));
    }
    return n;
  }

  // At most one quantifier per atom (a second is "nothing to repeat", as Python's "multiple repeat").
  node quantified(node a) {
    {
      int lo = 0, hi = 0;
      if (at('*')) {
        lo = 0, hi = -1, ++i_;
      } else if (at('+')) {
        lo = 1, hi = -1, ++i_;
      } else if (at('?')) {
        lo = 0, hi = 1, ++i_;
      } else if (at('{')) {
        const std::size_t save = i_;
        if (!counted(lo, hi)) {
          i_ = save;  // not a quantifier: a literal '{' (as Python's re)
          return a;
        }
      } else {
        return a;
      }
      if (at('?')) ++i_;  // lazy: the same language
      else if (at('+')) error("possessive quantifiers are not supported");
      node r{node::repeat};
      r.kids.push_back(std::move(a));
      r.min = lo;
      r.max = hi;
      return r;
    }
  }

  std::optional<int> number() {
    const std::size_t b = i_;
    long v = 0;
    while (i_ < re_.size() && re_[i_] >= '0' && re_[i_] <= '9') {
      v = v * 10 + (re_[i_] - '0');
      if (v > max_repeat) error("repetition count above ", max_repeat);
      ++i_;
    }
    if (i_ == b) return std::nullopt;
    return static_cast<int>(v);
  }

  bool counted(int& lo, int& hi) {
    ++i_;  // '{'
    const auto m = number();
    if (!m) return false;
    lo = *m;
    hi = *m;
    if (at(',')) {
      ++i_;
      const auto n = number();
      hi = n ? *n : -1;
    }
    if (!at('}')) return false;
    ++i_;
    if (hi >= 0 && hi < lo) error("repetition {", lo, ",", hi, "} has its maximum below its minimum");
    return true;
  }

  node atom() {
    const char c = re_[i_];
    if (c == '(') return group();
    if (c == '[') return bracket();
    if (c == '.') {
      ++i_;
      byte_set s;
      for (int b = 0; b < 0x80; ++b) s.set(static_cast<std::size_t>(b));
      s.reset('\n');
      return char_class(s, true);
    }
    if (c == '\\') return escape_atom();
    if (c == '*' || c == '+' || c == '?') error("nothing to repeat before '", c, "'");
    return utf8_literal();
  }

  node utf8_literal() {
    const auto lead = static_cast<unsigned char>(re_[i_]);
    std::size_t n = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    n = std::min(n, re_.size() - i_);
    node lit = literal(re_.substr(i_, n));
    i_ += n;
    return lit;
  }

  node group() {
    if (++depth_ > max_depth) error("groups nested more than ", max_depth, " deep");
    ++i_;  // '('
    if (at('?')) {
      ++i_;
      if ((at('%') && embedded_) || (at('&') && calls_ > 0)) {
        const char kind = re_[i_++];
        std::size_t index = 0;
        const std::size_t digits = i_;
        for (; i_ < re_.size() && re_[i_] >= '0' && re_[i_] <= '9' && i_ - digits < 9; ++i_)
          index = index * 10 + static_cast<std::size_t>(re_[i_] - '0');
        if (i_ == digits || !at(')')) error("bad (?", kind, "N) group");
        ++i_;
        --depth_;
        if (kind == '%') return embedded_(index);
        if (index >= calls_) error("(?&", index, ") calls no rule (", calls_, " rules)");
        node n{node::call};
        n.rule = static_cast<std::int32_t>(index);
        return n;
      }
      if (at(':')) {
        ++i_;
      } else if (at('P') && i_ + 1 < re_.size() && re_[i_ + 1] == '<') {
        i_ += 2;
        skip_name();
      } else if (at('<') && i_ + 1 < re_.size() && re_[i_ + 1] != '=' && re_[i_ + 1] != '!') {
        ++i_;
        skip_name();
      } else if (at('=') || at('!') || at('<')) {
        error("lookaround assertions are not supported");
      } else if (at('P')) {
        error("named backreferences are not supported");
      } else {
        error("inline flags and other (?...) groups are not supported");
      }
    }
    node inner = alternation();
    if (!at(')')) error("missing ')'");
    ++i_;
    --depth_;
    return inner;
  }

  void skip_name() {
    while (i_ < re_.size() && re_[i_] != '>') ++i_;
    if (!at('>')) error("unterminated group name");
    ++i_;
  }

  // An escape's class (\d \w \s and negations), if it is one.
  static std::optional<std::pair<byte_set, bool>> class_escape(char c) {
    byte_set s;
    auto span = [&](char a, char b) {
      for (int x = a; x <= b; ++x) s.set(static_cast<std::size_t>(x));
    };
    switch (c) {
      case 'd': case 'D': span('0', '9'); break;
      case 'w': case 'W': span('a', 'z'); span('A', 'Z'); span('0', '9'); s.set('_'); break;
      case 's': case 'S':
        for (char x : {' ', '\t', '\n', '\r', '\f', '\v'}) s.set(static_cast<unsigned char>(x));
        break;
      default: return std::nullopt;
    }
    if (c == 'D' || c == 'W' || c == 'S') {
      byte_set ascii;
      for (int b = 0; b < 0x80; ++b) ascii.set(static_cast<std::size_t>(b));
      return std::pair{ascii & ~s, true};
    }
    return std::pair{s, false};
  }

  std::uint32_t hex(int digits) {
    std::uint32_t v = 0;
    for (int k = 0; k < digits; ++k, ++i_) {
      if (i_ >= re_.size()) error("truncated \\x or \\u escape");
      const char h = re_[i_];
      const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F'
                                                                                     ? h - 'A' + 10 : -1;
      if (d < 0) error("bad hex digit '", h, "'");
      v = v * 16 + static_cast<std::uint32_t>(d);
    }
    return v;
  }

  // After a backslash: a literal character's text, or a class (returned through cls).
  std::string escape(std::optional<std::pair<byte_set, bool>>& cls) {
    ++i_;  // '\'
    if (i_ >= re_.size()) error("trailing backslash");
    const char c = re_[i_];
    if ((cls = class_escape(c))) {
      ++i_;
      return {};
    }
    ++i_;
    switch (c) {
      case 'n': return "\n";
      case 't': return "\t";
      case 'r': return "\r";
      case 'f': return "\f";
      case 'v': return "\v";
      case 'x': {
        std::string s;
        utf8::append(s, static_cast<char32_t>(hex(2)));
        return s;
      }
      case 'u': {
        std::string s;
        utf8::append(s, static_cast<char32_t>(hex(4)));
        return s;
      }
      case 'b': case 'B': --i_; error("word boundaries (\\", c, ") are not supported");
      case 'A': case 'Z': case 'z': --i_; error("anchors (\\", c, ") are not supported");
      default: break;
    }
    if (c >= '0' && c <= '9') {
      --i_;
      error("backreferences (\\", c, ") are not supported");
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      --i_;
      error("unknown escape \\", c);
    }
    return std::string(1, c);
  }

  node escape_atom() {
    std::optional<std::pair<byte_set, bool>> cls;
    const std::string text = escape(cls);
    if (cls) return char_class(cls->first, cls->second);
    return literal(text);
  }

  node bracket() {
    ++i_;  // '['
    bool negated = false;
    if (at('^')) {
      negated = true;
      ++i_;
    }
    byte_set s;
    bool non_ascii = false, first = true;
    while (i_ < re_.size() && (!at(']') || first)) {
      first = false;
      int lo = -1;
      if (at('\\')) {
        std::optional<std::pair<byte_set, bool>> cls;
        const std::string t = escape(cls);
        if (cls) {
          s |= cls->first;
          non_ascii = non_ascii || cls->second;
          continue;
        }
        if (t.size() != 1 || static_cast<unsigned char>(t[0]) >= 0x80)
          error("non-ASCII characters in a character class are not supported");
        lo = static_cast<unsigned char>(t[0]);
      } else {
        if (static_cast<unsigned char>(re_[i_]) >= 0x80)
          error("non-ASCII characters in a character class are not supported");
        if (at('[') && i_ + 1 < re_.size() && re_[i_ + 1] == ':') error("POSIX classes [:...:] are not supported");
        lo = static_cast<unsigned char>(re_[i_++]);
      }
      int hi = lo;
      if (at('-') && i_ + 1 < re_.size() && re_[i_ + 1] != ']') {
        ++i_;
        if (at('\\')) {
          std::optional<std::pair<byte_set, bool>> cls;
          const std::string t = escape(cls);
          if (cls || t.size() != 1 || static_cast<unsigned char>(t[0]) >= 0x80) error("bad range end in a class");
          hi = static_cast<unsigned char>(t[0]);
        } else {
          if (static_cast<unsigned char>(re_[i_]) >= 0x80)
            error("non-ASCII characters in a character class are not supported");
          hi = static_cast<unsigned char>(re_[i_++]);
        }
        if (hi < lo) error("class range out of order");
      }
      for (int b = lo; b <= hi; ++b) s.set(static_cast<std::size_t>(b));
    }
    if (!at(']')) error("missing ']'");
    ++i_;
    if (!negated) return char_class(s, non_ascii);
    byte_set ascii;
    for (int b = 0; b < 0x80; ++b) ascii.set(static_cast<std::size_t>(b));
    return char_class(ascii & ~s, !non_ascii);
  }
};

// Thompson NFA: each state has epsilon moves and at most one byte-set move.
class nfa {
 public:
  static constexpr std::size_t max_states = 200000;

  struct state {
    byte_set bytes{};
    std::int32_t to = -1;
    std::int32_t call = -1;  // >= 0: the move to `to` is a call of this rule (no bytes)
    std::vector<std::int32_t> eps{};
  };
  std::vector<state> states;

  std::int32_t add() {
    check(states.size() < max_states, "the regex is too large (more than ", max_states, " NFA states); simplify it");
    states.emplace_back();
    return static_cast<std::int32_t>(states.size() - 1);
  }
  // A fragment from a fresh start state to a fresh end state.
  std::pair<std::int32_t, std::int32_t> build(const node& n) {
    const std::int32_t s = add(), e = add();
    switch (n.kind) {
      case node::set:
        states[static_cast<std::size_t>(s)].bytes = n.bytes;
        states[static_cast<std::size_t>(s)].to = e;
        break;
      case node::concat: {
        std::int32_t cur = s;
        for (const node& k : n.kids) {
          const auto [ks, ke] = build(k);
          states[static_cast<std::size_t>(cur)].eps.push_back(ks);
          cur = ke;
        }
        states[static_cast<std::size_t>(cur)].eps.push_back(e);
        break;
      }
      case node::alt:
        for (const node& k : n.kids) {
          const auto [ks, ke] = build(k);
          states[static_cast<std::size_t>(s)].eps.push_back(ks);
          states[static_cast<std::size_t>(ke)].eps.push_back(e);
        }
        break;
      case node::repeat: {
        std::int32_t cur = s;
        for (int k = 0; k < n.min; ++k) {
          const auto [ks, ke] = build(n.kids[0]);
          states[static_cast<std::size_t>(cur)].eps.push_back(ks);
          cur = ke;
        }
        if (n.max < 0) {  // then any number more
          const auto [ks, ke] = build(n.kids[0]);
          states[static_cast<std::size_t>(cur)].eps.push_back(ks);
          states[static_cast<std::size_t>(ke)].eps.push_back(ks);
          states[static_cast<std::size_t>(ke)].eps.push_back(e);
        } else {  // then up to max - min more, each optional
          for (int k = n.min; k < n.max; ++k) {
            const auto [ks, ke] = build(n.kids[0]);
            states[static_cast<std::size_t>(cur)].eps.push_back(ks);
            states[static_cast<std::size_t>(cur)].eps.push_back(e);
            cur = ke;
          }
        }
        states[static_cast<std::size_t>(cur)].eps.push_back(e);
        break;
      }
      case node::automaton:
        embed(*n.machine, s, e);
        break;
      case node::call:
        states[static_cast<std::size_t>(s)].call = n.rule;
        states[static_cast<std::size_t>(s)].to = e;
        break;
    }
    return {s, e};
  }

  // The automaton between `s` and `e`: a hub state per automaton state (an epsilon move to `e` where it accepts),
  // and from each hub one byte-set move per target (the bytes that lead there).
  void embed(const byte_automaton& m, std::int32_t s, std::int32_t e) {
    const std::size_t n = m.edges.size();
    if (n == 0) return;  // matches nothing
    std::vector<std::int32_t> hub(n);
    for (std::size_t k = 0; k < n; ++k) hub[k] = add();
    states[static_cast<std::size_t>(s)].eps.push_back(hub[0]);
    for (std::size_t k = 0; k < n; ++k) {
      if (m.accepting[k]) states[static_cast<std::size_t>(hub[k])].eps.push_back(e);
      std::map<std::int32_t, byte_set> by_target;
      for (const byte_dfa::range& r : m.edges[k])
        for (int b = r.lo; b <= r.hi; ++b) by_target[r.to].set(static_cast<std::size_t>(b));
      for (const auto& [to, bytes] : by_target) {
        const std::int32_t q = add();
        states[static_cast<std::size_t>(q)].bytes = bytes;
        states[static_cast<std::size_t>(q)].to = hub[static_cast<std::size_t>(to)];
        states[static_cast<std::size_t>(hub[k])].eps.push_back(q);
      }
    }
  }

  // The states reachable from `set` by epsilon moves (sorted); returns the work done.
  std::size_t closure(std::vector<std::int32_t>& set) {
    if (seen_.size() != states.size()) seen_.assign(states.size(), 0);
    if (++stamp_ == 0) {
      std::fill(seen_.begin(), seen_.end(), 0);
      stamp_ = 1;
    }
    std::vector<std::int32_t> stack(set);
    set.clear();
    std::size_t work = 0;
    while (!stack.empty()) {
      const std::int32_t q = stack.back();
      stack.pop_back();
      ++work;
      if (seen_[static_cast<std::size_t>(q)] == stamp_) continue;
      seen_[static_cast<std::size_t>(q)] = stamp_;
      set.push_back(q);
      for (const std::int32_t r : states[static_cast<std::size_t>(q)].eps)
        if (seen_[static_cast<std::size_t>(r)] != stamp_) stack.push_back(r);
    }
    std::sort(set.begin(), set.end());
    return work + set.size();
  }

 private:
  std::vector<std::uint32_t> seen_;
  std::uint32_t stamp_ = 0;
};

// One byte for each group of bytes that every state treats alike (the alphabet the DFA really has).
inline std::vector<int> byte_representatives(const std::vector<std::array<std::int32_t, 256>>& next) {
  std::map<std::vector<std::int32_t>, int> columns;
  std::vector<std::int32_t> column(next.size());
  std::vector<int> out;
  for (int b = 0; b < 256; ++b) {
    for (std::size_t d = 0; d < next.size(); ++d) column[d] = next[d][static_cast<std::size_t>(b)];
    if (columns.emplace(column, b).second) out.push_back(b);
  }
  return out;
}

// Moore's partition refinement: the live states' classes of equivalence (states no text tells apart), numbered
// in order of first appearance (the start, state 0, gets 0); -1 for dead states. Each round's steps count into
// `work`, which may not pass `max_work` (a long chain of states takes as many rounds).
inline std::vector<std::int32_t> equivalence_classes(const std::vector<std::array<std::int32_t, 256>>& next,
                                                     const std::vector<std::vector<byte_dfa::call_edge>>& calls,
                                                     const std::vector<std::uint8_t>& live,
                                                     const std::vector<std::uint8_t>& accepting,
                                                     std::size_t& work, std::size_t max_work,
                                                     const std::string& what) {
  const std::size_t n = next.size();
  const std::vector<int> bytes = byte_representatives(next);
  std::vector<std::int32_t> cls(n, -1);
  for (std::size_t d = 0; d < n; ++d)
    if (live[d]) cls[d] = accepting[d];
  std::size_t classes = 0;
  std::string sig;
  for (;;) {
    work += n * (bytes.size() + 1);
    check(work <= max_work, what, " is too complex to compile (its automaton's construction passed ", max_work,
          " steps); simplify it");
    // A state's signature: its class and its transitions' target classes, as bytes (a hash map's key).
    std::unordered_map<std::string, std::int32_t> ids;
    std::vector<std::int32_t> refined(n, -1);
    for (std::size_t d = 0; d < n; ++d) {
      if (!live[d]) continue;
      sig.assign(reinterpret_cast<const char*>(&cls[d]), sizeof(std::int32_t));
      for (const int b : bytes) {
        const std::int32_t t = next[d][static_cast<std::size_t>(b)];
        const std::int32_t c = t >= 0 ? cls[static_cast<std::size_t>(t)] : -1;
        sig.append(reinterpret_cast<const char*>(&c), sizeof c);
      }
      for (const byte_dfa::call_edge& e : calls[d]) {  // a grammar rule's calls, by rule
        const std::int32_t c[2] = {e.rule, cls[static_cast<std::size_t>(e.to)]};
        sig.append(reinterpret_cast<const char*>(c), sizeof c);
      }
      refined[d] = ids.emplace(sig, static_cast<std::int32_t>(ids.size())).first->second;
    }
    cls.swap(refined);
    // Refinement only splits classes: an unchanged count means a stable partition.
    if (ids.size() == classes) return cls;
    classes = ids.size();
  }
}

// Subset construction, then dead states pruned. `what` names the constraint in errors.
inline byte_dfa determinize(const node& root, std::size_t max_dfa_states, const std::string& what) {
  nfa a;
  // Not a structured binding: `accept` is captured by the lambda below, which clang before 16 does not allow.
  const std::pair<std::int32_t, std::int32_t> ends = a.build(root);
  const std::int32_t start = ends.first, accept = ends.second;
  std::map<std::vector<std::int32_t>, std::int32_t> index;
  std::vector<std::vector<std::int32_t>> sets;
  std::vector<std::array<std::int32_t, 256>> next;
  std::vector<std::vector<byte_dfa::call_edge>> calls;  // per state: (?&N)'s moves, by rule
  bool any_call = false;
  std::vector<std::uint8_t> accepting;
  constexpr std::size_t max_work = 100'000'000;
  std::size_t work = 0;
  auto intern = [&](std::vector<std::int32_t> set) {
    work += a.closure(set);
    if (set.empty()) return std::int32_t{-1};
    if (auto it = index.find(set); it != index.end()) return it->second;
    // Before merging equivalent states a DFA may hold more (see the check after equivalence_classes).
    check(sets.size() < max_dfa_states * 4, what, " needs more than ", max_dfa_states, " DFA states; simplify it");
    const auto id = static_cast<std::int32_t>(sets.size());
    accepting.push_back(std::binary_search(set.begin(), set.end(), accept) ? 1 : 0);
    index.emplace(set, id);
    sets.push_back(std::move(set));
    next.emplace_back();
    calls.emplace_back();
    return id;
  };
  intern({start});
  // The construction's work is bounded, so that no regex takes long to compile (a server compiles requests').
  std::vector<std::int32_t> to, prev_to;
  for (std::size_t d = 0; d < sets.size(); ++d) {
    work += 256 * sets[d].size();
    check(work <= max_work, what, " is too complex to compile (its automaton's construction passed ", max_work,
          " steps); simplify it");
    std::int32_t prev = -1;
    prev_to.clear();
    for (int b = 0; b < 256; ++b) {
      to.clear();
      for (const std::int32_t q : sets[d]) {
        const nfa::state& st = a.states[static_cast<std::size_t>(q)];
        if (st.to >= 0 && st.bytes.test(static_cast<std::size_t>(b))) to.push_back(st.to);
      }
      // Neighbouring bytes mostly lead to the same states: reuse the last byte's result then.
      const std::int32_t t = to.empty() ? -1 : (to == prev_to && b > 0) ? prev : intern(to);
      prev = t;
      prev_to = to;
      next[d][static_cast<std::size_t>(b)] = t;
    }
    std::map<std::int32_t, std::vector<std::int32_t>> called;  // rule -> the NFA states after its call
    for (const std::int32_t q : sets[d])
      if (const nfa::state& st = a.states[static_cast<std::size_t>(q)]; st.call >= 0) called[st.call].push_back(st.to);
    for (auto& [rule, targets] : called) {
      const std::int32_t t = intern(std::move(targets));  // (grows `sets`: after the loop over sets[d])
      calls[d].push_back({rule, t});
      any_call = true;
    }
  }
  // Live states: those from which an accepting state is reachable.
  const std::size_t n = sets.size();
  std::vector<std::uint8_t> live(accepting);
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t d = 0; d < n; ++d) {
      if (live[d]) continue;
      for (const std::int32_t t : next[d])
        if (t >= 0 && live[static_cast<std::size_t>(t)]) {
          live[d] = 1;
          break;
        }
      // A call passes (pushdown.hpp checks that every rule derives some text).
      for (const byte_dfa::call_edge& e : calls[d])
        if (live[static_cast<std::size_t>(e.to)]) live[d] = 1;
      changed = changed || live[d];
    }
  }
  check(live[0] != 0, what, " matches no text");
  // Equivalent states merged (a schema's regex repeats sub-patterns, each copy its own states), numbered so that
  // the start stays 0; the transitions kept as byte ranges.
  const std::vector<std::int32_t> renum = equivalence_classes(next, calls, live, accepting, work, max_work, what);
  const std::int32_t count = n == 0 ? 0 : *std::max_element(renum.begin(), renum.end()) + 1;
  check(static_cast<std::size_t>(count) <= max_dfa_states, what, " needs more than ", max_dfa_states,
        " DFA states; simplify it");
  byte_dfa out;
  out.edges.resize(static_cast<std::size_t>(count));
  out.accepting.resize(static_cast<std::size_t>(count));
  if (any_call) out.calls.resize(static_cast<std::size_t>(count));
  std::vector<std::uint8_t> done(static_cast<std::size_t>(count), 0);
  for (std::size_t d = 0; d < n; ++d) {
    if (!live[d] || done[static_cast<std::size_t>(renum[d])]) continue;
    const auto id = static_cast<std::size_t>(renum[d]);
    done[id] = 1;
    out.accepting[id] = accepting[d];
    for (int b = 0; b < 256; ++b) {
      const std::int32_t t = next[d][static_cast<std::size_t>(b)];
      const std::int32_t to = t >= 0 ? renum[static_cast<std::size_t>(t)] : -1;
      if (to < 0) continue;
      auto& e = out.edges[id];
      if (!e.empty() && e.back().to == to && e.back().hi + 1 == b)
        e.back().hi = static_cast<std::uint8_t>(b);
      else
        e.push_back({static_cast<std::uint8_t>(b), static_cast<std::uint8_t>(b), to});
    }
    for (const byte_dfa::call_edge& e : calls[d])
      if (live[static_cast<std::size_t>(e.to)])
        out.calls[id].push_back({e.rule, renum[static_cast<std::size_t>(e.to)]});
  }
  return out;
}

}  // namespace guided_detail

// Bounds on a compiled constraint (errors name them).
inline constexpr std::size_t guided_max_dfa_states = 4096;
inline constexpr std::size_t guided_max_choice_bytes = 16384;

// The regex's DFA (the whole text must match). Throws zipage::error "guided_regex: ..." for unsupported syntax
// (naming it), a regex that matches nothing, or one whose DFA would exceed guided_max_dfa_states.
[[nodiscard]] inline byte_dfa compile_guided_regex(std::string_view re) {
  try {
    return guided_detail::determinize(guided_detail::regex_parser(re).parse(), guided_max_dfa_states, "the regex");
  } catch (const error& e) {
    fail("guided_regex: ", e.what());
  }
}

// The DFA of "exactly one of these strings". Throws zipage::error "guided_choice: ..." for an empty list or
// choice, or choices of more than guided_max_choice_bytes bytes in all.
[[nodiscard]] inline byte_dfa compile_guided_choice(const std::vector<std::string>& choices) {
  check(!choices.empty(), "guided_choice: the list of choices is empty");
  guided_detail::node alt{guided_detail::node::alt};
  std::size_t total = 0;
  for (std::size_t i = 0; i < choices.size(); ++i) {
    check(!choices[i].empty(), "guided_choice: choice [", i, "] is empty");
    total += choices[i].size();
    alt.kids.push_back(guided_detail::literal(choices[i]));
  }
  check(total <= guided_max_choice_bytes, "guided_choice: the choices hold ", total, " bytes, more than ",
        guided_max_choice_bytes);
  return guided_detail::determinize(alt, guided_max_choice_bytes + 1, "guided_choice");
}

// A compiled constraint: a DFA, or a pushdown grammar (pushdown.hpp) where recursion needs a stack.
class guided_machine {
 public:
  guided_machine(byte_dfa dfa) : dfa_(std::move(dfa)) {}  // NOLINT(google-explicit-constructor): a DFA is one
  // `what` names the constraint in check_pushdown's errors.
  explicit guided_machine(byte_pda pda, const std::string& what = "the grammar") : pda_(std::move(pda)) {
    check_pushdown(*pda_, what);
  }

  [[nodiscard]] bool is_pushdown() const { return pda_.has_value(); }
  [[nodiscard]] const byte_dfa& dfa() const {
    check(!pda_, "guided_machine: a pushdown grammar has no single DFA");
    return dfa_;
  }
  [[nodiscard]] const byte_pda& pda() const {
    check(pda_.has_value(), "guided_machine: a DFA, not a pushdown grammar");
    return *pda_;
  }
  // States in all (a pushdown grammar's: its rules' together).
  [[nodiscard]] std::int32_t size() const {
    if (!pda_) return dfa_.size();
    std::int32_t n = 0;
    for (const byte_dfa& r : pda_->rules) n += r.size();
    return n;
  }
  // Whether the constraint matches `text` whole.
  [[nodiscard]] bool matches(std::string_view text) const {
    return pda_ ? pushdown_matches(*pda_, text) : dfa_.matches(text);
  }
  // Whether `text` begins some text the constraint matches.
  [[nodiscard]] bool prefix(std::string_view text) const {
    return pda_ ? !pushdown_after(*pda_, text).empty() : dfa_.walk(byte_dfa::start, text) >= 0;
  }
  [[nodiscard]] byte_dfa take_dfa() && {
    check(!pda_, "guided_machine: a pushdown grammar has no single DFA");
    return std::move(dfa_);
  }
  [[nodiscard]] byte_pda take_pda() && { return std::move(*pda_); }

 private:
  byte_dfa dfa_;
  std::optional<byte_pda> pda_;
};

// A compiled constraint over one vocabulary: which tokens may follow a generated text.
class guide {
 public:
  guide(guided_machine machine, std::shared_ptr<const guide_vocabulary> vocab) : vocab_(std::move(vocab)) {
    check(vocab_ != nullptr, "guide: no vocabulary");
    if (machine.is_pushdown()) {
      pda_ = std::make_unique<const pushdown_guide>(std::move(machine).take_pda(), vocab_);
    } else {
      dfa_ = std::move(machine).take_dfa();
      memo_.resize(static_cast<std::size_t>(dfa_.size()));
    }
  }

  // Whether the constraint needs a stack (a pushdown grammar); the DFA functions below are for the others.
  [[nodiscard]] bool is_pushdown() const { return pda_ != nullptr; }
  [[nodiscard]] const byte_dfa& dfa() const {
    check(!pda_, "guide: a pushdown grammar has no single DFA");
    return dfa_;
  }
  [[nodiscard]] const byte_pda& pda() const {
    check(pda_ != nullptr, "guide: a DFA, not a pushdown grammar");
    return pda_->grammar();
  }
  [[nodiscard]] const guide_vocabulary& vocabulary() const { return *vocab_; }

  // What may follow the generated tokens: whether the text is still a prefix of a match, whether it is one, and
  // the tokens that keep it a prefix. Either kind of constraint.
  [[nodiscard]] guide_lookahead lookahead(std::span<const token_id> generated) const {
    if (pda_) return pda_->lookahead(generated);
    guide_lookahead out;
    const std::int32_t s = state_after(generated);
    out.alive = s >= 0;
    out.at_match = accepts(s);
    if (out.alive) out.next = next_tokens(s);
    return out;
  }
  // The ids allowed after the generated tokens, ascending (none where the text left the language).
  [[nodiscard]] std::vector<token_id> allowed_after(std::span<const token_id> generated) const {
    const guide_lookahead l = lookahead(generated);
    return l.next ? l.next->allowed_ids(vocab_->size()) : std::vector<token_id>{};
  }

  // The DFA state after the generated tokens (-1: a token left the language or has no bytes).
  [[nodiscard]] std::int32_t state_after(std::span<const token_id> generated) const {
    check(!pda_, "guide: state_after of a pushdown grammar (use lookahead)");
    std::int32_t s = byte_dfa::start;
    for (const token_id t : generated) {
      const std::string& b = vocab_->bytes_of(t);
      if (b.empty()) return -1;
      s = dfa_.walk(s, b);
      if (s < 0) return -1;
    }
    return s;
  }
  [[nodiscard]] bool accepts(std::int32_t state) const { return state >= 0 && dfa_.accepts(state); }

  // The tokens whose bytes keep the DFA alive from `state` (computed once per state), as the shorter list.
  [[nodiscard]] std::shared_ptr<const guide_tokens> next_tokens(std::int32_t state) const {
    check(!pda_, "guide: next_tokens of a pushdown grammar (use lookahead)");
    check(state >= 0 && state < dfa_.size(), "guide: state ", state, " of ", dfa_.size());
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (auto& m = memo_[static_cast<std::size_t>(state)]) return m;
    }
    auto next = std::make_shared<guide_tokens>();
    next->ids = walk_trie(state);
    if (next->ids.size() * 2 > static_cast<std::size_t>(vocab_->size())) {  // most are allowed: list the others
      std::vector<token_id> others;
      others.reserve(static_cast<std::size_t>(vocab_->size()) - next->ids.size());
      std::size_t k = 0;
      for (token_id t = 0; t < vocab_->size(); ++t) {
        if (k < next->ids.size() && next->ids[k] == t) ++k;
        else others.push_back(t);
      }
      next->ids = std::move(others);
      next->complement = true;
    }
    const std::lock_guard<std::mutex> lock(mutex_);
    auto& m = memo_[static_cast<std::size_t>(state)];
    if (!m) m = std::move(next);
    return m;
  }
  // The bytes the token lists found so far hold (the DFA's own, byte ranges per state, are small beside them).
  [[nodiscard]] std::size_t memo_bytes() const {
    if (pda_) return pda_->memo_bytes();
    const std::lock_guard<std::mutex> lock(mutex_);
    std::size_t n = 0;
    for (const auto& m : memo_)
      if (m) n += m->ids.capacity() * sizeof(token_id);
    return n;
  }
  // The allowed ids at `state`, ascending (the explicit list, whichever form next_tokens keeps).
  [[nodiscard]] std::vector<token_id> allowed_ids(std::int32_t state) const {
    return next_tokens(state)->allowed_ids(vocab_->size());
  }

 private:
  // A depth-first walk of the vocabulary's byte trie (its tokens in byte order, each sharing lcp bytes with the
  // one before), skipping every token below a prefix that leads to a dead state.
  [[nodiscard]] std::vector<token_id> walk_trie(std::int32_t state) const {
    const auto& order = vocab_->sorted();
    const auto& lcp = vocab_->lcp();
    std::vector<token_id> out;
    std::vector<std::int32_t> st{state};  // st[d]: the state after the current token's first d bytes
    std::size_t dead_at = 0;              // > 0: the previous walk died after dead_at bytes
    for (std::size_t i = 0; i < order.size(); ++i) {
      const std::size_t l = lcp[i];
      if (dead_at > 0 && l >= dead_at) continue;  // shares the dead prefix
      dead_at = 0;
      const std::string& b = vocab_->bytes_of(order[i]);
      st.resize(l + 1);
      bool alive = true;
      for (std::size_t d = l; d < b.size(); ++d) {
        const std::int32_t nx = dfa_.next(st[d], static_cast<unsigned char>(b[d]));
        if (nx < 0) {
          dead_at = d + 1;
          alive = false;
          break;
        }
        st.push_back(nx);
      }
      if (alive) out.push_back(order[i]);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  byte_dfa dfa_;
  std::unique_ptr<const pushdown_guide> pda_;
  std::shared_ptr<const guide_vocabulary> vocab_;
  mutable std::mutex mutex_;
  mutable std::vector<std::shared_ptr<const guide_tokens>> memo_;
};

// Compiling a JSON schema needs nlohmann-json (json_schema.hpp). CUDA translation units include this header only
// to apply guides, never to compile one, so nvcc is spared it and the functions below.
#if !defined(__CUDACC__)

namespace guided_detail {

// multipleOf's automaton: the spellings of m.spelling (the number's bounds) whose value is a multiple of m.divisor.
// The DFA of the spellings is run in step with json_multiple_of::tracker, each reachable pair of states a state
// (at most 4 x guided_max_dfa_states of them, as determinize allows before merging), then equivalent states merged.
// Errors name multipleOf and its place: no multiple within the bounds, or an automaton past the cap.
inline node multiple_of_node(const json_schema_multiple& m) {
  const std::string what = "'multipleOf' (" + m.value + ") at " + m.place;
  const byte_dfa spellings = determinize(regex_parser(m.spelling).parse(), guided_max_dfa_states, what);
  json_multiple_of::tracker tracker(m.divisor);
  using key = std::pair<std::int32_t, json_multiple_of::tracker::state>;
  std::map<key, std::int32_t> ids;
  std::vector<key> pairs;
  auto product = std::make_shared<byte_automaton>();
  auto id_of = [&](const key& p) {
    const auto [it, added] = ids.emplace(p, static_cast<std::int32_t>(pairs.size()));
    if (added) {
      check(pairs.size() < 4 * guided_max_dfa_states, what, " needs more than ", guided_max_dfa_states,
            " DFA states; simplify it");
      pairs.push_back(p);
    }
    return it->second;
  };
  id_of({byte_dfa::start, tracker.start()});
  bool any = false;
  for (std::size_t k = 0; k < pairs.size(); ++k) {
    const auto [d, t] = pairs[k];  // a copy: id_of grows `pairs`
    const bool accepting = spellings.accepts(d) && tracker.multiple(t);
    any = any || accepting;
    std::vector<byte_dfa::range> edges;
    for (const byte_dfa::range& r : spellings.edges[static_cast<std::size_t>(d)]) {
      for (int b = r.lo; b <= r.hi; ++b) {
        const auto next = tracker.step(t, static_cast<unsigned char>(b));
        if (!next) continue;
        const std::int32_t to = id_of({r.to, *next});
        if (!edges.empty() && edges.back().to == to && edges.back().hi + 1 == b)
          edges.back().hi = static_cast<std::uint8_t>(b);
        else
          edges.push_back({static_cast<std::uint8_t>(b), static_cast<std::uint8_t>(b), to});
      }
    }
    product->edges.push_back(std::move(edges));
    product->accepting.push_back(accepting ? 1 : 0);
  }
  check(any, "no ", m.integer_only ? "integer" : "number", " within the bounds at ", m.place, " is a multiple of ",
        "'multipleOf' (", m.value, ")");
  node whole{node::automaton};
  whole.machine = std::move(product);
  byte_dfa merged = determinize(whole, guided_max_dfa_states, what);
  auto machine = std::make_shared<byte_automaton>();
  machine->edges = std::move(merged.edges);
  machine->accepting = std::move(merged.accepting);
  node n{node::automaton};
  n.machine = std::move(machine);
  return n;
}

// The syntax tree of JSON text the schema describes: json_schema_regex's regex, with its multipleOf automata
// (each built once). Errors as json_schema_regex's and multiple_of_node's, and the regex compiler's for a pattern.
// A schema's regexes (json_schema_regex with `nesting`), and the multipleOf automata its (?%N) name, built once.
class json_schema_parts {
 public:
  json_schema_parts(std::string_view schema, const std::string& whitespace, json_schema_nesting nesting)
      : compiled_(json_schema_regex(
            schema, whitespace, [](const std::string& p) { (void)regex_parser("(?:" + p + ")").parse(); }, nesting)),
        built_(compiled_.multiples.size()) {}

  [[nodiscard]] const json_schema_compiled& compiled() const { return compiled_; }
  // The syntax tree of rule k (0: the root schema), its (?&N) calls kept as calls.
  [[nodiscard]] node rule(std::size_t k) {
    const std::string& re = k == 0 ? compiled_.regex : compiled_.rules.at(k - 1);
    const auto embedded = [this](std::size_t i) {
      check(i < built_.size(), "(?%", i, ") names no multipleOf");
      if (!built_[i]) built_[i] = multiple_of_node(compiled_.multiples[i]);
      return *built_[i];
    };
    return regex_parser(re, embedded, compiled_.rules.size() + 1).parse();
  }

 private:
  json_schema_compiled compiled_;
  std::vector<std::optional<node>> built_;
};

// The syntax tree of JSON text the schema describes, recursion unrolled (json_schema_nesting::unrolled): its
// regex, with its multipleOf automata. Errors as json_schema_regex's and multiple_of_node's, and the regex
// compiler's for a pattern.
inline node json_schema_node(std::string_view schema, const std::string& whitespace) {
  return json_schema_parts(schema, whitespace, json_schema_nesting::unrolled).rule(0);
}

// Rules (regexes with (?&N) calls, 0 the root) as a guided_machine: the root's DFA alone where nothing calls,
// else a pushdown grammar of the rules' DFAs. `rule(k)` gives rule k's syntax tree.
template <class Rule>
[[nodiscard]] guided_machine rules_machine(std::size_t count, Rule&& rule, const std::vector<std::string>& names,
                                           const std::string& what) {
  byte_pda g;
  for (std::size_t k = 0; k < count; ++k) {
    const std::string where = count == 1 ? what : what + " (its rule '" + names[k] + "')";
    g.rules.push_back(determinize(rule(k), guided_max_dfa_states, where));
    g.names.push_back(names[k]);
  }
  if (count == 1 && !g.rules[0].has_calls()) return std::move(g.rules[0]);
  return guided_machine(std::move(g), what);
}

}  // namespace guided_detail

// The automaton of JSON text that the schema describes (json_schema_regex with calls, then as regexes, multipleOf's
// automata embedded): a DFA, or where the schema recurses (a recursive $ref) or holds free-form values ({}, an
// object without properties) a pushdown grammar, exact at any depth. Throws zipage::error "guided_json: ..."
// naming what it cannot compile (an unsupported keyword and its JSON pointer, a bad whitespace pattern, a rule
// whose DFA would exceed guided_max_dfa_states).
[[nodiscard]] inline guided_machine compile_guided_json(std::string_view schema,
                                                  const std::optional<std::string>& whitespace_pattern = {}) {
  try {
    // Parsed as it will be embedded (between tokens), where anchors are errors.
    if (whitespace_pattern) (void)guided_detail::regex_parser("{(?:" + *whitespace_pattern + ")}").parse();
  } catch (const error& e) {
    fail("guided_json: its whitespace_pattern: ", e.what());
  }
  try {
    guided_detail::json_schema_parts parts(schema, whitespace_pattern.value_or("[ ]?"), json_schema_nesting::calls);
    std::vector<std::string> names{"#"};
    for (const std::string& n : parts.compiled().rule_names) names.push_back(n == "{}" ? "any JSON value" : n);
    return guided_detail::rules_machine(
        names.size(), [&](std::size_t k) { return parts.rule(k); }, names, "the schema");
  } catch (const error& e) {
    fail("guided_json: ", e.what());
  }
}

// The automaton of the strings a GBNF grammar derives (grammar_rules, then as regexes): a DFA for a grammar
// without recursion, else a pushdown grammar, exact at any depth. Throws zipage::error "guided_grammar: ..." naming
// what it cannot compile (a syntax error and its place, an undefined rule, a rule that derives no finite text, left
// recursion, a rule whose DFA would exceed guided_max_dfa_states).
[[nodiscard]] inline guided_machine compile_guided_grammar(std::string_view gbnf) {
  try {
    const grammar_compiled g = grammar_rules(gbnf);
    return guided_detail::rules_machine(
        g.rules.size(),
        [&](std::size_t k) { return guided_detail::regex_parser(g.rules[k], {}, g.rules.size()).parse(); }, g.names,
        "the grammar");
  } catch (const error& e) {
    fail("guided_grammar: ", e.what());
  }
}

// The automaton of a structural tag (structural_tag.hpp, included at the end of this header, defines it).
[[nodiscard]] inline guided_machine compile_guided_structural_tag(std::string_view structural_tag);

// The automaton of a constraint (see the five above); errors start with the field's name.
[[nodiscard]] inline guided_machine compile_guided(const guided_decoding& spec) {
  check(spec.active(), "guided decoding: no constraint given");
  check(spec.count() == 1, "guided decoding: more than one of guided_choice, guided_regex, guided_json, "
        "guided_grammar and structural_tag is set (give one)");
  if (spec.json_schema) return compile_guided_json(*spec.json_schema, spec.whitespace_pattern);
  if (spec.grammar) return compile_guided_grammar(*spec.grammar);
  if (spec.structural_tag) return compile_guided_structural_tag(*spec.structural_tag);
  return spec.regex ? compile_guided_regex(*spec.regex) : compile_guided_choice(spec.choice);
}

// A request's guide, compiled for `vocab`. Errors start with the field's name (guided_choice, guided_regex,
// guided_json, guided_grammar, structural_tag).
[[nodiscard]] inline std::shared_ptr<const guide> make_guide(const guided_decoding& spec,
                                                             std::shared_ptr<const guide_vocabulary> vocab) {
  return std::make_shared<const guide>(compile_guided(spec), std::move(vocab));
}

#endif  // !defined(__CUDACC__)

}  // namespace zipage

#if !defined(__CUDACC__)
// After the definitions above, which it builds on (it includes this header first when it is included first).
#include "zipage/sampling/structural_tag.hpp"
#endif
