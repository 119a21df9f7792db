#pragma once
// zipage::engine<Model, EvictionPolicy, Scheduler, Backend>: the pieces composed at compile time.
// The engine owns the KV pool and the requests; each step() asks the scheduler for a plan, lays the
// planned tokens out as one batch, runs the model once, samples one token per request and retires
// finished requests.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zipage/backend/cpu/cpu_backend.hpp"
#include "zipage/block/block_pool.hpp"
#include "zipage/compression/compression_worker.hpp"
#include "zipage/concepts.hpp"
#include "zipage/engine/compression_budget.hpp"
#include "zipage/engine/memory_plan.hpp"
#include "zipage/engine/memory_profile.hpp"
#include "zipage/core/error.hpp"
#include "zipage/model/concepts.hpp"
#include "zipage/policy/eviction_policy.hpp"
#include "zipage/request/sequence.hpp"
#include "zipage/sampling/logprobs.hpp"
#include "zipage/sampling/sampler.hpp"
#include "zipage/scheduler/scheduler.hpp"
#include "zipage/scheduler/zipage_scheduler.hpp"

namespace zipage {

// Every member has a default initialiser, so designated initialisers such as
// `engine_config{.block_size = 16, .num_blocks = 1024}` compile without -Wmissing-field-initializers warnings.
struct engine_config {
  int block_size = 16;
  int num_blocks = 0;                        // KV pool size; 0 = plan it from kv_cache_bytes (must be >= 0)
  std::size_t kv_cache_bytes = 64ull << 20;  // memory for blocks and query slots when num_blocks == 0
  // On a backend that reports its device memory (memory_info() -> {free, total}): when > 0, the KV cache
  // gets this fraction of the device's memory minus what is in use (weights, workspaces, and the
  // activation peak: the engine first runs one profiling forward of max_batched_tokens tokens, as vLLM's
  // profile_run), as vLLM's gpu_memory_utilization; replaces kv_cache_bytes.
  double gpu_memory_utilization = 0.0;
  // With gpu_memory_utilization: the KV cache takes at most this many bytes (0 = no cap), e.g. what
  // max_num_seqs requests could ever fill, so a small model does not get a pool it can never use.
  std::size_t max_kv_cache_bytes = 0;
  int max_num_seqs = 256;                    // running requests at most
  int max_batched_tokens = 8192;             // tokens per step (decodes and prefill chunks together)
  // Compressed PagedAttention (used when the eviction policy evicts): each request keeps budget_tokens
  // tokens (a whole number of blocks: B = budget_tokens / block_size), compressing at block boundaries;
  // window = W recent queries. The method's defaults: 2048 tokens, W = 16, whatever the block size.
  int budget_tokens = default_budget_tokens;
  int window = default_window;
  int num_query_slots = 0;        // 0 = the memory plan's max concurrency, capped at max_num_seqs
  bool hybrid = true;             // requests without a query slot run with full KV until they need one
  bool prefix_caching = true;     // share full prompt blocks between requests (zipage_scheduler)
  bool async_compression = true;  // compress on a worker thread while other requests decode
  // fcfs, or priority: requests ordered by sampling_params::priority (lower first), less urgent running
  // requests giving way to a more urgent waiting one (zipage_scheduler).
  scheduling_order scheduling = scheduling_order::fcfs;
  // The model's trained context (model_config::max_context, when known) is enforced by default: a prompt
  // of max_context tokens or more is refused by add_request, and a request stops (finish_reason::length)
  // when prompt + output reach max_context. Set true to opt out, e.g. for compressed long generation, where
  // an evicting policy keeps each request's cache at budget_tokens however long it generates.
  bool allow_beyond_context = false;
  // Makes a fresh streaming detokenizer per request, given its prompt (so the first generated piece is
  // spaced as it follows the prompt). Without it, request_output::text and step_event::text stay empty
  // and a request with stop strings is refused: set it to zipage::detokenizer_factory(tokenizer)
  // (zipage/tokenizer/detokenizer.hpp; the tokenizer must outlive the engine), or use zipage::llm
  // (zipage/llm.hpp), which wires it itself.
  std::function<streaming_detokenizer(std::span<const token_id> prompt)> make_detokenizer{};

  // B: blocks a compressed request keeps. Throws when budget_tokens is not a positive multiple of block_size.
  [[nodiscard]] int budget_blocks() const { return budget_blocks_for(budget_tokens, block_size); }
  // The compression settings these fields make, checked (budget a whole number of blocks, 1 <= W <= block_size).
  [[nodiscard]] compression_params compression() const {
    const compression_params p{block_size, budget_blocks(), window};
    p.validate();
    return p;
  }
};

// One token produced for one request in a step (what a streaming client sees).
struct step_event {
  request_id id = 0;
  token_id token = 0;
  std::string text;  // text this token completed (may be empty mid-character)
  bool finished = false;
  finish_reason reason = finish_reason::none;
};

struct request_output {
  request_id id = 0;
  std::vector<token_id> prompt;
  std::vector<token_id> output;
  std::string text;
  finish_reason reason = finish_reason::none;
  std::string error_message;
  int num_preemptions = 0;
  int num_compressions = 0;
  std::vector<float> logprobs;  // when sampling_params::logprobs
  std::vector<std::vector<token_logprob>> top_logprobs;  // when sampling_params::top_logprobs > 0: per token
};

struct engine_stats {
  std::int64_t steps = 0;
  std::int64_t prefill_steps = 0;
  std::int64_t decode_steps = 0;
  std::int64_t prompt_tokens = 0;     // tokens fed in prefill steps (recomputation included)
  std::int64_t generated_tokens = 0;
  std::int64_t preemptions = 0;       // by recomputation
  std::int64_t swaps = 0;             // compressed requests moved to host memory
  std::int64_t compressions = 0;
  std::int64_t tokens_evicted = 0;
  std::int64_t prefix_hit_tokens = 0; // prompt tokens whose KV came from the prefix cache
  std::int64_t prefix_lookups = 0, prefix_hits = 0;  // full-block lookups
  std::int64_t graph_steps = 0;       // decode steps run through the backend's decode graphs
  std::int64_t graph_padding_rows = 0;  // padding rows those steps added to reach the graph's batch size
  int num_blocks = 0;
  int peak_blocks_used = 0;
  int blocks_in_use = 0;
  int peak_running = 0;
  int running = 0;
  int waiting = 0;
  int swapped = 0;
  int compressing = 0;
  int slots_in_use = 0;
  int num_query_slots = 0;

