#pragma once
// The CPU reference of the FP8 KV cache (issue 14, part 1): K and V stored as OCP E4M3 codes
// (core/fp8.hpp) with one 2-byte scale per (token, KV head) and side: a bf16 (core/kv_scale.hpp),
// s = bf16_rne(amax / 448) of that head's head_dim values, so the largest magnitude of every head vector
// maps to +-448 (x / s may exceed 448 by up to 0.4%: the saturating conversion clamps it).
// The score cache and the query-window cache stay fp32.
//
//   written  at append:   code[i] = e4m3(x[i] / s)               (IEEE division, round to nearest even, saturating)
//   read     everywhere:  x'[i]   = float(code[i]) * float(s)    (attention, key gathering, nothing else)
//   moved    as is:       compaction, copy-on-write and swap move codes and scales together, bit for bit.
//
// A head whose vector is all zeros (or whose scale rounds to 0) gets scale 0 and zero codes; one holding a NaN
// gets the NaN scale (NaN codes), one holding an infinity the infinite scale: every value read back from either is
// NaN, as the fp32 cache would carry them into attention.
// cpu_fp8kv_backend is cpu_backend with only its KV-touching members replaced, so the engine accepts
// it wherever it accepts cpu_backend: engine<llama_model<cpu_fp8kv_backend>, Policy>.
//
// Bytes per cached token per layer: 2 · kv_heads · head_dim (codes) + 2 · kv_heads · 2 (scales),
// plus kv_heads · 4 with a score cache (fp8_kv_bytes_per_token). The query-window cache stays fp32.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "zipage/backend/cpu/compaction.hpp"
#include "zipage/backend/cpu/cpu_backend.hpp"
#include "zipage/backend/cpu/kv_storage.hpp"
#include "zipage/compression/compaction_plan.hpp"
#include "zipage/core/checked.hpp"
#include "zipage/core/error.hpp"
#include "zipage/core/fp8.hpp"
#include "zipage/core/kv_scale.hpp"
#include "zipage/core/types.hpp"
#include "zipage/kv/paged_kv.hpp"
#include "zipage/model/model_config.hpp"

namespace zipage {

// One layer of the FP8 cache: codes [num_blocks][block_size][kv_heads][head_dim] and scales
// [num_blocks][block_size][kv_heads] for each side. A slot's head h has its codes at
// offset(slot, h) and its scale at scale_offset(slot, h).
template <class Code, class Scale>
struct paged_fp8_kv_layer {
  Code* k = nullptr;
  Code* v = nullptr;
  Scale* k_scale = nullptr;
  Scale* v_scale = nullptr;
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;

  [[nodiscard]] std::int64_t offset(std::int64_t slot, int head) const { return (slot * num_kv_heads + head) * head_dim; }
  [[nodiscard]] std::int64_t scale_offset(std::int64_t slot, int head) const { return slot * num_kv_heads + head; }
};

// Every layer's FP8 K/V (codes + scales), and the fp32 score and query-window caches laid out as
// cpu_kv_storage's.
struct cpu_fp8_kv_storage {
  kv_cache_shape shape;
  std::vector<std::uint8_t> k, v;        // [layers][blocks][block_size][kv_heads][head_dim]
  std::vector<std::uint16_t> k_scale, v_scale;  // [layers][blocks][block_size][kv_heads], bf16 (core/kv_scale.hpp)
  std::vector<float> scores;             // [layers][blocks][block_size][kv_heads], when the policy keeps one
  std::vector<float> queries;            // [layers][slots][W][q_heads][head_dim]

  explicit cpu_fp8_kv_storage(const kv_cache_shape& s)
      : shape(s),
        k(static_cast<std::size_t>(s.elements_per_side()), 0),
        v(static_cast<std::size_t>(s.elements_per_side()), 0),
        k_scale(static_cast<std::size_t>(scale_elements_per_side(s)), kv_scale_zero),
        v_scale(static_cast<std::size_t>(scale_elements_per_side(s)), kv_scale_zero),
        scores(static_cast<std::size_t>(s.score_elements()), 0.0f),
        queries(static_cast<std::size_t>(s.query_layer_stride() * s.num_layers), 0.0f) {}

  [[nodiscard]] static std::int64_t scale_elements_per_side(const kv_cache_shape& s) {
    return std::int64_t{s.num_layers} * s.num_blocks * s.block_size * s.num_kv_heads;
  }
  [[nodiscard]] std::int64_t scale_layer_stride() const {
    return std::int64_t{shape.num_blocks} * shape.block_size * shape.num_kv_heads;
  }

