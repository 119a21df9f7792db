#pragma once
// Paged decode attention kernel (one query token per sequence, split-KV) and its merge pass.
// The tiles, MMA helpers, online softmax and FP8 K/V path they are built from are in attention.cuh.
#include "zipage/backend/cuda/attention.cuh"
#include "zipage/backend/cuda/attention.hpp"  // decode_params
#include "zipage/backend/cuda/fp8_copy.cuh"

namespace zipage::cuda::detail {

// ---------------------------------------------------------------------------------------------------
// Decode

struct decode_args {
  const bf16* q;
  bf16* out;
  const bf16* k;
  const bf16* v;
  const std::uint8_t* k8;  // FP8 kernels: E4M3 codes and per-(token, KV head) bf16 scales instead of k / v
  const std::uint8_t* v8;
  const std::uint16_t* k_scale;
  const std::uint16_t* v_scale;
  const std::int32_t* page_indptr;
  const std::int32_t* page_indices;
  const std::int32_t* kv_len;
  float* ws_o;    // [seqs][q_heads][num_splits][D]
  float* ws_lse;  // [seqs][q_heads][num_splits]
  int num_q_heads;
  int num_kv_heads;
  int group;        // q_heads / kv_heads
  int head_chunks;  // ceil(group / 16)
  int bs_shift;
  int chunk;  // tokens per split, multiple of kKvTile
  int num_splits;
  float scale_log2;
  fp8_copy out_fp8;  // when wanted (head_dim 128, one split): out's FP8 copy too (decode_params::out_fp8)
  int num_seqs;      // rows of out (out_fp8's padding rows follow them)
  decode_append append;  // the swapped kernels: each sequence's new K/V, written first when wanted
};

// A decode's kernel arguments (FP8 codes and scales when the cache has scales) for a plan of `num_splits` splits of
// `chunk` tokens; the split workspace (ws_o, ws_lse) is the launcher's to set.
inline decode_args make_decode_args(const decode_params& p, int num_splits, int chunk) {
  decode_args a{};
  a.q = static_cast<const bf16*>(p.q);
  a.out = static_cast<bf16*>(p.out);
  const bool fp8 = p.kv.k_scale != nullptr;
  a.k = fp8 ? nullptr : static_cast<const bf16*>(p.kv.k_cache);
  a.v = fp8 ? nullptr : static_cast<const bf16*>(p.kv.v_cache);
  a.k8 = fp8 ? static_cast<const std::uint8_t*>(p.kv.k_cache) : nullptr;
  a.v8 = fp8 ? static_cast<const std::uint8_t*>(p.kv.v_cache) : nullptr;
  a.k_scale = p.kv.k_scale;
  a.v_scale = p.kv.v_scale;
  a.page_indptr = p.kv.page_indptr;
  a.page_indices = p.kv.page_indices;
  a.kv_len = p.kv.kv_len;
  a.num_q_heads = p.num_q_heads;
  a.num_kv_heads = p.kv.num_kv_heads;
  a.group = p.num_q_heads / p.kv.num_kv_heads;
  a.head_chunks = (a.group + 15) / 16;
  while ((1 << a.bs_shift) < p.kv.block_size) ++a.bs_shift;
  a.chunk = chunk;
  a.num_splits = num_splits;
  a.scale_log2 = p.scale * kLog2e;
  a.out_fp8 = p.out_fp8;
  a.num_seqs = p.num_seqs;
  a.append = p.append;
  return a;
}

// Row r's output columns [8c, 8c + 8) merged from a CTA's kWarps partial softmax states: per warp and row the
// running max s_m and sum s_l, and the unnormalised output at so + (w * kRows + r) * D. acc gets the normalised
// values (0 when nothing was attended); returns the max used as the base (0 when none) and, in lt, the sum.
template <int D, int kWarps, int kRows>
__device__ __forceinline__ float merge_warp_states(const float (&s_m)[kWarps][kRows], const float (&s_l)[kWarps][kRows],
                                                   const float* so, int r, int c, float (&acc)[8], float& lt) {
  float mt = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) mt = fmaxf(mt, s_m[w][r]);
  const float base = mt == -INFINITY ? 0.0f : mt;
  lt = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const float wt = fast_exp2(s_m[w][r] - base);
    lt += s_l[w][r] * wt;
    const float4 x0 = *reinterpret_cast<const float4*>(so + (w * kRows + r) * D + c * 8);
    const float4 x1 = *reinterpret_cast<const float4*>(so + (w * kRows + r) * D + c * 8 + 4);
    acc[0] += wt * x0.x, acc[1] += wt * x0.y, acc[2] += wt * x0.z, acc[3] += wt * x0.w;
    acc[4] += wt * x1.x, acc[5] += wt * x1.y, acc[6] += wt * x1.z, acc[7] += wt * x1.w;
  }
  const float inv = lt > 0.0f ? 1.0f / lt : 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] *= inv;
  return base;
}

