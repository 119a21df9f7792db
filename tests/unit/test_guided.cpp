// Structured outputs (sampling/guided.hpp): the vocabulary trie walk, choice and regex guides on a hand-made
// vocabulary, the regex compiler's accept/reject tables, the logit edit a guide makes, and guided generation
// end to end on stories260K (CPU backend).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "zipage/engine/engine.hpp"
#include "zipage/gguf/gguf.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/sampling/guided.hpp"
#include "zipage/sampling/logits_processors.hpp"
#include "zipage/sampling/sampler.hpp"
#include "zipage/tokenizer/detokenizer.hpp"
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
    const byte_dfa d = compile_guided_regex(r.re);
    for (const std::string& t : r.yes) {
      CAPTURE(t);
      CHECK(d.matches(t));
    }
    for (const std::string& t : r.no) {
      CAPTURE(t);
      CHECK(!d.matches(t));
    }
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
  CHECK(contains(error_of([&] { p.validate(); }), "both set"));
  p.guided.choice.clear();
  p.allowed_token_ids = std::vector<token_id>{1};
  CHECK(contains(error_of([&] { p.validate(); }), "guided_regex cannot be combined with allowed_token_ids"));
  p.allowed_token_ids.reset();
  p.min_tokens = 1;
  CHECK(contains(error_of([&] { p.validate(); }), "min_tokens"));
  p.min_tokens = 0;
  p.validate();
  CHECK(!sampling_params{}.processes_logits(0));
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

}  // namespace

TEST_CASE("guided generation on stories260K: every output is one of the choices / matches the regex") {
  auto eng = make_engine();
  const auto& tok = stories().tokenizer;
  const auto prompt = tok.encode("Once upon a time", true);
  const std::vector<std::string> choices = {"happy", "sad", "a big red ball", "Lily"};
  const std::vector<std::string> regexes = {"[a-z]{2,6}( [a-z]{2,6}){0,2}\\.", "(cat|dog)s? [0-9]{1,3}", "Tim|Tom",
                                            "\"[^\"]{1,12}\""};
  std::set<std::string> seen;
  for (const float temperature : {0.0f, 0.7f, 1.0f, 1.5f}) {
    for (std::uint64_t seed = 0; seed < 4; ++seed) {
      CAPTURE(temperature);
      CAPTURE(seed);
      sampling_params p;
      p.temperature = temperature;
      p.seed = seed;
      p.max_tokens = 64;
      p.guided.choice = choices;
      const auto out = eng.generate({prompt}, p)[0];
      CAPTURE(out.text);
      CHECK(std::find(choices.begin(), choices.end(), out.text) != choices.end());
      CHECK(out.reason == finish_reason::eos);
      seen.insert(out.text);
      p.guided = {};
      for (const std::string& re : regexes) {
        CAPTURE(re);
        p.guided.regex = re;
        const auto r = eng.generate({prompt}, p)[0];
        CAPTURE(r.text);
        CHECK(compile_guided_regex(re).matches(r.text));
        CHECK(r.reason == finish_reason::eos);
        seen.insert(r.text);
      }
    }
  }
  CHECK(seen.size() > 4);  // sampling still chooses: not one fixed answer
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
