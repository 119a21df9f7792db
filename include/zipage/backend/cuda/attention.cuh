#pragma once
// Paged attention kernels (decode and prefill) for bf16 K/V with fp32 softmax and accumulation.
//
// Both kernels work on the same building blocks:
//  * K/V tiles of 64 tokens of one KV head, gathered through the page table with 16-byte cp.async
//    copies (several tiles in flight), stored in shared memory with an XOR swizzle of the 16-byte
//    chunks so that ldmatrix reads are free of bank conflicts;
//  * tensor-core products (mma.sync m16n8k16, bf16 in, fp32 out): S = Q K^T with K fragments from
//    ldmatrix, O += P V with V fragments from ldmatrix.trans, P re-packed from the S accumulators;
//  * an online softmax in the log2 domain (scores pre-multiplied by scale*log2(e)).
// The query rows of one MMA tile are the query heads of one KV group (decode) or tokens x heads of
// one KV group (prefill), so each K/V byte is read once per group (GQA).
//
// FP8 K/V (E4M3 codes + one fp32 scale per token and KV head, docs/fp8.md): the same pipeline carries
// the codes and scales of each 64-token tile into shared memory (half the bytes of bf16); each warp converts
// the codes it needs exactly to fp16 straight into its MMA fragments (fp16 MMAs, Q converted once per CTA),
// and the scales are applied in fp32 to the scores (K) and to the probabilities (V): "FP8 K/V" below.
#include <climits>
#include <type_traits>

#include "zipage/backend/cuda/common.cuh"
#include "zipage/backend/cuda/fp8.cuh"

namespace zipage::cuda::detail {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr int kKvTile = 64;  // tokens per K/V tile

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled [rows][D] bf16 shared-memory tile.
template <int D>
__device__ __forceinline__ std::uint32_t swz(int row, int chunk) {
  constexpr int kChunks = D / 8;
  return static_cast<std::uint32_t>((row * kChunks + (chunk ^ (row & 7))) * 16);
}

// Gathers 64-token K/V tiles of one (sequence, KV head) into shared memory. Thread `tid` copies chunk
// tid % (D/8) of rows tid / (D/8) + i * (THREADS / (D/8)). The page ids of a tile (at most 32 since the
// block size is >= 2) are loaded one per lane, one tile ahead (prefetch), and shuffled to the threads.
template <int D, int THREADS>
struct kv_tile_loader {
  static constexpr int kChunks = D / 8;
  static constexpr int kRowsPerPass = THREADS / kChunks;
  static constexpr int kPasses = kKvTile / kRowsPerPass;
  static_assert(THREADS % kChunks == 0 && kKvTile % kRowsPerPass == 0);

  const bf16* k;
  const bf16* v;
  const std::int32_t* pages;
  std::int64_t token_stride;
  int bs_shift;
  int lane;
  int part;
  int row0;
  std::int32_t next_page = 0;

  __device__ kv_tile_loader(const bf16* k_cache, const bf16* v_cache, const std::int32_t* seq_pages, int num_kv_heads,
                            int kv_head, int block_shift, int tid)
      : k(k_cache + kv_head * D),
        v(v_cache + kv_head * D),
        pages(seq_pages),
        token_stride(std::int64_t{num_kv_heads} * D),
        bs_shift(block_shift),
        lane(tid & 31),
        part(tid % kChunks),
        row0(tid / kChunks) {}

  // Loads (asynchronously, into a register) the page ids the tile starting at tile_start needs.
  __device__ __forceinline__ void prefetch(int tile_start, int end) {
    const int first = tile_start >> bs_shift;
    const int last = (min(tile_start + kKvTile, end) - 1) >> bs_shift;
    const int p = first + lane;
    next_page = (tile_start < end && p <= last) ? __ldg(pages + p) : 0;
  }

  // Shared-memory bytes of one pipeline stage (K then V).
  static constexpr int kStageBytes = 2 * kKvTile * D * 2;

