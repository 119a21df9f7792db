// zipage-generate: text generation with a Llama-family model (a GGUF file, or a Hugging Face checkpoint
// directory of Qwen3 / Qwen2 / Llama) on the GPU (zipage::cuda_backend, bf16, CUDA graphs) when the build
// has the CUDA backend and a device is present, else on the CPU reference backend (--device picks).
//   zipage-generate --prompt "Once upon a time" -n 64
//   zipage-generate --device cpu --prompt "Once upon a time" -n 64
//   zipage-generate --prompts prompts.txt -n 256 --temperature 0.8 --seed 1
//   zipage-generate --model Qwen3-0.6B/ --chat --no-thinking --prompt "What is 2+2?"
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <map>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "zipage/engine/engine.hpp"
#include "zipage/gguf/gguf.hpp"
#include "zipage/models/hf_loader.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/policy/policies.hpp"
#include "zipage/tokenizer/detokenizer.hpp"

#if ZIPAGE_GENERATE_CUDA
#include "zipage/backend/cuda/cuda_backend.hpp"
#include "zipage/cuda/device.hpp"
#endif

namespace {

struct options {
  std::string model;
  std::string prompt;
  std::string prompts_file;
  zipage::sampling_params sampling;
  zipage::engine_config engine;
  double kv_cache_mib = 64.0;
  std::string device = "auto";  // auto | cpu | cuda
  std::string dtype = "bf16";   // cuda: bf16 | fp32
  double gpu_memory_utilization = 0.9;
  std::string policy = "zipage";
  bool quiet = false;
  bool chat = false;         // apply the checkpoint's chat template (Hugging Face checkpoints)
  bool no_thinking = false;  // with --chat: Qwen3's empty <think></think> block
  std::string system;        // with --chat: a system message
  int budget_blocks = 0;     // --budget-blocks (0: --budget, in tokens, decides)
  // The sampling and budget flags given on the command line (they override the checkpoint's defaults).
  std::map<std::string, CLI::Option*> flags;
  std::string sampling_line;  // what the run samples with, and where each value came from
};

bool given(const options& o, const std::string& flag) { return o.flags.at(flag)->count() > 0; }

std::string default_model_path() {
  for (const char* candidate : {ZIPAGE_DEFAULT_MODEL, ZIPAGE_INSTALLED_MODEL})
    if (std::filesystem::is_regular_file(candidate)) return candidate;
  zipage::fail("no --model given and the bundled model is missing (looked for ", ZIPAGE_DEFAULT_MODEL, " and ",
               ZIPAGE_INSTALLED_MODEL, ")");
}

std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream in(path);
  zipage::check(in.good(), "cannot read prompts file '", path, "'");
  std::vector<std::string> prompts;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) prompts.push_back(line);
  zipage::check(!prompts.empty(), "prompts file '", path, "' has no prompt (one per line)");
  return prompts;
}

