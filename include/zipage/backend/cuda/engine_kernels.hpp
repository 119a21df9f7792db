#pragma once
// Host-callable CUDA kernels that the engine's CUDA backend (cuda_backend.hpp) needs besides the tuned
// bf16 kernels of kernels.hpp: the same ops for fp32 *and* bf16 data with any shape (head_dim 8, widths
// that are not multiples of 8, ...), written to mirror the zipage::cpu reference operation by operation
// (double-precision RoPE angles and RMSNorm sums, a softmax over the whole row, fixed summation orders),
// plus the compression / swap data movement. No CUDA header here: pointers are plain, streams are
// `cuda::cuda_stream`. Every launcher throws zipage::error on bad arguments or a failed launch.
#include <cstddef>
#include <cstdint>

#include "zipage/backend/cuda/dtype.hpp"
#include "zipage/backend/cuda/kernels.hpp"

namespace zipage {

namespace cuda::engine {

// out[t] = table[ids[t]] (rows of `cols` elements); ids are device memory and already range-checked.
void gather_rows(cuda_dtype t, const void* table, int cols, const std::int32_t* ids, int num_ids, void* out,
                 cuda_stream stream);

// RMSNorm over each `width`-wide segment of every row, as cpu::rms_norm (double sum of squares);
// out may be x. The weight has its own dtype.
void rms_norm(cuda_dtype t, const void* x, cuda_dtype wt, const void* weight, void* out, std::int64_t rows, int cols,
              int width, float eps, cuda_stream stream);

// In-place RoPE of every head of every row at positions[row]; inv_freq[i] (double, device) is the
// (scaled) frequency of pair i, as cpu::rope computes it.
void rope(cuda_dtype t, void* x, const std::int32_t* positions, std::int64_t rows, int num_heads, int head_dim,
          const double* inv_freq, bool interleaved, cuda_stream stream);

// out = silu(gate) * up, elementwise over n elements (out may alias gate or up).
void silu_mul(cuda_dtype t, const void* gate, const void* up, void* out, std::int64_t n, cuda_stream stream);

// x += y over n elements.
void add(cuda_dtype t, void* x, const void* y, std::int64_t n, cuda_stream stream);

// x[r] += bias for every row r.
void add_bias(cuda_dtype t, void* x, cuda_dtype bt, const void* bias, std::int64_t rows, int cols,
              cuda_stream stream);

// out = x · wᵀ (x [m][k], w [n][k], out [m][n]) with every output summed over k in order 0..k-1 by one
// thread: each row's result is independent of m (batch invariant) and of the launch shape.
void gemm_fixed_order(cuda_dtype t, const void* x, const void* w, void* out, int m, int n, int k, cuda_stream stream);

// Writes token t's K/V rows (width elements) into cache slot slots[t] (negative: skipped).
void append_kv(cuda_dtype t, void* k_cache, void* v_cache, const void* k, const void* v, const std::int64_t* slots,
               int num_tokens, int width, cuda_stream stream);

// FP8 KV cache (docs/fp8.md): quantises token t's K/V rows (num_kv_heads x head_dim values of dtype t)
// into cache slot slots[t] (negative: skipped): per KV head scale = amax / 448 (0 for an all-zero head,
// then zero codes), code[i] = e4m3(x[i] / scale) with IEEE division and the SATFINITE conversion, so
// codes and scales are bit-exact with cpu::fp8::append_kv on the same values. One warp per (token, head).
void append_kv_fp8(cuda_dtype t, std::uint8_t* k_codes, std::uint8_t* v_codes, float* k_scale, float* v_scale,
                   const void* k, const void* v, const std::int64_t* slots, int num_tokens, int num_kv_heads,
                   int head_dim, cuda_stream stream);

// Copies q row t into query-window row token_row[t] (rows of `width` elements) when token_row[t] >= 0.
void record_queries(cuda_dtype t, void* rows, const std::int32_t* token_row, const void* q, int num_tokens, int width,
                    cuda_stream stream);

// Causal GQA attention over the paged cache for any head_dim <= 512 and block size: one CTA per (token,
// query head), the softmax over the token's whole KV range (as cpu::paged_attention, online in chunks of
// 64 keys). q, out: [num_tokens][num_q_heads * head_dim].
struct generic_attention_params {
  const void* q = nullptr;
  void* out = nullptr;
  // One layer's cache and the page tables; lengths are per token (token_kv_len), so kv.kv_len is unused.
  // FP8 KV cache: with kv.k_scale / kv.v_scale set, each K/V value is read as float(code) * scale (as
  // cpu::fp8::paged_attention).
  paged_kv_view kv;
  const std::int32_t* token_seq = nullptr;
  const std::int32_t* token_kv_len = nullptr;
  int num_tokens = 0;
  int num_q_heads = 0;
  float scale = 0.0f;
};
void paged_attention(cuda_dtype t, const generic_attention_params& p, cuda_stream stream);

// Keys of one layer's cache gathered as fp32 [kv_heads][kv_len][head_dim] (compressor layout).
void gather_keys(cuda_dtype t, const void* k_layer, const std::int32_t* pages, int block_size, int num_kv_heads,
                 int head_dim, int kv_len, float* out, cuda_stream stream);

// FP8 keys of one layer (codes + scales [blocks][block_size][kv_heads]) gathered dequantised as fp32
// [kv_heads][kv_len][head_dim] (float(code) * scale, bit-exact with cpu::fp8::gather_keys).
void gather_keys_fp8(const std::uint8_t* k_layer, const float* k_scale_layer, const std::int32_t* pages, int block_size,
                     int num_kv_heads, int head_dim, int kv_len, float* out, cuda_stream stream);

// Score cache of one layer gathered as [kv_heads][kv_len].
void gather_scores(const float* scores_layer, const std::int32_t* pages, int block_size, int num_kv_heads, int kv_len,
                   float* out, cuda_stream stream);

// n elements to fp32.
void to_f32(cuda_dtype t, const void* in, float* out, std::int64_t n, cuda_stream stream);

// n fp32 values to dtype t.
void from_f32(cuda_dtype t, const float* in, void* out, std::int64_t n, cuda_stream stream);

// Carries out a compaction plan in place, one launch for all (layer, head) pairs: for each, the kept
// tokens keep[l][h][0..new_len) (ascending source slots) move to logical slots 0..new_len-1 of the page
// table, and their score-cache entries are set from kept_scores (when both are non-null).
struct compaction_params {
  // The whole cache from layer 0 (kv.k_cache / kv.v_cache: [layers][blocks][block_size][kv_heads][head_dim],
  // layer l at + l * layer_elements) and the request's pages (kv.page_indices, in order; no indptr,
  // lengths or scales: FP8 scales are compacted by a second call, as rows of head_dim 1).
  paged_kv_view kv;
  float* scores = nullptr;  // [layers][blocks][block_size][kv_heads] or null
  const std::int32_t* keep = nullptr;          // [layers][kv_heads][new_len]
  const float* kept_scores = nullptr;          // [layers][kv_heads][new_len] or null
  std::int64_t layer_elements = 0;             // K (or V) elements per layer
  std::int64_t score_layer_elements = 0;
  int num_layers = 0;
  int new_len = 0;
  cuda_dtype dtype = cuda_dtype::bf16;
  int element_bytes = 0;  // bytes of one K/V element; 0 = dtype's (FP8 codes: 1; their scales: 4 with head_dim 1)
};
void apply_compaction(const compaction_params& p, cuda_stream stream);

// Many copies in one launch: desc i copies bytes[i] bytes (a multiple of 4) from src[i] to dst[i]; any
// pointer the device can address (device memory, mapped pinned host memory).
struct copy_desc {
  std::uint64_t src = 0;
  std::uint64_t dst = 0;
  std::uint64_t bytes = 0;
};
void batched_copy(const copy_desc* descs, int count, std::uint64_t max_bytes, cuda_stream stream);

// Deterministic pseudo-random fill (uniform in [-scale, scale), counter-based on (seed, index)) and a
// constant fill, for models built on the device.
void fill_uniform(cuda_dtype t, void* out, std::int64_t n, float scale, std::uint64_t seed, cuda_stream stream);
void fill_constant(cuda_dtype t, void* out, std::int64_t n, float value, cuda_stream stream);

}  // namespace cuda::engine
}  // namespace zipage
