#pragma once
// The FP8 decode kernel with K and V as the MMAs' A operands (docs/architecture.md, "Decode attention and the power
// cap"). The split-KV kernel (decode_kernel.cuh) puts a group's query heads on the 16 rows of m16n8k16; at 32/8 heads
// 12 of them are padding. Here the rows are tokens (QK) and head-dimension values (PV) and the heads the 8 columns,
// which halves the MMAs per 16-token step and the registers of Q and of the accumulators. FP8 K/V only, head_dim 128,
// groups of up to 8 heads, one split, bf16 output and, when wanted, its FP8 copy. The engine runs it by
// cuda_backend_options::fp8_decode_kernel (automatic: resolve_fp8_decode_kernel's rule); bench_decode_attention's
// decode_fp8_swapped cases measure it, test_cuda_kernels checks it against the CPU reference.
#include "zipage/backend/cuda/append_fp8.cuh"
#include "zipage/backend/cuda/decode_kernel.cuh"
#include "zipage/backend/cuda/wgmma.cuh"

namespace zipage::cuda::detail {

// Pipeline depths: 3 stages and 4 CTAs per multiprocessor (at most 128 registers, and 3 stages of shared memory,
// 52.7 KB, fit 4 times), the default: 1-3% faster and 1-3% fewer joules per pass than 4 stages and 3 CTAs at the
// compressed steady state in three runs (docs/benchmarks.md, 2026-12-03 08:44-09:26).
inline constexpr int kSwappedStages = 3;
template <int STAGES>
inline constexpr int kSwappedMinBlocks = STAGES == 3 ? 4 : 3;
// Q's swizzled bf16 tile: 8 rows (a group of at most 8 heads).
inline constexpr int kSwappedQBytes = 8 * 128 * 2;
template <int STAGES>
inline constexpr int kSwappedSmemBytes = kSwappedQBytes + STAGES * fp8_kv_tile_loader<128, 128>::kStageBytes;

// Q^T's B fragments for the swapped QK MMA, head g (= lane / 4) of the swizzled bf16 Q tile: qb[kk] holds
// d = 32t + 4kk + {0, 1} and + {2, 3} (t = lane % 4; qk_tile_fp8's reduction order), times the warp's power
// of two (load_q_fragments_fp8's ranges). Returns its inverse.
__device__ __forceinline__ float load_qT_fragments_fp8(std::uint32_t (&qb)[8][2], const unsigned char* q_tile, int lane) {
  constexpr int D = 128;
  const int g = lane >> 2, t = lane & 3;
  std::uint32_t w[16];  // bf16 pairs of row g: elements [32t, 32t + 32)
  float amax = 0.0f;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int chunk = 4 * t + c;  // 8 bf16 each
    const uint4 x = *reinterpret_cast<const uint4*>(q_tile + swz<D>(g, chunk));
    const std::uint32_t xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[4 * c + i] = xs[i];
      amax = fmaxf(amax, bf16x2_amax(xs[i]));
    }
  }
  const q_fp16_scale q(warp_max(amax));
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    qb[kk][0] = q.pack(w[2 * kk]);
    qb[kk][1] = q.pack(w[2 * kk + 1]);
  }
  return q.inverse();
}

// The swapped kernel's CTA, one (sequence, KV head), and its thread: what the kernel and its helpers derive from
// blockIdx, threadIdx and the sequence's page-table row.
struct swapped_cta {
  int kvh, seq, end, qhead0;  // KV head, sequence, its KV length, its first query head
  const std::int32_t* pages;  // the sequence's page table
  int warp, lane, g, t;       // g = lane / 4, t = lane % 4
};

__device__ __forceinline__ swapped_cta swapped_cta_of(const decode_args& a) {
  const int kvh = blockIdx.y, seq = blockIdx.z, lane = threadIdx.x & 31;
  return {kvh,  seq, a.kv_len[seq], kvh * a.group, a.page_indices + a.page_indptr[seq], static_cast<int>(threadIdx.x >> 5),
          lane, lane >> 2, lane & 3};
}

// A warp's running state over its tokens: heads 2t, 2t + 1 (the maxima the same in every g after the reductions,
// the sums this thread's tokens only until the epilogue); O^T rows d = 16g + i and 16g + 8 + i of d-tile i.
struct swapped_acc {
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};
  float o[8][4] = {};
  int v_exp = 127;
};

