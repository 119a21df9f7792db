#pragma once
// Compression kernels, stages 1-5: window attention and the global score, redundancy, the final score.
// Arguments, segments and shared helpers: compression.cuh (with the overview of every stage).
#include <type_traits>

#include "zipage/backend/cuda/compression.cuh"

namespace zipage::cuda::detail {

// ---------------------------------------------------------------------------------------------------
// Stages 1-2: window attention (two passes) and the global score.

template <int D>
struct attn_config {
  static constexpr int kKBytes = kAttnChunk * D * 2;    // one bf16 key tile
  static constexpr int kRawBytes = kAttnChunk * (D + 4);  // one FP8 stage: codes [chunk][D] | scale words [chunk]
  static constexpr int kCgs = kAttnChunk / 16;           // 16-token column groups per chunk
  static constexpr int kCgsPerWarp = (kCgs + kAttnThreads / 32 - 1) / (kAttnThreads / 32);
  // Two key stages (the chunk being read, the next one arriving): bf16 tiles, or FP8 stages and the one
  // bf16 tile they are dequantised into.
  __host__ __device__ static constexpr int key_bytes(bool fp8) { return fp8 ? 2 * kRawBytes + kKBytes : 2 * kKBytes; }
  // Key stages | Q tile of q_rows window rows | per-row statistics | (score pass) the chunk's A.
  __host__ __device__ static constexpr int smem_bytes(int q_rows, bool score, bool fp8) {
    return key_bytes(fp8) + q_rows * (D * 2 + (score ? 8 : kCgs * 8)) + (score ? kAttnChunk * 4 : 0);
  }
};

// (m, l) of a softmax over the union of two parts (log2 domain): the max and the sum of 2^(x - max).
__device__ __forceinline__ void merge_softmax_stats(float& m, float& l, float om, float ol) {
  if (om == -INFINITY) return;
  if (m == -INFINITY) {
    m = om;
    l = ol;
    return;
  }
  const float mx = fmaxf(m, om);
  l = l * exp2f(m - mx) + ol * exp2f(om - mx);
  m = mx;
}

// Score pass, Gp < 16: a 16-row MMA tile holds whole window queries, rows lane / 4 and lane / 4 + 8 being
// (w, g) = (r / Gp, r % Gp). A column's A contribution is the sum over w of the max over g of p: over lane bits
// 2 .. 2 + log2(Gp) - 1 a max, over the remaining bits and the two halves (hr) a sum. The lane's 8 values
// p[hr][n][e] are reduce-scattered over lane bits 2, 3, 4 (each level keeps half of them: hr = bit 2, then
// n = bit 3, then e = bit 4: 7 shuffles instead of 24, the same pairs combined level by level, so the same
// result), then the halves are added: the lane returns column n * 8 + 2 (lane % 4) + e's value, n = bit 3,
// e = bit 4 (lanes l and l ^ 4 hold the same).
__device__ __forceinline__ float window_column_score(const float (&p)[2][2][2], int lane, int gp) {
  const bool b2 = (lane & 4) != 0, b3 = (lane & 8) != 0, b4 = (lane & 16) != 0;
  auto level = [gp](float mine, float other, int o) { return o < 4 * gp ? fmaxf(mine, other) : mine + other; };
  float y[2][2];  // [n][e] of half hr = b2, over lanes l, l ^ 4
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e)
      y[n][e] = level(b2 ? p[1][n][e] : p[0][n][e], __shfl_xor_sync(0xffffffffu, b2 ? p[0][n][e] : p[1][n][e], 4), 4);
  float z[2];  // [e] of n = b3, over lanes l, l ^ 4, l ^ 8, l ^ 12
#pragma unroll
  for (int e = 0; e < 2; ++e) z[e] = level(b3 ? y[1][e] : y[0][e], __shfl_xor_sync(0xffffffffu, b3 ? y[0][e] : y[1][e], 8), 8);
  const float x = level(b4 ? z[1] : z[0], __shfl_xor_sync(0xffffffffu, b4 ? z[0] : z[1], 16), 16);
  return x + __shfl_xor_sync(0xffffffffu, x, 4);  // the other half (hr) of the same column
}

inline constexpr int kMergeThreads = 256;

