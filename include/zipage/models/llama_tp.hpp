#pragma once
// Tensor parallelism for the Llama family (issue 15): a model and a backend that satisfy the engine's
// `model` and `backend` concepts, so `engine<tensor_parallel_llama<B>, Policy>` is the ordinary engine —
// one scheduler, one block pool, one set of page tables — over N ranks:
//
//   tensor_parallel_backend<B>  N rank backends (B each, e.g. cpu_backend, or one cuda_backend per GPU)
//                               and a tp_group (communicators + one thread per rank). Its kv_storage is
//                               one B::kv_storage per rank, each with the rank's KV heads, q heads (query
//                               window) and score cache; the engine's block ids and slots mean the same
//                               thing on every rank. Block copies and swaps act on every rank.
//   tensor_parallel_llama<B>    the model sharded Megatron-style (parallel/sharding.hpp). forward() runs
//                               every rank's shard at once (tp_group::run): vocabulary-parallel embedding
//                               + all-reduce; per layer, the rank's q/KV heads through its own paged
//                               attention, wo by columns + all-reduce, gate/up by rows, down by columns +
//                               all-reduce; the LM head by vocabulary rows + all-gather of the logits. It
//                               returns rank 0's full logits, which the engine samples as usual.
//
// Compression: every policy's scores are per KV head (scoring.hpp), so each rank scores and compacts its
// own heads with no communication (compress_on_device, the engine's hook for recipe-scored policies:
// every built-in). When KV heads are replicated (fewer KV heads than ranks) a replica's window scores need
// the queries of its whole GQA group: the ranks sharing the head gather them (in process: read from the
// other ranks' query caches; on GPUs an all-gather of W x group x head_dim per layer) so every replica
// keeps the same tokens as N = 1. A policy with its own score() goes through the engine's generic host
// path: gather_* assemble the whole model's keys/queries/scores from the ranks and apply_compaction
// splits the plan by rank, so it too keeps exactly what N = 1 keeps.
//
// Exactness: with fp32 on cpu_backend every all-reduce sums in rank order, so results are reproducible and
// identical on every rank; they differ from N = 1 only by the rounding of the split sums (wo, w_down), and
// greedy tokens match N = 1 (tests/unit/test_tensor_parallel.cpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zipage/backend/cpu/cpu_backend.hpp"
#include "zipage/compression/compaction_plan.hpp"
#include "zipage/compression/compression_job.hpp"
#include "zipage/compression/compression_worker.hpp"
#include "zipage/compression/compressor.hpp"
#include "zipage/core/error.hpp"
#include "zipage/engine/memory_plan.hpp"
#include "zipage/model/concepts.hpp"
#include "zipage/model/forward_context.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/parallel/communicator.hpp"
#include "zipage/parallel/sharding.hpp"
#include "zipage/policy/score_recipe.hpp"
#include "zipage/policy/scoring.hpp"

namespace zipage {

// How a backend's tensors go through a communicator: all_reduce (in place) and the vocabulary all-gather
// ([rows][V'] per rank -> [rows][vocab]). Defined for backends whose tensors are cpu::matrix; a device
// backend specialises it over its device pointers (the NCCL communicator takes them).
template <class B>
struct tp_collectives;

template <class B>
  requires std::same_as<typename B::tensor, cpu::matrix>
struct tp_collectives<B> {
  static void all_reduce(const B&, parallel::communicator& comm, cpu::matrix& t) {
    comm.all_reduce_sum(t.data(), static_cast<std::size_t>(t.size()));
  }
  static void gather_vocab(const B&, parallel::communicator& comm, const parallel::tp_layout& layout,
                           const cpu::matrix& local, std::vector<float>& scratch, cpu::matrix& out) {
    const auto count = static_cast<std::size_t>(local.size());
    scratch.resize(count * static_cast<std::size_t>(layout.size));
    comm.all_gather(local.data(), scratch.data(), count);
    out.resize(local.rows(), layout.vocab_size);
    parallel::assemble_vocab_columns(layout, scratch, static_cast<int>(local.rows()), out.data());
  }
};

template <class B>
struct tp_kv_storage {
  std::vector<typename B::kv_storage> ranks;  // rank r's heads
};

// What the model and the backend share: the group, the layout, the model's (global) config and the rank
// backends.
template <class B>
struct tp_state {
  std::shared_ptr<parallel::tp_group> group;
  parallel::tp_layout layout;
  model_config config;
  std::vector<B> ranks;
};

template <class B = cpu_backend>
class tensor_parallel_backend {
 public:
  using inner_backend = B;
  using tensor = typename B::tensor;
  using kv_storage = tp_kv_storage<B>;
  using swap_blob = std::vector<typename B::swap_blob>;
  static constexpr const char* name = "tensor_parallel";

