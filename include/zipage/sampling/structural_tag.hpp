#pragma once
// Structural tags (vLLM's structured_outputs.structural_tag and response_format {"type": "structural_tag"}, as its
// xgrammar backend reads them), compiled to the guide's DFA over bytes (guided.hpp) like any other constraint, or,
// where a grammar or JSON schema in it recurses, to a pushdown grammar (pushdown.hpp): their rules join the tag's.
//
// Two forms, both JSON text:
//   legacy  {"type": "structural_tag", "structures": [{"begin": s, "schema": JSONSchema, "end": s}, ...],
//            "triggers": [s, ...]}: free text; where a trigger occurs in it, the text from the trigger on must be
//            the `begin` of a structure whose begin starts with that trigger, then JSON the structure's schema
//            describes (json_schema.hpp; `[ ]?` between JSON tokens, as guided_json), then its `end`; then free
//            text again. Every begin must start with a trigger. The output may end (EOS) in free text, never inside
//            a structure.
//   format  {"type": "structural_tag", "format": F} (xgrammar's structural tag), F one of
//     const_string {value}; json_schema {json_schema, style "json" only, any_order false only,
//       max_whitespace_cnt 0 = no whitespace}; regex {pattern} (guided.hpp's subset); grammar {grammar} (GBNF,
//       grammar.hpp, recursion exact); any_text {excludes}; sequence {elements}; or {elements};
//     optional / plus / star {content}; repeat {min, max (-1 = unbounded), content};
//     tag {begin, content, end (a string or a list of strings)};
//     triggered_tags {triggers, tags, excludes, at_least_one, stop_after_first};
//     tags_with_separator {tags, separator, at_least_one, stop_after_first}; dispatch {rules, loop, excludes}.
//   As xgrammar: free text (any_text, the text between triggered tags, dispatch's) is any UTF-8 text in which no
//   exclude occurs, and for any_text and triggered_tags no `end` of the nearest enclosing tag either (that end then
//   closes the tag); it may stop anywhere but right where a trigger has occurred. Where a trigger occurs (the first
//   place one ends, scanned as an Aho-Corasick automaton), the tags whose begin starts with it must follow (one
//   trigger that is a prefix of another takes the other's tags too: it always occurs first). at_least_one: a tag
//   first, no free text before it; stop_after_first: nothing after the first tag. A tag in `tags` may leave out
//   "type": "tag". Unknown fields are ignored.
// Refused, an error naming the place (e.g. format.elements[1].content) and what: malformed JSON, a missing or
// mistyped field, a begin that starts with no trigger, an unknown format type; token-level formats (token,
// exclude_token, any_tokens, token_triggered_tags, token_dispatch: a DFA over text bytes has no token
// boundaries), any_text's max_tokens / max_chars, json_schema styles other than "json" and any_order, a tag whose
// begin or end is a token, and a structural tag whose DFA would pass guided_max_dfa_states.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/sampling/grammar.hpp"
#include "zipage/sampling/guided.hpp"
#include "zipage/sampling/json_schema.hpp"
#include "zipage/tokenizer/utf8.hpp"

