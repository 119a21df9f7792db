#pragma once
// Kernels of the compression step (host API: backend/cuda/compression.hpp). Every kernel runs one CTA
// per (layer, request, KV head) "segment", or per token chunk of one: blockIdx.x = segment index
// (layer * num_reqs + request) * kv_heads + head, blockIdx.y = chunk where there are chunks.
//
//  window_attention_kernel<D, false>  softmax statistics: per (segment, 128-token chunk), for every
//      window query row (w, g) the chunk's max logit and sum of exp (log2 domain) -> workspace.
//  window_attention_kernel<D, true>   scores: merges the statistics of all chunks, recomputes the
//      chunk's logits, p = softmax, A_j = mean_w max_g p; S_j = max(A_j, gamma * S_prev_j) (or
//      A_j + S_prev_j) for tokens with history -> workspace, and to the score cache when the recipe has one. Window rows are laid out w-major with the group padded to a power
//      of two (Gp), so max over g and sum over w are shuffles inside a 16-row MMA tile.
//  block_similarity_kernel<D>   per (segment, chunk of max(256, block_size) tokens): block-local cosine
//      similarities by tensor-core products of the raw bf16 keys (divided by the fp32 norms), the
//      newest-duplicate rule -> r (summed similarity) in the workspace.
//  full_similarity_kernel<D>   per (segment, 64-token row tile): the same over the whole sequence (R-KV's
//      full variant); each column's newest duplicate is an atomicMax of (row + 1, cos) in the workspace.
//  finalize_kernel   per segment: R = one softmax over all of the segment's tokens of r / (tau * n)
//      (n = block_size, or kv_len for the full variant), S' = max-pool of S (recency: the position),
//      F = lambda * S' - (1 - lambda) * R, window and sinks +inf -> workspace.
//  select_kernel   per segment: radix select (4 x 8-bit digits, warp-aggregated shared histograms, CUB
//      block scans) of the keep-th largest F; a final ordered pass emits the kept indices ascending,
//      ties to the older token.
//  compact_kernel<D>   per segment: moves kept token i from slot kept[i] to slot i (K, V, score), front
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

inline constexpr int kAttnChunk = 128;    // tokens per window-attention CTA
inline constexpr int kAttnThreads = 128;  // 4 warps, each owns 16-token column groups
inline constexpr int kAttnMaxRows = 128;  // window query rows per pass (Q tile in shared memory)
inline constexpr int kRedThreads = 256;   // final-score kernel: 8 warps
inline constexpr int kRedMinChunk = 256;  // tokens per final-score CTA (>= block_size)
inline constexpr int kSelThreads = 256;
inline constexpr int kSelItems = 8;
inline constexpr int kCompactThreads = 256;
inline constexpr int kCompactTile = 64;  // tokens per compaction tile

struct compress_args {
  bf16* k;
  bf16* v;
  // FP8 KV cache: E4M3 codes (same layout, 1 byte per element) and per-(slot, KV head) fp32 scales laid
  // out as the score cache (score_layer_stride); null for a bf16 cache. Keys are read as
  // bf16(float(code) * scale) into the same swizzled tiles; compaction moves codes and scales.
  std::uint8_t* k8;
  std::uint8_t* v8;
  float* k_scale;
  float* v_scale;
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
  const float* sb = a.k_scale + sg.layer * a.score_layer_stride + sg.head;
  constexpr int kChunks = D / 8;
  for (int c = tid; c < rows * kChunks; c += THREADS) {
    const int r = c / kChunks, ch = c % kChunks;
    const int tok = start + r;
    std::uint32_t w[4] = {0u, 0u, 0u, 0u};
    if (tok < len) {
      const std::int64_t slot = token_slot(pages, a.bs_shift, tok);
      const uint2 codes = *reinterpret_cast<const uint2*>(kb + slot * token_stride + ch * 8);
      const float sc = sb[slot * a.num_kv_heads];
      const std::uint32_t cw[2] = {codes.x, codes.y};
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float2 lo = e4m3x2_to_f32x2(static_cast<std::uint16_t>(cw[j] & 0xffffu));
        const float2 hi = e4m3x2_to_f32x2(static_cast<std::uint16_t>(cw[j] >> 16));
        w[2 * j] = pack_bf16(lo.x * sc, lo.y * sc);
        w[2 * j + 1] = pack_bf16(hi.x * sc, hi.y * sc);
      }
    }
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(sk + swz<D>(r, ch)), "r"(w[0]), "r"(w[1]),
                 "r"(w[2]), "r"(w[3])
                 : "memory");
  }
}

// ---------------------------------------------------------------------------------------------------
// Stages 1-2: window attention (two passes) and the global score.

