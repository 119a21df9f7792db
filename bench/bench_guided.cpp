// Structured outputs on the host: the cost of a guided step (guide::lookahead, what make_logit_edits asks once per
// request and step) over Qwen3's 151,669-token vocabulary, along one JSON document of ~300 tokens, for
//   dfa       a schema without recursion that describes the document (one DFA, each state's tokens memoised),
//   pushdown  the same document under {"type": "object"} (free-form values at any depth: a pushdown guide),
//   ambiguous a text of parentheses under a grammar with exponentially many parses of each prefix (a pushdown
//             guide's graph-structured stack; cold only, its stacks differ at every step),
// warm (the guide has seen the document once: its per-state token sets are kept, as in a server where requests
// share a schema) and cold (a new guide: each state's first walk of the vocabulary included). The peer in the
// same run is the DFA guide: the counter s_per_step is the time of one step (docs/benchmarks.md gives the ratio).
//   build/bench/bench_guided [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "zipage/sampling/guided.hpp"
#include "zipage/tokenizer/bpe_tokenizer.hpp"
#include "zipage/tokenizer/detokenizer.hpp"

namespace {

using namespace zipage;

const char* const kDocument =
    R"({"name": "zipage", "version": 3, "tags": ["paged", "attention", "kv", "compression"], "owner": {"team": )"
    R"("inference", "members": [{"id": 1, "role": "lead", "skills": ["cuda", "c++"]}, {"id": 2, "role": "dev", )"
    R"("skills": ["python"]}]}, "limits": {"budget": 2048, "blocks": [16, 32, 64], "ratio": 0.95}, "notes": )"
    R"("Each request keeps a small bounded cache, however long it thinks.", "history": [{"date": "2026-12-01", )"
    R"("tokens_per_s": 9782.5, "ok": true}, {"date": "2026-12-07", "tokens_per_s": 15191.0, "ok": false}]})";

// A schema of the document's own shape, without recursion or free-form values: a DFA.
const char* const kSchema = R"({"type": "object", "properties": {
  "name": {"type": "string"}, "version": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}},
  "owner": {"type": "object", "properties": {"team": {"type": "string"}, "members": {"type": "array", "items": {
    "type": "object", "properties": {"id": {"type": "integer"}, "role": {"type": "string"},
    "skills": {"type": "array", "items": {"type": "string"}}}, "required": ["id", "role", "skills"]}}},
    "required": ["team", "members"]},
  "limits": {"type": "object", "properties": {"budget": {"type": "integer"}, "blocks": {"type": "array",
    "items": {"type": "integer"}}, "ratio": {"type": "number"}}, "required": ["budget", "blocks", "ratio"]},
  "notes": {"type": "string"}, "history": {"type": "array", "items": {"type": "object", "properties": {
    "date": {"type": "string"}, "tokens_per_s": {"type": "number"}, "ok": {"type": "boolean"}},
    "required": ["date", "tokens_per_s", "ok"]}}},
  "required": ["name", "version", "tags", "owner", "limits", "notes", "history"]})";

// A highly ambiguous grammar (the ways to parse a prefix grow exponentially with its length) and a text of ~400
// bytes it derives (a fixed random derivation tree).
const char* const kAmbiguous = R"g(root ::= "(" root "(" root ")" | "(" root ")" root | "")g";
std::string ambiguous_text() {
  std::mt19937 rng(5);
  std::string text;
  const auto derive = [&](const auto& self, int budget) -> void {
    if (budget <= 0) return;
    const bool first = rng() % 2 == 0;
    text += "(";
    self(self, budget / 2 - 1);
    text += first ? "(" : ")";
    self(self, budget / 2 - 1);
    if (first) text += ")";
  };
  while (text.size() < 400) derive(derive, 400 - static_cast<int>(text.size()));
  return text;
}

struct fixture {
  std::shared_ptr<const guide_vocabulary> vocab;
  std::vector<token_id> tokens;
  std::vector<token_id> ambiguous;
};

const fixture& data() {
  static const fixture f = [] {
    const std::string dir = ZIPAGE_BENCH_QWEN3_DIR;
    const auto tok = bpe_tokenizer::from_files(dir + "/tokenizer.json", dir + "/tokenizer_config.json");
    fixture out{guide_vocabulary_of(tok), tok.encode(kDocument, false), tok.encode(ambiguous_text(), false)};
    return out;
  }();
  return f;
}

guided_machine machine(bool pushdown) {
  return pushdown ? compile_guided_json(R"({"type": "object"})") : compile_guided_json(kSchema);
}

// One pass along the document: a lookahead per step, each step's token checked as allowed.
void walk(const guide& g, const std::vector<token_id>& tokens) {
  const std::span<const token_id> all(tokens);
  for (std::size_t n = 0; n <= tokens.size(); ++n) {
    const guide_lookahead ahead = g.lookahead(all.first(n));
    if (!ahead.alive || (n < tokens.size() && !ahead.next->allows(tokens[n])) ||
        (n == tokens.size() && !ahead.at_match)) {
      std::fprintf(stderr, "bench_guided: the document left the constraint at token %zu\n", n);
      std::abort();
    }
    benchmark::DoNotOptimize(ahead.next);
  }
}

// `which`: the DFA guide, the pushdown guide on the document, or the pushdown guide on the ambiguous grammar.
enum class constraint { dfa, pushdown, ambiguous };

void bm_step(benchmark::State& state, constraint which, bool warm) {
  const fixture& f = data();
  const bool pushdown = which != constraint::dfa;
  const guided_machine m = which == constraint::ambiguous ? compile_guided_grammar(kAmbiguous) : machine(pushdown);
  const std::vector<token_id>& tokens = which == constraint::ambiguous ? f.ambiguous : f.tokens;
  auto g = std::make_shared<const guide>(m, f.vocab);
  if (warm) walk(*g, tokens);
  for (auto _ : state) {
    if (!warm) {
      state.PauseTiming();
      g = std::make_shared<const guide>(m, f.vocab);
      state.ResumeTiming();
    }
    walk(*g, tokens);
  }
  const double steps = static_cast<double>(tokens.size() + 1);
  state.counters["s_per_step"] =  // seconds (printed with an SI prefix: 150u is 150 microseconds)
      benchmark::Counter(steps * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert, benchmark::Counter::OneK::kIs1000);
  state.counters["steps"] = steps;
  state.SetLabel(which == constraint::ambiguous ? "pushdown guide, an ambiguous grammar"
                 : pushdown                     ? "pushdown guide, {\"type\": \"object\"}"
                                                : "DFA guide, the document's schema");
}

}  // namespace

BENCHMARK_CAPTURE(bm_step, dfa_warm, constraint::dfa, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bm_step, pushdown_warm, constraint::pushdown, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bm_step, dfa_cold, constraint::dfa, false)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK_CAPTURE(bm_step, pushdown_cold, constraint::pushdown, false)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK_CAPTURE(bm_step, ambiguous_cold, constraint::ambiguous, false)->Unit(benchmark::kMillisecond)->Iterations(3);

BENCHMARK_MAIN();
