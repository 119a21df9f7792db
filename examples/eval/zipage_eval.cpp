// zipage-eval: evaluation tools.
//   fidelity  how closely each eviction policy follows full KV on a real model (below);
//   accuracy  pass@1 of every policy and budget on a reasoning test set (run_grid.cpp, datasets.cpp);
//   math      the same on GSM8K / MATH-500 / AIME / AMC JSONL sets with the chat template and \boxed{} answers.
//
// zipage-eval fidelity: how closely each eviction policy follows full KV on a real model.
//
// For every prompt, full KV generates a greedy continuation. Then, for each policy and budget:
//  - agreement: the policy's own greedy continuation against full KV's (matching prefix length and
//    the share of positions with the same token);
//  - perplexity: full KV's continuation scored by teacher forcing with the compressed cache, as a
//    ratio to full KV's own perplexity (1.00 = no loss).
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "../common/flag_terms.hpp"
#include "../common/number_flags.hpp"
#include "../common/text_lines.hpp"
#include "eval_common.hpp"
#include "zipage/engine/engine.hpp"
#include "zipage/gguf/gguf.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/policy/policies.hpp"
#include "zipage/tokenizer/bpe_tokenizer.hpp"
#include "zipage/tokenizer/spm_tokenizer.hpp"

namespace {

using model_type = zipage::llama_model<zipage::cpu_backend>;
using tokens = std::vector<zipage::token_id>;

struct options {
  std::string model;
  std::string prompts_file;
  int num_prompts = 16;
  std::size_t longest_prompt = 0;  // in tokens, once the prompts are encoded (the pool is sized from it)
  int max_tokens = 480;
  int block_size = zipage::default_block_size;
  int window = 8;  // fidelity's own default (its budgets are 64-256 tokens of the 260K model), not the method's W
  std::vector<int> budgets = {64, 128, 256};
  std::vector<std::string> policies;
};

struct reference {
  std::vector<tokens> prompts;
  std::vector<tokens> outputs;   // full KV greedy continuations
  std::vector<double> nll;       // their mean negative log-likelihood under full KV
  std::vector<tokens> sampled;   // full KV continuations sampled at temperature 1 (natural text, no loops)
  std::vector<double> sampled_nll;
};

struct fidelity {
  double mean_prefix = 0;     // mean length of the prefix identical to full KV
  double identical = 0;       // share of positions with the same token
  double ppl_ratio = 0;       // exp(mean NLL compressed - mean NLL full), greedy continuation
  double sampled_ppl_ratio = 0;  // the same on the sampled continuation
  double compressions = 0;    // per request
};

std::vector<std::string> builtin_prompts() {
  const char* starts[] = {"Once upon a time, there was a little girl named Lily.",
                          "Tom and his dog went to the park.",
                          "One day, a big bear found a red ball in the forest.",
                          "The sun was shining and the birds were singing.",
                          "Sara wanted to bake a cake for her mom.",
                          "Ben had a toy car that he loved very much.",
                          "There was a small fish who lived in a big pond.",
                          "Mia and Max were best friends.",
                          "A little bunny was hopping in the garden.",
                          "The old man had a magic hat.",
                          "Anna saw a shiny rock on the ground.",
                          "It was a rainy day and Tim was bored.",
                          "The princess lived in a tall castle.",
                          "Lucy found a lost kitten under a tree.",
                          "Jack wanted to fly like a bird.",
                          "Once upon a time, there was a happy frog."};
  return {std::begin(starts), std::end(starts)};
}

constexpr int max_num_seqs = 64;

// The pool for `requests` prompts at `budget` (0: full KV): every running request may hold its whole sequence
// (prompt + -n, no more than the model's context, where generation stops) plus the write block, and an evicting
// one at least its budget and the write block (B + 1, or the whole context when that is smaller, as the engine
// asks). Computed in 64 bits; a pool past an int is an error naming the flags that size it.
int pool_blocks(const options& o, const zipage::model_config& c, std::size_t requests, int budget) {
  const long long bs = o.block_size;
  long long tokens = static_cast<long long>(o.longest_prompt) + o.max_tokens;
  if (c.max_context > 0) tokens = std::min<long long>(tokens, c.max_context);
  long long per_request = (tokens + bs - 1) / bs + 1;
  if (budget > 0) {
    long long budget_blocks = budget / bs + 1;
    if (c.max_context > 0) budget_blocks = std::min<long long>(budget_blocks, (c.max_context + bs - 1) / bs);
    per_request = std::max(per_request, budget_blocks);
  }
  const long long running = std::min<long long>(static_cast<long long>(requests), max_num_seqs);
  const long long blocks = per_request * running;
  zipage::check(blocks <= std::numeric_limits<int>::max(), "--budgets ", budget, " with --num-prompts ", running,
                " (running at once) and -n ", o.max_tokens, " needs ", blocks, " KV blocks of --block-size ", bs,
                ", more than a pool can hold (2147483647)");
  return static_cast<int>(blocks);
}

template <class Policy>
zipage::engine<model_type, Policy> make_engine(const zipage::gguf::file& file, const options& o, std::size_t requests,
                                               int budget) {
  auto model = zipage::load_llama_gguf(file);
  zipage::engine_config cfg;
  cfg.block_size = o.block_size;
  cfg.window = o.window;
  cfg.budget_tokens = budget;
  cfg.num_blocks = pool_blocks(o, model.config(), requests, Policy::evicts ? budget : 0);
  cfg.max_num_seqs = max_num_seqs;
  return zipage::engine<model_type, Policy>(std::move(model), cfg);
}

zipage::sampling_params greedy(int max_tokens, float temperature = 0.0f) {
  zipage::sampling_params p;
  p.temperature = temperature;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.logprobs = true;
  return p;
}

double mean_nll(const std::vector<float>& logprobs) {
  return -std::accumulate(logprobs.begin(), logprobs.end(), 0.0) / static_cast<double>(logprobs.size());
}

template <class Engine>
std::vector<zipage::request_output> run_all(Engine& eng, const std::vector<tokens>& prompts, const std::vector<tokens>* forced,
                                            int max_tokens, float temperature = 0.0f) {
  std::vector<zipage::request_id> ids;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    auto params = greedy(max_tokens, temperature);
    params.seed = i;
    ids.push_back(forced ? eng.add_forced_request(prompts[i], (*forced)[i]) : eng.add_request(prompts[i], params));
  }
  eng.run_to_completion();
  std::vector<zipage::request_output> out;
  for (auto id : ids) out.push_back(eng.take_output(id));
  return out;
}

