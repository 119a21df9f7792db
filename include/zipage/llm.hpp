#pragma once
// zipage::llm: text in, text out, for the common case (vLLM's `LLM(model).generate(prompts)`).
//
//   zipage::llm llm("models/stories260K.gguf");           // a GGUF file or a Hugging Face checkpoint directory
//   for (const auto& out : llm.generate({"Once upon a time"})) std::cout << out.text;
//   for (const auto& piece : llm.stream({"Once upon a time"})) std::cout << piece.text << std::flush;
//
// It loads the model (a Llama-architecture GGUF file, or a Qwen3 / Qwen2 / Llama checkpoint directory:
// config.json, *.safetensors, tokenizer.json), its tokenizer, and wires the detokenizer into the engine, so
// outputs carry text and stop strings work. Sampling defaults come from the checkpoint's
// generation_config.json (temperature, top_k, top_p, min_p, repetition_penalty, max_new_tokens as max_tokens;
// do_sample false = greedy) or a GGUF file's general.sampling.* keys; a field it does not set takes vLLM's
// default (temperature 1, no filters, seed 0): default_sampling() says what they are. Parameters passed to
// generate()/stream() are used as given, as vLLM's SamplingParams are, plus the tokenizer's end of turn as a
// stop id where it is not the config's eos (Qwen3's <|im_end|> in a base checkpoint), unless ignore_eos.
//
// The engine behind it is zipage::engine<llama_model<Backend>, Policy>: Policy is zipage_policy (Compressed
// PagedAttention, engine_config::budget_tokens = 2048 tokens per request) unless basic_llm<OtherPolicy> is
// used (zipage::full_kv keeps every token). Backend is the CPU reference, or cuda_backend when the program
// links zipage::cuda (which defines ZIPAGE_WITH_CUDA) and a GPU is present (llm_options::device).
//
// Requests run as one continuous batch per call; one llm is used from one thread.
//
// Compile time: the engine and the model loader are instantiated by detail::load_llm below. A program that
// links zipage::prebuilt (ZIPAGE_PREBUILT) takes them, for the built-in policies on the CPU backend, from that
// library instead of compiling them itself (docs/packaging.md).
#include <algorithm>
#include <cstddef>
#include <deque>
#include <filesystem>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/engine/engine.hpp"
#include "zipage/gguf/gguf.hpp"
#include "zipage/models/hf_config.hpp"
#include "zipage/models/hf_loader.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/models/load_model.hpp"
#include "zipage/policy/policies.hpp"
#include "zipage/tokenizer/bpe_tokenizer.hpp"
#include "zipage/tokenizer/detokenizer.hpp"
#include "zipage/tokenizer/spm_tokenizer.hpp"

#if ZIPAGE_WITH_CUDA
#include "zipage/backend/cuda/cuda_backend.hpp"
#include "zipage/cuda/device.hpp"
#endif

namespace zipage {

// Where the model runs: automatic = the GPU when the program links zipage::cuda and a device is present.
enum class llm_device { automatic, cpu, cuda };

struct llm_options {
  llm_device device = llm_device::automatic;
  bool fp32 = false;  // GPU: fp32 weights, activations and KV instead of bf16 (the CPU is always fp32)
  // Pool, scheduling and compression settings. make_detokenizer is set by llm. On the GPU, when neither
  // num_blocks nor gpu_memory_utilization is set, the pool takes 0.9 of the device's memory (less the
  // weights and the activation peak), capped at what max_num_seqs requests at the model's context fill.
  engine_config engine{};
};

// One prompt's result.
struct completion {
  std::string prompt{};
  std::vector<token_id> prompt_token_ids{};
  std::string text{};                  // the generated text (a stop string and what follows it cut off)
  std::vector<token_id> token_ids{};   // the generated tokens
  finish_reason reason = finish_reason::none;  // eos, length, stop_string, stop_token; error or cancelled
  stopped_by stop_reason{};            // vLLM's: the stop token id or stop string that ended it (sequence.hpp)
  std::string error{};                 // why, when reason == finish_reason::error
  std::vector<float> logprobs{};       // with sampling_params::logprobs: each generated token's
  std::vector<std::vector<token_logprob>> top_logprobs{};  // with sampling_params::top_logprobs: per token, best first
  int num_compressions = 0;            // times its KV cache was compressed

