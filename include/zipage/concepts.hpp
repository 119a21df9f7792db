#pragma once
// Every concept a type plugged into zipage must satisfy, in one place. The engine checks its template
// parameters against them with one static_assert per missing piece, each saying what to add.
//
//   zipage::engine<Model, EvictionPolicy = full_kv, Scheduler = zipage_scheduler, Backend = Model::backend_type>
//
// | concept              | for                      | defined in                              | satisfied by                          |
// |----------------------|--------------------------|-----------------------------------------|---------------------------------------|
// | model                | Model                    | model/concepts.hpp                      | llama_model<B>, your own type         |
// | backend              | Backend (always)         | model/concepts.hpp: backend_ops +       | cpu_backend, cuda_backend             |
// |                      |                          |   backend_kv_movement                   |                                       |
// | evicting_backend     | Backend, when the policy | model/concepts.hpp                      | cpu_backend, cuda_backend             |
// |                      |   evicts                 |                                         |                                       |
// | eviction_policy      | EvictionPolicy           | policy/eviction_policy.hpp              | full_kv, zipage_policy, ... (policy_base) |
// | scheduler_policy     | Scheduler                | here (its values: scheduler/step_plan.hpp) | zipage_scheduler, fcfs_scheduler   |
// | tokenizer            | text in/out (llm, detokenizer_factory) | here                      | spm_tokenizer, bpe_tokenizer          |
// | optional hooks       | Backend                  | device_sampler, decode_graph_runner (model/concepts.hpp), device_compressor (compression/compression_worker.hpp) |
// | recipe_scored        | EvictionPolicy           | policy/policies.hpp: scored on the device by a device_compressor |        |
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "zipage/compression/compression_worker.hpp"
#include "zipage/core/types.hpp"
#include "zipage/model/concepts.hpp"
#include "zipage/model/forward_context.hpp"
#include "zipage/model/model_config.hpp"
#include "zipage/policy/eviction_policy.hpp"
#include "zipage/policy/policies.hpp"
#include "zipage/scheduler/step_plan.hpp"

