// zipage-logits: the reference numbers of a Hugging Face checkpoint on the CPU backend, as JSON, for
// comparing against another implementation (scripts/hf_parity.py compares against transformers).
//
//   zipage-logits --model DIR --tokens 1,2,3 [--tokens 4,5] [--steps 64] [--all-positions]
//
// For each prompt (token ids): the fp32 logits of its last position (every position with
// --all-positions), computed by one prefill with full KV, and the greedy continuation of --steps tokens
// produced by the engine (full KV, temperature 0, EOS ignored). Prints
//   {"model": ..., "vocab_size": V, "prompts": [{"tokens": [...], "positions": [...], "logits": [[...], ...],
//    "greedy": [...]}, ...]}
// A non-finite logit (a checkpoint with NaN weights) is written as null, with a warning on stderr; a greedy run
// cut short by the model's context has fewer than --steps tokens, also with a warning.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "../common/number_flags.hpp"

#include "zipage/backend/cpu/prefill_logits.hpp"
#include "zipage/engine/engine.hpp"
#include "zipage/models/hf_loader.hpp"

namespace {

using model_type = zipage::llama_model<zipage::cpu_backend>;

// Comma-separated ids, each a whole number written as one: an empty item is refused wherever it is ("1,,2" and
// "1,2," alike; a reader that drops a trailing empty item would accept the second).
std::vector<zipage::token_id> parse_ids(const std::string& text) {
  zipage::check(!text.empty(), "--tokens: empty list");
  std::vector<zipage::token_id> ids;
  for (std::size_t start = 0;;) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = std::string_view(text).substr(start, comma - start);
    zipage::check(!item.empty(), "--tokens '", text, "': item ", ids.size() + 1, " is empty");
    zipage::token_id v = -1;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    zipage::check(ec == std::errc{} && end == item.data() + item.size() && v >= 0, "--tokens: '", item,
                  "' is not a token id");
    ids.push_back(v);
    if (comma == text.size()) return ids;
    start = comma + 1;
  }
}

// Every prompt must fit the model's context, with or without --steps: one that does not is refused by number
// (a prefill past the context would give logits of positions the model was never trained on; with --steps the
// engine refused it in terms of a library field). --steps needs room for one generated token.
void check_context(const std::vector<std::vector<zipage::token_id>>& prompts, const zipage::model_config& c,
                   int steps) {
  if (c.max_context <= 0) return;  // unknown
  const std::size_t limit = static_cast<std::size_t>(c.max_context) - (steps > 0 ? 1 : 0);
  for (std::size_t i = 0; i < prompts.size(); ++i)
    zipage::check(prompts[i].size() <= limit, "--tokens (prompt ", i, "): ", prompts[i].size(),
                  " tokens are too long for the model's context of ", c.max_context, " tokens",
                  steps > 0 ? " (with --steps, at most one less: room for a generated token)" : "");
}

// The pool for the greedy run: each prompt's tokens plus --steps, cut at the model's context where generation
// stops, plus the write block; in 64 bits, since 17 prompts x 2^31 tokens wrapped an int to a negative pool.
int greedy_pool_blocks(const std::vector<std::vector<zipage::token_id>>& prompts, const zipage::model_config& c,
                       int steps, int block_size) {
  long long blocks = 0;
  for (const auto& p : prompts) {
    long long tokens = static_cast<long long>(p.size()) + steps;
    if (c.max_context > 0) tokens = std::min<long long>(tokens, c.max_context);
    blocks += (tokens + block_size - 1) / block_size + 1;
  }
  zipage::check(blocks <= std::numeric_limits<int>::max(), "--steps ", steps, " for ", prompts.size(),
                " prompts needs ", blocks, " KV blocks of ", block_size, " tokens, more than a pool can hold "
                "(2147483647): lower --steps or give fewer --tokens");
  return static_cast<int>(blocks);
}

// JSON has no NaN or infinity: a non-finite logit (a broken checkpoint) is written as null, and counted.
std::size_t print_floats(const float* p, std::size_t n) {
  std::size_t non_finite = 0;
  std::fputc('[', stdout);
  for (std::size_t i = 0; i < n; ++i) {
    if (i) std::fputc(',', stdout);
    if (std::isfinite(p[i])) {
      std::printf("%.9g", static_cast<double>(p[i]));
    } else {
      std::fputs("null", stdout);
      ++non_finite;
    }
  }
  std::fputc(']', stdout);
  return non_finite;
}

void print_ids(const std::vector<zipage::token_id>& ids) {
  std::fputc('[', stdout);
  for (std::size_t i = 0; i < ids.size(); ++i) std::printf(i ? ",%d" : "%d", ids[i]);
  std::fputc(']', stdout);
}