// Default pipeline depth (64-token K/V tiles in flight per CTA, incl. the one being consumed). FP8 at
// head_dim 128: registers allow 3 CTAs per multiprocessor (kMinBlocks) and 4 stages of 16.5 KB fit 3 times.
template <int D, bool FP8 = false>
inline constexpr int kDecodeDefaultStages = D == 128 && !FP8 ? 3 : 4;

template <int D, int STAGES, bool FP8 = false>
struct decode_config {
  static constexpr int kThreads = 128;  // 4 warps, each takes 16 tokens of every 64-token tile
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kStages = STAGES;
  using loader = kv_loader_t<D, kThreads, FP8>;
  static constexpr int kTileBytes = kKvTile * D * 2;
  static constexpr int kQBytes = 16 * D * 2;
  static constexpr int kSmemBytes = kQBytes + kStages * loader::kStageBytes;
  static constexpr int kCombineBytes = kWarps * 16 * D * 4;
  static_assert(kCombineBytes <= kSmemBytes);
  // Resident CTAs per multiprocessor the register allocation must allow (__launch_bounds__; 0: no bound, the
  // bf16 kernels as tuned). Unbounded, the FP8 kernel at head_dim 128 takes 175 registers (2 CTAs per SM);
  // bounded to 168 it does not spill (ptxas -v) and 3 CTAs fit, as do 3 of its 4-stage shared memory. (4 CTAs,
  // 128 registers, spill.)
  static constexpr int kMinBlocks = FP8 ? 3 : 0;
};