reference full_kv_reference(const zipage::gguf::file& file, const options& o, std::vector<tokens> prompts) {
  auto eng = make_engine<zipage::full_kv>(file, o, prompts.size(), 64);
  reference ref;
  ref.prompts = std::move(prompts);
  for (auto& out : run_all(eng, ref.prompts, nullptr, o.max_tokens)) {
    ref.nll.push_back(mean_nll(out.logprobs));
    ref.outputs.push_back(std::move(out.output));
  }
  for (auto& out : run_all(eng, ref.prompts, nullptr, o.max_tokens, 1.0f)) {
    ref.sampled_nll.push_back(mean_nll(out.logprobs));
    ref.sampled.push_back(std::move(out.output));
  }
  return ref;
}

template <class Policy>
fidelity measure(const zipage::gguf::file& file, const options& o, const reference& ref, int budget) {
  fidelity f;
  auto eng = make_engine<Policy>(file, o, ref.prompts.size(), budget);
  const auto own = run_all(eng, ref.prompts, nullptr, o.max_tokens);
  const auto forced = run_all(eng, ref.prompts, &ref.outputs, o.max_tokens);
  const auto forced_sampled = run_all(eng, ref.prompts, &ref.sampled, o.max_tokens);
  const auto n = static_cast<double>(ref.prompts.size());
  double nll_delta = 0, sampled_delta = 0;
  for (std::size_t i = 0; i < ref.prompts.size(); ++i) {
    const auto& a = own[i].output;
    const auto& b = ref.outputs[i];
    std::size_t prefix = 0;
    while (prefix < a.size() && prefix < b.size() && a[prefix] == b[prefix]) ++prefix;
    std::size_t same = 0;
    for (std::size_t j = 0; j < std::min(a.size(), b.size()); ++j) same += a[j] == b[j];
    f.mean_prefix += static_cast<double>(prefix) / n;
    f.identical += static_cast<double>(same) / static_cast<double>(b.size()) / n;
    nll_delta += (mean_nll(forced[i].logprobs) - ref.nll[i]) / n;
    sampled_delta += (mean_nll(forced_sampled[i].logprobs) - ref.sampled_nll[i]) / n;
    f.compressions += own[i].num_compressions / n;
  }
  f.ppl_ratio = std::exp(nll_delta);
  f.sampled_ppl_ratio = std::exp(sampled_delta);
  return f;
}

