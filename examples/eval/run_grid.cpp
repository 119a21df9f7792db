// zipage-eval accuracy / math: the (policy, budget) grid through the engine, and the report.
//
// Every cell (one policy at one budget) is one engine running all its requests as one continuous batch:
// per problem, n sampled requests (seed + problem * n + sample) and one greedy request. Full KV runs first;
// --budget-fractions are fractions of its mean sequence length (prompt + generated tokens).
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/dtype_flags.hpp"
#include "../common/number_flags.hpp"
#include "eval_common.hpp"
#include "zipage/core/json.hpp"
#include "zipage/core/kv_cache_dtype.hpp"
#include "zipage/core/weight_dtype.hpp"
#include "zipage/engine/engine.hpp"
#include "zipage/eval/stats.hpp"
#include "zipage/gguf/gguf.hpp"
#include "zipage/models/gguf_generation.hpp"
#include "zipage/models/hf_loader.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/policy/policies.hpp"
#include "zipage/tokenizer/vocab_check.hpp"
#include "zipage/tokenizer/detokenizer.hpp"

#if ZIPAGE_EVAL_CUDA
#include "zipage/backend/cuda/cuda_backend.hpp"
#include "zipage/cuda/device.hpp"
#endif

namespace zipage_eval {

namespace {

// A float setting as the user wrote it: 0.6f widened to double is 0.6000000238418579 in JSON; the float's shortest
// decimal (to_chars) read back as a double is 0.6.
double as_written(float x) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, x).ptr;
  return std::strtod(std::string(text, end).c_str(), nullptr);
}

// --json-out is written once, at the end, through PATH.tmp renamed over PATH: a run that fails (a model that does not
// load, an exception in a cell) leaves no file, or the file that was there untouched, instead of an empty or half file.
std::string json_tmp_path(const std::string& path) { return path + ".tmp"; }

// The file --json-out names, through its symbolic links (a dangling one included): the rename replaces that file,
// not a link to it (a link to a results file kept elsewhere stays a link).
std::string json_out_file(const std::string& path) {
  std::filesystem::path p = path;
  std::error_code ec;
  for (int hops = 0; hops < 40 && std::filesystem::is_symlink(p, ec); ++hops) {
    const std::filesystem::path to = std::filesystem::read_symlink(p, ec);
    if (ec) break;
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
  return p.string();
}

// Before hours of cells run, not after: PATH.tmp can be created (it is removed again) and a PATH already there can be
// read (its lines are kept ahead of this run's). Creates nothing.
void check_json_out(const std::string& named) {
  std::error_code ec;
  const std::string path = json_out_file(named);
  const std::string tmp = json_tmp_path(path);
  zipage::check(!std::filesystem::is_directory(path, ec), "--json-out: '", path, "' is a directory");
  if (std::filesystem::exists(path, ec))
    zipage::check(std::ifstream(path).good(), "--json-out: cannot read '", path, "' (its lines are kept)");
  const bool writable = std::ofstream(tmp, std::ios::app).good();
  std::filesystem::remove(tmp, ec);
  zipage::check(writable, "--json-out: cannot write '", path, "'");
}

// PATH's lines, then `lines`, written to PATH.tmp and renamed over PATH (so --json-out still appends).
void write_json_out(const std::string& named, const std::string& lines) {
  const std::string path = json_out_file(named);
  const std::string tmp = json_tmp_path(path);
  std::error_code ec;
  std::string kept;
  if (std::filesystem::exists(path, ec)) {
    std::ifstream in(path, std::ios::binary);
    kept.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    zipage::check(!in.bad(), "--json-out: cannot read '", path, "'");
    if (!kept.empty() && kept.back() != '\n') kept += '\n';  // a last line without its newline stays a line
  }
  bool written = false;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << kept << lines;
    out.flush();
    written = out.good();
  }
  if (written) std::filesystem::rename(tmp, path, ec);
  if (!written || ec) std::filesystem::remove(tmp, ec);
  zipage::check(written && !ec, "--json-out: cannot write '", path, "'");
}


using zipage::token_id;
using tokens = std::vector<token_id>;

// The text side of a model: prompts to tokens, tokens to text.
struct text_io {
  std::function<tokens(const std::string&)> encode;
  std::function<zipage::streaming_detokenizer(std::span<const token_id>)> make_detokenizer;
  token_id eos = -1;  // the tokenizer's own end of turn
};

struct cell {
  std::string policy;
  int budget = 0;  // tokens; 0 for full_kv
  double fraction = 0;  // of the full-KV mean sequence length, when the budget came from one
};

struct request_result {
  std::optional<std::string> answer;  // extracted
  bool correct = false;
  int generated = 0;
  int prompt = 0;
  zipage::finish_reason reason = zipage::finish_reason::none;
};