// Between the two passes: each window row's softmax statistics over the whole request, merged once per
// (segment, row) by a warp (lanes over the chunks) rather than by every chunk's CTA of the score pass; the
// result, (max, 1 / sum), goes to the row's chunk-0 slot.
__global__ void __launch_bounds__(kMergeThreads) merge_stats_kernel(const compress_args a, std::int64_t rows_total) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (kMergeThreads / 32) + (threadIdx.x >> 5);
  if (row >= rows_total) return;
  const int lane = threadIdx.x & 31;
  const segment sg = decompose(a, static_cast<int>(row / a.rows_pad));
  const int chunks = (a.kv_len[sg.req] + kAttnChunk - 1) / kAttnChunk;
  float2* st = a.stats + row * a.attn_chunks;
  float m = -INFINITY, l = 0.0f;
  for (int c = lane; c < chunks; c += 32) merge_softmax_stats(m, l, st[c].x, st[c].y);
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, m, o), ol = __shfl_xor_sync(0xffffffffu, l, o);
    merge_softmax_stats(m, l, om, ol);
  }
  if (lane == 0) st[0] = make_float2(m, l > 0.0f ? 1.0f / l : 0.0f);  // only lane 0 read slot 0
}

// Issues the copies of chunk `chunk`'s keys into key stage `stage`: bf16 straight into a swizzled tile,
// FP8 codes as stored and each token's scale as the aligned 4-byte word that holds it (scale_word: cp.async
// copies at least 4 aligned bytes; dequantise_stage turns them into the tile once they have arrived).
template <int D>
__device__ __forceinline__ void issue_key_chunk(const compress_args& a, const segment& sg, std::uint32_t skeys,
                                                const std::int32_t* pages, int chunk, int stage, int len, int tid) {
  using cfg = attn_config<D>;
  const int start = chunk * kAttnChunk;
  const std::int64_t token_stride = std::int64_t{a.num_kv_heads} * D;
  if (a.k8 == nullptr) {
    load_key_rows<D, kAttnThreads>(skeys + stage * cfg::kKBytes, a.k + sg.layer * a.kv_layer_stride + sg.head * D,
                                   token_stride, pages, a.bs_shift, start, kAttnChunk, len, tid);
    return;
  }
  const std::uint32_t raw = skeys + stage * cfg::kRawBytes;
  const std::uint8_t* kb = a.k8 + sg.layer * a.kv_layer_stride + sg.head * D;
  constexpr int kPieces = D / 16;
  for (int c = tid; c < kAttnChunk * kPieces; c += kAttnThreads) {
    const int r = c / kPieces, piece = c % kPieces;
    const bool valid = start + r < len;
    const std::uint8_t* src = valid ? kb + token_slot(pages, a.bs_shift, start + r) * token_stride + piece * 16 : kb;
    cp_async_16(raw + r * D + piece * 16, src, valid);
  }
  const std::uint16_t* sb = a.k_scale + sg.layer * a.score_layer_stride + sg.head;
  for (int r = tid; r < kAttnChunk; r += kAttnThreads) {
    const bool valid = start + r < len;
    const std::uint16_t* src = valid ? sb + token_slot(pages, a.bs_shift, start + r) * a.num_kv_heads : sb;
    cp_async_4(raw + kAttnChunk * D + r * 4, scale_word(src), valid);
  }
}

// FP8 stage -> the bf16 key tile (tokens past the end were zero-filled: code 0 times scale 0). Row r's scale is at
// scale_shift(r, ...) of its word (chunks start at even tokens; compress checks fp8_scale_words).
template <int D>
__device__ __forceinline__ void dequantise_stage(const unsigned char* raw, std::uint32_t sk, int num_kv_heads,
                                                 int kv_head, int tid) {
  constexpr int kChunks = D / 8;
  const std::uint32_t* words = reinterpret_cast<const std::uint32_t*>(raw + kAttnChunk * D);
  for (int c = tid; c < kAttnChunk * kChunks; c += kAttnThreads) {
    const int r = c / kChunks, ch = c % kChunks;
    const float scale = scale_in_word(words[r], scale_shift(r, num_kv_heads, kv_head));
    store_dequantised(sk + swz<D>(r, ch), *reinterpret_cast<const uint2*>(raw + r * D + ch * 8), scale);
  }
}

