// Launcher of batched sampling (kernels: backend/cuda/sampling.cuh and logprob_kernel.cuh, which only this
// translation unit includes).
#include <atomic>
#include <bit>
#include <cstdint>

#include "zipage/backend/cuda/logprob_kernel.cuh"
#include "zipage/backend/cuda/sampling.cuh"
#include "zipage/backend/cuda/sampling.hpp"

namespace zipage::cuda {

namespace {

namespace ds = detail::sampling;

std::int64_t scratch_stride(int vocab) { return (std::int64_t{vocab} + 3) / 4 * 4; }

// Raises a kernel's dynamic shared memory limit when a launch needs more than it was last given (the
// default, 48 KiB minus the static shared memory, is not relied on). `granted` is per kernel.
template <class Kernel>
void allow_smem(Kernel kernel, int bytes, std::atomic<int>& granted) {
  if (bytes <= 16 * 1024 || bytes <= granted.load(std::memory_order_relaxed)) return;
  ZIPAGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  int seen = granted.load(std::memory_order_relaxed);
  while (seen < bytes && !granted.compare_exchange_weak(seen, bytes)) {
  }
}

template <class T>
void launch(const ds::kernel_args& a, int batch, bool sampling, int smem, cudaStream_t stream) {
  static std::atomic<int> granted[2];
  if (sampling) {
    allow_smem(ds::sample_kernel<T, true>, smem, granted[1]);
    ds::sample_kernel<T, true><<<batch, ds::kThreads, smem, stream>>>(a);
  } else {
    allow_smem(ds::sample_kernel<T, false>, smem, granted[0]);
    ds::sample_kernel<T, false><<<batch, ds::kThreads, smem, stream>>>(a);
  }
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace

std::size_t sampling_workspace_bytes(int batch, int vocab, bool all_greedy, bool output_penalties) {
  check(batch >= 0 && vocab >= 1 && vocab <= max_sampling_vocab, "sampling: bad shape: batch ", batch, ", vocab ",
        vocab);
  if (all_greedy && !output_penalties) return 0;
  return static_cast<std::size_t>(batch) * static_cast<std::size_t>(scratch_stride(vocab)) * sizeof(std::uint32_t);
}

void sample_tokens(const sampling_batch& p, void* workspace, std::size_t workspace_bytes, cuda_stream stream) {
  const bool sampling = p.temperature != nullptr;
  const bool output_penalties =
      (p.frequency_penalty != nullptr || p.presence_penalty != nullptr) && p.context_indptr != nullptr;
  const std::size_t need = sampling_workspace_bytes(p.batch, p.vocab, !sampling, output_penalties);
  check(p.batch <= 0x7fffffff, "sampling: batch too large");
  if (p.batch == 0) return;
  const std::int64_t row_stride = p.row_stride == 0 ? p.vocab : p.row_stride;
  check(row_stride >= p.vocab, "sampling: row_stride ", row_stride, " is smaller than the vocabulary ", p.vocab);
  check(p.logits != nullptr && p.out_tokens != nullptr, "sampling: logits and out_tokens are required");
  check(workspace_bytes >= need && (need == 0 || workspace != nullptr), "sampling: workspace of ", workspace_bytes,
        " bytes, ", need, " needed");
  check((reinterpret_cast<std::uintptr_t>(workspace) & 15u) == 0, "sampling: workspace must be 16-byte aligned");
  check((p.context_indptr == nullptr) == (p.context_ids == nullptr),
        "sampling: context_indptr and context_ids go together");
  const bool edits = p.edit_indptr != nullptr;
  check(edits == (p.edit_ids != nullptr) && edits == (p.edit_adds != nullptr) &&
            edits == (p.edit_others_banned != nullptr),
        "sampling: edit_indptr, edit_ids, edit_adds and edit_others_banned go together");

  ds::kernel_args a{};
  a.logits = p.logits;
  a.row_stride = row_stride;
  a.vocab = p.vocab;
  a.temperature = p.temperature;
  a.top_k = p.top_k;
  a.top_p = p.top_p;
  a.min_p = p.min_p;
  a.penalty = p.repetition_penalty;
  a.frequency = p.frequency_penalty;
  a.presence = p.presence_penalty;
  a.seed = p.seed;
  a.step = p.step;
  a.ctx_indptr = p.context_indptr;
  a.ctx_ids = p.context_ids;
  a.edit_indptr = p.edit_indptr;
  a.edit_ids = p.edit_ids;
  a.edit_adds = p.edit_adds;
  a.edit_others_banned = p.edit_others_banned;
  a.out = p.out_tokens;
  a.scratch = static_cast<std::uint32_t*>(workspace);
  a.scratch_stride = scratch_stride(p.vocab);
  // Fixed-point scale: vocab * 2^bits < 2^64, so no row total overflows.
  const int scale_bits = 63 - (std::bit_width(static_cast<unsigned>(p.vocab)) - 1);
  a.scale = static_cast<float>(std::uint64_t{1} << scale_bits);
  const std::size_t elem = p.dtype == logits_dtype::f32 ? 4 : 2;
  a.vec_ok = (reinterpret_cast<std::uintptr_t>(p.logits) % (4 * elem)) == 0 && row_stride % 4 == 0;
  a.output_penalties = output_penalties;
  a.use_bitmap = (p.repetition_penalty != nullptr && p.context_indptr != nullptr) || output_penalties;

  // Histograms, then the context's bitmap, then the edited ids' bitmap (66 KB at a 152k vocabulary: two CTAs
  // per multiprocessor still fit).
  const int bitmap_bytes = (p.vocab + 31) / 32 * 4;
  const int smem = (sampling ? ds::kHistBytes : 0) + (a.use_bitmap ? bitmap_bytes : 0) + (edits ? bitmap_bytes : 0);
  if (p.dtype == logits_dtype::f32)
    launch<float>(a, p.batch, sampling, smem, stream);
  else
    launch<detail::bf16>(a, p.batch, sampling, smem, stream);

  if (p.out_logprobs == nullptr) return;
  check(p.max_top_logprobs >= 0 && p.max_top_logprobs <= 20, "sampling: max_top_logprobs ", p.max_top_logprobs,
        " outside [0, 20]");
  check(p.top_logprobs == nullptr || (p.max_top_logprobs > 0 && p.out_top_ids != nullptr && p.out_top_logprobs != nullptr),
        "sampling: top_logprobs needs max_top_logprobs > 0, out_top_ids and out_top_logprobs");
  ds::logprob_args l{};
  l.logits = p.logits;
  l.row_stride = row_stride;
  l.vocab = p.vocab;
  l.vec_ok = a.vec_ok;
  l.tokens = p.out_tokens;
  l.top = p.top_logprobs;
  l.max_top = p.max_top_logprobs;
  l.out_logprob = p.out_logprobs;
  l.out_top_ids = p.out_top_ids;
  l.out_top_logprobs = p.out_top_logprobs;
  if (p.dtype == logits_dtype::f32)
    ds::logprob_kernel<float><<<p.batch, ds::kThreads, 0, stream>>>(l);
  else
    ds::logprob_kernel<detail::bf16><<<p.batch, ds::kThreads, 0, stream>>>(l);
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace zipage::cuda
