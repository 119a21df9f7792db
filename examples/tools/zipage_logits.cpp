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
#include <CLI/CLI.hpp>

#include <cstdio>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "zipage/backend/cpu/prefill_logits.hpp"
#include "zipage/engine/engine.hpp"
#include "zipage/models/hf_loader.hpp"

namespace {

using model_type = zipage::llama_model<zipage::cpu_backend>;

std::vector<zipage::token_id> parse_ids(const std::string& text) {
  std::vector<zipage::token_id> ids;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    std::size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    zipage::check(used == item.size() && v >= 0 && v < (1LL << 31), "--tokens: '", item, "' is not a token id");
    ids.push_back(static_cast<zipage::token_id>(v));
  }
  zipage::check(!ids.empty(), "--tokens: empty list");
  return ids;
}

void print_floats(const float* p, std::size_t n) {
  std::fputc('[', stdout);
  for (std::size_t i = 0; i < n; ++i) std::printf(i ? ",%.9g" : "%.9g", static_cast<double>(p[i]));
  std::fputc(']', stdout);
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
    std::size_t longest = 0;
    for (const auto& p : prompts) longest = std::max(longest, p.size());
    ec.num_blocks = static_cast<int>(prompts.size() * ((longest + static_cast<std::size_t>(steps)) / static_cast<std::size_t>(ec.block_size) + 2));
    zipage::engine<model_type> eng(std::move(model), ec);
    zipage::sampling_params sp;
    sp.temperature = 0.0f;
    sp.ignore_eos = true;
    sp.max_tokens = steps;
    const auto outs = eng.generate(prompts, sp);
    for (std::size_t i = 0; i < outs.size(); ++i) {
      zipage::check(outs[i].reason == zipage::finish_reason::length, "greedy generation of prompt ", i,
                    " failed: ", outs[i].error_message);
      greedy[i] = outs[i].output;
    }
  }

  const auto vocab = static_cast<std::size_t>(c.vocab_size);
  std::printf("{\"model\":\"%s\",\"vocab_size\":%d,\"prompts\":[", c.architecture.c_str(), c.vocab_size);
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    std::printf(i ? ",{\"tokens\":" : "{\"tokens\":");
    print_ids(prompts[i]);
    std::printf(",\"positions\":");
    print_ids(rows[i]);
    std::printf(",\"logits\":[");
    for (std::size_t r = 0; r < rows[i].size(); ++r) {
      if (r) std::fputc(',', stdout);
      print_floats(logits[i].data() + r * vocab, vocab);
    }
    std::printf("],\"greedy\":");
    print_ids(greedy[i]);
    std::fputc('}', stdout);
  }
  std::printf("]}\n");
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
  app.add_option("--steps,-n", steps, "greedy tokens to generate per prompt (0 = none)")->check(CLI::NonNegativeNumber);
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