// grid (num_splits, kv_heads * head_chunks, num_seqs). CTA: one KV split of one (sequence, KV head)
// for up to 16 query heads of its group. ABLATE (FP8 only; attention.cuh's kAblate* bits): bench_decode_attention's
// energy ablations, never launched by the library.
template <int D, int STAGES, bool FP8 = false, int ABLATE = kAblateNone>
__global__ void __launch_bounds__(decode_config<D, STAGES, FP8>::kThreads, decode_config<D, STAGES, FP8>::kMinBlocks)
    paged_decode_kernel(const decode_args a) {
  static_assert(ABLATE == kAblateNone || FP8, "the energy ablations are of the FP8 path");
  using cfg = decode_config<D, STAGES, FP8>;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ float s_m[cfg::kWarps][16];
  __shared__ float s_l[cfg::kWarps][16];

  // Let the merge kernel (launched with programmatic stream serialisation) start its launch now; it
  // waits for this grid's completion in griddepcontrol.wait before reading anything.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  const int split = blockIdx.x;
  const int kvh = blockIdx.y / a.head_chunks;
  const int g0 = (blockIdx.y % a.head_chunks) * 16;
  const int seq = blockIdx.z;
  const int len = a.kv_len[seq];
  const std::int32_t page_base = a.page_indptr[seq];  // issued together with kv_len (one round trip)
  const int seq_splits = max(1, (len + a.chunk - 1) / a.chunk);
  if (split >= seq_splits) return;
  const int start = split * a.chunk;
  const int end = min(len, start + a.chunk);
  const int rows = min(16, a.group - g0);
  const int qhead0 = kvh * a.group + g0;

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;

  const std::uint32_t sq = smem_addr(smem);
  const std::uint32_t skv = sq + cfg::kQBytes;

  auto loader = [&] {
    if constexpr (FP8)
      return typename cfg::loader(a.k8, a.v8, a.k_scale, a.v_scale, a.page_indices + page_base, a.num_kv_heads, kvh,
                                  a.bs_shift, tid);
    else
      return typename cfg::loader(a.k, a.v, a.page_indices + page_base, a.num_kv_heads, kvh, a.bs_shift, tid);
  }();
  loader.prefetch(start, end);

  // Q rows (zero beyond the group) join the first copy group.
  const bf16* qsrc = a.q + (std::int64_t{seq} * a.num_q_heads + qhead0) * D;
  for (int c = tid; c < 16 * (D / 8); c += cfg::kThreads) {
    const int r = c / (D / 8), ch = c % (D / 8);
    cp_async_16(sq + swz<D>(r, ch), r < rows ? qsrc + r * D + ch * 8 : qsrc, r < rows);
  }

  const int ntiles = (end - start + kKvTile - 1) / kKvTile;
  kv_pipeline_start<cfg::kStages>(loader, skv, start, end, ntiles);

  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};
  float o[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  std::uint32_t qf[D / 16][4];
  float q_mul = a.scale_log2;  // FP8: scale_log2 / Q's power of two (load_q_fragments_fp8)
  int v_exp = 127;             // FP8: o is in units of 2^(v_exp - 127) (normalise_v_scales)

  for (int it = 0; it < ntiles; ++it) {
    kv_pipeline_wait<cfg::kStages>(loader, skv, it, start, end, ntiles);
    if constexpr (FP8) {
      if (it == 0) q_mul *= load_q_fragments_fp8<D>(qf, smem, 0, lane);
      const int tile_start = start + it * kKvTile;
      const unsigned char* stage = smem + cfg::kQBytes + (it % cfg::kStages) * cfg::loader::kStageBytes;
      // (this warp's 16 tokens are not all past the end)
      if ((ABLATE & kAblateTile) == 0 && tile_start + warp * 16 < end) {
        float s[2][4] = {};
        qk_tile_fp8<D, 2, ABLATE>(s, qf, stage + cfg::loader::kKOffset, warp * 16, lane);
        // This thread's tokens: warp*16 + 8n + 2t + {0, 1}; their scales are at the same places of their words
        // for every n (scale_shift depends on the row modulo 2).
        const std::uint32_t* words =
            reinterpret_cast<const std::uint32_t*>(stage + cfg::loader::kScaleOffset) + warp * 16 + 2 * (lane & 3);
        const int sh0 = scale_shift(2 * (lane & 3), a.num_kv_heads, kvh);
        const int sh1 = scale_shift(2 * (lane & 3) + 1, a.num_kv_heads, kvh);
        float ks[2][2], vs[2][2];
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const uint2 k2 = *reinterpret_cast<const uint2*>(words + 8 * n);
          const uint2 v2 = *reinterpret_cast<const uint2*>(words + kKvTile + 8 * n);
          ks[n][0] = scale_in_word(k2.x, sh0) * q_mul, ks[n][1] = scale_in_word(k2.y, sh1) * q_mul;
          vs[n][0] = scale_in_word(v2.x, sh0), vs[n][1] = scale_in_word(v2.y, sh1);
        }
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int tok = tile_start + warp * 16 + n * 8 + 2 * (lane & 3) + (e & 1);
            s[n][e] = tok < end ? s[n][e] * ks[n][e & 1] : -INFINITY;
          }
        const float o_rescale = normalise_v_scales<2>(vs, v_exp);
        softmax_step<D, 2>(s, m, l, o, o_rescale);
        pv_tile_fp8<D, 2, ABLATE>(o, s, vs, stage + cfg::loader::kVOffset, warp * 16, lane);
      }
    } else {  // (statement order as tuned: it changes the bf16 kernels' register allocation)
      if (it == 0) load_q_fragments<D>(qf, sq, 0, lane);
      std::uint32_t sk, sv;
      loader.tile(skv + (it % cfg::kStages) * cfg::loader::kStageBytes, sk, sv);
      const int tile_start = start + it * kKvTile;
      if (tile_start + warp * 16 < end) {  // this warp's 16 tokens are not all past the end
        float s[2][4] = {};
        qk_tile<D, 2>(s, qf, sk, warp * 16, lane);
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int tok = tile_start + warp * 16 + n * 8 + 2 * (lane & 3) + (e & 1);
            s[n][e] = tok < end ? s[n][e] * a.scale_log2 : -INFINITY;
          }
        softmax_step<D, 2>(s, m, l, o);
        pv_tile<D, 2>(o, s, sv, warp * 16, lane);
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();
  __syncthreads();
  if constexpr (FP8) {  // o back to units of 1
    const float ov = __uint_as_float(static_cast<std::uint32_t>(v_exp) << 23);
#pragma unroll
    for (int j = 0; j < D / 8; ++j) o[j][0] *= ov, o[j][1] *= ov, o[j][2] *= ov, o[j][3] *= ov;
  }

  // Combine the four warps' partial softmax states through shared memory.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  float* so = reinterpret_cast<float*>(smem);  // [warps][16][D]
  const int g = lane >> 2, t = lane & 3;
  if (t == 0) {
    s_m[warp][g] = m[0];
    s_m[warp][g + 8] = m[1];
    s_l[warp][g] = l[0];
    s_l[warp][g + 8] = l[1];
  }
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    *reinterpret_cast<float2*>(so + (warp * 16 + g) * D + j * 8 + 2 * t) = make_float2(o[j][0], o[j][1]);
    *reinterpret_cast<float2*>(so + (warp * 16 + g + 8) * D + j * 8 + 2 * t) = make_float2(o[j][2], o[j][3]);
  }
  __syncthreads();

  if constexpr (D == 128)  // the copy's padding rows: by one CTA, the last sequence's first
    if (a.out_fp8.wanted() && seq == a.num_seqs - 1 && blockIdx.y == 0 && split == 0)
      zero_fp8_copy_padding(a.out_fp8, a.num_seqs, a.num_q_heads * D);

  const bool direct = seq_splits == 1;
  for (int item = tid; item < rows * (D / 8); item += cfg::kThreads) {
    const int r = item / (D / 8), c = item % (D / 8);
    float acc[8], lt;
    const float base = merge_warp_states<D>(s_m, s_l, so, r, c, acc, lt);
    const std::int64_t row = std::int64_t{seq} * a.num_q_heads + qhead0 + r;
    if constexpr (FP8) {
      // so holds the PV MMA's column order (pv_tile_fp8): so[.][8j + i] is output column i * D/8 + j, so
      // acc[i] is column i * D/8 + c. Per store instruction a warp's lanes (consecutive c) write consecutive
      // columns.
      if (direct) {
        float rounded[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const bf16 b = __float2bfloat16_rn(acc[i]);
          a.out[row * D + i * (D / 8) + c] = b;
          rounded[i] = __bfloat162float(b);
        }
        // A head's 16 items (c = 0..15) are one half-warp's lanes: kThreads and rows * D/8 are multiples of 16.
        if constexpr (D == 128)
          if (a.out_fp8.wanted()) store_fp8_copy_strided8(a.out_fp8, seq, a.num_q_heads * D, (qhead0 + r) * D, rounded);
      } else {
        float* dst = a.ws_o + (row * a.num_splits + split) * D + c;
#pragma unroll
        for (int i = 0; i < 8; ++i) dst[i * (D / 8)] = acc[i];
        if (c == 0) a.ws_lse[row * a.num_splits + split] = lt > 0.0f ? base + __log2f(lt) : -INFINITY;
      }
    } else if (direct) {
      const uint4 packed = float_to_bf16x8(acc);
      *reinterpret_cast<uint4*>(a.out + row * D + c * 8) = packed;
      if constexpr (D == 128)
        if (a.out_fp8.wanted()) store_fp8_copy8(a.out_fp8, seq, a.num_q_heads * D, (qhead0 + r) * D + c * 8, packed);
    } else {
      float* dst = a.ws_o + (row * a.num_splits + split) * D + c * 8;
      *reinterpret_cast<float4*>(dst) = make_float4(acc[0], acc[1], acc[2], acc[3]);
      *reinterpret_cast<float4*>(dst + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
      if (c == 0) a.ws_lse[row * a.num_splits + split] = lt > 0.0f ? base + __log2f(lt) : -INFINITY;
    }
  }
}