int run(const std::string& dir, const std::vector<std::string>& prompt_args, int steps, bool all_positions) {
  std::vector<std::vector<zipage::token_id>> prompts;
  for (const auto& p : prompt_args) prompts.push_back(parse_ids(p));
  model_type model = zipage::load_hf_checkpoint<zipage::cpu_backend>(dir);
  const zipage::model_config c = model.config();  // a copy: the model moves into the engine below
  for (const auto& p : prompts)
    for (zipage::token_id id : p)
      zipage::check(id < c.vocab_size, "--tokens: id ", id, " is outside the vocabulary of ", c.vocab_size);
  check_context(prompts, c, steps);

  std::vector<std::vector<std::int32_t>> rows(prompts.size());
  std::vector<std::vector<float>> logits(prompts.size());
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const auto n = static_cast<std::int32_t>(prompts[i].size());
    if (all_positions) {
      rows[i].resize(static_cast<std::size_t>(n));
      std::iota(rows[i].begin(), rows[i].end(), 0);
    } else {
      rows[i] = {n - 1};
    }
    logits[i] = zipage::cpu_prefill_logits(model, prompts[i], rows[i]);
  }

  std::vector<std::vector<zipage::token_id>> greedy(prompts.size());
  if (steps > 0) {
    zipage::engine_config ec;
    ec.num_blocks = greedy_pool_blocks(prompts, c, steps, ec.block_size);
    std::optional<zipage::engine<model_type>> built;
    try {
      built.emplace(std::move(model), ec);
    } catch (const zipage::error& e) {  // e.g. more than the machine's memory: the flag that sized the pool is named
      zipage::fail("--steps ", steps, " (the greedy run's KV pool of ", ec.num_blocks, " blocks): ", e.what());
    }
    auto& eng = *built;
    zipage::sampling_params sp;
    sp.temperature = 0.0f;
    sp.ignore_eos = true;
    sp.max_tokens = steps;
    const auto outs = eng.generate(prompts, sp);
    for (std::size_t i = 0; i < outs.size(); ++i) {
      zipage::check(outs[i].reason == zipage::finish_reason::length, "greedy generation of prompt ", i,
                    " failed: ", outs[i].error_message);
      greedy[i] = outs[i].output;
      if (static_cast<int>(greedy[i].size()) < steps)  // the engine stops a request at the model's context
        std::fprintf(stderr, "zipage-logits: warning: prompt %zu: the greedy run stopped at the model's context of %d "
                     "tokens, after %zu of --steps %d tokens\n", i, c.max_context, greedy[i].size(), steps);
    }
  }

  const auto vocab = static_cast<std::size_t>(c.vocab_size);
  std::vector<std::size_t> non_finite(prompts.size(), 0);
  std::printf("{\"model\":\"%s\",\"vocab_size\":%d,\"prompts\":[", c.architecture.c_str(), c.vocab_size);
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    std::printf(i ? ",{\"tokens\":" : "{\"tokens\":");
    print_ids(prompts[i]);
    std::printf(",\"positions\":");
    print_ids(rows[i]);
    std::printf(",\"logits\":[");
    for (std::size_t r = 0; r < rows[i].size(); ++r) {
      if (r) std::fputc(',', stdout);
      non_finite[i] += print_floats(logits[i].data() + r * vocab, vocab);
    }
    std::printf("],\"greedy\":");
    print_ids(greedy[i]);
    std::fputc('}', stdout);
  }
  std::printf("]}\n");
  for (std::size_t i = 0; i < prompts.size(); ++i)
    if (non_finite[i] > 0)
      std::fprintf(stderr, "zipage-logits: warning: prompt %zu: %zu logits are not finite (NaN or infinite; written "
                   "as null): the checkpoint's weights hold such values\n", i, non_finite[i]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zipage-logits: fp32 logits and greedy tokens of a Hugging Face checkpoint (CPU backend), as JSON"};
  std::string dir;
  std::vector<std::string> prompts;
  int steps = 0;
  bool all_positions = false;
  app.add_option("--model,-m", dir, "checkpoint directory (config.json + safetensors)")->required();
  app.add_option("--tokens", prompts, "a prompt as comma-separated token ids (repeatable)")->required();
  app.add_option("--steps,-n", steps, "greedy tokens to generate per prompt (0 = none)")->check(zipage_cli::count());
  app.add_flag("--all-positions", all_positions, "print the logits of every prompt position, not only the last");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "zipage-logits: %s (see --help)\n", e.what());
    return 2;
  }
  try {
    return run(dir, prompts, steps, all_positions);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zipage-logits: error: %s\n", e.what());
    return 1;
  }
}