  // The bf16 K and V tiles of a stage that has landed (nothing to do for bf16).
  __device__ __forceinline__ void tile(std::uint32_t stage, std::uint32_t& sk, std::uint32_t& sv) const {
    sk = stage;
    sv = stage + kKvTile * D * 2;
  }

  // Issues the copies of the tile starting at tile_start (tokens >= end are zero-filled) into the stage
  // at `stage`; the page ids must have been prefetched for this tile.
  __device__ __forceinline__ void issue(std::uint32_t stage, int tile_start, int end) const {
    const std::uint32_t sk = stage, sv = stage + kKvTile * D * 2;
    const int first = tile_start >> bs_shift;
    const int mask = (1 << bs_shift) - 1;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int row = row0 + i * kRowsPerPass;
      const int tok = tile_start + row;
      const bool valid = tok < end;
      const std::int32_t page = __shfl_sync(0xffffffffu, next_page, ((tok >> bs_shift) - first) & 31);
      const std::int64_t off =
          ((static_cast<std::int64_t>(page) << bs_shift) | (tok & mask)) * token_stride + part * 8;
      const std::uint32_t so = swz<D>(row, part);
      cp_async_16(sk + so, valid ? k + off : k, valid);
      cp_async_16(sv + so, valid ? v + off : v, valid);
    }
  }
};

// Byte offset of 16-byte chunk `chunk` of token row `row` in a [64][D] tile of FP8 codes. The XOR swizzles
// make the fragment loads of qk_tile_fp8 (K: a thread reads rows g, g+1 ... at chunks of t) and pv_tile_fp8
// (V: rows 2t, 2t+1, 2t+8, 2t+9 at chunk g) free of bank conflicts (head_dim 64 V: 2-way, the 8-byte reads
// of 16 lanes fall in 64 bytes of banks).
template <int D>
__device__ __forceinline__ std::uint32_t k8_off(int row, int chunk) {
  return static_cast<std::uint32_t>(row * D + ((D == 128 ? chunk ^ (row & 1) : chunk) << 4));
}
template <int D>
__device__ __forceinline__ std::uint32_t v8_off(int row, int chunk) {
  const int x = (row >> 1) & 3;
  return static_cast<std::uint32_t>(row * D + ((chunk ^ (D == 128 ? x << 1 : x)) << 4));
}

// The FP8 counterpart of kv_tile_loader: a stage holds the tile's K codes [64][D] (k8_off), V codes [64][D]
// (v8_off) and K, V scales [64] each (16-byte copies of codes, 4-byte copies of scales, zero-filled past
// the end). The MMAs read the codes from the stage directly (qk_tile_fp8, pv_tile_fp8): no second tile.
template <int D, int THREADS>
struct fp8_kv_tile_loader {
  static constexpr int kChunks = D / 16;  // 16-byte chunks of codes per row
  static constexpr int kRowsPerPass = THREADS / kChunks;
  static constexpr int kPasses = kKvTile / kRowsPerPass;
  static_assert(THREADS % kChunks == 0 && kKvTile % kRowsPerPass == 0 && THREADS >= 2 * kKvTile);
  static constexpr int kCodeBytes = kKvTile * D;
  static constexpr int kKOffset = 0;                   // K codes
  static constexpr int kVOffset = kCodeBytes;          // V codes
  static constexpr int kScaleOffset = 2 * kCodeBytes;  // K scales [64], then V scales [64]
  static constexpr int kStageBytes = 2 * kCodeBytes + 2 * kKvTile * 4;

  const std::uint8_t* k;
  const std::uint8_t* v;
  const float* ks;
  const float* vs;
  const std::int32_t* pages;
  std::int64_t token_stride;
  int num_kv_heads;
  int bs_shift;
  int lane;
  int part;
  int row0;
  int tid;
  std::int32_t next_page = 0;