  [[nodiscard]] double prefix_hit_rate() const {
    return prompt_tokens + prefix_hit_tokens > 0
               ? static_cast<double>(prefix_hit_tokens) / static_cast<double>(prompt_tokens + prefix_hit_tokens)
               : 0.0;
  }
};

namespace detail {
struct no_backend {};
template <class M>
struct model_backend { using type = no_backend; };
template <class M>
  requires requires { typename M::backend_type; }
struct model_backend<M> { using type = typename M::backend_type; };
}  // namespace detail

template <class Model, class EvictionPolicy = full_kv, class Scheduler = zipage_scheduler,
          class Backend = typename detail::model_backend<Model>::type>
class engine {
  static_assert(!std::same_as<Backend, detail::no_backend>,
                "zipage::engine: the Model type must name its backend: add `using backend_type = "
                "zipage::cpu_backend;` (or another backend) to it");
  // One check per missing piece, each saying what to add (the concepts: zipage/concepts.hpp).
  static_assert(concept_parts::model_config_member<Model>,
                "zipage::engine: the Model lacks `const zipage::model_config& config() const`");
  static_assert(concept_parts::model_forward<Model>,
                "zipage::engine: the Model lacks `backend_type::tensor forward(zipage::forward_context<backend_type>& ctx)` "
                "returning logits [ctx.logits_rows().size()][vocab] (or `const backend_type::tensor&` to logits it keeps); "
                "it calls ctx.attention(layer, q, k, v, out) once per layer");
  static_assert(backend_ops<Backend>,
                "zipage::engine: the Backend lacks ops of zipage::backend_ops (tensor, kv_storage, from_host, to_host, "
                "allocate_kv, embedding, rms_norm, linear, add_bias, rope, silu_mul, add, gather_rows, attention; "
                "zipage/model/concepts.hpp): derive from zipage::cpu_backend and override what you change");
  static_assert(backend_kv_movement<Backend>,
                "zipage::engine: the Backend lacks KV movement (zipage::backend_kv_movement): `using swap_blob = ...;`, "
                "`copy_block(kv, from, to)`, `swap_blob swap_out(kv, pages, slot)` and `swap_in(kv, pages, slot, blob&)`; "
                "derive from zipage::cpu_backend to inherit them");
  static_assert(!concept_parts::evicts<EvictionPolicy> || evicting_backend<Backend>,
                "zipage::engine: an evicting policy needs a Backend with the compression members (zipage::evicting_backend): "
                "gather_keys, gather_scores, gather_window_queries and apply_compaction (derive from zipage::cpu_backend), "
                "or use zipage::full_kv");
  static_assert(std::same_as<Backend, typename detail::model_backend<Model>::type>,
                "zipage::engine: the model was built for another backend; instantiate the model with the same "
                "Backend (e.g. llama_model<cpu_backend>) or leave the engine's Backend parameter defaulted");
  static_assert(concept_parts::policy_name<EvictionPolicy>,
                "zipage::engine: the EvictionPolicy lacks `std::string_view name() const`");
  static_assert(concept_parts::policy_flags<EvictionPolicy>,
                "zipage::engine: the EvictionPolicy lacks `static constexpr bool evicts` and `uses_score_cache`: derive "
                "from zipage::policy_base (evicts = true, no score cache)");
  static_assert(concept_parts::policy_score<EvictionPolicy>,
                "zipage::engine: the EvictionPolicy lacks `void score(const zipage::score_context& ctx, std::span<float> "
                "keep_score, std::span<float> cache_out) const` (or derive from zipage::recipe_policy<P> and define "
                "`score_recipe recipe() const`)");
  static_assert(concept_parts::policy_schedule<EvictionPolicy>,
                "zipage::engine: the EvictionPolicy lacks `should_compress(kv_len, params)` and `keep_tokens(params)`: "
                "derive from zipage::policy_base");
  static_assert(scheduler_policy<Scheduler>,
                "zipage::engine: Scheduler must satisfy zipage::scheduler_policy (constructible from "
                "(scheduler_config, block_pool&) with add/schedule/commit/finish/remove); see zipage_scheduler");

 public:
  using model_type = Model;
  using backend_type = Backend;
  using tensor = typename Backend::tensor;