  [[nodiscard]] bool ok() const { return reason != finish_reason::error && reason != finish_reason::cancelled; }
};

// One token of one prompt, as it is generated.
struct stream_piece {
  std::size_t index = 0;  // the prompt's index in the call
  token_id token = 0;
  std::string text{};     // the text this token completed (may be empty mid-character)
  bool finished = false;  // the prompt's last piece
  finish_reason reason = finish_reason::none;
  stopped_by stop_reason{};  // on the last piece: the stop token id or stop string that ended it (completion's)
};

namespace detail {

// The engine behind an llm, whatever its backend.
class llm_runtime {
 public:
  virtual ~llm_runtime() = default;
  virtual std::vector<request_id> add(const std::vector<std::vector<token_id>>& prompts, const sampling_params& p) = 0;
  virtual std::vector<step_event> step() = 0;
  [[nodiscard]] virtual bool has_unfinished() const = 0;
  virtual request_output take(request_id id) = 0;
  virtual bool cancel(request_id id) = 0;
  [[nodiscard]] virtual bool finished(request_id id) const = 0;
  [[nodiscard]] virtual const model_config& config() const = 0;
  [[nodiscard]] virtual const memory_plan& memory() const = 0;
  [[nodiscard]] virtual engine_stats stats() const = 0;
  [[nodiscard]] virtual const char* backend_name() const = 0;
};

template <class Engine>
class llm_runtime_of final : public llm_runtime {
 public:
  template <class... Args>
  explicit llm_runtime_of(const char* backend, Args&&... args) : backend_(backend), e_(std::forward<Args>(args)...) {}
  std::vector<request_id> add(const std::vector<std::vector<token_id>>& prompts, const sampling_params& p) override {
    return e_.add_requests(prompts, p);
  }
  std::vector<step_event> step() override { return e_.step(); }
  [[nodiscard]] bool has_unfinished() const override { return e_.has_unfinished(); }
  request_output take(request_id id) override { return e_.take_output(id); }
  bool cancel(request_id id) override { return e_.cancel(id); }
  [[nodiscard]] bool finished(request_id id) const override { return e_.request(id).is_finished(); }
  [[nodiscard]] const model_config& config() const override { return e_.config(); }
  [[nodiscard]] const memory_plan& memory() const override { return e_.memory(); }
  [[nodiscard]] engine_stats stats() const override { return e_.stats(); }
  [[nodiscard]] const char* backend_name() const override { return backend_; }

 private:
  const char* backend_;
  Engine e_;
};

// The state every call and stream of one llm shares: the engine, and the step events of requests whose
// consumer has not read them yet (several streams may be open at once).
struct llm_state {
  std::unique_ptr<llm_runtime> runtime;
  std::unordered_map<request_id, std::deque<step_event>> pending;

  // Runs one engine step and files its events under their requests.
  void step() {
    for (auto& e : runtime->step()) {
      auto it = pending.find(e.id);
      if (it != pending.end()) it->second.push_back(std::move(e));
    }
  }
};

inline completion to_completion(request_output&& out, std::string prompt) {
  completion c;
  c.prompt = std::move(prompt);
  c.prompt_token_ids = std::move(out.prompt);
  c.text = std::move(out.text);
  c.token_ids = std::move(out.output);
  c.reason = out.reason;
  c.stop_reason = std::move(out.stop_reason);
  c.error = std::move(out.error_message);
  c.logprobs = std::move(out.logprobs);
  c.top_logprobs = std::move(out.top_logprobs);
  c.num_compressions = out.num_compressions;
  return c;
}

}  // namespace detail

// The pieces of a streamed call, in the order they are generated (an input range: read it once). The
// pieces of different prompts interleave; stream_piece::index says whose each is. After the last piece,
// results() holds every prompt's completion. Destroying a stream before its end cancels what is left.
// A stream must not outlive the llm that made it.
class llm_stream {
 public:
  class iterator {
   public:
    using value_type = stream_piece;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    explicit iterator(llm_stream* s) : s_(s) {}
    const stream_piece& operator*() const { return s_->current_; }
    const stream_piece* operator->() const { return &s_->current_; }
    iterator& operator++() {
      s_->advance();
      return *this;
    }
    void operator++(int) { s_->advance(); }
    [[nodiscard]] bool at_end() const { return s_->done_; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) { return it.at_end(); }

   private:
    llm_stream* s_ = nullptr;
  };

  llm_stream(detail::llm_state& state, std::vector<std::string> prompts, std::vector<request_id> ids)
      : state_(&state), prompts_(std::move(prompts)), ids_(std::move(ids)), results_(ids_.size()) {
    for (request_id id : ids_) state_->pending[id];
    unfinished_ = ids_.size();
  }
  llm_stream(const llm_stream&) = delete;
  llm_stream& operator=(const llm_stream&) = delete;
  ~llm_stream() {
    for (std::size_t i = 0; i < ids_.size(); ++i) {
      if (taken_.count(ids_[i]) == 0) {
        try {
          state_->runtime->cancel(ids_[i]);
          (void)state_->runtime->take(ids_[i]);
        } catch (const error&) {  // nothing to hand back: the request is gone already
        }
      }
      state_->pending.erase(ids_[i]);
    }
  }

