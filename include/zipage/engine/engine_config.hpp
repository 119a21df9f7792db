#pragma once
// What an engine is built with (engine_config, checked by name before anything is built), what it makes
// of it (pool size, KV shape, stop rules; checked requests), and what it reports (engine_stats).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/cache_geometry.hpp"
#include "zipage/engine/memory_plan.hpp"
#include "zipage/engine/prepared_request.hpp"
#include "zipage/kv/paged_kv.hpp"
#include "zipage/model/model_config.hpp"
#include "zipage/policy/score_context.hpp"
#include "zipage/request/sequence.hpp"
#include "zipage/sampling/guided.hpp"
#include "zipage/scheduler/step_plan.hpp"

namespace zipage {

// Every member has a default initialiser, so designated initialisers such as
// `engine_config{.block_size = 16, .num_blocks = 1024}` compile without -Wmissing-field-initializers warnings.
struct engine_config {
  // The cache geometry, as three fields so designated initialisers stay flat; their defaults are
  // cache_geometry's (the one place they are set), and geometry() gives them back as one value.
  int block_size = cache_geometry{}.block_size;
  int num_blocks = 0;                        // KV pool size; 0 = plan it from kv_cache_bytes (must be >= 0)
  std::size_t kv_cache_bytes = 64ull << 20;  // memory for blocks and query slots when num_blocks == 0
  // On a backend that reports its device memory (memory_info() -> {free, total}): when > 0, the KV cache
  // gets this fraction of the device's memory minus what is in use (weights, workspaces, and the
  // activation peak: the engine first runs one profiling forward of max_batched_tokens tokens, as vLLM's
  // profile_run), as vLLM's gpu_memory_utilization; replaces kv_cache_bytes.
  double gpu_memory_utilization = 0.0;
  // With gpu_memory_utilization (a device backend): the KV cache takes at most this many bytes (0 = no cap), e.g. what
  // max_num_seqs requests could ever fill, so a small model does not get a pool it can never use.
  std::size_t max_kv_cache_bytes = 0;
  int max_num_seqs = 256;                    // running requests at most
  int max_batched_tokens = 8192;             // tokens per step (decodes and prefill chunks together)
  // Compressed PagedAttention (used when the eviction policy evicts): each request keeps budget_tokens
  // tokens (a whole number of blocks: B = budget_tokens / block_size), compressing at block boundaries;
  // window = W recent queries. The method's defaults: 2048 tokens, W = 16, whatever the block size.
  int budget_tokens = cache_geometry{}.budget_tokens;
  int window = cache_geometry{}.window;
  // Requests that may record window queries at once (compressing policies only; at most max_num_seqs).
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
  // The tokenizer's EOS where it is not the model config's eos (a base Qwen3's <|im_end|>), else -1. It is the
  // EOS vLLM takes as the model's own (its eos_token_id is the tokenizer's): a request ending on it reports no
  // stop_reason (request_output::stop_reason), and the config's eos then reports its id, as the generation
  // config's other eos ids do. It stops nothing by itself: the tools and zipage::llm add it to each request's
  // stop_token_ids (with_end_of_turn).
  token_id tokenizer_eos = -1;
  // Makes a fresh streaming detokenizer per request, given its prompt (so the first generated piece is
  // spaced as it follows the prompt). Without it, request_output::text and step_event::text stay empty
  // and a request with stop strings is refused: set it to zipage::detokenizer_factory(tokenizer)
  // (zipage/tokenizer/detokenizer.hpp; the tokenizer must outlive the engine), or use zipage::llm
  // (zipage/llm.hpp), which wires it itself.
  std::function<streaming_detokenizer(std::span<const token_id> prompt)> make_detokenizer{};
  // Encodes text without special tokens (no BOS), for sampling_params::bad_words; without it a request with bad
  // words is refused. zipage::llm and the tools set it from the tokenizer (which must outlive the engine).
  std::function<std::vector<token_id>(const std::string& text)> encode_words{};
  // Each token's bytes, for sampling_params::guided (structured output); without it a guided request is refused.
  // zipage::llm and the tools set it from the tokenizer (zipage::guide_vocabulary_of, tokenizer/detokenizer.hpp).
  std::shared_ptr<const guide_vocabulary> guide_vocab{};