  __device__ fp8_kv_tile_loader(const std::uint8_t* k_cache, const std::uint8_t* v_cache, const float* k_scale,
                                const float* v_scale, const std::int32_t* seq_pages, int kv_heads, int kv_head,
                                int block_shift, int tid_)
      : k(k_cache + kv_head * D),
        v(v_cache + kv_head * D),
        ks(k_scale + kv_head),
        vs(v_scale + kv_head),
        pages(seq_pages),
        token_stride(std::int64_t{kv_heads} * D),
        num_kv_heads(kv_heads),
        bs_shift(block_shift),
        lane(tid_ & 31),
        part(tid_ % kChunks),
        row0(tid_ / kChunks),
        tid(tid_) {}

  __device__ __forceinline__ void prefetch(int tile_start, int end) {
    const int first = tile_start >> bs_shift;
    const int last = (min(tile_start + kKvTile, end) - 1) >> bs_shift;
    const int p = first + lane;
    next_page = (tile_start < end && p <= last) ? __ldg(pages + p) : 0;
  }

  __device__ __forceinline__ void issue(std::uint32_t stage, int tile_start, int end) const {
    const int first = tile_start >> bs_shift;
    const int mask = (1 << bs_shift) - 1;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int row = row0 + i * kRowsPerPass;
      const int tok = tile_start + row;
      const bool valid = tok < end;
      const std::int32_t page = __shfl_sync(0xffffffffu, next_page, ((tok >> bs_shift) - first) & 31);
      const std::int64_t off = ((static_cast<std::int64_t>(page) << bs_shift) | (tok & mask)) * token_stride + part * 16;
      cp_async_16(stage + kKOffset + k8_off<D>(row, part), valid ? k + off : k, valid);
      cp_async_16(stage + kVOffset + v8_off<D>(row, part), valid ? v + off : v, valid);
    }
    // Scales: thread t < 64 copies token t's K scale, 64 <= t < 128 token t - 64's V scale.
    if (tid < 2 * kKvTile) {
      const int row = tid & (kKvTile - 1);
      const int tok = tile_start + row;
      const bool valid = tok < end;
      const std::int32_t page = __shfl_sync(0xffffffffu, next_page, ((tok >> bs_shift) - first) & 31);
      const std::int64_t slot = (static_cast<std::int64_t>(page) << bs_shift) | (tok & mask);
      const float* src = tid < kKvTile ? ks : vs;
      const std::uint32_t dst =
          stage + kScaleOffset + static_cast<std::uint32_t>((tid >= kKvTile ? kKvTile : 0) + row) * 4;
      const void* from = valid ? static_cast<const void*>(src + slot * num_kv_heads) : static_cast<const void*>(src);
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(from), "r"(valid ? 4 : 0)
                   : "memory");
    }
  }
};

// A fragments of a warp's 16 query rows (rows row_base .. row_base+15 of a swizzled Q tile).
// The K/V tile pipeline both attention kernels run over [start, end): STAGES tiles of K and V in flight
// (shared memory at skv, K then V per stage), the next tile's page ids prefetched one tile ahead.
// kv_pipeline_start issues the first STAGES-1 tiles; kv_pipeline_wait, at iteration `it`, issues tile
// it + STAGES - 1 and waits until tile `it` has landed (and the whole CTA is past it).
template <int STAGES, class Loader>
__device__ __forceinline__ void kv_pipeline_start(Loader& loader, std::uint32_t skv, int start, int end, int ntiles) {
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (st < ntiles) {
      loader.issue(skv + st * Loader::kStageBytes, start + st * kKvTile, end);
      loader.prefetch(start + (st + 1) * kKvTile, end);
    }
    cp_async_commit();
  }
}

template <int STAGES, class Loader>
__device__ __forceinline__ void kv_pipeline_wait(Loader& loader, std::uint32_t skv, int it, int start, int end,
                                                 int ntiles) {
  const int nxt = it + STAGES - 1;
  if (nxt < ntiles) {
    const std::uint32_t base = skv + (nxt % STAGES) * Loader::kStageBytes;
    loader.issue(base, start + nxt * kKvTile, end);
    loader.prefetch(start + (nxt + 1) * kKvTile, end);
  }
  cp_async_commit();
  cp_async_wait<STAGES - 1>();
  __syncthreads();
}