template <int ABLATE, class VChunk>
__device__ __forceinline__ void swapped_softmax_pv(swapped_acc& acc, float (&s)[4], VChunk&& v_chunk, float vs0,
                                                   float vs1, int g, int t);

// One warp's 16 tokens, the kernel's tile body: S^T = K Q^T, the online softmax, O^T += V^T P'^T. k_chunk(half, c):
// the 16 code bytes of chunk 2t + c of the warp's K row g + 8 * half; v_chunk(k): chunk g of its V row
// 2t + (k & 1) + 8 * (k >> 1); zero codes past the end (half, c and k are constants after unrolling, so a kernel
// holding them in registers indexes no local memory). ks0/ks1, vs0/vs1: rows g and g + 8's scales (0 past the end).
// tok0: row g's token. ABLATE: attention.cuh's kAblate* bits (bench_decode_attention's energy ablations only).
template <int ABLATE = kAblateNone, class KChunk, class VChunk>
__device__ __forceinline__ void swapped_tile(swapped_acc& acc, const std::uint32_t (&qb)[8][2], float q_mul,
                                             KChunk&& k_chunk, VChunk&& v_chunk, float ks0, float ks1, float vs0,
                                             float vs1, int tok0, int end, int g, int t) {
  // S^T = K Q^T: rows tokens g, g + 8 of the warp's 16; A = their codes at d = 32t + 16c + 4i + {0..3}.
  float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const uint4 x0 = k_chunk(0, c);
    const uint4 x1 = k_chunk(1, c);
    const std::uint32_t r0[4] = {x0.x, x0.y, x0.z, x0.w}, r1[4] = {x1.x, x1.y, x1.z, x1.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      std::uint32_t fa[4];  // (row g | g + 8) x (d + {0, 1} | d + {2, 3})
      if constexpr ((ABLATE & kAblateConvert) != 0) {
        fa[0] = r0[i], fa[2] = r0[i] >> 8, fa[1] = r1[i], fa[3] = r1[i] >> 8;
      } else {
        e4m3x4_to_f16x4(r0[i], fa[0], fa[2]);
        e4m3x4_to_f16x4(r1[i], fa[1], fa[3]);
      }
      if constexpr ((ABLATE & kAblateQkMma) != 0) fold_bits(s[0], fa[0] ^ fa[1], fa[2] ^ fa[3] ^ qb[4 * c + i][0]);
      else mma_f16(s, fa, qb[4 * c + i][0], qb[4 * c + i][1]);
    }
  }
  ks0 *= q_mul, ks1 *= q_mul;
  s[0] = tok0 < end ? s[0] * ks0 : -INFINITY;
  s[1] = tok0 < end ? s[1] * ks0 : -INFINITY;
  s[2] = tok0 + 8 < end ? s[2] * ks1 : -INFINITY;
  s[3] = tok0 + 8 < end ? s[3] * ks1 : -INFINITY;
  swapped_softmax_pv<ABLATE>(acc, s, v_chunk, vs0, vs1, g, t);
}