namespace zipage {

inline constexpr int structural_tag_max_depth = 64;  // formats nested deeper are refused (the compiler recurses)
// The triggers, excludes and ends one free text is scanned for, in bytes (its automaton has a state per prefix).
inline constexpr std::size_t structural_tag_max_pattern_bytes = 2048;

namespace structural_tag_detail {

using json = nlohmann::ordered_json;
using guided_detail::byte_automaton;
using guided_detail::node;

// A byte's next state in a UTF-8 decoder (0: between characters; 1-3: that many continuation bytes due; 4-7: the
// second byte of an E0, ED, F0 or F4 sequence, whose range is narrower), -1 for a byte that makes the text
// ill-formed. The lead bytes and ranges are utf8::detail::classify_lead's (the same characters as
// guided_detail::non_ascii_char).
inline constexpr std::array<unsigned char, 4> utf8_narrow_leads = {0xE0, 0xED, 0xF0, 0xF4};
inline int utf8_next(int state, unsigned b) {
  if (state == 0) {
    const auto lead = utf8::detail::classify_lead(static_cast<unsigned char>(b));
    if (lead.length <= 1) return lead.length == 1 ? 0 : -1;
    const auto* narrow = std::find(utf8_narrow_leads.begin(), utf8_narrow_leads.end(), b);
    if (narrow == utf8_narrow_leads.end()) return static_cast<int>(lead.length) - 1;
    return 4 + static_cast<int>(narrow - utf8_narrow_leads.begin());
  }
  if (state >= 1 && state <= 3) return b >= 0x80 && b <= 0xBF ? state - 1 : -1;
  if (state < 4 || state > 7) return -1;
  const auto lead = utf8::detail::classify_lead(utf8_narrow_leads[static_cast<std::size_t>(state - 4)]);
  return b >= lead.second_lo && b <= lead.second_hi ? static_cast<int>(lead.length) - 2 : -1;
}
inline constexpr int utf8_states = 8;

// Free text scanned for some strings (triggers, excludes, ends): an Aho-Corasick automaton over their bytes, in
// step with a UTF-8 decoder, from which the automata of two languages are built: the texts in which none of the
// strings occurs, and the texts in which the first occurrence of one ends at their very end.
class text_scanner {
 public:
  explicit text_scanner(const std::vector<std::string>& patterns, const std::string& where) {
    std::size_t bytes = 0;
    for (const std::string& p : patterns) {
      check(!p.empty(), where, ": an empty string to scan free text for");
      bytes += p.size();
    }
    check(bytes <= structural_tag_max_pattern_bytes, where, ": the triggers, excludes and ends that free text is "
          "scanned for hold ", bytes, " bytes, more than ", structural_tag_max_pattern_bytes);
    // The trie, then each node's failure target and the patterns that end there (its own and its suffixes').
    std::vector<std::array<std::int32_t, 256>> trie(1);
    trie[0].fill(-1);
    out_.emplace_back();
    for (std::size_t i = 0; i < patterns.size(); ++i) {
      std::int32_t n = 0;
      for (const char c : patterns[i]) {
        const auto b = static_cast<unsigned char>(c);
        if (trie[static_cast<std::size_t>(n)][b] < 0) {
          trie[static_cast<std::size_t>(n)][b] = static_cast<std::int32_t>(trie.size());
          trie.emplace_back().fill(-1);  // (invalidates references into trie)
          out_.emplace_back();
        }
        n = trie[static_cast<std::size_t>(n)][b];
      }
      out_[static_cast<std::size_t>(n)].push_back(i);
    }
    go_ = trie;
    std::vector<std::int32_t> fail(trie.size(), 0), queue;
    for (int b = 0; b < 256; ++b) {
      const std::int32_t v = trie[0][static_cast<std::size_t>(b)];
      if (v < 0) go_[0][static_cast<std::size_t>(b)] = 0;
      else queue.push_back(v);
    }
    for (std::size_t q = 0; q < queue.size(); ++q) {
      const auto u = static_cast<std::size_t>(queue[q]);
      auto& mine = out_[u];
      const auto& inherited = out_[static_cast<std::size_t>(fail[u])];
      mine.insert(mine.end(), inherited.begin(), inherited.end());
      for (int b = 0; b < 256; ++b) {
        const std::int32_t v = trie[u][static_cast<std::size_t>(b)];
        const std::int32_t via_fail = go_[static_cast<std::size_t>(fail[u])][static_cast<std::size_t>(b)];
        if (v < 0) {
          go_[u][static_cast<std::size_t>(b)] = via_fail;
        } else {
          fail[static_cast<std::size_t>(v)] = via_fail;
          queue.push_back(v);
        }
      }
    }
  }