template <int D>
__device__ __forceinline__ void load_q_fragments(std::uint32_t (&qf)[D / 16][4], std::uint32_t sq, int row_base,
                                                 int lane) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qf[kk], sq + swz<D>(row_base + (lane & 15), 2 * kk + (lane >> 4)));
}

// s[n] += Q(16 rows) . K(tokens tok_base + 8n .. +7)^T for NT n-tiles of 8 tokens (NT even).
template <int D, int NT>
__device__ __forceinline__ void qk_tile(float (&s)[NT][4], const std::uint32_t (&qf)[D / 16][4], std::uint32_t sk,
                                        int tok_base, int lane) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int p = 0; p < NT / 2; ++p) {
      std::uint32_t b[4];
      ldmatrix_x4(b, sk + swz<D>(tok_base + 16 * p + (lane & 7) + ((lane >> 4) << 3), 2 * kk + ((lane >> 3) & 1)));
      mma_bf16(s[2 * p], qf[kk], b[0], b[1]);
      mma_bf16(s[2 * p + 1], qf[kk], b[2], b[3]);
    }
  }
}

// o += P(16 rows x 8*NT tokens, from the S accumulators) . V(tokens tok_base ..).
template <int D, int NT>
__device__ __forceinline__ void pv_tile(float (&o)[D / 8][4], const float (&s)[NT][4], std::uint32_t sv, int tok_base,
                                        int lane) {
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    const std::uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                 pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                 pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      std::uint32_t b[4];
      ldmatrix_x4_trans(b, sv + swz<D>(tok_base + 16 * kk + (lane & 7) + (((lane >> 3) & 1) << 3), 2 * dp + (lane >> 4)));
      mma_bf16(o[2 * dp], pa, b[0], b[1]);
      mma_bf16(o[2 * dp + 1], pa, b[2], b[3]);
    }
  }
}

// Online-softmax step for the thread's two rows (r = 0: row lane/4, r = 1: row lane/4 + 8): updates the
// running max m and (thread-partial) sum l, rescales o (times o_rescale too: the FP8 path's change of V
// normalisation), and turns s into probabilities.
template <int D, int NT>
__device__ __forceinline__ void softmax_step(float (&s)[NT][4], float (&m)[2], float (&l)[2], float (&o)[D / 8][4],
                                             float o_rescale = 1.0f) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < NT; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[r], mx);
    const float base = m_new == -INFINITY ? 0.0f : m_new;  // a fully masked row keeps p = 0
    const float corr = fast_exp2(m[r] - base);
    m[r] = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      s[n][2 * r] = fast_exp2(s[n][2 * r] - base);
      s[n][2 * r + 1] = fast_exp2(s[n][2 * r + 1] - base);
      sum += s[n][2 * r] + s[n][2 * r + 1];
    }
    l[r] = l[r] * corr + sum;
    const float oc = corr * o_rescale;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      o[j][2 * r] *= oc;
      o[j][2 * r + 1] *= oc;
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// FP8 K/V: the MMAs read the E4M3 codes
//
// The scales stay out of the element path. With token t's key k_t = ks_t * c_t and value v_t = vs_t * c'_t
// (c, c' its codes' exact values, ks, vs its scales):
//     q . k_t = ks_t * (q . c_t)                  the K scale multiplies the score after the QK MMA;
//     sum_t p_t v_t = sum_t (p_t * vs_t) c'_t      the V scale multiplies the probability before the PV MMA.
// So a landed tile's codes convert exactly to fp16 (cvt.rn.f16x2.e4m3x2, two codes per instruction) straight
// from shared memory into the MMA B fragments in registers, and both products are fp16 m16n8k16 MMAs with
// fp32 accumulation: no dequantised copy of the tile, no extra pass or barrier. Against the reference
// (fp32 products of q with float(code) * scale) this reassociates the fp32 arithmetic, keeps K and V exact
// (the bf16 tile rounded them), and rounds P * vs to fp16 (11 bits) where the bf16 path rounds P to bf16.
//
// Ranges. fp16 holds |x| <= 65504 with normal numbers down to 2^-14, bf16 (Q) and fp32 (P * vs) much more:
//  * Q: each warp multiplies its 16 Q rows by a power of two that puts their largest magnitude in
//    [2^13, 2^14) (exact, but for elements below 2^-27 of that maximum, which become fp16 subnormals: an
//    error under 2^-38 of the maximum each) and the scores are multiplied back by its inverse together with
//    the K scale; inf / NaN stay inf / NaN, as in the reference.
//  * P * vs: per tile, each warp divides the V scales of its tokens by 2^E, E the exponent of their largest,
//    so the fp16 operand p * vs * 2^-E is < 4 and its rounding error at most 2^-12 relative, or 2^-25 * 2^E
//    absolute where it is an fp16 subnormal (p * vs below 2^(E-14)). o accumulates in units of 2^E; when E
//    changes o is rescaled by 2^(E_old - E_new) with the softmax correction (softmax_step's o_rescale), and
//    the epilogue multiplies it by 2^E. (Scales are >= 0.)
//
// Fragment layouts. The reduction dimension of an MMA may be permuted if both operands use the same
// permutation, and the output columns if the epilogue undoes it. Thread (g = lane / 4, t = lane % 4):
//  * S = Q K^T: for an n-tile of 8 tokens the thread holds token g's codes d in [t*D/4, (t+1)*D/4) (16-byte
//    loads); MMA step kk uses d = t*D/4 + 4kk + {0, 1} (b0), + {2, 3} (b1); the Q A fragments are built with
//    the same d's (load_q_fragments_fp8).
//  * O = P' V: for output n-tile j the B fragment holds V[tokens 2t, 2t+1 (b0) | 2t+8, 2t+9 (b1)][d = g*D/8 + j]:
//    the thread reads the D/8 contiguous codes [g*D/8, (g+1)*D/8) of four token rows and interleaves row
//    pairs with one prmt per 4 codes. So o[j][0..1] (and [2..3], row g+8) is output column (2t + {0,1})*D/8 + j.

