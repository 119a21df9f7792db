#pragma once
// The CPU reference backend: exact fp32, single-threaded, written for clarity and for results that do
// not depend on how requests are batched (every row of every op is computed the same way whatever
// else is in the batch), so a request gives the same tokens alone or in a crowd, before or after a
// preemption. Every CUDA kernel is tested against these functions.
#include <Eigen/Core>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/types.hpp"
#include "zipage/backend/cpu/compaction.hpp"
#include "zipage/backend/cpu/kv_storage.hpp"
#include "zipage/kv/paged_kv.hpp"
#include "zipage/model/forward_context.hpp"
#include "zipage/model/model_config.hpp"
#include "zipage/model/qkv_epilogue.hpp"

namespace zipage {

namespace cpu {

// out[t] = table[ids[t]]
inline void embedding(const matrix& table, std::span<const token_id> ids, matrix& out) {
  out.resize(static_cast<Eigen::Index>(ids.size()), table.cols());
  for (std::size_t t = 0; t < ids.size(); ++t) {
    check(ids[t] >= 0 && ids[t] < table.rows(), "embedding: token id ", ids[t],
          " outside the vocabulary of ", table.rows());
    out.row(static_cast<Eigen::Index>(t)) = table.row(ids[t]);
  }
}

// Row-wise RMSNorm: out = x / sqrt(mean(x²) + eps) * weight. Used on whole rows (hidden states) and,
// with weight.cols() == head_dim, on each head of a row (Qwen3's q/k norm).
inline void rms_norm(const matrix& x, const matrix& weight, float eps, matrix& out) {
  const Eigen::Index width = weight.cols();
  check(width > 0 && x.cols() % width == 0, "rms_norm: row of ", x.cols(), " is not a multiple of the weight width ", width);
  out.resize(x.rows(), x.cols());
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    for (Eigen::Index c0 = 0; c0 < x.cols(); c0 += width) {
      double sum_sq = 0.0;
      for (Eigen::Index c = 0; c < width; ++c) sum_sq += double(x(r, c0 + c)) * x(r, c0 + c);
      const float inv = 1.0f / std::sqrt(static_cast<float>(sum_sq / double(width)) + eps);
      for (Eigen::Index c = 0; c < width; ++c) out(r, c0 + c) = x(r, c0 + c) * inv * weight(0, c);
    }
  }
}

// out = x · wᵀ with w stored [out_features][in_features]. Each row is computed on its own through an
// aligned copy so its result bits do not depend on the batch it came in.
inline void linear(const matrix& x, const matrix& w, matrix& out) {
  check(x.cols() == w.cols(), "linear: input width ", x.cols(), " does not match weight input width ", w.cols());
  out.resize(x.rows(), w.rows());
  vector row(x.cols());
  vector result(w.rows());
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    row = x.row(r).transpose();
    result.noalias() = w * row;
    out.row(r) = result.transpose();
  }
}

inline void add_bias(matrix& x, const matrix& bias) {
  for (Eigen::Index r = 0; r < x.rows(); ++r) x.row(r) += bias.row(0);
}

// Rotates every head of every row by its token's logical position; `scaling` rescales the frequencies
// (Llama 3.1's llama3 scaling, or a GGUF file's per-frequency factors: rope_scaling_config::apply).
inline void rope(matrix& x, std::span<const std::int32_t> positions, int head_dim, float theta, rope_style style,
                 const rope_scaling_config& scaling = {}) {
  check(static_cast<std::size_t>(x.rows()) == positions.size(), "rope: ", x.rows(), " rows but ",
        positions.size(), " positions");
  const int half = head_dim / 2;
  std::vector<double> inv_freq(static_cast<std::size_t>(half));
  for (int i = 0; i < half; ++i)
    inv_freq[static_cast<std::size_t>(i)] = scaling.apply(i, std::pow(double(theta), -2.0 * i / head_dim));
  const auto heads = x.cols() / head_dim;
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    for (Eigen::Index h = 0; h < heads; ++h) {
      float* v = x.row(r).data() + h * head_dim;
      for (int i = 0; i < half; ++i) {
        const double angle = positions[static_cast<std::size_t>(r)] * inv_freq[static_cast<std::size_t>(i)];
        const auto c = static_cast<float>(std::cos(angle));
        const auto s = static_cast<float>(std::sin(angle));
        const int a = style == rope_style::interleaved ? 2 * i : i;
        const int b = style == rope_style::interleaved ? 2 * i + 1 : i + half;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
      }
    }
  }
}