  iterator begin() {
    if (!started_) {
      started_ = true;
      advance();
    }
    return iterator(this);
  }
  std::default_sentinel_t end() const { return {}; }

  // Every prompt's completion, in prompt order; complete once the stream has been read to its end.
  [[nodiscard]] const std::vector<completion>& results() const { return results_; }

 private:
  void advance() {
    while (buffer_.empty() && unfinished_ > 0) {
      collect();
      if (buffer_.empty()) state_->step();
      collect();
    }
    if (buffer_.empty()) {
      done_ = true;
      return;
    }
    current_ = std::move(buffer_.front());
    buffer_.pop_front();
  }

  // Moves this stream's filed events into its buffer; a finished request's completion is taken now. A
  // request that ended without a step event (its compression failed) gets a last, empty piece.
  void collect() {
    for (std::size_t i = 0; i < ids_.size(); ++i) {
      if (taken_.count(ids_[i]) > 0) continue;
      auto it = state_->pending.find(ids_[i]);
      for (step_event& e : it->second) {
        buffer_.push_back({i, e.token, std::move(e.text), e.finished, e.reason, std::move(e.stop_reason)});
        if (e.finished) finish(i);
      }
      it->second.clear();
      if (taken_.count(ids_[i]) == 0 && state_->runtime->finished(ids_[i])) {
        finish(i);
        buffer_.push_back({i, 0, {}, true, results_[i].reason});
      }
    }
  }

  void finish(std::size_t i) {
    results_[i] = detail::to_completion(state_->runtime->take(ids_[i]), prompts_[i]);
    taken_.insert(ids_[i]);
    --unfinished_;
  }