  // The texts in which none of the strings occurs.
  [[nodiscard]] std::shared_ptr<const byte_automaton> none() const { return build(-1, {}); }
  // The texts in which a string occurs only at their end, where string `target` ends and none of `blocked`.
  [[nodiscard]] std::shared_ptr<const byte_automaton> until(std::size_t target,
                                                            const std::vector<std::uint8_t>& blocked) const {
    return build(static_cast<std::int64_t>(target), blocked);
  }

 private:
  std::vector<std::array<std::int32_t, 256>> go_;  // the Aho-Corasick transitions (trie, then failure moves)
  std::vector<std::vector<std::size_t>> out_;      // the strings that end at each node

  [[nodiscard]] std::shared_ptr<const byte_automaton> build(std::int64_t target,
                                                            const std::vector<std::uint8_t>& blocked) const {
    // States: (node, decoder state) pairs in which no string has ended, numbered as reached; `done` last.
    std::vector<std::int32_t> id(go_.size() * utf8_states, -1);
    std::vector<std::pair<std::int32_t, int>> states{{0, 0}};
    id[0] = 0;
    std::vector<std::array<std::int32_t, 256>> next;
    constexpr std::int32_t done = -2;  // numbered once every other state is
    for (std::size_t s = 0; s < states.size(); ++s) {
      const auto [n, u] = states[s];
      std::array<std::int32_t, 256> row{};
      for (int b = 0; b < 256; ++b) {
        std::int32_t to = -1;
        const int u2 = utf8_next(u, static_cast<unsigned>(b));
        const std::int32_t n2 = go_[static_cast<std::size_t>(n)][static_cast<std::size_t>(b)];
        const auto& ended = out_[static_cast<std::size_t>(n2)];
        if (u2 < 0) {
          to = -1;
        } else if (ended.empty()) {
          auto& slot = id[static_cast<std::size_t>(n2) * utf8_states + static_cast<std::size_t>(u2)];
          if (slot < 0) {
            slot = static_cast<std::int32_t>(states.size());
            states.emplace_back(n2, u2);
          }
          to = slot;
        } else if (target >= 0 && u2 == 0) {
          const bool hit = std::find(ended.begin(), ended.end(), static_cast<std::size_t>(target)) != ended.end();
          const bool bad = std::any_of(ended.begin(), ended.end(), [&](std::size_t p) { return blocked[p] != 0; });
          if (hit && !bad) to = done;
        }
        row[static_cast<std::size_t>(b)] = to;
      }
      next.push_back(row);
    }
    auto m = std::make_shared<byte_automaton>();
    const auto done_id = static_cast<std::int32_t>(states.size());
    m->edges.resize(states.size() + 1);
    m->accepting.assign(states.size() + 1, 0);
    for (std::size_t s = 0; s < states.size(); ++s) {
      if (target < 0 && states[s].second == 0) m->accepting[s] = 1;
      auto& e = m->edges[s];
      for (int b = 0; b < 256; ++b) {
        std::int32_t to = next[s][static_cast<std::size_t>(b)];
        if (to == done) to = done_id;
        if (to < 0) continue;
        if (!e.empty() && e.back().to == to && e.back().hi + 1 == b)
          e.back().hi = static_cast<std::uint8_t>(b);
        else
          e.push_back({static_cast<std::uint8_t>(b), static_cast<std::uint8_t>(b), to});
      }
    }
    if (target >= 0) m->accepting[static_cast<std::size_t>(done_id)] = 1;
    return m;
  }
};

inline node embed(std::shared_ptr<const byte_automaton> m) {
  node n{node::automaton};
  n.machine = std::move(m);
  return n;
}
inline node one_of(std::vector<node> kids) {
  if (kids.size() == 1) return std::move(kids[0]);
  node n{node::alt};
  n.kids = std::move(kids);
  return n;
}
inline node repeated(node kid, int min, int max) {
  node n{node::repeat};
  n.kids.push_back(std::move(kid));
  n.min = min;
  n.max = max;
  return n;
}
inline node any_literal(const std::vector<std::string>& texts) {
  std::vector<node> kids;
  for (const std::string& t : texts) kids.push_back(guided_detail::literal(t));
  return one_of(std::move(kids));
}

// A trigger, and what must follow it where it occurs in free text.
struct dispatch_rule {
  std::string trigger;
  node then;
};

// Free text scanned for the rules' triggers and `excludes`; where a trigger occurs, what its rules say must follow
// it. loop: free text again after that (any number of times), else the end. The free text may end anywhere but
// right where a trigger has occurred.
inline node dispatch(const std::vector<dispatch_rule>& rules, const std::vector<std::string>& excludes, bool loop,
                     const std::string& where) {
  std::vector<std::string> patterns;
  const auto index_of = [&](const std::string& s) {
    const auto it = std::find(patterns.begin(), patterns.end(), s);
    if (it != patterns.end()) return static_cast<std::size_t>(it - patterns.begin());
    patterns.push_back(s);
    return patterns.size() - 1;
  };
  for (const dispatch_rule& r : rules) (void)index_of(r.trigger);
  for (const std::string& x : excludes) (void)index_of(x);
  std::vector<std::uint8_t> blocked(patterns.size(), 0);
  for (const std::string& x : excludes) blocked[index_of(x)] = 1;
  const text_scanner scan(patterns, where);
  std::vector<node> dispatched;
  for (std::size_t p = 0; p < patterns.size(); ++p) {
    if (blocked[p]) continue;  // an exclude that is also a trigger: the exclude wins
    std::vector<node> thens;
    for (const dispatch_rule& r : rules)
      if (r.trigger == patterns[p]) thens.push_back(r.then);
    if (thens.empty()) continue;
    dispatched.push_back(guided_detail::seq({embed(scan.until(p, blocked)), one_of(std::move(thens))}));
  }
  node free = embed(scan.none());
  if (dispatched.empty()) return free;
  if (loop) return guided_detail::seq({repeated(one_of(std::move(dispatched)), 0, -1), std::move(free)});
  std::vector<node> alts{std::move(free)};
  alts.push_back(one_of(std::move(dispatched)));
  return one_of(std::move(alts));
}

inline const char* type_name(const json& v) { return v.type_name(); }

// The compiler of one structural tag. The rules that grammars and schemas in it call (their recursion) are gathered
// as the tag's own, numbered from 1 (rule 0 is the tag's tree, which root() returns).
class compiler {
 public:
  // The rules gathered (rules()[k] is rule k + 1), and their names for errors.
  [[nodiscard]] std::vector<node>& rules() { return rules_; }
  [[nodiscard]] const std::vector<std::string>& rule_names() const { return rule_names_; }