  explicit engine(Model model, engine_config cfg = {}, EvictionPolicy policy = {}, Backend backend = {})
      : cfg_(std::move(cfg)),
        compression_(compression_settings(cfg_)),
        model_(std::move(model)),
        policy_(std::move(policy)),
        backend_(std::move(backend)),
        memory_(plan_memory(model_.config(), sized_memory_request())),
        pool_(checked_pool_blocks()),
        scheduler_(scheduler_settings(), pool_),
        kv_(backend_.allocate_kv(kv_shape())),
        worker_(backend_, kv_, policy_, compression_, model_.config(),
                EvictionPolicy::evicts && cfg_.async_compression) {}

  [[nodiscard]] const model_config& config() const { return model_.config(); }
  [[nodiscard]] const engine_config& settings() const { return cfg_; }
  [[nodiscard]] const EvictionPolicy& policy() const { return policy_; }
  [[nodiscard]] const memory_plan& memory() const { return memory_; }

  // Queues a request. Throws zipage::error (and changes nothing) for a request that can never run.
  request_id add_request(std::vector<token_id> prompt, sampling_params params = {}) {
    return enqueue(make_sequence(std::move(prompt), std::move(params)));
  }

  // Queues several requests, all or none: every prompt is checked before any is queued, so a bad one
  // throws zipage::error (naming its index) and leaves nothing queued.
  std::vector<request_id> add_requests(const std::vector<std::vector<token_id>>& prompts, const sampling_params& params) {
    std::vector<std::unique_ptr<sequence>> seqs;
    seqs.reserve(prompts.size());
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      try {
        seqs.push_back(make_sequence(prompts[i], params));
      } catch (const error& e) {
        fail("prompt ", i, " of ", prompts.size(), ": ", e.what(), " (no request was queued)");
      }
    }
    std::vector<request_id> ids;
    ids.reserve(seqs.size());
    for (auto& s : seqs) ids.push_back(enqueue(std::move(s)));
    return ids;
  }

  // Teacher forcing (evaluation): the request emits `forced` token by token instead of sampling, so its
  // logprobs score that continuation under this engine's (possibly compressed) cache.
  request_id add_forced_request(std::vector<token_id> prompt, std::vector<token_id> forced, sampling_params params = {}) {
    check(!forced.empty(), "request: the forced continuation is empty");
    params.max_tokens = static_cast<int>(forced.size());
    params.ignore_eos = true;
    params.stop.clear();
    params.stop_token_ids.clear();
    params.logprobs = true;
    const request_id id = add_request(std::move(prompt), std::move(params));
    requests_.at(id)->forced_tokens = std::move(forced);
    return id;
  }

  // Stops a request now; everything it held (blocks, query slot, host copy) is freed at once. Returns
  // false for an unknown or finished id.
  bool cancel(request_id id) {
    sequence* s = find(id);
    if (s == nullptr || s->is_finished()) return false;
    if (s->compressing) {
      worker_.wait_idle(s->id);  // the worker must not write into blocks that are about to be reused
      land_compressions(worker_.take_finished());
    }
    scheduler_.remove(s);
    swapped_state_.erase(s->id);
    s->status = request_status::finished;
    s->reason = finish_reason::cancelled;
    return true;
  }

  [[nodiscard]] bool has_unfinished() const {
    return scheduler_.num_waiting() + scheduler_.num_running() + scheduler_.num_swapped() > 0;
  }

  // Runs one step; returns the tokens it produced.
  std::vector<step_event> step() {
    land_compressions(worker_.take_finished());
    // Requests whose compression failed since the last step (here, or while cancel() waited) end now.
    std::vector<step_event> events = std::exchange(failed_events_, {});
    step_plan plan = scheduler_.schedule();
    for (sequence* s : plan.rejected) reject(*s, events);
    stats_.preemptions += static_cast<std::int64_t>(plan.preempted.size());
    move_state(plan);
    if (plan.batch.empty()) {
      // Nothing can run until a compression lands (its request holds the blocks others wait for).
      if (worker_.in_flight() > 0) land_compressions(worker_.wait_finished());
      for (auto& e : std::exchange(failed_events_, {})) events.push_back(std::move(e));
      return events;
    }

    build_batch(plan);
    const tensor& logits = forward(plan);
    const std::vector<token_id> sampled = sample_all(plan, logits);

    std::size_t row = 0;
    for (const scheduled_seq& e : plan.batch) {
      sequence& s = *e.seq;
      const bool samples = e.samples();  // before the sequence moves on
      record_entry(e.tokens, samples);
      s.kv_len += e.tokens;
      s.num_computed += e.tokens;
      if (!samples) {  // a prefill chunk short of the prompt's end, or a recomputation short of its last token
        if (s.recomputed_to_last_token() && worker_.planner().should_compress(s)) s.needs_compression = true;
        continue;
      }
      const token_id tok = sampled[row++];
      s.tokens.push_back(tok);
      events.push_back(on_token(s, tok));
      if (!s.is_finished() && worker_.planner().should_compress(s)) s.needs_compression = true;
    }
    scheduler_.commit(plan);
    record_step(plan);
    return events;
  }

  // Runs until every queued request is done.
  void run_to_completion(const std::function<void(const step_event&)>& on_event = {}) {
    while (has_unfinished()) {
      for (const auto& e : step())
        if (on_event) on_event(e);
    }
  }