  // The layout is checked here (heads divisible by the group's size; the error names the fields).
  // `ranks`: one backend per rank (empty: default-constructed ones).
  tensor_parallel_backend(std::shared_ptr<parallel::tp_group> group, const model_config& config, std::vector<B> ranks = {})
      : state_(std::make_shared<tp_state<B>>()) {
    check(group != nullptr, "tensor parallel: no group");
    state_->layout = parallel::tp_layout::make(config, group->size());
    state_->group = std::move(group);
    state_->config = config;
    if (ranks.empty()) ranks.resize(static_cast<std::size_t>(state_->group->size()));
    check(static_cast<int>(ranks.size()) == state_->group->size(), "tensor parallel: ", ranks.size(),
          " rank backends for a group of ", state_->group->size());
    state_->ranks = std::move(ranks);
  }

  [[nodiscard]] int size() const { return state_->layout.size; }
  [[nodiscard]] const parallel::tp_layout& layout() const { return state_->layout; }
  [[nodiscard]] parallel::tp_group& group() const { return *state_->group; }
  [[nodiscard]] B& rank(int r) const { return state_->ranks.at(static_cast<std::size_t>(r)); }
  [[nodiscard]] const std::shared_ptr<tp_state<B>>& state() const { return state_; }

  // Tensors of the engine's side (logits) live on rank 0.
  [[nodiscard]] tensor from_host(std::span<const float> values, int rows, int cols) const {
    return rank(0).from_host(values, rows, cols);
  }
  [[nodiscard]] std::vector<float> to_host(const tensor& t) const { return rank(0).to_host(t); }

  // The engine's shape is the whole model's; each rank stores its own heads.
  [[nodiscard]] kv_storage allocate_kv(const kv_cache_shape& shape) const {
    const auto& l = layout();
    check(shape.num_kv_heads == l.num_kv_heads && (shape.num_q_heads == 0 || shape.num_q_heads == l.num_q_heads),
          "tensor parallel: a KV cache of ", shape.num_kv_heads, " KV heads for a model of ", l.num_kv_heads);
    kv_cache_shape local = shape;
    local.num_kv_heads = l.kv_heads_per_rank;
    if (shape.num_q_heads > 0) local.num_q_heads = l.q_heads_per_rank;
    kv_storage kv;
    for (int r = 0; r < size(); ++r) kv.ranks.push_back(rank(r).allocate_kv(local));
    return kv;
  }

  // The memory-plan hooks a rank backend may have (every rank stores the same types).
  template <class X = B>
    requires requires(const X& b) { b.kv_element_bytes(); }
  [[nodiscard]] std::size_t kv_element_bytes() const { return rank(0).kv_element_bytes(); }
  template <class X = B>
    requires requires(const X& b) { b.kv_scale_bytes(); }
  [[nodiscard]] std::size_t kv_scale_bytes() const { return rank(0).kv_scale_bytes(); }
  template <class X = B>
    requires requires(const X& b) { b.query_element_bytes(); }
  [[nodiscard]] std::size_t query_element_bytes() const { return rank(0).query_element_bytes(); }
  template <class X = B>
    requires requires(const X& b) { b.synchronize(); }
  void synchronize() const {
    for (int r = 0; r < size(); ++r) rank(r).synchronize();
  }

  // Ops on rank 0 (the backend concept's; tensor_parallel_llama calls each rank's backend directly).
  void embedding(const tensor& table, std::span<const token_id> ids, tensor& out) const { rank(0).embedding(table, ids, out); }
  void rms_norm(const tensor& x, const tensor& w, float eps, tensor& out) const { rank(0).rms_norm(x, w, eps, out); }
  void linear(const tensor& x, const tensor& w, tensor& out) const { rank(0).linear(x, w, out); }
  void add_bias(tensor& x, const tensor& bias) const { rank(0).add_bias(x, bias); }
  void rope(tensor& x, std::span<const std::int32_t> pos, int head_dim, float theta, rope_style style) const {
    rank(0).rope(x, pos, head_dim, theta, style);
  }
  void silu_mul(const tensor& gate, const tensor& up, tensor& out) const { rank(0).silu_mul(gate, up, out); }
  void add(tensor& x, const tensor& y) const { rank(0).add(x, y); }
  void gather_rows(const tensor& x, std::span<const std::int32_t> rows, tensor& out) const { rank(0).gather_rows(x, rows, out); }
  // The heads are spread over the ranks' storages: only tensor_parallel_llama (each rank on its own
  // storage) can attend.
  void attention(kv_storage&, int, const attention_metadata&, const tensor&, const tensor&, const tensor&, int,
                 tensor&) const {
    fail("tensor parallel: attention over a sharded KV cache runs per rank (use tensor_parallel_llama)");
  }

