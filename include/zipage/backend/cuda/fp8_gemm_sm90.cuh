#pragma once
// The block-scaled FP8 GEMM of the FP8 linear layers on Hopper's warpgroup MMAs (sm_90a). fp8_gemm_kernel::automatic
// runs it for batches of up to 64 tokens, where it streams the weight once and split-K fills the GPU (1.01-1.09x
// cuBLASLt's over Qwen3-8B's projections at 1-32 tokens). Its 128-token tiles, with stream-K on request, reach
// 0.6-0.8x cuBLASLt's rate at 300-2,048 tokens: its consumer warps are latency-bound, each warpgroup waiting for its
// own MMAs (the tensor pipe 40% busy against cuBLASLt's 69% on the same tile; docs/architecture.md, "The FP8 GEMMs'
// second round"; docs/fp8.md, "Our own FP8 GEMM for small batches"). It computes:
//
//   out [m][n] (bf16) = sum over 128-column groups g of  (x codes [m][g] . W codes [n][g]^T) * xs[g][row] * ws[n/128][g]
//
// x: e4m3 activation codes [mp][k] (K-major) with per-token, per-128-group scales [k/128][mp] (fp8_gemm.hpp's
// layout, mp = padded_rows(m)); W: e4m3 weight codes [n][k] with 128x128 block scales [n/128][ld].
//
// A CTA walks the pieces that gemm_sm90_plan gives it: whole tiles of 64 kWG tokens x 128 outputs, or a range of one
// tile's k-groups. Warps 0 to 4 kWG - 1 are kWG consumer warpgroups (64 token rows each), the last warp the producer:
// one thread brings each 128-column k-group's A box (64 kWG x 128 bytes) and B box (128 x 128 bytes) by TMA with the
// 128-byte swizzle that wgmma's descriptors name, and the group's token scales by a bulk copy, into one of the
// stages, each guarded by a full / empty mbarrier pair; it runs ahead into the CTA's next piece while the consumers
// store the last. Per group each consumer warpgroup issues four m64n128k32 MMAs into a scratch accumulator, waits
// for them, releases the stage, and adds the scratch times (token scale x block scale) into the fp32 sum: the
// tensor cores' FP8 sum keeps fewer bits than fp32, so no more than one scale group is summed there (DeepSeek-V3's
// "promotion"). With 64-token tiles two CTAs share a multiprocessor. With 128 one CTA has it to itself, its
// producer is a whole warpgroup that gives its registers to the consumers (setmaxnreg), and each consumer
// warpgroup keeps two groups in flight in two scratch accumulators (7% faster on the H200).
#include <cuda.h>  // CUtensorMap (kernel parameters only: the driver's encoder is called by the launcher)

#include <cstdint>

#include "zipage/backend/cuda/common.cuh"
#include "zipage/backend/cuda/fp8_gemm.hpp"
#include "zipage/backend/cuda/wgmma.cuh"