  [[nodiscard]] node root(const json& st) {
    check(st.is_object(), "the structural tag must be a JSON object, got ", type_name(st));
    if (const auto t = st.find("type"); t != st.end())
      check(t->is_string() && *t == "structural_tag", "'type' must be \"structural_tag\", got ", t->dump());
    if (st.contains("structures")) return legacy(st);
    const auto f = st.find("format");
    check(f != st.end(), "needs 'format' (xgrammar's structural tag) or 'structures' and 'triggers' (the legacy form)");
    return format(*f, "format", {}, 0);
  }

 private:
  std::vector<node> rules_;
  std::vector<std::string> rule_names_;

  // Calls of rule N in `n` made calls of rule N + offset.
  static void shift_calls(node& n, std::int32_t offset) {
    if (n.kind == node::call) n.rule += offset;
    for (node& k : n.kids) shift_calls(k, offset);
  }
  // A grammar's or schema's rules (count of them, rule(k) the tree of rule k, 0 its root) joined to the tag's; the
  // root's tree returned, to be used in place. Without calls the root alone.
  template <class Rule>
  node join_rules(std::size_t count, Rule&& rule, const std::string& path) {
    node root = rule(0);
    if (count == 1 && !has_calls(root)) return root;
    const auto offset = static_cast<std::int32_t>(rules_.size() + 1);
    for (std::size_t k = 0; k < count; ++k) {
      node r = k == 0 ? root : rule(k);
      shift_calls(r, offset);
      rules_.push_back(std::move(r));
      rule_names_.push_back(path + (k == 0 ? "" : " rule " + std::to_string(k)));
    }
    shift_calls(root, offset);
    return root;
  }
  static bool has_calls(const node& n) {
    if (n.kind == node::call) return true;
    return std::any_of(n.kids.begin(), n.kids.end(), [](const node& k) { return has_calls(k); });
  }