template <int D>
struct attn_config {
  static constexpr int kKBytes = kAttnChunk * D * 2;
  static constexpr int kQBytes = kAttnMaxRows * D * 2;
  static constexpr int kCgs = kAttnChunk / 16;                 // 16-token column groups per chunk
  static constexpr int kCgsPerWarp = kCgs / (kAttnThreads / 32);
  static constexpr int kPartBytes = kAttnMaxRows * kCgs * 8;  // stats pass: (max, sum) per row and column group
  static constexpr int kSmemBytes = kKBytes + kQBytes + kPartBytes;  // at most
  // For q_rows rows of window queries: K chunk | Q tile | per-row statistics.
  static constexpr int smem_bytes(int q_rows, bool score) { return kKBytes + q_rows * (D * 2 + (score ? 8 : kCgs * 8)); }
};

template <int D, bool SCORE>
__global__ void __launch_bounds__(kAttnThreads) window_attention_kernel(const compress_args a) {
  using cfg = attn_config<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  const int sh = blockIdx.x;
  const int chunk = blockIdx.y;
  const segment sg = decompose(a, sh);
  const int len = a.kv_len[sg.req];
  const int start = chunk * kAttnChunk;
  if (start >= len) return;
  const std::int32_t* pages = a.page_indices + a.page_indptr[sg.req];
  const int qslot = a.slot[sg.req];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int gp = 1 << a.gp_shift;

  const std::uint32_t sk = smem_addr(smem);
  const std::uint32_t sq = sk + cfg::kKBytes;
  float2* part = reinterpret_cast<float2*>(smem + cfg::kKBytes + a.q_rows * D * 2);  // [rows][kCgs] or row (M, 1/L)

  load_keys<D, kAttnThreads>(a, sg, sk, pages, start, kAttnChunk, len, tid);
  cp_async_commit();

  const int n_cgs = min(cfg::kCgs, (len - start + 15) / 16);  // column groups holding tokens
  const int first_window_pos = len - a.window;                 // query w sits at first_window_pos + w
  const bf16* qbase = a.q + sg.layer * a.q_layer_stride +
                      (static_cast<std::int64_t>(qslot) * a.window * a.num_q_heads + sg.head * a.group) * D;
  const std::int64_t q_row_stride = std::int64_t{a.num_q_heads} * D;  // between window positions w

  float acc[cfg::kCgsPerWarp][2][2];  // SCORE: sum over w of max over g of p, per owned column
  float runmax[cfg::kCgsPerWarp][2][2];
#pragma unroll
  for (int i = 0; i < cfg::kCgsPerWarp; ++i)
#pragma unroll
    for (int n = 0; n < 2; ++n) acc[i][n][0] = acc[i][n][1] = runmax[i][n][0] = runmax[i][n][1] = 0.0f;

  for (int row0 = 0; row0 < a.rows_pad; row0 += kAttnMaxRows) {
    const int rows = min(kAttnMaxRows, a.rows_pad - row0);
    __syncthreads();  // the previous pass's Q tile and row data are no longer read
    for (int c = tid; c < rows * (D / 8); c += kAttnThreads) {
      const int r = c / (D / 8), ch = c % (D / 8);
      const int gr = row0 + r;
      const int w = gr >> a.gp_shift, g = gr & (gp - 1);
      const bool valid = w < a.window && g < a.group;
      cp_async_16(sq + swz<D>(r, ch), valid ? qbase + w * q_row_stride + g * D + ch * 8 : qbase, valid);
    }
    cp_async_commit();
    if constexpr (SCORE) {
      // Softmax normaliser of each row over the whole request: merge the per-chunk statistics.
      const int chunks = (len + kAttnChunk - 1) / kAttnChunk;
      for (int r = tid; r < rows; r += kAttnThreads) {
        const float2* st = a.stats + (static_cast<std::int64_t>(sh) * a.rows_pad + row0 + r) * a.attn_chunks;
        float m = -INFINITY;
        for (int c = 0; c < chunks; ++c) m = fmaxf(m, st[c].x);
        float l = 0.0f;
        if (m != -INFINITY)
          for (int c = 0; c < chunks; ++c)
            if (st[c].x != -INFINITY) l += st[c].y * exp2f(st[c].x - m);
        part[r] = make_float2(m, l > 0.0f ? 1.0f / l : 0.0f);
      }
    }
    cp_async_wait<0>();
    __syncthreads();

    const int rts = rows / 16;
#pragma unroll
    for (int ci = 0; ci < cfg::kCgsPerWarp; ++ci) {
      const int cg = warp + ci * (kAttnThreads / 32);
      if (cg >= n_cgs) continue;  // warp-uniform
      for (int rt = 0; rt < rts; ++rt) {
        std::uint32_t qf[D / 16][4];
        load_q_fragments<D>(qf, sq, rt * 16, lane);
        float s[2][4] = {};
        qk_tile<D, 2>(s, qf, sk, cg * 16, lane);
        // Mask: invalid rows (padding of the group or the window), tokens past the end, and tokens
        // after the query's own position (causal inside the current block).
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int gr = row0 + rt * 16 + (lane >> 2) + 8 * hr;
          const int w = gr >> a.gp_shift, g = gr & (gp - 1);
          const bool row_ok = w < a.window && g < a.group;
          const int limit = first_window_pos + w;  // last token the query may see
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int j = start + cg * 16 + n * 8 + 2 * (lane & 3) + e;
              float& v = s[n][2 * hr + e];
              v = (row_ok && j < len && j <= limit) ? v * a.scale_log2 : -INFINITY;
            }
        }
        if constexpr (!SCORE) {
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            float mx = fmaxf(fmaxf(s[0][2 * hr], s[0][2 * hr + 1]), fmaxf(s[1][2 * hr], s[1][2 * hr + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float base = mx == -INFINITY ? 0.0f : mx;
            float l = exp2f(s[0][2 * hr] - base) + exp2f(s[0][2 * hr + 1] - base) + exp2f(s[1][2 * hr] - base) +
                      exp2f(s[1][2 * hr + 1] - base);
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            if ((lane & 3) == 0) part[(rt * 16 + (lane >> 2) + 8 * hr) * cfg::kCgs + cg] = make_float2(mx, l);
          }
        } else {
          float p[2][2][2];  // [half][n][e]
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            const float2 ml = part[rt * 16 + (lane >> 2) + 8 * hr];
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const float v = s[n][2 * hr + e];
                p[hr][n][e] = v == -INFINITY ? 0.0f : exp2f(v - ml.x) * ml.y;
              }
          }
          if (gp < 16) {
            // Rows lane/4 and lane/4 + 8 of the tile are (w, g) = (r / Gp, r % Gp): max over g is a
            // shuffle over lane bits 2 .. 2 + log2(Gp) - 1, sum over w over the remaining bits and the halves.
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                float x0 = p[0][n][e], x1 = p[1][n][e];
                for (int o = 4; o < 4 * gp; o <<= 1) {
                  x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, o));
                  x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, o));
                }
                for (int o = 4 * gp; o < 32; o <<= 1) {
                  x0 += __shfl_xor_sync(0xffffffffu, x0, o);
                  x1 += __shfl_xor_sync(0xffffffffu, x1, o);
                }
                acc[ci][n][e] += x0 + x1;
              }
          } else {
            // The tile is (part of) one window query: max over its 16 rows, then over its Gp/16 tiles.
            const bool last_tile_of_w = (((row0 >> 4) + rt + 1) & ((gp >> 4) - 1)) == 0;
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                float x = fmaxf(p[0][n][e], p[1][n][e]);
                x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
                x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
                x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
                runmax[ci][n][e] = fmaxf(runmax[ci][n][e], x);
                if (last_tile_of_w) {
                  acc[ci][n][e] += runmax[ci][n][e];
                  runmax[ci][n][e] = 0.0f;
                }
              }
          }
        }
      }
    }
    if constexpr (!SCORE) {
      __syncthreads();
      for (int r = tid; r < rows; r += kAttnThreads) {
        float m = -INFINITY;
        for (int cg = 0; cg < n_cgs; ++cg) m = fmaxf(m, part[r * cfg::kCgs + cg].x);
        float l = 0.0f;
        if (m != -INFINITY)
          for (int cg = 0; cg < n_cgs; ++cg) {
            const float2 x = part[r * cfg::kCgs + cg];
            if (x.x != -INFINITY) l += x.y * exp2f(x.x - m);
          }
        a.stats[(static_cast<std::int64_t>(sh) * a.rows_pad + row0 + r) * a.attn_chunks + chunk] = make_float2(m, l);
      }
    }
  }

  if constexpr (SCORE) {
    // A = sum / W; merged with the history (S) into the workspace, and into the score cache if kept.
    if (lane < 4) {
      const bool first = a.first[sg.req] != 0;
      const int history = (first || a.history == 0) ? 0 : max(0, len - (1 << a.bs_shift));
      float* sbase = a.scores == nullptr ? nullptr : a.scores + sg.layer * a.score_layer_stride + sg.head;
      float* ibase = a.imp + static_cast<std::int64_t>(sh) * a.max_len;
      const float inv_w = 1.0f / static_cast<float>(a.window);
#pragma unroll
      for (int ci = 0; ci < cfg::kCgsPerWarp; ++ci) {
        const int cg = warp + ci * (kAttnThreads / 32);
        if (cg >= n_cgs) continue;
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int j = start + cg * 16 + n * 8 + 2 * lane + e;
            if (j >= len) continue;
            const float attn = acc[ci][n][e] * inv_w;
            float* dst = sbase == nullptr ? nullptr : sbase + token_slot(pages, a.bs_shift, j) * a.num_kv_heads;
            float sc = attn;
            if (j < history) sc = a.history == 1 ? fmaxf(attn, a.gamma * *dst) : attn + *dst;
            ibase[j] = sc;
            if (a.history != 0) *dst = sc;
          }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Stages 3-5: redundancy (similarity sums), then one finalize pass: softmax over the sequence, pooling,
// final score.

template <int D>
__host__ __device__ constexpr int block_similarity_smem_bytes(int chunk) {
  return chunk * (D * 2 + 4 + 4 + 8);  // keys | 1/norm | row sums | newest duplicate
}

// Gram tile of 16 rows (fragments qf, inv norms of the rows in row_inv) against 16 columns of a key tile
// (sk, column tokens col_base..+15 of the tile, global index col0 + ...): adds each row's cosines to
// rs[hr] and folds each column's newest duplicate (largest row with cos > 0.5) into dup_out via
// atomicMax; `pair_ok(m, c)` says which (row, column) pairs count (global indices).
template <int D, class PairOk, class DupOut>
__device__ __forceinline__ void gram_tile_16x16(const std::uint32_t (&qf)[D / 16][4], std::uint32_t sk, int col_base,
                                                int row0, int col0, const float* row_inv, const float* col_inv,
                                                int lane, float (&rs)[2], PairOk pair_ok, DupOut dup_out) {
  float s[2][4] = {};
  qk_tile<D, 2>(s, qf, sk, col_base, lane);
  unsigned long long best[2][2] = {{0ull, 0ull}, {0ull, 0ull}};  // per column (n, e): newest duplicate
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int mr = (lane >> 2) + 8 * hr;
#pragma unroll
    for (int nn = 0; nn < 2; ++nn)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int cc = nn * 8 + 2 * (lane & 3) + e;
        const int m = row0 + mr, c = col0 + cc;
        const bool ok = pair_ok(m, c);
        const float cs = ok ? s[nn][2 * hr + e] * row_inv[mr] * col_inv[col_base + cc] : 0.0f;
        rs[hr] += cs;
        if (ok && cs > 0.5f) {
          const unsigned long long key = (static_cast<unsigned long long>(m + 1) << 32) | __float_as_uint(cs);
          best[nn][e] = key > best[nn][e] ? key : best[nn][e];
        }
      }
  }
#pragma unroll
  for (int nn = 0; nn < 2; ++nn)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      unsigned long long b = best[nn][e];
#pragma unroll
      for (int o = 4; o < 32; o <<= 1) {
        const unsigned long long y = __shfl_xor_sync(0xffffffffu, b, o);
        b = y > b ? y : b;
      }
      if ((lane >> 2) == 0 && b != 0ull) dup_out(col0 + nn * 8 + 2 * (lane & 3) + e, b);
    }
}