// The rest of a warp's tile after S^T: s (scaled to log2 units, -inf past the end; rows tokens g, g + 8, columns
// heads 2t, 2t + 1) into the online softmax, then O^T += V^T P'^T (swapped_tile's v_chunk, vs0, vs1).
template <int ABLATE, class VChunk>
__device__ __forceinline__ void swapped_softmax_pv(swapped_acc& acc, float (&s)[4], VChunk&& v_chunk, float vs0,
                                                   float vs1, int g, int t) {
  // Online softmax per head column: the maximum over the warp's 16 tokens (lanes of equal t).
  float corr[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = fmaxf(s[h], s[h + 2]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
    const float m_new = fmaxf(acc.m[h], mx);
    const float base = m_new == -INFINITY ? 0.0f : m_new;
    corr[h] = fast_exp2(acc.m[h] - base);
    acc.m[h] = m_new;
    s[h] = fast_exp2(s[h] - base);
    s[h + 2] = fast_exp2(s[h + 2] - base);
    acc.l[h] = acc.l[h] * corr[h] + s[h] + s[h + 2];
  }
  // The warp's V scale exponent (normalise_v_scales' rule; the tokens vary with g only).
  std::uint32_t mxv = max(__float_as_uint(vs0), __float_as_uint(vs1));
  mxv = max(mxv, __shfl_xor_sync(0xffffffffu, mxv, 4));
  mxv = max(mxv, __shfl_xor_sync(0xffffffffu, mxv, 8));
  mxv = max(mxv, __shfl_xor_sync(0xffffffffu, mxv, 16));
  float norm;
  const float rescale = v_exponent_step(mxv, acc.v_exp, norm);
  vs0 *= norm, vs1 *= norm;
  const float c0 = corr[0] * rescale, c1 = corr[1] * rescale;
#pragma unroll
  for (int i = 0; i < 8; ++i) acc.o[i][0] *= c0, acc.o[i][1] *= c1, acc.o[i][2] *= c0, acc.o[i][3] *= c1;

  // P'^T's B fragment: lane (g, t) needs head g at tokens 2t, 2t+1, 2t+8, 2t+9. Shuffle j sends each lane's
  // value of token half j >> 1 and head parity (g + j) & 1 and reads lane (2t + ((g + j) & 1), g >> 1); odd g
  // receive each token pair swapped (docs/architecture.md).
  const float pp[4] = {s[0] * vs0, s[1] * vs0, s[2] * vs1, s[3] * vs1};  // (g | g+8) x (2t | 2t+1)
  float recv[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int par = (g + j) & 1;
    const float send = par ? pp[2 * (j >> 1) + 1] : pp[2 * (j >> 1)];  // a select, not a local-memory index
    recv[j] = __shfl_sync(0xffffffffu, send, 4 * (2 * t + par) + (g >> 1));
  }
  const bool odd = (g & 1) != 0;
  const std::uint32_t pb0 = odd ? pack_f16(recv[1], recv[0]) : pack_f16(recv[0], recv[1]);
  const std::uint32_t pb1 = odd ? pack_f16(recv[3], recv[2]) : pack_f16(recv[2], recv[3]);

  // O^T += V^T P'^T: V rows 2t, 2t+1, 2t+8, 2t+9, codes d = 16g .. 16g + 15 (one 16-byte chunk each).
  std::uint32_t r[4][4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint4 x = v_chunk(k);
    r[k][0] = x.x, r[k][1] = x.y, r[k][2] = x.z, r[k][3] = x.w;
  }
#pragma unroll
  for (int wp = 0; wp < 2; ++wp) {
    // top[h][e]: tokens (2t, 2t+1) at d = 16g + 4(wp + 2h) + e; bottom: tokens (2t+8, 2t+9).
    std::uint32_t top[2][4], bottom[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int w = wp + 2 * h;
      const std::uint32_t x[4] = {__byte_perm(r[0][w], r[1][w], 0x5140), __byte_perm(r[0][w], r[1][w], 0x7362),
                                  __byte_perm(r[2][w], r[3][w], 0x5140), __byte_perm(r[2][w], r[3][w], 0x7362)};
      if constexpr ((ABLATE & kAblateConvert) != 0) {
        top[h][0] = x[0], top[h][1] = x[0] >> 8, top[h][2] = x[1], top[h][3] = x[1] >> 8;
        bottom[h][0] = x[2], bottom[h][1] = x[2] >> 8, bottom[h][2] = x[3], bottom[h][3] = x[3] >> 8;
      } else {
        e4m3x4_to_f16x4(x[0], top[h][0], top[h][1]);
        e4m3x4_to_f16x4(x[1], top[h][2], top[h][3]);
        e4m3x4_to_f16x4(x[2], bottom[h][0], bottom[h][1]);
        e4m3x4_to_f16x4(x[3], bottom[h][2], bottom[h][3]);
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {  // d-tile i = 4wp + e: rows d = 16g + i (h 0) and 16g + 8 + i (h 1)
      const std::uint32_t fa[4] = {top[0][e], top[1][e], bottom[0][e], bottom[1][e]};
      if constexpr ((ABLATE & kAblatePvMma) != 0) fold_bits(acc.o[4 * wp + e][0], fa[0] ^ fa[1] ^ pb0, fa[2] ^ fa[3] ^ pb1);
      else mma_f16(acc.o[4 * wp + e], fa, pb0, pb1);
    }
  }
}

// Both kernels' epilogue: the 4 warps' states merged per head (partial outputs through `smem`, [warps][8][D]
// floats, free by now), the bf16 output and, when wanted, its FP8 copy.
__device__ __forceinline__ void swapped_epilogue(const decode_args& a, swapped_acc& acc, unsigned char* smem,
                                                 const swapped_cta& cta) {
  constexpr int D = 128, kThreads = 128;
  __shared__ float s_m[4][8];
  __shared__ float s_l[4][8];
  const auto& [kvh, seq, end, qhead0, pages, warp, lane, g, t] = cta;
  if (a.out_fp8.wanted() && seq == a.num_seqs - 1 && kvh == 0)  // the copy's padding rows, by one CTA
    zero_fp8_copy_padding(a.out_fp8, a.num_seqs, a.num_q_heads * D);
  const float ov = __uint_as_float(static_cast<std::uint32_t>(acc.v_exp) << 23);  // o back to units of 1
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    acc.l[h] += __shfl_xor_sync(0xffffffffu, acc.l[h], 4);
    acc.l[h] += __shfl_xor_sync(0xffffffffu, acc.l[h], 8);
    acc.l[h] += __shfl_xor_sync(0xffffffffu, acc.l[h], 16);
  }
  float* so = reinterpret_cast<float*>(smem);  // [warps][8 heads][D]
  if (g == 0) {
    s_m[warp][2 * t] = acc.m[0], s_m[warp][2 * t + 1] = acc.m[1];
    s_l[warp][2 * t] = acc.l[0], s_l[warp][2 * t + 1] = acc.l[1];
  }
  const auto& o = acc.o;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float* row = so + (warp * 8 + 2 * t + h) * D + 16 * g;
    *reinterpret_cast<float4*>(row) = make_float4(o[0][h] * ov, o[1][h] * ov, o[2][h] * ov, o[3][h] * ov);
    *reinterpret_cast<float4*>(row + 4) = make_float4(o[4][h] * ov, o[5][h] * ov, o[6][h] * ov, o[7][h] * ov);
    *reinterpret_cast<float4*>(row + 8) =
        make_float4(o[0][h + 2] * ov, o[1][h + 2] * ov, o[2][h + 2] * ov, o[3][h + 2] * ov);
    *reinterpret_cast<float4*>(row + 12) =
        make_float4(o[4][h + 2] * ov, o[5][h + 2] * ov, o[6][h + 2] * ov, o[7][h + 2] * ov);
  }
  __syncthreads();

  for (int item = threadIdx.x; item < a.group * (D / 8); item += kThreads) {
    const int h = item / (D / 8), c = item % (D / 8);
    float accum[8], lt;
    merge_warp_states<D>(s_m, s_l, so, h, c, accum, lt);
    const std::int64_t row = std::int64_t{seq} * a.num_q_heads + qhead0 + h;
    const uint4 packed = float_to_bf16x8(accum);
    *reinterpret_cast<uint4*>(a.out + row * D + c * 8) = packed;
    // A head's 16 items are 16 consecutive threads, one half-warp (the copy's group scale is a half-warp's amax).
    if (a.out_fp8.wanted()) store_fp8_copy8(a.out_fp8, seq, a.num_q_heads * D, (qhead0 + h) * D + c * 8, packed);
  }
}

// decode_params::append: warp 0 writes the CTA's (sequence, KV head) of the sequence's new token into the cache
// (append_head_fp8, append_kv's bytes), and the CTA waits for it before any copy reads the cache. The cache is the
// kernel's own to write here: no other CTA reads this head of this sequence's slots. The copies that read the
// token back are cp.async.cg (from L2, past the L1 the stores went through), so the writer fences at device scope
// before the barrier rather than relying on the barrier's CTA-scope ordering alone.
__device__ __forceinline__ void swapped_append(const decode_args& a, const swapped_cta& cta) {
  const decode_append& n = a.append;
  if (!n.wanted()) return;
  if (cta.warp == 0) {
    const std::int64_t slot = n.slots[cta.seq];
    const bf16* k_row = static_cast<const bf16*>(n.k) + cta.seq * n.k_stride + cta.kvh * 128;
    const bf16* v_row = static_cast<const bf16*>(n.v) + cta.seq * n.v_stride + cta.kvh * 128;
    if (slot >= 0)
      append_head_fp8(const_cast<std::uint8_t*>(a.k8), const_cast<std::uint8_t*>(a.v8),
                      const_cast<std::uint16_t*>(a.k_scale), const_cast<std::uint16_t*>(a.v_scale), k_row, v_row, slot,
                      a.num_kv_heads, cta.kvh, cta.lane);
    __threadfence();
  }
  __syncthreads();
}

// Q's bf16 rows of the CTA's (sequence, KV head) into the swizzled tile at `sq` (rows past the group: any valid row).
__device__ __forceinline__ void swapped_load_q(const decode_args& a, std::uint32_t sq, const swapped_cta& cta) {
  constexpr int D = 128;
  const bf16* qsrc = a.q + (std::int64_t{cta.seq} * a.num_q_heads + cta.qhead0) * D;
  for (int c = threadIdx.x; c < 8 * (D / 8); c += 128) {
    const int r = c / (D / 8), ch = c % (D / 8);
    cp_async_16(sq + swz<D>(r, ch), r < a.group ? qsrc + r * D + ch * 8 : qsrc, r < a.group);
  }
}

// Both swapped kernels' start: the new token appended (when wanted), Q's copy to the bf16 tile at sq (it lands with
// the first tile) and the first STAGES - 1 of the ntiles tiles in flight to the stages at skv.
template <int STAGES, class Loader>
__device__ __forceinline__ Loader swapped_start(const decode_args& a, const swapped_cta& cta, std::uint32_t sq,
                                                std::uint32_t skv, int ntiles) {
  swapped_append(a, cta);
  Loader loader(a.k8, a.v8, a.k_scale, a.v_scale, cta.pages, a.num_kv_heads, cta.kvh, a.bs_shift, threadIdx.x);
  loader.prefetch(0, cta.end);
  swapped_load_q(a, sq, cta);
  kv_pipeline_start<STAGES>(loader, skv, 0, cta.end, ntiles);
  return loader;
}

// grid (1, kv_heads, num_seqs); CTA: one (sequence, KV head), its whole cache, up to 8 query heads. Each of the
// 4 warps takes 16 tokens of every 64-token tile, staged in shared memory by a cp.async pipeline of STAGES tiles.
// Thread (g, t): S^T rows (tokens) g and g + 8, columns (heads) 2t and 2t + 1; O^T rows d = 16g + i and
// 16g + 8 + i of d-tile i, the same two heads. ABLATE: as swapped_tile's (kAblateTile: no tile work, the copies stay).
template <int STAGES, int ABLATE = kAblateNone>
__global__ void __launch_bounds__(128, kSwappedMinBlocks<STAGES>) paged_decode_swapped_kernel(const decode_args a) {
  constexpr int D = 128, kThreads = 128, kWarps = 4;
  using loader_t = fp8_kv_tile_loader<D, kThreads>;
  constexpr int kQBytes = kSwappedQBytes;
  static_assert(kWarps * 8 * D * 4 <= kSwappedSmemBytes<STAGES>, "the epilogue's partial outputs reuse the stages");
  extern __shared__ __align__(128) unsigned char smem[];
  const swapped_cta cta = swapped_cta_of(a);
  const auto& [kvh, seq, end, qhead0, pages, warp, lane, g, t] = cta;

  const std::uint32_t sq = smem_addr(smem);
  const std::uint32_t skv = sq + kQBytes;
  const int ntiles = (end + kKvTile - 1) / kKvTile;
  loader_t loader = swapped_start<STAGES, loader_t>(a, cta, sq, skv, ntiles);

  swapped_acc acc;
  std::uint32_t qb[8][2];
  float q_mul = a.scale_log2;

  for (int it = 0; it < ntiles; ++it) {
    kv_pipeline_wait<STAGES>(loader, skv, it, 0, end, ntiles);
    if (it == 0) q_mul *= load_qT_fragments_fp8(qb, smem, lane);
    const int tile_start = it * kKvTile;
    const unsigned char* stage = smem + kQBytes + (it % STAGES) * loader_t::kStageBytes;
    if ((ABLATE & kAblateTile) == 0 && tile_start + warp * 16 < end) {
      const unsigned char* kc = stage + loader_t::kKOffset;
      const unsigned char* vc = stage + loader_t::kVOffset;
      // Rows warp * 16 + g and + 8: their scales at the same place of their words (scale_shift, row mod 2).
      const int sh = scale_shift(g, a.num_kv_heads, kvh);
      const int r0 = warp * 16 + g;
      swapped_tile<ABLATE>(
          acc, qb, q_mul,
          [&](int half, int c) {
            return *reinterpret_cast<const uint4*>(kc + k8_off<D>(warp * 16 + g + 8 * half, 2 * t + c));
          },
          [&](int k) {
            return *reinterpret_cast<const uint4*>(vc + v8_off<D>(warp * 16 + 2 * t + (k & 1) + 8 * (k >> 1), g));
          },
          loader_t::scale(stage, 0, r0, sh), loader_t::scale(stage, 0, r0 + 8, sh), loader_t::scale(stage, 1, r0, sh),
          loader_t::scale(stage, 1, r0 + 8, sh), tile_start + r0, end, g, t);
    }
    __syncthreads();
  }
  cp_async_wait<0>();
  __syncthreads();
  swapped_epilogue(a, acc, smem, cta);
}

// ---- fp8_decode_kernel::swapped_e4m3_qk: S^T = K Q^T as FP8 wgmma ----
// Hopper runs mma.sync on E4M3 operands as fp16 MMAs after converting both (F2FP unpacks in the SASS), so an FP8
// product that spares the conversions and half the MMAs must be a wgmma. The 4 warps are one warpgroup and a tile's
// 64 tokens its M: wgmma.m64n8k32 reads the K codes straight from the stage (stored in the 128-byte swizzle) and Q
// from a [8][128] tile of E4M3 codes (one scale per head, its largest magnitude to 448), and leaves warp w the
// scores of tokens 16w + g, 16w + g + 8 for heads 2t, 2t + 1: the mma.sync kernel's s. The online softmax and
// the PV product (fp16 mma.sync over V's codes from registers) are the other kernel's.
inline constexpr int kSwappedWgmmaStages = 3;
using swapped_wgmma_loader = fp8_kv_tile_loader<128, 128, true>;
// [bf16 Q: kSwappedQBytes][pad to 1024][E4M3 Q: 8 x 128][stages x swapped_wgmma_loader::kStageBytes]
inline constexpr int kSwappedWgmmaSmemBytes =
    kSwappedQBytes + 1024 + 1024 + kSwappedWgmmaStages * swapped_wgmma_loader::kStageBytes;

// Q's rows (the bf16 tile at q_tile) as E4M3 codes into the 128-byte-swizzled tile at generic pointer qe, one scale
// per head; q_inv[h]: the inverse of head h's scale. Thread tid: row tid / 16, its 8 values of chunk tid % 16.
__device__ __forceinline__ void make_q_e4m3(const unsigned char* q_tile, unsigned char* qe, float* q_inv) {
  constexpr int D = 128;
  const int r = threadIdx.x >> 4, ch = threadIdx.x & 15;
  const uint4 x = *reinterpret_cast<const uint4*>(q_tile + swz<D>(r, ch));
  const std::uint32_t xs[4] = {x.x, x.y, x.z, x.w};
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) amax = fmaxf(amax, bf16x2_amax(xs[i]));
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  // A zero row (a padding head) or a non-finite one: unit scale (saturated codes; the reference's inf / NaN do not
  // survive E4M3 rounding of Q).
  const float f = amax > 0.0f && amax <= 3.0e38f ? kFp8E4m3Max / amax : 1.0f;
  std::uint32_t codes[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const auto lo = __nv_cvt_float2_to_fp8x2(
        make_float2(__uint_as_float(xs[2 * i] << 16) * f, __uint_as_float(xs[2 * i] & 0xffff0000u) * f),
        __NV_SATFINITE, __NV_E4M3);
    const auto hi = __nv_cvt_float2_to_fp8x2(
        make_float2(__uint_as_float(xs[2 * i + 1] << 16) * f, __uint_as_float(xs[2 * i + 1] & 0xffff0000u) * f),
        __NV_SATFINITE, __NV_E4M3);
    codes[i] = static_cast<std::uint32_t>(lo) | static_cast<std::uint32_t>(hi) << 16;
  }
  *reinterpret_cast<uint2*>(qe + sw128_off(r, ch >> 1) + (ch & 1) * 8) = make_uint2(codes[0], codes[1]);
  if (ch == 0) q_inv[r] = 1.0f / f;
}

