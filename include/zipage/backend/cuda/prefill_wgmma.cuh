#pragma once
// Paged prefill attention on Hopper's warpgroup MMAs (wgmma, sm_90a): bf16 K/V, head_dim 128.
//
// The work split is paged_prefill_kernel's (prefill_kernel.cuh): a CTA owns a query tile of tokens x the query
// heads of one KV head, packed token-major into rows, and walks the K/V of its sequence through the page table
// with cp.async (pages may be as small as 2 tokens, too small for TMA boxes). What changes:
//  * FlashAttention-3's warp specialisation: a producer warpgroup copies K/V, two consumer warpgroups compute, 64
//    query rows each (128 rows per CTA), sharing every K/V tile and taking turns on the tensor cores (below);
//  * Q, K and V live in shared memory in wgmma's 128-byte-swizzled layout (wgmma.cuh), and the products are
//    warpgroup MMAs: S = Q K^T as 8 m64n128k16 steps per 128 tokens with both operands read from shared memory,
//    O += P V as 8 m64n128k16 steps per 128 tokens with P from registers (re-packed S accumulators) and V read
//    N-major (transposed by the hardware: no ldmatrix.trans);
//  * 128-token K/V steps, three stages in flight;
//  * FA3's intra-warpgroup overlap: each step's softmax runs beside the previous step's P.V, the consumers holding
//    the registers that needs by taking them from the producer (setmaxnreg).
// The epilogue is the mma.sync kernel's, since the accumulator layout is the same; the online softmax is leaner
// (softmax_rows: the scale in the exponent's FMA, FlashAttention-4's lazy rescale). What FA3 has that this kernel
// has not yet (TMA, a tile scheduler) and the variants measured against it are in docs/architecture.md.
#include "zipage/backend/cuda/prefill_kernel.cuh"
#include "zipage/backend/cuda/wgmma.cuh"
#include "zipage/backend/cuda/ws_protocol.hpp"