namespace zipage::cuda::detail::fp8_gemm {

inline constexpr int kBN = 128, kBK = 128;  // outputs and k per tile and group (one scale group)

// A CTA of kWG consumer warpgroups: its tile height, stages and shared memory.
template <int kWG>
struct shape {
  static_assert(kWG == 1 || kWG == 2, "fp8_gemm_sm90: 64- or 128-token tiles");
  static constexpr int kBM = 64 * kWG;
  static constexpr int kStages = kWG == 1 ? 4 : 6;  // one CTA per multiprocessor at 128 tokens: deeper
  // 128-token tiles: a whole producer warpgroup, which gives its registers to the consumers by setmaxnreg (128 x 40
  // + 256 x 232 = 64,512 of 65,536), whose two scratch accumulators need ~230. ptxas gives a 288-thread CTA only
  // 168 registers per thread (a 384-thread CTA's), so without it the consumers would spill.
  static constexpr int kConsumers = 128 * kWG, kThreads = kConsumers + (kWG == 2 ? 128 : 32);
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
  static constexpr int kABytes = kBM * kBK, kBBytes = kBN * kBK, kStageBytes = kABytes + kBBytes;
  static constexpr int kCtasPerSm = kWG == 1 ? 2 : 1;
  // 1 KB of slack to align the stages to the swizzle's 1,024-byte period, the stages, their token scales, barriers.
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + kStages * kBM * 4 + 2 * kStages * 8;
};

struct args {
  const float* x_scales;  // [k/128][mp]
  const float* w_scales;  // [n/128][w_scale_ld]
  __nv_bfloat16* out;     // [m][n]
  int m, mp, n, k, w_scale_ld;
  fp8::gemm_sm90_plan plan;
  // Shared tiles: partial slot j at partial + j * (64 kWG x 128) fp32 ([row][col], rows < m written); counters[u]
  // for shared tile u, zero before the launch and left zero.
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

// grid plan.ctas. a_map: x codes as [mp][k] bytes, box {128, 64 kWG}; b_map: W codes as [n][k] bytes, box {128, 128};
// both 128-byte swizzled, rows past mp read as zeros.
template <int kWG>
__global__ void __launch_bounds__(shape<kWG>::kThreads, shape<kWG>::kCtasPerSm)
    fp8_gemm_sm90_kernel(const args a, const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map) {
#if ZIPAGE_WGMMA_DEVICE
  using S = shape<kWG>;
  constexpr int kBM = S::kBM, kStages = S::kStages, kConsumers = S::kConsumers, kStageBytes = S::kStageBytes;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  const std::uint32_t stages = smem_addr(smem);
  const std::uint32_t scales = stages + kStages * kStageBytes;
  const std::uint32_t bars = scales + kStages * kBM * 4;  // full[kStages], then empty[kStages]
  const auto full = [&](int s) { return bars + 8u * static_cast<std::uint32_t>(s); };
  const auto empty = [&](int s) { return bars + 8u * static_cast<std::uint32_t>(kStages + s); };
  const fp8::gemm_sm90_plan& plan = a.plan;
  const int cta = static_cast<int>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      wgmma::mbar_init(full(s), 1);
      wgmma::mbar_init(empty(s), kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp >= kConsumers / 32) {  // the producer
    if constexpr (kWG == 2) wgmma::regs_release<S::kProducerRegs>();
    if (warp != kConsumers / 32 || lane != 0) return;
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(&a_map)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(&b_map)) : "memory");
    int i = 0;  // the CTA's k-groups so far: stage i % kStages, its (i / kStages)-th use
    fp8::gemm_sm90_plan::piece p;
    for (auto at = plan.start(cta); plan.next(cta, at, p);) {
      const int m0 = p.tile % plan.m_tiles * kBM, n0 = p.tile / plan.m_tiles * kBN;
      // The last tile's token scales stop at mp (a multiple of 4: whole 16-byte pieces); its rows past mp are
      // zero codes, whose products are zero whatever the stale scale, and are never stored.
      const std::uint32_t scale_bytes = static_cast<std::uint32_t>(min(kBM, a.mp - m0)) * 4u;
      for (int g = p.g0; g < p.g1; ++g, ++i) {
        const int s = i % kStages;
        if (i >= kStages) wgmma::mbar_wait(empty(s), static_cast<std::uint32_t>((i / kStages - 1) & 1));
        const std::uint32_t st = stages + static_cast<std::uint32_t>(s * kStageBytes);
        tma::expect_tx(full(s), kStageBytes + scale_bytes);
        tma::load_2d(st, a_map, g * kBK, m0, full(s));
        tma::load_2d(st + S::kABytes, b_map, g * kBK, n0, full(s));
        tma::load_1d(scales + static_cast<std::uint32_t>(s * kBM * 4), a.x_scales + std::int64_t{g} * a.mp + m0,
                     scale_bytes, full(s));
      }
    }
    return;
  }