  // The three geometry fields as one value (not checked).
  [[nodiscard]] cache_geometry geometry() const { return {block_size, budget_tokens, window}; }
  // B: blocks a compressed request keeps. Throws when budget_tokens is not a positive multiple of block_size.
  [[nodiscard]] int budget_blocks() const { return budget_blocks_for(budget_tokens, block_size); }
  // The geometry, checked as an evicting policy uses it (budget a whole number of blocks, 1 <= W <= block_size;
  // errors name the engine_config field).
  [[nodiscard]] cache_geometry compression() const {
    const cache_geometry g = geometry();
    g.validate("engine_config::");
    return g;
  }
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
  std::int64_t nano_batch_steps = 0;  // decode steps run as two overlapped nano-batches (overlapping_backend)
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

// The fields every engine needs, checked by name before anything is built; with an evicting policy also
// the cache geometry's budget and window (a budget that is not a whole number of blocks, or a window outside
// [1, block_size], is an error here). Returns the geometry (checked: only its block size when the policy
// never evicts, which ignores the budget and the window).
[[nodiscard]] inline cache_geometry checked_geometry(const engine_config& cfg, bool evicts) {
  cfg.geometry().validate_block_size("engine_config::");
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
  // Query slots hold compressing requests' window queries: more than can run at once would be pool memory no
  // request ever uses, and a policy that never evicts has none (it would ignore the field without a word).
  check(cfg.num_query_slots <= cfg.max_num_seqs, "engine_config::num_query_slots (", cfg.num_query_slots,
        ") is more than engine_config::max_num_seqs (", cfg.max_num_seqs, "): at most max_num_seqs requests run at "
        "once, each with at most one slot; lower num_query_slots (0 = the memory plan's)");
  check(evicts || cfg.num_query_slots == 0, "engine_config::num_query_slots (", cfg.num_query_slots,
        ") is for compression, and this engine's policy never evicts (full KV keeps no window queries): leave it 0");
  return evicts ? cfg.compression() : cfg.geometry();
}

// The Model's config() as the engine uses it (the KV cache's shape, the memory plan, logits rows, EOS), checked
// before anything is built: a custom model with no layers or heads, a head count that is not a multiple of
// the KV head count or an EOS id outside the vocabulary is an error naming the field, where it divided by
// zero or wrote past its buffers. Only these fields: the rest (hidden_size, ffn_size, RoPE) are the model's own
// (llama_model checks them all with model_config::validate()).
[[nodiscard]] inline const model_config& checked_model_config(const model_config& c) {
  auto positive = [](int v, const char* name) {
    check(v > 0, "engine: the Model's config().", name, " must be positive, got ", v);
  };
  positive(c.vocab_size, "vocab_size");
  positive(c.num_layers, "num_layers");
  positive(c.num_q_heads, "num_q_heads");
  positive(c.num_kv_heads, "num_kv_heads");
  positive(c.head_dim, "head_dim");
  check(c.num_q_heads % c.num_kv_heads == 0, "engine: the Model's config().num_q_heads (", c.num_q_heads,
        ") must be a multiple of num_kv_heads (", c.num_kv_heads, ")");
  (void)c.q_size();  // the row widths fit an int
  (void)c.kv_size();
  check(c.eos < c.vocab_size, "engine: the Model's config().eos (", c.eos, ") is outside the vocabulary of ",
        c.vocab_size, " (-1 = none)");
  for (token_id id : c.extra_eos)
    check(id >= 0 && id < c.vocab_size, "engine: the Model's config().extra_eos holds ", id,
          ", outside the vocabulary of ", c.vocab_size);
  return c;
}

// A request's prompt and sampling parameters, checked before it is queued: a prompt that is empty, holds
// ids outside the vocabulary or does not fit the model's context (unless allow_beyond_context), stop, logit bias
// or allowed ids outside it, stop strings without a detokenizer, bad words without an encoder (unless the caller
// encoded them: prepared->bad_words), and a priority that fcfs order would ignore are errors naming what to change.
inline void check_request(const std::vector<token_id>& prompt, const sampling_params& params, const model_config& model,
                          const engine_config& cfg, const prepared_request* prepared = nullptr) {
  const bool bad_words_encoded = prepared != nullptr && prepared->bad_words != nullptr;
  params.validate();
  check(!prompt.empty(), "request: the prompt is empty (add BOS at least)");
  for (token_id t : prompt)
    check(t >= 0 && t < model.vocab_size, "request: prompt token ", t, " is outside the vocabulary of ", model.vocab_size);
  for (token_id t : params.stop_token_ids)  // (validate() checked >= 0) an id no step can sample would never stop it
    check(t < model.vocab_size, "request: sampling_params::stop_token_ids holds ", t, ", outside the vocabulary of ",
          model.vocab_size);
  const int context = model.max_context;
  check(cfg.allow_beyond_context || context <= 0 || static_cast<long long>(prompt.size()) < context,
        "request: a prompt of ", prompt.size(), " tokens does not fit the model's context of ", context,
        " tokens (model_config::max_context; set engine_config::allow_beyond_context to run past it)");
  // As vLLM, which names the ids: a bias or an allowed id no step can sample is an error, never ignored.
  for (const auto& [t, bias] : params.logit_bias)  // (validate() checked >= 0)
    check(t < model.vocab_size, "request: sampling_params::logit_bias holds token id ", t,
          ", outside the vocabulary of ", model.vocab_size);
  if (params.allowed_token_ids)
    for (token_id t : *params.allowed_token_ids)
      check(t < model.vocab_size, "request: sampling_params::allowed_token_ids holds token id ", t,
            ", outside the vocabulary of ", model.vocab_size);
  check(params.bad_words.empty() || bad_words_encoded || static_cast<bool>(cfg.encode_words),
        "request: sampling_params::bad_words (\"",
        params.bad_words.empty() ? std::string() : params.bad_words.front(), "\") need text encoded, and this "
        "engine has no encoder: set engine_config::encode_words (the tokenizer's encode without special tokens)");
  if (params.guided_after_reasoning)  // (validate() checked close >= 0, and open unless opened)
    for (const token_id t : {params.guided_after_reasoning->open, params.guided_after_reasoning->close})
      check(t < model.vocab_size, "request: sampling_params::guided_after_reasoning names token id ", t,
            ", outside the vocabulary of ", model.vocab_size);
  check(!params.guided.active() || cfg.guide_vocab != nullptr, "request: sampling_params::guided (",
        params.guided.field(), ") needs each token's bytes, and this engine has none: set engine_config::guide_vocab "
        "(zipage::guide_vocabulary_of(tokenizer))");
  check(!params.guided.active() || cfg.guide_vocab == nullptr || cfg.guide_vocab->size() <= model.vocab_size,
        "request: engine_config::guide_vocab holds ", cfg.guide_vocab ? cfg.guide_vocab->size() : 0,
        " tokens, more than the model's vocabulary of ", model.vocab_size);
  check(params.stop.empty() || static_cast<bool>(cfg.make_detokenizer),
        "request: sampling_params::stop (\"", params.stop.empty() ? std::string() : params.stop.front(),
        "\") needs text, and this engine has no detokenizer: set engine_config::make_detokenizer "
        "(zipage::detokenizer_factory(tokenizer)) or use sampling_params::stop_token_ids");
  // As vLLM ("Got priority != 0 but scheduling policy is not priority"): ignoring it would run the request
  // in arrival order although the caller asked for another.
  check(params.priority == 0 || cfg.scheduling == scheduling_order::priority, "request: sampling_params::priority = ",
        params.priority, " needs engine_config::scheduling = scheduling_order::priority (this engine schedules "
        "first-come-first-served, which would ignore it); leave priority 0 under fcfs");
}

// The pool size, checked against what one compressed request holds: B + 1 blocks (budget plus the write
// block), or its whole context when that is smaller. A pool that cannot hold that would fail every request
// that reaches its budget, so it is refused at construction instead.
[[nodiscard]] inline int checked_pool_blocks(const engine_config& cfg, const cache_geometry& geometry,
                                             const model_config& model, const memory_plan& memory, bool evicts) {
  if (evicts) {
    const int with_write_block = geometry.budget_blocks() + 1;
    const int context = model.max_context;
    const int whole_context = !cfg.allow_beyond_context && context > 0 ? blocks_for_tokens(context, geometry.block_size)
                                                                         : with_write_block;
    const int need = std::min(with_write_block, whole_context);
    check(memory.num_blocks >= need, "engine_config::budget_tokens = ", geometry.budget_tokens, " (", geometry.budget_blocks(),
          " blocks of ", geometry.block_size, " tokens) needs ", need, " KV blocks per request (",
          need == with_write_block ? std::string("the budget and the write block")
                                   : "the model's whole context of " + std::to_string(context) + " tokens",
          "), but the pool has ", memory.num_blocks, " (",
          cfg.num_blocks > 0 ? "engine_config::num_blocks" : "from engine_config::kv_cache_bytes",
          "): lower engine_config::budget_tokens or give the pool more blocks");
  }
  return memory.num_blocks;
}

// When a request stops: the model's EOS ids, and its trained context unless allow_beyond_context.
[[nodiscard]] inline stop_rules stop_rules_for(const model_config& model, const engine_config& cfg) {
  check(cfg.tokenizer_eos >= -1 && cfg.tokenizer_eos < model.vocab_size, "engine_config::tokenizer_eos (",
        cfg.tokenizer_eos, ") is outside the vocabulary of ", model.vocab_size, " (-1 = none)");
  return {model.eos, model.extra_eos, cfg.allow_beyond_context ? 0 : std::max(0, model.max_context), cfg.tokenizer_eos};
}

// The KV storage's shape: the pool's blocks, the model's heads and, with an evicting policy, the query-window cache (a
// row block of W queries per slot) and the score cache when the policy keeps one.
[[nodiscard]] inline kv_cache_shape kv_shape_for(const model_config& c, const cache_geometry& geometry,
                                                 const memory_plan& memory, bool evicts, bool score_cache) {
  kv_cache_shape shape{c.num_layers, memory.num_blocks, geometry.block_size, c.num_kv_heads, c.head_dim};
  shape.num_q_heads = c.num_q_heads;
  if (evicts) {
    shape.window = geometry.window;
    shape.num_query_slots = memory.num_query_slots;
    shape.score_cache = score_cache;
  }
  return shape;
}

}  // namespace zipage