  // Device sampling of rank 0's logits when the rank backend has it.
  template <class X = B>
    requires device_sampler<X>
  [[nodiscard]] std::vector<token_id> sample(const tensor& logits, std::span<const sample_row> rows) const {
    return rank(0).sample(logits, rows);
  }

  // KV movement: the same blocks on every rank.
  void copy_block(kv_storage& kv, block_id from, block_id to) const {
    for (int r = 0; r < size(); ++r) rank(r).copy_block(kv.ranks[static_cast<std::size_t>(r)], from, to);
  }
  [[nodiscard]] swap_blob swap_out(kv_storage& kv, std::span<const block_id> pages, int slot) const {
    swap_blob blob;
    for (int r = 0; r < size(); ++r) blob.push_back(rank(r).swap_out(kv.ranks[static_cast<std::size_t>(r)], pages, slot));
    return blob;
  }
  void swap_in(kv_storage& kv, std::span<const block_id> pages, int slot, swap_blob& blob) const {
    check(static_cast<int>(blob.size()) == size(), "tensor parallel: a swap blob of ", blob.size(), " ranks");
    for (int r = 0; r < size(); ++r)
      rank(r).swap_in(kv.ranks[static_cast<std::size_t>(r)], pages, slot, blob[static_cast<std::size_t>(r)]);
  }

  // The engine's generic compression path (a policy with its own score()): the whole model's view,
  // assembled from the ranks (replicas read once, from the first rank holding the head).
  void gather_keys(kv_storage& kv, int layer, std::span<const block_id> pages, int kv_len, std::vector<float>& out) const {
    gather_heads(kv, layer, pages, kv_len, static_cast<std::size_t>(kv_len) * static_cast<std::size_t>(layout().head_dim), out,
                 [](B& b, typename B::kv_storage& s, int l, std::span<const block_id> p, int n, std::vector<float>& o) {
                   b.gather_keys(s, l, p, n, o);
                 });
  }
  void gather_scores(kv_storage& kv, int layer, std::span<const block_id> pages, int kv_len, std::vector<float>& out) const {
    gather_heads(kv, layer, pages, kv_len, static_cast<std::size_t>(kv_len), out,
                 [](B& b, typename B::kv_storage& s, int l, std::span<const block_id> p, int n, std::vector<float>& o) {
                   b.gather_scores(s, l, p, n, o);
                 });
  }
  // [W][q_heads][head_dim], each rank's q heads at their place.
  void gather_window_queries(kv_storage& kv, int layer, int slot, std::vector<float>& out) const {
    const auto& l = layout();
    const auto d = static_cast<std::size_t>(l.head_dim);
    std::vector<float> local;
    std::size_t window = 0;
    for (int r = 0; r < size(); ++r) {
      rank(r).gather_window_queries(kv.ranks[static_cast<std::size_t>(r)], layer, slot, local);
      const std::size_t row = static_cast<std::size_t>(l.q_heads_per_rank) * d;
      if (r == 0) {
        window = local.size() / row;
        out.assign(window * static_cast<std::size_t>(l.num_q_heads) * d, 0.0f);
      }
      for (std::size_t w = 0; w < window; ++w)
        std::copy_n(local.begin() + static_cast<std::ptrdiff_t>(w * row), row,
                    out.begin() + static_cast<std::ptrdiff_t>((w * l.num_q_heads + l.q_head_begin(r)) * d));
    }
  }
  // The whole model's plan, split by rank (each replica applies its head's part).
  void apply_compaction(kv_storage& kv, const compaction_plan& plan) const {
    const auto& l = layout();
    for (int r = 0; r < size(); ++r) {
      compaction_plan local;
      local.request = plan.request;
      local.old_len = plan.old_len;
      local.new_len = plan.new_len;
      local.num_layers = plan.num_layers;
      local.num_kv_heads = l.kv_heads_per_rank;
      local.pages = plan.pages;
      for (int layer = 0; layer < plan.num_layers; ++layer)
        for (int h = 0; h < l.kv_heads_per_rank; ++h) {
          const auto kept = plan.kept(layer, l.kv_head_begin(r) + h);
          local.keep.insert(local.keep.end(), kept.begin(), kept.end());
          const auto scores = plan.scores(layer, l.kv_head_begin(r) + h);
          local.kept_scores.insert(local.kept_scores.end(), scores.begin(), scores.end());
        }
      rank(r).apply_compaction(kv.ranks[static_cast<std::size_t>(r)], local);
    }
  }