__device__ __forceinline__ void mma_f16(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> packed half2 (lo in the low half), round to nearest even.
__device__ __forceinline__ std::uint32_t pack_f16(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&h);
}

// fp16 A fragments of Q rows row_base .. row_base + 15 (a swizzled bf16 tile at q_tile, generic pointer to
// shared memory) in the d order of qk_tile_fp8, times the warp's power of two (above). Returns its inverse.
template <int D>
__device__ __forceinline__ float load_q_fragments_fp8(std::uint32_t (&qf)[D / 16][4], const unsigned char* q_tile,
                                                      int row_base, int lane) {
  const int g = lane >> 2, t = lane & 3;
  std::uint32_t w[2][D / 8];  // bf16 pairs of rows g and g + 8, elements [t*D/4, (t+1)*D/4)
  float amax = 0.0f;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int c = 0; c < D / 32; ++c) {
      const uint4 x = *reinterpret_cast<const uint4*>(q_tile + swz<D>(row_base + g + 8 * r, t * (D / 32) + c));
      const std::uint32_t xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        w[r][4 * c + i] = xs[i];
        amax = fmaxf(amax, fmaxf(fabsf(__uint_as_float(xs[i] << 16)), fabsf(__uint_as_float(xs[i] & 0xffff0000u))));
      }
    }
  amax = warp_max(amax);
  // f = 2^(fb - 127) with fb = 267 - (amax's exponent field e): amax * f in [2^13, 2^14). A zero, subnormal or
  // tiny amax gives fb 253 (f = 2^126); inf / NaN give fb 12.
  const int fb = min(267 - static_cast<int>(__float_as_uint(amax) >> 23), 253);
  const float f = __uint_as_float(static_cast<std::uint32_t>(fb) << 23);
  auto h2 = [f](std::uint32_t x) { return pack_f16(__uint_as_float(x << 16) * f, __uint_as_float(x & 0xffff0000u) * f); };
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    qf[kk][0] = h2(w[0][2 * kk]);      // row g,     d = t*D/4 + 4kk + {0, 1}
    qf[kk][1] = h2(w[1][2 * kk]);      // row g + 8
    qf[kk][2] = h2(w[0][2 * kk + 1]);  // row g,     d = t*D/4 + 4kk + {2, 3}
    qf[kk][3] = h2(w[1][2 * kk + 1]);  // row g + 8
  }
  return __uint_as_float(static_cast<std::uint32_t>(254 - fb) << 23);  // 1 / f (fb <= 253: normal)
}