  // Convenience: queue the prompts (all or none, as add_requests), run them as one continuous batch, return
  // outputs in prompt order.
  std::vector<request_output> generate(const std::vector<std::vector<token_id>>& prompts, const sampling_params& params) {
    const std::vector<request_id> ids = add_requests(prompts, params);
    run_to_completion();
    std::vector<request_output> out;
    out.reserve(ids.size());
    for (request_id id : ids) out.push_back(take_output(id));
    return out;
  }

  [[nodiscard]] const sequence& request(request_id id) const {
    const auto it = requests_.find(id);
    check(it != requests_.end(), "engine: unknown request id ", id);
    return *it->second;
  }

  // Hands a finished request's result over and forgets the request.
  request_output take_output(request_id id) {
    const sequence& s = request(id);
    check(s.is_finished(), "engine: request ", id, " has not finished");
    request_output out;
    out.id = id;
    out.prompt.assign(s.tokens.begin(), s.tokens.begin() + s.prompt_len);
    out.output.assign(s.tokens.begin() + s.prompt_len, s.tokens.end());
    out.text = s.output_text;
    out.reason = s.reason;
    out.error_message = s.error_message;
    out.num_preemptions = s.num_preemptions;
    out.num_compressions = s.num_compressions;
    out.logprobs = s.logprobs;
    out.top_logprobs = s.top_logprobs;
    requests_.erase(id);
    return out;
  }

  [[nodiscard]] engine_stats stats() const {
    engine_stats st = stats_;
    st.num_blocks = pool_.num_blocks();
    st.peak_blocks_used = pool_.peak_used();
    st.blocks_in_use = pool_.num_used();
    st.running = scheduler_.num_running();
    st.waiting = scheduler_.num_waiting();
    st.swapped = scheduler_.num_swapped();
    st.swaps = scheduler_.num_swaps();
    st.compressing = worker_.in_flight();
    st.slots_in_use = scheduler_.num_slots_in_use();
    st.num_query_slots = memory_.num_query_slots;
    st.prefix_hit_tokens = scheduler_.num_prefix_hit_tokens();
    st.prefix_lookups = pool_.prefix_lookups();
    st.prefix_hits = pool_.prefix_hits();
    return st;
  }

  [[nodiscard]] const block_pool& pool() const { return pool_; }
  [[nodiscard]] const typename Backend::kv_storage& kv_cache() const { return kv_; }
  // Requests not yet handed over with take_output (for inspection and tests).
  [[nodiscard]] std::vector<const sequence*> requests() const {
    std::vector<const sequence*> out;
    for (const auto& [id, s] : requests_) out.push_back(s.get());
    return out;
  }

 private:
  // A checked request, not yet queued: the prompt, the sampling parameters, what the pool, a step and the
  // model's context can hold, and text for stop strings. Throws zipage::error naming what is wrong.
  std::unique_ptr<sequence> make_sequence(std::vector<token_id> prompt, sampling_params params) const {
    params.validate();
    check(!prompt.empty(), "request: the prompt is empty (add BOS at least)");
    for (token_id t : prompt)
      check(t >= 0 && t < config().vocab_size, "request: prompt token ", t, " is outside the vocabulary of ",
            config().vocab_size);
    const int context = config().max_context;
    check(cfg_.allow_beyond_context || context <= 0 || static_cast<long long>(prompt.size()) < context,
          "request: a prompt of ", prompt.size(), " tokens does not fit the model's context of ", context,
          " tokens (model_config::max_context; set engine_config::allow_beyond_context to run past it)");
    check(params.stop.empty() || static_cast<bool>(cfg_.make_detokenizer),
          "request: sampling_params::stop (\"", params.stop.empty() ? std::string() : params.stop.front(),
          "\") needs text, and this engine has no detokenizer: set engine_config::make_detokenizer "
          "(zipage::detokenizer_factory(tokenizer)) or use sampling_params::stop_token_ids");
    auto s = std::make_unique<sequence>();
    s->prompt_len = static_cast<int>(prompt.size());
    s->tokens = std::move(prompt);
    s->params = std::move(params);
    check(scheduler_.admissible(*s), "request: a prompt of ", s->num_tokens(), " tokens needs ",
          blocks_for_tokens(s->num_tokens(), cfg_.block_size), " KV blocks; the pool has ", pool_.num_blocks(),
          " blocks", " and a step takes at most ", cfg_.max_batched_tokens, " tokens");
    if (cfg_.make_detokenizer) s->detokenizer = cfg_.make_detokenizer(s->tokens);
    return s;
  }

  request_id enqueue(std::unique_ptr<sequence> s) {
    s->id = next_id_++;
    sequence* raw = s.get();
    requests_.emplace(raw->id, std::move(s));
    scheduler_.add(raw);
    return raw->id;
  }