  // The engine's hook for recipe-scored policies (every built-in): each rank scores, selects and compacts
  // its own KV heads. On a rank backend with its own device compressor, and no replicated heads, each rank
  // runs that; otherwise each rank runs the host reference (compressor.hpp's steps, on its heads).
  bool compress_on_device(kv_storage& kv, std::span<const device_compression_job> jobs, const score_recipe& recipe,
                          const compression_params& params, int keep) const {
    if constexpr (device_compressor<B>) {
      if (!layout().replicated() && rank(0).compress_on_device(kv.ranks[0], jobs, recipe, params, keep)) {
        for (int r = 1; r < size(); ++r)
          check(rank(r).compress_on_device(kv.ranks[static_cast<std::size_t>(r)], jobs, recipe, params, keep),
                "tensor parallel: rank ", r, " declined a compression rank 0 ran");
        return true;
      }
    }
    if constexpr (evicting_backend<B>) {
      for (const auto& job : jobs) {
        // Every rank scores before any compacts: a replica reads its group's window queries, which a
        // compaction leaves in place anyway (only K, V and scores move).
        std::vector<compaction_plan> plans;
        for (int r = 0; r < size(); ++r) plans.push_back(plan_rank(kv, r, job, recipe, params, keep));
        for (int r = 0; r < size(); ++r) rank(r).apply_compaction(kv.ranks[static_cast<std::size_t>(r)], plans[static_cast<std::size_t>(r)]);
      }
      return true;
    } else {
      return false;
    }
  }

 private:
  template <class Gather>
  void gather_heads(kv_storage& kv, int layer, std::span<const block_id> pages, int kv_len, std::size_t per_head,
                    std::vector<float>& out, Gather gather) const {
    const auto& l = layout();
    out.assign(static_cast<std::size_t>(l.num_kv_heads) * per_head, 0.0f);
    std::vector<float> local;
    for (int r = 0; r < size(); r += l.kv_replicas) {
      gather(rank(r), kv.ranks[static_cast<std::size_t>(r)], layer, pages, kv_len, local);
      check(local.size() == static_cast<std::size_t>(l.kv_heads_per_rank) * per_head, "tensor parallel: rank ", r,
            " gathered ", local.size(), " values, expected ", static_cast<std::size_t>(l.kv_heads_per_rank) * per_head);
      std::copy(local.begin(), local.end(), out.begin() + static_cast<std::ptrdiff_t>(l.kv_head_begin(r) * per_head));
    }
  }

  // Rank r's window queries for scoring: its own, or with replicated KV heads the whole GQA group's
  // (the ranks sharing its KV head, in head order), as N = 1 scores the head.
  void group_queries(kv_storage& kv, int r, int layer, int slot, std::vector<float>& out) const {
    const auto& l = layout();
    if (!l.replicated()) {
      rank(r).gather_window_queries(kv.ranks[static_cast<std::size_t>(r)], layer, slot, out);
      return;
    }
    const auto row = static_cast<std::size_t>(l.q_heads_per_rank) * static_cast<std::size_t>(l.head_dim);
    const auto group_row = row * static_cast<std::size_t>(l.kv_replicas);
    std::vector<float> local;
    const int first = l.kv_group_first_rank(r);
    for (int s = first; s < first + l.kv_replicas; ++s) {
      rank(s).gather_window_queries(kv.ranks[static_cast<std::size_t>(s)], layer, slot, local);
      const std::size_t window = local.size() / row;
      if (s == first) out.assign(window * group_row, 0.0f);
      for (std::size_t w = 0; w < window; ++w)
        std::copy_n(local.begin() + static_cast<std::ptrdiff_t>(w * row), row,
                    out.begin() + static_cast<std::ptrdiff_t>(w * group_row + static_cast<std::size_t>(s - first) * row));
    }
  }