// Window attention over chunks [blockIdx.y * chunks_per_cta, ...) of segment blockIdx.x: the Q tile is
// loaded once (when the window rows fit one tile) and each chunk's keys arrive while the previous chunk
// is computed (two key stages).
//  SCORE = false: per (window row, chunk) the chunk's max logit and sum of exp -> a.stats.
//  SCORE = true:  with each row's merged statistics (merge_stats_kernel), p = softmax, A_j = mean_w max_g p,
//                 merged with the history -> a.imp (and the score cache).
template <int D, bool SCORE>
__global__ void __launch_bounds__(kAttnThreads, 2) window_attention_kernel(const compress_args a) {
  using cfg = attn_config<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  const int sh = blockIdx.x;
  const segment sg = decompose(a, sh);
  const int len = a.kv_len[sg.req];
  const int chunk_begin = blockIdx.y * a.attn_chunks_per_cta;
  const int chunk_end = min((len + kAttnChunk - 1) / kAttnChunk, chunk_begin + a.attn_chunks_per_cta);
  if (chunk_begin >= chunk_end) return;
  const std::int32_t* pages = a.page_indices + a.page_indptr[sg.req];
  const int qslot = a.slot[sg.req];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int gp = 1 << a.gp_shift;
  const bool fp8 = a.k8 != nullptr;

  const std::uint32_t skeys = smem_addr(smem);
  const int key_bytes = cfg::key_bytes(fp8);
  const std::uint32_t sq = skeys + key_bytes;
  float2* part = reinterpret_cast<float2*>(smem + key_bytes + a.q_rows * D * 2);  // [rows][kCgs] or row (M, 1/L)
  float* chunk_a = reinterpret_cast<float*>(smem + key_bytes + a.q_rows * (D * 2 + 8));  // score pass: A of the chunk

  const int first_window_pos = len - a.window;  // query w sits at first_window_pos + w
  const bf16* qbase = a.q + sg.layer * a.q_layer_stride +
                      (static_cast<std::int64_t>(qslot) * a.window * a.num_q_heads + sg.head * a.group) * D;
  const std::int64_t q_row_stride = std::int64_t{a.num_q_heads} * D;  // between window positions w
  const float2* row_stats = a.stats + static_cast<std::int64_t>(sh) * a.rows_pad * a.attn_chunks;

  // Rows [row0, row0 + rows) of the window queries -> the Q tile (cp.async); the score pass also reads
  // their merged statistics.
  auto load_rows = [&](int row0, int rows) {
    for (int c = tid; c < rows * (D / 8); c += kAttnThreads) {
      const int r = c / (D / 8), ch = c % (D / 8);
      const int gr = row0 + r;
      const int w = gr >> a.gp_shift, g = gr & (gp - 1);
      const bool valid = w < a.window && g < a.group;
      cp_async_16(sq + swz<D>(r, ch), valid ? qbase + w * q_row_stride + g * D + ch * 8 : qbase, valid);
    }
    if constexpr (SCORE)
      for (int r = tid; r < rows; r += kAttnThreads) part[r] = row_stats[static_cast<std::int64_t>(row0 + r) * a.attn_chunks];
  };
  const bool q_resident = a.rows_pad <= kAttnMaxRows;  // one row tile for every chunk
  const bool rows_unpadded = a.group == gp && a.window * gp == a.rows_pad;
  if (q_resident) load_rows(0, a.rows_pad);
  issue_key_chunk<D>(a, sg, skeys, pages, chunk_begin, 0, len, tid);
  cp_async_commit();

  for (int chunk = chunk_begin; chunk < chunk_end; ++chunk) {
    const int stage = (chunk - chunk_begin) & 1;
    if (chunk + 1 < chunk_end) issue_key_chunk<D>(a, sg, skeys, pages, chunk + 1, stage ^ 1, len, tid);
    cp_async_commit();
    cp_async_wait<1>();  // this chunk's keys (and the Q tile) have arrived; the next chunk's may still be in flight
    __syncthreads();
    std::uint32_t sk = skeys + stage * cfg::kKBytes;
    if (fp8) {
      sk = skeys + 2 * cfg::kRawBytes;
      dequantise_stage<D>(smem + stage * cfg::kRawBytes, sk, a.num_kv_heads, sg.head, tid);
      __syncthreads();
    }
    const int start = chunk * kAttnChunk;
    const int n_cgs = min(cfg::kCgs, (len - start + 15) / 16);  // column groups holding tokens
    // Every query sees every token of the chunk (it ends at or before the first window position) and no
    // row is padding: no masking (most chunks of a long request).
    const bool interior = rows_unpadded && start + kAttnChunk - 1 <= first_window_pos;

    // SCORE: sum over w of max over g of p, per owned column (Gp < 16: one column per lane, in acc[ci][0][0])
    float acc[cfg::kCgsPerWarp][2][2];
    float runmax[cfg::kCgsPerWarp][2][2];
#pragma unroll
    for (int i = 0; i < cfg::kCgsPerWarp; ++i)
#pragma unroll
      for (int n = 0; n < 2; ++n) acc[i][n][0] = acc[i][n][1] = runmax[i][n][0] = runmax[i][n][1] = 0.0f;

    for (int row0 = 0; row0 < a.rows_pad; row0 += kAttnMaxRows) {
      const int rows = min(kAttnMaxRows, a.rows_pad - row0);
      if (!q_resident) {
        __syncthreads();  // the previous row tile's Q and row data are no longer read
        load_rows(row0, rows);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
      }
      const int rts = rows / 16;
#pragma unroll
      for (int ci = 0; ci < cfg::kCgsPerWarp; ++ci) {
        const int cg = warp + ci * (kAttnThreads / 32);
        if (cg >= n_cgs) continue;  // warp-uniform
        // One 16-row tile of window queries against the warp's column group; `masked`: the chunk holds tokens
        // some query may not see (past the end, or after the query's position) or the rows have padding.
        auto row_tile = [&](int rt, auto masked) {
          std::uint32_t qf[D / 16][4];
          load_q_fragments<D>(qf, sq, rt * 16, lane);
          float s[2][4] = {};
          qk_tile<D, 2>(s, qf, sk, cg * 16, lane);
          if constexpr (decltype(masked)::value) {
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
          } else {
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
              for (int i = 0; i < 4; ++i) s[n][i] *= a.scale_log2;
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
                  if constexpr (decltype(masked)::value) p[hr][n][e] = v == -INFINITY ? 0.0f : exp2f(v - ml.x) * ml.y;
                  else p[hr][n][e] = exp2f(v - ml.x) * ml.y;
                }
            }
            if (gp < 16) {
              // Rows lane/4 and lane/4 + 8 of the tile are (w, g) = (r / Gp, r % Gp): max over g is a
              // shuffle over lane bits 2 .. 2 + log2(Gp) - 1, sum over w over the remaining bits and the halves.
              // Reduce-scattered: the lane keeps one of its 8 values, (hr, n, e) = lane bits (2, 3, 4).
              acc[ci][0][0] += window_column_score(p, lane, gp);
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
        };
        if (interior)
          for (int rt = 0; rt < rts; ++rt) row_tile(rt, std::false_type{});
        else
          for (int rt = 0; rt < rts; ++rt) row_tile(rt, std::true_type{});
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
      // A = sum / W, staged in shared memory so that every thread merges one token with the history (S)
      // into the workspace, and into the score cache if kept (one gather latency, not a chain of them).
      const float inv_w = 1.0f / static_cast<float>(a.window);
      if (gp < 16) {
        // acc[ci][0][0]: column (lane bit 3) * 8 + 2 (lane % 4) + (lane bit 4), in lanes l and l ^ 4.
        if ((lane & 4) == 0) {
#pragma unroll
          for (int ci = 0; ci < cfg::kCgsPerWarp; ++ci) {
            const int cg = warp + ci * (kAttnThreads / 32);
            if (cg < n_cgs)
              chunk_a[cg * 16 + ((lane >> 3) & 1) * 8 + 2 * (lane & 3) + ((lane >> 4) & 1)] = acc[ci][0][0] * inv_w;
          }
        }
      } else if (lane < 4) {
#pragma unroll
        for (int ci = 0; ci < cfg::kCgsPerWarp; ++ci) {
          const int cg = warp + ci * (kAttnThreads / 32);
          if (cg >= n_cgs) continue;
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) chunk_a[cg * 16 + n * 8 + 2 * lane + e] = acc[ci][n][e] * inv_w;
        }
      }
      __syncthreads();
      const bool first = a.first[sg.req] != 0;
      const int history = (first || a.history == 0) ? 0 : max(0, len - (1 << a.bs_shift));
      float* ibase = a.imp + static_cast<std::int64_t>(sh) * a.max_len;
      for (int t = tid; t < kAttnChunk && start + t < len; t += kAttnThreads) {
        const int j = start + t;
        const float attn = chunk_a[t];
        float sc = attn;
        if (a.history != 0) {
          float* dst =
              a.scores + sg.layer * a.score_layer_stride + sg.head + token_slot(pages, a.bs_shift, j) * a.num_kv_heads;
          if (j < history) sc = a.history == 1 ? fmaxf(attn, a.gamma * *dst) : attn + *dst;
          *dst = sc;
        }
        ibase[j] = sc;
      }
    }
    __syncthreads();  // this chunk's stage, tile and row data are read before the next issue overwrites them
  }
}