struct cell_result {
  cell c;
  std::vector<std::vector<request_result>> sampled;  // [problem][sample]
  std::vector<request_result> greedy;                 // [problem]
  std::vector<tokens> greedy_tokens;                  // [problem]
  zipage::engine_stats stats;
  double seconds = 0;
  int failed = 0;
  std::string first_error;

  [[nodiscard]] std::size_t requests() const {
    std::size_t n = greedy.size();
    for (const auto& s : sampled) n += s.size();
    return n;
  }
  [[nodiscard]] std::vector<double> per_problem_pass() const {
    std::vector<double> p;
    for (const auto& s : sampled) {
      double c = 0;
      for (const auto& r : s) c += r.correct;
      p.push_back(s.empty() ? 0.0 : c / static_cast<double>(s.size()));
    }
    return p;
  }
  [[nodiscard]] std::size_t greedy_correct() const {
    std::size_t c = 0;
    for (const auto& r : greedy) c += r.correct;
    return c;
  }
  [[nodiscard]] double mean_trace() const {  // sampled requests
    double sum = 0, n = 0;
    for (const auto& s : sampled)
      for (const auto& r : s) sum += r.generated, n += 1;
    return n > 0 ? sum / n : 0.0;
  }
  [[nodiscard]] double mean_greedy_trace() const {
    double sum = 0;
    for (const auto& r : greedy) sum += r.generated;
    return greedy.empty() ? 0.0 : sum / static_cast<double>(greedy.size());
  }
  [[nodiscard]] double mean_sequence() const {  // every request: prompt + generated
    double sum = 0, n = 0;
    for (const auto& s : sampled)
      for (const auto& r : s) sum += r.prompt + r.generated, n += 1;
    for (const auto& r : greedy) sum += r.prompt + r.generated, n += 1;
    return n > 0 ? sum / n : 0.0;
  }
};

struct run_context {
  grid_options* o = nullptr;
  const std::vector<problem>* problems = nullptr;
  const task* t = nullptr;
  std::vector<tokens> prompts;
  zipage::sampling_params sampled, greedy;
  std::string device_name;
};

// The checkpoint's sampling settings (generation_config.json), else temperature default_temperature;
// flags override either.
void resolve_sampling(grid_options& o, zipage::sampling_params& s) {
  s = {};
  s.temperature = o.default_temperature;
  std::error_code ec;
  zipage::generation_defaults gen;
  if (std::filesystem::is_directory(o.model, ec)) gen = zipage::load_generation_config(o.model);
  else gen = zipage::generation_defaults_from_gguf(zipage::gguf::file::open(o.model));
  gen.apply(s);
  if (o.temperature >= 0) s.temperature = o.temperature;
  if (o.top_p >= 0) s.top_p = o.top_p;
  if (o.top_k != grid_options::top_k_not_given) s.top_k = std::max(o.top_k, 0);  // -1: off, as vLLM
  if (o.min_p >= 0) s.min_p = o.min_p;
  s.max_tokens = o.max_tokens;
  s.validate();
  if (!o.quiet)
    std::fprintf(stderr, "sampling (%s; flags override): temperature %g, top_p %g, top_k %d, min_p %g, repetition penalty %g\n",
                 gen.sets_sampling() ? gen.source.c_str() : "no generation_config.json sampling: defaults", s.temperature,
                 s.top_p, s.top_k, s.min_p, s.repetition_penalty);
}

std::vector<std::string> chosen_policies(const grid_options& o) {
  std::vector<std::string> known;
  for (auto n : zipage::builtin_policy_names()) known.emplace_back(n);
  if (o.policies.empty()) return known;
  std::string list;
  for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
  std::vector<std::string> out;
  for (const auto& p : o.policies) {
    zipage::check(std::find(known.begin(), known.end(), p) != known.end(), "--policies: unknown policy '", p,
                  "' (known: ", list, ")");
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  }
  // full_kv first: the other cells are compared with it.
  std::stable_partition(out.begin(), out.end(), [](const std::string& p) { return p == "full_kv"; });
  return out;
}

// On a GPU the pool takes --gpu-memory-utilization of the device, but no more than max_num_seqs requests
// of the longest sequence could fill (as zipage-generate caps it at the model's context).
template <class Backend>
void size_pool(zipage::engine_config& cfg, const grid_options& o, const zipage::model_config& c, const Backend& backend,
               bool compress, int longest) {
  cfg.kv_cache_bytes = static_cast<std::size_t>(o.kv_cache_mib * 1024.0 * 1024.0);
  if constexpr (requires { backend.memory_info(); }) {
    cfg.gpu_memory_utilization = o.gpu_memory_utilization;
    std::size_t scale_bytes = 0;  // a quantised (FP8) cache's per token-head scales
    if constexpr (requires { backend.kv_scale_bytes(); }) scale_bytes = backend.kv_scale_bytes();
    const double per_token =
        static_cast<double>(zipage::kv_bytes_per_token(c, backend.kv_element_bytes(), compress, scale_bytes));
    cfg.max_kv_cache_bytes = static_cast<std::size_t>(per_token * o.max_num_seqs * (longest + o.block_size));
  }
}