namespace zipage::cuda::detail {

// Byte offset of 16-byte chunk `chunk` (of 16: 128 bf16) of row `row` in a [ROWS][128] bf16 tile in wgmma's
// 128-byte-swizzled layout: column block chunk / 8 ([ROWS][64] bf16, ROWS * 128 bytes), row `row` of it,
// chunk (chunk % 8) ^ (row % 8).
template <int ROWS>
__host__ __device__ constexpr std::uint32_t sw128_offset(int row, int chunk) {
  return static_cast<std::uint32_t>((chunk >> 3) * (ROWS * 128) + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

// kv_tile_loader's page walk and copies, 64 tokens at a time, into K and V tiles of STEP tokens ([STEP][128] bf16
// each, 128-byte swizzled): issue() fills rows row_base .. row_base + 63 of both.
template <int THREADS, int STEP>
struct wgmma_kv_loader : kv_tile_loader<128, THREADS> {
  using base = kv_tile_loader<128, THREADS>;
  using base::base;
  static constexpr int kTileBytes = STEP * 128 * 2;  // one of K, V

  __device__ __forceinline__ void issue(std::uint32_t sk, std::uint32_t sv, int row_base, int tile_start,
                                        int end) const {
    const int first = tile_start >> this->bs_shift;
    const int mask = (1 << this->bs_shift) - 1;
#pragma unroll
    for (int i = 0; i < base::kPasses; ++i) {
      const int row = this->row0 + i * base::kRowsPerPass;
      const int tok = tile_start + row;
      const bool valid = tok < end;
      const std::int32_t page = __shfl_sync(0xffffffffu, this->next_page, ((tok >> this->bs_shift) - first) & 31);
      const std::int64_t off =
          ((static_cast<std::int64_t>(page) << this->bs_shift) | (tok & mask)) * this->token_stride + this->part * 8;
      const std::uint32_t so = sw128_offset<STEP>(row_base + row, this->part);
      cp_async_16(sk + so, valid ? this->k + off : this->k, valid);
      cp_async_16(sv + so, valid ? this->v + off : this->v, valid);
    }
  }
};

#if ZIPAGE_WGMMA_DEVICE

namespace wgmma_prefill {

// Issues S = Q K^T for one warpgroup's 64 rows and a 128-token step: 8 k-steps of 16 over head_dim 128, each one
// m64n128k16 (two m64n64 would read Q twice: S would be shared-memory bound). k-step kk is column block kk / 4 of
// Q ([64][64] bf16 blocks) and K ([128][64] blocks), byte 32 * (kk % 4) of it.
__device__ __forceinline__ void issue_qk(float (&s)[128 / 8][4], std::uint32_t sq, std::uint32_t sk) {
#pragma unroll
  for (int kk = 0; kk < 128 / 16; ++kk) {
    const std::uint32_t in_row = (kk & 3) * 32;
    wgmma::mma_m64n128k16_ss(s, wgmma::desc_sw128(sq + (kk >> 2) * (64 * 128) + in_row, 16, 1024),
                             wgmma::desc_sw128(sk + (kk >> 2) * (128 * 128) + in_row, 16, 1024), kk > 0);
  }
}

// P (the probabilities in the S accumulators, NT 8-token column tiles) as the A fragments of the NT / 2 P.V
// k-steps.
template <int NT>
__device__ __forceinline__ void pack_p(const float (&s)[NT][4], std::uint32_t (&pa)[NT / 2][4]) {
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    pa[kk][0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
    pa[kk][1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
    pa[kk][2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[kk][3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// Issues O += P V over a 128-token step: 8 k-steps of 16 tokens; V is N-major, 16 token rows of 128 bytes per
// k-step, its two 64-column blocks 128 * 128 bytes apart (LBO).
__device__ __forceinline__ void issue_pv(float (&o)[128 / 8][4], const std::uint32_t (&pa)[128 / 16][4],
                                         std::uint32_t sv) {
#pragma unroll
  for (int kk = 0; kk < 128 / 16; ++kk)
    wgmma::mma_m64n128k16_rs(o, pa[kk], wgmma::desc_sw128(sv + kk * 16 * 128, 128 * 128, 1024));
}

// Scores (NT 8-token column tiles from tile_start) of the columns at or past a row's length to -inf, the others left
// unscaled (softmax_rows scales them); only tiles that reach past the shortest row need the test.
template <int NT>
__device__ __forceinline__ void mask(float (&s)[NT][4], int tile_start, int kv_min, const int (&row_len)[2], int t) {
  if (tile_start + NT * 8 <= kv_min) return;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = tile_start + nt * 8 + 2 * t + (e & 1);
      if (col >= row_len[e >> 1]) s[nt][e] = -INFINITY;
    }
}

// The online softmax of a thread's two rows over a step's unscaled scores, into probabilities in place:
//  * the scale goes into the exponent's FMA, p = 2^(s scale_log2 - m) with m in the log2 domain, instead of a
//    multiply per score before it (the max commutes with the scale, which paged_prefill_attention checks is > 0);
//  * the running max m moves only when a row of the warp finds a score more than 2^kLazyLog2 above it (as
//    FlashAttention-4 does): otherwise p may reach 2^kLazyLog2 (exact in bf16's exponent range, as the sums are in
//    fp32), the correction is 1 and O need not be rescaled. Returns whether it moved: then O times corr[r].
// (For the warp as a whole, so that the rescale's branch is warp-uniform.) The max and the sum run as four partial
// chains each, not one chain of 2 NT dependent instructions.
constexpr float kLazyLog2 = 8.0f;
template <int NT>
__device__ __forceinline__ bool softmax_rows(float (&s)[NT][4], float scale_log2, float (&m)[2], float (&l)[2],
                                             float (&corr)[2]) {
  float mx[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    static_assert(NT % 4 == 0);
    float part[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) part[k] = fmaxf(s[k][2 * r], s[k][2 * r + 1]);
#pragma unroll
    for (int n = 4; n < NT; ++n) part[n % 4] = fmaxf(part[n % 4], fmaxf(s[n][2 * r], s[n][2 * r + 1]));
    mx[r] = fmaxf(fmaxf(part[0], part[1]), fmaxf(part[2], part[3]));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    mx[r] *= scale_log2;
  }
  const bool moves = __any_sync(0xffffffffu, mx[0] > m[0] + kLazyLog2 || mx[1] > m[1] + kLazyLog2);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    corr[r] = 1.0f;
    if (moves) {
      const float m_new = fmaxf(m[r], mx[r]);
      corr[r] = fast_exp2(m[r] - (m_new == -INFINITY ? 0.0f : m_new));
      m[r] = m_new;
    }
    const float base = m[r] == -INFINITY ? 0.0f : m[r];  // a fully masked row keeps p = 0
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      s[n][2 * r] = fast_exp2(fmaf(s[n][2 * r], scale_log2, -base));
      s[n][2 * r + 1] = fast_exp2(fmaf(s[n][2 * r + 1], scale_log2, -base));
      sum[n % 4] += s[n][2 * r] + s[n][2 * r + 1];
    }
    l[r] = l[r] * corr[r] + ((sum[0] + sum[1]) + (sum[2] + sum[3]));
  }
  return moves;
}

// The CTA's K/V bounds in shared memory: bounds[0] the longest row's kv length, bounds[1] the shortest, bounds[2 + w]
// the longest of warpgroup w's 64 rows (its tile count). Thread `tid` < 4 resets them before a barrier
// (reset_kv_bounds), then thread tid < ntok adds its token (add_token_kv_bounds) before the next.
__device__ __forceinline__ void reset_kv_bounds(int* bounds, int tid) {
  if (tid < 4) bounds[tid] = tid == 1 ? INT_MAX : 0;
}
template <int GROUPS>
__device__ __forceinline__ void add_token_kv_bounds(const prefill_args& a, const query_tile& qt, int tid, int* bounds) {
  if (tid >= qt.ntok) return;
  const int L = a.token_kv_len[qt.qoff + qt.tok0 + tid];
  atomicMax(&bounds[0], L);
  atomicMin(&bounds[1], L);
  // The warpgroups whose rows hold this token's heads.
  for (int w = (tid * a.group) / 64; w <= (tid * a.group + a.group - 1) / 64 && w < GROUPS; ++w)
    atomicMax(&bounds[2 + w], L);
}

// Lengths of a thread's two accumulator rows, rows `row` and `row + 8` of the tile (0 for padding rows: fully masked).
__device__ __forceinline__ void row_lengths(const prefill_args& a, const query_tile& qt, int row, int (&row_len)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r)
    row_len[r] = row + 8 * r < qt.rows ? a.token_kv_len[qt.qoff + qt.tok0 + (row + 8 * r) / a.group] : 0;
}

// O / l of a thread's two rows (`row`, `row + 8`) to out; l is summed over the quad of lanes sharing the rows first.
__device__ __forceinline__ void store_rows(const prefill_args& a, const query_tile& qt, int kvh, int row, int t,
                                           const float (&o)[128 / 8][4], float (&l)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int rr = row + 8 * r;
    if (rr >= qt.rows) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    const int tk = rr / a.group, h = rr % a.group;
    bf16* dst = a.out + ((std::int64_t{qt.qoff} + qt.tok0 + tk) * a.num_q_heads + kvh * a.group + h) * 128 + 2 * t;
#pragma unroll
    for (int j = 0; j < 128 / 8; ++j)
      *reinterpret_cast<std::uint32_t*>(dst + j * 8) = pack_bf16(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
  }
}

}  // namespace wgmma_prefill

#endif  // ZIPAGE_WGMMA_DEVICE

// FlashAttention-3's structure on the products above: warpgroup 0 only copies K/V (cp.async through the page table),
// warpgroups 1 and 2 only compute, 64 query rows each. Instead of __syncthreads, a stage is handed over by two
// mbarriers: `full` (the producer's 128 threads arrive as their copies land) and `empty` (each consumer warp arrives
// when its MMAs have read the stage). The consumers take turns on the tensor cores (ping-pong): each issues its MMAs
// only after the other has issued its previous ones, so one's softmax runs while the other's MMAs do. The rules are
// ws_protocol's. A step is 128 tokens, copied as two 64-token sub-tiles: S is 64 x 128 (one m64n128 product per k-step),
// and its softmax, rescale of O and hand-overs serve 128 tokens. Within a consumer, FA3's intra-warpgroup overlap: a turn issues S(i)
// and then P(i-1).V(i-1). Its S, P and O fragments need more registers than the 168 a 384-thread CTA gives each
// thread, so the producer releases registers (setmaxnreg) and the consumers claim them: 128 x kProducerRegs + 256 x
// kConsumerRegs = 384 x 168 (the producer's copies need 56: with 40 it spills; the counts must add up exactly, or
// setmaxnreg.inc waits for ever).
struct prefill_wgmma_config {
  static constexpr int kD = 128;
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kRows = 64 * kConsumers;
  static constexpr int kSubTiles = 2;                 // 64-token K/V sub-tiles per step
  static constexpr int kTile = kKvTile * kSubTiles;  // tokens per step
  static constexpr int kNT = kTile / 8;              // 8-token column tiles of a step's S
  static constexpr int kStages = 3;
  using loader = wgmma_kv_loader<128, kTile>;  // the producer warpgroup's threads, one 64-token sub-tile at a time
  static constexpr int kStageBytes = 2 * loader::kTileBytes;  // K [kTile][128], then V [kTile][128]
  static constexpr int kQGroupBytes = 64 * kD * 2;
  static constexpr int kQBytes = kConsumers * kQGroupBytes;
  static constexpr int kHeaderBytes = 128;  // kv bounds (4 ints) at 0, the mbarriers from 64
  static_assert(64 + 2 * kStages * 8 <= kHeaderBytes);
  // [header][pad to 1024][Q: kConsumers x 2 x [64][64] bf16][kStages x (K, V: 2 x [kTile][64] bf16 each)]
  static constexpr int kSmemBytes = kHeaderBytes + 1024 + kQBytes + kStages * kStageBytes;
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than a Hopper CTA may have");
  static constexpr int kProducerRegs = 56, kConsumerRegs = 224;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs == kThreads * 168);
};

// grid (upper bound on query tiles, kv_heads), 384 threads; a query tile is kRows / group tokens.
// (A template, like the other kernels, so that including this header in several translation units is fine.)
template <int D>
__global__ void __launch_bounds__(prefill_wgmma_config::kThreads, 1)
    paged_prefill_wgmma_kernel(const prefill_args a) {
  using cfg = prefill_wgmma_config;
  static_assert(D == cfg::kD, "the wgmma prefill kernel is written for head_dim 128");
#if ZIPAGE_WGMMA_DEVICE
  namespace wp = wgmma_prefill;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  int* const s_bounds = reinterpret_cast<int*>(smem_raw);  // kv max, kv min, per-consumer kv max [2]
  const std::uint32_t raw = smem_addr(smem_raw);
  const std::uint32_t full_bar = raw + 64, empty_bar = full_bar + cfg::kStages * 8;  // [kStages] each
  const std::uint32_t sq = (raw + cfg::kHeaderBytes + 1023) & ~1023u;
  const std::uint32_t skv = sq + cfg::kQBytes;

  const int tid = threadIdx.x;
  // 0: producer; 1, 2: consumers. Through a shuffle, so that the compiler sees a warp-uniform value: branches on
  // it (and on wg_tiles below) would otherwise make ptxas serialise the wgmma instructions (C7518).
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  const int lane = tid & 31;
  const int kvh = blockIdx.y;

  query_tile qt;  // (a sequence's longest-KV tiles come first: locate_query_tile)
  if (!locate_query_tile(a, blockIdx.x, lane, qt)) return;

  wp::reset_kv_bounds(s_bounds, tid);
  if (tid < cfg::kStages) {
    wgmma::mbar_init(full_bar + tid * 8, 128);                   // the producer's threads
    wgmma::mbar_init(empty_bar + tid * 8, 4 * cfg::kConsumers);  // the consumers' warps
  }
  __syncthreads();
  wp::add_token_kv_bounds<cfg::kConsumers>(a, qt, tid, s_bounds);
  __syncthreads();  // the last CTA-wide barrier: from here on the roles only meet at the mbarriers
  const int kv_end = s_bounds[0];
  const int ntiles = (kv_end + cfg::kTile - 1) / cfg::kTile;

  if (wg == 0) {
    // Producer: step it goes to stage it % kStages once the consumers have released the step before it there.
    wgmma::regs_release<cfg::kProducerRegs>();
    typename cfg::loader loader(a.k, a.v, a.page_indices + a.page_indptr[qt.seq], a.num_kv_heads, kvh, a.bs_shift,
                                tid);
    loader.prefetch(0, kv_end);
    for (int it = 0; it < ntiles; ++it) {
      const int st = ws_protocol::stage_of(it, cfg::kStages);
      if (ws_protocol::producer_waits(it, cfg::kStages))
        wgmma::mbar_wait(empty_bar + st * 8, ws_protocol::empty_parity(it, cfg::kStages));
#pragma unroll
      for (int sub = 0; sub < cfg::kSubTiles; ++sub) {
        const int start = it * cfg::kTile + sub * kKvTile;
        const std::uint32_t sk = skv + st * cfg::kStageBytes;
        loader.issue(sk, sk + cfg::loader::kTileBytes, sub * kKvTile, start, kv_end);  // zero-filled past kv_end
        loader.prefetch(start + kKvTile, kv_end);
      }
      wgmma::mbar_arrive_on_cp_async(full_bar + st * 8);
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }

  wgmma::regs_claim<cfg::kConsumerRegs>();
  const int cw = wg - 1;            // consumer 0 or 1
  const int ctid = tid - 128 * wg;  // thread within the consumer warpgroup
  const int warp = ctid >> 5;
  const int kv_min = s_bounds[1];
  const int wg_tiles = __shfl_sync(0xffffffffu, (s_bounds[2 + cw] + cfg::kTile - 1) / cfg::kTile, 0);  // uniform
  // Named barriers: 1 + c is consumer c's turn on the tensor cores, 3 + c its own Q barrier.
  const int my_turn = 1 + cw, other_turn = 1 + (cw ^ 1);

  // This warpgroup's 64 Q rows (rows 64 cw .. 64 cw + 63 of the tile), copied by its own threads.
  const std::uint32_t sq_wg = sq + cw * cfg::kQGroupBytes;
  for (int c = ctid; c < 64 * (D / 8); c += 128) {
    const int r = c / (D / 8), ch = c % (D / 8);
    const bf16* src = q_chunk<D>(a, qt, kvh, cw * 64 + r, ch);
    cp_async_16(sq_wg + sw128_offset<64>(r, ch), src != nullptr ? src : a.q, src != nullptr);
  }
  cp_async_commit();
  cp_async_wait<0>();
  wgmma::fence_proxy_async();
  wgmma::named_sync(3 + cw, 128);

  const int g = lane >> 2, t = lane & 3;
  const int row = cw * 64 + warp * 16 + g;  // this thread's rows: row, row + 8
  int row_len[2];
  wp::row_lengths(a, qt, row, row_len);

  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};
  float o[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float s[cfg::kNT][4];
#pragma unroll
  for (int j = 0; j < cfg::kNT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;  // (defined before the first S)
  std::uint32_t pa[cfg::kNT / 2][4];

  // Turns alternate strictly between the consumers (c0, c1, c0, ...). Every consumer takes every turn (also those
  // of steps past its rows, without the MMAs), so the arrivals pair up: consumer 1 opens with one arrival for
  // consumer 0 and leaves out its last (ws_protocol). Each product's issue and wait sit in one branch, with the turn
  // handed over in every branch: split over two branches, ptxas injects waits of its own (C7517).
  const int nturns = ws_protocol::turns(ntiles);
  if (ws_protocol::opens_turns(cw, nturns)) wgmma::named_arrive(other_turn, 256);
  auto wait_step = [&](int it) {
    const int st = ws_protocol::stage_of(it, cfg::kStages);
    wgmma::mbar_wait(full_bar + st * 8, ws_protocol::full_parity(it, cfg::kStages));
    wgmma::fence_proxy_async();  // the producer's cp.async writes, now visible here, to wgmma's async proxy
    return skv + st * cfg::kStageBytes;
  };
  auto release_step = [&](int it) {
    __syncwarp();
    if (lane == 0) wgmma::mbar_arrive(empty_bar + ws_protocol::stage_of(it, cfg::kStages) * 8);
  };
  auto issue_s = [&](std::uint32_t stage) {  // (S's first k-step ignores the accumulators: no zeroing)
    wgmma::fence();
    wp::issue_qk(s, sq_wg, stage);
    wgmma::commit();
  };
  auto issue_pv = [&](std::uint32_t stage) {
    wgmma::fence();
    wp::issue_pv(o, pa, stage + cfg::loader::kTileBytes);
    wgmma::commit();
  };
  auto hand_over = [&](int turn) {
    if (ws_protocol::hands_over(cw, turn, nturns)) wgmma::named_arrive(other_turn, 256);
  };
  // Turn `it` multiplying S(it) out alone (the first step: no P.V yet): S, then its softmax into O and P.
  auto score_turn = [&](std::uint32_t stage, int it) {
    issue_s(stage);
    hand_over(it);
    wgmma::wait<0>();
    wgmma::fence_operands(s);
    wp::mask(s, it * cfg::kTile, kv_min, row_len, t);
    float corr[2];
    if (wp::softmax_rows(s, a.scale_log2, m, l, corr)) {
      rescale_row<D>(o, 0, corr[0]);
      rescale_row<D>(o, 1, corr[1]);
    }
    wp::pack_p(s, pa);
  };
  // A turn that only adds P V (V from `stage`) to O.
  auto pv_turn = [&](std::uint32_t stage, int turn) {
    issue_pv(stage);
    hand_over(turn);
    wgmma::wait<0>();
    wgmma::fence_operands(o);
  };

  // FlashAttention-3's intra-warpgroup overlap: turn it issues S(it) and then P(it-1).V(it-1); the softmax of
  // step it runs while that P.V does, and O is rescaled (and P(it) packed over P(it-1)) once it is done. The
  // last turn multiplies the last P.
  std::uint32_t prev_stage = 0;
  for (int it = 0; it < ntiles; ++it) {
    const std::uint32_t stage = wait_step(it);
    const bool pv = it >= 1 && it - 1 < wg_tiles;  // P(it-1).V(it-1) to issue
    wgmma::named_sync(my_turn, 256);
    // (The four cases in separate branches: with `pv` tested inside one, ptxas serialises the MMAs, C7514.)
    if (it < wg_tiles && pv) {
      issue_s(stage);
      issue_pv(prev_stage);
      hand_over(it);
      wgmma::wait<1>();  // S(it) (committed first) is done; the P.V may still run
      wgmma::fence_operands(s);
      wp::mask(s, it * cfg::kTile, kv_min, row_len, t);
      float corr[2];
      const bool rescale = wp::softmax_rows(s, a.scale_log2, m, l, corr);
      wgmma::wait<0>();
      wgmma::fence_operands(o);
      if (rescale) {
        rescale_row<D>(o, 0, corr[0]);
        rescale_row<D>(o, 1, corr[1]);
      }
      wp::pack_p(s, pa);  // the P.V reading the previous P is done
    } else if (it < wg_tiles) {  // the first step: nothing to multiply yet
      score_turn(stage, it);
    } else if (pv) {  // past this consumer's rows: the last P.V
      pv_turn(prev_stage, it);
    } else {
      hand_over(it);
    }
    if (it >= 1) release_step(ws_protocol::released_after_step(it));
    prev_stage = stage;
  }
  if (ntiles > 0) {
    wgmma::named_sync(my_turn, 256);
    if (ntiles - 1 < wg_tiles) {
      pv_turn(prev_stage, ntiles);
    } else {
      hand_over(ntiles);
    }
    release_step(ntiles - 1);
  }
  wp::store_rows(a, qt, kvh, row, t, o, l);
#else
  __trap();  // launched only where wgmma_prefill_available(): an sm_90a build on a compute-capability-9.0 device
#endif
}

}  // namespace zipage::cuda::detail