// grid (1, kv_heads, num_seqs), 128 threads: paged_decode_swapped_kernel's CTA, with its QK product as wgmma.
template <int STAGES>
__global__ void __launch_bounds__(128, 4) paged_decode_swapped_wgmma_kernel(const decode_args a) {
#if ZIPAGE_WGMMA_DEVICE
  constexpr int D = 128;
  using loader_t = swapped_wgmma_loader;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ float s_qinv[8];
  const swapped_cta cta = swapped_cta_of(a);
  const auto& [kvh, seq, end, qhead0, pages, warp, lane, g, t] = cta;

  const std::uint32_t sq = smem_addr(smem);
  const std::uint32_t sqe = (sq + kSwappedQBytes + 1023) & ~1023u;
  const std::uint32_t skv = sqe + 1024;
  const int ntiles = (end + kKvTile - 1) / kKvTile;
  loader_t loader = swapped_start<STAGES, loader_t>(a, cta, sq, skv, ntiles);

  swapped_acc acc;
  float q_mul[2] = {a.scale_log2, a.scale_log2};
  for (int it = 0; it < ntiles; ++it) {
    kv_pipeline_wait<STAGES, true>(loader, skv, it, 0, end, ntiles);
    if (it == 0) {  // Q has landed with the first tile
      make_q_e4m3(smem, smem + (sqe - sq), s_qinv);
      wgmma::fence_proxy_async();
      __syncthreads();
      q_mul[0] *= s_qinv[2 * t], q_mul[1] *= s_qinv[2 * t + 1];
    }
    const int tile_start = it * kKvTile;
    const std::uint32_t stage = skv + (it % STAGES) * loader_t::kStageBytes;
    float s[1][4] = {};
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < D / 32; ++kk)
      wgmma::mma_m64n8k32_e4m3_ss(s[0], wgmma::desc_sw128(stage + loader_t::kKOffset + 32 * kk, 16, 1024),
                                  wgmma::desc_sw128(sqe + 32 * kk, 16, 1024), kk > 0);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(s);
    if (tile_start + warp * 16 < end) {
      const unsigned char* st = smem + (stage - sq);
      const unsigned char* vc = st + loader_t::kVOffset;
      const int sh = scale_shift(g, a.num_kv_heads, kvh);  // rows warp * 16 + g and + 8 (row mod 2)
      const int r0 = warp * 16 + g;
      const int tok0 = tile_start + r0;
      const float ks0 = loader_t::scale(st, 0, r0, sh), ks1 = loader_t::scale(st, 0, r0 + 8, sh);
      float sc[4] = {tok0 < end ? s[0][0] * (ks0 * q_mul[0]) : -INFINITY,
                     tok0 < end ? s[0][1] * (ks0 * q_mul[1]) : -INFINITY,
                     tok0 + 8 < end ? s[0][2] * (ks1 * q_mul[0]) : -INFINITY,
                     tok0 + 8 < end ? s[0][3] * (ks1 * q_mul[1]) : -INFINITY};
      swapped_softmax_pv<kAblateNone>(
          acc, sc,
          [&](int k) {
            return *reinterpret_cast<const uint4*>(vc + v8_off<D>(warp * 16 + 2 * t + (k & 1) + 8 * (k >> 1), g));
          },
          loader_t::scale(st, 1, r0, sh), loader_t::scale(st, 1, r0 + 8, sh), g, t);
    }
    __syncthreads();
  }
  cp_async_wait<0>();
  __syncthreads();
  swapped_epilogue(a, acc, smem, cta);
#else
  __trap();  // never launched off sm_90a (paged_decode_attention_swapped checks current_device_runs_sm90a)
#endif
}

}  // namespace zipage::cuda::detail