bool progress_to_terminal() { return ::isatty(STDERR_FILENO) != 0; }

template <class Policy, class Backend>
cell_result run_cell(run_context& ctx, const cell& c, zipage::llama_model<Backend> model, const Backend& backend,
                     const text_io& io) {
  const grid_options& o = *ctx.o;
  zipage::engine_config cfg;
  cfg.block_size = o.block_size;
  cfg.window = o.window;
  if (Policy::evicts) cfg.budget_tokens = c.budget;
  cfg.num_blocks = o.num_blocks;
  cfg.max_num_seqs = o.max_num_seqs;
  cfg.max_batched_tokens = o.max_batched_tokens;
  cfg.make_detokenizer = io.make_detokenizer;
  int longest = 0;
  for (const auto& p : ctx.prompts) longest = std::max(longest, static_cast<int>(p.size()));
  size_pool(cfg, o, model.config(), backend, Policy::evicts, longest + o.max_tokens);
  zipage::engine<zipage::llama_model<Backend>, Policy, zipage::zipage_scheduler, Backend> eng(std::move(model), cfg, Policy{},
                                                                                               backend);
  const std::size_t n_problems = ctx.prompts.size();
  const auto n = static_cast<std::size_t>(o.samples);
  std::vector<std::vector<zipage::request_id>> sampled_ids(n_problems);
  std::vector<zipage::request_id> greedy_ids;
  for (std::size_t i = 0; i < n_problems; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      auto params = ctx.sampled;
      params.seed = o.seed + i * n + j;
      sampled_ids[i].push_back(eng.add_request(ctx.prompts[i], params));
    }
    greedy_ids.push_back(eng.add_request(ctx.prompts[i], ctx.greedy));
  }
  const std::size_t total = n_problems * (n + 1);

  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  const bool draw = !o.quiet && progress_to_terminal();
  std::size_t finished = 0;
  std::int64_t generated = 0;
  double next_draw = 0;
  while (eng.has_unfinished()) {
    for (const auto& ev : eng.step()) {
      ++generated;
      finished += ev.finished;
    }
    if (draw && elapsed() >= next_draw) {
      std::fprintf(stderr, "\r%s %d: %zu/%zu requests, %lld tokens, %.0f tok/s   ", c.policy.c_str(), c.budget, finished,
                   total, static_cast<long long>(generated), generated / std::max(elapsed(), 1e-9));
      next_draw = elapsed() + 0.5;
    }
  }
  if (draw) std::fprintf(stderr, "\n");

  cell_result r;
  r.c = c;
  r.seconds = elapsed();
  r.stats = eng.stats();
  auto collect = [&](zipage::request_id id, const problem& p, tokens* keep) {
    auto out = eng.take_output(id);
    request_result rr;
    rr.reason = out.reason;
    rr.generated = static_cast<int>(out.output.size());
    rr.prompt = static_cast<int>(out.prompt.size());
    if (out.reason == zipage::finish_reason::error) {
      if (r.failed++ == 0) r.first_error = out.error_message;
    } else {
      rr.answer = ctx.t->extract(out.text);
      rr.correct = rr.answer && ctx.t->correct(*rr.answer, p);
    }
    if (keep) *keep = std::move(out.output);
    return rr;
  };
  r.sampled.resize(n_problems);
  r.greedy_tokens.resize(n_problems);
  for (std::size_t i = 0; i < n_problems; ++i) {
    const problem& p = (*ctx.problems)[i];
    for (auto id : sampled_ids[i]) r.sampled[i].push_back(collect(id, p, nullptr));
    r.greedy.push_back(collect(greedy_ids[i], p, &r.greedy_tokens[i]));
  }
  if (!o.quiet)
    std::fprintf(stderr, "%s%s%s: %zu requests, %lld tokens in %.1f s (%.0f tok/s), %lld evicted, %d failed\n",
                 c.policy.c_str(), c.budget > 0 ? " at " : "", c.budget > 0 ? std::to_string(c.budget).c_str() : "",
                 r.requests(), static_cast<long long>(r.stats.generated_tokens), r.seconds,
                 r.stats.generated_tokens / std::max(r.seconds, 1e-9), static_cast<long long>(r.stats.tokens_evicted),
                 r.failed);
  if (r.failed > 0) std::fprintf(stderr, "zipage-eval: %d request(s) failed, the first: %s\n", r.failed, r.first_error.c_str());
  return r;
}

