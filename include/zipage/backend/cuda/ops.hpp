#pragma once
// The elementwise and data-movement ops of the CUDA backend, one host-callable launcher per op (paged
// attention: backend/cuda/attention.hpp). An op that has a tuned bf16 kernel besides its reference
// kernel takes a kernel_variant and picks the kernel itself; its rule ("Tuned: ...") is written next to
// its declaration and nowhere else. The reference kernels take fp32 and bf16 data of any shape and
// mirror the zipage::cpu reference (backend/cpu/cpu_backend.hpp); the tuned ones compute the same
// function up to bf16 rounding.
//
// No CUDA header here: device memory is passed as plain pointers (tensors of dtype `t` as `void*`),
// streams as `cuda_stream` (nullptr = the legacy default stream). Every launcher is asynchronous on
// `stream` and throws zipage::error, naming the argument, when its arguments are out of range or a
// launch fails. Shapes are row-major, in elements; row strides are in elements, 0 meaning contiguous.
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "zipage/backend/cuda/dtype.hpp"
#include "zipage/backend/cuda/fp8_copy.hpp"
#include "zipage/backend/cuda/kernel_variant.hpp"
#include "zipage/backend/cuda/paged_kv_view.hpp"
#include "zipage/model/model_config.hpp"  // rope_style

