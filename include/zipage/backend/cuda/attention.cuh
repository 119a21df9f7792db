#pragma once
// Paged attention building blocks (decode_kernel.cuh, prefill_kernel.cuh, compression.cuh): bf16 K/V with fp32
// softmax and accumulation.
//
// The decode and prefill kernels work on the same building blocks:
//  * K/V tiles of 64 tokens of one KV head, gathered through the page table with 16-byte cp.async
//    copies (several tiles in flight), stored in shared memory with an XOR swizzle of the 16-byte
//    chunks so that ldmatrix reads are free of bank conflicts;
//  * tensor-core products (mma.sync m16n8k16, bf16 in, fp32 out): S = Q K^T with K fragments from
//    ldmatrix, O += P V with V fragments from ldmatrix.trans, P re-packed from the S accumulators;
//  * an online softmax in the log2 domain (scores pre-multiplied by scale*log2(e)).
// The query rows of one MMA tile are the query heads of one KV group (decode) or tokens x heads of
// one KV group (prefill), so each K/V byte is read once per group (GQA).
//
// FP8 K/V (E4M3 codes + one bf16 scale per token and KV head, docs/fp8.md): the same pipeline carries
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

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of 128-byte rows in wgmma's 128-byte swizzle
// (wgmma.cuh): what the swapped kernel's wgmma QK variant reads K codes from.
__device__ __forceinline__ std::uint32_t sw128_off(int row, int chunk) {
  return static_cast<std::uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// The FP8 counterpart of kv_tile_loader: a stage holds the tile's K codes [64][D] (k8_off; SW128_K: sw128_off,
// head_dim 128, each stage 1024-byte aligned for wgmma), V codes [64][D] (v8_off) and K, V scale words [64] each
// (16-byte copies of codes, 4-byte copies of scales, zero-filled past the end). The MMAs read the codes from the
// stage directly (qk_tile_fp8, pv_tile_fp8): no second tile. A token's scale is two bytes, strided by num_kv_heads
// in the cache, and cp.async copies no fewer than 4 aligned bytes: each token's scale arrives as the aligned 4-byte
// word that holds it (scale_word), and scale() finds its half from the token's row (scale_shift; the cache must
// satisfy paged_kv_view::fp8_scale_words). So a stage's scales take 512 bytes as fp32 scales did, while the bytes
// read from memory are half: the words of neighbouring slots and heads are the same 32-byte sectors.
template <int D, int THREADS, bool SW128_K = false>
struct fp8_kv_tile_loader {
  static_assert(!SW128_K || D == 128, "the 128-byte swizzle holds one 128-byte row of codes");
  static constexpr int kChunks = D / 16;  // 16-byte chunks of codes per row
  static constexpr int kRowsPerPass = THREADS / kChunks;
  static constexpr int kPasses = kKvTile / kRowsPerPass;
  static_assert(THREADS % kChunks == 0 && kKvTile % kRowsPerPass == 0 && THREADS >= 2 * kKvTile);
  static constexpr int kCodeBytes = kKvTile * D;
  static constexpr int kKOffset = 0;                   // K codes
  static constexpr int kVOffset = kCodeBytes;          // V codes
  static constexpr int kScaleOffset = 2 * kCodeBytes;  // K scale words [64], then V scale words [64]
  static constexpr int kStageBytes = (2 * kCodeBytes + 2 * kKvTile * 4 + (SW128_K ? 1023 : 0)) / (SW128_K ? 1024 : 1) *
                                     (SW128_K ? 1024 : 1);

  const std::uint8_t* k;
  const std::uint8_t* v;
  const std::uint16_t* ks;
  const std::uint16_t* vs;
  const std::int32_t* pages;
  std::int64_t token_stride;
  int num_kv_heads;
  int bs_shift;
  int lane;
  int part;
  int row0;
  int tid;
  std::int32_t next_page = 0;

  __device__ fp8_kv_tile_loader(const std::uint8_t* k_cache, const std::uint8_t* v_cache, const std::uint16_t* k_scale,
                                const std::uint16_t* v_scale, const std::int32_t* seq_pages, int kv_heads, int kv_head,
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
      cp_async_16(stage + kKOffset + (SW128_K ? sw128_off(row, part) : k8_off<D>(row, part)), valid ? k + off : k,
                  valid);
      cp_async_16(stage + kVOffset + v8_off<D>(row, part), valid ? v + off : v, valid);
    }
    // Scales: thread t < 64 copies token t's K scale word, 64 <= t < 128 token t - 64's V scale word.
    if (tid < 2 * kKvTile) {
      const int row = tid & (kKvTile - 1);
      const int tok = tile_start + row;
      const bool valid = tok < end;
      const std::int32_t page = __shfl_sync(0xffffffffu, next_page, ((tok >> bs_shift) - first) & 31);
      const std::int64_t slot = (static_cast<std::int64_t>(page) << bs_shift) | (tok & mask);
      const std::uint16_t* src = tid < kKvTile ? ks : vs;
      const std::uint32_t dst =
          stage + kScaleOffset + static_cast<std::uint32_t>((tid >= kKvTile ? kKvTile : 0) + row) * 4;
      const void* from = scale_word(valid ? src + slot * num_kv_heads : src);
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(from), "r"(valid ? 4 : 0)
                   : "memory");
    }
  }

  // The scale of token row `row` of a landed stage (generic pointer), K (side 0) or V (side 1): its word's half at
  // bit `shift` = scale_shift(row, num_kv_heads, kv_head). 0 past the end (zero-filled words).
  __device__ static __forceinline__ float scale(const unsigned char* stage, int side, int row, int shift) {
    return scale_in_word(reinterpret_cast<const std::uint32_t*>(stage + kScaleOffset)[side * kKvTile + row], shift);
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

// ASYNC_PROXY: the landed tile is then read by wgmma (the async proxy): each thread fences its copies into it
// before the barrier that publishes them.
template <int STAGES, bool ASYNC_PROXY = false, class Loader>
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
  if constexpr (ASYNC_PROXY) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
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

// Online softmax of row r of the thread (r = 0: row lane/4, r = 1: row lane/4 + 8) over a new tile of scores:
// updates the running max m and (thread-partial) sum l, turns the row of s into probabilities, and returns the
// factor the row's output accumulated so far must be multiplied by.
template <int NT>
__device__ __forceinline__ float softmax_row(float (&s)[NT][4], int r, float& m, float& l) {
  float mx = -INFINITY;
#pragma unroll
  for (int n = 0; n < NT; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float m_new = fmaxf(m, mx);
  const float base = m_new == -INFINITY ? 0.0f : m_new;  // a fully masked row keeps p = 0
  const float corr = fast_exp2(m - base);
  m = m_new;
  float sum = 0.0f;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    s[n][2 * r] = fast_exp2(s[n][2 * r] - base);
    s[n][2 * r + 1] = fast_exp2(s[n][2 * r + 1] - base);
    sum += s[n][2 * r] + s[n][2 * r + 1];
  }
  l = l * corr + sum;
  return corr;
}

// Row r of the thread's output accumulators times c (softmax_row's correction).
template <int D>
__device__ __forceinline__ void rescale_row(float (&o)[D / 8][4], int r, float c) {
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    o[j][2 * r] *= c;
    o[j][2 * r + 1] *= c;
  }
}