// Greedy answers full KV gets right and the policy does not: where the policy's greedy tokens first leave
// full KV's, as a fraction of full KV's trace.
nlohmann::json lost_answers(const cell_result& full, const cell_result& r, const std::vector<problem>& problems) {
  nlohmann::json lost = nlohmann::json::array();
  for (std::size_t i = 0; i < problems.size(); ++i) {
    if (!full.greedy[i].correct || r.greedy[i].correct) continue;
    const tokens& a = full.greedy_tokens[i];
    const tokens& b = r.greedy_tokens[i];
    std::size_t d = 0;
    while (d < a.size() && d < b.size() && a[d] == b[d]) ++d;
    lost.push_back({{"id", problems[i].id},
                    {"level", problems[i].level},
                    {"diverge_token", d},
                    {"diverge_fraction", a.empty() ? 0.0 : static_cast<double>(d) / static_cast<double>(a.size())},
                    {"full_kv_trace_tokens", a.size()},
                    {"policy_trace_tokens", b.size()},
                    {"policy_answer", r.greedy[i].answer ? nlohmann::json(*r.greedy[i].answer) : nlohmann::json(nullptr)}});
  }
  return lost;
}

nlohmann::json ci_json(const zipage::eval::interval& i) { return nlohmann::json::array({i.lo, i.hi}); }

std::string budget_label(const cell& c) {
  if (c.policy == "full_kv") return "full";
  char buf[64];
  if (c.fraction > 0) std::snprintf(buf, sizeof buf, "%d (%.3g)", c.budget, c.fraction);
  else std::snprintf(buf, sizeof buf, "%d", c.budget);
  return buf;
}

