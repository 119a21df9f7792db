// Structured outputs (sampling/guided.hpp, sampling/json_schema.hpp, sampling/grammar.hpp,
// sampling/structural_tag.hpp): the vocabulary trie walk, choice and regex guides on a hand-made vocabulary, the regex
// compiler's accept/reject tables, the logit edit a guide makes, JSON schemas (accept/reject tables, random walks
// whose every output parses and satisfies the schema, errors), GBNF grammars, structural tags (accept/reject tables
// for the legacy and the format form, errors), and guided generation end to end on stories260K (CPU backend).
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "zipage/engine/engine.hpp"
#include "zipage/gguf/gguf.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/sampling/guided.hpp"
#include "zipage/sampling/json_schema.hpp"
#include "zipage/sampling/logits_processors.hpp"
#include "zipage/sampling/sampler.hpp"
#include "zipage/sampling/structural_tag.hpp"
#include "zipage/tokenizer/detokenizer.hpp"
#include "pushdown_reference.hpp"
#include "stories_model.hpp"
#include "test_support.hpp"

using namespace zipage;
using zipage::testing::contains;
using zipage::testing::error_of;
using zipage::testing::stories;

namespace {

// id 0 is a special token (EOS: no bytes); "yesno" spans two choices; "\xC3" + "\xA9" is "é" split in two.
const std::vector<std::string> kBytes = {"",   "a",  "b",     "ab",       "abc",    "c",    "yes", "ye",
                                         "s",  "no", "y",     "n",        "o",      "yesno", "\xC3\xA9", "\xC3",
                                         "\xA9", " ", "1",    "12",       "x",      "ss",   "",    "yess"};
constexpr token_id kEos = 0, kOtherSpecial = 22;

// The automaton matches each text of `yes` as a whole, and none of `no`.
void check_language(const guided_machine& d, const std::vector<std::string>& yes, const std::vector<std::string>& no) {
  for (const std::string& t : yes) {
    CAPTURE(t);
    CHECK(d.matches(t));
  }
  for (const std::string& t : no) {
    CAPTURE(t);
    CHECK(!d.matches(t));
  }
}

std::shared_ptr<const guide_vocabulary> vocab() {
  static const auto v = std::make_shared<const guide_vocabulary>(kBytes);
  return v;
}

std::vector<token_id> ids_of(const guide& g, const std::string& text) {
  const std::int32_t s = g.dfa().walk(byte_dfa::start, text);
  REQUIRE(s >= 0);
  return g.allowed_ids(s);
}

// Every token allowed by brute force: its bytes appended keep the text a prefix of some accepted string.
std::vector<token_id> brute(const byte_dfa& d, const std::string& text) {
  std::vector<token_id> out;
  for (std::size_t i = 0; i < kBytes.size(); ++i)
    if (!kBytes[i].empty() && d.walk(byte_dfa::start, text + kBytes[i]) >= 0) out.push_back(static_cast<token_id>(i));
  return out;
}

}  // namespace

TEST_CASE("guide vocabulary: tokens sorted by bytes, special tokens left out, common prefixes") {
  const auto& v = *vocab();
  CHECK(v.size() == static_cast<std::int32_t>(kBytes.size()));
  CHECK(v.sorted().size() == kBytes.size() - 2);
  CHECK(std::find(v.sorted().begin(), v.sorted().end(), kEos) == v.sorted().end());
  CHECK(std::find(v.sorted().begin(), v.sorted().end(), kOtherSpecial) == v.sorted().end());
  for (std::size_t i = 1; i < v.sorted().size(); ++i) {
    const std::string &a = v.bytes_of(v.sorted()[i - 1]), &b = v.bytes_of(v.sorted()[i]);
    CHECK(a < b);
    CHECK(a.substr(0, v.lcp()[i]) == b.substr(0, v.lcp()[i]));
    CHECK((v.lcp()[i] == a.size() || v.lcp()[i] == b.size() || a[v.lcp()[i]] != b[v.lcp()[i]]));
  }
  CHECK(v.bytes_of(-1).empty());
  CHECK(v.bytes_of(1000).empty());
}

TEST_CASE("choice guide: tokens along a choice, EOS only at a whole choice") {
  const guide g(compile_guided_choice({"yes", "no"}), vocab());
  CHECK(ids_of(g, "") == std::vector<token_id>{6, 7, 9, 10, 11});  // yes ye no y n; not yesno, not yess
  CHECK(ids_of(g, "ye") == std::vector<token_id>{8});               // s; not ss
  CHECK(!g.accepts(g.dfa().walk(0, "ye")));
  const std::int32_t at_yes = g.state_after(std::vector<token_id>{7, 8});
  CHECK(g.accepts(at_yes));
  CHECK(g.allowed_ids(at_yes).empty());  // no longer choice: only EOS
  CHECK(g.state_after(std::vector<token_id>{6, 8}) == -1);    // yess left the language
  CHECK(g.state_after(std::vector<token_id>{kEos}) == -1);    // a token without bytes
  for (const std::string t : {"", "y", "ye", "n", "no", "yes"}) CHECK(ids_of(g, t) == brute(g.dfa(), t));
}

TEST_CASE("choice guide: a choice that extends another; a token spanning two choices; split UTF-8") {
  const guide g(compile_guided_choice({"yes", "yesno"}), vocab());
  CHECK(ids_of(g, "") == std::vector<token_id>{6, 7, 10, 13});
  const std::int32_t at_yes = g.dfa().walk(0, "yes");
  CHECK(g.accepts(at_yes));
  CHECK(g.allowed_ids(at_yes) == std::vector<token_id>{9, 11});  // no, n (EOS too: the caller adds it)
  const guide e(compile_guided_choice({"é", "ab"}), vocab());
  CHECK(ids_of(e, "") == std::vector<token_id>{1, 3, 14, 15});
  CHECK(ids_of(e, "\xC3") == std::vector<token_id>{16});
  CHECK(e.accepts(e.state_after(std::vector<token_id>{15, 16})));
}

TEST_CASE("guide's logit edit: the allowed ids and EOS at a match, everything else -inf") {
  sampling_params p;
  p.guided.choice = {"yes", "yesno"};
  token_rules rules;
  rules.eos_ids = {kEos};
  rules.guided = std::make_shared<const guide>(compile_guided(p.guided), vocab());
  CHECK(p.processes_logits(0));
  logit_edits e;
  const std::vector<token_id> prompt_and_yes = {5, 5, 7, 8};  // prompt "cc", generated "ye" "s"
  make_logit_edits(e, p, prompt_and_yes, 2, rules, static_cast<std::int64_t>(kBytes.size()));
  CHECK(e.others_banned);
  CHECK(e.ids == std::vector<token_id>{kEos, 9, 11});
  make_logit_edits(e, p, prompt_and_yes, 0, rules, static_cast<std::int64_t>(kBytes.size()));
  CHECK(e.ids == std::vector<token_id>{6, 7, 10, 13});
  // A text that left the language (cannot happen under the guide) ends with EOS rather than garbage.
  const std::vector<token_id> bad = {5, 1};
  make_logit_edits(e, p, bad, 1, rules, static_cast<std::int64_t>(kBytes.size()));
  CHECK(e.ids == std::vector<token_id>{kEos});
  // The sampler draws only allowed ids, whatever the logits.
  std::vector<float> logits(kBytes.size(), 0.0f);
  logits[13] = 50.0f;  // "yesno" is the favourite but not allowed after "yes"
  logits[20] = 100.0f;
  sampling_params q = p;
  q.temperature = 0.0f;
  CHECK(sampler{}.sample(logits, q, prompt_and_yes, 2, rules) == kEos);
  logits[9] = 1.0f;
  CHECK(sampler{}.sample(logits, q, prompt_and_yes, 2, rules) == 9);
}

TEST_CASE("guide's logit edit when most tokens are allowed: the others banned, EOS only at a match") {
  sampling_params p;
  p.guided.regex = "[^x]*";
  token_rules rules;
  rules.eos_ids = {kEos};
  rules.guided = std::make_shared<const guide>(compile_guided(p.guided), vocab());
  const auto next = rules.guided->next_tokens(byte_dfa::start);
  CHECK(next->complement);
  // Banned: "\xA9" (a continuation byte cannot start a character), "x", the special token 22, and the ids past the
  // guide's vocabulary (the model's is larger: 26). EOS (0) is not: the empty text matches.
  logit_edits e;
  const std::vector<token_id> prompt = {5, 5};
  make_logit_edits(e, p, prompt, 0, rules, 26);
  CHECK(!e.others_banned);
  CHECK(e.ids == std::vector<token_id>{16, 20, 22, 24, 25});
  for (const float add : e.adds) CHECK(add == -std::numeric_limits<float>::infinity());
  // Inside "é" (after "\xC3") only its second byte may come: an allowed list again, without EOS.
  const std::vector<token_id> half = {5, 5, 15};
  make_logit_edits(e, p, half, 1, rules, 26);
  CHECK(e.others_banned);
  CHECK(e.ids == std::vector<token_id>{16});
  // The sampler draws from what is left.
  std::vector<float> logits(26, 0.0f);
  logits[20] = 100.0f;
  logits[25] = 90.0f;
  logits[3] = 5.0f;
  sampling_params q = p;
  q.temperature = 0.0f;
  CHECK(sampler{}.sample(logits, q, prompt, 0, rules) == 3);
}

TEST_CASE("guide after reasoning: the block is free, the guide reads the tokens after its closing tag") {
  // Model vocabulary 26: 24 and 25 (past the guide's vocabulary, no bytes) are <think> and </think>.
  constexpr token_id kOpen = 24, kClose = 25;
  sampling_params p;
  p.guided.choice = {"yes", "yesno"};
  token_rules rules;
  rules.eos_ids = {kEos};
  rules.guided = std::make_shared<const guide>(compile_guided(p.guided), vocab());
  logit_edits e;
  const auto edit = [&](std::vector<token_id> generated) {
    std::vector<token_id> context = {5, 5};  // the prompt "cc"
    context.insert(context.end(), generated.begin(), generated.end());
    make_logit_edits(e, p, context, generated.size(), rules, 26);
    return e.ids;
  };
  const std::vector<token_id> at_start = {6, 7, 10, 13}, after_ye = {8}, at_yes = {kEos, 9, 11};

  SUBCASE("the prompt opened the block") {
    p.guided_after_reasoning = reasoning_tags{-1, kClose, true};
    p.validate();
    CHECK(edit({}).empty());  // thinking: no edit at all
    CHECK(e.empty());
    CHECK(edit({5, 1, 20}).empty());  // "x" is no choice's byte, but the block is free
    CHECK(edit({5, kClose}) == at_start);
    CHECK(e.others_banned);
    CHECK(edit({5, kClose, 7}) == after_ye);
    CHECK(edit({5, kClose, 7, 8}) == at_yes);
    // A second </think> is guided text, and no text of the guide's (no bytes): only EOS is left.
    CHECK(edit({kClose, 7, kClose}) == std::vector<token_id>{kEos});
  }
  SUBCASE("the answer may open the block as its first token") {
    p.guided_after_reasoning = reasoning_tags{kOpen, kClose, false};
    p.validate();
    std::vector<token_id> first = at_start;
    first.push_back(kOpen);
    CHECK(edit({}) == first);
    CHECK(e.others_banned);
    CHECK(edit({kOpen, 1, 20}).empty());
    CHECK(edit({kOpen, 1, kClose}) == at_start);
    CHECK(edit({kOpen, kClose, 7, 8}) == at_yes);
    CHECK(edit({7}) == after_ye);  // another first token: the guided text started at once
    CHECK(edit({7, 8}) == at_yes);
    // The sampler: free inside the block (the favourite "x" is drawn), the guide's tokens after it.
    std::vector<float> logits(26, 0.0f);
    logits[20] = 100.0f;
    sampling_params q = p;
    q.temperature = 0.0f;
    CHECK(sampler{}.sample(logits, q, std::vector<token_id>{5, kOpen}, 1, rules) == 20);
    logits[6] = 1.0f;
    CHECK(sampler{}.sample(logits, q, std::vector<token_id>{5, kOpen, kClose}, 2, rules) == 6);
    CHECK(sampler{}.sample(logits, q, std::vector<token_id>{5}, 0, rules) == 6);
    logits[kOpen] = 2.0f;
    CHECK(sampler{}.sample(logits, q, std::vector<token_id>{5}, 0, rules) == kOpen);
  }
  SUBCASE("most tokens allowed: the opening tag is not among the banned") {
    p.guided = {};
    p.guided.regex = "[^x]*";
    rules.guided = std::make_shared<const guide>(compile_guided(p.guided), vocab());
    p.guided_after_reasoning = reasoning_tags{kOpen, kClose, false};
    CHECK(edit({}) == std::vector<token_id>{16, 20, 22, 25});  // 24 (<think>) kept
    CHECK(!e.others_banned);
    CHECK(edit({kOpen, 20}).empty());
    CHECK(edit({kOpen, 20, kClose}) == std::vector<token_id>{16, 20, 22, 24, 25});  // after it, the guide alone
  }
  SUBCASE("bad tags are named") {
    p.guided_after_reasoning = reasoning_tags{-1, kClose, false};
    CHECK(contains(error_of([&] { p.validate(); }), "guided_after_reasoning.open must be a token id >= 0"));
    p.guided_after_reasoning = reasoning_tags{kOpen, -1, false};
    CHECK(contains(error_of([&] { p.validate(); }), "guided_after_reasoning.close must be a token id >= 0"));
    p.guided_after_reasoning = reasoning_tags{kOpen, kOpen, false};
    CHECK(contains(error_of([&] { p.validate(); }), "open and close tags are one token"));
    p.guided = {};
    p.guided_after_reasoning = reasoning_tags{kOpen, kClose, false};
    CHECK(contains(error_of([&] { p.validate(); }), "guided_after_reasoning is set without a guided constraint"));
  }
}

