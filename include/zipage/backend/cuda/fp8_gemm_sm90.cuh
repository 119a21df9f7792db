#pragma once
// The block-scaled FP8 GEMM of the FP8 linear layers on Hopper's warpgroup MMAs (sm_90a). fp8_gemm_kernel::automatic
// runs it for batches of up to 64 tokens, where it streams the weight once and split-K fills the GPU (1.12x
// cuBLASLt's over Qwen3-8B's projections at 1-8 tokens). At ~700 tokens its 64-token tiles move more bytes from L2
// per multiply-add than cuBLASLt's 128-token ones and it loses (docs/architecture.md, "The FP8 GEMMs' second round";
// docs/fp8.md, "Our own FP8 GEMM for small batches"). It computes:
//
//   out [m][n] (bf16) = sum over 128-column groups g of  (x codes [m][g] . W codes [n][g]^T) * xs[g][row] * ws[n/128][g]
//
// x: e4m3 activation codes [mp][k] (K-major) with per-token, per-128-group scales [k/128][mp] (fp8_gemm.hpp's
// layout, mp = padded_rows(m)); W: e4m3 weight codes [n][k] with 128x128 block scales [n/128][ld].
//
// A CTA computes a 64-token x 128-output tile (a 1-64-token batch is one row of tiles; cuBLASLt's 128-token tiles
// would compute half padding), or, with split-K, part of one tile's k-groups. Warps 0-3 are the
// consumer warpgroup, warp 4 the producer: one thread brings each 128-column k-group's A box (64 x 128 bytes) and B
// box (128 x 128 bytes) by TMA with the 128-byte swizzle that wgmma's descriptors name, and the group's 64 token
// scales by a bulk copy, into one of kStages stages guarded by a full / empty mbarrier pair. Per group the
// consumers issue four m64n128k32 MMAs into a scratch accumulator, wait for them, release the stage, and add the
// scratch times (token scale x block scale) into the fp32 sum: the tensor cores' FP8 sum keeps fewer bits than
// fp32, so no more than one scale group is summed there (DeepSeek-V3's "promotion"). Two CTAs share a
// multiprocessor, so one's promotion runs beside the other's MMAs.
#include <cuda.h>  // CUtensorMap (kernel parameters only: the driver's encoder is called by the launcher)

#include <cstdint>

#include "zipage/backend/cuda/common.cuh"
#include "zipage/backend/cuda/wgmma.cuh"

