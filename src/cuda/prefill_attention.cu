// Paged prefill attention (causal, GQA) for head_dim 64 and 128: the mma.sync kernel, and on Hopper the
// wgmma kernel for bf16 K/V at head_dim 128.
#include <cmath>
#include <cstdint>

#include "zipage/backend/cuda/attention.hpp"
#include "zipage/backend/cuda/prefill_kernel.cuh"

namespace zipage::cuda {

namespace {

using detail::prefill_config;

template <int D, bool F8>
void launch(const detail::prefill_args& a, int num_tokens, cuda_stream stream) {
  detail::opt_in_smem<detail::paged_prefill_kernel<D, F8>>(prefill_config<D, F8>::kSmemBytes);
  // Upper bound on the query tiles: sum over sequences of ceil(n_s / tq) <= num_tokens / tq + num_seqs.
  const long long tiles = static_cast<long long>(num_tokens) / a.tokens_per_tile + a.num_seqs;
  check(tiles < (1ll << 31), "paged_prefill_attention: too many query tiles");
  const dim3 grid(static_cast<unsigned>(tiles), a.num_kv_heads);
  detail::paged_prefill_kernel<D, F8>
      <<<grid, prefill_config<D, F8>::kThreads, prefill_config<D, F8>::kSmemBytes, stream>>>(a);
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void paged_prefill_attention(const prefill_params& p, cuda_stream stream) {
  check(p.kv.head_dim == 64 || p.kv.head_dim == 128, "paged_prefill_attention: head_dim ", p.kv.head_dim,
        " is not supported (64 or 128)");
  check(p.kv.num_kv_heads > 0 && p.num_q_heads > 0 && p.num_q_heads % p.kv.num_kv_heads == 0,
        "paged_prefill_attention: ", p.num_q_heads, " query heads are not a multiple of ", p.kv.num_kv_heads, " KV heads");
  const int group = p.num_q_heads / p.kv.num_kv_heads;
  check(group <= prefill_config<128>::kRows, "paged_prefill_attention: ", group,
        " query heads per KV head (at most 64)");
  check(p.kv.num_kv_heads <= 65535, "paged_prefill_attention: too many KV heads");
  int shift = 0;
  while ((1 << shift) < p.kv.block_size) ++shift;
  check(p.kv.block_size >= 2 && (1 << shift) == p.kv.block_size, "paged_prefill_attention: block_size ", p.kv.block_size,
        " is not a power of two >= 2");
  const prefill_kernel kernel = prefill_kernel_on_device(p.kernel, p.kv.head_dim, p.kv.k_scale != nullptr);
  // (> 0: the wgmma kernel takes a row's max before scaling; finite: a NaN or infinite scale has no meaning)
  check(p.scale > 0.0f && p.scale < INFINITY, "paged_prefill_attention: scale ", p.scale,
        " must be positive and finite");
  if (p.num_tokens == 0 || p.num_seqs == 0) return;

  detail::prefill_args a{};
  a.q = static_cast<const detail::bf16*>(p.q);
  a.out = static_cast<detail::bf16*>(p.out);
  a.k = static_cast<const detail::bf16*>(p.kv.k_cache);
  a.v = static_cast<const detail::bf16*>(p.kv.v_cache);
  const bool fp8 = p.kv.k_scale != nullptr;
  check(fp8 == (p.kv.v_scale != nullptr), "paged_prefill_attention: FP8 needs both k_scale and v_scale");
  check(!fp8 || p.kv.fp8_scale_words(), "paged_prefill_attention: FP8 scales need block_size x num_kv_heads even "
        "and 4-byte aligned scale arrays (got block_size ", p.kv.block_size, ", ", p.kv.num_kv_heads, " KV heads)");
  a.k8 = static_cast<const std::uint8_t*>(p.kv.k_cache);
  a.v8 = static_cast<const std::uint8_t*>(p.kv.v_cache);
  a.k_scale = p.kv.k_scale;
  a.v_scale = p.kv.v_scale;
  a.q_indptr = p.q_indptr;
  a.token_kv_len = p.token_kv_len;
  a.page_indptr = p.kv.page_indptr;
  a.page_indices = p.kv.page_indices;
  a.num_seqs = p.num_seqs;
  a.num_q_heads = p.num_q_heads;
  a.num_kv_heads = p.kv.num_kv_heads;
  a.group = group;
  a.tokens_per_tile = prefill_config<128>::kRows / group;
  a.bs_shift = shift;
  a.scale_log2 = p.scale * detail::kLog2e;
  if (is_wgmma(kernel)) {
    detail::launch_prefill_wgmma(a, p.num_tokens, stream);
    return;
  }
  if (p.kv.head_dim == 128)
    fp8 ? launch<128, true>(a, p.num_tokens, stream) : launch<128, false>(a, p.num_tokens, stream);
  else
    fp8 ? launch<64, true>(a, p.num_tokens, stream) : launch<64, false>(a, p.num_tokens, stream);
}

}  // namespace zipage::cuda