TEST_CASE("regex compiler: accepts and rejects whole texts") {
  struct row {
    const char* re;
    std::vector<std::string> yes, no;
  };
  const std::vector<row> table = {
      {"abc", {"abc"}, {"", "ab", "abcd", "xabc"}},
      {"^a|b$", {"a", "b"}, {"", "ab"}},
      {"(?:ab)+c?", {"ab", "abab", "ababc"}, {"", "a", "abc c", "c"}},
      {"[a-c]*x", {"x", "abcx", "cccx"}, {"dx", "abc"}},
      {"[^0-9]{2}", {"ab", " b", "é!"}, {"a1", "a", "abc"}},
      {"\\d{3}-\\d{2,}", {"123-45", "000-123456"}, {"12-45", "123-4", "abc-45"}},
      {"\\w+@\\w+\\.com", {"bob@mail.com", "a_1@b.com"}, {"bob@mail.org", "@b.com", "a@b com"}},
      {"\\s?\\S", {"a", " a", "\tb", "é"}, {" ", "  a"}},
      {"(yes|no)!{0,1}", {"yes", "no!"}, {"yes!!", "maybe"}},
      {"a.c", {"abc", "a c", "aéc", "a\xF0\x9F\x98\x80" "c", "a\xEF\xBF\xBD" "c"},
       {"a\nc", "ac", "a\xE0\x80\x80" "c", "a\xED\xA0\x80" "c", "a\xC0\xAF" "c", "a\xF4\x90\x80\x80" "c",
        "a\x80" "c"}},
      {"x{2,3}", {"xx", "xxx"}, {"x", "xxxx"}},
      {"x{2,}", {"xx", "xxxxxxx"}, {"x"}},
      {"(?P<n>a)(?<m>b)", {"ab"}, {"a"}},
      {"a+?b*?", {"a", "aab"}, {"b"}},
      {"\\x41\\u00e9\\.\\n", {"Aé.\n"}, {"Ae.\n"}},
      {"[\\w.-]+", {"a.b-c_d"}, {"a b"}},
      {"[]a]", {"]", "a"}, {"b"}},
      {"a{x}", {"a{x}"}, {"a"}},
      {"é+", {"é", "éé"}, {"e", "\xC3"}},
      {"", {""}, {"a"}},
  };
  for (const row& r : table) {
    const std::string re = r.re;
    CAPTURE(re);
    check_language(compile_guided_regex(r.re), r.yes, r.no);
  }
}

TEST_CASE("regex compiler: unsupported syntax and bad regexes are errors naming guided_regex and the problem") {
  const std::vector<std::pair<const char*, const char*>> table = {
      {"(a)\\1", "backreferences"},        {"a(?=b)", "lookaround"},         {"a(?<!b)", "lookaround"},
      {"\\bword", "word boundaries"},      {"(?i)abc", "inline flags"},      {"(ab", "missing ')'"},
      {"ab)", "unbalanced ')'"},           {"[abc", "missing ']'"},          {"*a", "nothing to repeat"},
      {"a{3,1}", "maximum below"},         {"a^b", "anchor"},                {"[z-a]", "out of order"},
      {"a{1001}", "above 1000"},           {"\\q", "unknown escape"},        {"a++", "possessive"},
      {"[é]", "non-ASCII"},                {"[^\\x00-\\x7f\\W]", "matches no text"},
      {"[a-z]{0,40}[0-9]{0,40}[a-f]{0,40}x[0-9a-z]{30}", "states"},
      {"a**", "nothing to repeat"},       {"(.{0,300}){0,300}", "simplify it"}, {".{0,900}[ab]{0,900}", "simplify it"},
  };
  for (const auto& [re, what] : table) {
    CAPTURE(re);
    const std::string msg = error_of([&] { (void)compile_guided_regex(re); });
    CHECK(contains(msg, "guided_regex"));
    CHECK(contains(msg, what));
  }
  const std::string deep = std::string(300, '(') + "a" + std::string(300, ')');
  CHECK(contains(error_of([&] { (void)compile_guided_regex(deep); }), "nested more than 200"));
  CHECK(compile_guided_regex(std::string(150, '(') + "a" + std::string(150, ')')).matches("a"));
  CHECK(contains(error_of([] { (void)compile_guided_choice({}); }), "guided_choice"));
  CHECK(contains(error_of([] { (void)compile_guided_choice({"a", ""}); }), "choice [1] is empty"));
}

TEST_CASE("regex guide: allowed tokens equal the brute-force set at every reachable prefix") {
  for (const char* re : {"(ab|c)*x?", "\\d+ ?[a-c]{1,2}", "y(es)?s*|no", "[^a]+"}) {
    CAPTURE(re);
    const guide g(compile_guided_regex(re), vocab());
    for (const std::string t : {"", "a", "ab", "abc", "1", "12 ", "y", "ye", "yes", "yess", "n", "\xC3", "x"}) {
      CAPTURE(t);
      const std::int32_t s = g.dfa().walk(0, t);
      if (s < 0) continue;
      CHECK(g.allowed_ids(s) == brute(g.dfa(), t));
    }
  }
}

TEST_CASE("sampling_params::guided is validated: one constraint, no empty choice, not with allowed_token_ids") {
  sampling_params p;
  p.guided.choice = {"a", ""};
  CHECK(contains(error_of([&] { p.validate(); }), "guided_choice[1] must not be empty"));
  p.guided.choice = {"a"};
  p.guided.regex = "b";
  CHECK(contains(error_of([&] { p.validate(); }), "more than one of guided_choice, guided_regex, guided_json, "
                                                  "guided_grammar and structural_tag"));
  p.guided.regex.reset();
  p.guided.json_schema = "{}";
  CHECK(contains(error_of([&] { p.validate(); }), "more than one"));
  p.guided.choice.clear();
  p.validate();
  p.guided.json_schema.reset();
  p.guided.whitespace_pattern = " ?";
  CHECK(contains(error_of([&] { p.validate(); }), "whitespace_pattern is set without guided_json"));
  p.guided.whitespace_pattern.reset();
  p.guided.regex = "b";
  p.allowed_token_ids = std::vector<token_id>{1};
  CHECK(contains(error_of([&] { p.validate(); }), "guided_regex cannot be combined with allowed_token_ids"));
  p.allowed_token_ids.reset();
  p.min_tokens = 1;
  CHECK(contains(error_of([&] { p.validate(); }), "min_tokens"));
  p.min_tokens = 0;
  p.validate();
  CHECK(!sampling_params{}.processes_logits(0));
}

// ---- JSON schemas (json_schema.hpp) ----

namespace {

std::size_t code_points(const std::string& s) {
  return static_cast<std::size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

// A validator of the keywords the random walks' schemas use: what the guide promises, checked on the parsed value.
bool conforms(const nlohmann::json& v, const nlohmann::json& s, const nlohmann::json& root) {
  if (s.contains("$ref")) {
    const nlohmann::json::json_pointer target(s["$ref"].get<std::string>().substr(1));
    return conforms(v, root.at(target), root);
  }
  if (s.contains("const")) return v == s["const"];
  if (s.contains("enum")) return std::find(s["enum"].begin(), s["enum"].end(), v) != s["enum"].end();
  if (s.contains("anyOf"))
    return std::any_of(s["anyOf"].begin(), s["anyOf"].end(), [&](const auto& sub) { return conforms(v, sub, root); });
  if (!s.contains("type")) return true;
  if (s["type"].is_array()) {
    return std::any_of(s["type"].begin(), s["type"].end(), [&](const auto& t) {
      nlohmann::json one = s;
      one["type"] = t;
      return conforms(v, one, root);
    });
  }
  const std::string type = s["type"];
  if (type == "integer") {
    if (!v.is_number_integer()) return false;
    const auto n = v.get<long long>();
    return (!s.contains("multipleOf") || n % s["multipleOf"].get<long long>() == 0) &&
           n >= s.value("minimum", std::numeric_limits<long long>::min()) &&
           n <= s.value("maximum", std::numeric_limits<long long>::max());
  }
  if (type == "number") return v.is_number();
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  if (type == "string") {
    if (!v.is_string()) return false;
    const std::size_t n = code_points(v.get<std::string>());
    return n >= s.value("minLength", 0u) && n <= s.value("maxLength", 1000u);
  }
  if (type == "array") {
    if (!v.is_array() || v.size() < s.value("minItems", 0u) || v.size() > s.value("maxItems", 1000u)) return false;
    return !s.contains("items") ||
           std::all_of(v.begin(), v.end(), [&](const auto& item) { return conforms(item, s["items"], root); });
  }
  if (!v.is_object()) return false;
  if (!s.contains("properties")) return true;
  for (const auto& k : s.value("required", nlohmann::json::array()))
    if (!v.contains(k.get<std::string>())) return false;
  for (const auto& [k, item] : v.items())
    if (!s["properties"].contains(k) || !conforms(item, s["properties"][k], root)) return false;
  return true;
}

// Every printable ASCII character, and a few longer tokens; id 0 is EOS (no bytes).
std::shared_ptr<const guide_vocabulary> json_vocab() {
  static const auto v = [] {
    std::vector<std::string> bytes = {""};
    for (char c = ' '; c <= '~'; ++c) bytes.emplace_back(1, c);
    for (const char* t : {"true", "false", "null", "\"name\"", "\": ", ", ", "12", "\xC3\xA9", "\\u00e9", "[]", "{}"})
      bytes.emplace_back(t);
    return std::make_shared<const guide_vocabulary>(std::move(bytes));
  }();
  return v;
}

// Each DFA state's distance (in bytes) to an accepting one.
// Per rule (a DFA's: one rule), the fewest bytes from each state to its accepting states, a call costing its rule's
// shortest text.
std::vector<std::vector<int>> distance_to_accept(const std::vector<const byte_dfa*>& rules) {
  constexpr int far = 1 << 20;
  std::vector<std::vector<int>> dist(rules.size());
  for (std::size_t r = 0; r < rules.size(); ++r) dist[r].assign(static_cast<std::size_t>(rules[r]->size()), far);
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t r = 0; r < rules.size(); ++r) {
      const byte_dfa& d = *rules[r];
      auto& dr = dist[r];
      auto lower = [&](std::int32_t s, int v) {
        if (v < dr[static_cast<std::size_t>(s)]) {
          dr[static_cast<std::size_t>(s)] = v;
          changed = true;
        }
      };
      for (std::int32_t s = 0; s < d.size(); ++s) {
        if (d.accepts(s)) lower(s, 0);
        for (const auto& e : d.edges[static_cast<std::size_t>(s)]) lower(s, dr[static_cast<std::size_t>(e.to)] + 1);
        for (const auto& c : d.calls_of(s))
          lower(s, dist[static_cast<std::size_t>(c.rule)][0] + dr[static_cast<std::size_t>(c.to)]);
      }
    }
  }
  return dist;
}

// The fewest bytes that complete `text` to a match of the guide's automaton (a pushdown one's: the cheapest stack,
// each frame finishing its rule), or a large number where `text` is no prefix of one.
struct completion_cost {
  explicit completion_cost(const guide& g) : g_(g) {
    std::vector<const byte_dfa*> rules;
    if (g.is_pushdown())
      for (const byte_dfa& r : g.pda().rules) rules.push_back(&r);
    else
      rules.push_back(&g.dfa());
    dist_ = distance_to_accept(rules);
  }
  int operator()(const std::string& text) const {
    constexpr int far = 1 << 20;
    if (!g_.is_pushdown()) {
      const std::int32_t s = g_.dfa().walk(byte_dfa::start, text);
      return s < 0 ? far : dist_[0][static_cast<std::size_t>(s)];
    }
    const auto c = zipage_test::reference_after(g_.pda(), text);
    int best = c.bottom_returned ? 0 : far;
    for (const auto& st : c.stacks) {
      int cost = 0;
      for (const auto& f : st) cost += dist_[static_cast<std::size_t>(f.rule)][static_cast<std::size_t>(f.state)];
      best = std::min(best, cost);
    }
    return best;
  }

 private:
  const guide& g_;
  std::vector<std::vector<int>> dist_;
};

// A random text the guide allows: uniform picks among the allowed tokens for `budget` steps (stopping at a match
// now and then), then the tokens that come closest to a match, so that every walk ends.
std::string random_walk(const guide& g, const completion_cost& cost, std::mt19937& rng, int budget) {
  std::string text;
  std::vector<token_id> tokens;
  for (int step = 0;; ++step) {
    const guide_lookahead ahead = g.lookahead(tokens);
    CAPTURE(text);
    REQUIRE(ahead.alive);
    if (ahead.at_match && (step >= budget || rng() % 4 == 0)) return text;
    const std::vector<token_id> ids = g.allowed_after(tokens);
    if (ids.empty() && ahead.at_match) return text;  // nothing longer matches: only EOS
    REQUIRE(!ids.empty());
    token_id pick = ids[rng() % ids.size()];
    if (step >= budget)
      pick = *std::min_element(ids.begin(), ids.end(), [&](token_id a, token_id b) {
        return cost(text + g.vocabulary().bytes_of(a)) < cost(text + g.vocabulary().bytes_of(b));
      });
    text += g.vocabulary().bytes_of(pick);
    tokens.push_back(pick);
    REQUIRE(cost(text) < (1 << 20));
  }
}

}  // namespace