namespace zipage::cuda::detail::fp8_gemm {

inline constexpr int kBM = 64, kBN = 128, kBK = 128;  // tokens, outputs, k per group (one scale group)
inline constexpr int kStages = 4;
inline constexpr int kConsumers = 128, kThreads = kConsumers + 32;
inline constexpr int kABytes = kBM * kBK, kBBytes = kBN * kBK, kStageBytes = kABytes + kBBytes;
// 1 KB of slack to align the stages to the swizzle's 1,024-byte period, the stages, their token scales, barriers.
inline constexpr int kSmemBytes = 1024 + kStages * kStageBytes + kStages * kBM * 4 + 2 * kStages * 8;

struct args {
  const float* x_scales;  // [k/128][mp]
  const float* w_scales;  // [n/128][w_scale_ld]
  __nv_bfloat16* out;     // [m][n]
  int m, mp, n, k, w_scale_ld, m_tiles;
  // Split-K (splits > 1): CTA (split, tile) sums k-groups [split * groups / splits, (split + 1) * groups / splits)
  // into partial[tile][split] ([64][128] fp32, rows < m written); the last of a tile's CTAs to finish (counters[tile],
  // zero before the launch and left zero) adds the partials in split order and writes out.
  int splits;
  float* partial;
  int* counters;
};

#if ZIPAGE_WGMMA_DEVICE
namespace tma {
__device__ __forceinline__ void expect_tx(std::uint32_t bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Box (c0, c1) of `map` (c0 the contiguous dimension) into shared memory at dst, counted on the mbarrier `bar`.
__device__ __forceinline__ void load_2d(std::uint32_t dst, const CUtensorMap& map, int c0, int c1, std::uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(&map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// `bytes` (a multiple of 16) contiguous bytes from global src (16-byte aligned) to shared dst.
__device__ __forceinline__ void load_1d(std::uint32_t dst, const void* src, std::uint32_t bytes, std::uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(reinterpret_cast<std::uint64_t>(src)), "r"(bytes), "r"(bar)
               : "memory");
}
}  // namespace tma
#endif

// grid (splits * m_tiles * n / 128; CTA b: split b / tiles of tile b % tiles): tile t covers tokens [64 (t % m_tiles), +64) and outputs [128 (t / m_tiles), +128), so
// the CTAs running together share their weight tile through L2. a_map: x codes as [mp][k] bytes, box {128, 64};
// b_map: W codes as [n][k] bytes, box {128, 128}; both 128-byte swizzled, rows past mp read as zeros.
__global__ void __launch_bounds__(kThreads, 2)
    fp8_gemm_sm90_kernel(const args a, const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map) {
#if ZIPAGE_WGMMA_DEVICE
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  const std::uint32_t stages = smem_addr(smem);
  const std::uint32_t scales = stages + kStages * kStageBytes;
  const std::uint32_t bars = scales + kStages * kBM * 4;  // full[kStages], then empty[kStages]
  const auto full = [&](int s) { return bars + 8u * static_cast<std::uint32_t>(s); };
  const auto empty = [&](int s) { return bars + 8u * static_cast<std::uint32_t>(kStages + s); };

  const int tiles = a.m_tiles * (a.n / kBN);
  const int tile = static_cast<int>(blockIdx.x) % tiles, split = static_cast<int>(blockIdx.x) / tiles;
  const int mt = tile % a.m_tiles, nt = tile / a.m_tiles;
  const int m0 = mt * kBM, n0 = nt * kBN;
  const int all_groups = a.k / kBK;
  const int g_begin = split * all_groups / a.splits, g_end = (split + 1) * all_groups / a.splits;
  const int groups = g_end - g_begin;  // this CTA's; its i-th is k-group g_begin + i
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      wgmma::mbar_init(full(s), 1);
      wgmma::mbar_init(empty(s), kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp == kConsumers / 32) {  // the producer
    if (lane != 0) return;
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(&a_map)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(&b_map)) : "memory");
    // The last tile's token scales stop at mp (a multiple of 4: whole 16-byte pieces); its rows past mp are
    // zero codes, whose products are zero whatever the stale scale, and are never stored.
    const std::uint32_t scale_bytes = static_cast<std::uint32_t>(min(kBM, a.mp - m0)) * 4u;
    for (int i = 0; i < groups; ++i) {
      const int s = i % kStages, g = g_begin + i;
      if (i >= kStages) wgmma::mbar_wait(empty(s), static_cast<std::uint32_t>((i / kStages - 1) & 1));
      const std::uint32_t st = stages + static_cast<std::uint32_t>(s * kStageBytes);
      tma::expect_tx(full(s), kStageBytes + scale_bytes);
      tma::load_2d(st, a_map, g * kBK, m0, full(s));
      tma::load_2d(st + kABytes, b_map, g * kBK, n0, full(s));
      tma::load_1d(scales + static_cast<std::uint32_t>(s * kBM * 4), a.x_scales + std::int64_t{g} * a.mp + m0,
                   scale_bytes, full(s));
    }
    return;
  }