inline float silu_times(float g, float u) { return g / (1.0f + std::exp(-g)) * u; }

// out = silu(gate) * up
inline void silu_mul(const matrix& gate, const matrix& up, matrix& out) {
  out.resize(gate.rows(), gate.cols());
  for (Eigen::Index r = 0; r < gate.rows(); ++r)
    for (Eigen::Index c = 0; c < gate.cols(); ++c) out(r, c) = silu_times(gate(r, c), up(r, c));
}

// The same function of a fused [rows][2 * cols] gate|up matrix: out = silu(gate_up[:, :cols]) * gate_up[:, cols:].
inline void swiglu(const matrix& gate_up, matrix& out) {
  check(gate_up.cols() % 2 == 0, "swiglu: a gate|up row of ", gate_up.cols(), " columns is not two halves");
  const Eigen::Index cols = gate_up.cols() / 2;
  matrix result(gate_up.rows(), cols);  // out may be gate_up
  for (Eigen::Index r = 0; r < gate_up.rows(); ++r)
    for (Eigen::Index c = 0; c < cols; ++c) result(r, c) = silu_times(gate_up(r, c), gate_up(r, cols + c));
  out.swap(result);
}

// Linear weights [n_i][in] stacked into one [sum n_i][in] (a fused projection's weight).
inline matrix stack_rows(std::span<const matrix* const> parts) {
  check(!parts.empty(), "stack_rows: no parts");
  Eigen::Index rows = 0;
  for (const matrix* p : parts) {
    check(p->cols() == parts[0]->cols(), "stack_rows: parts of ", parts[0]->cols(), " and ", p->cols(), " columns");
    rows += p->rows();
  }
  matrix out(rows, parts[0]->cols());
  Eigen::Index r = 0;
  for (const matrix* p : parts) {
    out.middleRows(r, p->rows()) = *p;
    r += p->rows();
  }
  return out;
}

// outs[i] = the widths[i] columns of x after those of outs[0..i) (a fused projection's output, cut).
inline void split_columns(const matrix& x, std::span<const int> widths, std::span<matrix* const> outs) {
  check(widths.size() == outs.size(), "split_columns: ", widths.size(), " widths for ", outs.size(), " outputs");
  Eigen::Index sum = 0;
  for (const int w : widths) {
    check(w >= 0, "split_columns: negative width ", w);
    sum += w;
  }
  check(sum == x.cols(), "split_columns: widths add up to ", sum, ", not the row of ", x.cols());
  Eigen::Index c = 0;
  for (std::size_t i = 0; i < outs.size(); ++i) {
    check(outs[i] != &x, "split_columns: an output may not alias the input");
    *outs[i] = x.middleCols(c, widths[i]);
    c += widths[i];
  }
}

inline void gather_rows(const matrix& x, std::span<const std::int32_t> rows, matrix& out) {
  out.resize(static_cast<Eigen::Index>(rows.size()), x.cols());
  for (std::size_t i = 0; i < rows.size(); ++i) out.row(static_cast<Eigen::Index>(i)) = x.row(rows[i]);
}