TEST_CASE("json schema compiler: accepts and rejects whole texts, keyword by keyword") {
  struct row {
    const char* schema;
    std::vector<std::string> yes, no;
  };
  const std::vector<row> table = {
      {R"({"type":"integer"})", {"0", "-12", "340"}, {"01", "1.5", "+1", "", "\"1\""}},
      {R"({"type":"number"})", {"0", "-1.25", "3e10", "2.5E-3"}, {"1.", ".5", "1e", "NaN", "1e400"}},
      {R"({"type":"boolean"})", {"true", "false"}, {"True", "1"}},
      {R"({"type":"null"})", {"null"}, {"", "None"}},
      {R"({"type":"string"})", {R"("")", R"("a b")", R"("é\"\\\/\n\u00E9")"},
       {R"("a)", "\"a\nb\"", R"("\x")", R"("\u12")"}},
      {R"({"type":"string","minLength":2,"maxLength":3})", {R"("ab")", R"("éé")", R"("a\nb")"},
       {R"("a")", R"("abcd")"}},
      {R"({"type":"string","pattern":"^[a-z]+-[0-9]$"})", {R"("ab-1")"}, {R"("ab1")", "ab-1"}},
      {R"({"type":"string","format":"date"})", {R"("2024-02-29")"}, {R"("2024-13-01")", R"("24-01-01")"}},
      {R"({"type":"string","format":"time"})", {R"("23:59:59")", R"("12:00:00Z")"}, {R"("24:00:00")"}},
      {R"({"format":"date-time"})", {R"("2024-01-02T03:04:05.6+01:00")"}, {R"("2024-01-02 03:04:05")"}},
      {R"({"type":"string","format":"uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"}, {R"("123e4567")"}},
      {R"({"type":"string","format":"email"})", {R"("a.b+c@mail.example.org")"}, {R"("a@b")", R"("@b.org")"}},
      {R"({"type":"string","format":"hostname"})", {R"("example.org")", R"("localhost")"}, {R"("-a.org")"}},
      {R"({"type":"string","format":"ipv4"})", {R"("192.168.0.255")"}, {R"("256.1.1.1")", R"("1.2.3")"}},
      {R"({"type":"string","format":"duration"})", {R"("P3DT4H")", R"("PT0.5S")"}, {R"("3 days")"}},
      // Another format is an annotation (JSON Schema's default): any string.
      {R"({"type":"string","format":"ipv6"})", {R"("::1")", R"("not an address")"}, {"1"}},
      {R"({"enum":["a",1,null,[true],{"k":"v"}]})", {R"("a")", "1", "null", "[true]", R"({"k":"v"})"}, {"2", R"("b")"}},
      {R"({"const":"x.y"})", {R"("x.y")"}, {R"("xzy")"}},
      {R"({"type":["string","null"]})", {"null", R"("s")"}, {"1"}},
      {R"({"anyOf":[{"type":"integer"},{"type":"boolean"}]})", {"1", "true"}, {"null"}},
      {R"({"oneOf":[{"const":1},{"const":2}]})", {"1", "2"}, {"3"}},
      {R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":2})", {"[1]", "[1, 2]", "[ 1,2 ]"},
       {"[]", "[1,2,3]", "[1,]", "[\"a\"]"}},
      {R"({"type":"array","items":{"type":"null"}})", {"[]", "[null,null,null]"}, {"[null"}},
      {R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"boolean"}},"required":["a","b"]})",
       {R"({"a":1,"b":true})", R"({ "a": 1, "b": false })"},
       {R"({"b":true,"a":1})", R"({"a":1})", R"({"a":1,"b":true,"c":1})"}},
      // Optional properties may be left out, in order, commas only between those written.
      {R"({"properties":{"a":{"const":1},"b":{"const":2},"c":{"const":3}},"required":["b"]})",
       {R"({"b":2})", R"({"a":1,"b":2})", R"({"b":2,"c":3})", R"({"a":1,"b":2,"c":3})"},
       {"{}", R"({"a":1})", R"({,"b":2})", R"({"b":2,})", R"({"a":1"b":2})", R"({"c":3,"b":2})"}},
      {R"({"properties":{"a":{"const":1},"b":{"const":2}}})", {"{}", R"({"a":1})", R"({"b":2})", R"({"a":1,"b":2})"},
       {R"({"b":2,"a":1})", R"({,})"}},
      {R"({"$defs":{"p":{"type":"integer"}},"properties":{"x":{"$ref":"#/$defs/p"}},"required":["x"]})",
       {R"({"x":5})"}, {R"({"x":"5"})"}},
      {R"({"definitions":{"p":{"type":"null"}},"type":"array","items":{"$ref":"#/definitions/p"}})", {"[null]"},
       {"[1]"}},
      {R"({"title":"T","description":"d","examples":[1],"default":1,"$schema":"x","type":"integer"})", {"7"}, {"x"}},
      {R"({"allOf":[{"type":"boolean"}]})", {"true"}, {"1"}},
      {"true", {"1", R"({"a":[1,{"b":null}]})", R"("s")"}, {"{", "[1,]"}},
      {"{}", {"null", "[[[1]]]", "[[[[[[[[1]]]]]]]]", R"({"a":[{"b":{}}]})"}, {"[[[[1]]]", "[1,]", "{1:2}"}},
      {R"({"type":"object"})", {"{}", R"({"a": {"b": [1]}})", R"({"a":{"b":{"c":[1]}}})"}, {"[]", R"({"a":{"b":})"}},
      {R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"next":{"anyOf":[
          {"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"]}},"$ref":"#/$defs/node"})",
       {R"({"v":1,"next":null})", R"({"v":1,"next":{"v":2,"next":{"v":3,"next":{"v":4,"next":null}}}})"},
       {R"({"v":1,"next":{"v":2}})", R"({"v":1})", "null"}},  // a recursive $ref: a linked list of any length
      {R"({"type":"object","properties":{"name":{"type":"string"},"children":{"type":"array","items":{"$ref":"#"}}},
          "required":["name"]})",
       {R"({"name":"a"})", R"({"name":"a","children":[{"name":"b","children":[{"name":"c","children":[]}]}]})"},
       {R"({"name":"a","children":[{}]})", R"({"children":[]})"}},  // "#": the root itself, a tree
  };
  // `required` names without a schema in `properties`: present, any value, after the declared ones.
  check_language(compile_guided_json(R"({"properties":{"a":{"type":"integer"}},"required":["b"]})"),
                 {R"({"b":1})", R"({"a":2,"b":"x"})", R"({"a":2,"b":{"c":[null]}})"},
                 {"{}", R"({"a":2})", R"({"b":1,"a":2})"});
  check_language(compile_guided_json(R"({"type":"object","required":["id","id"]})"), {R"({"id":true})"},
                 {"{}", R"({"x":1})"});
  for (const row& r : table) {
    const std::string schema = r.schema;
    CAPTURE(schema);
    check_language(compile_guided_json(schema), r.yes, r.no);
  }
}

TEST_CASE("json schema compiler: minimum, maximum, exclusiveMinimum and exclusiveMaximum") {
  struct row {
    const char* schema;
    std::vector<std::string> yes, no;
  };
  const std::vector<row> table = {
      {R"({"type":"integer","minimum":1,"maximum":10})", {"1", "5", "10"}, {"0", "11", "-1", "100", "01", "5.0"}},
      {R"({"type":"integer","minimum":-5})", {"-5", "-1", "0", "7", "123456789012"}, {"-6", "-10", "-0"}},
      {R"({"type":"integer","exclusiveMinimum":0})", {"1", "99"}, {"0", "-1"}},
      {R"({"type":"integer","maximum":-10})", {"-10", "-11", "-99999"}, {"-9", "0", "10"}},
      {R"({"type":"integer","minimum":1.5,"exclusiveMaximum":4})", {"2", "3"}, {"1", "4"}},
      {R"({"type":"integer","minimum":99,"maximum":1001})", {"99", "100", "999", "1000", "1001"}, {"98", "1002"}},
      {R"({"type":"number","minimum":0,"maximum":1})", {"0", "0.5", "1", "1.0", "0.999"},
       {"-0.1", "1.01", "2", "1e-1"}},
      {R"({"type":"number","exclusiveMinimum":0})", {"0.001", "3", "12.5"}, {"0", "0.0", "-1", "-0.5"}},
      {R"({"type":"number","minimum":-1.25,"exclusiveMaximum":2.5})", {"-1.25", "-1.2", "-0.3", "0", "2.49"},
       {"-1.26", "-2", "2.5", "2.50", "3"}},
      {R"({"type":"number","minimum":0.1,"maximum":0.25})", {"0.1", "0.15", "0.25", "0.2499"}, {"0.09", "0.251", "0"}},
      {R"({"type":"number","minimum":5,"exclusiveMinimum":true})", {"5.01", "6"}, {"5", "4.99"}},  // draft 4
      {R"({"minimum":0,"exclusiveMaximum":10})", {"0", "9.5"}, {"10", "null", "\"a\""}},  // untyped: a number
      {R"({"type":["integer","null"],"maximum":3})", {"3", "null", "-4"}, {"4"}},
      {R"({"type":"number","minimum":1,"exclusiveMinimum":1})", {"1.5"}, {"1"}},  // the tighter bound
      // 18 digits each side of the point (the limits), still a small DFA; integers in the schema are exact.
      {R"({"type":"number","minimum":-123456789012345678,"maximum":0.000000000000000001})",
       {"-123456789012345678", "0.000000000000000001", "-7.25", "0"}, {"-123456789012345679", "0.00000000000000001"}},
  };
  for (const row& r : table) {
    const std::string schema = r.schema;
    CAPTURE(schema);
    check_language(compile_guided_json(schema), r.yes, r.no);
  }
}

namespace {

// A value counted in thousandths, written with `digits` fraction digits (0..3, padded): the random range and
// multipleOf tests compare values as integers, independent of the compilers' digit-by-digit work.
std::string spell_thousandths(long long thousandths, int digits) {
  const bool neg = thousandths < 0;
  const long long m = neg ? -thousandths : thousandths;
  std::string out = (neg ? "-" : "") + std::to_string(m / 1000);
  if (digits > 0) out += "." + std::to_string(1000 + m % 1000).substr(1, static_cast<std::size_t>(digits));
  return out;
}

// Random bounds of a schema, in thousandths: what they admit, and the keywords that say it.
struct thousandths_bounds {
  bool integer = false, has_lo = false, has_hi = false, lo_ex = false, hi_ex = false;
  long long lo = 0, hi = 0;
  bool admits(long long t) const {
    if (integer && t % 1000 != 0) return false;
    if (has_lo && (lo_ex ? t <= lo : t < lo)) return false;
    return !(has_hi && (hi_ex ? t >= hi : t > hi));
  }
  void put(nlohmann::json& schema) const {
    auto as_json = [](long long t) { return nlohmann::json::parse(spell_thousandths(t, t % 1000 == 0 ? 0 : 3)); };
    if (has_lo) schema[lo_ex ? "exclusiveMinimum" : "minimum"] = as_json(lo);
    if (has_hi) schema[hi_ex ? "exclusiveMaximum" : "maximum"] = as_json(hi);
  }
};

}  // namespace

TEST_CASE("json schema compiler: random ranges against exact arithmetic") {
  // Bounds and candidates with at most 3 fraction digits, compared as integers of thousandths (independent of the
  // compiler's digit-by-digit comparison). A bounded number's spellings: no exponent, no sign on zero.
  std::mt19937 rng(1234);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const auto spell = spell_thousandths;
  auto random_value = [&](bool integer) {
    const long long whole = pick(0, 3) == 0 ? pick(-2000, 2000) : pick(-30, 30);
    return whole * 1000 + (integer ? 0 : pick(0, 3) == 0 ? 0 : pick(-999, 999));
  };
  int checked = 0;
  for (int round = 0; round < 120; ++round) {
    const bool integer = round % 3 == 0;
    const bool has_lo = pick(0, 4) != 0, has_hi = pick(0, 4) != 0;
    const long long lo = random_value(pick(0, 1) == 0), hi = lo + (pick(0, 1) ? random_value(false) : pick(0, 3000));
    const bool lo_ex = pick(0, 1) == 1, hi_ex = pick(0, 1) == 1;
    nlohmann::json s = {{"type", integer ? "integer" : "number"}};
    const thousandths_bounds bounds{integer, has_lo, has_hi, lo_ex, hi_ex, lo, hi};
    bounds.put(s);
    auto inside = [&](long long t) { return bounds.admits(t); };
    const std::string schema = s.dump();
    CAPTURE(schema);
    std::optional<guided_machine> g;
    try {
      g.emplace(compile_guided_json(schema));
    } catch (const error& e) {
      // Only an empty range is refused.
      bool any = false;
      for (long long t = (has_lo ? lo : hi) - 3000; t <= (has_lo ? lo : hi) + 3000 && !any; ++t) any = inside(t);
      CHECK_MESSAGE(!any, e.what());
      continue;
    }
    std::vector<long long> probes = {0, lo, hi, lo - 1, lo + 1, hi - 1, hi + 1, lo - 1000, hi + 1000};
    for (int i = 0; i < 60; ++i) probes.push_back(random_value(pick(0, 1) == 0));
    for (int i = 0; i < 30; ++i) probes.push_back(lo + pick(-1500, 1500));
    for (const long long t : probes) {
      for (int digits = 0; digits <= 4; ++digits) {
        const long long cut = digits == 0 ? 1000 : digits == 1 ? 100 : digits == 2 ? 10 : 1;
        if (t % cut != 0) continue;  // fewer digits would spell another value
        const std::string text = digits == 4 ? spell(t, 3) + "0" : spell(t, digits);
        const bool ok = inside(t) && !(integer && digits > 0) && !(t == 0 && text[0] == '-');
        CAPTURE(text);
        CHECK(g->matches(text) == ok);
        ++checked;
      }
    }
    if (has_lo || has_hi) CHECK((!g->matches("-0") && !g->matches("1e1")));
  }
  MESSAGE(checked, " number spellings checked against exact arithmetic");
}

