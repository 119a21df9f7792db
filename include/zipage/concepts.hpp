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
// | scheduler_policy     | Scheduler                | scheduler/step_plan.hpp                 | zipage_scheduler, fcfs_scheduler      |
// | tokenizer            | text in/out (llm, detokenizer_factory) | here                      | spm_tokenizer, bpe_tokenizer          |
// | optional hooks       | Backend                  | device_sampler, decode_graph_runner (model/concepts.hpp), device_compressor (compression/compression_worker.hpp) |
// | recipe_scored        | EvictionPolicy           | policy/policies.hpp: scored on the device by a device_compressor |        |
#include <concepts>
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
template <class P>
concept policy_flags = requires {
  { P::evicts } -> std::convertible_to<bool>;
  { P::uses_score_cache } -> std::convertible_to<bool>;
};
template <class P>
concept policy_score = requires(const P& p, const score_context& ctx, std::span<float> keep, std::span<float> out) {
  p.score(ctx, keep, out);
};
template <class P>
concept policy_schedule = requires(const P& p, const compression_params& params, int kv_len) {
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

}  // namespace zipage