// s[n] += Q . C^T for the NT n-tiles of 8 tokens at tok_base + 8n of an FP8 K code tile (kc: generic pointer
// to shared memory). The scores still lack the K scales and Q's factor.
template <int D, int NT>
__device__ __forceinline__ void qk_tile_fp8(float (&s)[NT][4], const std::uint32_t (&qf)[D / 16][4],
                                            const unsigned char* kc, int tok_base, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int c = 0; c < D / 64; ++c)  // 16-byte chunks of the thread's D/4 codes of a row
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const uint4 x = *reinterpret_cast<const uint4*>(kc + k8_off<D>(tok_base + 8 * n + g, t * (D / 64) + c));
      const std::uint32_t xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // 4 codes: d = t*D/4 + 4kk + {0..3}, kk = 4c + i
        std::uint32_t b0, b1;
        e4m3x4_to_f16x4(xs[i], b0, b1);
        mma_f16(s[n], qf[4 * c + i], b0, b1);
      }
    }
}

// Per tile: the warp's V scale exponent E (above). vs holds this thread's tokens' V scales (a quad's four
// threads hold all of the warp's tokens), which become vs * 2^-(E - 127); v_exp is E (biased, 1..253),
// updated; returns the factor 2^(E_old - E_new) by which o must be rescaled. A tile whose scales are all
// zero (or subnormal) keeps E.
template <int NT>
__device__ __forceinline__ float normalise_v_scales(float (&vs)[NT][2], int& v_exp) {
  std::uint32_t mx = 0;
#pragma unroll
  for (int n = 0; n < NT; ++n) mx = max(mx, max(__float_as_uint(vs[n][0]), __float_as_uint(vs[n][1])));
  mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const int ev = static_cast<int>((mx >> 23) & 0xffu);
  const int e_new = ev == 0 ? v_exp : min(ev, 253);
  const float rescale = __uint_as_float(static_cast<std::uint32_t>(min(max(127 + v_exp - e_new, 1), 254)) << 23);
  v_exp = e_new;
  const float norm = __uint_as_float(static_cast<std::uint32_t>(254 - e_new) << 23);
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    vs[n][0] *= norm;
    vs[n][1] *= norm;
  }
  return rescale;
}

// o += P' V over the NT/2 16-token steps at tok_base of an FP8 V code tile (vc); P' = p * vsn, s holding the
// probabilities p and vsn[n][e] the normalised V scale of token 8n + 2t + e, packed to fp16.
template <int D, int NT>
__device__ __forceinline__ void pv_tile_fp8(float (&o)[D / 8][4], const float (&s)[NT][4], const float (&vsn)[NT][2],
                                            const unsigned char* vc, int tok_base, int lane) {
  const int g = lane >> 2, t = lane & 3;
  constexpr int kWords = D / 32;  // 4-byte words of a row's D/8 codes
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    const int n0 = 2 * kk, n1 = 2 * kk + 1;
    const std::uint32_t pa[4] = {pack_f16(s[n0][0] * vsn[n0][0], s[n0][1] * vsn[n0][1]),
                                 pack_f16(s[n0][2] * vsn[n0][0], s[n0][3] * vsn[n0][1]),
                                 pack_f16(s[n1][0] * vsn[n1][0], s[n1][1] * vsn[n1][1]),
                                 pack_f16(s[n1][2] * vsn[n1][0], s[n1][3] * vsn[n1][1])};
    std::uint32_t r[4][kWords];  // token rows 2t, 2t+1, 2t+8, 2t+9 of the step: codes [g*D/8, (g+1)*D/8)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int row = tok_base + 16 * kk + 2 * t + (k & 1) + 8 * (k >> 1);
      if constexpr (D == 128) {
        const uint4 x = *reinterpret_cast<const uint4*>(vc + v8_off<D>(row, g));
        r[k][0] = x.x, r[k][1] = x.y, r[k][2] = x.z, r[k][3] = x.w;
      } else {
        const uint2 x = *reinterpret_cast<const uint2*>(vc + v8_off<D>(row, g >> 1) + (g & 1) * 8);
        r[k][0] = x.x, r[k][1] = x.y;
      }
    }
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      // Row pairs interleaved byte by byte: (2t, 2t+1) codes of columns 4w, 4w+1 | 4w+2, 4w+3.
      std::uint32_t b0[4], b1[4];
      e4m3x4_to_f16x4(__byte_perm(r[0][w], r[1][w], 0x5140), b0[0], b0[1]);
      e4m3x4_to_f16x4(__byte_perm(r[0][w], r[1][w], 0x7362), b0[2], b0[3]);
      e4m3x4_to_f16x4(__byte_perm(r[2][w], r[3][w], 0x5140), b1[0], b1[1]);
      e4m3x4_to_f16x4(__byte_perm(r[2][w], r[3][w], 0x7362), b1[2], b1[3]);