// Norms (fp32 over the bf16 values) of rows [0, n) of a swizzled [rows][D] tile; an all-zero key gets
// 1 / 1e-8 and so similarity 0.
template <int D, int THREADS>
__device__ __forceinline__ void tile_inv_norms(const unsigned char* kbytes, int n, float* inv_norm, int tid) {
  for (int t = tid; t < n; t += THREADS) {
    float ss = 0.0f;
#pragma unroll
    for (int ch = 0; ch < D / 8; ++ch) {
      float f[8];
      bf16x8_to_float(*reinterpret_cast<const uint4*>(kbytes + swz<D>(t, ch)), f);
#pragma unroll
      for (int i = 0; i < 8; ++i) ss = fmaf(f[i], f[i], ss);
    }
    inv_norm[t] = 1.0f / (sqrtf(ss) + 1e-8f);
  }
}

template <int D>
__global__ void __launch_bounds__(kRedThreads) block_similarity_kernel(const compress_args a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int sh = blockIdx.x;
  const int cf = a.red_chunk;
  const int start = blockIdx.y * cf;
  const segment sg = decompose(a, sh);
  const int len = a.kv_len[sg.req];
  if (start >= len) return;
  const int n = min(cf, len - start);
  const std::int32_t* pages = a.page_indices + a.page_indptr[sg.req];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int bs = 1 << a.bs_shift;

  const std::uint32_t sk = smem_addr(smem);
  float* inv_norm = reinterpret_cast<float*>(smem + cf * D * 2);
  float* rowsum = inv_norm + cf;
  unsigned long long* dup = reinterpret_cast<unsigned long long*>(rowsum + cf);  // (row + 1) << 32 | cos bits

  load_keys<D, kRedThreads>(a, sg, sk, pages, start, cf, len, tid);
  cp_async_commit();
  for (int t = tid; t < cf; t += kRedThreads) dup[t] = 0ull;
  cp_async_wait<0>();
  __syncthreads();
  tile_inv_norms<D, kRedThreads>(smem, n, inv_norm, tid);
  __syncthreads();

  // Gram matrix of the chunk's keys, block-diagonal part only, one 16-row tile per warp at a time.
  const int row_tiles = (n + 15) / 16;
  for (int rt = warp; rt < row_tiles; rt += kRedThreads / 32) {
    std::uint32_t qf[D / 16][4];
    load_q_fragments<D>(qf, sk, rt * 16, lane);
    // Columns: the blocks the tile's rows lie in (the tile itself when blocks are shorter than 16).
    const int col_lo = bs >= 16 ? ((rt * 16) & ~(bs - 1)) : rt * 16;
    const int col_hi = min(n, bs >= 16 ? col_lo + bs : rt * 16 + 16);
    float rs[2] = {0.0f, 0.0f};
    for (int cg = col_lo / 16; cg * 16 < col_hi; ++cg)
      gram_tile_16x16<D>(
          qf, sk, cg * 16, rt * 16, cg * 16, inv_norm + rt * 16, inv_norm, lane, rs,
          // chunk starts are block-aligned, so "same block" is a test on chunk-local indices
          [&](int m, int c) { return m < n && c < n && m != c && ((m ^ c) >> a.bs_shift) == 0; },
          [&](int c, unsigned long long b) { atomicMax(&dup[c], b); });
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      rs[hr] += __shfl_xor_sync(0xffffffffu, rs[hr], 1);
      rs[hr] += __shfl_xor_sync(0xffffffffu, rs[hr], 2);
      const int m = rt * 16 + (lane >> 2) + 8 * hr;
      if ((lane & 3) == 0 && m < n) rowsum[m] = rs[hr];
    }
  }
  __syncthreads();

  // The newest duplicate of each column does not count that column.
  float* red = a.red + static_cast<std::int64_t>(sh) * a.max_len + start;
  for (int t = tid; t < n; t += kRedThreads) {
    const int b0 = t & ~(bs - 1), b1 = min(n, b0 + bs);
    float r = rowsum[t];
    for (int c = b0; c < b1; ++c) {
      const unsigned long long d = dup[c];
      if (d != 0ull && static_cast<int>(d >> 32) - 1 == t) r -= __uint_as_float(static_cast<unsigned>(d));
    }
    red[t] = r;
  }
}