// ---------------------------------------------------------------------------------------------------
// Stages 3-5: redundancy (similarity sums), then one finalize pass: softmax over the sequence, pooling,
// final score.

// Block-local similarity works on the upper triangle of each block's Gram matrix (cos is symmetric) in
// 16-token tiles: tb tiles per block (1 when blocks are shorter than a tile, which leaves only the
// diagonal tiles), tb (tb - 1) / 2 off-diagonal tile pairs per block.
__host__ __device__ constexpr int gram_tiles_per_block(int block_size) { return block_size >= 16 ? block_size / 16 : 1; }
// log2 of gram_tiles_per_block for a power-of-two block size (the kernel divides by shifts: tile indices
// are computed per tile product, and a division by a runtime value costs ~20 instructions).
__host__ __device__ constexpr int gram_tile_shift(int bs_shift) { return bs_shift > 4 ? bs_shift - 4 : 0; }
__host__ __device__ constexpr int gram_pairs(int chunk, int block_size) {
  const int tb = gram_tiles_per_block(block_size);
  return chunk / 16 / tb * (tb * (tb - 1) / 2);
}

template <int D>
__host__ __device__ constexpr int block_similarity_smem_bytes(int chunk, int block_size) {
  // keys | 1/norm | newest duplicate | column sums of each off-diagonal tile pair [pairs][16]
  return chunk * (D * 2 + 4 + 8) + gram_pairs(chunk, block_size) * 16 * 4;
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

// Row tile of a chunk handled k-th: inside each block the order 0, tb-1, 1, tb-2, ..., so the two row tiles
// a warp takes at a time (k = 2w, 2w + 1) cost tb + 1 tile products together (the triangle's rows shrink).
__device__ __forceinline__ int gram_row_tile(int k, int tb_shift) {
  const int tb = 1 << tb_shift;
  const int i = k & (tb - 1);
  return (k & ~(tb - 1)) + ((i & 1) ? tb - 1 - (i >> 1) : (i >> 1));
}

// The row tile a warp handles as `which` (0 or 1) of round `round`, or -1 where the chunk has no such tile
// (past its tiles, or past the tokens it holds: `tiles` row tiles).
__device__ __forceinline__ int warp_row_tile(int round, int which, int warp, int chunk, int tb_shift, int tiles) {
  const int k = round * 2 * (kRedThreads / 32) + 2 * warp + which;
  if (k * 16 >= chunk) return -1;
  const int rt = gram_row_tile(k, tb_shift);
  return rt < tiles ? rt : -1;
}

// Column sums of the off-diagonal pair (rt < ct) of one block: slot of the pair in the chunk's table.
__device__ __forceinline__ int gram_pair_index(int rt, int ct, int tb_shift) {
  const int tb = 1 << tb_shift;
  const int rl = rt & (tb - 1), cl = ct & (tb - 1);
  return (rt >> tb_shift) * (tb * (tb - 1) / 2) + cl * (cl - 1) / 2 + rl;
}

// Newest-duplicate candidates of one 16 x 16 cosine tile (c: the accumulator layout of qk_tile, rows
// r0 = row0 + lane / 4 and r0 + 8, columns col0 + 8 nn + 2 (lane % 4) + e), folded into `dup` (chunk-local
// (index + 1) << 32 | cos bits, atomicMax): for each column the largest row with cos > 0.5 and, when
// `transposed`, for each row (as a column of the symmetric matrix) the largest column with cos > 0.5.
// Pairs that do not count are 0 in c.
__device__ __forceinline__ void fold_duplicates(const float (&c)[2][4], int row0, int col0, int lane, bool transposed,
                                                unsigned long long* dup) {
  auto key = [](int index, float cs) {
    return (static_cast<unsigned long long>(index + 1) << 32) | __float_as_uint(cs);
  };
  const int r0 = row0 + (lane >> 2);
#pragma unroll
  for (int nn = 0; nn < 2; ++nn)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      // Column: the lane's newer row first, then the warp's (rows differ in lane bits 2-4).
      const int mine = c[nn][2 + e] > 0.5f ? r0 + 8 : (c[nn][e] > 0.5f ? r0 : -1);
      int best = mine;
#pragma unroll
      for (int o = 4; o < 32; o <<= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
      if (best >= 0 && best == mine)
        atomicMax(&dup[col0 + nn * 8 + 2 * (lane & 3) + e], key(best, best == r0 + 8 ? c[nn][2 + e] : c[nn][e]));
    }
  if (!transposed) return;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    // Row r0 + 8 hr as a column: its newest duplicate among the tile's columns (the lane's 4, then the quad's).
    int mine = -1;
    float cs = 0.0f;
#pragma unroll
    for (int nn = 0; nn < 2; ++nn)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (c[nn][2 * hr + e] > 0.5f) {
          mine = col0 + nn * 8 + 2 * (lane & 3) + e;
          cs = c[nn][2 * hr + e];
        }
    int best = max(mine, __shfl_xor_sync(0xffffffffu, mine, 1));
    best = max(best, __shfl_xor_sync(0xffffffffu, best, 2));
    if (best >= 0 && best == mine) atomicMax(&dup[r0 + 8 * hr], key(best, cs));
  }
}

