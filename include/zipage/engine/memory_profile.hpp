#pragma once
// Sizing the KV memory at engine start. The batch of the engine's profiling forward (vLLM's profile_run):
// before the KV pool is sized from a device's free memory, the model runs once over a step as large as a
// step can be, so its activations and the backend's workspaces reach their peak (they are grow-only and
// stay allocated) and the free memory read afterwards is what the pool may take (make_profile_batch: plain
// host code, it only lays the batch out; profile_peak_memory runs it). sized_memory_request: what the
// memory plan is asked for.
//
// The layout: `num_tokens` prompt tokens (max_batched_tokens) split as evenly as possible over `num_seqs`
// sequences (at most one per token), each one's last token a logits row (so the logits tensor and device
// sampling see as many rows as a real step can have). Every sequence's page table is block 0 repeated,
// so the attention reads and writes one throwaway block (`kv_cache_shape::num_blocks = 1`) while doing
// the work of a real prefill of those lengths (causal lengths 1..len); what it writes there is garbage
// and is never read as a result.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/host_memory.hpp"
#include "zipage/core/types.hpp"
#include "zipage/engine/engine_config.hpp"
#include "zipage/engine/memory_plan.hpp"
#include "zipage/model/concepts.hpp"
#include "zipage/model/forward_context.hpp"
#include "zipage/sampling/sampling_params.hpp"

namespace zipage {

struct profile_batch {
  std::vector<token_id> tokens;
  std::vector<std::int32_t> positions, token_seq, token_kv_len, logits_rows, page_indptr, page_indices;
  std::vector<std::int64_t> slots;

  [[nodiscard]] int num_tokens() const { return static_cast<int>(tokens.size()); }
  [[nodiscard]] int num_seqs() const { return static_cast<int>(logits_rows.size()); }

  // A view for forward_context (valid while this batch lives and is not changed); records no queries.
  [[nodiscard]] forward_batch view() const {
    forward_batch b;
    b.tokens = tokens;
    b.positions = positions;
    b.logits_rows = logits_rows;
    b.attention = {slots, token_seq, token_kv_len, page_indptr, page_indices, {}};
    return b;
  }
};

// num_tokens tokens over min(num_seqs, num_tokens) sequences (the first num_tokens % n get one more).
[[nodiscard]] inline profile_batch make_profile_batch(int num_tokens, int num_seqs, int block_size, token_id token = 0) {
  check(num_tokens > 0, "memory profile: the profiling batch needs at least one token, got ", num_tokens);
  check(num_seqs > 0, "memory profile: the profiling batch needs at least one sequence, got ", num_seqs);
  check(block_size > 0, "memory profile: block_size must be positive, got ", block_size);
  const int n = std::min(num_seqs, num_tokens);
  profile_batch b;
  const auto tokens = static_cast<std::size_t>(num_tokens);
  b.tokens.assign(tokens, token);
  b.positions.reserve(tokens);
  b.token_seq.reserve(tokens);
  b.token_kv_len.reserve(tokens);
  b.slots.reserve(tokens);
  b.logits_rows.reserve(static_cast<std::size_t>(n));
  b.page_indptr.assign(1, 0);
  for (int s = 0; s < n; ++s) {
    const int len = num_tokens / n + (s < num_tokens % n ? 1 : 0);
    for (int p = 0; p < len; ++p) {
      b.positions.push_back(p);
      b.token_seq.push_back(s);
      b.token_kv_len.push_back(p + 1);
      b.slots.push_back(p % block_size);  // block 0
    }
    b.logits_rows.push_back(static_cast<std::int32_t>(b.positions.size()) - 1);
    b.page_indices.insert(b.page_indices.end(), static_cast<std::size_t>((len + block_size - 1) / block_size), 0);
    b.page_indptr.push_back(static_cast<std::int32_t>(b.page_indices.size()));
  }
  return b;
}

// vLLM's profile_run: one forward over the largest step there can be (max_batched_tokens prompt tokens,
// as many logits rows as a step can sample: max_num_seqs, or the decode graph's padded batch), then device
// sampling of those rows, on a throwaway one-block KV storage (make_profile_batch). The model's
// activations and the backend's workspaces are grow-only, so they stay at this peak (and the backend's
// stream-ordered pool keeps what it freed), and the free memory read next leaves room for them.
template <class Model, class Backend>
void profile_peak_memory(Model& model, Backend& backend, int max_batched_tokens, int max_num_seqs, int block_size) {
  using tensor = typename Backend::tensor;
  const model_config& c = model.config();
  int rows = max_num_seqs;
  if constexpr (decode_graph_runner<Backend>) rows = std::max(rows, backend.decode_graph_batch(max_num_seqs));
  const profile_batch pb = make_profile_batch(max_batched_tokens, rows, block_size);
  {
    auto kv = backend.allocate_kv(kv_cache_shape{c.num_layers, 1, block_size, c.num_kv_heads, c.head_dim});
    const forward_batch batch = pb.view();
    forward_context<Backend> ctx(backend, kv, batch, c.num_q_heads);
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
        (void)backend.sample(logits, sr);  // synchronises: the tokens come back to the host
      } else {
        (void)backend.to_host(logits);
      }
    };
    sample(model.forward(ctx));  // logits returned by value are freed again (a pooled backend keeps them cached)
  }
  if constexpr (requires { backend.synchronize(); }) backend.synchronize();  // the throwaway KV is freed
}

