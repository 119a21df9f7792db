#pragma once
// Batched token sampling on the GPU: one launch turns a [batch][vocab] block of logits into one token id
// per request, computing the same function as the CPU reference zipage::sampler (sampling/sampler.hpp):
//
//   logits processors (zipage/sampling/logits_processors.hpp's edit)
//   -> repetition penalty -> frequency and presence penalties -> greedy argmax if temperature == 0 (ties: lowest id)
//   -> divide by temperature
//   -> softmax -> top-k -> top-p -> min-p -> renormalise
//   -> inverse-CDF draw with sampling_uniform(seed, step) over the kept tokens, walked in descending
//      probability order with ties broken by ascending id.
//
// Same conventions as the CPU: NaN logits count as -inf, +inf as the largest float, a row that is all
// -inf/NaN yields token 0, a temperature that is not > 0 samples greedily (the CPU does so for 0 and NaN),
// and knobs out of range degrade to "off" (top_k <= 0, top_p >= 1 or NaN, min_p <= 0 or NaN).
//
// How close to the CPU: the unnormalised weights exp((logit - max) / temperature) are bit-identical to
// the CPU's (the kernel evaluates glibc's expf algorithm in double precision, operation by operation), so
// greedy tokens, top-k and min-p sets are identical. Probability masses are summed exactly, in 64-bit
// fixed point (weights scaled by 2^(63 - floor(log2 vocab))), where the CPU sums doubles in sorted order,
// so a top-p cut or a draw can differ from the CPU's only when its target lies within about 1e-13 (relative)
// of a CDF boundary. The result is deterministic: it does not depend on thread scheduling, nor on the
// other rows of the batch.
//
// This header includes no CUDA header: device memory is passed as plain pointers, streams as cuda_stream
// (dtype.hpp). sample_tokens() launches asynchronously on `stream` and throws zipage::error when its
// arguments are out of range or a launch fails. Stream-capturable (no allocation, no synchronisation).
#include <cstddef>
#include <cstdint>

#include "zipage/backend/cuda/dtype.hpp"  // cuda_stream

namespace zipage::cuda {

enum class logits_dtype { f32, bf16 };

struct sampling_batch {
  // ---- Logits (device memory): row r at logits + r * row_stride elements.
  const void* logits = nullptr;  // fp32 or bf16 (raw 16-bit values) [batch][vocab]
  logits_dtype dtype = logits_dtype::f32;
  std::int64_t row_stride = 0;  // elements; 0 = vocab
  int batch = 0;
  int vocab = 0;  // 1 .. max_sampling_vocab

  // ---- Per-request parameters (device arrays of `batch` entries). A null array means "every request
  // uses the default": temperature 0 (greedy; then no workspace is needed), top_k 0, top_p 1, min_p 0,
  // repetition_penalty 1, seed 0, step 0.
  const float* temperature = nullptr;
  const std::int32_t* top_k = nullptr;
  const float* top_p = nullptr;
  const float* min_p = nullptr;
  const float* repetition_penalty = nullptr;
  const float* frequency_penalty = nullptr;  // OpenAI's, over the generated tokens (below); null = 0
  const float* presence_penalty = nullptr;   // null = 0
  const std::uint64_t* seed = nullptr;
  const std::uint64_t* step = nullptr;  // index of the token being generated (number generated so far)

  // ---- Context of the penalties (prompt + generated tokens), as CSR: request r's tokens are
  // context_ids[context_indptr[r] .. context_indptr[r + 1]). Null = no context. Ids outside [0, vocab)
  // are ignored (the CPU sampler throws on them). The repetition penalty covers the whole range (a token
  // seen several times is penalised once); the frequency and presence penalties its last step[r] ids, the
  // generated tokens (counted in the workspace), so a row with only those penalties may pass just them.
  const std::int32_t* context_indptr = nullptr;  // [batch + 1]
  const std::int32_t* context_ids = nullptr;

  // ---- Logits processors: each row's zipage::logit_edits (zipage/sampling/logits_processors.hpp) as CSR. Row
  // r's edited ids are edit_ids[edit_indptr[r] .. edit_indptr[r + 1]) (ascending, unique, in [0, vocab): the
  // host makes them so), their adds beside them in edit_adds (a bias, 0, or -inf for a ban), and with
  // edit_others_banned[r] != 0 every id the row does not name is -inf (allowed_token_ids). Null = no row is
  // edited. The penalties and the draw then see the edited values; log-probabilities stay the raw logits'.
  const std::int32_t* edit_indptr = nullptr;  // [batch + 1]
  const std::int32_t* edit_ids = nullptr;
  const float* edit_adds = nullptr;
  const std::int32_t* edit_others_banned = nullptr;  // [batch]

  // ---- Output (device memory).
  std::int32_t* out_tokens = nullptr;  // [batch]

  // ---- Log-probabilities (optional, device memory), under the raw logits as zipage/sampling/logprobs.hpp
  // computes them on the host (log-softmax before penalties and filters; NaN as -inf, +inf as the largest
  // float): with out_logprobs, each row's sampled token's; with top_logprobs too, the top_logprobs[r] most
  // likely tokens of row r (at most max_top_logprobs, most likely first, ties by ascending id) into row r of
  // out_top_ids / out_top_logprobs ([batch][max_top_logprobs]; entries past a row's count are left as they
  // are). A second kernel after the draw, on the same stream; the sum of the log-sum-exp is in another order
  // than the host's, so values agree within float rounding, ids exactly.
  float* out_logprobs = nullptr;
  const std::int32_t* top_logprobs = nullptr;
  int max_top_logprobs = 0;  // 0 .. 20
  std::int32_t* out_top_ids = nullptr;
  float* out_top_logprobs = nullptr;
};

inline constexpr int max_sampling_vocab = 1 << 20;

// Device scratch that sample_tokens() needs for this batch shape: the weights of every row (4 bytes per
// logit, rows padded to 16 bytes), which also hold the counts of the frequency and presence penalties.
// 0 when `all_greedy` (temperature == nullptr) and no `output_penalties` (frequency_penalty or
// presence_penalty given with a context): never more than a sampling batch needs.
std::size_t sampling_workspace_bytes(int batch, int vocab, bool all_greedy = false, bool output_penalties = false);

// Launches one CTA per request. `workspace` (16-byte aligned) must hold sampling_workspace_bytes(batch,
// vocab, p.temperature == nullptr, output penalties given) bytes; it is only scratch (no initialisation
// needed).
void sample_tokens(const sampling_batch& p, void* workspace, std::size_t workspace_bytes, cuda_stream stream);

}  // namespace zipage::cuda