  // The consumers: warpgroup wg's warp w holds rows 64 wg + 16 w + lane/4 (+ 8) of the tile (wgmma.cuh's
  // accumulator layout), columns 8j + 2 (lane % 4) (+ 1).
  const int wg = warp / 4;
  const int r0 = 64 * wg + 16 * (warp % 4) + (lane >> 2);
  const int col = 2 * (lane & 3);
  const std::uint32_t a_rows = static_cast<std::uint32_t>(wg * 64 * kBK);  // this warpgroup's rows of the A box
  if constexpr (kWG == 2) wgmma::regs_claim<S::kConsumerRegs>();
  float acc[16][4], part[16][4], part2[kWG == 2 ? 16 : 1][4];
  __shared__ int last;  // whether this CTA finishes a shared tile
  const float* ws = nullptr;  // the current tile's weight scales
  // 128-token tiles: group g's MMAs into scratch d once its stage (the CTA's i-th) is full; returns its weight
  // block scale (loaded now, used at its promotion).
  const auto issue = [&](float (&d)[16][4], int g, int i) {
    const int s = i % kStages;
    const float w = __ldg(ws + g);
    wgmma::mbar_wait(full(s), static_cast<std::uint32_t>((i / kStages) & 1));
    const std::uint32_t sa = stages + static_cast<std::uint32_t>(s * kStageBytes), sb = sa + S::kABytes;
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 32; ++kk)
      wgmma::mma_m64n128k32_e4m3_ss(d, wgmma::desc_sw128(sa + a_rows + 32 * kk, 16, 1024),
                                    wgmma::desc_sw128(sb + 32 * kk, 16, 1024), kk > 0);
    wgmma::commit();
    return w;
  };
  // Its scratch (complete) times token scale x block scale into acc, then the stage's release: the token scales
  // are read and used first (the next TMA write into the stage is ordered only after completed reads).
  const auto promote = [&](float (&d)[16][4], float w, int i) {
    const int s = i % kStages;
    wgmma::fence_operands(d);
    const float* ts = reinterpret_cast<const float*>(smem + kStages * kStageBytes + s * kBM * 4);
    const float f0 = ts[r0] * w, f1 = ts[r0 + 8] * w;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      acc[j][0] = fmaf(d[j][0], f0, acc[j][0]);
      acc[j][1] = fmaf(d[j][1], f0, acc[j][1]);
      acc[j][2] = fmaf(d[j][2], f1, acc[j][2]);
      acc[j][3] = fmaf(d[j][3], f1, acc[j][3]);
    }
    wgmma::mbar_arrive(empty(s));
  };
  int i = 0;
  fp8::gemm_sm90_plan::piece p;
  for (auto at = plan.start(cta); plan.next(cta, at, p);) {
    const int m0 = p.tile % plan.m_tiles * kBM, nt = p.tile / plan.m_tiles;
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    ws = a.w_scales + std::int64_t{nt} * a.w_scale_ld;
    if constexpr (kWG == 1) {
      // Not written through issue / promote: that fold (token scales read after the MMAs) failed the 64-token
      // stream-K plan on the H200, cause not found (docs/benchmarks.md, "Device session of 2026-12-04 14:47-15:20").
      float w_scale = __ldg(ws + p.g0);
      for (int g = p.g0; g < p.g1; ++g, ++i) {
        const int s = i % kStages;
        const float w_next = g + 1 < p.g1 ? __ldg(ws + g + 1) : 0.0f;
        wgmma::mbar_wait(full(s), static_cast<std::uint32_t>((i / kStages) & 1));
        // The group's token scales, read before its MMAs are issued and used before the stage is released: the next
        // TMA write into this stage (async proxy) is ordered after the release only for reads that have completed.
        const float* ts = reinterpret_cast<const float*>(smem + kStages * kStageBytes + s * kBM * 4);
        const float f0 = ts[r0] * w_scale, f1 = ts[r0 + 8] * w_scale;
        const std::uint32_t sa = stages + static_cast<std::uint32_t>(s * kStageBytes), sb = sa + S::kABytes;
        wgmma::fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 32; ++kk)  // 32 codes = 32 bytes of each 128-byte row per step
          wgmma::mma_m64n128k32_e4m3_ss(part, wgmma::desc_sw128(sa + a_rows + 32 * kk, 16, 1024),
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
    } else {
      // Two groups in flight per warpgroup: group g + 1's MMAs go into the other scratch before group g's are waited
      // for (wgmma.wait_group 1) and promoted, so the tensor pipe has work across each promotion. The promotion is
      // the same, in the same order: the bits equal one scratch's.
      const int n = p.g1 - p.g0;
      float w0 = issue(part, p.g0, i), w1 = 0.0f;
      int j = 0;
      for (; j + 2 < n; j += 2) {
        w1 = issue(part2, p.g0 + j + 1, i + j + 1);
        wgmma::wait<1>();
        promote(part, w0, i + j);
        w0 = issue(part, p.g0 + j + 2, i + j + 2);
        wgmma::wait<1>();
        promote(part2, w1, i + j + 1);
      }
      if (j + 1 < n) {  // groups j (in flight) and j + 1 left
        w1 = issue(part2, p.g0 + j + 1, i + j + 1);
        wgmma::wait<1>();
        promote(part, w0, i + j);
        wgmma::wait<0>();
        promote(part2, w1, i + j + 1);
      } else {
        wgmma::wait<0>();
        promote(part, w0, i + j);
      }
      i += n;
    }

    // Rows past m (padding tokens, or past mp) are not stored: out holds m rows.
    const int row0 = m0 + r0, row1 = row0 + 8;
    if (p.slot >= 0) {
      // This piece's partial sums; then the last of the tile's CTAs to finish adds all of them in CTA order
      // (threadFenceReduction) and stores the tile.
      float* mine = a.partial + std::int64_t{p.slot} * (kBM * kBN);
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        if (row0 < a.m) __stcg(reinterpret_cast<float2*>(mine + r0 * kBN + 8 * j + col), make_float2(acc[j][0], acc[j][1]));
        if (row1 < a.m) __stcg(reinterpret_cast<float2*>(mine + (r0 + 8) * kBN + 8 * j + col), make_float2(acc[j][2], acc[j][3]));
      }
      __threadfence();
      const int u = p.tile - plan.dp_tiles, c_first = plan.first_cta(u), c_last = plan.last_cta(u);
      wgmma::named_sync(1, kConsumers);
      if (tid == 0) last = atomicAdd(a.counters + u, 1) == c_last - c_first;
      wgmma::named_sync(1, kConsumers);
      if (!last) continue;
      __threadfence();
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
      for (int c = c_first; c <= c_last; ++c) {
        const float* src = a.partial + std::int64_t{plan.slot(c, u)} * (kBM * kBN);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          if (row0 < a.m) {
            const float2 v = __ldcg(reinterpret_cast<const float2*>(src + r0 * kBN + 8 * j + col));
            acc[j][0] += v.x, acc[j][1] += v.y;
          }
          if (row1 < a.m) {
            const float2 v = __ldcg(reinterpret_cast<const float2*>(src + (r0 + 8) * kBN + 8 * j + col));
            acc[j][2] += v.x, acc[j][3] += v.y;
          }
        }
      }
      if (tid == 0) a.counters[u] = 0;  // for the next launch (stream-ordered after this one)
    }
    __nv_bfloat16* o0 = a.out + std::int64_t{row0} * a.n + nt * kBN + col;
    __nv_bfloat16* o1 = o0 + std::int64_t{8} * a.n;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      if (row0 < a.m) *reinterpret_cast<__nv_bfloat162*>(o0 + 8 * j) = __floats2bfloat162_rn(acc[j][0], acc[j][1]);
      if (row1 < a.m) *reinterpret_cast<__nv_bfloat162*>(o1 + 8 * j) = __floats2bfloat162_rn(acc[j][2], acc[j][3]);
    }
  }
#else
  __trap();  // the launcher runs it only on sm_90a builds (fp8::gemm_sm90_available)
#endif
}

}  // namespace zipage::cuda::detail::fp8_gemm