  detail::llm_state* state_;
  std::vector<std::string> prompts_;
  std::vector<request_id> ids_;
  std::unordered_set<request_id> taken_;
  std::vector<completion> results_;
  std::deque<stream_piece> buffer_;
  stream_piece current_;
  std::size_t unfinished_ = 0;
  bool started_ = false;
  bool done_ = false;
};

namespace detail {

// What basic_llm is made of once its model is loaded: the tokenizer (one of the two; the runtime's
// detokenizers refer to it, so it must outlive the runtime), the checkpoint's sampling defaults and stop ids,
// and the engine behind a virtual interface.
struct llm_parts {
  std::unique_ptr<const spm_tokenizer> spm;
  std::unique_ptr<const bpe_tokenizer> bpe;
  generation_defaults generation;
  std::vector<token_id> stop_token_ids;
  std::unique_ptr<llm_runtime> runtime;
};

// Loads the model at `path` onto `backend` and builds engine<llama_model<Backend>, Policy> around it with the
// tokenizer's detokenizer wired in. All of basic_llm's template-heavy work is here, in a function template
// that is not inline: zipage::prebuilt compiles it once for the built-in policies on the CPU backend, and
// the extern template declarations below (ZIPAGE_PREBUILT) keep a program that links it from compiling it again.
template <class Policy, class Backend>
llm_parts load_llm(const std::filesystem::path& path, const engine_config& options, Policy policy, Backend backend,
                   const char* name) {
  loaded_model<Backend> loaded = load_model<Backend>(path, backend);
  // Wired before the tokenizers move into parts: the functions refer to the tokenizer objects, which stay put.
  engine_config cfg = loaded.engine_settings(options);
  llm_parts parts;
  parts.generation = std::move(loaded.generation);
  parts.stop_token_ids = std::move(loaded.stop_token_ids);
  parts.spm = std::move(loaded.spm);
  parts.bpe = std::move(loaded.bpe);
  if constexpr (requires { backend.memory_info(); }) {
    if (cfg.num_blocks == 0 && cfg.gpu_memory_utilization == 0.0) {
      cfg.gpu_memory_utilization = 0.9;
      if (cfg.max_kv_cache_bytes == 0) {
        const auto& c = loaded.model.config();
        std::size_t scale_bytes = 0;  // a quantised (FP8) cache's per token-head scales
        if constexpr (requires { backend.kv_scale_bytes(); }) scale_bytes = backend.kv_scale_bytes();
        const double per_token =
            static_cast<double>(kv_bytes_per_token(c, backend.kv_element_bytes(), Policy::evicts, scale_bytes));
        cfg.max_kv_cache_bytes = static_cast<std::size_t>(per_token * cfg.max_num_seqs * std::max(c.max_context, 4096));
      }
    }
  }
  using engine_type = engine<llama_model<Backend>, Policy, zipage_scheduler, Backend>;
  parts.runtime = std::make_unique<llm_runtime_of<engine_type>>(name, std::move(loaded.model), std::move(cfg),
                                                               std::move(policy), backend);
  return parts;
}

}  // namespace detail

// The built-in policies, for X-macros: zipage::prebuilt compiles basic_llm's loader for each on the CPU backend.
#define ZIPAGE_BUILTIN_POLICIES(X) X(full_kv) X(streaming_llm) X(h2o) X(snapkv) X(rkv) X(gkv) X(zipage_policy)

// Linking zipage::prebuilt defines ZIPAGE_PREBUILT: the CPU backend's model loader and basic_llm's loader for
// the built-in policies are then taken from the library instead of being compiled in every program (a
// program that does not link it compiles them itself, as any header-only use).
#define ZIPAGE_PREBUILT_LLM_DECLARATION(Policy)                                                                   \
  extern template detail::llm_parts detail::load_llm<Policy, cpu_backend>(const std::filesystem::path&,             \
                                                                          const engine_config&, Policy, cpu_backend, \
                                                                          const char*);
#if ZIPAGE_PREBUILT
extern template loaded_model<cpu_backend> load_model<cpu_backend>(const std::filesystem::path&, const cpu_backend&);
ZIPAGE_BUILTIN_POLICIES(ZIPAGE_PREBUILT_LLM_DECLARATION)
#endif

template <class Policy = zipage_policy>
class basic_llm {
 public:
  // Loads `model`: a GGUF file, or a Hugging Face checkpoint directory. Throws zipage::error naming the
  // file and what is wrong.
  explicit basic_llm(const std::filesystem::path& model, llm_options options = {}, Policy policy = {}) {
#if ZIPAGE_WITH_CUDA
    const bool gpu = options.device == llm_device::cuda ||
                     (options.device == llm_device::automatic && cuda::device_count() > 0);
    if (gpu) {
      check(cuda::device_count() > 0, "llm: llm_device::cuda asked for, but there is no CUDA device (",
            cuda::describe_device(), ")");
      cuda_backend_options bo;
      bo.dtype = options.fp32 ? cuda_dtype::f32 : cuda_dtype::bf16;
      load<cuda_backend>(model, options, std::move(policy), cuda_backend(bo), "cuda");
      return;
    }
#else
    check(options.device != llm_device::cuda,
          "llm: llm_device::cuda asked for, but the program does not link zipage::cuda (a build with a CUDA compiler)");
#endif
    load<cpu_backend>(model, options, std::move(policy), cpu_backend{}, "cpu");
  }

  // The sampling parameters generate() and stream() use when given none: the checkpoint's
  // generation_config.json or GGUF general.sampling.* keys over vLLM's defaults (temperature 1); max_tokens the
  // file's max_new_tokens (as vLLM's LLM reads it), else 256.
  [[nodiscard]] const sampling_params& default_sampling() const { return defaults_; }

  // Runs the prompts as one continuous batch; results in prompt order. All prompts are checked before any
  // runs: a bad one (too long for the pool or the model's context, ...) throws zipage::error naming its
  // index, and nothing runs.
  std::vector<completion> generate(const std::vector<std::string>& prompts) { return generate(prompts, defaults_); }
  std::vector<completion> generate(const std::vector<std::string>& prompts, const sampling_params& params) {
    llm_stream s = stream(prompts, params);
    for (auto it = s.begin(); it != s.end(); ++it) {
    }
    return s.results();
  }
  // The same, calling on_piece with every token as it is generated.
  std::vector<completion> generate(const std::vector<std::string>& prompts, const sampling_params& params,
                                   const std::function<void(const stream_piece&)>& on_piece) {
    llm_stream s = stream(prompts, params);
    for (const stream_piece& piece : s) on_piece(piece);
    return s.results();
  }

  // The pieces of the prompts' outputs as they are generated:
  //   for (const auto& piece : llm.stream({"Once upon a time"})) std::cout << piece.text << std::flush;
  llm_stream stream(const std::vector<std::string>& prompts) { return stream(prompts, defaults_); }
  llm_stream stream(const std::vector<std::string>& prompts, const sampling_params& params) {
    std::vector<std::vector<token_id>> ids;
    ids.reserve(prompts.size());
    for (const auto& p : prompts) ids.push_back(encode(p));
    return llm_stream(*state_, prompts, state_->runtime->add(ids, with_model_stops(params)));
  }

