#pragma once
// Paged attention on the CUDA device, one entry point: paged_attention() runs the tuned bf16 decode or
// prefill kernel when the kernel variant, the data type, head_dim, the block size, the batch's shape and
// the alignment allow it, else the reference kernel (fp32 or bf16, any head_dim up to 512, any block
// size), which mirrors cpu::paged_attention. The rule is select_attention_kernel(), written once below;
// the backend asks it first only to know whether a decode split plan and its workspace are needed. The two
// tuned kernels keep their own launchers (paged_decode_attention, paged_prefill_attention) for tests and
// benchmarks that choose a split plan or a pipeline depth. The other ops are in ops.hpp.
//
// This header includes no CUDA header: device memory is passed as plain pointers (tensors of dtype `t`
// as `void*`), streams as `cuda_stream` (a `cudaStream_t`; nullptr = the legacy default stream). Every
// function launches asynchronously on `stream` and throws zipage::error, naming the argument, when a
// CUDA call or launch fails or when its arguments are out of range. Each kernel computes the same
// function as cpu::paged_attention (backend/cpu/cpu_backend.hpp), the tuned ones up to bf16 rounding.
//
// Layouts (row-major, elements):
//   KV cache of one layer   K, V: [num_blocks][block_size][num_kv_heads][head_dim]   (paged_kv_view)
//   queries / outputs       [tokens][num_q_heads][head_dim]; query head h uses KV head h / (q/kv ratio)
//   page tables             CSR: page_indptr[num_seqs + 1] offsets into page_indices (block ids, in order)
#include <cstddef>
#include <cstdint>

#include "zipage/backend/cuda/dtype.hpp"
#include "zipage/backend/cuda/fp8_copy.hpp"
#include "zipage/backend/cuda/kernel_variant.hpp"
#include "zipage/backend/cuda/paged_kv_view.hpp"