  struct tag_parts {
    std::string begin;
    std::vector<std::string> ends;
    const json* content = nullptr;
  };

  // A field's place in errors: "path.key", or "key" at the top.
  static std::string place(const std::string& path, const char* key) {
    return path.empty() ? std::string(key) : path + "." + key;
  }
  static const json& need(const json& obj, const char* key, const std::string& path) {
    const auto it = obj.find(key);
    check(it != obj.end(), place(path, key), " is missing");
    return *it;
  }
  static std::string need_string(const json& obj, const char* key, const std::string& path) {
    const json& v = need(obj, key, path);
    check(v.is_string(), place(path, key), " must be a string, got ", type_name(v));
    return v.get<std::string>();
  }
  static bool flag(const json& obj, const char* key, bool otherwise, const std::string& path) {
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return otherwise;
    check(it->is_boolean(), place(path, key), " must be a boolean, got ", type_name(*it));
    return it->get<bool>();
  }
  // A list of strings (absent or null and not `required`: none); `non_empty`: each must hold a byte.
  static std::vector<std::string> strings(const json& obj, const char* key, const std::string& path, bool required,
                                          bool non_empty) {
    const auto it = obj.find(key);
    if (it == obj.end() || (!required && it->is_null())) {
      check(!required, place(path, key), " is missing");
      return {};
    }
    check(it->is_array(), place(path, key), " must be a list of strings, got ", type_name(*it));
    std::vector<std::string> out;
    for (std::size_t i = 0; i < it->size(); ++i) {
      const json& s = (*it)[i];
      check(s.is_string(), place(path, key), "[", i, "] must be a string, got ", type_name(s));
      check(!non_empty || !s.get_ref<const std::string&>().empty(), place(path, key), "[", i, "] is empty");
      out.push_back(s.get<std::string>());
    }
    return out;
  }
  // A non-empty list.
  static const json& list(const json& obj, const char* key, const std::string& path) {
    const json& v = need(obj, key, path);
    check(v.is_array(), place(path, key), " must be a list, got ", type_name(v));
    check(!v.empty(), place(path, key), " is empty");
    return v;
  }

  // Regex text (from the regex, json_schema or grammar compilers) as a syntax tree, errors naming `path`.
  static node regex_node(const std::string& re, const std::string& path) {
    try {
      return guided_detail::regex_parser(re).parse();
    } catch (const error& e) {
      fail(path, ": ", e.what());
    }
  }

  node json_node(const json& schema, const std::string& path, const std::string& whitespace = "[ ]?") {
    check(schema.is_object() || schema.is_boolean(), path, " must be a JSON schema (an object or a boolean), got ",
          type_name(schema));
    try {
      guided_detail::json_schema_parts parts(schema.dump(), whitespace, json_schema_nesting::calls);
      return join_rules(parts.compiled().rules.size() + 1, [&](std::size_t k) { return parts.rule(k); }, path);
    } catch (const error& e) {
      fail(path, ": ", e.what());
    }
  }

