#pragma once
// What the command-line tools built on the engine share (zipage-generate, zipage-serve): the model, device,
// sampling, policy and scheduling flags; the budget and sampling defaults resolved from them and the
// checkpoint; and with_engine(), which loads the model (a GGUF file or a Hugging Face checkpoint
// directory), picks the backend (the GPU when the build has the CUDA backend and a device is present, else
// the CPU reference) and builds the engine for the chosen policy.
//
// A tool that includes this defines ZIPAGE_DEFAULT_MODEL and ZIPAGE_INSTALLED_MODEL (the bundled model's
// paths), and ZIPAGE_GENERATE_CUDA or ZIPAGE_SERVE_CUDA when it links the CUDA backend.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <new>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "dtype_flags.hpp"
#include "flag_terms.hpp"
#include "number_flags.hpp"
#include "zipage/core/kv_cache_dtype.hpp"
#include "zipage/core/weight_dtype.hpp"
#include "zipage/engine/engine.hpp"
#include "zipage/gguf/gguf.hpp"
#include "zipage/models/gguf_generation.hpp"
#include "zipage/models/hf_loader.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/models/llama_tp.hpp"
#include "zipage/policy/policies.hpp"
#include "zipage/tokenizer/detokenizer.hpp"
#include "zipage/tokenizer/vocab_check.hpp"

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

#if ZIPAGE_GENERATE_CUDA || ZIPAGE_SERVE_CUDA
#define ZIPAGE_CLI_CUDA 1
#include "zipage/backend/cuda/cuda_backend.hpp"
#include "zipage/cuda/device.hpp"
#endif

namespace zipage_cli {

struct engine_options {
  std::string model;
  zipage::sampling_params sampling;
  zipage::engine_config engine;
  double kv_cache_mib = 64.0;
  std::string device = "auto";  // auto | cpu | cuda
  std::string dtype = "bf16";   // cuda: bf16 | fp32
  std::string kv_cache_dtype = "auto";  // auto (= dtype) | fp8 | fp8_e4m3 (cuda)
  std::string quantization = "auto";    // linear weights: auto (the checkpoint's) | none | fp8 | fp8_e4m3 (cuda)
  double gpu_memory_utilization = 0.9;
  std::string policy = "zipage";
  std::string generation_config = "auto";  // auto (the checkpoint's) | vllm (none: vLLM's defaults) | a directory
  std::string chat_template = "auto";      // auto (the checkpoint's) | plain (zipage-serve) | a built-in format | a file
  std::string scheduling = "fcfs";  // fcfs | priority
  bool quiet = false;               // no device line (the tool's own --quiet sets it)
  int budget_blocks = 0;            // --budget-blocks (0: --budget, in tokens, decides)
  int tensor_parallel_size = 1;     // --tensor-parallel-size: ranks the model is sharded over (CPU: threads)
  // The sampling and budget flags given on the command line (they override the checkpoint's defaults).
  std::map<std::string, CLI::Option*> flags;
  std::string sampling_line;  // what the run samples with, and where each value came from
  // The checkpoint's max_new_tokens (generation_config.json): the output length of a request that sets none
  // unless the tool's -n says otherwise (vLLM's default max_tokens). Each tool says how it applies.
  std::optional<int> checkpoint_max_tokens;
  // The tokenizer's EOS where it is not the config's (e.g. Qwen3 base's <|im_end|>): a stop id of every request
  // that does not ignore EOS (add_end_of_turn).
  std::vector<zipage::token_id> end_of_turn_ids;
};

// A request's stop ids: its own, plus the tokenizer's end of turn unless it ignores EOS (zipage::with_end_of_turn).
inline void add_end_of_turn(zipage::sampling_params& p, const engine_options& o) {
  p = zipage::with_end_of_turn(std::move(p), o.end_of_turn_ids);
}


// Parses the command line: -1 to go on, else the exit status (0 after --help; 2 after a bad flag, with one
// line on stderr naming it).
inline int parse_cli(CLI::App& app, int argc, char** argv, const char* tool) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: %s (see --help)\n", tool, e.what());
    return 2;
  }
  return -1;
}