TEST_CASE("json schema compiler: multipleOf, integer and decimal, with and without bounds") {
  struct row {
    const char* schema;
    std::vector<std::string> yes, no;
  };
  const std::vector<row> table = {
      {R"({"type":"integer","multipleOf":3})", {"0", "3", "-3", "99", "123456789012", "-0"},
       {"1", "-4", "100", "3.0", "3e0", "03"}},
      {R"({"type":"integer","multipleOf":7,"minimum":10,"maximum":50})", {"14", "21", "49"},
       {"7", "56", "15", "0", "-14"}},
      {R"({"type":"integer","multipleOf":5,"exclusiveMinimum":-20,"exclusiveMaximum":20})", {"-15", "0", "15"},
       {"-20", "20", "12", "-0"}},
      // Divisors with many factors 2 and 5 keep a small automaton (the remainder's class, not the remainder).
      {R"({"type":"integer","multipleOf":1000000})", {"0", "3000000", "-1000000", "123000000000"},
       {"100000", "1000001", "1000000.0", "1e6"}},
      {R"({"type":"integer","multipleOf":1024,"minimum":-5000,"maximum":5000})", {"-4096", "0", "1024", "4096"},
       {"512", "5120", "-5120", "2000"}},
      // 18 significant digits (the limit), within bounds that leave one multiple.
      {R"({"type":"integer","multipleOf":999999999999999999,"minimum":0,"maximum":1000})", {"0"}, {"1", "999"}},
      // A decimal divisor of an integer: every integer is a multiple of 0.5; those of 2.5 are the multiples of 5.
      {R"({"type":"integer","multipleOf":0.5})", {"0", "1", "-7", "12345"}, {"1.5", "0.5", "1.0"}},
      {R"({"type":"integer","multipleOf":2.5})", {"0", "5", "-10", "25", "1000"}, {"2", "3", "7", "12", "2.5"}},
      // Numbers: the digits past the divisor's are zeros; the value counts, not the spelling.
      {R"({"type":"number","multipleOf":0.01})", {"0", "1", "1.5", "1.25", "-3.14", "2.50", "2.500", "0.00"},
       {"1.255", "0.001", "1e2", "1.2500001", "-0.005"}},
      {R"({"type":"number","multipleOf":0.5})", {"0", "1.5", "-2", "3.50", "100.0"}, {"1.25", "0.1", "-0.3"}},
      {R"({"type":"number","multipleOf":3})", {"0", "9", "-12", "9.0", "9.000"}, {"9.5", "9.01", "10", "9e0"}},
      {R"({"type":"number","multipleOf":2.5,"minimum":0,"maximum":10})", {"0", "2.5", "5", "7.50", "10", "10.0"},
       {"-2.5", "12.5", "3", "2.25", "10.5"}},
      {R"({"type":"number","multipleOf":0.3,"exclusiveMinimum":0.3,"maximum":1.2})", {"0.6", "0.9", "1.2", "1.20"},
       {"0.3", "1.5", "0.5", "0", "0.60001"}},
      {R"({"type":"number","multipleOf":1e-18})", {"0.000000000000000001", "1", "-0.5"},
       {"0.0000000000000000001", "1e-18"}},
      {R"({"multipleOf":4})", {"8", "8.0", "-4"}, {"6", "null", "\"8\""}},  // untyped: a number
      {R"({"type":["integer","null"],"multipleOf":6})", {"null", "12", "-6"}, {"8", "12.0"}},
      {R"({"type":["integer","number"],"multipleOf":6})", {"12", "12.0"}, {"8", "12.5"}},
      {R"({"type":"array","items":{"type":"integer","multipleOf":4},"maxItems":3})", {"[]", "[4, 8,-12]", "[0]"},
       {"[4,6]", "[1]"}},
      {R"({"$defs":{"even":{"type":"integer","multipleOf":2}},"properties":{"a":{"$ref":"#/$defs/even"},
          "b":{"$ref":"#/$defs/even"},"c":{"type":"integer","multipleOf":2}},"required":["a","b","c"]})",
       {R"({"a":2,"b":-4,"c":0})"}, {R"({"a":2,"b":3,"c":0})", R"({"a":1,"b":2,"c":0})", R"({"a":2,"b":2,"c":1})"}},
  };
  for (const row& r : table) {
    const std::string schema = r.schema;
    CAPTURE(schema);
    check_language(compile_guided_json(schema), r.yes, r.no);
  }
  // (?%N) is the schema compiler's own syntax: in a regex or a schema's pattern it is an unsupported group.
  CHECK(contains(error_of([] { (void)compile_guided_regex("(?%0)"); }), "guided_regex: inline flags"));
  CHECK(contains(error_of([] { (void)compile_guided_json(R"j({"type":"string","pattern":"(?%0)"})j"); }),
                 "'pattern' at / (the root): inline flags"));
  // The regex text refers to the multipleOf constraints, each once.
  const json_schema_compiled c = json_schema_regex(
      R"({"type":"array","items":{"anyOf":[{"type":"integer","multipleOf":3},{"type":"integer","multipleOf":3},
          {"type":"number","multipleOf":0.25,"maximum":2}]}})");
  REQUIRE(c.multiples.size() == 2);
  CHECK(c.regex.find("(?%0)") != std::string::npos);
  CHECK(c.regex.find("(?%1)") != std::string::npos);
  CHECK(c.multiples[1].divisor.p == 25);
  CHECK(c.multiples[1].divisor.q == 2);
  CHECK(c.multiples[1].place == "/items/anyOf/2");
}

TEST_CASE("json schema compiler: random multipleOf against exact arithmetic") {
  // Integers: a divisor k in [1, 60] (sometimes k / 10, a decimal one), random bounds; every integer in a window
  // checked. Numbers: a divisor p / 10^q (p in [1, 60], q in [0, 3]), random bounds; spellings of a sample of
  // values with up to 4 fraction digits checked, all values counted in thousandths.
  std::mt19937 rng(2468);
  auto pick = [&](long long lo, long long hi) { return std::uniform_int_distribution<long long>(lo, hi)(rng); };
  const auto spell = spell_thousandths;
  int checked = 0, refused = 0;
  for (int round = 0; round < 160; ++round) {
    const bool integer = round % 2 == 0;
    const bool has_lo = pick(0, 3) != 0, has_hi = pick(0, 3) != 0;
    const bool lo_ex = pick(0, 1) == 1, hi_ex = pick(0, 1) == 1;
    // Divisor p / 10^q; in thousandths, value t is a multiple iff t * 10^q is divisible by p * 1000.
    const long long p = pick(1, 60);
    const int q = integer ? (pick(0, 3) == 0 ? 1 : 0) : static_cast<int>(pick(0, 3));
    long long lo = 0, hi = 0;  // thousandths
    nlohmann::json s = {{"type", integer ? "integer" : "number"}};
    const long long unit = q == 1 ? 100 : q == 2 ? 10 : 1;  // thousandths per last digit of p / 10^q
    s["multipleOf"] = nlohmann::json::parse(q == 0 ? std::to_string(p) : spell(p * unit, q));
    if (integer) {
      lo = pick(-700, 700) * 1000;
      hi = lo + pick(0, 900) * 1000;
    } else {
      lo = pick(-30000, 30000);
      hi = lo + pick(0, 40000);
    }
    const thousandths_bounds bounds{integer, has_lo, has_hi, lo_ex, hi_ex, lo, hi};
    bounds.put(s);
    long long ten_q = 1;
    for (int i = 0; i < q; ++i) ten_q *= 10;
    auto multiple = [&](long long t) { return (t * ten_q) % (p * 1000) == 0; };
    auto inside = [&](long long t) { return bounds.admits(t) && multiple(t); };
    const std::string schema = s.dump();
    CAPTURE(schema);
    std::optional<guided_machine> g;
    try {
      g.emplace(compile_guided_json(schema));
    } catch (const error& e) {
      // Only bounds that hold no multiple are refused.
      bool any = false;
      for (long long t = lo - 1000; t <= hi + 1000 && !any; ++t) any = inside(t);
      CHECK_MESSAGE(!any, e.what());
      CHECK(contains(e.what(), "is a multiple of 'multipleOf'"));
      ++refused;
      continue;
    }
    if (integer) {
      for (long long x = -1000; x <= 1000; ++x) {
        const std::string text = std::to_string(x);
        CAPTURE(text);
        CHECK(g->matches(text) == inside(x * 1000));
        ++checked;
      }
      CHECK(!g->matches("0.0"));
      continue;
    }
    std::vector<long long> probes = {0, lo, hi, lo - 1, hi + 1, lo + p, hi - p};
    for (int i = 0; i < 150; ++i) probes.push_back(pick(lo - 2000, hi + 2000));
    for (int i = 0; i < 50; ++i) probes.push_back(pick(-40, 40) * p * 1000 / ten_q);  // multiples, mostly
    for (const long long t : probes) {
      for (int digits = 0; digits <= 4; ++digits) {
        const long long cut = digits == 0 ? 1000 : digits == 1 ? 100 : digits == 2 ? 10 : 1;
        if (t % cut != 0) continue;  // fewer digits would spell another value
        const std::string text = digits == 4 ? spell(t, 3) + "0" : spell(t, digits);
        if (t == 0 && text[0] == '-') continue;
        CAPTURE(text);
        CHECK(g->matches(text) == inside(t));
        ++checked;
      }
      // A non-zero digit past the third after the point: never a multiple of a divisor with at most 3.
      const std::string past = spell(t, 3) + "5";
      CAPTURE(past);
      CHECK(!g->matches(past));
      ++checked;
    }
  }
  CHECK(refused < 40);
  MESSAGE(checked, " spellings checked against exact arithmetic; ", refused, " schemas without a multiple refused");
}

TEST_CASE("json schema compiler: the whitespace pattern; the regex it makes") {
  const std::string schema = R"({"type":"object","properties":{"a":{"type":"array","items":{"const":1}}}})";
  CHECK(compile_guided_json(schema).matches(R"({ "a": [ 1, 1 ] })"));
  CHECK(!compile_guided_json(schema).matches("{\n\"a\":[1]}"));
  CHECK(!compile_guided_json(schema, "").matches(R"({"a": [1]})"));
  CHECK(compile_guided_json(schema, "").matches(R"({"a":[1,1]})"));
  CHECK(compile_guided_json(schema, "[ \\n]*").matches("{\n  \"a\": [\n    1\n  ]\n}"));
  CHECK(contains(error_of([&] { (void)compile_guided_json(schema, "(a"); }), "whitespace_pattern"));
  CHECK(contains(error_of([&] { (void)compile_guided_json(schema, "^ ?"); }), "whitespace_pattern: anchor"));
  // The regex is in guided.hpp's subset, and the properties come in declared order (not sorted by name).
  const std::string re =
      json_schema_regex(R"({"properties":{"z":{"type":"null"},"a":{"type":"null"}},"required":["z","a"]})").regex;
  CHECK(re.find("\"z\"") < re.find("\"a\""));
  CHECK(compile_guided_regex(re).matches(R"({"z":null,"a":null})"));
  // json_object's schema: any object at any depth, a pushdown grammar of two small rules.
  const guided_machine object = compile_guided_json(R"({"type":"object"})");
  CHECK(object.is_pushdown());
  CHECK(object.size() < 200);
  // Unrolled (for a plain DFA, as structural tags embed schemas), it fits the DFA cap with room to spare.
  CHECK(compile_guided_regex(json_schema_regex(R"({"type":"object"})").regex).size() < 1000);
}

TEST_CASE("json schema guide: random walks over a vocabulary parse as JSON and satisfy the schema") {
  const std::vector<std::string> schemas = {
      R"({"type":"object","properties":{"id":{"type":"integer"},"name":{"type":"string","minLength":1,"maxLength":6},
          "tags":{"type":"array","items":{"enum":["a","b",1,null]},"minItems":1,"maxItems":3},
          "ok":{"type":["boolean","null"]},"score":{"type":"number"},"kind":{"const":"x"},
          "at":{"$ref":"#/$defs/point"}},
          "required":["name","tags"],
          "$defs":{"point":{"type":"object","properties":{"x":{"type":"number"},
                   "y":{"anyOf":[{"type":"integer"},{"type":"string","maxLength":2}]}},"required":["x"]}}})",
      R"({"type":"array","items":{"type":"object"},"maxItems":2})",
      "{}",
      R"({"type":"object","properties":{"n":{"type":"integer","multipleOf":7,"minimum":-999999999999999,
          "maximum":999999999999999},"m":{"type":"integer","minimum":-50,"maximum":500,"multipleOf":12}},
          "required":["n","m"]})",
  };
  std::mt19937 rng(7);
  for (const std::string& schema : schemas) {
    CAPTURE(schema);
    const guide g(compile_guided_json(schema), json_vocab());
    const completion_cost cost(g);
    const nlohmann::json s = nlohmann::json::parse(schema);
    std::set<std::string> seen;
    for (int walk = 0; walk < 40; ++walk) {
      const std::string text = random_walk(g, cost, rng, 40);
      CAPTURE(text);
      nlohmann::json v;
      REQUIRE_NOTHROW(v = nlohmann::json::parse(text));
      CHECK(conforms(v, s, s));
      seen.insert(text);
    }
    CHECK(seen.size() > 10);  // the walks differ: the checks saw varied values
  }
}