  [[nodiscard]] paged_fp8_kv_layer<std::uint8_t, std::uint16_t> layer(int l) {
    const auto off = static_cast<std::size_t>(shape.layer_stride() * l);
    const auto soff = static_cast<std::size_t>(scale_layer_stride() * l);
    return {k.data() + off, v.data() + off, k_scale.data() + soff, v_scale.data() + soff,
            shape.block_size, shape.num_kv_heads, shape.head_dim};
  }
  [[nodiscard]] paged_fp8_kv_layer<const std::uint8_t, const std::uint16_t> layer(int l) const {
    const auto off = static_cast<std::size_t>(shape.layer_stride() * l);
    const auto soff = static_cast<std::size_t>(scale_layer_stride() * l);
    return {k.data() + off, v.data() + off, k_scale.data() + soff, v_scale.data() + soff,
            shape.block_size, shape.num_kv_heads, shape.head_dim};
  }
  // Bytes held: K/V codes, their scales, the score cache, the query-window cache.
  [[nodiscard]] std::size_t bytes() const {
    return k.size() + v.size() + (k_scale.size() + v_scale.size()) * sizeof(std::uint16_t) +
           (scores.size() + queries.size()) * sizeof(float);
  }
  [[nodiscard]] float* query_rows(int l) {
    return queries.data() + static_cast<std::size_t>(shape.query_layer_stride() * l);
  }
  [[nodiscard]] float* layer_scores(int l) {
    return scores.data() + static_cast<std::size_t>(scale_layer_stride() * l);
  }
};

// What the memory plan should count per cached token over all layers for the FP8 cache: E4M3 K and V
// (1 byte each), a 2-byte (bf16) scale per KV head per side, and the fp32 score per KV head with a score cache.
[[nodiscard]] inline std::size_t fp8_kv_bytes_per_token(const model_config& c, bool score_cache) {
  const std::int64_t per_layer_heads = checked_mul(std::int64_t{c.num_layers}, c.num_kv_heads, "FP8 KV cache: num_layers x kv_heads");
  const std::int64_t codes = checked_mul(2 * per_layer_heads, c.head_dim, "FP8 KV cache: code bytes per token");
  // One bf16 per (KV head, side).
  std::int64_t bytes = checked_add(codes, checked_mul(2 * per_layer_heads, sizeof(std::uint16_t),
                                                      "FP8 KV cache: scale bytes per token"),
                                   "FP8 KV cache: bytes per token");
  if (score_cache)
    bytes = checked_add(bytes, checked_mul(per_layer_heads, sizeof(float), "FP8 KV cache: score bytes per token"),
                        "FP8 KV cache: bytes per token");
  return static_cast<std::size_t>(bytes);
}

namespace cpu::fp8 {

// The per-(token, head) scale of a head vector (core/kv_scale.hpp): bf16_rne(amax / 448) with amax = max |x|;
// 0 for an all-zero vector, the NaN scale when a value is NaN, the infinite one for an infinite value.
inline std::uint16_t head_scale(const float* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float a = std::abs(x[i]);
    if (std::isnan(a)) return kv_scale_nan;
    amax = std::max(amax, a);
  }
  return kv_scale_from_amax(amax);
}

// Quantises one head vector: returns its scale and writes code[i] = e4m3(x[i] / s) (IEEE division by the bf16 scale
// as an fp32, then E4M3's saturating rounding). A zero scale gives zero codes; a non-finite one (a NaN or infinite
// input) gives non-finite dequantised values, as the fp32 cache would carry them. A NaN quotient (every value under
// the NaN scale, an infinite one under the infinite scale) gets code 0x7f, whatever its sign, as the GPU's conversion
// of its canonical NaN gives: the CUDA append kernels write these bytes bit for bit.
inline std::uint16_t quantize_head(const float* x, int n, std::uint8_t* codes) {
  const std::uint16_t scale = head_scale(x, n);
  const float s = kv_scale_to_f32(scale);
  if (s == 0.0f) {
    std::fill_n(codes, n, std::uint8_t{0});
    return scale;
  }
  for (int i = 0; i < n; ++i) {
    const float q = x[i] / s;
    codes[i] = std::isnan(q) ? fp8_e4m3_nan : f32_to_fp8_e4m3(q);
  }
  return scale;
}

// out[i] = float(code[i]) * float(scale)
inline void dequantize_head(const std::uint8_t* codes, std::uint16_t scale, int n, float* out) {
  const float s = kv_scale_to_f32(scale);
  for (int i = 0; i < n; ++i) out[i] = fp8_e4m3_to_f32(codes[i]) * s;
}

// Writes each new token's K/V into its slot, quantised per KV head. k, v: [num_tokens][kv_heads * head_dim].
inline void append_kv(paged_fp8_kv_layer<std::uint8_t, std::uint16_t> kv, std::span<const std::int64_t> slots,
                      const matrix& k, const matrix& v) {
  const int d = kv.head_dim;
  for (std::size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] < 0) continue;  // a padding row writes nowhere
    const auto r = static_cast<Eigen::Index>(t);
    for (int h = 0; h < kv.num_kv_heads; ++h) {
      kv.k_scale[kv.scale_offset(slots[t], h)] = quantize_head(k.row(r).data() + h * d, d, kv.k + kv.offset(slots[t], h));
      kv.v_scale[kv.scale_offset(slots[t], h)] = quantize_head(v.row(r).data() + h * d, d, kv.v + kv.offset(slots[t], h));
    }
  }
}