void add_flags(CLI::App& app, options& o) {
  app.add_option("--model,-m", o.model,
                 "GGUF model file, or a Hugging Face checkpoint directory (default: the bundled stories260K)");
  auto* single = app.add_option("--prompt,-p", o.prompt, "prompt text (streamed)");
  auto* many = app.add_option("--prompts", o.prompts_file, "file with one prompt per line, run as one batch");
  single->excludes(many);
  auto& s = o.sampling;
  s.temperature = 0.0f;
  s.max_tokens = 128;
  app.add_option("-n,--max-tokens", s.max_tokens, "tokens to generate per request")->check(CLI::PositiveNumber);
  // Sampling: the checkpoint's generation_config.json sets the defaults (greedy when it sets nothing).
  o.flags["--temperature"] = app.add_option("--temperature,-t", s.temperature,
                                            "0 = greedy (default: the checkpoint's generation_config.json, else 0)")
                                 ->check(CLI::NonNegativeNumber);
  o.flags["--top-k"] = app.add_option("--top-k", s.top_k, "keep the k most likely tokens (0 = off; default: the checkpoint's)")
                           ->check(CLI::NonNegativeNumber);
  o.flags["--top-p"] = app.add_option("--top-p", s.top_p, "nucleus sampling mass (1 = off; default: the checkpoint's)")
                           ->check(CLI::Range(0.0f, 1.0f));
  o.flags["--min-p"] = app.add_option("--min-p", s.min_p, "drop tokens below min-p times the top probability (default: the checkpoint's)")
                           ->check(CLI::Range(0.0f, 1.0f));
  o.flags["--repetition-penalty"] = app.add_option("--repetition-penalty", s.repetition_penalty, "1 = off (default: the checkpoint's)")
                                        ->check(CLI::PositiveNumber);
  app.add_option("--seed", s.seed, "per-request seed (request i uses seed + i)");
  app.add_option("--stop", s.stop, "stop string (repeatable)");
  app.add_flag("--ignore-eos", s.ignore_eos, "keep generating past EOS");
  auto& e = o.engine;
  app.add_option("--block-size", e.block_size, "tokens per KV block")->check(CLI::PositiveNumber);
  app.add_option("--num-blocks", e.num_blocks, "KV pool size in blocks (default: from --kv-cache-mib)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--kv-cache-mib", o.kv_cache_mib, "KV pool size in MiB (CPU)")->check(CLI::PositiveNumber);
  app.add_option("--device", o.device, "auto (the GPU when there is one), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--dtype", o.dtype, "GPU: bf16 or fp32 weights, activations and KV")->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_option("--gpu-memory-utilization", o.gpu_memory_utilization,
                 "GPU: fraction of device memory for weights + KV pool (as vLLM)")
      ->check(CLI::Range(0.05, 1.0));
  app.add_option("--max-num-seqs", e.max_num_seqs, "running requests at most")->check(CLI::PositiveNumber);
  app.add_option("--max-batched-tokens", e.max_batched_tokens, "tokens per step at most")->check(CLI::PositiveNumber);
  std::vector<std::string> policies;
  for (auto name : zipage::builtin_policy_names()) policies.emplace_back(name);
  app.add_option("--policy", o.policy, "eviction policy (full_kv keeps everything)")->check(CLI::IsMember(policies));
  auto* budget = app.add_option("--budget", e.budget_tokens,
                                 "tokens each compressed request keeps (a multiple of --block-size)")
                     ->check(CLI::PositiveNumber)
                     ->capture_default_str();
  auto* budget_blocks = app.add_option("--budget-blocks", o.budget_blocks,
                                       "instead of --budget: blocks each compressed request keeps (B)")
                            ->check(CLI::PositiveNumber);
  budget->excludes(budget_blocks);
  o.flags["--budget"] = budget;
  app.add_option("--window", e.window, "recent queries that score the cache, and tokens always kept (W)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--query-slots", e.num_query_slots, "requests that may record window queries (default: max concurrency)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("!--no-hybrid", e.hybrid, "admit only requests that get a query slot");
  app.add_flag("!--no-prefix-caching", e.prefix_caching, "do not share prompt blocks between requests");
  app.add_flag("!--sync-compression", e.async_compression, "compress on the decode thread");
  app.add_flag("--quiet,-q", o.quiet, "print only the generated text");
  app.add_flag("--chat", o.chat, "wrap each prompt in the checkpoint's chat template (checkpoint directories)");
  app.add_flag("--no-thinking", o.no_thinking, "with --chat: turn Qwen3's thinking off");
  app.add_option("--system", o.system, "with --chat: a system message");
}

void progress(std::size_t done, std::size_t total, std::int64_t tokens, double seconds) {
  constexpr int width = 30;
  const int filled = total ? static_cast<int>(width * done / total) : width;
  std::fprintf(stderr, "\r[%-*s] %zu/%zu requests  %lld tokens  %.0f tok/s", width, std::string(filled, '=').c_str(),
               done, total, static_cast<long long>(tokens), seconds > 0 ? tokens / seconds : 0.0);
  std::fflush(stderr);
}

template <class Engine>
void print_summary(const Engine& eng, std::size_t requests, double seconds) {
  const auto st = eng.stats();
  std::fprintf(stderr,
               "requests: %zu  generated tokens: %lld  time: %.2f s  throughput: %.1f tok/s\n"
               "peak KV blocks used: %d of %d (block size %d)  peak running: %d  preemptions: %lld  swaps: %lld\n"
               "compressions: %lld  prefix-cache hit rate: %.1f%%  steps: %lld\n",
               requests, static_cast<long long>(st.generated_tokens), seconds,
               seconds > 0 ? st.generated_tokens / seconds : 0.0, st.peak_blocks_used, st.num_blocks,
               eng.settings().block_size, st.peak_running, static_cast<long long>(st.preemptions),
               static_cast<long long>(st.swaps), static_cast<long long>(st.compressions), 100.0 * st.prefix_hit_rate(),
               static_cast<long long>(st.steps));
}

// The compression budget in tokens from --budget or --budget-blocks, checked against the block size with
// the flags' names (an evicting policy only: full_kv keeps everything).
void resolve_budget(options& o) {
  auto& e = o.engine;
  if (o.budget_blocks > 0) e.budget_tokens = o.budget_blocks * e.block_size;
  if (o.policy == "full_kv") return;
  (void)zipage::budget_blocks_for(e.budget_tokens, e.block_size,
                                  o.budget_blocks > 0 ? "--budget-blocks x --block-size"
                                  : given(o, "--budget") ? "--budget" : "--budget (default)");
  zipage::check(e.window <= e.block_size, "--window ", e.window, " is larger than the block size ", e.block_size,
                " (--block-size): the window's queries are recorded in the last W slots of a block");
}

// Sampling: flags given on the command line, else the checkpoint's generation_config.json (`gen`), else
// greedy. Builds the line that says which value came from where.
void resolve_sampling(options& o, const zipage::generation_defaults& gen) {
  zipage::sampling_params merged = o.sampling;
  gen.apply(merged);
  auto& s = o.sampling;
  std::string line = "sampling:";
  auto field = [&](const char* flag, auto& value, auto from_file, bool set_by_file) {
    const bool user = given(o, flag);
    if (!user) value = from_file;
    std::ostringstream v;
    v << (line.back() == ':' ? " " : ", ") << (flag + 2) << " " << value << " ("
      << (user ? "flag" : set_by_file ? "checkpoint" : "default") << ")";
    line += v.str();
  };
  const bool greedy_by_file = gen.do_sample && !*gen.do_sample;
  field("--temperature", s.temperature, merged.temperature, gen.temperature.has_value() || greedy_by_file);
  field("--top-k", s.top_k, merged.top_k, gen.top_k.has_value());
  field("--top-p", s.top_p, merged.top_p, gen.top_p.has_value());
  field("--min-p", s.min_p, merged.min_p, gen.min_p.has_value());
  field("--repetition-penalty", s.repetition_penalty, merged.repetition_penalty, gen.repetition_penalty.has_value());
  if (s.greedy()) line += "; greedy";
  if (!gen.source.empty())
    line += gen.sets_sampling() ? "; checkpoint = " + gen.source + (greedy_by_file ? " (do_sample: false)" : "")
                                : "; " + gen.source + " sets no sampling";
  o.sampling_line = line;
}

// Runs the prompts through the engine; `encode` turns a prompt's text into its token ids.
template <class Backend, class Encode>
int generate(options& o, zipage::llama_model<Backend> model, const Backend& backend, Encode encode);
template <class Engine, class Encode>
int run_engine(options& o, Engine& eng, Encode& encode);

template <class Backend>
int run(options& o, const Backend& backend) {
  if (o.model.empty()) o.model = default_model_path();
  if (std::filesystem::is_directory(o.model)) {  // a Hugging Face checkpoint
    resolve_sampling(o, zipage::load_generation_config(o.model));
    const auto tokenizer = zipage::bpe_tokenizer::from_dir(o.model);
    auto model = zipage::load_hf_checkpoint<Backend>(o.model, backend);
    // The engine stops at every end-of-sequence id of the config (eos and extra_eos); the tokenizer's
    // own EOS ends a turn too (e.g. Qwen3's <|im_end|>).
    if (tokenizer.eos() >= 0 && tokenizer.eos() != model.config().eos) o.sampling.stop_token_ids.push_back(tokenizer.eos());
    if (o.chat)
      zipage::check(tokenizer.chat() != zipage::chat_format::none, "--chat: ", o.model,
                    "/tokenizer_config.json has no chat template zipage knows");
    o.engine.make_detokenizer = zipage::detokenizer_factory(tokenizer);
    return generate(o, std::move(model), backend, [&](const std::string& text) {
      if (!o.chat) return tokenizer.encode(text, tokenizer.add_bos());
      std::vector<zipage::chat_message> messages;
      if (!o.system.empty()) messages.push_back({"system", o.system});
      messages.push_back({"user", text});
      // The template writes any BOS itself.
      return tokenizer.encode(tokenizer.apply_chat_template(messages, {.enable_thinking = !o.no_thinking}), false);
    });
  }
  zipage::check(!o.chat, "--chat needs a Hugging Face checkpoint directory as --model");
  resolve_sampling(o, {});
  const auto file = zipage::gguf::file::open(o.model);
  const auto tokenizer = zipage::spm_tokenizer::from_gguf(file);
  auto model = zipage::load_llama_gguf<Backend>(file, backend);
  o.engine.make_detokenizer = zipage::detokenizer_factory(tokenizer);
  return generate(o, std::move(model), backend, [&](const std::string& text) { return tokenizer.encode(text, true); });
}

// On a GPU the pool takes --gpu-memory-utilization of the device (less the activation peak the engine
// measures first), but never more than max_num_seqs requests at the model's context (at least 4,096
// tokens) could fill: a toy model would otherwise get millions of blocks it can never use.
template <class Backend>
void size_gpu_pool(options& o, const zipage::model_config& c, const Backend& backend) {
  if constexpr (requires { backend.memory_info(); }) {
    const double per_token =
        static_cast<double>(zipage::kv_bytes_per_token(c, backend.kv_element_bytes(), o.policy != "full_kv"));
    o.engine.max_kv_cache_bytes =
        static_cast<std::size_t>(per_token * o.engine.max_num_seqs * std::max(c.max_context, 4096));
  }
}

// The engine type depends on the policy, so the run is instantiated once per built-in policy.
template <class Backend, class Encode>
int generate(options& o, zipage::llama_model<Backend> model, const Backend& backend, Encode encode) {
  o.sampling.validate();
  resolve_budget(o);
  o.engine.kv_cache_bytes = static_cast<std::size_t>(o.kv_cache_mib * 1024.0 * 1024.0);
  if (o.engine.gpu_memory_utilization > 0.0) size_gpu_pool(o, model.config(), backend);
  int rc = -1;
  zipage::for_each_builtin_policy([&](auto policy) {
    if (policy.name() != o.policy) return;
    zipage::engine<zipage::llama_model<Backend>, decltype(policy), zipage::zipage_scheduler, Backend> eng(
        std::move(model), o.engine, policy, backend);
    rc = run_engine(o, eng, encode);
  });
  return rc;
}

// --device: the GPU when asked for, or for auto when the build has it and a device is present.
int run(options& o) {
#if ZIPAGE_GENERATE_CUDA
  const bool gpu = o.device == "cuda" || (o.device == "auto" && zipage::cuda::device_count() > 0);
  if (gpu) {
    zipage::check(zipage::cuda::device_count() > 0, "--device cuda: no CUDA device (",
                  zipage::cuda::describe_device(), ")");
    zipage::cuda_backend_options bo;
    bo.dtype = o.dtype == "fp32" ? zipage::cuda_dtype::f32 : zipage::cuda_dtype::bf16;
    // The pool comes from the device's memory unless --num-blocks fixes it.
    o.engine.gpu_memory_utilization = o.gpu_memory_utilization;
    const zipage::cuda_backend backend(bo);
    if (!o.quiet) std::fprintf(stderr, "device: %s (%s)\n", zipage::cuda::describe_device(0).c_str(), o.dtype.c_str());
    return run(o, backend);
  }
#else
  zipage::check(o.device != "cuda", "--device cuda: this build has no CUDA backend (configure with a CUDA compiler)");
#endif
  if (!o.quiet) std::fprintf(stderr, "device: cpu (fp32 reference backend)\n");
  return run(o, zipage::cpu_backend{});
}

template <class Engine, class Encode>
int run_engine(options& o, Engine& eng, Encode& encode) {
  if (!o.quiet) {
    std::fprintf(stderr, "%s; policy %s\n", eng.memory().describe().c_str(), std::string(eng.policy().name()).c_str());
    std::fprintf(stderr, "%s\n", o.sampling_line.c_str());
  }

  const bool batch = !o.prompts_file.empty();
  const std::vector<std::string> texts = batch ? read_prompts(o.prompts_file) : std::vector<std::string>{o.prompt};
  std::vector<zipage::request_id> ids;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    auto params = o.sampling;
    params.seed += i;
    ids.push_back(eng.add_request(encode(texts[i]), params));
  }

  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  std::size_t finished = 0;
  std::int64_t tokens = 0;
  double next_draw = 0.0;
  if (!batch) std::cout << texts[0] << std::flush;
  while (eng.has_unfinished()) {
    for (const auto& ev : eng.step()) {
      ++tokens;
      if (!batch) std::cout << ev.text << std::flush;
      finished += ev.finished;
    }
    // Redraw at most ten times a second (and once at the end), not once per step.
    if (batch && !o.quiet && (elapsed() >= next_draw || !eng.has_unfinished())) {
      progress(finished, texts.size(), tokens, elapsed());
      next_draw = elapsed() + 0.1;
    }
  }
  const double seconds = elapsed();
  if (batch && !o.quiet) std::fprintf(stderr, "\n");

  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto out = eng.take_output(ids[i]);
    if (out.reason == zipage::finish_reason::error)
      std::fprintf(stderr, "request %zu failed: %s\n", i, out.error_message.c_str());
    if (batch) std::cout << "[" << i << "] " << texts[i] << out.text << "\n";
    else std::cout << "\n";
  }
  std::cout << std::flush;  // the text first, then the summary on stderr
  if (!o.quiet) print_summary(eng, texts.size(), seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zipage-generate: generate text with a GGUF model or a Hugging Face checkpoint (Compressed PagedAttention engine)"};
  options o;
  add_flags(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "zipage-generate: %s (see --help)\n", e.what());
    return 2;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zipage-generate: error: %s\n", e.what());
    return 1;
  }
}