  // Checked before anything is built: with an evicting policy, a budget that is not a whole number of
  // blocks or a window outside [1, block_size] is an error here. A policy that never evicts ignores them.
  [[nodiscard]] static compression_params compression_settings(const engine_config& cfg) {
    check(cfg.block_size > 0, "engine_config::block_size must be positive, got ", cfg.block_size);
    check(cfg.num_blocks >= 0, "engine_config::num_blocks must be >= 0 (0 = size the pool from kv_cache_bytes), got ",
          cfg.num_blocks);
    check(cfg.num_query_slots >= 0, "engine_config::num_query_slots must be >= 0 (0 = the memory plan's), got ",
          cfg.num_query_slots);
    check(cfg.num_blocks > 0 || cfg.kv_cache_bytes > 0 || cfg.gpu_memory_utilization > 0.0,
          "engine_config::kv_cache_bytes must be > 0 when num_blocks is 0");
    check(cfg.gpu_memory_utilization >= 0.0 && cfg.gpu_memory_utilization <= 1.0,
          "engine_config::gpu_memory_utilization must be in (0, 1], or 0 to use kv_cache_bytes, got ",
          cfg.gpu_memory_utilization);
    check(cfg.max_batched_tokens > 0, "engine_config::max_batched_tokens must be positive, got ", cfg.max_batched_tokens);
    check(cfg.max_num_seqs > 0, "engine_config::max_num_seqs must be positive, got ", cfg.max_num_seqs);
    if constexpr (EvictionPolicy::evicts) return cfg.compression();
    else return compression_params{.block_size = cfg.block_size};
  }

  // The pool size, checked against what one compressed request holds: B + 1 blocks (budget plus the
  // write block), or its whole context when that is smaller. A pool that cannot hold that would fail every
  // request that reaches its budget, so it is refused here instead.
  [[nodiscard]] int checked_pool_blocks() const {
    if constexpr (EvictionPolicy::evicts) {
      int need = compression_.budget_blocks + 1;
      const int context = config().max_context;
      if (!cfg_.allow_beyond_context && context > 0) need = std::min(need, blocks_for_tokens(context, cfg_.block_size));
      check(memory_.num_blocks >= need, "engine_config::budget_tokens = ", cfg_.budget_tokens, " (", compression_.budget_blocks,
            " blocks of ", cfg_.block_size, " tokens) needs ", need, " KV blocks per request with the write block, but the pool has ",
            memory_.num_blocks, " (", cfg_.num_blocks > 0 ? "engine_config::num_blocks" : "from engine_config::kv_cache_bytes",
            "): lower budget_tokens or give the pool more blocks");
    }
    return memory_.num_blocks;
  }

  // The memory the KV cache may take. On a backend that reports device memory, with gpu_memory_utilization
  // set, the activation peak is measured first (profile_peak_memory) so the pool never takes it.
  [[nodiscard]] memory_request sized_memory_request() {
    const engine_config& cfg = cfg_;
    memory_request r;
    r.budget_bytes = cfg.kv_cache_bytes;
    if constexpr (requires { { backend_.memory_info() } -> std::convertible_to<std::pair<std::size_t, std::size_t>>; }) {
      if (cfg.gpu_memory_utilization > 0.0 && cfg.num_blocks == 0) {
        check(cfg.gpu_memory_utilization <= 1.0, "engine: gpu_memory_utilization must be in (0, 1], got ",
              cfg.gpu_memory_utilization);
        profile_peak_memory();
        r.budget_bytes = device_kv_budget(cfg.gpu_memory_utilization, backend_.memory_info());
        if (cfg.max_kv_cache_bytes > 0) r.budget_bytes = std::min(r.budget_bytes, cfg.max_kv_cache_bytes);
      }
    }
    const Backend& backend = backend_;
    // A backend that stores K/V in a narrower type (bf16) says so; the CPU reference keeps fp32.
    if constexpr (requires { { backend.kv_element_bytes() } -> std::convertible_to<std::size_t>; })
      r.element_bytes = backend.kv_element_bytes();
    // A quantised cache (FP8) also counts its scales; its query-window cache keeps the compute dtype.
    if constexpr (requires { { backend.kv_scale_bytes() } -> std::convertible_to<std::size_t>; })
      r.kv_scale_bytes = backend.kv_scale_bytes();
    if constexpr (requires { { backend.query_element_bytes() } -> std::convertible_to<std::size_t>; })
      r.query_element_bytes = backend.query_element_bytes();
    r.num_blocks = cfg.num_blocks;
    r.num_query_slots = cfg.num_query_slots;
    r.max_running = cfg.max_num_seqs;
    r.block_size = cfg.block_size;
    if constexpr (EvictionPolicy::evicts) {
      r.budget_blocks = compression_.budget_blocks;
      r.window = compression_.window;
      r.score_cache = EvictionPolicy::uses_score_cache;
      // A scheduler without hybrid slots gives every running request one.
      if constexpr (requires { Scheduler::slot_per_running_request; })
        if (r.num_query_slots == 0) r.num_query_slots = cfg.max_num_seqs;
    }
    return r;
  }

  // vLLM's profile_run: one forward over the largest step there can be (max_batched_tokens prompt tokens,
  // as many logits rows as a step can sample: max_num_seqs, or the decode graph's padded batch), then device
  // sampling of those rows, on a throwaway one-block KV storage (make_profile_batch). The model's
  // activations and the backend's workspaces are grow-only, so they stay at this peak (and the backend's
  // stream-ordered pool keeps what it freed), and the free memory read next leaves room for them.
  void profile_peak_memory() {
    const model_config& c = config();
    int rows = cfg_.max_num_seqs;
    if constexpr (decode_graph_runner<Backend>) rows = std::max(rows, backend_.decode_graph_batch(cfg_.max_num_seqs));
    const profile_batch pb = make_profile_batch(cfg_.max_batched_tokens, rows, cfg_.block_size);
    {
      auto kv = backend_.allocate_kv(kv_cache_shape{c.num_layers, 1, cfg_.block_size, c.num_kv_heads, c.head_dim});
      const forward_batch batch = pb.view();
      forward_context<Backend> ctx(backend_, kv, batch, c.num_q_heads);
      auto sample = [&](const tensor& logits) {
        if constexpr (device_sampler<Backend>) {
          // Every filter on, so the sampler's workspaces reach their largest size.
          sampling_params sp;
          sp.temperature = 1.0f;
          sp.top_k = 50;
          sp.top_p = 0.9f;
          sp.min_p = 0.01f;
          sp.repetition_penalty = 1.1f;
          const std::vector<token_id> context(pb.tokens.begin(), pb.tokens.begin() + 1);
          std::vector<sample_row> sr;
          for (int i = 0; i < pb.num_seqs(); ++i) sr.push_back({i, &sp, context, 0});
          (void)backend_.sample(logits, sr);  // synchronises: the tokens come back to the host
        } else {
          (void)backend_.to_host(logits);
        }
      };
      sample(model_.forward(ctx));  // logits returned by value are freed again (a pooled backend keeps them cached)
    }
    if constexpr (requires { backend_.synchronize(); }) backend_.synchronize();  // the throwaway KV is freed
  }