  // compressor::plan's steps over rank r's KV heads.
  compaction_plan plan_rank(kv_storage& kv, int r, const device_compression_job& job, const score_recipe& recipe,
                            const compression_params& params, int keep_tokens) const {
    const auto& l = layout();
    const auto& c = state_->config;
    B& b = rank(r);
    auto& local = kv.ranks[static_cast<std::size_t>(r)];
    const int kv_len = job.kv_len;
    const int keep = std::min(keep_tokens, kv_len);
    check(keep >= params.window, "compression: keeping ", keep, " tokens cannot hold the window of ", params.window);
    compaction_plan p;
    p.old_len = kv_len;
    p.new_len = keep;
    p.num_layers = c.num_layers;
    p.num_kv_heads = l.kv_heads_per_rank;
    p.pages.assign(job.pages.begin(), job.pages.end());
    const bool history = recipe.uses_score_cache();
    const auto heads = static_cast<std::size_t>(l.kv_heads_per_rank);
    const auto per_head = static_cast<std::size_t>(kv_len);
    p.keep.resize(static_cast<std::size_t>(p.num_layers) * heads * static_cast<std::size_t>(keep));
    if (history) p.kept_scores.resize(p.keep.size());
    std::vector<float> keys, queries, prev, keep_score(heads * per_head), cache_out(heads * per_head);
    std::vector<std::int32_t> order;
    const int q_heads = l.q_heads_per_rank * l.kv_replicas;  // the query heads scoring each local KV head
    for (int layer = 0; layer < p.num_layers; ++layer) {
      b.gather_keys(local, layer, p.pages, kv_len, keys);
      group_queries(kv, r, layer, job.slot, queries);
      if (history) b.gather_scores(local, layer, p.pages, kv_len, prev);
      else prev.assign(heads * per_head, 0.0f);
      const score_context ctx{kv_len, l.kv_heads_per_rank, q_heads, l.head_dim, params.block_size, params.window,
                              job.first_compression, keys, queries, prev};
      std::fill(cache_out.begin(), cache_out.end(), 0.0f);
      scoring::run_recipe(recipe, ctx, keep_score, cache_out);
      for (std::size_t h = 0; h < heads; ++h) {
        const std::span<float> row(keep_score.data() + h * per_head, per_head);
        std::fill(row.end() - params.window, row.end(), std::numeric_limits<float>::infinity());
        const auto offset = p.offset(layer, static_cast<int>(h));
        const std::span<std::int32_t> kept(p.keep.data() + offset, static_cast<std::size_t>(keep));
        select_top_k(row, keep, order, kept);
        if (history)
          for (int i = 0; i < keep; ++i)
            p.kept_scores[offset + static_cast<std::size_t>(i)] =
                cache_out[h * per_head + static_cast<std::size_t>(kept[static_cast<std::size_t>(i)])];
      }
    }
    return p;
  }

  std::shared_ptr<tp_state<B>> state_;
};

// One rank's share of a Llama model and the activations its forward reuses.
template <class B>
struct llama_shard {
  using tensor = typename B::tensor;
  struct layer {
    tensor attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
    std::optional<tensor> bq, bk, bv, q_norm, k_norm;
  };
  tensor embedding;  // [V' + 1][hidden]: the rank's vocabulary rows (zero-padded) and one zero row
  std::vector<layer> layers;
  tensor final_norm;
  tensor lm_head;    // [V'][hidden]
  tensor x, h, qkv, q, k, v, attn, gate, up, local_logits, logits;  // qkv: unused (shards are not fused)
  std::vector<token_id> local_ids;
  std::vector<float> gathered;
};

template <class B = cpu_backend>
class tensor_parallel_llama {
 public:
  using backend_type = tensor_parallel_backend<B>;
  using tensor = typename B::tensor;

  // Shards `full` (host weights) over the backend's ranks, uploading each shard with its rank's backend.
  tensor_parallel_llama(const llama_model<cpu_backend>& full, backend_type backend)
      : config_(full.config()), backend_(std::move(backend)) {
    check(backend_.layout().num_q_heads == config_.num_q_heads && backend_.layout().num_kv_heads == config_.num_kv_heads &&
              backend_.layout().vocab_size == config_.vocab_size,
          "tensor parallel: the backend was laid out for another model");
    check(!config_.rope_scaling.enabled() || llama_block::scales_rope<B>,
          "llama: the config asks for RoPE frequency scaling, which this backend does not implement");
    for (int r = 0; r < backend_.size(); ++r) shards_.push_back(make_shard(full.weights(), r));
  }