// A model's forward_context::attention call, checked against the cache before anything is written: a layer
// outside the cache, or q / k / v of the wrong width or with too few rows, wrote past the pool's layers or a
// token's heads (heap corruption, not an error). q: [rows][q_heads * head_dim]; k, v: [rows][kv_heads * head_dim],
// a row per token of the step at least.
inline void check_attention_call(const kv_cache_shape& s, int layer, const attention_metadata& meta, const matrix& q,
                                 const matrix& k, const matrix& v, int num_q_heads) {
  check(layer >= 0 && layer < s.num_layers, "attention: layer ", layer, " is outside the KV cache's ", s.num_layers,
        " layers (forward_context::attention's first argument; the model's config().num_layers)");
  check(num_q_heads > 0 && num_q_heads % s.num_kv_heads == 0, "attention: ", num_q_heads,
        " query heads are not a multiple of the cache's ", s.num_kv_heads, " KV heads");
  const auto check_tensor = [&](const char* name, const matrix& x, std::int64_t width, int heads) {
    check(x.cols() == width, "attention (layer ", layer, "): ", name, " has ", x.cols(), " columns, not ", heads,
          " heads x head_dim ", s.head_dim, " = ", width);
    check(x.rows() >= meta.num_tokens(), "attention (layer ", layer, "): ", name, " has ", x.rows(),
          " rows, fewer than the step's ", meta.num_tokens(), " tokens");
  };
  check_tensor("q", q, std::int64_t{num_q_heads} * s.head_dim, num_q_heads);
  check_tensor("k", k, s.token_stride(), s.num_kv_heads);
  check_tensor("v", v, s.token_stride(), s.num_kv_heads);
}

// Writes each new token's K/V into its slot. k, v: [num_tokens][kv_heads * head_dim].
inline void append_kv(paged_kv_layer<float> kv, std::span<const std::int64_t> slots, const matrix& k, const matrix& v) {
  const std::int64_t width = std::int64_t{kv.num_kv_heads} * kv.head_dim;
  for (std::size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] < 0) continue;  // a padding row (decode graphs) writes nowhere
    const auto r = static_cast<Eigen::Index>(t);
    std::copy_n(k.row(r).data(), width, kv.k + slots[t] * width);
    std::copy_n(v.row(r).data(), width, kv.v + slots[t] * width);
  }
}

// Copies the queries of tokens inside a block's last W positions into the query-window cache.
inline void record_queries(float* rows, std::span<const std::int32_t> token_row, const matrix& q) {
  for (std::size_t t = 0; t < token_row.size(); ++t)
    if (token_row[t] >= 0)
      std::copy_n(q.row(static_cast<Eigen::Index>(t)).data(), q.cols(), rows + std::int64_t{token_row[t]} * q.cols());
}

namespace detail {
// Causal GQA attention over the paged cache, each cached key and value head read as fp32 through `rows`
// (rows.key(slot, head), rows.value(slot, head); rows.kv the layer's geometry): the fp32 cache's own
// rows, or the FP8 cache's dequantised ones (fp8_kv.hpp), so both run the same operations in the same order.
template <class Rows>
void paged_attention(Rows& rows, const attention_metadata& meta, const matrix& q, int num_q_heads, float scale, matrix& out) {
  const auto& kv = rows.kv;
  const int d = kv.head_dim;
  const int group = num_q_heads / kv.num_kv_heads;
  out.resize(q.rows(), q.cols());
  std::vector<float> scores;
  for (int t = 0; t < meta.num_tokens(); ++t) {
    const int s = meta.token_seq[static_cast<std::size_t>(t)];
    const int len = meta.token_kv_len[static_cast<std::size_t>(t)];
    const std::int32_t* pages = meta.page_indices.data() + meta.page_indptr[static_cast<std::size_t>(s)];
    scores.resize(static_cast<std::size_t>(len));
    for (int h = 0; h < num_q_heads; ++h) {
      const float* qh = q.row(t).data() + h * d;
      const int kvh = h / group;
      float max_score = -INFINITY;
      for (int j = 0; j < len; ++j) {
        const std::int64_t slot = std::int64_t{pages[j / kv.block_size]} * kv.block_size + j % kv.block_size;
        const float* kj = rows.key(slot, kvh);
        float dot = 0.0f;
        for (int i = 0; i < d; ++i) dot += qh[i] * kj[i];
        scores[static_cast<std::size_t>(j)] = dot * scale;
        max_score = std::max(max_score, scores[static_cast<std::size_t>(j)]);
      }
      float denom = 0.0f;
      for (float& sc : scores) denom += (sc = std::exp(sc - max_score));
      float* oh = out.row(t).data() + h * d;
      std::fill_n(oh, d, 0.0f);
      for (int j = 0; j < len; ++j) {
        const std::int64_t slot = std::int64_t{pages[j / kv.block_size]} * kv.block_size + j % kv.block_size;
        const float* vj = rows.value(slot, kvh);
        const float p = scores[static_cast<std::size_t>(j)] / denom;
        for (int i = 0; i < d; ++i) oh[i] += p * vj[i];
      }
    }
  }
}
}  // namespace detail