namespace zipage {

// A tokenizer: text to ids and back. `add_bos` asks for the model's beginning-of-sequence id first.
template <class T>
concept tokenizer = requires(const T& t, std::string_view text, std::span<const token_id> ids) {
  { t.encode(text, true) } -> std::convertible_to<std::vector<token_id>>;
  { t.decode(ids) } -> std::convertible_to<std::string>;
};

// The pieces of each concept, so that the engine's static_asserts can name the one that is missing.
namespace concept_parts {

// A scheduler plans each step and is the only writer of request and cache state (scheduler/scheduler.hpp).
template <class S>
concept scheduler_construct = std::constructible_from<S, scheduler_config, block_pool&>;
template <class S>
concept scheduler_step = requires(S& s, const S& cs, sequence* seq, const step_plan& plan, const step_output& out) {
  s.add(seq);                                        // queue a new request
  { s.schedule() } -> std::same_as<step_plan>;      // plan one step
  { s.update(plan, out) } -> std::convertible_to<std::vector<request_id>>;  // apply its result; failed requests
  s.cancel(seq);                                     // drop a request wherever it is
  { cs.admissible(*seq) } -> std::convertible_to<bool>;
};
template <class S>
concept scheduler_counters = requires(const S& cs) {
  { cs.num_waiting() } -> std::convertible_to<int>;
  { cs.num_running() } -> std::convertible_to<int>;
  { cs.num_swapped() } -> std::convertible_to<int>;
  { cs.num_slots_in_use() } -> std::convertible_to<int>;
  { cs.num_preemptions() } -> std::convertible_to<std::int64_t>;
  { cs.num_swaps() } -> std::convertible_to<std::int64_t>;
  { cs.num_prefix_hit_tokens() } -> std::convertible_to<std::int64_t>;
  { cs.num_compressions() } -> std::convertible_to<std::int64_t>;
  { cs.num_tokens_evicted() } -> std::convertible_to<std::int64_t>;
};

template <class M>
concept names_backend = requires { typename M::backend_type; };
template <class M>
concept model_config_member = requires(const M& m) {
  { m.config() } -> std::convertible_to<const model_config&>;
};
template <class M>
concept model_forward = names_backend<M> && requires(M& m, forward_context<typename M::backend_type>& ctx) {
  requires std::same_as<std::remove_cvref_t<decltype(m.forward(ctx))>, typename M::backend_type::tensor>;
};

template <class P>
concept policy_name = requires(const P& p) {
  { p.name() } -> std::convertible_to<std::string_view>;
};
// Constants the engine reads at compile time: a non-static member of the same name does not do.
template <class P>
concept policy_flags = requires {
  typename std::bool_constant<static_cast<bool>(P::evicts)>;
  typename std::bool_constant<static_cast<bool>(P::uses_score_cache)>;
};
template <class P>
concept policy_score = requires(const P& p, const score_context& ctx, std::span<float> keep, std::span<float> out) {
  p.score(ctx, keep, out);
};
template <class P>
concept policy_schedule = requires(const P& p, const cache_geometry& params, int kv_len) {
  { p.should_compress(kv_len, params) } -> std::convertible_to<bool>;
  { p.keep_tokens(params) } -> std::convertible_to<int>;
};

// P::evicts, or false when P does not say (so one missing member gives one error).
template <class P>
inline constexpr bool evicts = [] {
  if constexpr (policy_flags<P>) return static_cast<bool>(P::evicts);
  else return false;
}();

}  // namespace concept_parts

// What the engine needs of a scheduler: plan = schedule(); (the engine runs it); update(plan, out).
template <class S>
concept scheduler_policy =
    concept_parts::scheduler_construct<S> && concept_parts::scheduler_step<S> && concept_parts::scheduler_counters<S>;

namespace detail {
struct no_backend {};
template <class M>
struct model_backend { using type = no_backend; };
template <class M>
  requires requires { typename M::backend_type; }
struct model_backend<M> { using type = typename M::backend_type; };
}  // namespace detail

// The engine's parameters checked against these concepts: one static_assert per missing piece, each
// saying what to add (zipage::engine instantiates this; tests/compile_fail checks the messages).
template <class Model, class EvictionPolicy, class Scheduler, class Backend>
struct engine_requirements {
  static_assert(!std::same_as<Backend, detail::no_backend>,
                "zipage::engine: the Model type must name its backend: add `using backend_type = "
                "zipage::cpu_backend;` (or another backend) to it");
  // One check per missing piece, each saying what to add (the concepts: zipage/concepts.hpp).
  static_assert(concept_parts::model_config_member<Model>,
                "zipage::engine: the Model lacks `const zipage::model_config& config() const`");
  static_assert(std::move_constructible<Model>,
                "zipage::engine: the Model must be movable (the engine takes it by value and keeps it): give it a move "
                "constructor, or hold what cannot move (a mutex, a device handle) through a std::unique_ptr");
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
                "zipage::engine: the EvictionPolicy lacks `static constexpr bool evicts` and `uses_score_cache` (both "
                "static constexpr: the engine reads them at compile time): derive from zipage::policy_base (evicts = "
                "true, no score cache)");
  static_assert(concept_parts::policy_score<EvictionPolicy>,
                "zipage::engine: the EvictionPolicy lacks `void score(const zipage::score_context& ctx, std::span<float> "
                "keep_score, std::span<float> cache_out) const` (or derive from zipage::recipe_policy<P> and define "
                "`score_recipe recipe() const`)");
  static_assert(concept_parts::policy_schedule<EvictionPolicy>,
                "zipage::engine: the EvictionPolicy lacks `should_compress(kv_len, params)` and `keep_tokens(params)`: "
                "derive from zipage::policy_base");
  static_assert(concept_parts::scheduler_construct<Scheduler>,
                "zipage::engine: the Scheduler must be constructible from (zipage::scheduler_config, zipage::block_pool&): "
                "derive from zipage::scheduler_base (zipage/scheduler/scheduler.hpp) and inherit its constructor");
  static_assert(concept_parts::scheduler_step<Scheduler>,
                "zipage::engine: the Scheduler lacks a step member: `void add(sequence*)`, `step_plan schedule()`, "
                "`std::vector<request_id> update(const step_plan&, const step_output&)`, `void cancel(sequence*)` or "
                "`bool admissible(const sequence&) const`; derive from zipage::scheduler_base, which has all but schedule()");
  static_assert(concept_parts::scheduler_counters<Scheduler>,
                "zipage::engine: the Scheduler lacks a counter (num_waiting, num_running, num_swapped, num_slots_in_use, "
                "num_preemptions, num_swaps, num_prefix_hit_tokens, num_compressions, num_tokens_evicted): derive from "
                "zipage::scheduler_base");
  static constexpr bool checked = true;
};

}  // namespace zipage
