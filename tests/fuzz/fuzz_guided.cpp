// Structured outputs (zipage/sampling/guided.hpp) on arbitrary constraints: the first byte picks the compiler (regex,
// JSON schema, GBNF grammar, structural tag, or a choice list split at line breaks), the bytes up to the first NUL are
// the constraint, the bytes after it steer a walk. A constraint that cannot be compiled must end in a zipage::error.
// One that compiles is walked over a small vocabulary (every single byte, multi-byte tokens that span UTF-8
// characters and JSON / tag syntax, and a token with no bytes), checking at each step what the guide promises:
//   - it allows exactly the tokens whose bytes keep the text a prefix of a match (compared with the machine's own
//     prefix test, token by token; the byte trie walk and the pushdown guide's stacks are what is checked);
//   - a pushdown grammar's graph-structured stack has the top frames, the liveness and the whole-match answer of
//     the plain parse with every stack kept apart (tests/support/pushdown_reference.hpp), where that stays small;
//   - a token with no bytes is never allowed;
//   - "at a match" is the machine's whole-text match, and a text that is alive is a prefix;
//   - a walk never dead-ends: where the text is no match, some token is allowed.
// Any other exception, a crash, a sanitizer report or a hang is a finding.
#include "fuzz_common.hpp"

#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "../support/pushdown_reference.hpp"
#include "zipage/sampling/guided.hpp"

namespace {

using zipage::guided_machine;
using zipage::token_id;

std::shared_ptr<const zipage::guide_vocabulary> vocabulary() {
  static const auto vocab = [] {
    std::vector<std::string> bytes;
    bytes.emplace_back();  // id 0: a special token, no bytes
    for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
    for (const char* s : {"ab", "abc", "{\"", "\":", "\": ", "\"}", "true", "false", "null", "12", "-0", ".5", "e+",
                          ", ", "[]", "<a>", "</a>", "  ", "\n\n", "hi", "yes", "no", "\xe6\x97\xa5\xe6\x9c\xac",
                          "\xe6\x97", "\xa5\xe6", "\xc3\xa9", "\xf0\x9f\x98\x80", "\\u00", "\\\""})
      bytes.emplace_back(s);
    return std::make_shared<const zipage::guide_vocabulary>(std::move(bytes));
  }();
  return vocab;
}

guided_machine compile(unsigned kind, std::string_view spec) {
  switch (kind % 5) {
    case 0: return zipage::compile_guided_regex(spec);
    case 1: return zipage::compile_guided_json(spec);
    case 2: return zipage::compile_guided_grammar(spec);
    case 3: return zipage::compile_guided_structural_tag(spec);
    default: {
      std::vector<std::string> choices;
      std::size_t at = 0;
      while (at <= spec.size()) {
        const std::size_t end = std::min(spec.find('\n', at), spec.size());
        choices.emplace_back(spec.substr(at, end - at));
        at = end + 1;
      }
      return zipage::compile_guided_choice(choices);
    }
  }
}

void walk(const guided_machine& machine, const zipage::guide& g, std::string_view steer) {
  const auto& vocab = g.vocabulary();
  std::vector<token_id> generated;
  std::string text;
  for (std::size_t step = 0; step < 12; ++step) {
    const zipage::guide_lookahead l = g.lookahead(generated);
    zipage_fuzz::require(l.alive);  // every token taken so far was allowed
    zipage_fuzz::require(machine.prefix(text));
    zipage_fuzz::require(l.at_match == machine.matches(text));
    zipage_fuzz::require(l.next != nullptr);
    if (machine.is_pushdown()) {  // the graph-structured stack against every stack kept apart, where those are few
      const auto plain = zipage_test::reference_after(machine.pda(), text);
      if (plain.exact) {
        const auto here = zipage::pushdown_after(machine.pda(), text);
        zipage_fuzz::require(here.empty() == plain.empty() && here.bottom_returned == plain.bottom_returned);
        std::vector<zipage::pushdown_detail::frame> tops, plain_tops;
        for (const auto& h : here.heads) tops.push_back(h.top);
        for (const auto& st : plain.stacks) plain_tops.push_back(st.back());
        for (auto* v : {&tops, &plain_tops}) {
          std::sort(v->begin(), v->end());
          v->erase(std::unique(v->begin(), v->end()), v->end());
        }
        zipage_fuzz::require(tops == plain_tops);
      }
    }
    std::vector<token_id> allowed;
    for (token_id t = 0; t < vocab.size(); ++t) {
      const std::string& b = vocab.bytes_of(t);
      const bool ok = l.next->allows(t);
      zipage_fuzz::require(ok == (!b.empty() && machine.prefix(text + b)));
      if (ok) allowed.push_back(t);
    }
    zipage_fuzz::require(!allowed.empty() || l.at_match);
    if (allowed.empty() || step >= steer.size() || (l.at_match && (steer[step] & 1) != 0)) return;
    const token_id t = allowed[static_cast<unsigned char>(steer[step]) % allowed.size()];
    generated.push_back(t);
    text += vocab.bytes_of(t);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view input = zipage_fuzz::text(data + 1, size - 1);
  const std::size_t nul = input.find('\0');
  const std::string_view spec = input.substr(0, nul);
  // Compiling is bounded (4,096 DFA states, 10^8 construction steps: ~1.4 s at -O2 for the worst regexes), but
  // under ASan and coverage ~50x slower: a 150-byte regex of '.' already takes ~5 s here. Longer constraints only
  // slow the search down (the step bound is what stops them, and the unit tests check it).
  if (spec.size() > 160) return 0;
  const std::string_view steer = nul == std::string_view::npos ? std::string_view{} : input.substr(nul + 1);
  zipage_fuzz::expect_only_zipage_errors([&] {
    // The guide takes a copy of the machine; the machine answers the checks.
    const guided_machine reference = compile(data[0], spec);
    const zipage::guide g(guided_machine(reference), vocabulary());
    walk(reference, g, steer);
  });
  return 0;
}