  // The consumers: per warp w, rows 16w + lane/4 (+ 8) of the tile (wgmma.cuh's accumulator layout).
  float acc[16][4], part[16][4];
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
  const int r0 = 16 * warp + (lane >> 2);
  const float* ws = a.w_scales + std::int64_t{nt} * a.w_scale_ld;
  float w_scale = __ldg(ws + g_begin);
  for (int i = 0; i < groups; ++i) {
    const int s = i % kStages;
    const float w_next = i + 1 < groups ? __ldg(ws + g_begin + i + 1) : 0.0f;
    wgmma::mbar_wait(full(s), static_cast<std::uint32_t>((i / kStages) & 1));
    // The group's token scales, read before its MMAs are issued and used before the stage is released: the next
    // TMA write into this stage (async proxy) is ordered after the release only for reads that have completed.
    const float* ts = reinterpret_cast<const float*>(smem + kStages * kStageBytes + s * kBM * 4);
    const float f0 = ts[r0] * w_scale, f1 = ts[r0 + 8] * w_scale;
    const std::uint32_t sa = stages + static_cast<std::uint32_t>(s * kStageBytes), sb = sa + kABytes;
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 32; ++kk)  // 32 codes = 32 bytes of each 128-byte row per step
      wgmma::mma_m64n128k32_e4m3_ss(part, wgmma::desc_sw128(sa + 32 * kk, 16, 1024),
                                    wgmma::desc_sw128(sb + 32 * kk, 16, 1024), kk > 0);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(part);
    asm volatile("" ::"f"(f0), "f"(f1));  // the loads have returned (their products exist) before the release
    wgmma::mbar_arrive(empty(s));
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      acc[j][0] = fmaf(part[j][0], f0, acc[j][0]);
      acc[j][1] = fmaf(part[j][1], f0, acc[j][1]);
      acc[j][2] = fmaf(part[j][2], f1, acc[j][2]);
      acc[j][3] = fmaf(part[j][3], f1, acc[j][3]);
    }
    w_scale = w_next;
  }

  // Rows past m (padding tokens, or past mp) are not stored: out holds m rows.
  const int row0 = m0 + r0, row1 = row0 + 8;
  const int col = 2 * (lane & 3);  // of the tile, plus 8j
  if (a.splits > 1) {
    // This split's partial sums, then the tile's last CTA adds all of them in split order (threadFenceReduction).
    __shared__ int last;
    float* mine = a.partial + (std::int64_t{tile} * a.splits + split) * (kBM * kBN);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      if (row0 < a.m) __stcg(reinterpret_cast<float2*>(mine + r0 * kBN + 8 * j + col), make_float2(acc[j][0], acc[j][1]));
      if (row1 < a.m) __stcg(reinterpret_cast<float2*>(mine + (r0 + 8) * kBN + 8 * j + col), make_float2(acc[j][2], acc[j][3]));
    }
    __threadfence();
    wgmma::named_sync(1, kConsumers);
    if (tid == 0) last = atomicAdd(a.counters + tile, 1) == a.splits - 1;
    wgmma::named_sync(1, kConsumers);
    if (!last) return;
    __threadfence();
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    const float* tile_partials = a.partial + std::int64_t{tile} * a.splits * (kBM * kBN);
    for (int sp = 0; sp < a.splits; ++sp) {
      const float* p = tile_partials + std::int64_t{sp} * (kBM * kBN);
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        if (row0 < a.m) {
          const float2 v = __ldcg(reinterpret_cast<const float2*>(p + r0 * kBN + 8 * j + col));
          acc[j][0] += v.x, acc[j][1] += v.y;
        }
        if (row1 < a.m) {
          const float2 v = __ldcg(reinterpret_cast<const float2*>(p + (r0 + 8) * kBN + 8 * j + col));
          acc[j][2] += v.x, acc[j][3] += v.y;
        }
      }
    }
    if (tid == 0) a.counters[tile] = 0;  // for the next launch (stream-ordered after this one)
  }
  __nv_bfloat16* o0 = a.out + std::int64_t{row0} * a.n + n0 + col;
  __nv_bfloat16* o1 = o0 + std::int64_t{8} * a.n;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    if (row0 < a.m) *reinterpret_cast<__nv_bfloat162*>(o0 + 8 * j) = __floats2bfloat162_rn(acc[j][0], acc[j][1]);
    if (row1 < a.m) *reinterpret_cast<__nv_bfloat162*>(o1 + 8 * j) = __floats2bfloat162_rn(acc[j][2], acc[j][3]);
  }
#else
  __trap();  // the launcher runs it only on sm_90a builds (fp8::gemm_sm90_available)
#endif
}

}  // namespace zipage::cuda::detail::fp8_gemm