namespace {

// json_vocab's tokens and some that cross the end of a rule (a closing bracket and what follows it).
std::shared_ptr<const guide_vocabulary> crossing_vocab() {
  static const auto v = [] {
    std::vector<std::string> bytes;
    for (token_id t = 0; t < json_vocab()->size(); ++t) bytes.push_back(json_vocab()->bytes_of(t));
    for (const char* t : {"\"}", "}]", "]}", "\"},", "}}", "))", ")+", "((", "\"]", "\":[", "},{", "x)", "1)", "]]]",
                          "a,", "a)", ")]", "1,", "null}", "y\"", "xx", "xy", "zy", "\":{\"", "1}],", "[["})
      bytes.emplace_back(t);
    return std::make_shared<const guide_vocabulary>(std::move(bytes));
  }();
  return v;
}

}  // namespace

TEST_CASE("pushdown guide: the allowed tokens are brute force's at every step of random walks; EOS at matches") {
  const std::vector<std::string> grammars = {
      R"g(root ::= "(" root ")" | "x")g",
      R"g(root ::= expr
expr ::= term (("+" | "-") term)*
term ::= [0-9]+ | "(" expr ")")g",
      R"g(root ::= s
s ::= "x" s "y" | "x" s | "z")g",  // ambiguous: "xxzy" has two parses (several stacks at once)
      R"g(root ::= "[" items "]"
items ::= (item ("," item)*)?
item ::= "(" items ")" | "a" | "[" items "]")g",  // a nullable rule between calls
      R"g(root ::= val
val ::= obj | arr | """ [a-z]* """ | [0-9]+ | "null"
obj ::= "{" (str ":" val ("," str ":" val)*)? "}"
arr ::= "[" (val ("," val)*)? "]"
str ::= """ [a-z]* """)g",
  };
  const std::vector<std::string> schemas = {
      "{}",
      R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"next":{"anyOf":[
          {"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"]}},"$ref":"#/$defs/node"})",
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":3},"kids":{"type":"array",
          "items":{"$ref":"#"},"maxItems":2}},"required":["name"]})",
  };
  std::vector<guided_machine> machines;
  for (const std::string& g : grammars) machines.push_back(compile_guided_grammar(g));
  for (const std::string& s : schemas) machines.push_back(compile_guided_json(s));
  const auto v = crossing_vocab();
  std::mt19937 rng(11);
  std::size_t checked = 0;
  for (std::size_t m = 0; m < machines.size(); ++m) {
    CAPTURE(m);
    REQUIRE(machines[m].is_pushdown());
    const guide g(machines[m], v);
    const completion_cost cost(g);
    const byte_pda& pda = g.pda();
    for (int walk = 0; walk < 12; ++walk) {
      std::vector<token_id> tokens;
      std::string text;
      for (int step = 0; step < 40; ++step) {
        CAPTURE(text);
        const auto here = pushdown_after(pda, text);
        REQUIRE(!here.empty());
        const auto plain = zipage_test::reference_after(pda, text);  // every stack apart: the same parse
        if (plain.exact) CHECK(here.bottom_returned == plain.bottom_returned);
        const guide_lookahead ahead = g.lookahead(tokens);
        CHECK(ahead.alive);
        CHECK(ahead.at_match == here.bottom_returned);
        std::vector<token_id> brute;
        for (token_id t = 0; t < v->size(); ++t) {
          const std::string& b = v->bytes_of(t);
          if (b.empty()) continue;
          auto c = here;
          for (const char ch : b) {
            if (c.heads.empty()) {
              c = {};
              break;
            }
            c = pushdown_detail::step(pda, c, static_cast<unsigned char>(ch));
          }
          if (!c.empty()) brute.push_back(t);
        }
        const std::vector<token_id> allowed = g.allowed_after(tokens);
        CHECK(allowed == brute);
        ++checked;
        if (step % 7 == 3) {  // a guide that has kept nothing agrees (the whole text read at once)
          const guide fresh(machines[m], v);
          CHECK(fresh.allowed_after(tokens) == brute);
        }
        if (allowed.empty()) break;
        token_id pick = allowed[rng() % allowed.size()];
        if (step >= 25)  // then towards a match
          pick = *std::min_element(allowed.begin(), allowed.end(), [&](token_id a, token_id b) {
            return cost(text + v->bytes_of(a)) < cost(text + v->bytes_of(b));
          });
        tokens.push_back(pick);
        text += v->bytes_of(pick);
      }
    }
  }
  MESSAGE(checked, " steps checked against brute force");
  // A token that leaves the language: nothing allowed after it, not alive.
  const guide parens(compile_guided_grammar(R"g(root ::= "(" root ")" | "x")g"), v);
  const token_id close = 10;  // ')'
  REQUIRE(v->bytes_of(close) == ")");
  CHECK(!parens.lookahead(std::vector<token_id>{close}).alive);
  CHECK(parens.allowed_after(std::vector<token_id>{close}).empty());
  CHECK(parens.lookahead(std::vector<token_id>{}).alive);
  CHECK(parens.memo_bytes() > 0);
}

namespace {

// The stacks a pushdown guide's heads hold, each bottom first, read off the graph (false past `limit` of them).
bool stacks_of(const pushdown_detail::config& c, std::set<std::vector<pushdown_detail::frame>>& out,
               std::size_t limit) {
  std::vector<pushdown_detail::frame> above;  // top first
  const auto down = [&](const auto& self, const pushdown_detail::gss_node& n) -> bool {
    if (n.bottom()) {
      out.emplace(above.rbegin(), above.rend());
      return out.size() <= limit;
    }
    above.push_back(n.resume);
    for (const auto& b : n.below)
      if (!self(self, *b)) return false;
    above.pop_back();
    return true;
  };
  for (const auto& h : c.heads) {
    above.assign(1, h.top);
    if (!down(down, *h.node)) return false;
  }
  return true;
}

const std::vector<std::string>& ambiguous_grammars() {
  static const std::vector<std::string> g = {
      R"g(root ::= "(" root "(" root ")" | "(" root ")" root | "")g",
      R"g(root ::= s
s ::= "[" s "]" s | "[" s s "]" | "a" | "")g",
      R"g(root ::= x x x
x ::= "a" x | "a" | "ab" x | "b" | "a" x x)g",
      R"g(root ::= "x" root "1" | "x" v "2" | n
v ::= root n root
n ::= "y" n | "")g",  // a nullable rule called from two places: a node returned from gets a caller later
      R"g(root ::= s "b" s "c" s | s s "d"
s ::= "a" s | "" | "a" s s)g",
      R"g(root ::= s
s ::= "x" s "y" | "x" s | "z")g",
      R"g(root ::= e
e ::= t | t "+" e | e2
e2 ::= t "+" e2 | t
t ::= "1" | "(" e ")")g",
  };
  return g;
}

}  // namespace

TEST_CASE("pushdown guide: the graph-structured stack holds exactly the stacks kept apart, byte by byte") {
  std::mt19937 rng(20261207);
  const std::string alphabet = "()[]abcdxyz12+";
  std::size_t compared = 0, past_reference = 0;
  for (const std::string& src : ambiguous_grammars()) {
    CAPTURE(src);
    const guided_machine m = compile_guided_grammar(src);
    REQUIRE(m.is_pushdown());
    const byte_pda& pda = m.pda();
    for (int walk = 0; walk < 25; ++walk) {
      std::string text;
      auto here = pushdown_after(pda, text);
      auto plain = zipage_test::reference_after(pda, text);
      for (int step = 0; step < 48; ++step) {
        CAPTURE(text);
        REQUIRE(here.empty() == plain.empty());
        if (!plain.exact) {
          ++past_reference;
          break;
        }
        CHECK(here.bottom_returned == plain.bottom_returned);
        std::set<std::vector<pushdown_detail::frame>> held;
        REQUIRE(stacks_of(here, held, 1 << 16));
        const std::set<std::vector<pushdown_detail::frame>> want(plain.stacks.begin(), plain.stacks.end());
        CHECK(held == want);
        ++compared;
        // Next: a random byte of the alphabet that keeps the text alive, if one does.
        std::string order = alphabet;
        std::shuffle(order.begin(), order.end(), rng);
        bool moved = false;
        for (const char ch : order) {
          auto next = pushdown_detail::step(pda, here, static_cast<unsigned char>(ch));
          auto next_plain = zipage_test::reference_step(pda, plain, static_cast<unsigned char>(ch));
          CHECK(next.empty() == next_plain.empty());
          if (next.empty()) continue;
          here = std::move(next);
          plain = std::move(next_plain);
          text += ch;
          moved = true;
          break;
        }
        if (!moved) break;
      }
    }
  }
  MESSAGE(compared, " texts compared; ", past_reference, " walks left where the plain stacks passed their bound");
  CHECK(compared > 3000);
}

TEST_CASE("pushdown guide: a highly ambiguous grammar is followed exactly far past thousands of parses") {
  // "(" root "(" root ")" | "(" root ")" root | "": the ways to parse a prefix grow exponentially with its length;
  // kept apart they passed any fixed bound (4,096 stacks, the old guide's) within ~20 bytes, and text beyond was
  // not generated. The graph holds them all in polynomial space.
  const guided_machine m = compile_guided_grammar(ambiguous_grammars()[0]);
  const auto v = crossing_vocab();
  const guide g(m, v);
  std::mt19937 rng(5);
  // A derivation of 600 bytes, built from the grammar's own alternatives (a random tree).
  std::string text;
  const auto derive = [&](const auto& self, int budget) -> void {
    if (budget <= 0) return;
    if (rng() % 2 == 0) {
      text += "(";
      self(self, budget / 2 - 1);
      text += "(";
      self(self, budget / 2 - 1);
      text += ")";
    } else {
      text += "(";
      self(self, budget / 2 - 1);
      text += ")";
      self(self, budget / 2 - 1);
    }
  };
  while (text.size() < 600) derive(derive, 600 - static_cast<int>(text.size()));
  CAPTURE(text);
  CHECK(m.matches(text));
  CHECK(!m.prefix(")" + text));
  CHECK(!m.matches(text + "x"));
  CHECK(zipage_test::reference_after(m.pda(), text.substr(0, 60)).exact == false);  // the old way gave up here
  // Token by token through the guide: each next byte allowed, at a match at the end, and a prefix cut after any
  // unmatched "(" is no match.
  std::vector<token_id> tokens;
  token_id open_id = -1, close_id = -1;
  for (token_id t = 0; t < v->size(); ++t) {
    if (v->bytes_of(t) == "(") open_id = t;
    if (v->bytes_of(t) == ")") close_id = t;
  }
  REQUIRE(open_id >= 0);
  REQUIRE(close_id >= 0);
  for (const char ch : text) {
    const guide_lookahead ahead = g.lookahead(tokens);
    REQUIRE(ahead.alive);
    const token_id want = ch == '(' ? open_id : close_id;
    REQUIRE(ahead.next->allows(want));
    tokens.push_back(want);
  }
  CHECK(g.lookahead(tokens).at_match);
  CHECK(g.lookahead(std::vector<token_id>(tokens.begin(), tokens.end() - 1)).alive);
}