inline constexpr int kFullRows = 64;     // rows per full-similarity CTA (4 warps x 16)
inline constexpr int kFullThreads = 128;

template <int D>
__host__ __device__ constexpr int full_similarity_smem_bytes() {
  return 2 * kFullRows * (D * 2 + 4);  // row keys | column keys | 1/norms of each
}

// Whole-sequence similarity sums: row tile blockIdx.y of the segment against every column tile. Row sums
// go to the workspace (r, before the newest-duplicate correction); each column's newest duplicate is
// combined across CTAs with atomicMax in the workspace (zeroed before the launch). The finalize kernel
// subtracts the duplicates' terms.
template <int D>
__global__ void __launch_bounds__(kFullThreads) full_similarity_kernel(const compress_args a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int sh = blockIdx.x;
  const int row0 = blockIdx.y * kFullRows;
  const segment sg = decompose(a, sh);
  const int len = a.kv_len[sg.req];
  if (row0 >= len) return;
  const std::int32_t* pages = a.page_indices + a.page_indptr[sg.req];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const std::uint32_t srow = smem_addr(smem);
  const std::uint32_t scol = srow + kFullRows * D * 2;
  float* row_inv = reinterpret_cast<float*>(smem + 2 * kFullRows * D * 2);
  float* col_inv = row_inv + kFullRows;
  unsigned long long* dup = a.dup + static_cast<std::int64_t>(sh) * a.max_len;

  load_keys<D, kFullThreads>(a, sg, srow, pages, row0, kFullRows, len, tid);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  tile_inv_norms<D, kFullThreads>(smem, min(kFullRows, len - row0), row_inv, tid);
  __syncthreads();
  std::uint32_t qf[D / 16][4];
  load_q_fragments<D>(qf, srow, warp * 16, lane);

  float rs[2] = {0.0f, 0.0f};
  for (int col0 = 0; col0 < len; col0 += kFullRows) {
    __syncthreads();  // the previous column tile is no longer read
    load_keys<D, kFullThreads>(a, sg, scol, pages, col0, kFullRows, len, tid);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    tile_inv_norms<D, kFullThreads>(smem + kFullRows * D * 2, min(kFullRows, len - col0), col_inv, tid);
    __syncthreads();
    for (int cg = 0; cg < kFullRows / 16 && col0 + cg * 16 < len; ++cg)
      gram_tile_16x16<D>(
          qf, scol, cg * 16, row0 + warp * 16, col0 + cg * 16, row_inv + warp * 16, col_inv, lane, rs,
          [&](int m, int c) { return m < len && c < len && m != c; },
          [&](int c, unsigned long long b) { atomicMax(&dup[c], b); });
  }
  float* red = a.red + static_cast<std::int64_t>(sh) * a.max_len;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    rs[hr] += __shfl_xor_sync(0xffffffffu, rs[hr], 1);
    rs[hr] += __shfl_xor_sync(0xffffffffu, rs[hr], 2);
    const int m = row0 + warp * 16 + (lane >> 2) + 8 * hr;
    if ((lane & 3) == 0 && m < len) red[m] = rs[hr];
  }
}

