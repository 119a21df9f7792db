#pragma once
// Which kernel an op of the CUDA backend may run. Every op has one launcher (backend/cuda/ops.hpp,
// backend/cuda/attention.hpp) that takes the data type and a kernel_variant and picks the kernel itself;
// the rule for each op is written next to its declaration. No CUDA header here.
#include <cstdint>

#include "zipage/core/error.hpp"

namespace zipage::cuda {

enum class kernel_variant : std::uint8_t {
  // The op's tuned bf16 kernel (16-byte vectors, tensor cores for attention) when the data type, the
  // shape and the alignment allow it; otherwise, silently, the reference kernel. What the engine asks
  // for unless cuda_backend_options::fast_kernels is off.
  tuned,
  // Always the reference kernel: fp32 or bf16 data of any shape, written to mirror the zipage::cpu
  // reference operation by operation (double RoPE angles and RMSNorm sums, a softmax over the whole row,
  // fixed summation orders), so that the fp32 engine gives the CPU backend's tokens.
  reference,
};

[[nodiscard]] constexpr const char* to_string(kernel_variant v) {
  return v == kernel_variant::tuned ? "tuned" : "reference";
}

// Which implementation runs paged prefill attention (prefill_params::kernel, attention_params::prefill,
// cuda_backend_options::prefill_kernel).
enum class prefill_kernel : std::uint8_t {
  automatic,  // wgmma where it can run (bf16 K/V, head_dim 128, wgmma_prefill_available), else mma_sync
  mma_sync,   // mma.sync m16n8k16, any GPU the library builds for (backend/cuda/prefill_kernel.cuh)
  wgmma,      // Hopper warpgroup MMAs in FlashAttention-3's structure (backend/cuda/prefill_wgmma.cuh): a producer
              // warpgroup copying K/V, two consumer warpgroups taking turns on the tensor cores, each overlapping a
              // step's softmax with the previous step's P.V, 128-token K/V steps. bf16 K/V, head_dim 128, an sm_90a
              // build on a compute-capability-9.0 device (wgmma_prefill_available); anything else is an error.
              // 1.9-2.0x mma_sync on the H100, 53-61% of the GEMM rate (docs/benchmarks.md, 2026-12-02 18:34)
};

[[nodiscard]] constexpr const char* to_string(prefill_kernel k) {
  switch (k) {
    case prefill_kernel::automatic: return "automatic";
    case prefill_kernel::mma_sync: return "mma_sync";
    case prefill_kernel::wgmma: return "wgmma";
  }
  return "?";
}

// Every prefill_kernel, in declaration order: what the tools parse and list, and the tests and benches loop over.
inline constexpr prefill_kernel all_prefill_kernels[] = {
    prefill_kernel::automatic, prefill_kernel::mma_sync, prefill_kernel::wgmma};

// Whether k is a prefill_kernel at all (an options struct may hold any value of the underlying type).
[[nodiscard]] constexpr bool is_prefill_kernel(prefill_kernel k) {
  for (const prefill_kernel x : all_prefill_kernels)
    if (x == k) return true;
  return false;
}

// Which implementation runs decode attention over an FP8 KV cache (cuda_backend_options::fp8_decode_kernel; a bf16
// cache always runs the split-KV kernel). docs/architecture.md, "Decode attention and the power cap".
enum class fp8_decode_kernel : std::uint8_t {
  automatic,  // swapped where it fits and the batch fills the GPU without splitting each sequence's KV range
              // (resolve_fp8_decode_kernel); else split_kv
  split_kv,   // paged_decode_attention: query heads as the MMAs' A operand, each sequence's KV range split over
              // several CTAs when the batch alone does not fill the GPU (plan_decode)
  swapped,    // paged_decode_attention_swapped: K/V as the MMAs' A operand (half the MMAs at up to 8 query heads
              // per KV head), one CTA per sequence and KV head. Where it fits (decode_swapped_supported: head_dim
              // 128, at most 8 query heads per KV head, power-of-two blocks), else split_kv
  swapped_e4m3_qk,  // swapped with the QK product as FP8 wgmma (m64n8k32, sm_90a): K's codes read from shared
                    // memory as they are, Q rounded to E4M3 under one scale per head (FlashAttention-3's FP8 rounding
                    // of Q). No K conversions, at Q's 3-bit mantissa; opt-in (docs/architecture.md, "FP8 operands for
                    // the MMAs")
};

[[nodiscard]] constexpr const char* to_string(fp8_decode_kernel k) {
  switch (k) {
    case fp8_decode_kernel::automatic: return "automatic";
    case fp8_decode_kernel::split_kv: return "split_kv";
    case fp8_decode_kernel::swapped: return "swapped";
    case fp8_decode_kernel::swapped_e4m3_qk: return "swapped_e4m3_qk";
  }
  return "?";
}

// Every fp8_decode_kernel, in declaration order: what the tools parse and list.
inline constexpr fp8_decode_kernel all_fp8_decode_kernels[] = {
    fp8_decode_kernel::automatic, fp8_decode_kernel::split_kv, fp8_decode_kernel::swapped,
    fp8_decode_kernel::swapped_e4m3_qk};

// The ones that run paged_decode_attention_swapped (what the swapped_decodes counter counts).
[[nodiscard]] constexpr bool is_swapped(fp8_decode_kernel k) {
  return k == fp8_decode_kernel::swapped || k == fp8_decode_kernel::swapped_e4m3_qk;
}

[[nodiscard]] constexpr bool is_fp8_decode_kernel(fp8_decode_kernel k) {
  for (const fp8_decode_kernel x : all_fp8_decode_kernels)
    if (x == k) return true;
  return false;
}

// Automatic takes the swapped-operand kernel on a split plan from this many full waves of its grid on: its grid
// cannot split, so a batch of few CTAs over long contexts keeps the split-KV kernel's parallelism. Measured on the
// H200 at 32/8 heads, 3 CTAs per multiprocessor (docs/benchmarks.md, 2026-12-03 09:03): at 64 sequences (1.3
// waves) the swapped kernel lost 12% at 8k-16k tokens against 2-3 splits; at 256 and 512 sequences (5.2 and 10.3
// waves) it won 1-14% against 2-4 splits. At the default depth (4 CTAs per multiprocessor; 2 waves are 132
// sequences of 8 KV heads) 128 sequences, 1.94 waves, were the break-even: 4% faster at 8k tokens, 1% slower at 16k.
inline constexpr double kSwappedDecodeMinWaves = 2.0;

// The kernel an FP8 decode launch runs: `requested` made concrete. `swapped_fits`: decode_swapped_supported for the
// launch; `plan_splits`: plan_decode's split count for it; `swapped_waves`: decode_swapped_waves for it (read only
// by automatic on a split plan). Automatic takes the swapped kernel where it fits and either the split-KV kernel
// would not split (the compressed steady state: 5-6% more tokens per second and per joule, docs/benchmarks.md,
// 2026-12-03 08:44) or its grid makes kSwappedDecodeMinWaves full waves.
[[nodiscard]] inline fp8_decode_kernel resolve_fp8_decode_kernel(fp8_decode_kernel requested, bool swapped_fits,
                                                                 int plan_splits, double swapped_waves) {
  switch (requested) {
    case fp8_decode_kernel::automatic:
      return swapped_fits && (plan_splits == 1 || swapped_waves >= kSwappedDecodeMinWaves) ? fp8_decode_kernel::swapped
                                                                                           : fp8_decode_kernel::split_kv;
    case fp8_decode_kernel::swapped:
    case fp8_decode_kernel::swapped_e4m3_qk: return swapped_fits ? requested : fp8_decode_kernel::split_kv;
    case fp8_decode_kernel::split_kv: return fp8_decode_kernel::split_kv;
  }
  check(false, "fp8 decode kernel: not a cuda::fp8_decode_kernel (", static_cast<int>(requested), ")");
  return fp8_decode_kernel::split_kv;
}

// Which implementation runs the block-scaled FP8 GEMM of an FP8 linear weight (cuda_backend_options::fp8_gemm_kernel).
// docs/fp8.md, "Our own FP8 GEMM for small batches"; docs/architecture.md, "The FP8 GEMMs' second round".
enum class fp8_gemm_kernel : std::uint8_t {
  automatic,  // sm90 where it runs up to kSm90Fp8GemmMaxRows tokens (resolve_fp8_gemm_kernel), else cublaslt
  cublaslt,   // cuBLASLt's block-scaled FP8 matmul (128-token tiles)
  sm90,       // fp8::gemm_sm90: wgmma + TMA, 64- or 128-token tiles (backend/cuda/fp8_gemm_sm90.cuh). n, k multiples of
              // 128, an sm_90a build on a compute-capability-9.0 device (fp8::gemm_sm90_available); a weight it
              // does not take runs cuBLASLt's
};

[[nodiscard]] constexpr const char* to_string(fp8_gemm_kernel k) {
  switch (k) {
    case fp8_gemm_kernel::automatic: return "automatic";
    case fp8_gemm_kernel::cublaslt: return "cublaslt";
    case fp8_gemm_kernel::sm90: return "sm90";
  }
  return "?";
}

// Every fp8_gemm_kernel, in declaration order: what the tools parse and list.
inline constexpr fp8_gemm_kernel all_fp8_gemm_kernels[] = {fp8_gemm_kernel::automatic, fp8_gemm_kernel::cublaslt,
                                                           fp8_gemm_kernel::sm90};

[[nodiscard]] constexpr bool is_fp8_gemm_kernel(fp8_gemm_kernel k) {
  for (const fp8_gemm_kernel x : all_fp8_gemm_kernels)
    if (x == k) return true;
  return false;
}

// Automatic runs fp8::gemm_sm90 up to this many tokens: a batch of one 64-token tile, where the GEMM streams its weight
// once and split-K lets our kernel fill the GPU while cuBLASLt's 128-token tiles leave most multiprocessors idle.
// Measured on the H200 in CUDA graphs over weights read from HBM (docs/benchmarks.md, 2026-12-04): the Qwen3-8B
// projections' sum 1.12x cuBLASLt's at 8 tokens, 1.03x at 64 and 0.89x at 128; the engine's decode step 10% shorter
// at 1 sequence, 1.6% at 64. A second machine (2026-12-04 04:50): 1.01x at 1 token, 1.06x at 8, 1.09x at 32, 0.99x
// at 64, and never ahead from 96 tokens on, with either tile height.
inline constexpr int kSm90Fp8GemmMaxRows = 64;

// The kernel an FP8 GEMM of `rows` tokens runs: `requested` made concrete; `sm90_takes`: fp8::gemm_sm90_supported
// for the call (an sm90 request it does not take runs cuBLASLt's).
[[nodiscard]] inline fp8_gemm_kernel resolve_fp8_gemm_kernel(fp8_gemm_kernel requested, int rows, bool sm90_takes) {
  switch (requested) {
    case fp8_gemm_kernel::automatic:
      return sm90_takes && rows <= kSm90Fp8GemmMaxRows ? fp8_gemm_kernel::sm90 : fp8_gemm_kernel::cublaslt;
    case fp8_gemm_kernel::sm90: return sm90_takes ? fp8_gemm_kernel::sm90 : fp8_gemm_kernel::cublaslt;
    case fp8_gemm_kernel::cublaslt: return fp8_gemm_kernel::cublaslt;
  }
  check(false, "fp8 GEMM kernel: not a cuda::fp8_gemm_kernel (", static_cast<int>(requested), ")");
  return fp8_gemm_kernel::cublaslt;
}

// The Hopper wgmma kernel (bf16 K/V, head_dim 128, a device with wgmma).
[[nodiscard]] constexpr bool is_wgmma(prefill_kernel k) { return k == prefill_kernel::wgmma; }

// Whether automatic may pick the wgmma kernel for this cache before the device is asked (callers skip the
// device query when it cannot).
[[nodiscard]] constexpr bool wgmma_prefill_fits(int head_dim, bool fp8_kv) { return head_dim == 128 && !fp8_kv; }

// The kernel a prefill launch runs: `requested` made concrete (automatic: wgmma where it fits and the device runs
// it, else mma_sync), or an error naming why a requested wgmma kernel cannot run here. `wgmma_available`:
// cuda::wgmma_prefill_available() (attention.hpp).
[[nodiscard]] inline prefill_kernel resolve_prefill_kernel(prefill_kernel requested, int head_dim, bool fp8_kv,
                                                          bool wgmma_available) {
  if (requested == prefill_kernel::automatic)
    return wgmma_prefill_fits(head_dim, fp8_kv) && wgmma_available ? prefill_kernel::wgmma : prefill_kernel::mma_sync;
  if (requested == prefill_kernel::mma_sync) return prefill_kernel::mma_sync;
  check(is_wgmma(requested), "prefill kernel: not a cuda::prefill_kernel (", static_cast<int>(requested), ")");
  check(!fp8_kv, "prefill kernel ", to_string(requested), " reads bf16 K/V (FP8 K/V: prefill_kernel::mma_sync)");
  check(head_dim == 128, "prefill kernel ", to_string(requested), " needs head_dim 128, not ", head_dim);
  check(wgmma_available, "prefill kernel ", to_string(requested),
        " needs an sm_90a build (CMAKE_CUDA_ARCHITECTURES=90a) and a compute-capability-9.0 device");
  return requested;
}

}  // namespace zipage::cuda