// Causal GQA attention over the paged cache. q, out: [num_tokens][q_heads * head_dim].
// Token t of sequence s attends to physical slots [0, token_kv_len[t]) of s's page table.
inline void paged_attention(paged_kv_layer<const float> kv, const attention_metadata& meta, const matrix& q,
                            int num_q_heads, float scale, matrix& out) {
  f32_rows rows{kv};
  detail::paged_attention(rows, meta, q, num_q_heads, scale, out);
}

}  // namespace cpu

// The backend type the engine is instantiated with: its tensor type, its KV storage and its ops.
struct cpu_backend {
  using tensor = cpu::matrix;  // [rows][cols] row-major fp32
  using kv_storage = cpu_kv_storage;
  static constexpr const char* name = "cpu";

  [[nodiscard]] tensor from_host(std::span<const float> values, int rows, int cols) const {
    check(values.size() == static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols),
          "cpu_backend: ", values.size(), " values do not fill a ", rows, "x", cols, " tensor");
    return Eigen::Map<const tensor>(values.data(), rows, cols);
  }
  [[nodiscard]] std::vector<float> to_host(const tensor& t) const {
    return {t.data(), t.data() + t.size()};
  }
  [[nodiscard]] kv_storage allocate_kv(const kv_cache_shape& shape) const { return kv_storage(shape); }

  void embedding(const tensor& table, std::span<const token_id> ids, tensor& out) const { cpu::embedding(table, ids, out); }
  void rms_norm(const tensor& x, const tensor& w, float eps, tensor& out) const { cpu::rms_norm(x, w, eps, out); }
  void linear(const tensor& x, const tensor& w, tensor& out) const { cpu::linear(x, w, out); }
  void add_bias(tensor& x, const tensor& bias) const { cpu::add_bias(x, bias); }
  void rope(tensor& x, std::span<const std::int32_t> pos, int head_dim, float theta, rope_style style) const {
    cpu::rope(x, pos, head_dim, theta, style);
  }
  void rope(tensor& x, std::span<const std::int32_t> pos, int head_dim, float theta, rope_style style,
            const rope_scaling_config& scaling) const {
    cpu::rope(x, pos, head_dim, theta, style, scaling);
  }
  void silu_mul(const tensor& gate, const tensor& up, tensor& out) const { cpu::silu_mul(gate, up, out); }
  // Fused projections (models/llama.hpp fuses_projections).
  [[nodiscard]] std::optional<tensor> stack_rows(std::span<const tensor* const> parts) const { return cpu::stack_rows(parts); }
  void split_columns(const tensor& x, std::span<const int> widths, std::span<tensor* const> outs) const {
    cpu::split_columns(x, widths, outs);
  }
  void swiglu(const tensor& gate_up, tensor& out) const { cpu::swiglu(gate_up, out); }
  // Residual add then RMSNorm: x += y; out = rms_norm(x, w) (out may be y, not x).
  void add_rms_norm(tensor& x, const tensor& y, const tensor& w, float eps, tensor& out) const {
    check(&out != &x, "add_rms_norm: the output may not be x (it may be y)");
    check(x.rows() == y.rows() && x.cols() == y.cols(), "add_rms_norm: shapes differ (", x.rows(), "x", x.cols(), " and ",
          y.rows(), "x", y.cols(), ")");
    check(w.cols() == x.cols(), "add_rms_norm: a weight of ", w.cols(), " for rows of ", x.cols());
    x += y;
    cpu::rms_norm(x, w, eps, out);
  }
  // What follows a fused q|k|v projection (model/qkv_epilogue.hpp): the ops above, one after another.
  void qkv_epilogue(const tensor& qkv, const zipage::qkv_epilogue<tensor>& e, tensor& q, tensor& k, tensor& v) const {
    separate_qkv_epilogue(*this, qkv, e, q, k, v);
  }
  void add(tensor& x, const tensor& y) const { x += y; }
  void gather_rows(const tensor& x, std::span<const std::int32_t> rows, tensor& out) const { cpu::gather_rows(x, rows, out); }

  // Compression data movement (see backend/cpu/compaction.hpp).
  void gather_keys(kv_storage& kv, int layer, std::span<const block_id> pages, int kv_len, std::vector<float>& out) const {
    cpu::gather_keys(kv, layer, pages, kv_len, out);
  }
  void gather_scores(kv_storage& kv, int layer, std::span<const block_id> pages, int kv_len, std::vector<float>& out) const {
    cpu::gather_scores(kv, layer, pages, kv_len, out);
  }
  void gather_window_queries(kv_storage& kv, int layer, int slot, std::vector<float>& out) const {
    const auto rows = cpu::window_queries(kv, layer, slot);
    out.assign(rows.begin(), rows.end());
  }
  void apply_compaction(kv_storage& kv, const compaction_plan& plan) const { cpu::apply_compaction(kv, plan); }
  void copy_block(kv_storage& kv, block_id from, block_id to) const { cpu::copy_block(kv, from, to); }

  using swap_blob = cpu::swap_blob;
  [[nodiscard]] swap_blob swap_out(kv_storage& kv, std::span<const block_id> pages, int slot) const {
    return cpu::save_request_state(kv, pages, slot);
  }
  void swap_in(kv_storage& kv, std::span<const block_id> pages, int slot, swap_blob& blob) const {
    cpu::restore_request_state(kv, pages, slot, blob);
  }

  void attention(kv_storage& kv, int layer, const attention_metadata& meta, const tensor& q, const tensor& k,
                        const tensor& v, int num_q_heads, tensor& out) const {
    cpu::check_attention_call(kv.shape, layer, meta, q, k, v, num_q_heads);
    auto view = kv.layer(layer);
    cpu::append_kv(view, meta.slot_mapping, k, v);
    if (!meta.token_window_row.empty()) cpu::record_queries(kv.query_rows(layer), meta.token_window_row, q);
    cpu::paged_attention(std::as_const(kv).layer(layer), meta, q, num_q_heads, 1.0f / std::sqrt(float(view.head_dim)), out);
  }

  // Nano-batches (model/forward_context.hpp overlapping_backend). The CPU has nothing to overlap: attention_async
  // attends at once. Off unless overlap_min_batch > 0, which tests set to run the engine's and the model's
  // split path on the reference backend.
  int overlap_min_batch = 0;
  [[nodiscard]] int nano_batch_split(int num_seqs) const { return zipage::nano_batch_split(num_seqs, overlap_min_batch); }
  void attention_async(kv_storage& kv, int layer, const attention_metadata& meta, const tensor& q, const tensor& k,
                       const tensor& v, int num_q_heads, tensor& out, int /*nano*/) const {
    attention(kv, layer, meta, q, k, v, num_q_heads, out);
  }
  void wait_attention(int /*nano*/) const {}
  void concat_rows(const tensor& a, const tensor& b, tensor& out) const {
    check(a.cols() == b.cols(), "concat_rows: ", a.cols(), " and ", b.cols(), " columns");
    tensor stacked(a.rows() + b.rows(), a.cols());
    stacked << a, b;
    out.swap(stacked);
  }
};

}  // namespace zipage