// A plan for a host-memory KV pool against what a new allocation can take (`available`, host_available_memory),
// naming the field that sized the plan and the limit it hit (MemAvailable + SwapFree, or the cgroup's); nothing
// to check where the system does not say.
inline void check_host_plan(const memory_plan& plan, const engine_config& cfg, const available_memory& available) {
  check(!available.known() || plan.total_bytes() <= available.bytes, "engine: the KV cache plan takes ",
        plan.total_bytes(), " bytes (", plan.num_blocks, " blocks + ", plan.num_query_slots, " query slots, from ",
        cfg.num_blocks > 0 ? "engine_config::num_blocks" : "engine_config::kv_cache_bytes",
        cfg.num_query_slots > 0 ? " and engine_config::num_query_slots" : "",
        "), more than this machine's available memory (", available.bytes, " bytes: ", available.source, ")");
}

// A backend without device memory (the CPU reference) keeps its KV pool in host memory: a plan larger than what
// the machine has available now (host_available_memory: MemAvailable + SwapFree after the weights are loaded, or
// the process's cgroup limit less its usage where that is tighter) is refused here (check_host_plan), before the
// pool and the block pool's bookkeeping are allocated (the pool is zero-filled at once: that would end in
// std::bad_alloc, or the process killed by the OOM killer).
template <class Backend>
[[nodiscard]] memory_plan checked_host_memory(memory_plan plan, const engine_config& cfg, const Backend& backend) {
  if constexpr (!requires { backend.memory_info(); }) check_host_plan(plan, cfg, host_available_memory());
  return plan;
}

// The memory the KV cache may take. On a backend that reports device memory, with gpu_memory_utilization
// set, the activation peak is measured first (profile_peak_memory) so the pool never takes it.
// SlotPerRunning: the scheduler has no hybrid slots and gives every running request one.
template <bool Evicts, bool ScoreCache, bool SlotPerRunning, class Model, class Backend>
[[nodiscard]] memory_request sized_memory_request(Model& model, Backend& backend, const engine_config& cfg,
                                                  const cache_geometry& geometry) {
  memory_request r;
  r.budget_bytes = cfg.kv_cache_bytes;
  if constexpr (requires { { backend.memory_info() } -> std::convertible_to<std::pair<std::size_t, std::size_t>>; }) {
    if (cfg.gpu_memory_utilization > 0.0 && cfg.num_blocks == 0) {
      check(cfg.gpu_memory_utilization <= 1.0, "engine: gpu_memory_utilization must be in (0, 1], got ",
            cfg.gpu_memory_utilization);
      profile_peak_memory(model, backend, cfg.max_batched_tokens, cfg.max_num_seqs, geometry.block_size);
      r.budget_bytes = device_kv_budget(cfg.gpu_memory_utilization, backend.memory_info());
      if (cfg.max_kv_cache_bytes > 0) r.budget_bytes = std::min(r.budget_bytes, cfg.max_kv_cache_bytes);
    }
  } else {
    // Ignored here, it would leave the pool at kv_cache_bytes without a word.
    check(cfg.gpu_memory_utilization == 0.0, "engine_config::gpu_memory_utilization (", cfg.gpu_memory_utilization,
          ") sizes the pool on a backend that reports device memory; this backend keeps its pool in host memory, "
          "sized by engine_config::kv_cache_bytes or engine_config::num_blocks");
    check(cfg.max_kv_cache_bytes == 0, "engine_config::max_kv_cache_bytes (", cfg.max_kv_cache_bytes,
          ") caps the pool that gpu_memory_utilization sizes on a backend that reports device memory; this backend "
          "keeps its pool in host memory, sized by engine_config::kv_cache_bytes or engine_config::num_blocks");
  }
  const Backend& b = backend;
  // A backend that stores K/V in a narrower type (bf16) says so; the CPU reference keeps fp32.
  if constexpr (requires { { b.kv_element_bytes() } -> std::convertible_to<std::size_t>; })
    r.element_bytes = b.kv_element_bytes();
  // A quantised cache (FP8) also counts its scales; its query-window cache keeps the compute dtype.
  if constexpr (requires { { b.kv_scale_bytes() } -> std::convertible_to<std::size_t>; })
    r.kv_scale_bytes = b.kv_scale_bytes();
  if constexpr (requires { { b.query_element_bytes() } -> std::convertible_to<std::size_t>; })
    r.query_element_bytes = b.query_element_bytes();
  r.num_blocks = cfg.num_blocks;
  r.num_query_slots = cfg.num_query_slots;
  r.max_running = cfg.max_num_seqs;
  r.geometry = geometry;
  if constexpr (Evicts) {
    r.compress = true;
    r.score_cache = ScoreCache;
    if constexpr (SlotPerRunning)
      if (r.num_query_slots == 0) r.num_query_slots = cfg.max_num_seqs;
  }
  return r;
}

}  // namespace zipage