  [[nodiscard]] scheduler_config scheduler_settings() const {
    scheduler_config sc;
    sc.max_num_seqs = cfg_.max_num_seqs;
    sc.max_batched_tokens = cfg_.max_batched_tokens;
    sc.block_size = cfg_.block_size;
    sc.prefix_caching = cfg_.prefix_caching;
    sc.order = cfg_.scheduling;
    sc.hybrid = cfg_.hybrid;
    if constexpr (EvictionPolicy::evicts) {
      sc.budget_blocks = compression_.budget_blocks;
      sc.window = compression_.window;
      sc.num_query_slots = memory_.num_query_slots;
    }
    return sc;
  }

  [[nodiscard]] kv_cache_shape kv_shape() const {
    const auto& c = config();
    kv_cache_shape shape{c.num_layers, memory_.num_blocks, cfg_.block_size, c.num_kv_heads, c.head_dim};
    if constexpr (EvictionPolicy::evicts) {
      shape.num_q_heads = c.num_q_heads;
      shape.window = cfg_.window;
      shape.num_query_slots = memory_.num_query_slots;
      shape.score_cache = EvictionPolicy::uses_score_cache;
    }
    return shape;
  }

  sequence* find(request_id id) {
    const auto it = requests_.find(id);
    return it == requests_.end() ? nullptr : it->second.get();
  }

  // Data movement the plan asks for, in an order that keeps every source intact until it is read:
  // swap-outs read blocks the plan may already have handed to others, then copy-on-write copies (their
  // sources may be among the blocks handed out), then swap-ins write into their fresh blocks, and only
  // then compressions start: a request swapped in this step may be compressed in the same step, and its
  // compression must read its restored cache and window queries.
  void move_state(const step_plan& plan) {
    for (const swap_out_job& job : plan.swap_out) swapped_state_.emplace(job.seq->id, backend_.swap_out(kv_, job.pages, job.slot));
    for (const compression_job& job : plan.compress)
      for (const block_copy& c : job.copies) backend_.copy_block(kv_, c.from, c.to);
    for (sequence* s : plan.swap_in) {
      auto it = swapped_state_.find(s->id);
      check(it != swapped_state_.end(), "engine: request ", s->id, " was swapped in without a saved state");
      backend_.swap_in(kv_, s->table.blocks(), s->query_slot, it->second);
      swapped_state_.erase(it);
    }
    // One submission for the step, so the worker can compress the burst as one batch; the worker gets
    // values (pages, lengths, slot), never the requests themselves.
    std::vector<compression_request> to_compress;
    for (const compression_job& job : plan.compress) to_compress.push_back(compression_request_of(*job.seq));
    worker_.submit(std::move(to_compress));
  }

  // Compactions that landed: the scheduler shrinks each request's table (the tail blocks go back to the
  // pool through the block manager) and the request may run again.
  void land_compressions(std::vector<finished_compression> done) {
    for (auto& d : done) {
      sequence* s = find(d.id);
      if (s == nullptr || s->is_finished()) continue;  // cancel() waits for the worker, so only defensively
      if (!d.error.empty()) {
        s->compressing = false;
        fail_request(*s, "compression failed: " + d.error);
        failed_events_.push_back({s->id, 0, {}, true, finish_reason::error});  // so streams see it end
        continue;
      }
      stats_.tokens_evicted += s->kv_len - d.new_len;
      scheduler_.land_compression(*s, d.new_len);
      ++stats_.compressions;
    }
  }

  // The model's forward over the built batch; a pure decode step goes through the backend's decode graphs
  // when it has them (padded to the graph's batch size).
  const tensor& forward(const step_plan& plan) {
    if constexpr (decode_graph_runner<Backend> && forward_returns_reference<Model>) {
      if (const int padded = graph_batch_size(plan); padded > 0) {
        const int real = static_cast<int>(plan.batch.size());
        pad_batch(padded);
        ++stats_.graph_steps;
        stats_.graph_padding_rows += padded - real;
        forward_context<Backend> ctx(backend_, kv_, batch_, config().num_q_heads);
        return backend_.run_decode_graph(padded, [&]() -> const tensor& { return model_.forward(ctx); });
      }
    }
    forward_context<Backend> ctx(backend_, kv_, batch_, config().num_q_heads);
    if constexpr (forward_returns_reference<Model>) {
      return model_.forward(ctx);
    } else {
      logits_ = model_.forward(ctx);
      return logits_;
    }
  }