  [[nodiscard]] const model_config& config() const { return config_; }
  [[nodiscard]] const backend_type& backend() const { return backend_; }
  [[nodiscard]] const parallel::tp_layout& layout() const { return backend_.layout(); }

  // Every rank runs its shard over the same batch; rank 0's gathered logits are the step's.
  const tensor& forward(forward_context<backend_type>& ctx) {
    const forward_batch& batch = ctx.batch();
    auto& kv = ctx.kv();
    backend_.group().run([&](int r) {
      forward_rank(r, kv.ranks[static_cast<std::size_t>(r)], batch);
    });
    return shards_[0].logits;
  }

 private:
  static std::span<const float> host(const cpu::matrix& m) { return {m.data(), static_cast<std::size_t>(m.size())}; }

  llama_shard<B> make_shard(const llama_weights<cpu_backend>& w, int r) const {
    const auto& c = config_;
    const auto& l = backend_.layout();
    B& b = backend_.rank(r);
    const int d = c.head_dim, hidden = c.hidden_size;
    auto up = [&](const std::vector<float>& v, int rows, int cols) { return b.from_host(v, rows, cols); };
    auto whole = [&](const cpu::matrix& m) { return b.from_host(host(m), static_cast<int>(m.rows()), static_cast<int>(m.cols())); };
    auto rows = [&](const cpu::matrix& m, int begin, int count, int pad_to = 0) {
      return up(parallel::slice_rows(host(m), static_cast<int>(m.rows()), static_cast<int>(m.cols()), begin, count, pad_to),
                std::max(count, pad_to), static_cast<int>(m.cols()));
    };
    auto cols = [&](const cpu::matrix& m, int begin, int count) {
      return up(parallel::slice_cols(host(m), static_cast<int>(m.rows()), static_cast<int>(m.cols()), begin, count),
                static_cast<int>(m.rows()), count);
    };
    auto bias = [&](const std::optional<cpu::matrix>& m, int begin, int count) -> std::optional<tensor> {
      if (!m) return std::nullopt;
      return cols(*m, begin, count);  // [1][out]: the rank's output features are columns of the bias row
    };
    llama_shard<B> s;
    const int q0 = l.q_head_begin(r) * d, qn = l.q_heads_per_rank * d;
    const int k0 = l.kv_head_begin(r) * d, kn = l.kv_heads_per_rank * d;
    const int f0 = l.ffn_begin(r), fn = l.ffn_count(r);
    const int v0 = l.vocab_begin(r), vn = l.vocab_count(r), vp = l.vocab_per_rank;
    s.embedding = rows(w.embedding, v0, vn, vp + 1);  // + the zero row ids of other shards look up
    for (const auto& lw : w.layers) {
      typename llama_shard<B>::layer sl;
      sl.attn_norm = whole(lw.attn_norm);
      // A fused q|k|v (gate|up) weight is sliced where its parts begin: each rank's shard stays unfused.
      const int q_rows = c.q_size(), kv_rows = c.kv_size();
      sl.wq = lw.wqkv ? rows(*lw.wqkv, q0, qn) : rows(lw.wq, q0, qn);
      sl.wk = lw.wqkv ? rows(*lw.wqkv, q_rows + k0, kn) : rows(lw.wk, k0, kn);
      sl.wv = lw.wqkv ? rows(*lw.wqkv, q_rows + kv_rows + k0, kn) : rows(lw.wv, k0, kn);
      sl.bq = bias(lw.bq, q0, qn);
      sl.bk = bias(lw.bk, k0, kn);
      sl.bv = bias(lw.bv, k0, kn);
      if (lw.q_norm) sl.q_norm = whole(*lw.q_norm);
      if (lw.k_norm) sl.k_norm = whole(*lw.k_norm);
      sl.wo = cols(lw.wo, q0, qn);
      sl.ffn_norm = whole(lw.ffn_norm);
      sl.w_gate = lw.w_gate_up ? rows(*lw.w_gate_up, f0, fn) : rows(lw.w_gate, f0, fn);
      sl.w_up = lw.w_gate_up ? rows(*lw.w_gate_up, c.ffn_size + f0, fn) : rows(lw.w_up, f0, fn);
      sl.w_down = cols(lw.w_down, f0, fn);
      s.layers.push_back(std::move(sl));
    }
    s.final_norm = whole(w.final_norm);
    s.lm_head = rows(w.lm_head ? *w.lm_head : w.embedding, v0, vn, vp);
    (void)hidden;
    return s;
  }