  node legacy(const json& st) {
    const json& structures = list(st, "structures", "");
    const std::vector<std::string> triggers = strings(st, "triggers", "", true, true);
    check(!triggers.empty(), "triggers is empty");
    std::vector<dispatch_rule> rules;
    for (std::size_t i = 0; i < structures.size(); ++i) {
      const std::string path = "structures[" + std::to_string(i) + "]";
      const json& s = structures[i];
      check(s.is_object(), path, " must be an object {begin, schema, end}, got ", type_name(s));
      const std::string begin = need_string(s, "begin", path), end = need_string(s, "end", path);
      node body = guided_detail::seq({json_node(need(s, "schema", path), path + ".schema"),
                                      guided_detail::literal(end)});
      bool matched = false;
      for (const std::string& t : triggers) {
        if (!begin.starts_with(t)) continue;
        matched = true;
        rules.push_back({t, guided_detail::seq({guided_detail::literal(begin.substr(t.size())), body})});
      }
      check(matched, path, ".begin \"", begin, "\" starts with none of the triggers");
    }
    return dispatch(rules, {}, true, "triggers");
  }

  tag_parts parse_tag(const json& t, const std::string& path, bool type_optional) {
    check(t.is_object(), path, " must be a tag object {begin, content, end}, got ", type_name(t));
    const auto type = t.find("type");
    if (type != t.end() || !type_optional)
      check(type != t.end() && *type == "tag", path, ": a tag must have \"type\": \"tag\"");
    tag_parts out;
    const json& begin = need(t, "begin", path);
    check(!begin.is_object(), path, ".begin: a token (a token-level format) is not supported");
    check(begin.is_string(), path, ".begin must be a string, got ", type_name(begin));
    out.begin = begin.get<std::string>();
    const json& end = need(t, "end", path);
    check(!end.is_object(), path, ".end: a token (a token-level format) is not supported");
    if (end.is_string()) out.ends.push_back(end.get<std::string>());
    else out.ends = strings(t, "end", path, true, false);
    check(!out.ends.empty(), path, ".end is an empty list");
    out.content = &need(t, "content", path);
    return out;
  }

  // What follows a tag's begin: its content (whose free text stops at the tag's ends), then one of the ends.
  node tag_rest(const tag_parts& t, const std::string& path, int depth) {
    return guided_detail::seq({format(*t.content, path + ".content", t.ends, depth + 1), any_literal(t.ends)});
  }

  // The tags of triggered_tags or tags_with_separator: each parsed, and its begin and rest.
  std::vector<std::pair<std::string, node>> tags(const json& f, const std::string& path, int depth) {
    const json& ts = list(f, "tags", path);
    std::vector<std::pair<std::string, node>> out;
    for (std::size_t i = 0; i < ts.size(); ++i) {
      const std::string p = path + ".tags[" + std::to_string(i) + "]";
      const tag_parts t = parse_tag(ts[i], p, true);
      out.emplace_back(t.begin, tag_rest(t, p, depth));
    }
    return out;
  }

  static std::vector<std::string> non_empty(std::vector<std::string> xs) {
    xs.erase(std::remove(xs.begin(), xs.end(), ""), xs.end());
    return xs;
  }