  // The graph batch size for this step, or 0: only steps where every sequence decodes one token and
  // samples it on the device (forced tokens need the logits on the host).
  [[nodiscard]] int graph_batch_size(const step_plan& plan) const {
    if constexpr (decode_graph_runner<Backend> && device_sampler<Backend>) {
      for (const scheduled_seq& e : plan.batch)
        if (e.tokens != 1 || !e.samples() || !e.seq->forced_tokens.empty()) return 0;
      return backend_.decode_graph_batch(static_cast<int>(plan.batch.size()));
    } else {
      return 0;
    }
  }

  // Adds padding sequences up to `padded`: one token each that writes nowhere (slot -1), attends to
  // nothing (kv_len 0, no pages) and records no query; every row's logits are computed.
  void pad_batch(int padded) {
    const int real = static_cast<int>(tokens_.size());
    for (int i = real; i < padded; ++i) {
      tokens_.push_back(0);
      positions_.push_back(0);
      slots_.push_back(-1);
      token_seq_.push_back(i);
      token_kv_len_.push_back(0);
      page_indptr_.push_back(page_indptr_.back());
      if constexpr (EvictionPolicy::evicts) window_rows_.push_back(-1);
    }
    graph_rows_.resize(static_cast<std::size_t>(padded));
    std::iota(graph_rows_.begin(), graph_rows_.end(), 0);
    point_batch(graph_rows_);
  }

  // The forward batch views the per-step buffers (again after they grew).
  void point_batch(std::span<const std::int32_t> logits_rows) {
    batch_.tokens = tokens_;
    batch_.positions = positions_;
    batch_.logits_rows = logits_rows;
    batch_.attention = {slots_, token_seq_, token_kv_len_, page_indptr_, page_indices_, window_rows_};
  }

  // Lays the planned tokens out back to back with their positions, slots and page tables.
  void build_batch(const step_plan& plan) {
    tokens_.clear();
    positions_.clear();
    slots_.clear();
    token_seq_.clear();
    token_kv_len_.clear();
    logits_rows_.clear();
    page_indptr_.assign(1, 0);
    page_indices_.clear();
    window_rows_.clear();
    const int bs = cfg_.block_size;
    for (std::size_t i = 0; i < plan.batch.size(); ++i) {
      const scheduled_seq& e = plan.batch[i];
      const sequence& s = *e.seq;
      for (int j = 0; j < e.tokens; ++j) {
        const int logical = s.num_computed + j;
        const int physical = s.kv_len + j;
        tokens_.push_back(s.tokens[static_cast<std::size_t>(logical)]);
        positions_.push_back(logical);
        slots_.push_back(s.table.slot(physical, bs));
        token_seq_.push_back(static_cast<std::int32_t>(i));
        token_kv_len_.push_back(physical + 1);
        if constexpr (EvictionPolicy::evicts) window_rows_.push_back(window_row(s, physical));
      }
      if (e.samples()) logits_rows_.push_back(static_cast<std::int32_t>(tokens_.size()) - 1);
      page_indices_.insert(page_indices_.end(), s.table.blocks().begin(), s.table.blocks().end());
      page_indptr_.push_back(static_cast<std::int32_t>(page_indices_.size()));
    }
    point_batch(logits_rows_);
  }

  // Queries are recorded while the write position is in the last W slots of a block, so at a block
  // boundary the window holds the last W queries of the block that just filled.
  [[nodiscard]] std::int32_t window_row(const sequence& s, int physical) const {
    const int offset = physical % cfg_.block_size - (cfg_.block_size - cfg_.window);
    return offset >= 0 && s.query_slot >= 0 ? s.query_slot * cfg_.window + offset : -1;
  }

  // The next token of every sequence that samples this step, in batch order. On a backend that can
  // sample on the device the logits stay there (log-probabilities included), unless a row is forced
  // (evaluation), which the host handles.
  std::vector<token_id> sample_all(const step_plan& plan, const tensor& logits) {
    std::vector<token_id> out;
    out.reserve(logits_rows_.size());
    if constexpr (device_sampler<Backend>) {
      const bool host_only = std::any_of(plan.batch.begin(), plan.batch.end(), [](const scheduled_seq& e) {
        return e.samples() && !e.seq->forced_tokens.empty();
      });
      if (!host_only) {
        sample_rows_.clear();
        for (const scheduled_seq& e : plan.batch)
          if (e.samples())
            sample_rows_.push_back({static_cast<int>(sample_rows_.size()), &e.seq->params, e.seq->tokens,
                                    static_cast<std::uint64_t>(e.seq->num_generated()),
                                    e.seq->params.logprobs ? &e.seq->logprobs : nullptr,
                                    e.seq->params.top_logprobs > 0 ? &e.seq->top_logprobs : nullptr});
        return backend_.sample(logits, sample_rows_);
      }
    }
    const std::vector<float> host_logits = backend_.to_host(logits);
    const auto vocab = static_cast<std::size_t>(config().vocab_size);
    check(host_logits.size() == vocab * logits_rows_.size(), "engine: the model returned ", host_logits.size(),
          " logits for ", logits_rows_.size(), " requests of vocabulary ", vocab);
    std::size_t row = 0;
    for (const scheduled_seq& e : plan.batch)
      if (e.samples()) out.push_back(next_token(*e.seq, {host_logits.data() + row++ * vocab, vocab}));
    return out;
  }