#pragma unroll
      for (int i = 0; i < 4; ++i) mma_f16(o[4 * w + i], pa, b0[i], b1[i]);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Decode

struct decode_args {
  const bf16* q;
  bf16* out;
  const bf16* k;
  const bf16* v;
  const std::uint8_t* k8;  // FP8 kernels: E4M3 codes and per-(token, KV head) scales instead of k / v
  const std::uint8_t* v8;
  const float* k_scale;
  const float* v_scale;
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
};

// Default pipeline depth (64-token K/V tiles in flight per CTA, incl. the one being consumed). FP8 at
// head_dim 128: registers allow 3 CTAs per multiprocessor (kMinBlocks) and 4 stages of 16.5 KB fit 3 times.
template <int D, bool FP8 = false>
inline constexpr int kDecodeDefaultStages = D == 128 && !FP8 ? 3 : 4;

template <int D, int THREADS, bool FP8>
using kv_loader_t = std::conditional_t<FP8, fp8_kv_tile_loader<D, THREADS>, kv_tile_loader<D, THREADS>>;

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
// for up to 16 query heads of its group.
template <int D, int STAGES, bool FP8 = false>
__global__ void __launch_bounds__(decode_config<D, STAGES, FP8>::kThreads, decode_config<D, STAGES, FP8>::kMinBlocks)
    paged_decode_kernel(const decode_args a) {
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
      if (tile_start + warp * 16 < end) {  // this warp's 16 tokens are not all past the end
        float s[2][4] = {};
        qk_tile_fp8<D, 2>(s, qf, stage + cfg::loader::kKOffset, warp * 16, lane);
        // This thread's tokens: warp*16 + 8n + 2t + {0, 1}.
        const float* scales = reinterpret_cast<const float*>(stage + cfg::loader::kScaleOffset) + warp * 16 + 2 * (lane & 3);
        float ks[2][2], vs[2][2];
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const float2 k2 = *reinterpret_cast<const float2*>(scales + 8 * n);
          const float2 v2 = *reinterpret_cast<const float2*>(scales + kKvTile + 8 * n);
          ks[n][0] = k2.x * q_mul, ks[n][1] = k2.y * q_mul;
          vs[n][0] = v2.x, vs[n][1] = v2.y;
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
        pv_tile_fp8<D, 2>(o, s, vs, stage + cfg::loader::kVOffset, warp * 16, lane);
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

  const bool direct = seq_splits == 1;
  for (int item = tid; item < rows * (D / 8); item += cfg::kThreads) {
    const int r = item / (D / 8), c = item % (D / 8);
    float mt = -INFINITY;
#pragma unroll
    for (int w = 0; w < cfg::kWarps; ++w) mt = fmaxf(mt, s_m[w][r]);
    const float base = mt == -INFINITY ? 0.0f : mt;
    float lt = 0.0f;
    float acc[8] = {};
#pragma unroll
    for (int w = 0; w < cfg::kWarps; ++w) {
      const float wt = fast_exp2(s_m[w][r] - base);
      lt += s_l[w][r] * wt;
      const float4 x0 = *reinterpret_cast<const float4*>(so + (w * 16 + r) * D + c * 8);
      const float4 x1 = *reinterpret_cast<const float4*>(so + (w * 16 + r) * D + c * 8 + 4);
      acc[0] += wt * x0.x, acc[1] += wt * x0.y, acc[2] += wt * x0.z, acc[3] += wt * x0.w;
      acc[4] += wt * x1.x, acc[5] += wt * x1.y, acc[6] += wt * x1.z, acc[7] += wt * x1.w;
    }
    const float inv = lt > 0.0f ? 1.0f / lt : 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] *= inv;
    const std::int64_t row = std::int64_t{seq} * a.num_q_heads + qhead0 + r;
    if constexpr (FP8) {
      // so holds the PV MMA's column order (pv_tile_fp8): so[.][8j + i] is output column i * D/8 + j, so
      // acc[i] is column i * D/8 + c. Per store instruction a warp's lanes (consecutive c) write consecutive
      // columns.
      if (direct) {
#pragma unroll
        for (int i = 0; i < 8; ++i) a.out[row * D + i * (D / 8) + c] = __float2bfloat16_rn(acc[i]);
      } else {
        float* dst = a.ws_o + (row * a.num_splits + split) * D + c;
#pragma unroll
        for (int i = 0; i < 8; ++i) dst[i * (D / 8)] = acc[i];
        if (c == 0) a.ws_lse[row * a.num_splits + split] = lt > 0.0f ? base + __log2f(lt) : -INFINITY;
      }
    } else if (direct) {
      *reinterpret_cast<uint4*>(a.out + row * D + c * 8) = float_to_bf16x8(acc);
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

// ---------------------------------------------------------------------------------------------------
// Prefill

struct prefill_args {
  const bf16* q;
  bf16* out;
  const bf16* k;
  const bf16* v;
  const std::uint8_t* k8;  // FP8 kernels (as decode_args)
  const std::uint8_t* v8;
  const float* k_scale;
  const float* v_scale;
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
  const int tq = a.tokens_per_tile;

  // Which (sequence, query tile) this CTA owns: a warp-wide scan over the sequences' tile counts
  // (every warp computes the same answer).
  int seq = -1, tile = 0, seq_tiles = 0;
  {
    int target = blockIdx.x;
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
  }
  if (seq < 0) return;
  tile = seq_tiles - 1 - tile;  // the longest-KV tiles of a sequence start first

  const int qoff = a.q_indptr[seq];
  const int n = a.q_indptr[seq + 1] - qoff;
  const int tok0 = tile * tq;
  const int ntok = min(tq, n - tok0);
  const int rows = ntok * a.group;

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
    const bool ok = r < rows;
    const bf16* src = a.q;
    if (ok) {
      const int tk = r / a.group, h = r % a.group;
      src = a.q + ((std::int64_t{qoff} + tok0 + tk) * a.num_q_heads + kvh * a.group + h) * D + ch * 8;
    }
    cp_async_16(sq + swz<D>(r, ch), src, ok);
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
        // This thread's tokens: 8n + 2t + {0, 1}.
        const float* scales = reinterpret_cast<const float*>(stage + cfg::loader::kScaleOffset) + 2 * t;
        const bool mask = tile_start + kKvTile > kv_min;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const float2 k2 = *reinterpret_cast<const float2*>(scales + 8 * nt);
          const float km[2] = {k2.x * q_mul, k2.y * q_mul};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = tile_start + nt * 8 + 2 * t + (e & 1);
            s[nt][e] = !mask || col < row_len[e >> 1] ? s[nt][e] * km[e & 1] : -INFINITY;
          }
        }
        float vs[NT][2];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const float2 v2 = *reinterpret_cast<const float2*>(scales + kKvTile + 8 * nt);
          vs[nt][0] = v2.x, vs[nt][1] = v2.y;
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
