#pragma once
// Kernels of the compression step (host API: backend/cuda/compression.hpp): this header holds their
// arguments and shared helpers; the kernels are in compression_scores.cuh (stages 1-5: window attention,
// redundancy, final score) and compression_select.cuh (stages 6-7: top-keep selection, compaction).
// Every kernel runs one CTA per (layer, request, KV head) "segment", or per token chunk of one:
// blockIdx.x = segment index (layer * num_reqs + request) * kv_heads + head, blockIdx.y = chunk where
// there are chunks.
//
//  window_attention_kernel<D, false>  softmax statistics: each CTA walks consecutive 128-token chunks of one
//      segment (the Q tile loaded once, the next chunk's keys arriving while one is computed: two key stages,
//      FP8 codes dequantised in shared memory); per (window query row (w, g), chunk) the chunk's max logit and
//      sum of exp (log2 domain) -> workspace.
//  merge_stats_kernel   a warp per (segment, window row): the row's statistics over all chunks, merged
//      once -> (max, 1 / sum) in the row's chunk-0 slot.
//  window_attention_kernel<D, true>   scores, over the same chunks: recomputes the logits, p = softmax with
//      the merged statistics, A_j = mean_w max_g p; S_j = max(A_j, gamma * S_prev_j)
//      (or A_j + S_prev_j) for tokens with history, a thread per token -> workspace, and to the score
//      cache when the recipe has one. Window rows are laid out w-major with the group padded to a power
//      of two (Gp), so max over g and sum over w are shuffles inside a 16-row MMA tile.
//  block_similarity_kernel<D>   per (segment, chunk of max(256, block_size) tokens): block-local cosine
//      similarities by tensor-core products of the raw bf16 keys (divided by the fp32 norms), the upper
//      triangle of each block only (a tile pair adds to its rows' sums and its columns' sums), the
//      newest-duplicate rule (skipped for tiles with no cosine above 0.5) -> r (summed similarity) in the
//      workspace.
//  full_similarity_kernel<D>   per (segment, 64-token row tile): the same over the whole sequence (R-KV's
//      full variant); each column's newest duplicate is an atomicMax of (row + 1, cos) in the workspace.
//  finalize_kernel   per segment: R = one softmax over all of the segment's tokens of r / (tau * n)
//      (n = block_size, or kv_len for the full variant), S' = max-pool of S (recency: the position),
//      F = lambda * S' - (1 - lambda) * R, window and sinks +inf -> workspace.
//  select_kernel   per segment: radix select (4 x 8-bit digits, warp-aggregated shared histograms, CUB
//      block scans) of the keep-th largest F; a final ordered pass emits the kept indices ascending,
//      ties to the older token.
//  compact_kernel<D, fp8> per segment: moves kept token i from slot kept[i] to slot i (K, V, score), front
//      to back in 64-token tiles, every read of a tile before any write of it (dst <= src).
//
// Matrix products use the attention helpers (attention.cuh): K tiles in swizzled shared memory,
// ldmatrix + mma.sync m16n8k16 (bf16 in, fp32 accumulate), so q.k and k.k' are exact products of the
// stored bf16 values accumulated in fp32.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "zipage/backend/cuda/attention.cuh"
#include "zipage/backend/cuda/fp8.cuh"