inline constexpr int kFinalThreads = 256;

// Per segment: R = softmax over the sequence of r / (tau * n); S' = pooled S (or the position, for
// recency); F = lambda * S' - (1 - lambda) * R (or S' without redundancy); window and sinks +inf.
__global__ void __launch_bounds__(kFinalThreads) finalize_kernel(const compress_args a) {
  using reduce = cub::BlockReduce<float, kFinalThreads>;
  __shared__ typename reduce::TempStorage temp;
  __shared__ float s_max, s_sum;
  const int sh = blockIdx.x;
  const segment sg = decompose(a, sh);
  const int len = a.kv_len[sg.req];
  if (len <= 0) return;
  const int tid = threadIdx.x;
  const std::int64_t row = static_cast<std::int64_t>(sh) * a.max_len;
  const float* imp = a.imp + row;
  float* red = a.red + row;
  float* out = a.fscore + row;

  if (a.redundancy != 0) {
    if (a.redundancy == 2) {
      // Each column's newest duplicate does not count that column (global atomics; visible after the barrier).
      const unsigned long long* dup = a.dup + row;
      for (int c = tid; c < len; c += kFinalThreads) {
        const unsigned long long d = dup[c];
        if (d != 0ull) atomicAdd(&red[static_cast<int>(d >> 32) - 1], -__uint_as_float(static_cast<unsigned>(d)));
      }
      __syncthreads();
    }
    const float inv_div =
        1.0f / (a.tau * static_cast<float>(a.redundancy == 2 ? len : (1 << a.bs_shift)));
    float mx = -INFINITY;
    for (int j = tid; j < len; j += kFinalThreads) mx = fmaxf(mx, red[j] * inv_div);
    mx = reduce(temp).Reduce(mx, [](float x, float y) { return fmaxf(x, y); });
    if (tid == 0) s_max = mx;
    __syncthreads();
    float sum = 0.0f;
    for (int j = tid; j < len; j += kFinalThreads) sum += expf(red[j] * inv_div - s_max);
    sum = reduce(temp).Sum(sum);
    if (tid == 0) s_sum = sum;
    __syncthreads();
    for (int j = tid; j < len; j += kFinalThreads) red[j] = expf(red[j] * inv_div - s_max) / s_sum;
    __syncthreads();
  }

  const bool first = a.first[sg.req] != 0;
  const bool pool = a.pool_radius > 0 && (a.pool_mode == 2 || (a.pool_mode == 1 && first));
  auto importance = [&](int i) { return a.recency ? static_cast<float>(i) : imp[i]; };
  for (int j = tid; j < len; j += kFinalThreads) {
    float s;
    if (pool) {
      s = -INFINITY;
      const int lo = max(0, j - a.pool_radius), hi = min(len - 1, j + a.pool_radius);
      for (int i = lo; i <= hi; ++i) s = fmaxf(s, importance(i));
    } else {
      s = importance(j);
    }
    float f = a.redundancy != 0 ? a.lambda * s - (1.0f - a.lambda) * red[j] : s;
    if (j >= len - a.window || j < a.sinks) f = INFINITY;
    out[j] = f;
  }
}