inline constexpr int kMaxDecodeSplits = 256;

// One 256-thread CTA per (sequence, query head): merges the splits of sequences that used more than
// one. Threads spread over (split group, float4 of the row) so the partial rows are read in parallel.
template <int D>
__global__ void __launch_bounds__(256) decode_merge_kernel(const decode_args a) {
  // Launched with programmatic stream serialisation: wait until the decode grid has completed and its
  // writes are visible (a no-op for a normal launch).
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  constexpr int kThreads = 256;
  constexpr int kVecs = D / 4;               // float4 vectors per row
  constexpr int kGroups = kThreads / kVecs;  // splits processed side by side
  __shared__ float s_w[kMaxDecodeSplits];
  __shared__ float4 s_acc[kGroups][kVecs];
  __shared__ float s_red[2][kThreads / 32];

  const std::int64_t row = blockIdx.x;  // sequence * q_heads + head
  const int seq = static_cast<int>(row / a.num_q_heads);
  const int len = a.kv_len[seq];
  const int seq_splits = max(1, (len + a.chunk - 1) / a.chunk);
  if (seq_splits == 1) return;  // written directly by the decode kernel
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  const float* lse = a.ws_lse + row * a.num_splits;
  float mx = -INFINITY;
  for (int i = tid; i < seq_splits; i += kThreads) mx = fmaxf(mx, lse[i]);
  mx = warp_max(mx);
  if (lane == 0) s_red[0][warp] = mx;
  __syncthreads();
  mx = s_red[0][0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) mx = fmaxf(mx, s_red[0][w]);
  const float base = mx == -INFINITY ? 0.0f : mx;
  float den = 0.0f;
  for (int i = tid; i < seq_splits; i += kThreads) {
    const float w = fast_exp2(lse[i] - base);
    s_w[i] = w;
    den += w;
  }
  den = warp_sum(den);
  if (lane == 0) s_red[1][warp] = den;
  __syncthreads();
  den = 0.0f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) den += s_red[1][w];

  const int c = tid % kVecs, grp = tid / kVecs;
  const float* po = a.ws_o + row * a.num_splits * D + c * 4;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
  for (int i = grp; i < seq_splits; i += kGroups) {
    const float w = s_w[i];
    const float4 x = *reinterpret_cast<const float4*>(po + std::int64_t{i} * D);
    acc.x += w * x.x, acc.y += w * x.y, acc.z += w * x.z, acc.w += w * x.w;
  }
  s_acc[grp][c] = acc;
  __syncthreads();
  if (grp == 0) {
#pragma unroll
    for (int g = 1; g < kGroups; ++g) {
      const float4 y = s_acc[g][c];
      acc.x += y.x, acc.y += y.y, acc.z += y.z, acc.w += y.w;
    }
    const float inv = den > 0.0f ? 1.0f / den : 0.0f;
    *reinterpret_cast<uint2*>(a.out + row * D + c * 4) =
        make_uint2(pack_bf16(acc.x * inv, acc.y * inv), pack_bf16(acc.z * inv, acc.w * inv));
  }
}

}  // namespace zipage::cuda::detail