  node format(const json& f, const std::string& path, const std::vector<std::string>& ends, int depth) {
    check(depth < structural_tag_max_depth, path, ": formats nested more than ", structural_tag_max_depth, " deep");
    check(f.is_object(), path, " must be a format object, got ", type_name(f));
    const auto type_it = f.find("type");
    check(type_it != f.end(), path, ": a format needs a 'type'");
    check(type_it->is_string(), path, ".type must be a string, got ", type_name(*type_it));
    const std::string type = type_it->get<std::string>();
    const std::string& at = path;
    if (type == "const_string") return guided_detail::literal(need_string(f, "value", at));
    if (type == "json_schema") {
      if (const auto s = f.find("style"); s != f.end() && !s->is_null())
        check(*s == "json", at, ".style ", s->dump(), " is not supported in a json_schema format (only \"json\")");
      check(!flag(f, "any_order", false, at), at, ".any_order true is not supported in a json_schema format "
            "(properties come in their declared order)");
      std::string whitespace = "[ ]?";
      if (const auto w = f.find("max_whitespace_cnt"); w != f.end() && !w->is_null()) {
        check(w->is_number_integer() && w->get<std::int64_t>() >= 0, at, ".max_whitespace_cnt must be an integer >= 0");
        if (w->get<std::int64_t>() == 0) whitespace = "";
      }
      return json_node(need(f, "json_schema", at), at + ".json_schema", whitespace);
    }
    if (type == "regex") {
      const std::string pattern = need_string(f, "pattern", at);
      check(!pattern.empty(), at, ".pattern is empty");
      return regex_node(pattern, at + ".pattern");
    }
    if (type == "grammar") {
      const std::string g = need_string(f, "grammar", at);
      check(!g.empty(), at, ".grammar is empty");
      try {
        const grammar_compiled rules = grammar_rules(g);
        return join_rules(
            rules.rules.size(),
            [&](std::size_t k) { return guided_detail::regex_parser(rules.rules[k], {}, rules.rules.size()).parse(); },
            at + ".grammar");
      } catch (const error& e) {
        fail(at, ".grammar: ", e.what());
      }
    }
    if (type == "any_text") {
      for (const char* budget : {"max_tokens", "max_chars"})
        if (const auto b = f.find(budget); b != f.end() && !b->is_null())
          fail(at, ".", budget, " is not supported in an any_text format");
      std::vector<std::string> stops = strings(f, "excludes", at, false, true);
      for (const std::string& e : non_empty(ends)) stops.push_back(e);
      return embed(text_scanner(stops, at).none());
    }
    if (type == "sequence" || type == "or") {
      const json& elements = list(f, "elements", at);
      std::vector<node> kids;
      for (std::size_t i = 0; i < elements.size(); ++i)
        kids.push_back(format(elements[i], path + ".elements[" + std::to_string(i) + "]", ends, depth + 1));
      return type == "or" ? one_of(std::move(kids)) : guided_detail::seq(std::move(kids));
    }
    if (type == "optional" || type == "plus" || type == "star") {
      node kid = format(need(f, "content", at), path + ".content", ends, depth + 1);
      return repeated(std::move(kid), type == "plus" ? 1 : 0, type == "optional" ? 1 : -1);
    }
    if (type == "repeat") {
      const json& lo = need(f, "min", at);
      const json& hi = need(f, "max", at);
      constexpr int cap = guided_detail::regex_parser::max_repeat;
      check(lo.is_number_integer() && lo.get<std::int64_t>() >= 0 && lo.get<std::int64_t>() <= cap, at,
            ".min must be an integer in [0, ", cap, "]");
      check(hi.is_number_integer() && hi.get<std::int64_t>() >= -1 && hi.get<std::int64_t>() <= cap, at,
            ".max must be -1 (unbounded) or an integer in [0, ", cap, "]");
      const int min = lo.get<int>(), max = hi.get<int>();
      check(max < 0 || max >= min, at, ".max ", max, " is below .min ", min);
      return repeated(format(need(f, "content", at), path + ".content", ends, depth + 1), min, max);
    }
    if (type == "tag") {
      const tag_parts t = parse_tag(f, at, false);
      return guided_detail::seq({guided_detail::literal(t.begin), tag_rest(t, path, depth)});
    }
    if (type == "triggered_tags") {
      const std::vector<std::string> triggers = strings(f, "triggers", at, true, true);
      check(!triggers.empty(), at, ".triggers is empty");
      const auto ts = tags(f, path, depth);
      const bool at_least_one = flag(f, "at_least_one", false, at);
      const bool stop_after_first = flag(f, "stop_after_first", false, at);
      std::vector<dispatch_rule> rules;
      std::vector<node> whole;
      for (std::size_t i = 0; i < ts.size(); ++i) {
        const auto& [begin, rest] = ts[i];
        bool matched = false;
        for (const std::string& t : triggers) {
          if (!begin.starts_with(t)) continue;
          matched = true;
          rules.push_back({t, guided_detail::seq({guided_detail::literal(begin.substr(t.size())), rest})});
        }
        check(matched, path, ".tags[", i, "].begin \"", begin, "\" starts with none of the triggers");
        whole.push_back(guided_detail::seq({guided_detail::literal(begin), rest}));
      }
      std::vector<std::string> excludes = strings(f, "excludes", at, false, true);
      for (const std::string& e : non_empty(ends)) excludes.push_back(e);
      if (at_least_one && stop_after_first) return one_of(std::move(whole));
      if (at_least_one) return guided_detail::seq({one_of(std::move(whole)), dispatch(rules, excludes, true, at)});
      return dispatch(rules, excludes, !stop_after_first, at);
    }
    if (type == "tags_with_separator") {
      const std::string separator = need_string(f, "separator", at);
      const auto ts = tags(f, path, depth);
      const bool at_least_one = flag(f, "at_least_one", false, at);
      const bool stop_after_first = flag(f, "stop_after_first", false, at);
      std::vector<node> whole;
      for (const auto& [begin, rest] : ts) whole.push_back(guided_detail::seq({guided_detail::literal(begin), rest}));
      node one = one_of(std::move(whole));
      node some = stop_after_first ? one
                  : guided_detail::seq({one, repeated(guided_detail::seq({guided_detail::literal(separator), one}),
                                                      0, -1)});
      return at_least_one ? some : repeated(std::move(some), 0, 1);
    }
    if (type == "dispatch") {
      const json& rs = list(f, "rules", at);
      std::vector<dispatch_rule> rules;
      for (std::size_t i = 0; i < rs.size(); ++i) {
        const std::string p = path + ".rules[" + std::to_string(i) + "]";
        const json& r = rs[i];
        check(r.is_array() && r.size() == 2, p, " must be a pair [pattern, format]");
        check(r[0].is_string() && !r[0].get_ref<const std::string&>().empty(), p, "[0] must be a non-empty string");
        rules.push_back({r[0].get<std::string>(), format(r[1], p + "[1]", ends, depth + 1)});
      }
      return dispatch(rules, strings(f, "excludes", at, false, true), flag(f, "loop", true, at), at);
    }
    for (const char* token_level : {"token", "exclude_token", "any_tokens", "token_triggered_tags", "token_dispatch"})
      if (type == token_level)
        fail(at, ": format type \"", type, "\" is token-level, not supported (the guide constrains text bytes)");
    fail(path, ": unknown format type \"", type, "\"");
  }
};

}  // namespace structural_tag_detail

// The automaton of a structural tag's text (JSON text; see the top of this header): a DFA, or a pushdown grammar
// where a grammar or schema in it recurses. Throws zipage::error "structural_tag: ..." naming the place and what is
// wrong: malformed JSON, a missing or mistyped field, a begin that starts with no trigger, an unknown or
// unsupported format type, a structure whose DFA would pass guided_max_dfa_states, a grammar's left recursion.
[[nodiscard]] inline guided_machine compile_guided_structural_tag(std::string_view structural_tag) {
  try {
    structural_tag_detail::json root;
    try {
      root = structural_tag_detail::json::parse(structural_tag);
    } catch (const nlohmann::json::exception& e) {
      fail("not JSON (", e.what(), ")");
    }
    structural_tag_detail::compiler c;
    const guided_detail::node tree = c.root(root);
    std::vector<std::string> names{"the structural tag"};
    for (const std::string& n : c.rule_names()) names.push_back(n);
    return guided_detail::rules_machine(
        names.size(), [&](std::size_t k) { return k == 0 ? tree : c.rules()[k - 1]; }, names, "the structural tag");
  } catch (const error& e) {
    fail("structural_tag: ", e.what());
  }
}

}  // namespace zipage