template <class Policy>
void report(const zipage::gguf::file& file, const options& o, const reference& ref, Policy policy) {
  const std::string name(policy.name());
  if (!o.policies.empty() && std::find(o.policies.begin(), o.policies.end(), name) == o.policies.end()) return;
  for (int budget : o.budgets) {
    const auto f = measure<Policy>(file, o, ref, budget);
    std::printf("| %-13s | %6d | %11.1f | %8.1f%% | %16.3f | %17.3f | %12.1f |\n", name.c_str(), budget,
                f.mean_prefix, 100.0 * f.identical, f.ppl_ratio, f.sampled_ppl_ratio, f.compressions);
    std::fflush(stdout);
  }
}

int fidelity_command(options o) {
  const auto file = zipage::gguf::file::open(o.model);
  // The prompts' ids by the file's own vocabulary: SentencePiece (llama) or byte-level BPE (Qwen, Llama 3).
  std::function<std::vector<zipage::token_id>(const std::string&)> encode;
  std::optional<zipage::spm_tokenizer> spm;
  std::optional<zipage::bpe_tokenizer> bpe;
  if (zipage::gguf_has_bpe_vocab(file)) {
    bpe.emplace(zipage::bpe_tokenizer::from_gguf(file));
    encode = [&](const std::string& t) { return bpe->encode(t, bpe->add_bos()); };
  } else {
    spm.emplace(zipage::spm_tokenizer::from_gguf(file));
    encode = [&](const std::string& t) { return spm->encode(t, spm->add_bos()); };  // as the file asks
  }
  // Every flag is checked before the reference runs and the table starts.
  for (int b : o.budgets)
    zipage::check(b > 0 && b % o.block_size == 0, "--budgets: ", b, " is not a positive multiple of --block-size ",
                  o.block_size);
  zipage::check(o.window <= o.block_size, "--window ", o.window, " is larger than --block-size ", o.block_size,
                " (the window's queries are recorded in the last W slots of a block)");
  std::string known;
  for (auto n : zipage::builtin_policy_names()) known += (known.empty() ? "" : ", ") + std::string(n);
  for (const auto& p : o.policies) {
    bool found = false;
    for (auto n : zipage::builtin_policy_names()) found = found || n == p;
    zipage::check(found, "--policies: unknown policy '", p, "' (known: ", known, ")");
  }
  std::vector<std::string> texts = builtin_prompts();
  if (!o.prompts_file.empty()) {
    std::ifstream in = zipage_cli::open_lines(o.prompts_file, "prompts file");
    texts.clear();
    for (std::string line; std::getline(in, line);)
      if (const auto text = zipage_cli::without_cr(line); !text.empty()) texts.emplace_back(text);
  }
  texts.resize(std::min<std::size_t>(texts.size(), static_cast<std::size_t>(o.num_prompts)));
  zipage::check(!texts.empty(), "no prompts");
  std::vector<tokens> prompts;
  for (const auto& t : texts) prompts.push_back(encode(t));
  for (const auto& p : prompts) o.longest_prompt = std::max(o.longest_prompt, p.size());
  // Every budget's pool is sized (and checked) before the reference runs, so a budget cannot fail halfway.
  const zipage::model_config config = zipage::llama_config_from_gguf(file);
  for (int b : o.budgets) (void)pool_blocks(o, config, prompts.size(), b);

  const auto start = std::chrono::steady_clock::now();
  const reference ref = full_kv_reference(file, o, prompts);
  auto mean_ppl = [](const std::vector<double>& nll) {
    double sum = 0;
    for (double x : nll) sum += x;
    return std::exp(sum / static_cast<double>(nll.size()));
  };
  std::printf("prompts: %zu, tokens per prompt: %d, block %d, window %d; full-KV perplexity of its greedy "
              "continuation %.3f, of its sampled (T=1) continuation %.3f\n\n",
              prompts.size(), o.max_tokens, o.block_size, o.window, mean_ppl(ref.nll), mean_ppl(ref.sampled_nll));
  std::printf("| policy        | budget | mean prefix | identical | PPL ratio greedy | PPL ratio sampled | compressions |\n");
  std::printf("|---------------|-------:|------------:|----------:|-----------------:|------------------:|-------------:|\n");
  report(file, o, ref, zipage::streaming_llm{});
  report(file, o, ref, zipage::h2o{});
  report(file, o, ref, zipage::snapkv{});
  report(file, o, ref, zipage::rkv{});
  report(file, o, ref, zipage::gkv{});
  report(file, o, ref, zipage::zipage_policy{});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "zipage-eval: done in %.1f s\n", seconds);
  return 0;
}

}  // namespace