void report(run_context& ctx, const std::vector<cell_result>& results, std::string* json_out) {
  const grid_options& o = *ctx.o;
  const auto& problems = *ctx.problems;
  const cell_result* full = nullptr;
  for (const auto& r : results)
    if (r.c.policy == "full_kv") full = &r;
  const double full_pass = full ? zipage::eval::mean_ci_normal(full->per_problem_pass()).mean : 0.0;
  const double full_greedy = full ? static_cast<double>(full->greedy_correct()) / static_cast<double>(problems.size()) : 0.0;

  std::printf("\n## zipage-eval %s: %s on %s\n\n", o.command.c_str(), o.model.c_str(), o.data.c_str());
  std::printf("problems: %zu, samples per problem: %d, requests per cell: %zu; sampling: temperature %g, top_p %g, top_k %d; "
              "max tokens %d; block size %d, window %d; seed %llu; device %s\n",
              problems.size(), o.samples, problems.size() * (static_cast<std::size_t>(o.samples) + 1), ctx.sampled.temperature,
              ctx.sampled.top_p, ctx.sampled.top_k, o.max_tokens, o.block_size, o.window,
              static_cast<unsigned long long>(o.seed), ctx.device_name.c_str());
  std::printf("answer: %s\n", ctx.t->extraction.c_str());
  std::printf("pass@1: mean over problems of the share of the n samples that are right; 95%% CI: normal approximation "
              "over problems. greedy: one greedy sample per problem; 95%% CI: Wilson. %% of full KV: pass@1 / full KV's.\n\n");
  std::printf("| policy        | budget        | pass@1 | 95%% CI         | %% of full KV | greedy | 95%% CI         | "
              "trace tokens | evicted/request | tok/s    | failed |\n");
  std::printf("|---------------|---------------|-------:|----------------|-------------:|-------:|----------------|"
              "-------------:|----------------:|---------:|-------:|\n");
  for (const auto& r : results) {
    const auto pass = zipage::eval::mean_ci_normal(r.per_problem_pass());
    const auto greedy = zipage::eval::wilson_interval(r.greedy_correct(), problems.size());
    const auto requests = static_cast<double>(r.requests());
    const double evicted = static_cast<double>(r.stats.tokens_evicted) / requests;
    const double tps = static_cast<double>(r.stats.generated_tokens) / std::max(r.seconds, 1e-9);
    char pct[32] = "-";
    if (full && full_pass > 0) std::snprintf(pct, sizeof pct, "%.1f%%", 100.0 * pass.mean / full_pass);
    std::printf("| %-13s | %-13s | %6.3f | [%5.3f, %5.3f] | %12s | %6.3f | [%5.3f, %5.3f] | %12.1f | %15.1f | %8.1f | %6d |\n",
                r.c.policy.c_str(), budget_label(r.c).c_str(), pass.mean, pass.lo, pass.hi, pct, greedy.mean, greedy.lo,
                greedy.hi, r.mean_trace(), evicted, tps, r.failed);
    if (!json_out) continue;
    std::map<std::string, std::pair<std::vector<double>, std::size_t>> per_level;  // pass shares, greedy right
    const auto shares = r.per_problem_pass();
    for (std::size_t i = 0; i < problems.size(); ++i) {
      auto& l = per_level[problems[i].level];
      l.first.push_back(shares[i]);
      l.second += r.greedy[i].correct;
    }
    nlohmann::json levels = nlohmann::json::object();
    for (const auto& [name, l] : per_level) {
      const auto lp = zipage::eval::mean_ci_normal(l.first);
      const auto lg = zipage::eval::wilson_interval(l.second, l.first.size());
      levels[name] = {{"problems", l.first.size()}, {"pass_at_1", lp.mean}, {"pass_at_1_ci", ci_json(lp)},
                      {"greedy_pass_at_1", lg.mean}, {"greedy_ci", ci_json(lg)}};
    }
    std::map<std::string, int> reasons;
    for (const auto& s : r.sampled)
      for (const auto& q : s) ++reasons[zipage::to_string(q.reason)];
    for (const auto& q : r.greedy) ++reasons[zipage::to_string(q.reason)];
    nlohmann::json j = {
        {"command", o.command},
        {"model", o.model},
        {"data", o.data},
        {"device", ctx.device_name},
        {"kv_cache_dtype", o.kv_cache_dtype},
        {"quantization", o.quantization},
        {"policy", r.c.policy},
        {"budget", r.c.policy == "full_kv" ? nlohmann::json(nullptr) : nlohmann::json(r.c.budget)},
        {"budget_fraction", r.c.fraction > 0 ? nlohmann::json(r.c.fraction) : nlohmann::json(nullptr)},
        {"block_size", o.block_size},
        {"window", o.window},
        {"problems", problems.size()},
        {"samples", o.samples},
        {"requests", r.requests()},
        {"temperature", as_written(ctx.sampled.temperature)},
        {"top_p", as_written(ctx.sampled.top_p)},
        {"top_k", ctx.sampled.top_k},
        {"min_p", as_written(ctx.sampled.min_p)},
        {"max_tokens", o.max_tokens},
        {"seed", o.seed},
        {"pass_at_1", pass.mean},
        {"pass_at_1_ci", ci_json(pass)},
        {"ci_method", "normal approximation over problems (mean +- 1.96 s/sqrt(N) of per-problem pass rates)"},
        {"greedy_pass_at_1", greedy.mean},
        {"greedy_ci", ci_json(greedy)},
        {"greedy_ci_method", "Wilson score interval"},
        {"pct_of_full_kv", full && full_pass > 0 ? nlohmann::json(100.0 * pass.mean / full_pass) : nlohmann::json(nullptr)},
        {"greedy_pct_of_full_kv",
         full && full_greedy > 0 ? nlohmann::json(100.0 * greedy.mean / full_greedy) : nlohmann::json(nullptr)},
        {"mean_trace_tokens", r.mean_trace()},
        {"mean_greedy_trace_tokens", r.mean_greedy_trace()},
        {"mean_sequence_tokens", r.mean_sequence()},
        {"generated_tokens", r.stats.generated_tokens},
        {"tokens_evicted", r.stats.tokens_evicted},
        {"tokens_evicted_per_request", evicted},
        {"compressions_per_request", static_cast<double>(r.stats.compressions) / requests},
        {"preemptions", r.stats.preemptions},
        {"swaps", r.stats.swaps},
        {"peak_running", r.stats.peak_running},
        {"seconds", r.seconds},
        {"throughput_tok_s", tps},
        {"failed", r.failed},
        {"finish_reasons", reasons},
        {"levels", levels},
        {"lost_answers",
         full && r.c.policy != "full_kv" ? lost_answers(*full, r, problems) : nlohmann::json(nullptr)},
    };
    json_out->append(j.dump()).append("\n");
  }
  std::fflush(stdout);
}

