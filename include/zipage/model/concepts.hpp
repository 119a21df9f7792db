#pragma once
// Concepts for the engine's template parameters. Each is checked with a static_assert in the engine
// whose message says what to add when a type falls short.
#include <concepts>
#include <cstdint>
#include <functional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "zipage/compression/compaction_plan.hpp"
#include "zipage/core/types.hpp"
#include "zipage/kv/paged_kv.hpp"
#include "zipage/model/forward_context.hpp"
#include "zipage/model/model_config.hpp"
#include "zipage/sampling/logprobs.hpp"
#include "zipage/sampling/sampling_params.hpp"

namespace zipage {

// A backend's ops: a tensor type, KV storage, and what a transformer's forward pass calls. Ops are members
// so a device backend can carry its stream and library handles.
template <class B>
concept backend_ops = requires(B& b, typename B::tensor& t, const typename B::tensor& ct,
                               typename B::kv_storage& kv, const attention_metadata& meta,
                               std::span<const float> host, std::span<const token_id> ids,
                               std::span<const std::int32_t> rows, const kv_cache_shape& shape) {
  typename B::tensor;
  typename B::kv_storage;
  { b.from_host(host, 1, 1) } -> std::same_as<typename B::tensor>;
  { b.to_host(ct) } -> std::same_as<std::vector<float>>;
  { b.allocate_kv(shape) } -> std::same_as<typename B::kv_storage>;
  b.embedding(ct, ids, t);
  b.rms_norm(ct, ct, 1e-5f, t);
  b.linear(ct, ct, t);
  b.add_bias(t, ct);
  b.rope(t, rows, 2, 10000.0f, rope_style::half);
  b.silu_mul(ct, ct, t);
  b.add(t, ct);
  b.gather_rows(ct, rows, t);
  b.attention(kv, 0, meta, ct, ct, ct, 1, t);
};

// What the engine moves between blocks whatever the policy: copy-on-write of a shared prompt block
// (prefix caching), and a request's blocks (+ query slot) to host memory and back (swapping).
template <class B>
concept backend_kv_movement = requires(B& b, typename B::kv_storage& kv, std::span<const block_id> pages,
                                       typename B::swap_blob& blob) {
  typename B::swap_blob;
  b.copy_block(kv, block_id{0}, block_id{1});
  { b.swap_out(kv, pages, 0) } -> std::same_as<typename B::swap_blob>;
  b.swap_in(kv, pages, 0, blob);
};

// A backend: the ops and the KV movement. zipage::cpu_backend is the reference; derive from it to
// override a few ops.
template <class B>
concept backend = backend_ops<B> && backend_kv_movement<B>;

// What compression needs besides (an evicting policy only): each layer's keys, recorded window queries
// and score cache gathered to host vectors in the CPU layout (the compressor scores there), and the
// compaction plan applied in place. A backend may also offer device_compressor (compression_worker.hpp)
// to do all of it on the device; the host path stays the fallback, so these are required anyway.
template <class B>
concept evicting_backend = backend<B> && requires(B& b, typename B::kv_storage& kv, std::span<const block_id> pages,
                                                  std::vector<float>& out, const compaction_plan& plan) {
  b.gather_keys(kv, 0, pages, 1, out);
  b.gather_scores(kv, 0, pages, 1, out);
  b.gather_window_queries(kv, 0, 0, out);
  b.apply_compaction(kv, plan);
};

// One row of a batch to sample on the device: its logits row, parameters, context (for the penalties)
// and the index of the token being drawn (for the counter-based random numbers). Optional outputs: when
// `logprobs` is set, the backend appends the drawn token's log-probability under the raw logits, and when
// `top_logprobs` is set, the params->top_logprobs most likely tokens of the row (zipage/sampling/logprobs.hpp),
// so requests asking for them can still be sampled on the device.
struct sample_row {
  int logits_row = 0;
  const sampling_params* params = nullptr;
  std::span<const token_id> context;
  std::uint64_t step = 0;
  std::vector<float>* logprobs = nullptr;
  std::vector<std::vector<token_logprob>>* top_logprobs = nullptr;
  const token_rules* rules = nullptr;  // the request's bad words and EOS ids (its logits processors); null = none
};

// Optional backend hook: draws one token per row on the device from logits [rows][vocab], exactly as the
// CPU `sampler` would (its logits processors included: zipage::make_logit_edits gives a row's edit), so the
// logits need not cross to the host. Without it the engine samples on the host.
template <class B>
concept device_sampler = requires(const B& b, const typename B::tensor& logits, std::span<const sample_row> rows) {
  { b.sample(logits, rows) } -> std::same_as<std::vector<token_id>>;
};

// Optional backend hook: decode steps through captured graphs (cuda_backend). decode_graph_batch(n) is the
// batch size a decode step of n sequences is padded to (0: no graph); run_decode_graph(batch, forward)
// runs the model's forward over the padded batch (padding rows: slot -1, kv_len 0, position 0) and
// returns its logits. The engine pads only steps where every sequence decodes one token and samples on
// the device, and only for models whose forward returns a reference to logits it keeps (see model).
template <class B>
concept decode_graph_runner =
    requires(const B& b, int n, const std::function<const typename B::tensor&()>& forward) {
      { b.decode_graph_batch(n) } -> std::convertible_to<int>;
      { b.run_decode_graph(n, forward) } -> std::same_as<const typename B::tensor&>;
    };

// A model: its config, the backend it runs on, and a forward pass that returns logits
// [logits_rows][vocab] and calls ctx.attention(layer, q, k, v, out) once per layer. forward may return the
// logits by value or as a reference to a member it reuses across steps (which lets a graph-capable
// backend replay the step: the logits must stay where the captured kernels write them).
template <class M>
concept model = requires(M& m, const M& cm, forward_context<typename M::backend_type>& ctx) {
  typename M::backend_type;
  { cm.config() } -> std::convertible_to<const model_config&>;
  requires std::same_as<std::remove_cvref_t<decltype(m.forward(ctx))>, typename M::backend_type::tensor>;
};

// Whether M's forward returns a reference to logits it keeps (a prerequisite for decode graphs).
template <class M>
inline constexpr bool forward_returns_reference =
    std::is_lvalue_reference_v<decltype(std::declval<M&>().forward(std::declval<forward_context<typename M::backend_type>&>()))>;

}  // namespace zipage