TEST_CASE("json schema compiler: unsupported keywords and bad schemas are errors naming guided_json and the place") {
  const std::vector<std::pair<const char*, std::vector<const char*>>> table = {
      {R"({"type":"object","patternProperties":{"a":{}}})", {"'patternProperties' at / (the root)"}},
      {R"({"properties":{"x":{"not":{"type":"null"}}}})", {"'not' at /properties/x"}},
      {R"({"properties":{"a/b~":{"not":{}}}})", {"'not' at /properties/a~1b~0"}},
      {R"({"type":"array","items":{"if":{},"then":{}}})", {"'if' at /items"}},
      {R"({"properties":{"a":{"type":"object","additionalProperties":{"type":"integer"}}}})",
       {"'additionalProperties' as a schema at /properties/a"}},
      {R"({"anyOf":[{"type":"null"},{"dependentSchemas":{}}]})", {"'dependentSchemas' at /anyOf/1"}},
      {R"({"type":"array","uniqueItems":true})", {"'uniqueItems'"}},
      {R"({"properties":{"a":{"$ref":"#/$defs/missing"}}})", {"names nothing", "/properties/a"}},
      {R"({"$ref":"other.json#/a"})", {"'$ref' \"other.json#/a\""}},
      {R"({"properties":{"id":{"type":"string","pattern":"^(?!x)[a-z]+$"}}})",
       {"'pattern' at /properties/id: lookaround", "(?!x)[a-z]+"}},
      {R"({"type":"string","pattern":"a|^b"})", {"'pattern' at / (the root): anchor"}},
      {R"({"type":"integr"})", {"'type' \"integr\""}},
      {R"({"type":"array","minItems":3,"maxItems":2})", {"'minItems' (3) is above 'maxItems' (2)"}},
      {R"({"type":"string","maxLength":-1})", {"'maxLength' at / (the root) must be an integer"}},
      {R"({"type":"integer","minimum":3,"maximum":2})", {"at / (the root) holds no integer"}},
      {R"({"properties":{"a":{"type":"integer","minimum":1.5,"maximum":1.9}}})", {"/properties/a holds no integer"}},
      {R"({"type":"number","exclusiveMinimum":1,"maximum":1})", {"holds no number"}},
      {R"({"type":"number","minimum":"1"})", {"'minimum' at / (the root) must be a number"}},
      {R"({"type":"number","maximum":1e300})", {"'maximum'", "at most 18 digits"}},
      {R"({"type":"integer","multipleOf":0})", {"'multipleOf' at / (the root) must be above 0, got 0"}},
      {R"({"properties":{"a":{"type":"number","multipleOf":-2.5}}})",
       {"'multipleOf' at /properties/a must be above 0"}},
      {R"({"type":"number","multipleOf":"2"})", {"'multipleOf' at / (the root) must be a number, got \"2\""}},
      {R"({"multipleOf":true})", {"'multipleOf' at / (the root) must be a number"}},
      {R"({"type":"number","multipleOf":1e-19})", {"'multipleOf' at / (the root)", "at most 18 significant digits"}},
      {R"({"type":"integer","multipleOf":1234567890123456789})", {"'multipleOf'", "at most 18 significant digits"}},
      {R"({"type":"number","multipleOf":1e300})", {"'multipleOf'", "at most 18 significant digits"}},
      {R"({"type":"integer","minimum":1,"maximum":4,"multipleOf":5})",
       {"no integer within the bounds at / (the root) is a multiple of 'multipleOf' (5)"}},
      {R"({"items":{"type":"number","exclusiveMinimum":0,"exclusiveMaximum":0.5,"multipleOf":0.5}})",
       {"no number within the bounds at /items is a multiple of 'multipleOf' (0.5)"}},
      // A divisor prime to 10 keeps every remainder: 1000003 of them pass the DFA cap (bounds may save it).
      {R"({"properties":{"n":{"type":"integer","multipleOf":1000003}}})",
       {"'multipleOf' (1000003) at /properties/n needs more than 4096 DFA states"}},
      {R"({"properties":{"a":{}},"required":[1]})", {"'required' at / (the root) holds 1"}},
      {R"({"allOf":[{"type":"integer"},{"minimum":1}]})", {"'allOf'"}},
      {R"({"properties":{"a":false}})", {"/properties/a is false"}},
      {R"({"enum":[]})", {"'enum'"}},
      {R"({"type":"object",)", {"not JSON"}},
      {R"({"type":"string","maxLength":1000})", {"simplify it"}},
  };
  for (const auto& [schema, parts] : table) {
    CAPTURE(schema);
    const std::string msg = error_of([&] { (void)compile_guided_json(schema); });
    CAPTURE(msg);
    CHECK(contains(msg, "guided_json: "));
    for (const char* part : parts) CHECK(contains(msg, part));
  }
  // $refs used four times at each of 12 levels: refused as the regex grows, not after 4^12 copies.
  nlohmann::json doubling = {{"$ref", "#/$defs/d0"}};
  for (int i = 0; i < 12; ++i) {
    const nlohmann::json next = {{"$ref", "#/$defs/d" + std::to_string(i + 1)}};
    doubling["$defs"]["d" + std::to_string(i)] = {{"anyOf", {next, next, next, next}}};
  }
  doubling["$defs"]["d12"] = {{"type", "null"}};
  CHECK(contains(error_of([&] { (void)compile_guided_json(doubling.dump()); }), "bytes at /$defs/d"));
  sampling_params p;
  p.guided.json_schema = R"({"not":{}})";
  CHECK(contains(error_of([&] { (void)make_guide(p.guided, json_vocab()); }), "guided_json: 'not'"));
}

// ---- end to end on stories260K ----

namespace {

using llama_engine = engine<llama_model<cpu_backend>>;

llama_engine make_engine(bool with_vocab = true) {
  auto& m = stories();
  engine_config cfg;
  cfg.make_detokenizer = detokenizer_factory(m.tokenizer);
  cfg.encode_words = words_encoder(m.tokenizer);
  if (with_vocab) cfg.guide_vocab = guide_vocabulary_of(m.tokenizer);
  return llama_engine(load_llama_gguf<cpu_backend>(m.file), cfg);
}

// The story prompt generated under `guided` for each temperature and seeds 0 .. seeds-1 (max_tokens tokens at
// most); each output must end at EOS and goes to `check` with the temperature and seed captured for its CHECKs.
template <class Check>
void each_guided_output(llama_engine& eng, const guided_decoding& guided, std::initializer_list<float> temperatures,
                        int max_tokens, Check&& check, std::uint64_t seeds = 3) {
  const auto prompt = stories().tokenizer.encode("Once upon a time", true);
  for (const float temperature : temperatures) {
    for (std::uint64_t seed = 0; seed < seeds; ++seed) {
      CAPTURE(temperature);
      CAPTURE(seed);
      sampling_params p;
      p.temperature = temperature;
      p.seed = seed;
      p.max_tokens = max_tokens;
      p.guided = guided;
      const auto out = eng.generate({prompt}, p)[0];
      CAPTURE(out.text);
      CHECK(out.reason == finish_reason::eos);
      check(out);
    }
  }
}

}  // namespace

TEST_CASE("grammar compiler: GBNF rules, literals, classes, groups, quantifiers, comments") {
  struct row {
    const char* grammar;
    std::vector<std::string> yes, no;
  };
  const std::vector<row> table = {
      {R"(root ::= "yes" | "no")", {"yes", "no"}, {"", "yesno", "Yes"}},
      {"root ::= greeting \" \" name  # a comment\ngreeting ::= \"hi\" | \"hello\"\nname ::= [A-Z] [a-z]*",
       {"hi Bob", "hello X"}, {"hi bob", "hey Bob", "hi  Bob"}},
      {R"(root ::= [0-9]+ ("." [0-9]{1,2})?)", {"7", "12.5", "0.25"}, {"1.", "1.234", ".5"}},
      {R"(root ::= "a"{2,3} "b"{2} "c"{1,})", {"aabbc", "aaabbccc"}, {"abbc", "aabc", "aabb"}},
      {R"(root ::= [^"\n]* "!")", {"!", "ok!", "é!"}, {"\"!", "a\n!"}},
      {R"(root ::= "\x41\u00e9\t" [\x30-\x39] "\"" "\\")", {"A\xC3\xA9\t5\"\\"}, {"A\xC3\xA9 5\"\\"}},
      {R"(root ::= . . .)", {"abc", "a\nb", "\xC3\xA9xy"}, {"ab", "abcd"}},
      {"root ::=\n  item\n  (\",\" item)*\nitem ::= \"x\" |\n  \"y\"", {"x", "x,y,x"}, {"", "x,", ",x"}},
      {R"(root ::= [a-c-] [\]\-\\])", {"a]", "--", "c\\"}, {"d]", "a["}},
      {R"g(root ::= "(" root ")" | "x")g", {"x", "(x)", "((((x))))", "(((((((((((x)))))))))))"}, {"(x", "", "(x))"}},
      {R"g(root ::= expr
          expr ::= term (("+" | "-") term)*
          term ::= [0-9]+ | "(" expr ")")g",
       {"1+2", "(1+2)-3", "((1))"}, {"1+", "(1+2", "+1"}},
  };
  for (const row& r : table) {
    const std::string grammar = r.grammar;
    CAPTURE(grammar);
    check_language(compile_guided_grammar(grammar), r.yes, r.no);
  }
  // A JSON grammar with whitespace everywhere: a pushdown grammar, containers nested at any depth.
  const std::string json_gbnf = R"g(root ::= obj
val ::= obj | arr | str | num | "true" | "false" | "null"
obj ::= "{" sp ( str sp ":" sp val sp ( "," sp str sp ":" sp val sp )* )? "}"
arr ::= "[" sp ( val sp ( "," sp val sp )* )? "]"
str ::= "\"" ( [^"\\\x00-\x1F] | "\\" ["\\/bfnrt] )* "\""
num ::= "-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]+ )?
sp ::= | " " | "\n" [ \t]{0,16})g";
  check_language(compile_guided_grammar(json_gbnf), {R"({"a": [1, {"b": null}], "c": "x\n"})", "{}", R"({"a":[[]]})"},
                 {R"({"a": })", R"({"a":[[[[]]]])", "[]"});
  CHECK(compile_guided_grammar(json_gbnf).is_pushdown());
  CHECK(compile_guided_grammar(json_gbnf).matches(R"({"a":[[[[[[[[[[{"b":[{}]}]]]]]]]]]]})"));
  // Recursion is unrolled grammar_max_recursion times; with a larger limit, deeper nesting.
  const std::string nested = R"(root ::= "[" root* "]")";
  CHECK(compile_guided_regex(grammar_regex(nested, 1)).matches("[[]]"));
  CHECK(!compile_guided_regex(grammar_regex(nested, 1)).matches("[[[]]]"));
  CHECK(compile_guided_regex(grammar_regex(nested, 2)).matches("[[[]][]]"));
}

TEST_CASE("grammar compiler: bad grammars are errors naming guided_grammar and the place") {
  const std::vector<std::pair<std::string, std::vector<const char*>>> table = {
      {R"(start ::= "a")", {"no 'root' rule"}},
      {R"(root ::= "a" other)", {"uses 'other'", "not defined"}},
      {"root ::= \"a\"\nroot ::= \"b\"", {"'root' is defined twice"}},
      {R"(root ::= "abc)", {"literal", "not closed"}},
      {R"(root ::= [a-z)", {"class", "not closed"}},
      {R"(root ::= ("a" | "b")", {"'(' at line 1", "not closed"}},
      {R"(root ::= [é])", {"non-ASCII member (U+E9)"}},
      {R"(root ::= "a"{3,2})", {"reversed"}},
      {R"(root ::= "\q")", {"unknown escape '\\q'"}},
      {"root ::= \"a\"\n  ::= \"b\"", {"line 2"}},
      {R"(root ::= root "a")", {"'root' derives no finite text"}},  // recursion that never ends
      {R"(root ::= root "a" | "b")", {"left recursion", "'root'", "x ::= item x?"}},
      {"root ::= x \"a\"\nx ::= y? \"b\" | root\ny ::= \"c\"", {"left recursion"}},  // through another rule
      {R"(root ::= "a" @)", {"unexpected '@'"}},
  };
  for (const auto& [grammar, parts] : table) {
    CAPTURE(grammar);
    const std::string msg = error_of([&] { (void)compile_guided_grammar(grammar); });
    CAPTURE(msg);
    CHECK(contains(msg, "guided_grammar: "));
    for (const char* part : parts) CHECK(contains(msg, part));
  }
  sampling_params p;
  p.guided.grammar = R"(root ::= "a")";
  p.guided.regex = "a";
  CHECK(contains(error_of([&] { p.validate(); }), "more than one of"));
  p.guided.regex.reset();
  p.validate();
  CHECK(std::string(p.guided.field()) == "guided_grammar");
}

// ---- structural tags (structural_tag.hpp) ----

TEST_CASE("structural tag, legacy form: free text, triggers force structures, JSON inside, EOS only outside") {
  struct row {
    const char* tag;
    std::vector<std::string> yes, no;
  };
  const std::vector<row> table = {
      // Two structures under one trigger; the JSON inside is validated; text around and between them.
      {R"({"type": "structural_tag", "triggers": ["<f="], "structures": [
          {"begin": "<f=get>", "schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                                          "required": ["city"]}, "end": "</f>"},
          {"begin": "<f=time>", "schema": {"type": "object", "properties": {"tz": {"enum": ["utc", "cet"]}},
                                           "required": ["tz"]}, "end": "</f>"}]})",
       {"", "hello world", "call <f=get>{\"city\": \"Oslo\"}</f> done",
        "<f=get>{\"city\":\"A\"}</f><f=time>{\"tz\":\"utc\"}</f>",
        "a <f=time>{\"tz\": \"cet\"}</f>\nb <f=get>{\"city\":\"B\"}</f>", "<f", "text <f", "\xC3\xA9 <", "</f> f=",
        "<<f=get>{\"city\":\"\"}</f>"},
       {"<f=", "<f=other>{}</f>", "<f=get>{\"city\": 5}</f>", "<f=get>{\"city\":\"Oslo\"}",
        "<f=get>{\"city\":\"Oslo\"}</f", "<f=time>{\"tz\":\"pst\"}</f>", "<f=get>{\"city\":\"Oslo\"}</g>", "x<f=get>",
        "<f=get>{\"city\":\"Oslo\"}</f><f=", "<f=get>{\"city\":\"123456789\"}</f>", "\xC3", "a\xC3(b"}},
      // Several triggers, each with its structure.
      {R"({"triggers": ["<a>", "[b]"], "structures": [{"begin": "<a>", "schema": {"type": "integer"}, "end": "</a>"},
                                                     {"begin": "[b]", "schema": {"type": "boolean"}, "end": "[/b]"}]})",
       {"x<a>12</a>y[b]true[/b]", "<a>-3</a>", "[b]false[/b]<a>0</a>", "a] b< [c] <b>"},
       {"<a>true</a>", "[b]1[/b]", "<a>1[/b]", "[b]true</a>", "<a>", "[b]"}},
      // A trigger that is a prefix of another: the shorter one always occurs first and takes both structures.
      {R"({"triggers": ["<t", "<tool>"], "structures": [
          {"begin": "<tool>", "schema": {"type": "integer"}, "end": "</tool>"},
          {"begin": "<tx>", "schema": {"enum": ["y"]}, "end": "</tx>"}]})",
       {"ok", "<tool>1</tool>", "a <tx>\"y\"</tx> b <tool>7</tool>", "< t", "<T"},
       {"<t", "<tea>", "<tool>x</tool>", "<tx>\"n\"</tx>", "<tool>1</tx>"}},
      // Where a trigger first occurs is where its structure begins (as an Aho-Corasick scan finds it): in "ababa!"
      // "aba" occurs at 0, so the structure would have to start there.
      {R"({"triggers": ["aba"], "structures": [{"begin": "aba!", "schema": {"type": "null"}, "end": "."}]})",
       {"xaba!null.", "ab aba!null. ab", "abba"},
       {"ababa!null.", "aba", "aba!nul."}},
  };
  for (const row& r : table) {
    const std::string tag = r.tag;
    CAPTURE(tag);
    check_language(compile_guided_structural_tag(tag), r.yes, r.no);
  }
  // The same tag as an object's JSON text or as the OpenAI response_format (whose type is "structural_tag").
  const std::string plain = R"({"structures": [{"begin": "<n>", "schema": {"type": "integer"}, "end": "</n>"}],
                                "triggers": ["<n>"]})";
  const std::string typed = R"({"type": "structural_tag", "triggers": ["<n>"],
                                "structures": [{"begin": "<n>", "schema": {"type": "integer"}, "end": "</n>"}]})";
  for (const std::string& t : {plain, typed})
    check_language(compile_guided_structural_tag(t), {"a <n>1</n> b"}, {"a <n>x</n>"});
}