// Runs f() and turns what it throws into one line on stderr and exit status 1 (running out of memory
// included, with what to change).
template <class F>
int run_reporting_errors(const char* tool, F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s: error: out of memory (the model or the KV pool does not fit: lower --kv-cache-mib or "
                         "--num-blocks)\n", tool);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool, in_flag_terms(e.what()).c_str());
  }
  return 1;
}

// Whether `flag` was given on the command line (false for options built in code, without flags).
[[nodiscard]] inline bool given(const engine_options& o, const std::string& flag) {
  const auto it = o.flags.find(flag);
  return it != o.flags.end() && it->second != nullptr && it->second->count() > 0;
}

inline std::string default_model_path() {
  for (const char* candidate : {ZIPAGE_DEFAULT_MODEL, ZIPAGE_INSTALLED_MODEL})
    if (std::filesystem::is_regular_file(candidate)) return candidate;
  zipage::fail("no --model given and the bundled model is missing (looked for ", ZIPAGE_DEFAULT_MODEL, " and ",
               ZIPAGE_INSTALLED_MODEL, ")");
}

// --model, the sampling flags (but -n/--max-tokens, which each tool words its own way), the device, pool,
// scheduling and Compressed PagedAttention flags.
inline void add_engine_flags(CLI::App& app, engine_options& o) {
  app.add_option("--model,-m", o.model,
                 "GGUF model file, or a Hugging Face checkpoint directory (default: the bundled stories260K)");
  auto& s = o.sampling;
  // Sampling: the checkpoint's generation_config.json (or GGUF general.sampling.*) sets the defaults; a field it
  // does not set keeps vLLM's (sampling_params: temperature 1, filters off).
  o.flags["--temperature"] = app.add_option("--temperature,-t", s.temperature,
                                            "0 = greedy (default: the checkpoint's, else 1 as vLLM)")
                                 ->check(float_value(non_negative()));
  o.flags["--top-k"] = app.add_option("--top-k", s.top_k,
                                      "keep the k most likely tokens (0 or -1 = off, as vLLM; default: the "
                                      "checkpoint's)")
                           ->check(top_k_check());
  o.flags["--top-p"] = app.add_option("--top-p", s.top_p, "nucleus sampling mass (1 = off; default: the checkpoint's)")
                           ->check(float_value(in_half_open(0.0, 1.0)));
  o.flags["--min-p"] = app.add_option("--min-p", s.min_p, "drop tokens below min-p times the top probability (default: the checkpoint's)")
                           ->check(float_value(in_range(0.0, 1.0)));
  o.flags["--repetition-penalty"] = app.add_option("--repetition-penalty", s.repetition_penalty, "1 = off (default: the checkpoint's)")
                                        ->check(float_value(positive()));
  o.flags["--frequency-penalty"] = app.add_option("--frequency-penalty", s.frequency_penalty,
                                       "OpenAI's: minus this times a token's count in the output so far, in [-2, 2] (default 0 = off)")
                                       ->check(float_value(in_range(-2.0, 2.0)));
  o.flags["--presence-penalty"] = app.add_option("--presence-penalty", s.presence_penalty,
                                      "OpenAI's: minus this once for a token already in the output, in [-2, 2] (default 0 = off)")
                                      ->check(float_value(in_range(-2.0, 2.0)));
  app.add_option("--chat-template", o.chat_template,
                 "the chat template (vLLM's flag): auto = the checkpoint's own (Jinja, rendered as transformers does); "
                 "FILE = a Jinja template file; chatml|qwen2|qwen2_5|qwen3|qwq|llama3|llama3_1|deepseek_r1 = zipage's "
                 "built-in rendering of that family; plain (zipage-serve) = the messages' contents joined by newlines")
      ->capture_default_str();
  app.add_option("--generation-config", o.generation_config,
                 "where the sampling defaults come from (vLLM's): auto = the checkpoint's generation_config.json or "
                 "GGUF general.sampling keys; vllm = none, vLLM's defaults; DIR = DIR/generation_config.json")
      ->capture_default_str();
  app.add_option("--seed", s.seed, "per-request seed (request i uses seed + i)")->check(seed_check());
  app.add_option("--stop", s.stop, "stop string (repeatable)");
  app.add_flag("--ignore-eos", s.ignore_eos, "keep generating past EOS");
  auto& e = o.engine;
  app.add_option("--block-size", e.block_size, "tokens per KV block")->check(positive_count());
  app.add_option("--num-blocks", e.num_blocks, "KV pool size in blocks (default: from --kv-cache-mib)")
      ->check(count());
  o.flags["--kv-cache-mib"] = app.add_option("--kv-cache-mib", o.kv_cache_mib, "KV pool size in MiB (CPU)")
      ->check(kv_cache_mib_check());
  app.add_option("--device", o.device, "auto (the GPU when there is one), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  o.flags["--dtype"] = app.add_option("--dtype", o.dtype, "GPU: bf16 or fp32 weights, activations and KV")
                           ->check(CLI::IsMember({"bf16", "fp32"}));
  add_kv_cache_dtype_flag(app, o.kv_cache_dtype, "GPU: ", "the model's dtype");
  add_quantization_flag(app, o.quantization, "GPU: ", "the checkpoint's: FP8 for an FP8 checkpoint, else --dtype");
  o.flags["--gpu-memory-utilization"] = app.add_option("--gpu-memory-utilization", o.gpu_memory_utilization,
                                                       "GPU: fraction of device memory for weights + KV pool (as vLLM)")
                                            ->check(in_range(0.05, 1.0));
  app.add_option("--max-num-seqs", e.max_num_seqs, "running requests at most")->check(positive_count());
  app.add_option("--max-batched-tokens", e.max_batched_tokens, "tokens per step at most")->check(positive_count());
  app.add_option("--scheduling-policy", o.scheduling,
                 "fcfs, or priority (requests' priority, lower first; as vLLM's --scheduling-policy)")
      ->check(CLI::IsMember({"fcfs", "priority"}));
  std::vector<std::string> policies;
  for (auto name : zipage::builtin_policy_names()) policies.emplace_back(name);
  app.add_option("--policy", o.policy, "eviction policy (full_kv keeps everything)")->check(CLI::IsMember(policies));
  auto* budget = app.add_option("--budget", e.budget_tokens,
                                 "tokens each compressed request keeps (a multiple of --block-size)")
                     ->check(positive_count())
                     ->capture_default_str();
  auto* budget_blocks = app.add_option("--budget-blocks", o.budget_blocks,
                                       "instead of --budget: blocks each compressed request keeps (B)")
                            ->check(positive_count());
  budget->excludes(budget_blocks);
  o.flags["--budget"] = budget;
  app.add_option("--window", e.window, "recent queries that score the cache, and tokens always kept (W)")
      ->check(positive_count())
      ->capture_default_str();
  app.add_option("--query-slots", e.num_query_slots, "requests that may record window queries (default: max concurrency)")
      ->check(count());
  app.add_flag("!--no-hybrid", e.hybrid, "admit only requests that get a query slot");
  app.add_flag("!--no-prefix-caching", e.prefix_caching, "do not share prompt blocks between requests");
  app.add_flag("!--sync-compression", e.async_compression, "compress on the decode thread");
  app.add_option("--tensor-parallel-size,--tp", o.tensor_parallel_size,
                 "shard the model over N ranks (1, 2, 4 or 8; Megatron-style, one thread per rank; CPU only for now: "
                 "docs/tensor-parallel.md). --kv-cache-mib is then per rank")
      ->check(number_check("1, 2, 4 or 8", [](double v) { return v == 1 || v == 2 || v == 4 || v == 8; }));
  app.add_flag("--allow-beyond-context", e.allow_beyond_context,
               "let prompt + output run past the model's trained context (max_position_embeddings); by default a "
               "longer prompt is refused and generation stops there. For compressed long generation, where each "
               "request's cache stays at the budget");
}

// The compression budget in tokens from --budget or --budget-blocks, checked against the block size with
// the flags' names (an evicting policy only: full_kv keeps everything).
inline void resolve_budget(engine_options& o) {
  auto& e = o.engine;
  if (o.budget_blocks > 0) {  // the product in 64 bits: two flags in range can overflow an int together
    const long long tokens = static_cast<long long>(o.budget_blocks) * e.block_size;
    zipage::check(tokens <= std::numeric_limits<int>::max(), "--budget-blocks ", o.budget_blocks, " x --block-size ",
                  e.block_size, " = ", tokens, " tokens is too large (at most 2147483647)");
    e.budget_tokens = static_cast<int>(tokens);
  }
  if (o.policy == "full_kv") return;
  (void)zipage::budget_blocks_for(e.budget_tokens, e.block_size,
                                  o.budget_blocks > 0 ? "--budget-blocks x --block-size"
                                  : given(o, "--budget") ? "--budget" : "--budget (default)");
  zipage::check(e.window <= e.block_size, "--window ", e.window, " is larger than the block size ", e.block_size,
                " (--block-size): the window's queries are recorded in the last W slots of a block");
}

// The sampling defaults --generation-config names: the checkpoint's own (`of_checkpoint`, for auto), none (vllm),
// or DIR/generation_config.json.
template <class F>
zipage::generation_defaults generation_config_of(const engine_options& o, F&& of_checkpoint) {
  if (o.generation_config == "auto") return of_checkpoint();
  if (o.generation_config == "vllm") return {};
  const std::filesystem::path file = std::filesystem::path(o.generation_config) / "generation_config.json";
  std::error_code ec;
  zipage::check(std::filesystem::is_regular_file(file, ec), "--generation-config ", o.generation_config,
                ": no generation_config.json there (auto: the checkpoint's; vllm: vLLM's defaults; or a directory "
                "holding one)");
  return zipage::load_generation_config(o.generation_config);
}

// Sampling: flags given on the command line, else the checkpoint's generation_config.json or GGUF
// general.sampling.* keys (`gen`), else vLLM's defaults. Builds the line that says which value came from where.
inline void resolve_sampling(engine_options& o, const zipage::generation_defaults& gen) {
  zipage::sampling_params merged = o.sampling;
  gen.apply(merged);
  auto& s = o.sampling;
  std::string line = "sampling:";
  auto field = [&](const char* flag, auto& value, auto from_file, bool set_by_file, const std::string& note = {}) {
    const bool user = given(o, flag);
    if (!user) value = from_file;
    std::ostringstream v;
    v << (line.back() == ':' ? " " : ", ") << (flag + 2) << " " << value << " ("
      << (user ? "flag" : set_by_file ? "checkpoint" : "default") << note << ")";
    line += v.str();
  };
  const bool greedy_by_file = gen.do_sample && !*gen.do_sample;
  field("--temperature", s.temperature, merged.temperature, gen.temperature.has_value() || greedy_by_file);
  // top-k -1 (vLLM's "off", from the flag or the file) runs as zipage's 0; the line keeps what was written.
  const int top_k_written = given(o, "--top-k") ? s.top_k : gen.top_k.value_or(0);
  s.top_k = std::max(s.top_k, 0);
  field("--top-k", s.top_k, merged.top_k, gen.top_k.has_value(),
        top_k_written < 0 ? ": " + std::to_string(top_k_written) + " = off" : std::string());
  field("--top-p", s.top_p, merged.top_p, gen.top_p.has_value());
  field("--min-p", s.min_p, merged.min_p, gen.min_p.has_value());
  field("--repetition-penalty", s.repetition_penalty, merged.repetition_penalty, gen.repetition_penalty.has_value());
  if (s.output_penalties()) {  // generation_config.json has no such fields: these come from flags only
    std::ostringstream v;
    v << ", frequency-penalty " << s.frequency_penalty << ", presence-penalty " << s.presence_penalty << " (flag)";
    line += v.str();
  }
  if (s.greedy()) line += "; greedy";
  if (!gen.source.empty())
    line += gen.sets_sampling() ? "; checkpoint = " + gen.source + (greedy_by_file ? " (do_sample: false)" : "")
                                : "; " + gen.source + " sets no sampling";
  for (const auto& setting : gen.ignored) line += "; ignored: " + setting + ", which zipage does not have";
  o.sampling_line = line;
  o.checkpoint_max_tokens = gen.max_new_tokens;
}

// The loaded model's text side, whichever tokenizer it has: encode with the model's BOS convention,
// encode templated text (the template writes any BOS), and the chat template when the checkpoint has one.
struct model_text {
  const zipage::bpe_tokenizer* bpe = nullptr;  // Hugging Face checkpoints
  const zipage::spm_tokenizer* spm = nullptr;  // GGUF files

  [[nodiscard]] std::vector<zipage::token_id> encode(const std::string& text) const {
    return bpe ? bpe->encode(text, bpe->add_bos()) : spm->encode(text, spm->add_bos());
  }
  [[nodiscard]] std::vector<zipage::token_id> encode_templated(const std::string& text) const {
    return bpe ? bpe->encode(text, false) : spm->encode(text, false);
  }
  // Text of ids, special tokens included (an id the tokenizer does not define decodes to nothing).
  [[nodiscard]] std::string decode(std::span<const zipage::token_id> ids) const {
    return bpe ? bpe->decode(ids) : spm->decode(ids);
  }
  // The vocabulary's own string of an id (a byte-level BPE token as stored, a SentencePiece piece); empty for an
  // id the tokenizer does not define.
  [[nodiscard]] std::string token_str(zipage::token_id id) const {
    if (id < 0 || id >= vocab_size()) return {};
    return bpe ? std::string(bpe->token_text(id)) : std::string(spm->piece(id));
  }
  [[nodiscard]] int vocab_size() const { return bpe ? bpe->vocab_size() : spm->vocab_size(); }
  [[nodiscard]] bool has_chat_template() const { return bpe && bpe->has_chat_template(); }
  [[nodiscard]] std::string chat_template_name() const { return bpe ? bpe->chat_template_name() : "none"; }
  // The checkpoint's template over `messages` (has_chat_template() must be true).
  [[nodiscard]] std::string apply_chat_template(std::span<const zipage::chat_message> messages,
                                                const zipage::chat_options& options) const {
    zipage::check(has_chat_template(), "the model has no chat template");
    return bpe->apply_chat_template(messages, options);
  }
  // OpenAI message objects (tool calls and results included).
  [[nodiscard]] std::string apply_chat_template_json(const nlohmann::ordered_json& messages,
                                                     const zipage::chat_options& options) const {
    zipage::check(has_chat_template(), "the model has no chat template");
    return bpe->apply_chat_template_json(messages, options);
  }
};

// On a GPU the pool takes --gpu-memory-utilization of the device (less the activation peak the engine
// measures first), but never more than max_num_seqs requests at the model's context (at least 4,096
// tokens) could fill: a toy model would otherwise get millions of blocks it can never use.
template <class Backend>
void size_gpu_pool(engine_options& o, const zipage::model_config& c, const Backend& backend) {
  if constexpr (requires { backend.memory_info(); }) {
    std::size_t scale_bytes = 0;  // a quantised (FP8) cache's per token-head scales
    if constexpr (requires { backend.kv_scale_bytes(); }) scale_bytes = backend.kv_scale_bytes();
    const double per_token = static_cast<double>(
        zipage::kv_bytes_per_token(c, backend.kv_element_bytes(), o.policy != "full_kv", scale_bytes));
    o.engine.max_kv_cache_bytes =
        static_cast<std::size_t>(per_token * o.engine.max_num_seqs * std::max(c.max_context, 4096));
  }
}

namespace detail {

// --tensor-parallel-size N on the CPU: the model sharded over an in-process group of N threads
// (zipage/models/llama_tp.hpp), one engine. The engine plans the whole model's KV memory; --kv-cache-mib is
// what each rank holds, so the engine is given it over the rank's share of a block (N x, or less when KV
// heads are replicated), and the rank's plan is printed.
template <class F>
int build_tensor_parallel_engine(engine_options& o, const zipage::llama_model<zipage::cpu_backend>& model,
                                 const model_text& text, F& f) {
  auto tp = zipage::make_tensor_parallel_llama(model, o.tensor_parallel_size);  // heads checked here
  const auto backend = tp.backend();
  const auto& layout = backend.layout();
  if (o.engine.num_blocks == 0)
    o.engine.kv_cache_bytes = static_cast<std::size_t>(static_cast<double>(o.engine.kv_cache_bytes) / layout.block_fraction());
  if (!o.quiet) std::fprintf(stderr, "%s\n", layout.describe().c_str());
  int rc = -1;
  zipage::for_each_builtin_policy([&](auto policy) {
    if (policy.name() != o.policy) return;
    using tp_model = zipage::tensor_parallel_llama<zipage::cpu_backend>;
    zipage::engine<tp_model, decltype(policy), zipage::zipage_scheduler, typename tp_model::backend_type> eng(
        std::move(tp), o.engine, policy, backend);
    if (!o.quiet) std::fprintf(stderr, "KV memory %s\n", zipage::describe_rank_memory(eng.memory(), layout).c_str());
    rc = f(eng, text);
  });
  return rc;
}

// The engine type depends on the policy, so `f` is instantiated once per built-in policy.
template <class Backend, class F>
int build_engine(engine_options& o, zipage::llama_model<Backend> model, const Backend& backend, const model_text& text,
                 F& f) {
  o.sampling.validate();
  resolve_budget(o);
  o.engine.scheduling = o.scheduling == "priority" ? zipage::scheduling_order::priority : zipage::scheduling_order::fcfs;
  zipage::check(std::isfinite(o.kv_cache_mib) && o.kv_cache_mib >= min_kv_cache_mib &&
                    o.kv_cache_mib <= max_kv_cache_mib,
                "--kv-cache-mib ", o.kv_cache_mib, " is out of range: it must be in [2^-20 (one byte), ",
                max_kv_cache_mib, "]");
  if (o.engine.gpu_memory_utilization <= 0.0) check_host_kv_cache_mib(o.kv_cache_mib, o.engine.num_blocks);
  o.engine.kv_cache_bytes = static_cast<std::size_t>(o.kv_cache_mib * 1024.0 * 1024.0);
  if (o.engine.gpu_memory_utilization > 0.0) size_gpu_pool(o, model.config(), backend);
  int rc = -1;
  if constexpr (std::is_same_v<Backend, zipage::cpu_backend>) {
    if (o.tensor_parallel_size > 1) return build_tensor_parallel_engine(o, model, text, f);
  }
  zipage::for_each_builtin_policy([&](auto policy) {
    if (policy.name() != o.policy) return;
    zipage::engine<zipage::llama_model<Backend>, decltype(policy), zipage::zipage_scheduler, Backend> eng(
        std::move(model), o.engine, policy, backend);
    rc = f(eng, text);
  });
  return rc;
}

// The device's word on the linear weights once they are loaded (cuda_backend: how many are FP8, how many stayed
// in the compute dtype because cuBLASLt's FP8 GEMM refuses their shape).
template <class Backend>
void print_linear_weights(const engine_options& o, const Backend& backend) {
  if constexpr (requires { backend.describe_weights(); })
    if (!o.quiet) std::fprintf(stderr, "weights: %s\n", backend.describe_weights().c_str());
}

// --chat-template: auto and plain keep the tokenizer's own template; a file replaces it (vLLM's); a built-in
// format's name renders with zipage's copy of that family's template.
inline void choose_chat_template(const engine_options& o, zipage::bpe_tokenizer& tokenizer) {
  if (o.chat_template == "plain") return;
  if (o.chat_template == "auto") {
    // The tokenizer loads without it (completions need none); said once here, not only by each chat request.
    if (!tokenizer.chat_template_error().empty() && !o.quiet)
      std::fprintf(stderr, "warning: the checkpoint's chat template cannot be used (%s): chat requests will fail; "
                   "--chat-template FILE gives another\n", tokenizer.chat_template_error().c_str());
    return;
  }
  std::error_code ec;
  if (std::filesystem::is_regular_file(o.chat_template, ec)) {
    tokenizer.set_chat_template(zipage::json::read_text_file(o.chat_template, "--chat-template file"),
                                "--chat-template " + o.chat_template);
    return;
  }
  zipage::check(!std::filesystem::exists(o.chat_template, ec), "--chat-template: '", o.chat_template,
                "' is not a regular file");
  try {
    tokenizer.use_builtin_chat_format(zipage::chat_format_from_name(o.chat_template));
  } catch (const zipage::error& e) {
    zipage::fail("--chat-template: '", o.chat_template, "' is neither a file nor auto, plain or a built-in format: ", e.what());
  }
}

template <class Backend, class F>
int load_and_run(engine_options& o, const Backend& backend, F& f) {
  if (o.model.empty()) o.model = default_model_path();
  if (std::filesystem::is_directory(o.model)) {  // a Hugging Face checkpoint
    resolve_sampling(o, generation_config_of(o, [&] { return zipage::load_generation_config(o.model); }));
    auto tokenizer = zipage::bpe_tokenizer::from_dir(o.model);
    choose_chat_template(o, tokenizer);
    // The pair is checked before the weights load (a mismatch would otherwise fail a batch halfway).
    const auto config = zipage::load_hf_checkpoint_config(o.model);
    zipage::check_vocabulary_pair(config, tokenizer, (std::filesystem::path(o.model) / "config.json").string(),
                                  (std::filesystem::path(o.model) / "tokenizer.json").string());
    if (o.tensor_parallel_size > 1) (void)zipage::parallel::tp_layout::make(config, o.tensor_parallel_size);  // before the weights
    auto model = zipage::load_hf_checkpoint<Backend>(o.model, backend);
    if (const auto q = zipage::load_hf_quantization(o.model); q.fp8 && !o.quiet)
      std::fprintf(stderr, "weights: FP8 e4m3 with %dx%d block scales (quantization_config), dequantised at load\n",
                   q.block_rows, q.block_cols);
    print_linear_weights(o, backend);
    // The engine stops at every end-of-sequence id of the config (eos and extra_eos); the tokenizer's
    // own EOS ends a turn too (e.g. Qwen3's <|im_end|>).
    if (tokenizer.eos() >= 0 && tokenizer.eos() != model.config().eos) {
      o.end_of_turn_ids.push_back(tokenizer.eos());
      o.engine.tokenizer_eos = tokenizer.eos();  // the EOS without a stop_reason, as vLLM's (engine_config)
    }
    o.engine.make_detokenizer = zipage::detokenizer_factory(tokenizer);
    o.engine.encode_words = zipage::words_encoder(tokenizer);
    o.engine.guide_vocab = zipage::guide_vocabulary_of(tokenizer);
    return build_engine(o, std::move(model), backend, model_text{.bpe = &tokenizer}, f);
  }
  const auto file = zipage::gguf::file::open(o.model);
  resolve_sampling(o, generation_config_of(o, [&] { return zipage::generation_defaults_from_gguf(file); }));
  const auto config = zipage::llama_config_from_gguf(file);
  // Loads the weights once the vocabulary agrees with them (Qwen / Llama 3 files: byte-level BPE; the eos set
  // is in config.extra_eos).
  auto run = [&](const auto& tokenizer, model_text text) {
    zipage::check_vocabulary_pair(config, tokenizer, o.model + " (token_embd.weight)", o.model + " (tokenizer.ggml.tokens)");
    if (o.tensor_parallel_size > 1) (void)zipage::parallel::tp_layout::make(config, o.tensor_parallel_size);  // before the weights
    auto model = zipage::load_llama_gguf<Backend>(file, backend);
    print_linear_weights(o, backend);
    o.engine.make_detokenizer = zipage::detokenizer_factory(tokenizer);
    o.engine.encode_words = zipage::words_encoder(tokenizer);
    o.engine.guide_vocab = zipage::guide_vocabulary_of(tokenizer);
    return build_engine(o, std::move(model), backend, text, f);
  };
  if (zipage::gguf_has_bpe_vocab(file)) {
    auto tokenizer = zipage::bpe_tokenizer::from_gguf(file);
    choose_chat_template(o, tokenizer);
    return run(tokenizer, model_text{.bpe = &tokenizer});
  }
  zipage::check(o.chat_template == "auto" || o.chat_template == "plain", "--chat-template ", o.chat_template, ": ",
                o.model, " has a SentencePiece vocabulary, which zipage renders no chat template for");
  const auto tokenizer = zipage::spm_tokenizer::from_gguf(file);
  return run(tokenizer, model_text{.spm = &tokenizer});
}

}  // namespace detail

// A flag for the other device's backend would be ignored where the run lands: refused instead, naming it.
inline void check_flags_for_device(const engine_options& o, bool gpu, zipage::kv_cache_dtype kv_dtype,
                                   zipage::weight_dtype weights) {
  if (gpu) {
    zipage::check(!given(o, "--kv-cache-mib"), "--kv-cache-mib sizes the CPU backend's pool; on the GPU the pool is "
                  "--gpu-memory-utilization of device memory (default 0.9), or exactly --num-blocks blocks");
    return;
  }
  zipage::check(kv_dtype == zipage::kv_cache_dtype::auto_, "--kv-cache-dtype ", o.kv_cache_dtype,
                ": the CPU backend keeps an fp32 KV cache; the FP8 KV cache runs on the GPU (--device cuda)");
  zipage::check(weights != zipage::weight_dtype::fp8_e4m3, "--quantization ", o.quantization,
                ": the CPU backend keeps fp32 weights; FP8 weights run on the GPU (--device cuda)");
  refuse_gpu_pool_flags_on_cpu(given(o, "--dtype"), o.dtype, given(o, "--gpu-memory-utilization"), 64);
}

// Loads the model on the device --device picks (the GPU when asked for, or for auto when the build has it
// and a device is present), builds the engine and returns f(engine, model_text). The tokenizer and the
// engine live until f returns.
template <class F>
int with_engine(engine_options& o, F&& f) {
  const zipage::kv_cache_dtype kv_dtype = zipage::parse_kv_cache_dtype(o.kv_cache_dtype);
  const zipage::weight_dtype weights = zipage::parse_weight_quantization(o.quantization);
#if ZIPAGE_CLI_CUDA
  const bool gpu = o.device == "cuda" || (o.device == "auto" && zipage::cuda::device_count() > 0);
  if (gpu) {
    zipage::check(zipage::cuda::device_count() > 0, "--device cuda: no CUDA device (",
                  zipage::cuda::describe_device(), ")");
    zipage::check(o.tensor_parallel_size == 1, "--tensor-parallel-size ", o.tensor_parallel_size,
                  " runs on the CPU only for now (the GPU collectives are not wired into the CUDA backend yet: "
                  "docs/tensor-parallel.md); add --device cpu");
    check_flags_for_device(o, true, kv_dtype, weights);
    zipage::cuda_backend_options bo;
    bo.dtype = o.dtype == "fp32" ? zipage::cuda_dtype::f32 : zipage::cuda_dtype::bf16;
    bo.kv_dtype = kv_dtype;
    bo.weight_dtype = weights;
    check_quantization_dtype(weights, o.quantization, o.dtype);
    // The pool comes from the device's memory unless --num-blocks fixes it.
    o.engine.gpu_memory_utilization = o.gpu_memory_utilization;
    const zipage::cuda_backend backend(bo);
    if (!o.quiet)
      std::fprintf(stderr, "device: %s (%s, KV cache %s, linear weights %s)\n", zipage::cuda::describe_device(0).c_str(),
                   o.dtype.c_str(),
                   kv_dtype == zipage::kv_cache_dtype::fp8_e4m3 ? "fp8_e4m3 + per token-head scales" : o.dtype.c_str(),
                   weights == zipage::weight_dtype::fp8_e4m3 ? "fp8_e4m3 + 128x128 block scales"
                   : weights == zipage::weight_dtype::auto_ ? "auto (fp8_e4m3 for an FP8 checkpoint)"
                                                            : o.dtype.c_str());
    return detail::load_and_run(o, backend, f);
  }
#else
  zipage::check(o.device != "cuda", "--device cuda: this build has no CUDA backend (configure with a CUDA compiler)");
#endif
  check_flags_for_device(o, false, kv_dtype, weights);
  if (!o.quiet) std::fprintf(stderr, "device: cpu (fp32 reference backend)\n");
  const zipage::cpu_backend backend{};
  return detail::load_and_run(o, backend, f);
}

}  // namespace zipage_cli
