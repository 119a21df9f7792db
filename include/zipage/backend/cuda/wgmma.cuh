#pragma once
// Hopper warpgroup MMAs (wgmma.mma_async, sm_90a): the instructions, their shared-memory matrix descriptors
// and the fences around them. Used by prefill_wgmma.cuh, fp8_gemm_sm90.cuh and decode_swapped.cuh.
//
// A warpgroup (4 consecutive warps, 128 threads) issues an MMA together. Operands in shared memory are named
// by 64-bit descriptors (PTX ISA, "Matrix Descriptor Format"); this file only builds 128-byte-swizzled ones:
// the tile is stored as column blocks of 64 bf16 (128 bytes per row), each 16-byte chunk c of row r at chunk
// c ^ (r % 8). The hardware applies that XOR to address bits [4:6] from bits [7:9], so every column block must
// start 1024-byte aligned. A descriptor's strides:
//   K-major (the reduction dimension contiguous: Q and K):  SBO = 1024 (8 rows of 128 bytes), LBO unused;
//   MN-major (N contiguous: V as the B of P.V):               SBO = 1024 (8 reduction rows), LBO = bytes
//                                                             between the 64-column blocks of N.
// The accumulators of m64nNk16 are, per warp w of the group, the m16n8k16 C layout of rows 16w..16w+15
// repeated over N/8 column tiles: d[j][e] is row 16w + lane/4 + 8*(e/2), column 8j + 2*(lane%4) + e%2. A from
// registers is the m16n8k16 A layout per warp, so S accumulators re-pack into P fragments as with mma.sync.
#include <cstdint>

// Only the sm_90a device pass has the instructions; elsewhere the kernels that use them compile to a trap and
// the launcher never selects them (wgmma_prefill_available()).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ZIPAGE_WGMMA_DEVICE 1
#else
#define ZIPAGE_WGMMA_DEVICE 0
#endif

namespace zipage::cuda::detail::wgmma {

// Descriptor of a 128-byte-swizzled tile starting at shared-memory byte address `addr` (16-byte aligned; its
// column block 1024-byte aligned but for the k-step offsets of 32, 64, 96 bytes).
__device__ __forceinline__ std::uint64_t desc_sw128(std::uint32_t addr, std::uint32_t lbo_bytes, std::uint32_t sbo_bytes) {
  std::uint64_t d = (addr & 0x3FFFFu) >> 4;
  d |= static_cast<std::uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16;
  d |= static_cast<std::uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32;
  d |= std::uint64_t{1} << 62;  // swizzle mode 1: 128 bytes
  return d;
}

#if ZIPAGE_WGMMA_DEVICE

// Register operands written before this point are visible to the next wgmma.mma_async.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups are pending.
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared memory written through the generic proxy (st.shared, cp.async) is visible to the async proxy that
// wgmma reads it through (each writing thread, before the barrier that publishes the writes).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Ties accumulators to this point: the compiler may not move their reads above a preceding wait(), which it
// would otherwise see as unrelated to the registers an earlier mma_async wrote.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}

// ---- Synchronisation of the warp-specialised kernel (prefill_wgmma.cuh) ----
// An mbarrier (8 bytes of shared memory) completes a phase when `count` arrivals have come; waiters name the
// phase by its parity. A fresh barrier is in phase 0.
__device__ __forceinline__ void mbar_init(std::uint32_t bar, std::uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(std::uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// One arrival once every cp.async this thread has issued so far has landed (the barrier's count includes it:
// .noinc).
__device__ __forceinline__ void mbar_arrive_on_cp_async(std::uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Spins until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(std::uint32_t bar, std::uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nspin:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra spin;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// Named hardware barriers (0 is __syncthreads'): sync waits until `threads` threads have arrived or synced on
// barrier `id`; arrive counts this warp in without waiting.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// A warpgroup's register budget per thread (setmaxnreg): every warp of the warpgroup runs the same one. A role that
// needs few registers releases them (regs_release) and one that needs more claims them (regs_claim, which waits
// until they are free); N is a multiple of 8 in [24, 256].
template <int N>
__device__ __forceinline__ void regs_release() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256);
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_claim() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256);
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// d[16][4] (+)= A[64x16] . B[16x128] (A, B: K-major, 128-byte swizzled, in shared memory). (One m64n128 reads A
// once for 128 columns where two m64n64 would read it twice: 3/4 of their shared-memory bytes per FLOP.)
__device__ __forceinline__ void mma_m64n128k16_ss(float (&d)[16][4], std::uint64_t desc_a, std::uint64_t desc_b,
                                                  int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// d[16][4] += A[64x16] . B[16x128] (A: four bf16x2 registers per thread, the m16n8k16 A layout per warp;
// B: MN-major, 128-byte swizzled, in shared memory).
__device__ __forceinline__ void mma_m64n128k16_rs(float (&d)[16][4], const std::uint32_t (&a)[4], std::uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

// d[16][4] (+)= A[64x32] . B[32x128] in e4m3 (A, B: K-major, 128-byte swizzled, in shared memory; 8-bit operands
// have no transposed form), fp32 accumulators in the layout above. The tensor cores keep fewer mantissa bits of
// the fp32 sum for FP8 than for bf16, so callers add the products of a few k-steps into an exact fp32 sum
// (fp8_gemm_sm90.cuh: one 128-column scale group at a time).
__device__ __forceinline__ void mma_m64n128k32_e4m3_ss(float (&d)[16][4], std::uint64_t desc_a, std::uint64_t desc_b,
                                                       int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
        "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// d[4] (+)= A[64x32] . B[32x8] in e4m3 (both K-major, 128-byte swizzled, in shared memory): the swapped FP8 decode
// kernel's S^T = K Q^T step (decode_swapped.cuh), d in the layout above with one column tile.
__device__ __forceinline__ void mma_m64n8k32_e4m3_ss(float (&d)[4], std::uint64_t desc_a, std::uint64_t desc_b,
                                                     int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

#endif  // ZIPAGE_WGMMA_DEVICE

}  // namespace zipage::cuda::detail::wgmma