template <class Backend>
int run_backend(run_context& ctx, const Backend& backend) {
  grid_options& o = *ctx.o;
  std::error_code ec;
  const bool hf = std::filesystem::is_directory(o.model, ec);
  std::optional<zipage::bpe_tokenizer> bpe;
  std::optional<zipage::spm_tokenizer> spm;
  std::optional<zipage::gguf::file> gguf;
  text_io io;
  if (hf) {
    bpe.emplace(zipage::bpe_tokenizer::from_dir(o.model));
  } else {
    gguf.emplace(zipage::gguf::file::open(o.model));
    if (zipage::gguf_has_bpe_vocab(*gguf)) bpe.emplace(zipage::bpe_tokenizer::from_gguf(*gguf));  // Qwen, Llama 3
  }
  if (bpe) {
    const auto& tok = *bpe;
    if (o.chat)
      zipage::check(tok.has_chat_template(), o.command, ": ", o.model,
                    hf ? "/tokenizer_config.json" : " (tokenizer.chat_template)",
                    " has no chat template (--raw feeds the prompt as is)");
    const bool chat = o.chat, thinking = o.thinking;
    io.encode = [&tok, chat, thinking](const std::string& text) {
      if (!chat) return tok.encode(text, tok.add_bos());
      const std::vector<zipage::chat_message> messages = {{"user", text}};
      return tok.encode(tok.apply_chat_template(messages, {.enable_thinking = thinking}), false);  // the template writes any BOS
    };
    io.make_detokenizer = zipage::detokenizer_factory(tok);
    io.eos = tok.eos();
  } else {
    zipage::check(!o.chat, o.command, ": ", o.model, " has a SentencePiece vocabulary and no chat template zipage knows "
                  "(--raw feeds the prompt as is)");
    spm.emplace(zipage::spm_tokenizer::from_gguf(*gguf));
    const auto& tok = *spm;
    io.encode = [&tok](const std::string& text) { return tok.encode(text, tok.add_bos()); };  // as the file asks
    io.make_detokenizer = zipage::detokenizer_factory(tok);
  }
  auto load = [&]() {
    return hf ? zipage::load_hf_checkpoint<Backend>(o.model, backend) : zipage::load_llama_gguf<Backend>(*gguf, backend);
  };
  std::optional<zipage::llama_model<Backend>> first(load());
  if constexpr (requires { backend.describe_weights(); })  // how many linear weights are FP8 (--quantization)
    if (!o.quiet) std::fprintf(stderr, "weights: %s\n", backend.describe_weights().c_str());
  const zipage::model_config config = first->config();
  // The model and its tokenizer must agree (else a batch fails halfway at an id one side lacks).
  if (hf) zipage::check_vocabulary_pair(config, *bpe, o.model + "/config.json", o.model + "/tokenizer.json");
  else if (bpe) zipage::check_vocabulary_pair(config, *bpe, o.model + " (token_embd.weight)", o.model + " (tokenizer.ggml.tokens)");
  else zipage::check_vocabulary_pair(config, *spm, o.model + " (token_embd.weight)", o.model + " (tokenizer.ggml.tokens)");

  resolve_sampling(o, ctx.sampled);
  if (io.eos >= 0 && io.eos != config.eos) ctx.sampled.stop_token_ids.push_back(io.eos);
  ctx.greedy = ctx.sampled;
  ctx.greedy.temperature = 0.0f;
  ctx.greedy.seed = 0;

  int longest = 0;
  for (const auto& p : *ctx.problems) {
    ctx.prompts.push_back(io.encode(p.prompt));
    longest = std::max(longest, static_cast<int>(ctx.prompts.back().size()));
    // The engine would refuse it mid-grid in its own terms (engine_config::allow_beyond_context, no row): the row
    // is named here, before any cell runs (a prompt must leave room for one generated token).
    zipage::check(config.max_context <= 0 || static_cast<long long>(ctx.prompts.back().size()) < config.max_context,
                  p.source, " (id '", zipage::json::printable(p.id), "'): the prompt is ", ctx.prompts.back().size(),
                  " tokens", o.chat ? " with the chat template" : "", ", too long for the model's context of ",
                  config.max_context, " tokens");
  }
  if (!o.quiet && longest + o.max_tokens > config.max_context)
    std::fprintf(stderr, "zipage-eval: note: the longest prompt (%d tokens) + --max-tokens %d exceeds the model's context %d\n",
                 longest, o.max_tokens, config.max_context);

  const auto policies = chosen_policies(o);
  const bool fractions = o.budgets.empty();
  const bool want_full = std::find(policies.begin(), policies.end(), "full_kv") != policies.end();
  std::vector<cell_result> results;
  auto run_one = [&](const cell& c) {
    bool found = false;
    zipage::for_each_builtin_policy([&](auto policy) {
      using P = decltype(policy);
      if (policy.name() != c.policy) return;
      found = true;
      auto model = first ? std::move(*first) : load();
      first.reset();
      results.push_back(run_cell<P>(ctx, c, std::move(model), backend, io));
    });
    zipage::check(found, "unknown policy '", c.policy, "'");
  };
  std::vector<int> budgets = o.budgets;
  std::vector<double> budget_fraction(budgets.size(), 0.0);
  if (want_full || fractions) run_one({"full_kv", 0, 0});
  const bool any_evicting = std::any_of(policies.begin(), policies.end(), [](const std::string& p) { return p != "full_kv"; });
  if (fractions && any_evicting) {
    const double mean = results.front().mean_sequence();
    const int floor_tokens = o.block_size;
    for (double f : o.budget_fractions) {
      int b = static_cast<int>(std::lround(f * mean / o.block_size)) * o.block_size;
      if (b < floor_tokens) {
        std::fprintf(stderr, "zipage-eval: budget fraction %g of %.0f tokens rounds to %d; using one block, %d\n",
                     f, mean, b, floor_tokens);
        b = floor_tokens;
      }
      if (std::find(budgets.begin(), budgets.end(), b) != budgets.end()) continue;
      budgets.push_back(b);
      budget_fraction.push_back(f);
    }
    if (!o.quiet) {
      std::fprintf(stderr, "full-KV mean sequence length %.1f tokens; budgets:", mean);
      for (int b : budgets) std::fprintf(stderr, " %d", b);
      std::fprintf(stderr, "\n");
    }
  }
  for (const auto& p : policies) {
    if (p == "full_kv") continue;
    for (std::size_t k = 0; k < budgets.size(); ++k) run_one({p, budgets[k], budget_fraction[k]});
  }
  // (full_kv measured for --budget-fractions is reported even when --policies leaves it out: it is the reference.)
  std::string json_lines;
  report(ctx, results, o.json_out.empty() ? nullptr : &json_lines);
  if (!o.json_out.empty()) write_json_out(o.json_out, json_lines);
  int failed = 0;
  for (const auto& r : results) failed += r.failed;
  if (failed > 0) {
    std::fprintf(stderr, "zipage-eval: %d request(s) failed\n", failed);
    return 1;
  }
  return 0;
}

}  // namespace