  // llama_model::forward on rank r's shard, with the collectives where the shards' partial results meet.
  void forward_rank(int r, typename B::kv_storage& kv, const forward_batch& batch) {
    const auto& c = config_;
    const auto& l = backend_.layout();
    B& ops = backend_.rank(r);
    parallel::communicator& comm = backend_.group().comm(r);
    using coll = tp_collectives<B>;
    auto& s = shards_[static_cast<std::size_t>(r)];

    // Vocabulary-parallel embedding: ids outside the shard read its zero row; the sum over ranks is the row.
    const int v0 = l.vocab_begin(r), vn = l.vocab_count(r);
    s.local_ids.resize(batch.tokens.size());
    for (std::size_t t = 0; t < batch.tokens.size(); ++t) {
      const token_id id = batch.tokens[t];
      check(id >= 0 && id < c.vocab_size, "embedding: token id ", id, " outside the vocabulary of ", c.vocab_size);
      s.local_ids[t] = id >= v0 && id < v0 + vn ? id - v0 : l.vocab_per_rank;
    }
    ops.embedding(s.embedding, s.local_ids, s.x);
    coll::all_reduce(ops, comm, s.x);

    forward_context<B> ctx(ops, kv, batch, l.q_heads_per_rank);
    for (int layer = 0; layer < c.num_layers; ++layer) {
      const auto& lw = s.layers[static_cast<std::size_t>(layer)];
      llama_block::attention_input(ops, c, lw, s.x, s.h, s.qkv, s.q, s.k, s.v, batch.positions);
      ctx.attention(layer, s.q, s.k, s.v, s.attn);
      ops.linear(s.attn, lw.wo, s.h);
      coll::all_reduce(ops, comm, s.h);
      ops.add(s.x, s.h);

      ops.rms_norm(s.x, lw.ffn_norm, c.rms_eps, s.h);
      ops.linear(s.h, lw.w_gate, s.gate);
      ops.linear(s.h, lw.w_up, s.up);
      ops.silu_mul(s.gate, s.up, s.gate);
      ops.linear(s.gate, lw.w_down, s.h);
      coll::all_reduce(ops, comm, s.h);
      ops.add(s.x, s.h);
    }
    ops.gather_rows(s.x, batch.logits_rows, s.h);
    ops.rms_norm(s.h, s.final_norm, c.rms_eps, s.h);
    ops.linear(s.h, s.lm_head, s.local_logits);
    coll::gather_vocab(ops, comm, l, s.local_logits, s.gathered, s.logits);
  }

  model_config config_;
  backend_type backend_;
  std::vector<llama_shard<B>> shards_;
};

// The usual set-up on the CPU: an in-process group of n threads, cpu_backend on every rank, `full`
// sharded over them.
inline tensor_parallel_llama<cpu_backend> make_tensor_parallel_llama(const llama_model<cpu_backend>& full, int n) {
  return tensor_parallel_llama<cpu_backend>(full, tensor_parallel_backend<cpu_backend>(
                                                      parallel::tp_group::in_process(n), full.config()));
}

// One rank's KV memory plan, from the engine's plan of the whole model (block bytes scale with the
// rank's KV heads, query-slot bytes with its q heads; block and slot counts are the same on every rank).
inline std::string describe_rank_memory(const memory_plan& plan, const parallel::tp_layout& l) {
  const double block = static_cast<double>(plan.block_bytes) * l.block_fraction();
  const double slot = static_cast<double>(plan.query_slot_bytes) * l.query_fraction();
  const double total = block * plan.num_blocks + slot * plan.num_query_slots;
  char buf[256];
  std::snprintf(buf, sizeof buf, "per rank (%d ranks): %d blocks x %.1f KiB + %d query slots x %.1f KiB = %.1f MiB",
                l.size, plan.num_blocks, block / 1024.0, plan.num_query_slots, slot / 1024.0, total / 1048576.0);
  return buf;
}

}  // namespace zipage