namespace zipage::cuda {

// ---------------------------------------------------------------------------------------------------
// Forward-pass ops (kernel_variant picks tuned or reference).

// out[i] = table[ids[i]]: embedding lookup and row gathers. table [num_rows][cols], out [num_ids][cols],
// both of dtype t; ids [num_ids] in device memory. An id outside [0, num_rows) yields a row of zeros.
// Tuned: t == bf16 (16-byte vectors when cols % 8 == 0 and table and out are 16-byte aligned, else one
// element per thread). Both kernels copy bits, so they give the same rows.
void gather_rows(cuda_dtype t, const void* table, std::int64_t num_rows, int cols, const std::int32_t* ids,
                 int num_ids, void* out, kernel_variant v, cuda_stream stream);

// out = x / sqrt(mean(x^2) + eps) * weight over each `width`-wide segment of every row (width == cols:
// row-wise RMSNorm; width == head_dim: per-head q/k norm). x, out: [rows][cols] of dtype t (out may be
// x); weight: [width] of dtype wt. width must divide cols.
// Tuned: t == bf16, width % 8 == 0 and x, weight, out 16-byte aligned (fp32 sum of squares); else the
// reference kernel (double sum of squares, as cpu::rms_norm).
void rms_norm(cuda_dtype t, const void* x, cuda_dtype wt, const void* weight, void* out, std::int64_t rows, int cols,
              int width, float eps, kernel_variant v, cuda_stream stream);

// Rotary position embedding, in place: head h of row r (x + r * row_stride + h * head_dim, head_dim
// elements of dtype t) rotates by positions[r] with frequency f_i for pair i (style: zipage::rope_style,
// as cpu::rope). Angles are computed in double.
struct rope_params {
  void* x = nullptr;                        // [rows][row_stride]
  const std::int32_t* positions = nullptr;  // [rows]
  std::int64_t rows = 0;
  int num_heads = 0;
  int head_dim = 0;             // even, at most 512
  std::int64_t row_stride = 0;  // 0 = num_heads * head_dim
  rope_style style = rope_style::half;
  float theta = 10000.0f;  // f_i = theta^(-2i / head_dim) when inv_freq is null
  // [head_dim / 2] doubles in device memory: f_i as the host computed it (with rope_scaling_config
  // applied, as cpu::rope does), or null.
  const double* inv_freq = nullptr;
};
// Tuned: t == bf16, inv_freq == nullptr (it computes theta^(-2i / head_dim) itself) and, for the
// interleaved style, 4-byte aligned pairs (x 4-byte aligned, row_stride even).
void rope(cuda_dtype t, const rope_params& p, kernel_variant v, cuda_stream stream);

// out[r][c] = silu(gate[r][c]) * up[r][c]. gate and up rows lie at in_row_stride (0 = cols), so a fused
// [rows][2 * cols] gate|up buffer works with up = gate + cols, in_row_stride = 2 * cols; out: [rows][cols].
// Tuned: t == bf16 (fast exp; 16-byte vectors when cols and in_row_stride are multiples of 8 and gate,
// up, out are 16-byte aligned, else one element per thread); else the reference kernel (expf).
void silu_mul(cuda_dtype t, const void* gate, const void* up, void* out, std::int64_t rows, int cols,
              std::int64_t in_row_stride, kernel_variant v, cuda_stream stream);

// Whether the tuned kernels can write an fp8_copy: bf16, the tuned variant, rows of whole 128-column groups,
// 16-byte vectors (in_row_stride: silu_mul's, a multiple of 8; 0 for add_rms_norm).
[[nodiscard]] bool fp8_copy_supported(cuda_dtype t, kernel_variant v, int cols, std::int64_t in_row_stride,
                                      std::initializer_list<const void*> pointers);
// silu_mul, also writing `copy` (fp8_copy_supported must hold); with no copy wanted (fp8_copy{}), plain silu_mul.
void silu_mul(cuda_dtype t, const void* gate, const void* up, void* out, std::int64_t rows, int cols,
              std::int64_t in_row_stride, kernel_variant v, const fp8_copy& copy, cuda_stream stream);

// Cuts x [rows][sum of widths] (dtype t) into its column blocks: parts.out[i] [rows][parts.width[i]] gets the
// width[i] columns after those of parts 0..i-1 (a fused projection's output: q | k | v). One kernel, which
// copies bits (16-byte vectors where every row and block boundary allows).
struct column_split {
  static constexpr int max_parts = 4;
  void* out[max_parts] = {};
  int width[max_parts] = {};
  int parts = 0;
};
void split_columns(cuda_dtype t, const void* x, std::int64_t rows, const column_split& parts, cuda_stream stream);

// What follows a fused q|k|v projection (model/qkv_epilogue.hpp), in one kernel, bf16 only. Row r of qkv
// [rows][(Hq + 2 Hkv) * D] is cut into q [rows][Hq * D], k and v [rows][Hkv * D]. Then the biases are added
// (when set), each q and k head is RMSNormed with its weights (when set; sum of squares in fp32) and rotated by
// positions[r] with the angles positions[r] * inv_freq[i] (double). The bits are those of split_columns,
// add_bias, the tuned rms_norm and rope run one after another. Needs qkv_epilogue_supported: D a multiple of 16
// and at most 256, every pointer 16-byte aligned, the biases and norm weights bf16.
struct qkv_epilogue_params {
  const void* qkv = nullptr;
  void* q = nullptr;
  void* k = nullptr;
  void* v = nullptr;
  const void* q_bias = nullptr;  // [Hq * D] bf16, or null
  const void* k_bias = nullptr;  // [Hkv * D]
  const void* v_bias = nullptr;
  const void* q_norm = nullptr;  // [D] bf16, or null
  const void* k_norm = nullptr;
  const std::int32_t* positions = nullptr;  // [rows]
  const double* inv_freq = nullptr;         // [D / 2]
  std::int64_t rows = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float eps = 1e-6f;
  rope_style style = rope_style::half;
};
[[nodiscard]] bool qkv_epilogue_supported(const qkv_epilogue_params& p);
void qkv_epilogue(const qkv_epilogue_params& p, cuda_stream stream);

// Residual add, then row-wise RMSNorm: x += y, out = x / sqrt(mean(x^2) + eps) * weight (x, y, out [rows][cols]
// of dtype t; out may be y; weight [cols] of dtype wt). Tuned: t == bf16, cols % 8 == 0 and every pointer 16-byte
// aligned: one kernel with add's and the tuned rms_norm's bits; else add then rms_norm.
void add_rms_norm(cuda_dtype t, void* x, const void* y, cuda_dtype wt, const void* weight, void* out, std::int64_t rows,
                  int cols, float eps, kernel_variant v, cuda_stream stream);
// add_rms_norm, also writing out's FP8 copy (fp8_copy_supported must hold, weight 16-byte aligned too); with no copy
// wanted (fp8_copy{}), plain add_rms_norm.
void add_rms_norm(cuda_dtype t, void* x, const void* y, cuda_dtype wt, const void* weight, void* out, std::int64_t rows,
                  int cols, float eps, kernel_variant v, const fp8_copy& copy, cuda_stream stream);

// out = a + b over n elements of dtype t (fp32 sum, rounded once); out may be a or b (residual add).
// Tuned: t == bf16 (16-byte vectors when a, b and out are 16-byte aligned). Both give the same values.
void add(cuda_dtype t, const void* a, const void* b, void* out, std::int64_t n, kernel_variant v, cuda_stream stream);

// x[r] += bias for every row r of x [rows][cols] (dtype t); bias [cols] of dtype bt. One kernel.
void add_bias(cuda_dtype t, void* x, cuda_dtype bt, const void* bias, std::int64_t rows, int cols, cuda_stream stream);

// out = x · wᵀ (x [m][k], w [n][k], out [m][n], dtype t) with every output summed over k in order
// 0..k-1 by one thread: each row's result is independent of m (batch invariant) and of the launch shape.
// One kernel (the fast linears are cuBLASLt's, in the backend).
void gemm_fixed_order(cuda_dtype t, const void* x, const void* w, void* out, int m, int n, int k, cuda_stream stream);

// ---------------------------------------------------------------------------------------------------
// The paged KV cache and the query window.

// Writes token i's K and V rows (num_kv_heads x head_dim values of dtype t) into cache slot slots[i]
// (block * block_size + offset; negative: the token is skipped) of one layer's cache.
struct append_kv_params {
  // The layer's cache, [slots][num_kv_heads][head_dim]: K/V pointers, FP8 scales when set, num_kv_heads
  // and head_dim. The block table is not read (slots address the cache directly).
  paged_kv_view kv;
  const void* k = nullptr;                // [num_tokens][k_row_stride]
  const void* v = nullptr;                // [num_tokens][v_row_stride]
  const std::int64_t* slots = nullptr;    // [num_tokens]
  int num_tokens = 0;
  std::int64_t k_row_stride = 0;  // 0 = num_kv_heads * head_dim
  std::int64_t v_row_stride = 0;

