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
// the codes and scales of each 64-token tile into shared memory (half the bytes of bf16), and when a tile
// has landed the CTA dequantises it in registers (bf16(float(code) * scale)) into one bf16 tile that the
// unchanged MMA path reads (fp8_kv_tile_loader::tile).
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

  // Shared-memory bytes of one pipeline stage (K then V), and of the extra buffer tile() needs.
  static constexpr int kStageBytes = 2 * kKvTile * D * 2;
  static constexpr int kExtraBytes = 0;

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

// The FP8 counterpart of kv_tile_loader: a stage holds the tile's K codes [64][D], V codes [64][D] and
// K, V scales [64] each (16-byte copies of codes, 4-byte copies of scales, zero-filled past the end);
// tile() dequantises a landed stage into the bf16 swizzled K and V tiles at `conv` (kExtraBytes) and
// synchronises the CTA, so every thread must call it.
template <int D, int THREADS>
struct fp8_kv_tile_loader {
  static constexpr int kChunks = D / 16;  // 16-byte chunks of codes per row
  static constexpr int kRowsPerPass = THREADS / kChunks;
  static constexpr int kPasses = kKvTile / kRowsPerPass;
  static_assert(THREADS % kChunks == 0 && kKvTile % kRowsPerPass == 0 && THREADS >= 2 * kKvTile);
  static constexpr int kCodeBytes = kKvTile * D;
  static constexpr int kStageBytes = 2 * kCodeBytes + 2 * kKvTile * 4;
  static constexpr int kExtraBytes = 2 * kKvTile * D * 2;

  const std::uint8_t* k;
  const std::uint8_t* v;
  const float* ks;
  const float* vs;
  const std::int32_t* pages;
  unsigned char* smem;       // generic pointer of the dynamic shared memory
  std::uint32_t smem_base;   // its shared-space address
  std::uint32_t conv;        // bf16 K tile, then V tile
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
                                int block_shift, int tid_, unsigned char* smem_, std::uint32_t conv_)
      : k(k_cache + kv_head * D),
        v(v_cache + kv_head * D),
        ks(k_scale + kv_head),
        vs(v_scale + kv_head),
        pages(seq_pages),
        smem(smem_),
        smem_base(smem_addr(smem_)),
        conv(conv_),
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
      const std::uint32_t so = static_cast<std::uint32_t>(row * D + part * 16);
      cp_async_16(stage + so, valid ? k + off : k, valid);
      cp_async_16(stage + kCodeBytes + so, valid ? v + off : v, valid);
    }
    // Scales: thread t < 64 copies token t's K scale, 64 <= t < 128 token t - 64's V scale.
    if (tid < 2 * kKvTile) {
      const int row = tid & (kKvTile - 1);
      const int tok = tile_start + row;
      const bool valid = tok < end;
      const std::int32_t page = __shfl_sync(0xffffffffu, next_page, ((tok >> bs_shift) - first) & 31);
      const std::int64_t slot = (static_cast<std::int64_t>(page) << bs_shift) | (tok & mask);
      const float* src = tid < kKvTile ? ks : vs;
      const std::uint32_t dst = stage + 2 * kCodeBytes + static_cast<std::uint32_t>((tid >= kKvTile ? kKvTile : 0) + row) * 4;
      const void* from = valid ? static_cast<const void*>(src + slot * num_kv_heads) : static_cast<const void*>(src);
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(from), "r"(valid ? 4 : 0)
                   : "memory");
    }
  }

  // Dequantises the landed stage into the bf16 tiles: 8 codes per item, bf16(float(code) * scale).
  __device__ __forceinline__ void tile(std::uint32_t stage, std::uint32_t& sk, std::uint32_t& sv) const {
    const unsigned char* st = smem + (stage - smem_base);
    const float* scales = reinterpret_cast<const float*>(st + 2 * kCodeBytes);
    constexpr int kItems = kKvTile * (D / 8);
#pragma unroll
    for (int side = 0; side < 2; ++side) {
      const unsigned char* codes = st + side * kCodeBytes;
      const std::uint32_t dst = conv + static_cast<std::uint32_t>(side * kKvTile * D * 2);
#pragma unroll 4
      for (int item = tid; item < kItems; item += THREADS) {
        const int row = item / (D / 8), ch = item % (D / 8);
        const uint2 c = *reinterpret_cast<const uint2*>(codes + row * D + ch * 8);
        const float sc = scales[side * kKvTile + row];
        const std::uint32_t w[2] = {c.x, c.y};
        std::uint32_t packed[4];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const float2 lo = e4m3x2_to_f32x2(static_cast<std::uint16_t>(w[j] & 0xffffu));
          const float2 hi = e4m3x2_to_f32x2(static_cast<std::uint16_t>(w[j] >> 16));
          packed[2 * j] = pack_bf16(lo.x * sc, lo.y * sc);
          packed[2 * j + 1] = pack_bf16(hi.x * sc, hi.y * sc);
        }
        *reinterpret_cast<uint4*>(smem + (dst - smem_base) + swz<D>(row, ch)) =
            make_uint4(packed[0], packed[1], packed[2], packed[3]);
      }
    }
    __syncthreads();
    sk = conv;
    sv = conv + kKvTile * D * 2;
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
// running max m and (thread-partial) sum l, rescales o, and turns s into probabilities.
template <int D, int NT>
__device__ __forceinline__ void softmax_step(float (&s)[NT][4], float (&m)[2], float (&l)[2], float (&o)[D / 8][4]) {
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
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      o[j][2 * r] *= corr;
      o[j][2 * r + 1] *= corr;
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

// Default pipeline depth (64-token K/V tiles in flight per CTA, incl. the one being consumed).
template <int D>
inline constexpr int kDecodeDefaultStages = D == 128 ? 3 : 4;

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
  static constexpr int kSmemBytes = kQBytes + kStages * loader::kStageBytes + loader::kExtraBytes;
  static constexpr int kCombineBytes = kWarps * 16 * D * 4;
  static_assert(kCombineBytes <= kSmemBytes);
};

// grid (num_splits, kv_heads * head_chunks, num_seqs). CTA: one KV split of one (sequence, KV head)
// for up to 16 query heads of its group.
template <int D, int STAGES, bool FP8 = false>
__global__ void __launch_bounds__(decode_config<D, STAGES, FP8>::kThreads) paged_decode_kernel(const decode_args a) {
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
                                  a.bs_shift, tid, smem, skv + cfg::kStages * cfg::loader::kStageBytes);
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

  for (int it = 0; it < ntiles; ++it) {
    kv_pipeline_wait<cfg::kStages>(loader, skv, it, start, end, ntiles);
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
    __syncthreads();
  }
  cp_async_wait<0>();
  __syncthreads();

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
    if (direct) {
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
  static constexpr int kSmemBytes = kQBytes + kStages * loader::kStageBytes + loader::kExtraBytes;
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
                                  kvh, a.bs_shift, tid, smem, skv + cfg::kStages * cfg::loader::kStageBytes);
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

  for (int it = 0; it < ntiles; ++it) {
    kv_pipeline_wait<cfg::kStages>(loader, skv, it, 0, kv_end, ntiles);
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
    bf16* dst = a.out + ((std::int64_t{qoff} + tok0 + tk) * a.num_q_heads + kvh * a.group + h) * D + 2 * t;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<std::uint32_t*>(dst + j * 8) = pack_bf16(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
  }
}

}  // namespace zipage::cuda::detail