void add_grid_flags(CLI::App& app, grid_options& o) {
  app.add_option("--model,-m", o.model, "Hugging Face checkpoint directory or GGUF file")->required();
  app.add_option("--data", o.data, "problems, JSONL")->required();
  app.add_option("--json-out", o.json_out,
                 "append one JSON line per (policy, budget) cell to this file (written at the end: a failed run "
                 "leaves it as it was)");
  app.add_option("--limit", o.limit, "use the first N problems (0 = all)")->check(zipage_cli::count());
  app.add_option("--policies", o.policies, "comma-separated policies (default: all built-in)")->delimiter(',');
  auto* budgets = app.add_option("--budgets", o.budgets, "comma-separated token budgets (multiples of --block-size)")
                      ->delimiter(',');
  auto* fractions =
      app.add_option("--budget-fractions", o.budget_fractions,
                     "budgets as fractions of full KV's mean sequence length (default 0.5,0.25,0.125)")
          ->delimiter(',');
  budgets->excludes(fractions);
  app.add_option("--block-size", o.block_size, "KV block size")->check(zipage_cli::positive_count());
  app.add_option("--window", o.window, "query window W")->check(zipage_cli::positive_count());
  app.add_option("-n,--samples", o.samples, "sampled requests per problem")->check(zipage_cli::positive_count());
  app.add_option("--max-tokens", o.max_tokens, "generated tokens per request at most")
      ->check(zipage_cli::positive_count());
  app.add_option("--seed", o.seed, "sample j of problem i uses seed + i * n + j")->check(zipage_cli::seed_check());
  app.add_option("--temperature,-t", o.temperature, "default: generation_config.json, else 0.6")
      ->check(zipage_cli::float_value(
          zipage_cli::number_check("in [0, 1000000]", [](double v) { return v >= 0 && v <= 1e6; })));
  app.add_option("--top-p", o.top_p, "default: generation_config.json, else off")
      ->check(zipage_cli::float_value(zipage_cli::in_half_open(0.0, 1.0)));
  app.add_option("--top-k", o.top_k, "0 or -1 = off, as vLLM (default: generation_config.json, else off)")
      ->check(zipage_cli::top_k_check());
  app.add_option("--min-p", o.min_p, "default: generation_config.json, else off")
      ->check(zipage_cli::float_value(zipage_cli::in_range(0.0, 1.0)));
  app.add_option("--device", o.device, "auto (the GPU when there is one), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  o.dtype_flag = app.add_option("--dtype", o.dtype, "GPU: bf16 or fp32")->check(CLI::IsMember({"bf16", "fp32"}));
  zipage_cli::add_kv_cache_dtype_flag(app, o.kv_cache_dtype, "GPU: ", "= --dtype");
  zipage_cli::add_quantization_flag(app, o.quantization, "GPU: ", "FP8 for an FP8 checkpoint, else --dtype");
  o.gpu_memory_utilization_flag =
      app.add_option("--gpu-memory-utilization", o.gpu_memory_utilization, "GPU: fraction of device memory for weights + KV")
          ->check(zipage_cli::in_range(0.05, 1.0));
  app.add_option("--kv-cache-mib", o.kv_cache_mib, "CPU: KV pool size in MiB")
      ->check(zipage_cli::kv_cache_mib_check());
  app.add_option("--num-blocks", o.num_blocks, "KV pool size in blocks (overrides the memory settings)")
      ->check(zipage_cli::count());
  app.add_option("--max-num-seqs", o.max_num_seqs, "running requests at most")->check(zipage_cli::positive_count());
  app.add_option("--max-batched-tokens", o.max_batched_tokens, "tokens per step at most")
      ->check(zipage_cli::positive_count());
  app.add_flag("--quiet,-q", o.quiet, "only the table on stdout");
}

int run_grid(grid_options& o, const std::vector<problem>& problems, const task& t) {
  if (!o.json_out.empty()) check_json_out(o.json_out);
  for (int b : o.budgets)
    zipage::check(b > 0 && b % o.block_size == 0, "--budgets: ", b, " is not a positive multiple of --block-size ",
                  o.block_size);
  // A budget given twice is one cell (as a policy given twice, or two fractions that round alike), not two.
  std::vector<int> budgets;
  for (int b : o.budgets)
    if (std::find(budgets.begin(), budgets.end(), b) == budgets.end()) budgets.push_back(b);
  o.budgets = std::move(budgets);
  zipage::check(o.window <= o.block_size, "--window ", o.window, " is larger than --block-size ", o.block_size,
                " (the window's queries are recorded in the last W slots of a block)");
  for (double f : o.budget_fractions)
    zipage::check(f > 0 && f <= 1, "--budget-fractions: ", f, " is not in (0, 1]");
  if (o.budgets.empty() && o.budget_fractions.empty()) o.budget_fractions = {0.5, 0.25, 0.125};
  (void)chosen_policies(o);  // unknown names fail before the model loads
  run_context ctx;
  ctx.o = &o;
  ctx.problems = &problems;
  ctx.t = &t;
#if ZIPAGE_EVAL_CUDA
  const bool gpu = o.device == "cuda" || (o.device == "auto" && zipage::cuda::device_count() > 0);
  if (gpu) {
    zipage::check(zipage::cuda::device_count() > 0, "--device cuda: no CUDA device (", zipage::cuda::describe_device(), ")");
    zipage::cuda_backend_options bo;
    bo.dtype = o.dtype == "fp32" ? zipage::cuda_dtype::f32 : zipage::cuda_dtype::bf16;
    bo.kv_dtype = zipage::parse_kv_cache_dtype(o.kv_cache_dtype);
    bo.weight_dtype = zipage::parse_weight_quantization(o.quantization);
    zipage_cli::check_quantization_dtype(bo.weight_dtype, o.quantization, o.dtype);
    const zipage::cuda_backend backend(bo);
    ctx.device_name = zipage::cuda::describe_device(0) + " (" + o.dtype +
                      (bo.kv_dtype == zipage::kv_cache_dtype::fp8_e4m3 ? ", fp8 KV" : "") +
                      (bo.weight_dtype == zipage::weight_dtype::fp8_e4m3 ? ", fp8 weights"
                       : bo.weight_dtype == zipage::weight_dtype::auto_ ? ", weights auto (fp8 for an FP8 checkpoint)"
                                                                         : "") + ")";
    if (!o.quiet) std::fprintf(stderr, "device: %s\n", ctx.device_name.c_str());
    return run_backend(ctx, backend);
  }
#else
  zipage::check(o.device != "cuda", "--device cuda: this build has no CUDA backend (configure with a CUDA compiler)");
#endif
  zipage::check(zipage::parse_weight_quantization(o.quantization) != zipage::weight_dtype::fp8_e4m3, "--quantization ",
                o.quantization, ": the CPU backend keeps fp32 weights (FP8 weights run with --device cuda)");
  zipage::check(o.kv_cache_dtype == "auto", "--kv-cache-dtype ", o.kv_cache_dtype,
                ": the CPU backend keeps fp32 KV (an FP8 cache runs with --device cuda)");
  // Flags the CPU run would ignore are refused, as zipage-generate refuses them.
  auto given = [](const CLI::Option* flag) { return flag != nullptr && flag->count() > 0; };
  zipage_cli::refuse_gpu_pool_flags_on_cpu(given(o.dtype_flag), o.dtype, given(o.gpu_memory_utilization_flag), 256);
  zipage_cli::check_host_kv_cache_mib(o.kv_cache_mib, o.num_blocks);
  ctx.device_name = "cpu (fp32 reference backend)";
  if (!o.quiet) std::fprintf(stderr, "device: %s\n", ctx.device_name.c_str());
  return run_backend(ctx, zipage::cpu_backend{});
}

}  // namespace zipage_eval