// ---------------------------------------------------------------------------------------------------
// Stage 6: top-keep selection.

// Order-preserving map of a float to an unsigned key (larger float -> larger key); NaN -> -inf, -0 -> +0.
__device__ __forceinline__ unsigned ordered_key(float f) {
  if (f != f) f = -INFINITY;
  if (f == 0.0f) f = 0.0f;
  const unsigned u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(kSelThreads) select_kernel(const compress_args a) {
  using scan_u32 = cub::BlockScan<unsigned, kSelThreads>;
  using scan_u64 = cub::BlockScan<unsigned long long, kSelThreads>;
  __shared__ union {
    typename scan_u32::TempStorage u32;
    typename scan_u64::TempStorage u64;
  } temp;
  __shared__ unsigned hist[256];
  __shared__ unsigned s_digit, s_remaining;
  extern __shared__ __align__(128) unsigned char smem[];

  const int sh = blockIdx.x;
  const segment sg = decompose(a, sh);
  const int len = a.kv_len[sg.req];
  if (len <= 0) return;
  const int k = min(a.keep, len);
  const int tid = threadIdx.x, lane = tid & 31;
  std::int32_t* kept = a.kept + static_cast<std::int64_t>(sh) * a.keep;
  if (k == len) {
    for (int j = tid; j < len; j += kSelThreads) kept[j] = j;
    return;
  }
  // Keys in shared memory when they fit, else recomputed from F at every pass (F is left intact).
  const float* f = a.fscore + static_cast<std::int64_t>(sh) * a.max_len;
  unsigned* keys = reinterpret_cast<unsigned*>(smem);
  const bool in_smem = a.select_smem;
  auto key_at = [&](int j) { return in_smem ? keys[j] : ordered_key(f[j]); };
  if (in_smem) {
    for (int j = tid; j < len; j += kSelThreads) keys[j] = ordered_key(f[j]);
    __syncthreads();
  }

  // Radix select of the k-th largest key, 8 bits at a time from the top.
  unsigned prefix = 0, mask = 0, remaining = static_cast<unsigned>(k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    hist[tid] = 0;  // kSelThreads == 256 bins
    __syncthreads();
    for (int j0 = 0; j0 < len; j0 += kSelThreads) {
      const int j = j0 + tid;
      unsigned digit = 256;  // no bin
      if (j < len) {
        const unsigned key = key_at(j);
        if ((key & mask) == prefix) digit = (key >> shift) & 255u;
      }
      const unsigned peers = __match_any_sync(0xffffffffu, digit);
      if (digit < 256 && lane == __ffs(peers) - 1) atomicAdd(&hist[digit], static_cast<unsigned>(__popc(peers)));
    }
    __syncthreads();
    const unsigned h = hist[255 - tid];
    unsigned cum;  // keys (matching the prefix) with digit >= 255 - tid
    scan_u32(temp.u32).InclusiveSum(h, cum);
    if (cum >= remaining && cum - h < remaining) {
      s_digit = 255u - static_cast<unsigned>(tid);
      s_remaining = remaining - (cum - h);
    }
    __syncthreads();
    prefix |= s_digit << shift;
    mask |= 255u << shift;
    remaining = s_remaining;
    __syncthreads();
  }
  const unsigned thr = prefix;          // the k-th largest key
  const unsigned need_eq = remaining;   // how many keys equal to it are kept (the oldest ones)

  // Ordered pass: kept position of token j = (# greater before j) + min(# equal before j, need_eq).
  unsigned long long carry = 0;
  constexpr int kTile = kSelThreads * kSelItems;
  for (int base = 0; base < len; base += kTile) {
    unsigned kk[kSelItems];
    unsigned long long cnt = 0;
#pragma unroll
    for (int i = 0; i < kSelItems; ++i) {
      const int j = base + tid * kSelItems + i;
      kk[i] = j < len ? key_at(j) : 0u;
      if (j < len) cnt += kk[i] > thr ? (1ull << 32) : (kk[i] == thr ? 1ull : 0ull);
    }
    unsigned long long run, total;
    scan_u64(temp.u64).ExclusiveSum(cnt, run, total);
    run += carry;
#pragma unroll
    for (int i = 0; i < kSelItems; ++i) {
      const int j = base + tid * kSelItems + i;
      if (j >= len) break;
      const unsigned gt_before = static_cast<unsigned>(run >> 32), eq_before = static_cast<unsigned>(run);
      if (kk[i] > thr) {
        kept[gt_before + min(eq_before, need_eq)] = j;
        run += 1ull << 32;
      } else if (kk[i] == thr) {
        if (eq_before < need_eq) kept[gt_before + eq_before] = j;
        run += 1ull;
      }
    }
    carry += total;
    __syncthreads();  // temp storage reuse
  }
}

// ---------------------------------------------------------------------------------------------------
// Stage 7: in-place compaction.

// FP8 cache: codes move in 16-byte chunks (D / 16 per token) and each kept token's K and V scales with
// them, bit for bit; the score cache as in compact_kernel.
template <int D>
__global__ void __launch_bounds__(kCompactThreads) compact_fp8_kernel(const compress_args a) {
  constexpr int kChunks = D / 16;
  constexpr int kPer = (kCompactTile * kChunks + kCompactThreads - 1) / kCompactThreads;
  const int sh = blockIdx.x;
  const segment sg = decompose(a, sh);
  const int len = a.kv_len[sg.req];
  const int k = min(a.keep, len);
  if (k >= len) return;
  const std::int32_t* kept = a.kept + static_cast<std::int64_t>(sh) * a.keep;
  const std::int32_t* pages = a.page_indices + a.page_indptr[sg.req];
  const std::int64_t token_stride = std::int64_t{a.num_kv_heads} * D;
  std::uint8_t* kb = a.k8 + sg.layer * a.kv_layer_stride + sg.head * D;
  std::uint8_t* vb = a.v8 + sg.layer * a.kv_layer_stride + sg.head * D;
  const std::int64_t sl = sg.layer * a.score_layer_stride + sg.head;
  float* sb = a.scores == nullptr ? nullptr : a.scores + sl;
  float* ksb = a.k_scale + sl;
  float* vsb = a.v_scale + sl;
  const int tid = threadIdx.x;

  for (int t0 = 0; t0 < k; t0 += kCompactTile) {
    const int t1 = min(k, t0 + kCompactTile);
    if (kept[t1 - 1] == t1 - 1) continue;
    uint4 kr[kPer], vr[kPer];
    std::int64_t dst_off[kPer];
    bool move[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int item = tid + i * kCompactThreads;
      const int dst = t0 + item / kChunks, ch = item % kChunks;
      move[i] = false;
      if (item < kCompactTile * kChunks && dst < t1) {
        const int src = kept[dst];
        if (src != dst) {
          move[i] = true;
          const std::int64_t so = token_slot(pages, a.bs_shift, src) * token_stride + ch * 16;
          dst_off[i] = token_slot(pages, a.bs_shift, dst) * token_stride + ch * 16;
          kr[i] = *reinterpret_cast<const uint4*>(kb + so);
          vr[i] = *reinterpret_cast<const uint4*>(vb + so);
        }
      }
    }
    float sv = 0.0f, ks = 0.0f, vs = 0.0f;
    std::int64_t s_dst = -1;
    if (tid < kCompactTile) {
      const int dst = t0 + tid;
      if (dst < t1) {
        const int src = kept[dst];
        if (src != dst) {
          const std::int64_t from = token_slot(pages, a.bs_shift, src) * a.num_kv_heads;
          s_dst = token_slot(pages, a.bs_shift, dst) * a.num_kv_heads;
          ks = ksb[from];
          vs = vsb[from];
          if (sb != nullptr) sv = sb[from];
        }
      }
    }
    __syncthreads();  // every source of the tile is read before any slot of it is written
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (move[i]) {
        *reinterpret_cast<uint4*>(kb + dst_off[i]) = kr[i];
        *reinterpret_cast<uint4*>(vb + dst_off[i]) = vr[i];
      }
    if (s_dst >= 0) {
      ksb[s_dst] = ks;
      vsb[s_dst] = vs;
      if (sb != nullptr) sb[s_dst] = sv;
    }
    __syncthreads();
  }
}

template <int D>
__global__ void __launch_bounds__(kCompactThreads) compact_kernel(const compress_args a) {
  constexpr int kChunks = D / 8;
  constexpr int kPer = kCompactTile * kChunks / kCompactThreads;  // 16-byte chunks per thread per side
  static_assert(kCompactTile * kChunks % kCompactThreads == 0 && kCompactTile <= kCompactThreads);
  const int sh = blockIdx.x;
  const segment sg = decompose(a, sh);
  const int len = a.kv_len[sg.req];
  const int k = min(a.keep, len);
  if (k >= len) return;  // nothing evicted
  const std::int32_t* kept = a.kept + static_cast<std::int64_t>(sh) * a.keep;
  const std::int32_t* pages = a.page_indices + a.page_indptr[sg.req];
  const std::int64_t token_stride = std::int64_t{a.num_kv_heads} * D;
  bf16* kb = a.k + sg.layer * a.kv_layer_stride + sg.head * D;
  bf16* vb = a.v + sg.layer * a.kv_layer_stride + sg.head * D;
  float* sb = a.scores == nullptr ? nullptr : a.scores + sg.layer * a.score_layer_stride + sg.head;
  const int tid = threadIdx.x;

  for (int t0 = 0; t0 < k; t0 += kCompactTile) {
    const int t1 = min(k, t0 + kCompactTile);
    if (kept[t1 - 1] == t1 - 1) continue;  // ascending and kept[i] >= i: the whole tile stays in place
    uint4 kr[kPer], vr[kPer];
    std::int64_t dst_off[kPer];
    bool move[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int item = tid + i * kCompactThreads;
      const int dst = t0 + item / kChunks, ch = item % kChunks;
      move[i] = false;
      if (dst < t1) {
        const int src = kept[dst];
        if (src != dst) {
          move[i] = true;
          const std::int64_t so = token_slot(pages, a.bs_shift, src) * token_stride + ch * 8;
          dst_off[i] = token_slot(pages, a.bs_shift, dst) * token_stride + ch * 8;
          kr[i] = *reinterpret_cast<const uint4*>(kb + so);
          vr[i] = *reinterpret_cast<const uint4*>(vb + so);
        }
      }
    }
    float sv = 0.0f;
    std::int64_t s_dst = -1;
    if (sb != nullptr && tid < kCompactTile) {
      const int dst = t0 + tid;
      if (dst < t1) {
        const int src = kept[dst];
        if (src != dst) {
          sv = sb[token_slot(pages, a.bs_shift, src) * a.num_kv_heads];
          s_dst = token_slot(pages, a.bs_shift, dst) * a.num_kv_heads;
        }
      }
    }
    __syncthreads();  // every source of the tile is read before any slot of it is written
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (move[i]) {
        *reinterpret_cast<uint4*>(kb + dst_off[i]) = kr[i];
        *reinterpret_cast<uint4*>(vb + dst_off[i]) = vr[i];
      }
    if (s_dst >= 0) sb[s_dst] = sv;
    __syncthreads();
  }
}

}  // namespace zipage::cuda::detail