TEST_CASE("structural tag, format form: every supported format type") {
  struct row {
    const char* format;
    std::vector<std::string> yes, no;
  };
  const std::string fn = R"({"type": "tag", "begin": "<fn=a>", "content": {"type": "json_schema",
                                                                          "json_schema": {"type": "integer"}},
                            "end": "</fn>"})";
  const std::string item = R"({"begin": "<i>", "content": {"type": "json_schema", "json_schema": {"type": "integer"}},
                               "end": "</i>"})";  // (a tag in `tags` may leave out its type)
  const auto triggered = [&](const char* flags) {
    return std::string(R"({"type": "triggered_tags", "triggers": ["<fn="], "tags": [)") + fn + "]" + flags + "}";
  };
  const auto separated = [&](const char* flags) {
    return std::string(R"({"type": "tags_with_separator", "separator": ",", "tags": [)") + item + "]" + flags + "}";
  };
  const std::vector<std::pair<std::string, std::pair<std::vector<std::string>, std::vector<std::string>>>> table = {
      {R"({"type": "const_string", "value": "Hi!"})", {{"Hi!"}, {"Hi", "Hi!!", ""}}},
      {R"({"type": "json_schema", "json_schema": {"type": "array", "items": {"type": "integer"}, "maxItems": 2}})",
       {{"[1, 2]", "[]", "[3]"}, {"[1,2,3]", "[a]"}}},
      // Properties in their declared order (the tag's JSON is read in order).
      {R"({"type": "json_schema", "json_schema": {"type": "object", "properties": {"b": {"type": "integer"},
          "a": {"type": "integer"}}, "required": ["b", "a"]}, "max_whitespace_cnt": 0})",
       {{R"({"b":1,"a":2})"}, {R"({"a":2,"b":1})", R"({"b": 1,"a":2})"}}},
      {R"({"type": "json_schema", "json_schema": {"type": "integer", "multipleOf": 4}})",
       {{"8", "-12", "0"}, {"6", "8.0"}}},
      {R"({"type": "regex", "pattern": "[A-Z]{3}-[0-9]{2}"})", {{"ABC-12"}, {"AB-12", "ABC-123"}}},
      {R"({"type": "grammar", "grammar": "root ::= \"yes\" | \"no\" | \"(\" root \")\""})",
       {{"yes", "(no)", "((yes))"}, {"maybe", "(yes"}}},
      // any_text in a tag stops at the tag's end.
      {R"({"type": "tag", "begin": "<think>", "content": {"type": "any_text"}, "end": "</think>"})",
       {{"<think></think>", "<think>a < b </thin </think>", "<think>\xC3\xA9\n</think>"},
        {"<think>a</think>b", "<think>a</think></think>", "<think>x", "<think>\xC3</think>"}}},
      {R"({"type": "any_text", "excludes": ["bad"]})", {{"", "good", "ba d"}, {"so bad", "badly"}}},
      {R"({"type": "tag", "begin": "[", "content": {"type": "any_text"}, "end": ["]", "}"]})",
       {{"[ab]", "[ab}", "[]"}, {"[a]b]", "[a}]", "[a"}}},
      {R"({"type": "sequence", "elements": [
          {"type": "tag", "begin": "<think>", "content": {"type": "any_text"}, "end": "</think>"},
          {"type": "const_string", "value": "Answer: "}, {"type": "regex", "pattern": "[0-9]+"}]})",
       {{"<think>hm</think>Answer: 42"}, {"<think>hm</think>Answer: ", "Answer: 1"}}},
      {R"({"type": "or", "elements": [{"type": "const_string", "value": "yes"},
                                      {"type": "const_string", "value": "no"}]})",
       {{"yes", "no"}, {"yesno", ""}}},
      {R"({"type": "optional", "content": {"type": "const_string", "value": "x"}})", {{"", "x"}, {"xx"}}},
      {R"({"type": "plus", "content": {"type": "const_string", "value": "x"}})", {{"x", "xxx"}, {""}}},
      {R"({"type": "star", "content": {"type": "const_string", "value": "x"}})", {{"", "xx"}, {"y"}}},
      {R"({"type": "repeat", "min": 2, "max": 3, "content": {"type": "const_string", "value": "ab"}})",
       {{"abab", "ababab"}, {"ab", "abababab"}}},
      {R"({"type": "repeat", "min": 1, "max": -1, "content": {"type": "const_string", "value": "ab"}})",
       {{"ab", "ababababab"}, {""}}},
      {triggered(""), {{"", "text", "t <fn=a>1</fn> u <fn=a>2</fn>", "<fn"}, {"<fn=b>1</fn>", "<fn=a>x</fn>", "<fn="}}},
      {triggered(R"(, "at_least_one": true)"),
       {{"<fn=a>1</fn>", "<fn=a>1</fn> then text <fn=a>2</fn>"}, {"", "text <fn=a>1</fn>"}}},
      {triggered(R"(, "stop_after_first": true)"),
       {{"text <fn=a>1</fn>", "text", ""}, {"<fn=a>1</fn> more", "<fn=a>1</fn><fn=a>2</fn>"}}},
      {triggered(R"(, "at_least_one": true, "stop_after_first": true)"),
       {{"<fn=a>1</fn>"}, {"x<fn=a>1</fn>", "<fn=a>1</fn>x", ""}}},
      {triggered(R"(, "excludes": ["STOP"])"), {{"go <fn=a>1</fn>", "ST OP"}, {"STOP", "a <fn=a>1</fn> STOP"}}},
      // Inside a tag, the free text between triggered tags stops at the tag's end.
      {std::string(R"({"type": "tag", "begin": "<r>", "end": "</r>", "content": )") + triggered("") + "}",
       {{"<r></r>", "<r>hi <fn=a>1</fn> ok</r>"}, {"<r>hi</r>x", "<r>hi <fn=a>1</fn> ok", "<r><fn=a></r>"}}},
      {separated(""), {{"", "<i>1</i>", "<i>1</i>,<i>2</i>,<i>3</i>"}, {"<i>1</i><i>2</i>", "<i>1</i>,", ",<i>1</i>"}}},
      {separated(R"(, "at_least_one": true)"), {{"<i>1</i>", "<i>1</i>,<i>2</i>"}, {""}}},
      {separated(R"(, "stop_after_first": true)"), {{"", "<i>1</i>"}, {"<i>1</i>,<i>2</i>"}}},
      {R"({"type": "dispatch", "rules": [["<<", {"type": "regex", "pattern": "[0-9]+>>"}]]})",
       {{"a <<12>> b <<3>>", "x", "<"}, {"a << 12>>", "a << b", "<<"}}},
      {R"({"type": "dispatch", "loop": false, "excludes": ["!"],
           "rules": [["<<", {"type": "regex", "pattern": "[0-9]+>>"}]]})",
       {{"a <<1>>", "a"}, {"<<1>><<2>>", "<<1>> b", "a!"}}},
  };
  for (const auto& [format, texts] : table) {
    const std::string tag = R"({"type": "structural_tag", "format": )" + format + "}";
    CAPTURE(tag);
    check_language(compile_guided_structural_tag(tag), texts.first, texts.second);
  }
}

TEST_CASE("structural tag: recursive grammars and schemas inside are exact at any depth (a pushdown grammar)") {
  const std::string legacy = R"({"structures": [{"begin": "<j>", "schema": {}, "end": "</j>"}], "triggers": ["<j>"]})";
  const std::string format = R"({"format": {"type": "sequence", "elements": [
      {"type": "tag", "begin": "<p>", "content": {"type": "grammar", "grammar": "root ::= \"(\" root \")\" | \"x\""},
       "end": "</p>"},
      {"type": "tag", "begin": "<t>", "content": {"type": "json_schema", "json_schema": {"type": "object",
       "properties": {"n": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}}},
       "required": ["n"]}}, "end": "</t>"}]}})";
  const guided_machine a = compile_guided_structural_tag(legacy), b = compile_guided_structural_tag(format);
  CHECK(a.is_pushdown());
  CHECK(b.is_pushdown());
  check_language(a, {"hi <j>[[[[[[1]]]]]]</j> and <j>{\"a\":{\"b\":{\"c\":{\"d\":[]}}}}</j>", "no tag"},
                 {"<j>[[1]</j>", "<j>[1]]</j>", "<j>"});
  check_language(b, {"<p>x</p><t>{\"n\":1}</t>", "<p>((((((x))))))</p><t>{\"n\":1,\"kids\":[{\"n\":2,\"kids\":"
                     "[{\"n\":3,\"kids\":[{\"n\":4}]}]}]}</t>"},
                 {"<p>((x)</p><t>{\"n\":1}</t>", "<p>x</p><t>{\"n\":1,\"kids\":[{}]}</t>"});
  // Left recursion in a tag's grammar: refused naming the place.
  const std::string left = R"({"format": {"type": "grammar", "grammar": "root ::= root \"a\" | \"b\""}})";
  const std::string msg = error_of([&] { (void)compile_guided_structural_tag(left); });
  CAPTURE(msg);
  CHECK(contains(msg, "structural_tag: "));
  CHECK(contains(msg, "left recursion"));
}

TEST_CASE("structural tag guide: allowed tokens equal brute force; EOS only outside a structure") {
  const std::string tag = R"({"triggers": ["ab"], "structures": [{"begin": "abc", "schema": {"enum": ["yes", "no"]},
                                                                  "end": "c"}]})";
  const guide g(compile_guided_structural_tag(tag), vocab());
  for (const std::string t : {"", "a", "x", "ab", "abc", "abc\"", "abc\"ye", "abc\"yes\"", "abc\"yes\"c", "yes ab"}) {
    CAPTURE(t);
    const std::int32_t s = g.dfa().walk(0, t);
    REQUIRE(s >= 0);
    CHECK(g.allowed_ids(s) == brute(g.dfa(), t));
    const bool in_structure = t.find("ab") != std::string::npos && !t.ends_with("\"c");
    CHECK(g.accepts(s) == !in_structure);
  }
}