  // The strides in use: the ones set, else a packed row (every launcher resolves the default the same way).
  [[nodiscard]] std::int64_t k_stride() const { return k_row_stride != 0 ? k_row_stride : packed_row(); }
  [[nodiscard]] std::int64_t v_stride() const { return v_row_stride != 0 ? v_row_stride : packed_row(); }
  [[nodiscard]] std::int64_t packed_row() const { return std::int64_t{kv.num_kv_heads} * kv.head_dim; }
};
// FP8 cache (kv.k_scale and kv.v_scale set; docs/fp8.md): a quantising kernel — per (token, KV head) a bf16 scale
// from the head's amax (kv_scale_from_amax: bf16_rne(amax / 448), IEEE division; 0 for an all-zero head, then zero
// codes; NaN / inf for a head with a NaN / an infinity), code = e4m3(x / scale) with IEEE division and the SATFINITE
// conversion, bit-exact with cpu::fp8::append_kv. Tuned (a half-warp per head and side): t == bf16,
// head_dim 128, both row strides multiples of 8, k and v 16-byte and the caches 8-byte aligned; else the
// reference kernel (a warp per head and side). Both write the same bytes.
// A bf16 / fp32 cache: tuned when t == bf16, num_kv_heads * head_dim and both row strides multiples of 8, and
// kv.k_cache, kv.v_cache, k, v 16-byte aligned; else the reference kernel. Both copy bits.
void append_kv(cuda_dtype t, const append_kv_params& p, kernel_variant v, cuda_stream stream);
// Whether append_kv(t, p, v) runs the tuned FP8 kernel (an FP8 cache, bf16 K/V, head_dim 128, ...): the bytes a
// swapped decode kernel writes itself under decode_params::append.
[[nodiscard]] bool append_kv_runs_tuned_fp8(cuda_dtype t, const append_kv_params& p, kernel_variant v);

// Copies q row i into query-window row token_row[i] (rows of `width` elements of dtype t) when
// token_row[i] >= 0. One kernel.
void record_queries(cuda_dtype t, void* rows, const std::int32_t* token_row, const void* q, int num_tokens, int width,
                    cuda_stream stream);

// Keys of one layer's cache for the pages of one request, as fp32 [num_kv_heads][kv_len][head_dim]
// (the compressor's layout). k_layer: [blocks][block_size][num_kv_heads][head_dim] of dtype t, or, when
// k_scale_layer ([blocks][block_size][num_kv_heads] bf16) is set, FP8 codes read as float(code) * scale
// (bit-exact with cpu::fp8::gather_keys). One kernel per cache kind.
void gather_keys(cuda_dtype t, const void* k_layer, const std::uint16_t* k_scale_layer, const std::int32_t* pages,
                 int block_size, int num_kv_heads, int head_dim, int kv_len, float* out, cuda_stream stream);

// The score cache of one layer ([blocks][block_size][num_kv_heads]) for the pages of one request, as
// [num_kv_heads][kv_len].
void gather_scores(const float* scores_layer, const std::int32_t* pages, int block_size, int num_kv_heads, int kv_len,
                   float* out, cuda_stream stream);

// Carries out a compaction plan in place, one launch for all (layer, head) pairs: for each, the kept
// tokens keep[l][h][0..new_len) (ascending source slots) move to logical slots 0..new_len-1 of the page
// table, and their score-cache entries are set from kept_scores (when both are non-null).
struct compaction_params {
  // The whole cache from layer 0 (kv.k_cache / kv.v_cache: [layers][blocks][block_size][kv_heads][head_dim],
  // layer l at + l * layer_elements) and the request's pages (kv.page_indices, in order; no indptr,
  // lengths or scales: FP8 scales are compacted by a second call, as 2-byte rows of head_dim 1).
  paged_kv_view kv;
  float* scores = nullptr;              // [layers][blocks][block_size][kv_heads] or null
  const std::int32_t* keep = nullptr;   // [layers][kv_heads][new_len]
  const float* kept_scores = nullptr;   // [layers][kv_heads][new_len] or null
  std::int64_t layer_elements = 0;      // K (or V) elements per layer
  std::int64_t score_layer_elements = 0;
  int num_layers = 0;
  int new_len = 0;
  cuda_dtype dtype = cuda_dtype::bf16;
  int element_bytes = 0;  // bytes of one K/V element; 0 = dtype's (FP8 codes: 1; their scales: 2 with head_dim 1)
};
void apply_compaction(const compaction_params& p, cuda_stream stream);

// ---------------------------------------------------------------------------------------------------
// Copies, conversions and fills (one kernel each).

// Many copies in one launch: desc i copies bytes[i] bytes (a multiple of 4) from src[i] to dst[i]; any
// pointer the device can address (device memory, mapped pinned host memory). descs: device memory.
struct copy_desc {
  std::uint64_t src = 0;
  std::uint64_t dst = 0;
  std::uint64_t bytes = 0;
};
void batched_copy(const copy_desc* descs, int count, std::uint64_t max_bytes, cuda_stream stream);

// n elements of dtype t to fp32, and back.
void to_f32(cuda_dtype t, const void* in, float* out, std::int64_t n, cuda_stream stream);
void from_f32(cuda_dtype t, const float* in, void* out, std::int64_t n, cuda_stream stream);

// Deterministic pseudo-random fill (uniform in [-scale, scale), counter-based on (seed, index)) and a
// constant fill, for models built on the device.
void fill_uniform(cuda_dtype t, void* out, std::int64_t n, float scale, std::uint64_t seed, cuda_stream stream);
void fill_constant(cuda_dtype t, void* out, std::int64_t n, float value, cuda_stream stream);

// Reads `bytes` of device memory at p (16-byte aligned, a multiple of 16) once with a read-only streaming kernel, 8
// CTAs per multiprocessor, each thread 4 independent 16-byte loads in flight; it writes `sink` (one unsigned) only
// if an impossible sum comes out. The memory-bound load that bandwidths and joules per byte are read against
// (bench_decode_attention, cuda_backend::read_stream).
void read_stream(const void* p, std::size_t bytes, unsigned* sink, cuda_stream stream);

}  // namespace zipage::cuda