// Library errors in zipage-eval's flags (zipage-generate's in_flag_terms, with this tool's table). The grid has no
// --allow-beyond-context (prompts are checked against the context by row first), fidelity sizes its own pool.
constexpr zipage_cli::flag_term grid_flag_terms[] = {
    {"; set engine_config::allow_beyond_context to run past it", ""},
    {"engine_config::max_batched_tokens", "--max-batched-tokens"},
    {"engine_config::budget_tokens", "--budgets"},
    {"engine_config::max_num_seqs", "--max-num-seqs"},
    {"engine_config::block_size", "--block-size"},
    {"engine_config::num_blocks", "--num-blocks"},
    {"engine_config::window", "--window"},
    {"engine_config::kv_cache_bytes", "--kv-cache-mib"}};
constexpr zipage_cli::flag_term fidelity_flag_terms[] = {
    {"; set engine_config::allow_beyond_context to run past it", ""},
    {"lower engine_config::budget_tokens or give the pool more blocks", "lower --budgets"},
    {"from engine_config::num_blocks", "sized from --num-prompts, -n and --budgets"},
    {"engine_config::budget_tokens", "--budgets"},
    {"engine_config::block_size", "--block-size"},
    {"engine_config::window", "--window"}};

// CLI11 reads an unknown first word as a missing subcommand ("A subcommand is required"): named instead.
std::string unknown_subcommand(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return {};
  const std::string word = argv[1];
  std::string known;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->get_name() == word) return {};
    known += (known.empty() ? "" : ", ") + sub->get_name();
  }
  return "unknown subcommand '" + word + "' (subcommands: " + known + ")";
}

int main(int argc, char** argv) {
  CLI::App app{"zipage-eval: evaluation tools"};
  app.require_subcommand(1);
  options o;
  auto* fid = app.add_subcommand("fidelity", "agreement and perplexity of each eviction policy against full KV");
  fid->add_option("--model,-m", o.model, "GGUF model (default: the bundled stories260K)");
  fid->add_option("--prompts", o.prompts_file, "one prompt per line (default: 16 built-in story openings)");
  fid->add_option("--num-prompts", o.num_prompts, "prompts to use")->check(zipage_cli::positive_count());
  fid->add_option("-n,--max-tokens", o.max_tokens, "greedy tokens per prompt")->check(zipage_cli::positive_count());
  fid->add_option("--block-size", o.block_size, "KV block size")->check(zipage_cli::positive_count());
  fid->add_option("--window", o.window, "query window W")->check(zipage_cli::positive_count());
  fid->add_option("--budgets", o.budgets, "token budgets (multiples of the block size)")->delimiter(',');
  fid->add_option("--policies", o.policies, "subset of policies")->delimiter(',');

  zipage_eval::grid_options acc;
  acc.command = "accuracy";
  auto* acc_cmd = app.add_subcommand("accuracy", "pass@1 of every policy and budget on a reasoning test set (JSONL)");
  zipage_eval::add_grid_flags(*acc_cmd, acc);
  acc_cmd->add_option("--levels", acc.levels, "comma-separated levels to keep (e.g. L1,L3)")->delimiter(',');

  zipage_eval::grid_options math;
  math.command = "math";
  math.samples = 32;
  math.max_tokens = 32768;
  math.chat = true;
  auto* math_cmd = app.add_subcommand("math", "pass@1 on GSM8K / MATH-500 / AIME / AMC JSONL sets (chat template, \\boxed{})");
  zipage_eval::add_grid_flags(*math_cmd, math);
  math_cmd->add_flag("!--raw", math.chat, "feed the problem as raw text instead of the chat template");
  math_cmd->add_flag("!--no-thinking", math.thinking, "Qwen3: thinking off (an empty <think></think> block)");
  if (const std::string unknown = unknown_subcommand(app, argc, argv); !unknown.empty()) {
    std::fprintf(stderr, "zipage-eval: %s (see --help)\n", unknown.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "zipage-eval: %s (see --help)\n", e.what());
    return 2;
  }
  try {
    if (*acc_cmd) {
      const auto problems = zipage_eval::read_accuracy_set(acc.data, acc.levels, acc.limit);
      return zipage_eval::run_grid(acc, problems, zipage_eval::accuracy_task());
    }
    if (*math_cmd) {
      const auto problems = zipage_eval::read_math_set(math.data, math.limit);
      return zipage_eval::run_grid(math, problems, zipage_eval::math_task());
    }
    if (o.model.empty()) o.model = ZIPAGE_DEFAULT_MODEL;
    return fidelity_command(o);
  } catch (const std::exception& e) {
    const std::string message = *fid ? zipage_cli::in_flag_terms(e.what(), fidelity_flag_terms)
                                     : zipage_cli::in_flag_terms(e.what(), grid_flag_terms);
    std::fprintf(stderr, "zipage-eval: error: %s\n", message.c_str());
    return 1;
  }
}