TEST_CASE("structural tag compiler: bad or unsupported tags are errors naming structural_tag and the place") {
  const std::string st = R"({"type": "structural_tag", "format": )";
  const std::vector<std::pair<std::string, std::vector<const char*>>> table = {
      {R"({"structures": [)", {"not JSON"}},
      {"[]", {"must be a JSON object"}},
      {R"({"type": "json_schema", "format": {"type": "any_text"}})", {"'type' must be \"structural_tag\""}},
      {"{}", {"needs 'format'"}},
      {R"({"structures": [], "triggers": ["<"]})", {"structures is empty"}},
      {R"({"structures": [{"begin": "<a>", "schema": {}}], "triggers": ["<"]})", {"structures[0].end is missing"}},
      {R"({"structures": [{"begin": "<a>", "schema": {}, "end": "x"}]})", {"triggers is missing"}},
      {R"({"structures": [{"begin": "<a>", "end": "x"}], "triggers": ["<"]})", {"structures[0].schema is missing"}},
      {R"({"structures": [{"begin": "<a>", "schema": 5, "end": "x"}], "triggers": ["<"]})",
       {"structures[0].schema must be a JSON schema"}},
      {R"({"structures": [{"begin": 1, "schema": {}, "end": "x"}], "triggers": ["<"]})",
       {"structures[0].begin must be a string"}},
      {R"({"structures": [{"begin": "<a>", "schema": {}, "end": "x"}, {"begin": "[b]", "schema": {}, "end": "x"}],
           "triggers": ["<"]})",
       {"structures[1].begin \"[b]\" starts with none of the triggers"}},
      {R"({"structures": [{"begin": "<a>", "schema": {"not": {}}, "end": "x"}], "triggers": ["<"]})",
       {"structures[0].schema", "'not'"}},
      {R"({"structures": [{"begin": "<a>", "schema": {}, "end": "x"}], "triggers": [""]})", {"triggers[0] is empty"}},
      {R"({"structures": [{"begin": "<a>", "schema": {}, "end": "x"}], "triggers": "<"})",
       {"triggers must be a list of strings"}},
      {st + R"({"type": "nope"}})", {"format: unknown format type \"nope\""}},
      {st + R"({"value": "x"}})", {"format: a format needs a 'type'"}},
      {st + R"("x"})", {"format must be a format object"}},
      {st + R"({"type": "sequence", "elements": []}})", {"format.elements is empty"}},
      {st + R"({"type": "sequence", "elements": [{"type": "optional", "content": {"type": "nope"}}]}})",
       {"format.elements[0].content: unknown format type \"nope\""}},
      {st + R"({"type": "const_string"}})", {"format.value is missing"}},
      {st + R"({"type": "regex", "pattern": "(a)\\1"}})", {"format.pattern", "backreferences"}},
      {st + R"({"type": "grammar", "grammar": "start ::= \"a\""}})", {"format.grammar", "no 'root' rule"}},
      {st + R"({"type": "token", "token": "<|tool|>"}})", {"format: format type \"token\" is token-level"}},
      {st + R"({"type": "any_tokens"}})", {"\"any_tokens\" is token-level"}},
      {st + R"({"type": "tag", "begin": {"type": "token", "token": 5}, "content": {"type": "any_text"}, "end": "x"}})",
       {"format.begin: a token"}},
      {st + R"({"type": "tag", "begin": "<a>", "content": {"type": "any_text"}, "end": []}})",
       {"format.end is an empty list"}},
      {st + R"({"type": "tag", "begin": "<a>", "end": "</a>"}})", {"format.content is missing"}},
      {st + R"({"type": "triggered_tags", "triggers": ["<f"], "tags": [{"begin": "[x]", "end": "",
                                                                         "content": {"type": "any_text"}}]}})",
       {"format.tags[0].begin \"[x]\" starts with none of the triggers"}},
      {st + R"({"type": "triggered_tags", "triggers": [], "tags": []}})", {"format.triggers is empty"}},
      {st + R"({"type": "triggered_tags", "triggers": ["<"], "tags": [{"type": "or", "begin": "<"}]}})",
       {"format.tags[0]: a tag must have \"type\": \"tag\""}},
      {st + R"({"type": "tags_with_separator",
                "tags": [{"begin": "<", "end": ">", "content": {"type": "any_text"}}]}})",
       {"format.separator is missing"}},
      {st + R"({"type": "triggered_tags", "triggers": ["<"], "at_least_one": "yes",
                "tags": [{"begin": "<", "end": ">", "content": {"type": "any_text"}}]}})",
       {"format.at_least_one must be a boolean"}},
      {st + R"({"type": "any_text", "max_tokens": 5}})", {"format.max_tokens is not supported in an any_text format"}},
      {st + R"({"type": "json_schema", "json_schema": {}, "style": "qwen_xml"}})", {"format.style \"qwen_xml\""}},
      {st + R"({"type": "json_schema", "json_schema": {}, "any_order": true}})", {"format.any_order true"}},
      {st + R"({"type": "repeat", "min": 2, "max": 1, "content": {"type": "any_text"}}})", {"format.max 1 is below"}},
      {st + R"({"type": "dispatch", "rules": [["<", {"type": "any_text"}, 3]]}})",
       {"format.rules[0] must be a pair [pattern, format]"}},
      {st + R"({"type": "regex", "pattern": "[a-z]{0,40}[0-9]{0,40}[a-f]{0,40}x[0-9a-z]{30}"}})",
       {"the structural tag needs more than 4096 DFA states"}},
      {st + R"({"type": "any_text", "excludes": [")" + std::string(3000, 'x') + R"("]}})", {"more than 2048"}},
  };
  for (const auto& [tag, parts] : table) {
    CAPTURE(tag);
    const std::string msg = error_of([&] { (void)compile_guided_structural_tag(tag); });
    CAPTURE(msg);
    CHECK(msg.starts_with("structural_tag: "));
    for (const char* part : parts) CHECK(contains(msg, part));
  }
  // One constraint at a time; the field errors name.
  sampling_params p;
  p.guided.structural_tag = R"({"format": {"type": "const_string", "value": "a"}})";
  p.validate();
  CHECK(std::string(p.guided.field()) == "structural_tag");
  CHECK(compile_guided(p.guided).matches("a"));
  p.guided.regex = "a";
  CHECK(contains(error_of([&] { p.validate(); }), "more than one of"));
  p.guided.regex.reset();
  p.guided.structural_tag = R"({"format": {"type": "nope"}})";
  CHECK(contains(error_of([&] { (void)make_guide(p.guided, vocab()); }), "structural_tag: format: unknown"));
}

TEST_CASE("guided generation on stories260K: every output is a sentence of the grammar") {
  auto eng = make_engine();
  guided_decoding g;
  g.grammar = R"(root ::= "The " animal " was " mood ( " and " mood )? "."
animal ::= "cat" | "dog" | "little bird"
mood ::= "happy" | "sad" | "very " mood)";
  const guided_machine sentence = compile_guided_grammar(*g.grammar);
  std::set<std::string> seen;
  each_guided_output(eng, g, {0.0f, 1.0f, 1.5f}, 60, [&](const auto& out) {
    CHECK(out.text.starts_with("The "));
    CHECK(sentence.matches(out.text));
    seen.insert(out.text);
  });
  CHECK(seen.size() > 2);
}

TEST_CASE("guided generation on stories260K: a recursive grammar and free-form JSON, through the pushdown guide") {
  auto eng = make_engine();
  const auto prompt = stories().tokenizer.encode("Once upon a time", true);
  guided_decoding nested, any_json;
  nested.grammar = R"g(root ::= "The " thing " was happy."
thing ::= "cat" | "dog" | "(" thing " and " thing ")")g";
  any_json.json_schema = R"({"type":"array","items":{},"minItems":2,"maxItems":3})";  // free-form values
  int finished = 0;
  std::set<std::string> seen;
  for (const guided_decoding* guided : {&nested, &any_json}) {
    const guided_machine machine = compile_guided(*guided);
    REQUIRE(machine.is_pushdown());
    for (const float temperature : {0.0f, 0.8f, 1.2f}) {
      for (std::uint64_t seed = 0; seed < 4; ++seed) {
        sampling_params p;
        p.temperature = temperature;
        p.seed = seed;
        p.max_tokens = 48;
        p.guided = *guided;
        const auto out = eng.generate({prompt}, p)[0];
        CAPTURE(temperature);
        CAPTURE(seed);
        CAPTURE(out.text);
        if (out.reason == finish_reason::eos) {  // a whole sentence of the grammar
          CHECK(machine.matches(out.text));
          nlohmann::json v;
          if (guided == &any_json) CHECK_NOTHROW(v = nlohmann::json::parse(out.text));
          ++finished;
        } else {  // cut at max_tokens: still a prefix of one
          CHECK(out.reason == finish_reason::length);
          CHECK(machine.prefix(out.text));
        }
        seen.insert(out.text);
      }
    }
  }
  CHECK(finished >= 6);
  CHECK(seen.size() > 4);
}

TEST_CASE("guided generation on stories260K: every output is one of the choices / matches the regex") {
  auto eng = make_engine();
  const std::vector<std::string> choices = {"happy", "sad", "a big red ball", "Lily"};
  const std::vector<std::string> regexes = {"[a-z]{2,6}( [a-z]{2,6}){0,2}\\.", "(cat|dog)s? [0-9]{1,3}", "Tim|Tom",
                                            "\"[^\"]{1,12}\""};
  const std::initializer_list<float> temperatures = {0.0f, 0.7f, 1.0f, 1.5f};
  std::set<std::string> seen;
  guided_decoding g;
  g.choice = choices;
  each_guided_output(eng, g, temperatures, 64, [&](const auto& out) {
    CHECK(std::find(choices.begin(), choices.end(), out.text) != choices.end());
    seen.insert(out.text);
  }, 4);
  for (const std::string& re : regexes) {
    CAPTURE(re);
    const guided_decoding r{.regex = re};
    const byte_dfa matcher = compile_guided_regex(re);
    each_guided_output(eng, r, temperatures, 64, [&](const auto& out) {
      CHECK(matcher.matches(out.text));
      seen.insert(out.text);
    }, 4);
  }
  CHECK(seen.size() > 4);  // sampling still chooses: not one fixed answer
}

TEST_CASE("guided generation on stories260K: every JSON output parses and satisfies the schema") {
  auto eng = make_engine();
  // Bounded (short strings, a pattern for the number, few items), so that every output ends within max_tokens.
  guided_decoding g;
  g.json_schema = R"({"type":"object","properties":{
      "name":{"type":"string","minLength":1,"maxLength":8},"age":{"type":"string","pattern":"[1-9][0-9]?"},
      "mood":{"enum":["happy","sad"]},"pets":{"type":"array","items":{"type":"boolean"},"maxItems":3},
      "toy":{"type":["null","string"],"maxLength":5}},"required":["name","mood"]})";
  const nlohmann::json s = nlohmann::json::parse(*g.json_schema);
  std::set<std::string> seen;
  each_guided_output(eng, g, {0.0f, 0.8f, 1.5f}, 160, [&](const auto& out) {
    nlohmann::json v;
    REQUIRE_NOTHROW(v = nlohmann::json::parse(out.text));
    CHECK(conforms(v, s, s));
    CHECK((v["mood"] == "happy" || v["mood"] == "sad"));
    seen.insert(out.text);
  });
  CHECK(seen.size() > 3);
}

TEST_CASE("guided generation on stories260K: structural tags, the format form and free text with triggers") {
  auto eng = make_engine();
  // Exactly one tag between two fixed strings (bounded, so that every output ends within max_tokens).
  guided_decoding g;
  g.structural_tag = R"({"type": "structural_tag", "format": {"type": "sequence", "elements": [
      {"type": "const_string", "value": "The "},
      {"type": "triggered_tags", "triggers": ["<"], "at_least_one": true, "stop_after_first": true, "tags": [
        {"type": "tag", "begin": "<mood>", "end": "</mood>",
         "content": {"type": "json_schema", "json_schema": {"enum": ["happy", "sad"]}}},
        {"type": "tag", "begin": "<name>", "end": "</name>",
         "content": {"type": "json_schema", "json_schema": {"type": "string", "minLength": 1, "maxLength": 6}}}]},
      {"type": "const_string", "value": "."}]}})";
  const guided_machine one_tag = compile_guided_structural_tag(*g.structural_tag);
  std::set<std::string> seen;
  each_guided_output(eng, g, {0.0f, 1.0f, 1.5f}, 60, [&](const auto& out) {
    CHECK(one_tag.matches(out.text));
    CHECK((out.text.starts_with("The <mood>") || out.text.starts_with("The <name>")));
    seen.insert(out.text);
  });
  CHECK(seen.size() > 2);
  // The legacy form: a story, free text, but wherever " was" occurs, ` was "happy"!` or ` was "sad"!` follows. The
  // model writes " was" often; an output may end (EOS) only outside a structure, or be cut off by max_tokens.
  guided_decoding legacy;
  legacy.structural_tag = R"({"triggers": [" was"],
                              "structures": [{"begin": " was ", "schema": {"enum": ["happy", "sad"]}, "end": "!"}]})";
  const guided_machine tagged = compile_guided_structural_tag(*legacy.structural_tag);
  const auto prompt = stories().tokenizer.encode("Once upon a time", true);
  int structures = 0;
  for (const float temperature : {0.0f, 0.8f, 1.2f}) {
    for (std::uint64_t seed = 0; seed < 3; ++seed) {
      CAPTURE(temperature);
      CAPTURE(seed);
      sampling_params p;
      p.temperature = temperature;
      p.seed = seed;
      p.max_tokens = 48;
      p.guided = legacy;
      const auto out = eng.generate({prompt}, p)[0];
      CAPTURE(out.text);
      CHECK(tagged.prefix(out.text));
      CHECK((out.reason == finish_reason::eos || out.reason == finish_reason::length));
      if (out.reason == finish_reason::eos) CHECK(tagged.matches(out.text));
      for (std::size_t at = out.text.find(" was"); at != std::string::npos; at = out.text.find(" was", at + 1)) {
        const std::string rest = out.text.substr(at);
        const bool whole = rest.starts_with(" was \"happy\"!") || rest.starts_with(" was \"sad\"!");
        CHECK((whole || (out.reason == finish_reason::length && rest.size() < 13)));
        structures += whole ? 1 : 0;
      }
    }
  }
  CHECK(structures > 3);
}

TEST_CASE("guided generation in a batch beside unguided requests; the unguided output is unchanged") {
  auto eng = make_engine();
  const auto prompt = stories().tokenizer.encode("Once upon a time", true);
  sampling_params plain;
  plain.temperature = 0.0f;
  plain.max_tokens = 24;
  const auto alone = eng.generate({prompt}, plain)[0];
  const request_id a = eng.add_request(prompt, plain);
  sampling_params g = plain;
  g.guided.choice = {"yes", "no"};
  const request_id b = eng.add_request(prompt, g);
  eng.run_to_completion();
  CHECK(eng.take_output(a).output == alone.output);
  const std::string text = eng.take_output(b).text;
  CHECK((text == "yes" || text == "no"));
}

TEST_CASE("guided requests: errors name the field") {
  auto eng = make_engine();
  const auto prompt = stories().tokenizer.encode("Once", true);
  sampling_params p;
  p.guided.regex = "(a)\\1";
  const std::string msg = error_of([&] { (void)eng.add_request(prompt, p); });
  CHECK(contains(msg, "guided_regex"));
  CHECK(contains(msg, "backreferences"));
  auto bare = make_engine(false);
  p.guided.regex = "a";
  CHECK(contains(error_of([&] { (void)bare.add_request(prompt, p); }), "engine_config::guide_vocab"));
}
