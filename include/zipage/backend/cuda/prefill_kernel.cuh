#pragma once
// Paged prefill attention kernel (chunked prefill: causal over earlier chunks and the new tokens).
// The tiles, MMA helpers, online softmax and FP8 K/V path they are built from are in attention.cuh.
#include "zipage/backend/cuda/attention.cuh"
#include "zipage/backend/cuda/dtype.hpp"  // cuda_stream
#include "zipage/backend/cuda/kernel_variant.hpp"  // prefill_kernel

namespace zipage::cuda::detail {

// ---------------------------------------------------------------------------------------------------
// Prefill

struct prefill_args {
  const bf16* q;
  bf16* out;
  const bf16* k;
  const bf16* v;
  const std::uint8_t* k8;  // FP8 kernels (as decode_args)
  const std::uint8_t* v8;
  const std::uint16_t* k_scale;
  const std::uint16_t* v_scale;
  const std::int32_t* q_indptr;
  const std::int32_t* token_kv_len;
  const std::int32_t* page_indptr;
  const std::int32_t* page_indices;
  int num_seqs;
  int num_q_heads;
  int num_kv_heads;
  int group;            // q_heads / kv_heads (<= 64)
  int tokens_per_tile;  // 64 / group
  int bs_shift;
  float scale_log2;
};

// A CTA's query tile: tokens [tok0, tok0 + ntok) of sequence `seq`, whose first query row is qoff; `rows`
// = ntok x group MMA rows.
struct query_tile {
  int seq, qoff, tok0, ntok, rows;
};

// Which query tile the CTA with index `target` owns, tiles of a.tokens_per_tile tokens counted over the
// sequences in order: a warp-wide scan over the sequences' tile counts (every warp computes the same answer).
// False past the last tile. The longest-KV tiles of a sequence come first, so they start first.
__device__ __forceinline__ bool locate_query_tile(const prefill_args& a, int target, int lane, query_tile& q) {
  const int tq = a.tokens_per_tile;
  int seq = -1, tile = 0, seq_tiles = 0;
  for (int base = 0; base < a.num_seqs; base += 32) {
    const int s = base + lane;
    const int n = s < a.num_seqs ? a.q_indptr[s + 1] - a.q_indptr[s] : 0;
    const int cnt = (n + tq - 1) / tq;
    int incl = cnt;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    const int total = __shfl_sync(0xffffffffu, incl, 31);
    if (target < total) {
      const unsigned hit = __ballot_sync(0xffffffffu, target < incl);
      const int f = __ffs(hit) - 1;
      const int f_incl = __shfl_sync(0xffffffffu, incl, f);
      const int f_cnt = __shfl_sync(0xffffffffu, cnt, f);
      seq = base + f;
      seq_tiles = f_cnt;
      tile = target - (f_incl - f_cnt);
      break;
    }
    target -= total;
  }
  if (seq < 0) return false;
  tile = seq_tiles - 1 - tile;
  q.seq = seq;
  q.qoff = a.q_indptr[seq];
  q.tok0 = tile * tq;
  q.ntok = min(tq, a.q_indptr[seq + 1] - q.qoff - q.tok0);
  q.rows = q.ntok * a.group;
  return true;
}

// Chunk ch (8 values) of query row r of the tile: token r / group, head r % group of KV head kvh; nullptr for a
// padding row (r >= rows).
template <int D>
__device__ __forceinline__ const bf16* q_chunk(const prefill_args& a, const query_tile& qt, int kvh, int r, int ch) {
  if (r >= qt.rows) return nullptr;
  const int tk = r / a.group, h = r % a.group;
  return a.q + ((std::int64_t{qt.qoff} + qt.tok0 + tk) * a.num_q_heads + kvh * a.group + h) * D + ch * 8;
}

// Launches the wgmma kernel (prefill_wgmma.cu: paged_prefill_wgmma_kernel) over the query tiles of `a` (with its own
// tile height, whatever a.tokens_per_tile says).
void launch_prefill_wgmma(const prefill_args& a, int num_tokens, cuda_stream stream);

template <int D, bool FP8 = false>
struct prefill_config {
  static constexpr int kThreads = 128;  // 4 warps x 16 query rows
  static constexpr int kRows = 64;
  static constexpr int kStages = 2;
  using loader = kv_loader_t<D, kThreads, FP8>;
  static constexpr int kTileBytes = kKvTile * D * 2;
  static constexpr int kQBytes = kRows * D * 2;
  static constexpr int kSmemBytes = kQBytes + kStages * loader::kStageBytes;
};

// grid (upper bound on query tiles, kv_heads). A query tile: tokens_per_tile consecutive new tokens of
// one sequence x the `group` query heads of one KV head, packed token-major into 64 MMA rows.
template <int D, bool FP8 = false>
__global__ void __launch_bounds__(prefill_config<D, FP8>::kThreads) paged_prefill_kernel(const prefill_args a) {
  using cfg = prefill_config<D, FP8>;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int s_kv_max, s_kv_min;

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int kvh = blockIdx.y;

  query_tile qt;
  if (!locate_query_tile(a, blockIdx.x, lane, qt)) return;
  const int seq = qt.seq, qoff = qt.qoff, tok0 = qt.tok0, ntok = qt.ntok, rows = qt.rows;

  if (tid == 0) {
    s_kv_max = 0;
    s_kv_min = INT_MAX;
  }
  __syncthreads();
  if (tid < ntok) {
    const int L = a.token_kv_len[qoff + tok0 + tid];
    atomicMax(&s_kv_max, L);
    atomicMin(&s_kv_min, L);
  }

  const std::uint32_t sq = smem_addr(smem);
  const std::uint32_t skv = sq + cfg::kQBytes;

  // Q rows: row r = token (r / group) x head (r % group) of this KV group.
  for (int c = tid; c < cfg::kRows * (D / 8); c += cfg::kThreads) {
    const int r = c / (D / 8), ch = c % (D / 8);
    const bf16* src = q_chunk<D>(a, qt, kvh, r, ch);
    cp_async_16(sq + swz<D>(r, ch), src != nullptr ? src : a.q, src != nullptr);
  }
  __syncthreads();
  const int kv_end = s_kv_max;
  const int kv_min = s_kv_min;

  // Lengths of this thread's two rows (0 for padding rows: fully masked).
  const int g = lane >> 2, t = lane & 3;
  int row_len[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp * 16 + g + 8 * r;
    row_len[r] = row < rows ? a.token_kv_len[qoff + tok0 + row / a.group] : 0;
  }
  int warp_len = max(row_len[0], row_len[1]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) warp_len = max(warp_len, __shfl_xor_sync(0xffffffffu, warp_len, o));

  auto loader = [&] {
    if constexpr (FP8)
      return typename cfg::loader(a.k8, a.v8, a.k_scale, a.v_scale, a.page_indices + a.page_indptr[seq], a.num_kv_heads,
                                  kvh, a.bs_shift, tid);
    else
      return typename cfg::loader(a.k, a.v, a.page_indices + a.page_indptr[seq], a.num_kv_heads, kvh, a.bs_shift, tid);
  }();
  loader.prefetch(0, kv_end);
  const int ntiles = (kv_end + kKvTile - 1) / kKvTile;
  kv_pipeline_start<cfg::kStages>(loader, skv, 0, kv_end, ntiles);

  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};
  float o[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  std::uint32_t qf[D / 16][4];
  float q_mul = a.scale_log2;  // FP8: as in the decode kernel
  int v_exp = 127;

  for (int it = 0; it < ntiles; ++it) {
    kv_pipeline_wait<cfg::kStages>(loader, skv, it, 0, kv_end, ntiles);
    if constexpr (FP8) {
      if (it == 0) q_mul *= load_q_fragments_fp8<D>(qf, smem, warp * 16, lane);
      const int tile_start = it * kKvTile;
      const unsigned char* stage = smem + cfg::kQBytes + (it % cfg::kStages) * cfg::loader::kStageBytes;
      if (tile_start < warp_len) {
        constexpr int NT = kKvTile / 8;
        float s[NT][4] = {};
        qk_tile_fp8<D, NT>(s, qf, stage + cfg::loader::kKOffset, 0, lane);
        // This thread's tokens: 8n + 2t + {0, 1}, their scales at the same places of their words for every n
        // (scale_shift depends on the row modulo 2).
        const std::uint32_t* words = reinterpret_cast<const std::uint32_t*>(stage + cfg::loader::kScaleOffset) + 2 * t;
        const int sh0 = scale_shift(2 * t, a.num_kv_heads, kvh), sh1 = scale_shift(2 * t + 1, a.num_kv_heads, kvh);
        const bool mask = tile_start + kKvTile > kv_min;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint2 k2 = *reinterpret_cast<const uint2*>(words + 8 * nt);
          const float km[2] = {scale_in_word(k2.x, sh0) * q_mul, scale_in_word(k2.y, sh1) * q_mul};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = tile_start + nt * 8 + 2 * t + (e & 1);
            s[nt][e] = !mask || col < row_len[e >> 1] ? s[nt][e] * km[e & 1] : -INFINITY;
          }
        }
        float vs[NT][2];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint2 v2 = *reinterpret_cast<const uint2*>(words + kKvTile + 8 * nt);
          vs[nt][0] = scale_in_word(v2.x, sh0), vs[nt][1] = scale_in_word(v2.y, sh1);
        }
        const float o_rescale = normalise_v_scales<NT>(vs, v_exp);
        softmax_step<D, NT>(s, m, l, o, o_rescale);
        pv_tile_fp8<D, NT>(o, s, vs, stage + cfg::loader::kVOffset, 0, lane);
      }
    } else {  // (statement order as tuned: it changes the bf16 kernels' register allocation)
      if (it == 0) load_q_fragments<D>(qf, sq, warp * 16, lane);
      const int tile_start = it * kKvTile;
      std::uint32_t sk, sv;
      loader.tile(skv + (it % cfg::kStages) * cfg::loader::kStageBytes, sk, sv);
      if (tile_start < warp_len) {
        float s[kKvTile / 8][4] = {};
        qk_tile<D, kKvTile / 8>(s, qf, sk, 0, lane);
        if (tile_start + kKvTile > kv_min) {
#pragma unroll
          for (int nt = 0; nt < kKvTile / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int col = tile_start + nt * 8 + 2 * t + (e & 1);
              s[nt][e] = col < row_len[e >> 1] ? s[nt][e] * a.scale_log2 : -INFINITY;
            }
        } else {
#pragma unroll
          for (int nt = 0; nt < kKvTile / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] *= a.scale_log2;
        }
        softmax_step<D, kKvTile / 8>(s, m, l, o);
        pv_tile<D, kKvTile / 8>(o, s, sv, 0, lane);
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int row = warp * 16 + g + 8 * r;
    if (row >= rows) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    const int tk = row / a.group, h = row % a.group;
    bf16* out_row = a.out + ((std::int64_t{qoff} + tok0 + tk) * a.num_q_heads + kvh * a.group + h) * D;
    if constexpr (FP8) {
      // o[j][2r + e] is output column (2t + e) * D/8 + j (pv_tile_fp8), in units of 2^(v_exp - 127).
      const float sc = inv * __uint_as_float(static_cast<std::uint32_t>(v_exp) << 23);
#pragma unroll
      for (int e = 0; e < 2; ++e)
#pragma unroll
        for (int j = 0; j < D / 8; j += 8) {
          float x[8];
#pragma unroll
          for (int i = 0; i < 8; ++i) x[i] = o[j + i][2 * r + e] * sc;
          *reinterpret_cast<uint4*>(out_row + (2 * t + e) * (D / 8) + j) = float_to_bf16x8(x);
        }
    } else {
      bf16* dst = out_row + 2 * t;
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
        *reinterpret_cast<std::uint32_t*>(dst + j * 8) = pack_bf16(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
    }
  }
}

}  // namespace zipage::cuda::detail