// The FP8 cache's row reader: a cached key or value head dequantised (x' = float(code) * scale) into a
// scratch row, which the shared loops read as they read the fp32 cache's own rows.
struct dequantized_rows {
  paged_fp8_kv_layer<const std::uint8_t, const std::uint16_t> kv;
  std::vector<float> row = std::vector<float>(static_cast<std::size_t>(kv.head_dim));

  [[nodiscard]] const float* key(std::int64_t slot, int head) { return read(kv.k, kv.k_scale, slot, head); }
  [[nodiscard]] const float* value(std::int64_t slot, int head) { return read(kv.v, kv.v_scale, slot, head); }

 private:
  const float* read(const std::uint8_t* codes, const std::uint16_t* scales, std::int64_t slot, int head) {
    dequantize_head(codes + kv.offset(slot, head), scales[kv.scale_offset(slot, head)], kv.head_dim, row.data());
    return row.data();
  }
};

// A request's FP8 state in host memory while swapped out: its blocks' codes, scales and scores, and its
// query-window rows (fp32).
struct swap_blob {
  std::size_t num_pages = 0;
  std::vector<std::uint8_t> k, v;
  std::vector<std::uint16_t> k_scale, v_scale;
  std::vector<float> scores, queries;
};

// The FP8 cache's layout for the shared compaction, copy and swap loops (cpu::detail): a kept token's
// codes and scales move together, bit for bit.
struct fp8_layout {
  using storage = cpu_fp8_kv_storage;
  using blob = swap_blob;

  // The fp32 cache's arrays (K and V codes here, scores), then the scales beside the codes.
  template <class F>
  static void for_each_block_array(storage& kv, int l, F&& f) {
    cpu::detail::for_each_kv_block_array<blob>(kv, l, f);
    const auto view = kv.layer(l);
    const auto head_elems = static_cast<std::size_t>(std::int64_t{kv.shape.block_size} * kv.shape.num_kv_heads);
    f(view.k_scale, head_elems, &blob::k_scale);
    f(view.v_scale, head_elems, &blob::v_scale);
  }
  static void move_head(const paged_fp8_kv_layer<std::uint8_t, std::uint16_t>& view, std::int64_t from, std::int64_t to,
                        int h) {
    cpu::detail::move_kv_head(view, from, to, h);
    view.k_scale[view.scale_offset(to, h)] = view.k_scale[view.scale_offset(from, h)];
    view.v_scale[view.scale_offset(to, h)] = view.v_scale[view.scale_offset(from, h)];
  }
};

// cpu::paged_attention with each key and value row dequantised (x' = float(code) * scale) before use;
// the loop is cpu::paged_attention's, so it equals cpu::paged_attention run on the dequantised cache bit for bit.
inline void paged_attention(paged_fp8_kv_layer<const std::uint8_t, const std::uint16_t> kv,
                            const attention_metadata& meta, const matrix& q, int num_q_heads, float scale,
                            matrix& out) {
  dequantized_rows rows{kv};
  cpu::detail::paged_attention(rows, meta, q, num_q_heads, scale, out);
}

// Dequantised keys of one layer as [kv_heads][kv_len][head_dim] (what the compressor scores).
inline void gather_keys(cpu_fp8_kv_storage& kv, int layer, std::span<const block_id> pages, int kv_len, std::vector<float>& out) {
  dequantized_rows rows{std::as_const(kv).layer(layer)};
  cpu::detail::gather_keys(rows, pages, kv_len, out);
}

// The score cache of one layer as [kv_heads][kv_len] (fp32, as cpu::gather_scores).
inline void gather_scores(cpu_fp8_kv_storage& kv, int layer, std::span<const block_id> pages, int kv_len, std::vector<float>& out) {
  cpu::detail::gather_scores(kv, layer, pages, kv_len, out);
}