// Online-softmax step for the thread's two rows: softmax_row, then o rescaled (times o_rescale too: the FP8
// path's change of V normalisation).
template <int D, int NT>
__device__ __forceinline__ void softmax_step(float (&s)[NT][4], float (&m)[2], float (&l)[2], float (&o)[D / 8][4],
                                             float o_rescale = 1.0f) {
#pragma unroll
  for (int r = 0; r < 2; ++r) rescale_row<D>(o, r, softmax_row(s, r, m[r], l[r]) * o_rescale);
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

// Energy ablations of the FP8 decode path, for bench_decode_attention only (their outputs are wrong on purpose):
// bits of work a tile skips, to tell how much of the kernel's energy above a read-only stream's each part costs.
// A skipped MMA folds its B operand into the accumulator's bits (one logic op, so the conversions stay live); a
// skipped conversion passes the codes' bytes as fp16 bits; kAblateTile skips a warp's whole tile (the copies remain).
enum : int { kAblateNone = 0, kAblateQkMma = 1, kAblatePvMma = 2, kAblateConvert = 4, kAblateTile = 8 };

__device__ __forceinline__ void fold_bits(float& acc, std::uint32_t b0, std::uint32_t b1) {
  acc = __uint_as_float(__float_as_uint(acc) ^ b0 ^ b1);
}

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

// The larger magnitude of a word's two bf16 values.
__device__ __forceinline__ float bf16x2_amax(std::uint32_t x) {
  return fmaxf(fabsf(__uint_as_float(x << 16)), fabsf(__uint_as_float(x & 0xffff0000u)));
}

// Q's power of two for the fp16 MMAs (the ranges above), from the largest magnitude of the warp's Q values:
// f = 2^(fb - 127) with fb = 267 - (amax's exponent field e), so that amax * f lies in [2^13, 2^14). A zero,
// subnormal or tiny amax gives fb 253 (f = 2^126); inf / NaN give fb 12.
struct q_fp16_scale {
  int fb;
  float f;
  __device__ __forceinline__ explicit q_fp16_scale(float amax) {
    fb = min(267 - static_cast<int>(__float_as_uint(amax) >> 23), 253);
    f = __uint_as_float(static_cast<std::uint32_t>(fb) << 23);
  }
  // Two bf16 values (low, high) times f, packed as fp16.
  __device__ __forceinline__ std::uint32_t pack(std::uint32_t x) const {
    return pack_f16(__uint_as_float(x << 16) * f, __uint_as_float(x & 0xffff0000u) * f);
  }
  __device__ __forceinline__ float inverse() const {  // 1 / f (fb <= 253: normal)
    return __uint_as_float(static_cast<std::uint32_t>(254 - fb) << 23);
  }
};

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
        amax = fmaxf(amax, bf16x2_amax(xs[i]));
      }
    }
  const q_fp16_scale q(warp_max(amax));
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    qf[kk][0] = q.pack(w[0][2 * kk]);      // row g,     d = t*D/4 + 4kk + {0, 1}
    qf[kk][1] = q.pack(w[1][2 * kk]);      // row g + 8
    qf[kk][2] = q.pack(w[0][2 * kk + 1]);  // row g,     d = t*D/4 + 4kk + {2, 3}
    qf[kk][3] = q.pack(w[1][2 * kk + 1]);  // row g + 8
  }
  return q.inverse();
}

