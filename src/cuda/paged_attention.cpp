// The entry point of backend/cuda/attention.hpp: select_attention_kernel() (the rule, documented next to
// its declaration) and paged_attention(), which runs the kernel it names. Host code only; the kernels are
// in decode_attention.cu, prefill_attention.cu and reference_attention.cu.
#include <cstdint>

#include "kernel_launchers.hpp"
#include "launch_checks.hpp"
#include "zipage/backend/cuda/attention.hpp"
#include "zipage/core/error.hpp"

namespace zipage::cuda {

namespace {

using detail::aligned16;
using detail::power_of_two;

prefill_params as_prefill_params(const attention_params& p) {
  prefill_params f;
  f.q = p.q;
  f.out = p.out;
  f.kv = p.kv;
  f.q_indptr = p.q_indptr;
  f.token_kv_len = p.token_kv_len;
  f.num_tokens = p.num_tokens;
  f.num_seqs = p.num_seqs;
  f.num_q_heads = p.num_q_heads;
  f.scale = p.scale;
  f.kernel = p.prefill;
  return f;
}

}  // namespace

attention_kernel select_attention_kernel(cuda_dtype t, const attention_params& p, kernel_variant v) {
  const int d = p.kv.head_dim;
  // (FP8: the tuned kernels gather the 2-byte scales as 4-byte words, paged_kv_view::fp8_scale_words; cuda_backend's
  // pools always allow it, a hand-made view may not.)
  const bool tuned = v == kernel_variant::tuned && t == cuda_dtype::bf16 && (d == 64 || d == 128) &&
                     p.kv.block_size >= 2 && power_of_two(p.kv.block_size) && aligned16(p.q) && aligned16(p.out) &&
                     (!p.kv.fp8() || p.kv.fp8_scale_words());
  if (!tuned || p.kv.num_kv_heads <= 0) return attention_kernel::reference;
  if (p.one_token_per_seq && p.num_seqs <= 65535) return attention_kernel::tuned_decode;
  if (p.num_q_heads / p.kv.num_kv_heads <= 64) return attention_kernel::tuned_prefill;
  return attention_kernel::reference;
}

decode_params as_decode_params(const attention_params& p) {
  decode_params d;
  d.q = p.q;
  d.out = p.out;
  d.kv = p.kv;
  d.kv.kv_len = p.token_kv_len;  // one token per sequence: token i is sequence i
  d.num_seqs = p.num_seqs;
  d.num_q_heads = p.num_q_heads;
  d.max_kv_len = p.max_kv_len;
  d.scale = p.scale;
  d.out_fp8 = p.out_fp8;
  d.append = p.append;
  return d;
}

fp8_decode_kernel decode_kernel_for(const decode_params& p, fp8_decode_kernel requested, const decode_plan& plan) {
  if (p.kv.k_scale == nullptr) return fp8_decode_kernel::split_kv;  // bf16 K/V: the only kernel
  const bool fits = decode_swapped_supported(p);
  // The waves matter only to automatic on a split plan (an occupancy query the first time, cached after).
  const bool ask_waves = fits && requested == fp8_decode_kernel::automatic && plan.num_splits > 1;
  return resolve_fp8_decode_kernel(requested, fits, plan.num_splits, ask_waves ? decode_swapped_waves(p) : 0.0);
}

void paged_attention(cuda_dtype t, const attention_params& p, kernel_variant v, const attention_workspace& ws,
                     cuda_stream stream) {
  const attention_kernel kernel = select_attention_kernel(t, p, v);
  check(!p.out_fp8.wanted() || kernel == attention_kernel::tuned_decode,
        "paged_attention: out_fp8 is written by the tuned decode kernel only (bf16, head_dim 128, one query token per "
        "sequence)");
  check(!p.append.wanted() || kernel == attention_kernel::tuned_decode,
        "paged_attention: append is done by the tuned decode kernel only (the swapped kernels)");
  switch (kernel) {
    case attention_kernel::tuned_decode: {
      check(p.num_tokens == p.num_seqs, "paged_attention: one_token_per_seq, but ", p.num_tokens, " tokens for ",
            p.num_seqs, " sequences");
      const decode_params d = as_decode_params(p);
      const fp8_decode_kernel k = decode_kernel_for(d, p.fp8_decode, ws.plan);
      check(!p.append.wanted() || is_swapped(k), "paged_attention: append is done by the swapped decode kernels only "
            "(this launch runs ", to_string(k), ")");
      switch (k) {
        case fp8_decode_kernel::swapped:
        case fp8_decode_kernel::swapped_e4m3_qk: return paged_decode_attention_swapped(d, stream, 0, k);
        default: return paged_decode_attention(d, ws.plan, ws.data, ws.bytes, stream);
      }
    }
    case attention_kernel::tuned_prefill:
      return paged_prefill_attention(as_prefill_params(p), stream);
    case attention_kernel::reference:
      return reference::paged_attention(t, p, stream);
  }
}

}  // namespace zipage::cuda