// cpu::apply_compaction on the FP8 cache: a kept token's codes and scale move together, front to back
// (kept indices ascend, so the move is safe in place), bit for bit.
inline void apply_compaction(cpu_fp8_kv_storage& kv, const compaction_plan& plan) {
  cpu::detail::apply_compaction<fp8_layout>(kv, plan);
}

inline void copy_block(cpu_fp8_kv_storage& kv, block_id from, block_id to) { cpu::detail::copy_block<fp8_layout>(kv, from, to); }

inline swap_blob save_request_state(cpu_fp8_kv_storage& kv, std::span<const block_id> pages, int slot) {
  return cpu::detail::save_request_state<fp8_layout>(kv, pages, slot);
}

// Restores into the first blob.num_pages of `pages` (the rest are fresh room for new tokens) and `slot`.
inline void restore_request_state(cpu_fp8_kv_storage& kv, std::span<const block_id> pages, int slot, swap_blob& blob) {
  cpu::detail::restore_request_state<fp8_layout>(kv, pages, slot, blob);
}

}  // namespace cpu::fp8

// cpu_backend with an FP8 (E4M3, per token-head scales) KV cache. Every op that does not touch the KV
// cache is cpu_backend's; the KV-touching members below hide cpu_backend's of the same names.
struct cpu_fp8kv_backend : cpu_backend {
  using kv_storage = cpu_fp8_kv_storage;
  using swap_blob = cpu::fp8::swap_blob;
  static constexpr const char* name = "cpu-fp8kv";

  [[nodiscard]] kv_storage allocate_kv(const kv_cache_shape& shape) const { return kv_storage(shape); }

  // Bytes per cached token over all layers (codes + scales + scores), for the memory plan.
  [[nodiscard]] static std::size_t kv_bytes_per_token(const model_config& c, bool score_cache) {
    return fp8_kv_bytes_per_token(c, score_cache);
  }
  // The engine's memory-plan hooks: 1-byte codes, a 2-byte (bf16) scale per (token, KV head, side), fp32
  // query-window rows (so plan_memory's count equals kv_bytes_per_token above and bytes()).
  [[nodiscard]] static constexpr std::size_t kv_element_bytes() { return 1; }
  [[nodiscard]] static constexpr std::size_t kv_scale_bytes() { return sizeof(std::uint16_t); }
  [[nodiscard]] static constexpr std::size_t query_element_bytes() { return sizeof(float); }

  void gather_keys(kv_storage& kv, int layer, std::span<const block_id> pages, int kv_len, std::vector<float>& out) const {
    cpu::fp8::gather_keys(kv, layer, pages, kv_len, out);
  }
  void gather_scores(kv_storage& kv, int layer, std::span<const block_id> pages, int kv_len, std::vector<float>& out) const {
    cpu::fp8::gather_scores(kv, layer, pages, kv_len, out);
  }
  void gather_window_queries(kv_storage& kv, int layer, int slot, std::vector<float>& out) const {
    const auto rows = cpu::window_queries(kv, layer, slot);
    out.assign(rows.begin(), rows.end());
  }
  void apply_compaction(kv_storage& kv, const compaction_plan& plan) const { cpu::fp8::apply_compaction(kv, plan); }
  void copy_block(kv_storage& kv, block_id from, block_id to) const { cpu::fp8::copy_block(kv, from, to); }

  [[nodiscard]] swap_blob swap_out(kv_storage& kv, std::span<const block_id> pages, int slot) const {
    return cpu::fp8::save_request_state(kv, pages, slot);
  }
  void swap_in(kv_storage& kv, std::span<const block_id> pages, int slot, swap_blob& blob) const {
    cpu::fp8::restore_request_state(kv, pages, slot, blob);
  }

  void attention(kv_storage& kv, int layer, const attention_metadata& meta, const tensor& q, const tensor& k, const tensor& v,
                 int num_q_heads, tensor& out) const {
    cpu::check_attention_call(kv.shape, layer, meta, q, k, v, num_q_heads);
    cpu::fp8::append_kv(kv.layer(layer), meta.slot_mapping, k, v);
    if (!meta.token_window_row.empty()) cpu::record_queries(kv.query_rows(layer), meta.token_window_row, q);
    const auto read = std::as_const(kv).layer(layer);
    cpu::fp8::paged_attention(read, meta, q, num_q_heads, 1.0f / std::sqrt(float(kv.shape.head_dim)), out);
  }
};

}  // namespace zipage