// Per (segment, chunk of max(256, block_size) tokens): r of every token = the sum of its cosine similarities
// to the other tokens of its block, less the term of each column whose newest duplicate it is.
// Only the upper triangle of each block's Gram matrix is computed: a tile pair (rt < ct) adds to the row
// sums of rt (in registers) and to the column sums of ct (a table in shared memory, summed in a fixed order
// at the end, so the result is deterministic); diagonal tiles are computed whole.
template <int D>
__global__ void __launch_bounds__(kRedThreads, 3) block_similarity_kernel(const compress_args a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kWarps = kRedThreads / 32;
  constexpr int kRounds = 512 / 16 / (2 * kWarps);  // chunks are at most 512 tokens: 32 row tiles
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
  const int tb_shift = gram_tile_shift(a.bs_shift), tb = 1 << tb_shift;  // == gram_tiles_per_block(bs)
  const int tiles = (n + 15) >> 4;         // row tiles holding tokens

  const std::uint32_t sk = smem_addr(smem);
  float* inv_norm = reinterpret_cast<float*>(smem + cf * D * 2);
  unsigned long long* dup = reinterpret_cast<unsigned long long*>(inv_norm + cf);
  float* colsum = reinterpret_cast<float*>(dup + cf);  // [pairs][16]

  load_keys<D, kRedThreads>(a, sg, sk, pages, start, cf, len, tid);  // tokens >= len: zero keys
  cp_async_commit();
  for (int t = tid; t < cf; t += kRedThreads) dup[t] = 0ull;
  cp_async_wait<0>();
  __syncthreads();
  tile_inv_norms<D, kRedThreads>(smem, cf, inv_norm, tid);  // a zero key has similarity 0 to everything
  __syncthreads();

  // Each row's own sum goes to r in the workspace at once (read back by the same lane below): registers held
  // across the Gram loop are what limits this kernel to 80 per thread.
  float* red = a.red + static_cast<std::int64_t>(sh) * a.max_len + start;
  bool had_dup = false;
#pragma unroll
  for (int round = 0; round < kRounds; ++round)
#pragma unroll
    for (int which = 0; which < 2; ++which) {
      const int rt = warp_row_tile(round, which, warp, cf, tb_shift, tiles);
      if (rt < 0) continue;  // warp-uniform
      std::uint32_t qf[D / 16][4];
      load_q_fragments<D>(qf, sk, rt * 16, lane);
      const int r0 = rt * 16 + (lane >> 2);
      const float ri[2] = {inv_norm[r0], inv_norm[r0 + 8]};
      const int ct_end = min(tiles, rt - rt % tb + tb);
      float rs[2] = {0.0f, 0.0f};
      // Pairs (rt, ct > rt) of rt's block: gram_pair_index(rt, ct, tb_shift) = pair_base + cl (cl - 1) / 2.
      const int pair_base = (rt >> tb_shift) * (tb * (tb - 1) / 2) + (rt & (tb - 1));
      // One tile product (rt, ct); the diagonal tile (ct == rt, the first) is its own instantiation, so the
      // off-diagonal ones carry no masking.
      auto tile = [&](int ct, auto diagonal) {
        float c[2][4] = {};
        qk_tile<D, 2>(c, qf, sk, ct * 16, lane);
        const int c0 = ct * 16 + 2 * (lane & 3);
        bool any = false;
#pragma unroll
        for (int nn = 0; nn < 2; ++nn)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float ci = inv_norm[c0 + nn * 8 + e];
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
              float v = c[nn][2 * hr + e] * ri[hr] * ci;
              if constexpr (decltype(diagonal)::value) {  // not a token with itself, nor across blocks (< 16 tokens)
                const int m = r0 + 8 * hr, col = c0 + nn * 8 + e;
                if (m == col || ((m ^ col) >> a.bs_shift) != 0) v = 0.0f;
              }
              c[nn][2 * hr + e] = v;
              rs[hr] += v;
              any |= v > 0.5f;
            }
          }
        if constexpr (!decltype(diagonal)::value) {
          // Column sums over the tile's 16 rows (the lanes of one column differ in bits 2-4), reduce-scattered:
          // the xor-4 step keeps half of a lane's four columns (nn = bit 2), the xor-8 step one (e = bit 3), so
          // lanes 0-15 end with one column each; 4 shuffles instead of 12, the same sums (same pairs added).
          const bool b2 = (lane & 4) != 0, b3 = (lane & 8) != 0;
          const float e0 = __shfl_xor_sync(0xffffffffu, b2 ? c[0][0] + c[0][2] : c[1][0] + c[1][2], 4);
          const float k0 = (b2 ? c[1][0] + c[1][2] : c[0][0] + c[0][2]) + e0;
          const float e1 = __shfl_xor_sync(0xffffffffu, b2 ? c[0][1] + c[0][3] : c[1][1] + c[1][3], 4);
          const float k1 = (b2 ? c[1][1] + c[1][3] : c[0][1] + c[0][3]) + e1;
          float x = b3 ? k1 : k0;
          x += __shfl_xor_sync(0xffffffffu, b3 ? k0 : k1, 8);
          x += __shfl_xor_sync(0xffffffffu, x, 16);
          const int cl = ct & (tb - 1);
          if (lane < 16) colsum[(pair_base + cl * (cl - 1) / 2) * 16 + (b2 ? 8 : 0) + 2 * (lane & 3) + (b3 ? 1 : 0)] = x;
        }
        if (__any_sync(0xffffffffu, any)) {
          had_dup = true;
          fold_duplicates(c, rt * 16, ct * 16, lane, !decltype(diagonal)::value, dup);
        }
      };
      tile(rt, std::true_type{});
      for (int ct = rt + 1; ct < ct_end; ++ct) tile(ct, std::false_type{});
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        rs[hr] += __shfl_xor_sync(0xffffffffu, rs[hr], 1);
        rs[hr] += __shfl_xor_sync(0xffffffffu, rs[hr], 2);
        const int m = rt * 16 + (lane >> 2) + 8 * hr;
        if ((lane & 3) == 0 && m < n) red[m] = rs[hr];
      }
    }
  const bool any_dup = __syncthreads_or(had_dup);

  // r = row sum + the column sums of the pairs above the row's tile - the terms of the columns whose newest
  // duplicate the token is; the four lanes of a quad split the work, then add up in a fixed order.
  const int q = lane & 3;
#pragma unroll
  for (int round = 0; round < kRounds; ++round)
#pragma unroll
    for (int which = 0; which < 2; ++which) {
      const int rt = warp_row_tile(round, which, warp, cf, tb_shift, tiles);
      if (rt < 0) continue;
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int m = rt * 16 + (lane >> 2) + 8 * hr;
        float extra = 0.0f;
        for (int above = rt - rt % tb + q; above < rt; above += 4)
          extra += colsum[gram_pair_index(above, rt, tb_shift) * 16 + (m & 15)];
        if (any_dup) {
          const int b0 = m & ~(bs - 1), b1 = min(n, b0 + bs);  // chunks start on a block boundary
          for (int col = b0 + q; col < b1; col += 4) {
            const unsigned long long d = dup[col];
            if (d != 0ull && static_cast<int>(d >> 32) - 1 == m) extra -= __uint_as_float(static_cast<unsigned>(d));
          }
        }
        extra += __shfl_xor_sync(0xffffffffu, extra, 1);
        extra += __shfl_xor_sync(0xffffffffu, extra, 2);
        if (q == 0 && m < n) red[m] += extra;
      }
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

}  // namespace zipage::cuda::detail