namespace zipage::cuda::detail {

inline constexpr int kAttnChunk = 128;    // tokens per window-attention step (a CTA walks several chunks)
inline constexpr int kAttnThreads = 256;  // 8 warps, each owns 16-token column groups
inline constexpr int kAttnMaxRows = 128;  // window query rows per pass (Q tile in shared memory)
inline constexpr int kRedThreads = 256;   // final-score kernel: 8 warps
inline constexpr int kRedMinChunk = 256;  // tokens per final-score CTA (>= block_size)
inline constexpr int kSelThreads = 256;
inline constexpr int kSelItems = 8;
inline constexpr int kCompactThreads = 256;
inline constexpr int kCompactTileBytes = 16 * 1024;  // K bytes per compaction tile (as many again of V)

struct compress_args {
  bf16* k;
  bf16* v;
  // FP8 KV cache: E4M3 codes (same layout, 1 byte per element) and per-(slot, KV head) bf16 scales laid
  // out as the score cache (score_layer_stride); null for a bf16 cache. Keys are read as
  // bf16(float(code) * scale) into the same swizzled tiles; compaction moves codes and scales.
  std::uint8_t* k8;
  std::uint8_t* v8;
  std::uint16_t* k_scale;
  std::uint16_t* v_scale;
  float* scores;
  const bf16* q;
  std::int64_t kv_layer_stride;     // elements
  std::int64_t score_layer_stride;  // elements
  std::int64_t q_layer_stride;      // elements
  const std::int32_t* page_indptr;
  const std::int32_t* page_indices;
  const std::int32_t* kv_len;
  const std::int32_t* slot;
  const std::uint8_t* first;
  int num_reqs;
  int num_q_heads;
  int num_kv_heads;
  int group;      // q_heads / kv_heads
  int gp_shift;   // log2 of the padded group Gp (next power of two >= group)
  int window;
  int keep;
  int bs_shift;
  int max_len;
  int rows_pad;     // window * Gp rounded up to 16
  int attn_chunks;  // ceil(max_len / kAttnChunk)
  int q_rows;       // rows of the Q tile in shared memory: min(kAttnMaxRows, rows_pad)
  int attn_chunks_per_cta;  // window attention: consecutive chunks of one segment walked by one CTA
  int red_chunk;    // tokens per final-score CTA
  float scale_log2;
  int history;     // 0 none, 1 decayed max (gamma), 2 accumulate
  bool recency;    // importance = physical position (no window attention)
  int pool_mode;   // 0 never, 1 first compression, 2 always
  int redundancy;  // 0 none, 1 block-local, 2 full sequence
  float gamma;
  float lambda;
  float tau;
  int pool_radius;
  int sinks;
  float2* stats;       // [segments][rows_pad][attn_chunks] (max, sum) in the log2 domain
  float* imp;          // [segments][max_len] S (window attention merged with the history)
  float* red;          // [segments][max_len] r, the summed similarity, then R
  unsigned long long* dup;  // [segments][max_len] full variant: (newest duplicate row + 1) << 32 | cos bits
  float* fscore;       // [segments][max_len]
  std::int32_t* kept;  // [segments][keep]
  bool select_smem;    // select_kernel keeps its keys in shared memory (else recomputes them from fscore)
};

struct segment {
  int head, req, layer;
};

__device__ __forceinline__ segment decompose(const compress_args& a, int sh) {
  segment s;
  s.head = sh % a.num_kv_heads;
  const int lr = sh / a.num_kv_heads;
  s.req = lr % a.num_reqs;
  s.layer = lr / a.num_reqs;
  return s;
}

// Pool slot of physical token j through a request's page table.
__device__ __forceinline__ std::int64_t token_slot(const std::int32_t* pages, int bs_shift, int j) {
  return (static_cast<std::int64_t>(pages[j >> bs_shift]) << bs_shift) | (j & ((1 << bs_shift) - 1));
}

// Issues cp.async copies of tokens [start, start + rows) of one KV head into a swizzled [rows][D] tile;
// tokens >= len are zero-filled.
template <int D, int THREADS>
__device__ __forceinline__ void load_key_rows(std::uint32_t sk, const bf16* kbase, std::int64_t token_stride,
                                              const std::int32_t* pages, int bs_shift, int start, int rows, int len,
                                              int tid) {
  constexpr int kChunks = D / 8;
  for (int c = tid; c < rows * kChunks; c += THREADS) {
    const int r = c / kChunks, ch = c % kChunks;
    const int tok = start + r;
    const bool valid = tok < len;
    const bf16* src = kbase;
    if (valid) src = kbase + token_slot(pages, bs_shift, tok) * token_stride + ch * 8;
    cp_async_16(sk + swz<D>(r, ch), src, valid);
  }
}

// 8 E4M3 key codes times their scale, as bf16 (what the attention kernels read), to 16 bytes of shared memory.
__device__ __forceinline__ void store_dequantised(std::uint32_t dst, uint2 codes, float scale) {
  std::uint32_t w[4];
  const std::uint32_t cw[2] = {codes.x, codes.y};
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const float2 lo = e4m3x2_to_f32x2(static_cast<std::uint16_t>(cw[j] & 0xffffu));
    const float2 hi = e4m3x2_to_f32x2(static_cast<std::uint16_t>(cw[j] >> 16));
    w[2 * j] = pack_bf16(lo.x * scale, lo.y * scale);
    w[2 * j + 1] = pack_bf16(hi.x * scale, hi.y * scale);
  }
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
               : "memory");
}

// load_key_rows for either cache: bf16 keys through cp.async, or FP8 keys dequantised in registers
// (bf16(float(code) * scale), as the attention kernels read them) and stored to the tile directly.
template <int D, int THREADS>
__device__ __forceinline__ void load_keys(const compress_args& a, const segment& sg, std::uint32_t sk,
                                          const std::int32_t* pages, int start, int rows, int len, int tid) {
  const std::int64_t token_stride = std::int64_t{a.num_kv_heads} * D;
  if (a.k8 == nullptr) {
    load_key_rows<D, THREADS>(sk, a.k + sg.layer * a.kv_layer_stride + sg.head * D, token_stride, pages, a.bs_shift,
                              start, rows, len, tid);
    return;
  }
  const std::uint8_t* kb = a.k8 + sg.layer * a.kv_layer_stride + sg.head * D;
  const std::uint16_t* sb = a.k_scale + sg.layer * a.score_layer_stride + sg.head;
  constexpr int kChunks = D / 8;
  // kBatch items' loads are issued before any of them is converted and stored: the shared-memory stores
  // (asm with a memory clobber) would otherwise hold every load back to the previous item's latency.
  constexpr int kBatch = 8;
  const int items = rows * kChunks;
  for (int c0 = tid; c0 < items; c0 += THREADS * kBatch) {
    uint2 codes[kBatch];
    float sc[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int c = c0 + i * THREADS;
      const int tok = start + c / kChunks;
      codes[i] = make_uint2(0u, 0u);
      sc[i] = 0.0f;
      if (c < items && tok < len) {
        const std::int64_t slot = token_slot(pages, a.bs_shift, tok);
        codes[i] = *reinterpret_cast<const uint2*>(kb + slot * token_stride + (c % kChunks) * 8);
        sc[i] = kv_scale_to_f32(sb[slot * a.num_kv_heads]);
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int c = c0 + i * THREADS;
      if (c >= items) break;
      store_dequantised(sk + swz<D>(c / kChunks, c % kChunks), codes[i], sc[i]);
    }
  }
}

}  // namespace zipage::cuda::detail