  token_id next_token(sequence& s, std::span<const float> row) {
    const auto step = static_cast<std::size_t>(s.num_generated());
    const token_id tok = step < s.forced_tokens.size()
                             ? s.forced_tokens[step]
                             : sampler_.sample(row, s.params, s.tokens, static_cast<std::uint64_t>(step));
    if (s.params.logprobs) s.logprobs.push_back(token_logprob_of(row, tok));
    if (s.params.top_logprobs > 0) s.top_logprobs.push_back(top_logprobs(row, s.params.top_logprobs));
    return tok;
  }

  step_event on_token(sequence& s, token_id tok) {
    step_event e{s.id, tok, {}, false, finish_reason::none};
    const auto& p = s.params;
    const auto& extra = config().extra_eos;
    const bool is_eos = !p.ignore_eos && (tok == config().eos || std::find(extra.begin(), extra.end(), tok) != extra.end());
    if (s.detokenizer && !is_eos) e.text = s.detokenizer(tok);
    const std::size_t old_size = s.output_text.size();
    s.output_text += e.text;

    finish_reason reason = finish_reason::none;
    if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), tok) != p.stop_token_ids.end())
      reason = finish_reason::stop_token;
    else if (is_eos)
      reason = finish_reason::eos;
    else if (truncate_at_stop_string(s, old_size, e.text))
      reason = finish_reason::stop_string;
    else if (s.num_generated() >= p.max_tokens || at_context_limit(s))
      reason = finish_reason::length;

    if (reason != finish_reason::none) {
      s.reason = reason;
      scheduler_.finish(&s);
      e.finished = true;
      e.reason = reason;
    }
    return e;
  }

  // Whether the request has reached the model's trained context (unless engine_config::allow_beyond_context).
  [[nodiscard]] bool at_context_limit(const sequence& s) const {
    const int context = config().max_context;
    return !cfg_.allow_beyond_context && context > 0 && s.num_tokens() >= context;
  }

  // Looks for a stop string that ends in the newly added text; cuts the output (and the event's text)
  // just before it, as vLLM does.
  static bool truncate_at_stop_string(sequence& s, std::size_t old_size, std::string& event_text) {
    for (const std::string& stop : s.params.stop) {
      if (stop.empty()) continue;
      const std::size_t from = old_size >= stop.size() ? old_size - stop.size() + 1 : 0;
      const std::size_t at = s.output_text.find(stop, from);
      if (at == std::string::npos) continue;
      s.output_text.resize(at);
      event_text = at >= old_size ? s.output_text.substr(old_size) : std::string();
      return true;
    }
    return false;
  }

  void fail_request(sequence& s, std::string message) {
    scheduler_.remove(&s);
    s.status = request_status::finished;
    s.reason = finish_reason::error;
    s.error_message = std::move(message);
  }

  void reject(sequence& s, std::vector<step_event>& events) {
    fail_request(s, detail::concat("request ", s.id, " needs ", blocks_for_tokens(s.num_tokens(), cfg_.block_size),
                                   " KV blocks for its ", s.num_tokens(), " tokens; the pool has ", pool_.num_blocks()));
    events.push_back({s.id, 0, {}, true, finish_reason::error});
  }

  // Per batch entry: a prompt (chunk) or one decode token, and whether it produced a token.
  void record_entry(int tokens, bool samples) {
    const bool prefill = tokens > 1 || !samples;
    step_has_prefill_ |= prefill;
    if (prefill) stats_.prompt_tokens += tokens;
    if (samples) ++stats_.generated_tokens;
  }

  void record_step(const step_plan& plan) {
    ++stats_.steps;
    step_has_prefill_ ? ++stats_.prefill_steps : ++stats_.decode_steps;
    step_has_prefill_ = false;
    int finished = 0;
    for (const auto& e : plan.batch) finished += e.seq->is_finished();
    stats_.peak_running = std::max(stats_.peak_running, scheduler_.num_running() + finished);
  }

  engine_config cfg_;
  compression_params compression_;  // from cfg_, checked; B and W as everything below uses them
  Model model_;
  EvictionPolicy policy_;
  Backend backend_;
  memory_plan memory_;
  block_pool pool_;
  Scheduler scheduler_;
  typename Backend::kv_storage kv_;
  sampler sampler_;
  std::unordered_map<request_id, std::unique_ptr<sequence>> requests_;
  std::unordered_map<request_id, typename Backend::swap_blob> swapped_state_;
  std::vector<step_event> failed_events_;  // compressions that failed, reported by the next step()
  request_id next_id_ = 0;
  engine_stats stats_;
  bool step_has_prefill_ = false;

  // Per-step batch buffers, kept to avoid reallocating every step.
  std::vector<token_id> tokens_;
  std::vector<std::int32_t> positions_, token_seq_, token_kv_len_, logits_rows_, page_indptr_, page_indices_;
  std::vector<std::int64_t> slots_;
  std::vector<std::int32_t> window_rows_;
  std::vector<sample_row> sample_rows_;
  std::vector<std::int32_t> graph_rows_;  // logits rows of a padded decode-graph step (all of them)
  forward_batch batch_;
  tensor logits_;  // the last step's logits, for models that return them by value

  // Declared last, so destroyed first: its thread finishes (joins) while the requests it may be
  // compressing, the KV storage and the backend still exist.
  compression_worker<EvictionPolicy, Backend> worker_;
};

}  // namespace zipage