namespace zipage::cuda {

// ---------------------------------------------------------------------------------------------------
// The tuned decode kernel: one query token per sequence (bf16 q/out; bf16 or FP8 cache).
//
// Sequence s attends to physical slots [0, kv_len[s]) of its page table (its own K/V must already be
// appended). One CTA handles one (sequence, KV head, KV split) and all query heads of that KV group
// (up to 16 at a time), so K/V are read once per group; long contexts are split over several CTAs
// (split-KV) and merged by a second pass (log-sum-exp). head_dim: 64 or 128. block_size: a power of
// two >= 2. q_heads / kv_heads: any integer ratio.
// Each sequence's new token, appended by the decode kernel itself before it reads the cache (the swapped kernels,
// FP8 cache, head_dim 128): what append_kv would write for row s of k / v at slots[s], byte for byte, without
// the append launch before every layer's decode.
struct decode_append {
  const void* k = nullptr;              // bf16 [num_seqs][k_stride], 16-byte aligned rows
  const void* v = nullptr;              // bf16 [num_seqs][v_stride]
  const std::int64_t* slots = nullptr;  // [num_seqs]; < 0: no token (nothing written)
  std::int64_t k_stride = 0;            // elements; multiples of 8
  std::int64_t v_stride = 0;
  [[nodiscard]] constexpr bool wanted() const { return k != nullptr; }
};

struct decode_params {
  const void* q = nullptr;  // bf16 [num_seqs][num_q_heads][head_dim]
  void* out = nullptr;      // bf16 [num_seqs][num_q_heads][head_dim]
  // One layer's cache (bf16 [num_blocks][block_size][num_kv_heads][head_dim]), the page tables of the
  // num_seqs sequences and their lengths kv.kv_len [num_seqs], each in [0, max_kv_len]. FP8 KV cache
  // (docs/fp8.md): with kv.k_scale / kv.v_scale set (bf16 scales; paged_kv_view::fp8_scale_words must hold),
  // the codes go to fp16 MMAs and the scales multiply the scores and probabilities (attention.cuh).
  paged_kv_view kv;
  int num_seqs = 0;
  int num_q_heads = 0;
  int max_kv_len = 0;  // host-side upper bound of kv.kv_len (sizes the split-KV plan)
  float scale = 0.0f;  // softmax scale, usually 1/sqrt(head_dim)
  // When wanted, also out's FP8 copy (fp8_copy.hpp: out as [num_seqs][num_q_heads * head_dim], a 128-column group
  // per head), written by the kernel's epilogue so that an FP8 o projection needs no quantisation launch of its
  // own. Only where decode_writes_fp8_copy(*this, plan) holds.
  fp8_copy out_fp8{};
  // When wanted, the new tokens' K/V are written first (decode_append): paged_decode_attention_swapped only.
  decode_append append{};
};

// How the KV range of each sequence is split: split i covers tokens [i*chunk_tokens, (i+1)*chunk_tokens).
// A sequence shorter than max_kv_len uses only the splits its length reaches.
struct decode_plan {
  int num_splits = 1;    // 1..256
  int chunk_tokens = 0;  // multiple of 64
  int stages = 0;        // K/V pipeline depth in 64-token tiles, 2..4; 0 = the default for head_dim (tuning knob)
};

// Picks the split count from the batch shape, the device's multiprocessor count and the kernel's
// occupancy; `force_splits` > 0 asks for that many (tests), `stages` > 0 a pipeline depth (tuning).
// Host-only, no synchronisation.
decode_plan plan_decode(const decode_params& p, int force_splits = 0, int stages = 0);

// Whether the kernel can write out_fp8 under `plan`: head_dim 128 (a head is one 128-column group) and one split
// (each output row is finished by one CTA, with no merge pass).
[[nodiscard]] bool decode_writes_fp8_copy(const decode_params& p, const decode_plan& plan);

// Device workspace the plan needs (0 when num_splits == 1): fp32 partial outputs and log-sum-exps.
std::size_t decode_workspace_bytes(const decode_params& p, const decode_plan& plan);

// Launches the decode kernel and, when split, the merge kernel (with programmatic dependent launch,
// so its launch overlaps the decode grid). `workspace` must hold decode_workspace_bytes(p, plan) bytes
// of device memory; it is only scratch (no initialisation needed). Stream-capturable.
void paged_decode_attention(const decode_params& p, const decode_plan& plan, void* workspace,
                            std::size_t workspace_bytes, cuda_stream stream);

// The FP8 decode kernel with K and V as the MMAs' A operands (docs/architecture.md, "Decode attention and the power
// cap"): half the MMAs of paged_decode_attention's at groups of up to 8 heads, and 5-6% fewer joules per token at the
// compressed steady state, where every step is power-capped. It runs where decode_swapped_supported holds (FP8 K/V,
// head_dim 128, at most 8 query heads per KV head, a power-of-two block size); the whole cache of a sequence in one
// CTA (no split, no workspace); out_fp8 as paged_decode_attention writes it. Stream-capturable. stages: 3 (0: the
// default; 4 CTAs per multiprocessor) or 4 (3 CTAs per multiprocessor). The engine picks it by
// cuda_backend_options::fp8_decode_kernel (fp8_decode_kernel::automatic: resolve_fp8_decode_kernel's rule).
[[nodiscard]] bool decode_swapped_supported(const decode_params& p);
// `kernel`: swapped or swapped_e4m3_qk (fp8_decode_kernel's two swapped kernels).
void paged_decode_attention_swapped(const decode_params& p, cuda_stream stream, int stages = 0,
                                    fp8_decode_kernel kernel = fp8_decode_kernel::swapped);
// How many full waves of the current device the swapped kernel's grid (one CTA per sequence and KV head, at its
// default depth) makes: its CTAs over the CTAs all multiprocessors hold at once.
[[nodiscard]] double decode_swapped_waves(const decode_params& p);

// ---------------------------------------------------------------------------------------------------
// The tuned prefill kernel: causal GQA attention for a batch of sequences whose new tokens lie back to
// back in q/out. Sequence s owns the query rows [q_indptr[s], q_indptr[s+1]); token t attends to the
// physical slots [0, token_kv_len[t]) of its sequence's page table (as attention_metadata::token_kv_len:
// the new tokens' K/V must already be appended, so a chunk appended to an existing cache works, and so
// does a whole prompt). Tiles of query rows pack the tokens x query heads of one KV group, so one K/V
// tile serves the whole group. head_dim: 64 or 128; q_heads / kv_heads <= 64; block_size: power of two.
// Whether the wgmma prefill kernel can run on the current device: the library was built for sm_90a and the
// device has compute capability 9.0.
bool wgmma_prefill_available();
// resolve_prefill_kernel on the current device (asked only when wgmma may run): the kernel a prefill launch with
// `requested` runs, or the error naming why a requested wgmma kernel cannot.
prefill_kernel prefill_kernel_on_device(prefill_kernel requested, int head_dim, bool fp8_kv);

struct prefill_params {
  const void* q = nullptr;  // bf16 [num_tokens][num_q_heads][head_dim]
  void* out = nullptr;      // bf16 [num_tokens][num_q_heads][head_dim]
  // One layer's cache (bf16, or FP8 as decode_params) and the num_seqs page tables; lengths are per
  // token (token_kv_len), so kv.kv_len is unused.
  paged_kv_view kv;
  const std::int32_t* q_indptr = nullptr;      // [num_seqs + 1], q_indptr[0] = 0, q_indptr[num_seqs] = num_tokens
  const std::int32_t* token_kv_len = nullptr;  // [num_tokens]
  int num_tokens = 0;
  int num_seqs = 0;
  int num_q_heads = 0;
  float scale = 0.0f;  // softmax scale, usually 1/sqrt(head_dim); positive and finite (checked)
  prefill_kernel kernel = prefill_kernel::automatic;
};

void paged_prefill_attention(const prefill_params& p, cuda_stream stream);

// ---------------------------------------------------------------------------------------------------
// The entry point: causal GQA attention of a step's tokens over the paged cache of one layer. Sequence s
// owns the query rows [q_indptr[s], q_indptr[s + 1]) (tokens of a sequence back to back, sequences in
// order); token i attends to the physical slots [0, token_kv_len[i]) of its sequence's page table (its
// own K/V already appended).
struct attention_params {
  const void* q = nullptr;  // [num_tokens][num_q_heads][head_dim] of dtype t
  void* out = nullptr;      // [num_tokens][num_q_heads][head_dim] of dtype t
  // One layer's cache (dtype t, or FP8 codes with kv.k_scale / kv.v_scale set: read as float(code) *
  // scale) and the num_seqs page tables; lengths are per token, so kv.kv_len is unused.
  paged_kv_view kv;
  const std::int32_t* token_seq = nullptr;     // [num_tokens] (reference kernel)
  const std::int32_t* token_kv_len = nullptr;  // [num_tokens]
  const std::int32_t* q_indptr = nullptr;      // [num_seqs + 1] (tuned prefill kernel)
  int num_tokens = 0;
  int num_seqs = 0;
  int num_q_heads = 0;
  int max_kv_len = 0;  // host-side upper bound of token_kv_len (sizes the decode split plan)
  // Host-side: every sequence has exactly one query token (num_tokens == num_seqs, token i is sequence
  // i), so the decode kernel may run.
  bool one_token_per_seq = false;
  float scale = 0.0f;  // softmax scale, usually 1/sqrt(head_dim)
  prefill_kernel prefill = prefill_kernel::automatic;  // when the tuned prefill kernel runs: which one
  // When wanted, out's FP8 copy too (decode_params::out_fp8): only with the tuned decode kernel under a plan where
  // decode_writes_fp8_copy(as_decode_params(p), plan) holds; anything else is an error.
  fp8_copy out_fp8{};
  // Where select_attention_kernel() picks tuned_decode over an FP8 cache: which decode kernel
  // (decode_kernel_for says which one a launch under a plan runs; with the swapped ones the plan and workspace are
  // unused).
  fp8_decode_kernel fp8_decode = fp8_decode_kernel::automatic;
  // When wanted, the decode kernel appends each sequence's new K/V itself (decode_params::append): only where the
  // tuned decode runs a swapped kernel (fp8_decode); anything else is an error.
  decode_append append{};
};

enum class attention_kernel : std::uint8_t { tuned_decode, tuned_prefill, reference };

// The rule. Tuned kernels need v == tuned, t == bf16, head_dim 64 or 128, a power-of-two block size >= 2,
// 16-byte aligned q and out and, for an FP8 cache, scales they can gather as words (paged_kv_view::fp8_scale_words:
// block_size x num_kv_heads even, 4-byte aligned); then the decode kernel when one_token_per_seq and
// num_seqs <= 65535, else the prefill kernel when num_q_heads / num_kv_heads <= 64. Anything else: the reference
// kernel.
[[nodiscard]] attention_kernel select_attention_kernel(cuda_dtype t, const attention_params& p, kernel_variant v);

// The decode kernel's view of `p` (kv.kv_len = token_kv_len: token i is sequence i), for plan_decode()
// and decode_workspace_bytes() when select_attention_kernel() chose tuned_decode.
[[nodiscard]] decode_params as_decode_params(const attention_params& p);

// The decode kernel's split plan and its scratch (decode_workspace_bytes(as_decode_params(p), plan)
// bytes of device memory); unused by the other kernels.
struct attention_workspace {
  decode_plan plan{};
  void* data = nullptr;
  std::size_t bytes = 0;
};

// Where select_attention_kernel() chose tuned_decode: the decode kernel the launch under `plan` runs
// (resolve_fp8_decode_kernel of `requested`; split_kv for a bf16 cache, whose only kernel it is).
[[nodiscard]] fp8_decode_kernel decode_kernel_for(const decode_params& p, fp8_decode_kernel requested,
                                                  const decode_plan& plan);

// Runs the kernel select_attention_kernel(t, p, v) names.
void paged_attention(cuda_dtype t, const attention_params& p, kernel_variant v, const attention_workspace& ws,
                     cuda_stream stream);

}  // namespace zipage::cuda