  // Chat, as vLLM's LLM.chat: each conversation is rendered with the checkpoint's chat template
  // (bpe_tokenizer::apply_chat_template; completion::prompt holds the rendered text) and generated from.
  // A model without a chat template zipage recognises (GGUF files, stories260K) is an error.
  std::vector<completion> chat(const std::vector<std::vector<chat_message>>& conversations) {
    return chat(conversations, defaults_);
  }
  std::vector<completion> chat(const std::vector<std::vector<chat_message>>& conversations, const sampling_params& params,
                               const chat_options& options = {}) {
    check_chat_template();
    std::vector<std::string> prompts;
    for (const auto& messages : conversations) prompts.push_back(bpe_->apply_chat_template(messages, options));
    return chat_prompts(std::move(prompts), params);
  }
  // The same with OpenAI message objects (assistant tool_calls, tool results, reasoning_content, ...) and
  // options.tools, the tools the model may call, as vLLM's LLM.chat(messages, tools=...).
  std::vector<completion> chat_json(const std::vector<nlohmann::ordered_json>& conversations, const sampling_params& params,
                                    const chat_options& options = {}) {
    check_chat_template();
    std::vector<std::string> prompts;
    for (const auto& messages : conversations) prompts.push_back(bpe_->apply_chat_template_json(messages, options));
    return chat_prompts(std::move(prompts), params);
  }

 private:
  void check_chat_template() const {
    check(bpe_ && bpe_->has_chat_template(),
          "llm: chat needs a checkpoint whose tokenizer has a chat template (tokenizer_config.json, chat_template.jinja "
          "or a GGUF file's tokenizer.chat_template); this model has none (use generate() with plain prompts)");
  }
  // Generates from rendered chat prompts; the template writes any BOS itself.
  std::vector<completion> chat_prompts(std::vector<std::string> prompts, const sampling_params& params) {
    std::vector<std::vector<token_id>> ids;
    for (const auto& p : prompts) ids.push_back(bpe_->encode(p, false));
    llm_stream s(*state_, std::move(prompts), state_->runtime->add(ids, with_model_stops(params)));
    for (auto it = s.begin(); it != s.end(); ++it) {
    }
    return s.results();
  }

 public:
  // Text to prompt ids with the model's BOS convention (what generate() does), and ids back to text.
  [[nodiscard]] std::vector<token_id> encode(const std::string& text) const {
    return bpe_ ? bpe_->encode(text, bpe_->add_bos()) : spm_->encode(text, spm_->add_bos());
  }
  [[nodiscard]] std::string decode(std::span<const token_id> ids) const {
    return bpe_ ? bpe_->decode(ids, true) : spm_->decode(ids);
  }
  // The Hugging Face tokenizer (chat templates: bpe_tokenizer::apply_chat_template), or null for GGUF files.
  [[nodiscard]] const bpe_tokenizer* hf_tokenizer() const { return bpe_.get(); }

  [[nodiscard]] const model_config& config() const { return state_->runtime->config(); }
  [[nodiscard]] const memory_plan& memory() const { return state_->runtime->memory(); }
  [[nodiscard]] engine_stats stats() const { return state_->runtime->stats(); }
  // "cpu" or "cuda".
  [[nodiscard]] const char* device() const { return state_->runtime->backend_name(); }

 private:
  template <class Backend>
  void load(const std::filesystem::path& path, llm_options& options, Policy policy, Backend backend, const char* name) {
    detail::llm_parts parts = detail::load_llm<Policy, Backend>(path, options.engine, std::move(policy), std::move(backend), name);
    parts.generation.apply(defaults_);  // over sampling_params' defaults, vLLM's: temperature 1 unless the checkpoint says otherwise
    model_stop_ids_ = std::move(parts.stop_token_ids);  // added per call (with_model_stops), not to defaults_
    spm_ = std::move(parts.spm);
    bpe_ = std::move(parts.bpe);
    state_->runtime = std::move(parts.runtime);
  }

  [[nodiscard]] sampling_params with_model_stops(sampling_params p) const {
    return with_end_of_turn(std::move(p), model_stop_ids_);
  }

  // Declared first, so destroyed last: the engine's detokenizers refer to the tokenizer (one of the two).
  std::unique_ptr<const spm_tokenizer> spm_;
  std::unique_ptr<const bpe_tokenizer> bpe_;
  sampling_params defaults_;
  std::vector<token_id> model_stop_ids_;
  std::unique_ptr<detail::llm_state> state_ = std::make_unique<detail::llm_state>();
};

// The common case: Compressed PagedAttention with the zipage policy.
using llm = basic_llm<zipage_policy>;

}  // namespace zipage