// s[n] += Q . C^T for the NT n-tiles of 8 tokens at tok_base + 8n of an FP8 K code tile (kc: generic pointer
// to shared memory). The scores still lack the K scales and Q's factor.
template <int D, int NT, int ABLATE = kAblateNone>
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
        if constexpr ((ABLATE & kAblateConvert) != 0) b0 = xs[i], b1 = xs[i] >> 8;
        else e4m3x4_to_f16x4(xs[i], b0, b1);
        if constexpr ((ABLATE & kAblateQkMma) != 0) fold_bits(s[n][0], b0, b1);
        else mma_f16(s[n], qf[4 * c + i], b0, b1);
      }
    }
}

// Per tile: the warp's V scale exponent E (above). vs holds this thread's tokens' V scales (a quad's four
// threads hold all of the warp's tokens), which become vs * 2^-(E - 127); v_exp is E (biased, 1..253),
// updated; returns the factor 2^(E_old - E_new) by which o must be rescaled. A tile whose scales are all
// zero (or subnormal) keeps E.
// The exponent step of normalise_v_scales given the bits of the warp's largest V scale: updates v_exp, sets norm
// (the factor that divides a scale by 2^E) and returns o's rescale factor.
__device__ __forceinline__ float v_exponent_step(std::uint32_t max_scale_bits, int& v_exp, float& norm) {
  const int ev = static_cast<int>((max_scale_bits >> 23) & 0xffu);
  const int e_new = ev == 0 ? v_exp : min(ev, 253);
  const float rescale = __uint_as_float(static_cast<std::uint32_t>(min(max(127 + v_exp - e_new, 1), 254)) << 23);
  v_exp = e_new;
  norm = __uint_as_float(static_cast<std::uint32_t>(254 - e_new) << 23);
  return rescale;
}

template <int NT>
__device__ __forceinline__ float normalise_v_scales(float (&vs)[NT][2], int& v_exp) {
  std::uint32_t mx = 0;
#pragma unroll
  for (int n = 0; n < NT; ++n) mx = max(mx, max(__float_as_uint(vs[n][0]), __float_as_uint(vs[n][1])));
  mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  float norm;
  const float rescale = v_exponent_step(mx, v_exp, norm);
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    vs[n][0] *= norm;
    vs[n][1] *= norm;
  }
  return rescale;
}

// o += P' V over the NT/2 16-token steps at tok_base of an FP8 V code tile (vc); P' = p * vsn, s holding the
// probabilities p and vsn[n][e] the normalised V scale of token 8n + 2t + e, packed to fp16.
template <int D, int NT, int ABLATE = kAblateNone>
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
      if constexpr ((ABLATE & kAblateConvert) != 0) {
        const std::uint32_t c0 = __byte_perm(r[0][w], r[1][w], 0x5140), c1 = __byte_perm(r[0][w], r[1][w], 0x7362);
        const std::uint32_t c2 = __byte_perm(r[2][w], r[3][w], 0x5140), c3 = __byte_perm(r[2][w], r[3][w], 0x7362);
        b0[0] = c0, b0[1] = c0 >> 8, b0[2] = c1, b0[3] = c1 >> 8;
        b1[0] = c2, b1[1] = c2 >> 8, b1[2] = c3, b1[3] = c3 >> 8;
      } else {
        e4m3x4_to_f16x4(__byte_perm(r[0][w], r[1][w], 0x5140), b0[0], b0[1]);
        e4m3x4_to_f16x4(__byte_perm(r[0][w], r[1][w], 0x7362), b0[2], b0[3]);
        e4m3x4_to_f16x4(__byte_perm(r[2][w], r[3][w], 0x5140), b1[0], b1[1]);
        e4m3x4_to_f16x4(__byte_perm(r[2][w], r[3][w], 0x7362), b1[2], b1[3]);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if constexpr ((ABLATE & kAblatePvMma) != 0) fold_bits(o[4 * w + i][0], b0[i] ^ pa[i], b1[i]);
        else mma_f16(o[4 * w + i], pa, b0[i], b1[i]);
      }
    }
  }
}


// The K/V tile loader of a kernel: bf16 tiles, or FP8 codes and scales.
template <int D, int THREADS, bool FP8>
using kv_loader_t = std::conditional_t<FP8, fp8_kv_tile_loader<D, THREADS>, kv_tile_loader<D, THREADS>>;

}  // namespace zipage::cuda::detail
