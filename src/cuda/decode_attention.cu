// Paged decode attention: split-KV planning, the decode kernel for head_dim 64 and 128, and the merge.
#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>

#include "launch_checks.hpp"
#include "zipage/backend/cuda/attention.hpp"
#include "zipage/backend/cuda/decode_kernel.cuh"

namespace zipage::cuda {

namespace {

using detail::decode_args;
using detail::decode_config;

int log2_exact(int x) {
  int s = 0;
  while ((1 << s) < x) ++s;
  return (1 << s) == x ? s : -1;
}

void validate(const decode_params& p) {
  check(p.kv.head_dim == 64 || p.kv.head_dim == 128, "paged_decode_attention: head_dim ", p.kv.head_dim,
        " is not supported (64 or 128)");
  check(p.kv.num_kv_heads > 0 && p.num_q_heads > 0 && p.num_q_heads % p.kv.num_kv_heads == 0,
        "paged_decode_attention: ", p.num_q_heads, " query heads are not a multiple of ", p.kv.num_kv_heads, " KV heads");
  const int shift = log2_exact(p.kv.block_size);
  check(shift >= 1, "paged_decode_attention: block_size ", p.kv.block_size, " is not a power of two >= 2");
  check(p.num_seqs >= 0 && p.num_seqs <= 65535, "paged_decode_attention: ", p.num_seqs, " sequences (at most 65535)");
  check(p.max_kv_len >= 0, "paged_decode_attention: negative max_kv_len");
  check((p.kv.k_scale == nullptr) == (p.kv.v_scale == nullptr), "paged_decode_attention: FP8 needs both k_scale and v_scale");
  check(!p.kv.fp8() || p.kv.fp8_scale_words(), "paged_decode_attention: FP8 scales need block_size x num_kv_heads "
        "even and 4-byte aligned scale arrays (got block_size ", p.kv.block_size, ", ", p.kv.num_kv_heads,
        " KV heads)");
}

void validate_fp8_copy(const decode_params& p, const decode_plan& plan) {
  if (!p.out_fp8.wanted()) return;
  check(decode_writes_fp8_copy(p, plan), "paged_decode_attention: out_fp8 needs head_dim 128 (got ", p.kv.head_dim,
        ") and a plan of one split (got ", plan.num_splits, ")");
  detail::check_fp8_copy("paged_decode_attention (out_fp8)", p.out_fp8, p.num_seqs);
}

template <int D, int S, bool F8>
void prepare_kernel() {
  detail::opt_in_smem<detail::paged_decode_kernel<D, S, F8>>(decode_config<D, S, F8>::kSmemBytes);
}

int default_stages(int head_dim, bool fp8) {
  if (fp8) return head_dim == 128 ? detail::kDecodeDefaultStages<128, true> : detail::kDecodeDefaultStages<64, true>;
  return head_dim == 128 ? detail::kDecodeDefaultStages<128> : detail::kDecodeDefaultStages<64>;
}

// Calls f.template operator()<D, S, F8>() for the runtime (head_dim, stages, FP8 cache or not).
template <bool F8, class F>
void dispatch_kv(int head_dim, int stages, F&& f) {
  if (head_dim == 128) {
    if (stages == 2) return f.template operator()<128, 2, F8>();
    if (stages == 3) return f.template operator()<128, 3, F8>();
    return f.template operator()<128, 4, F8>();
  }
  if (stages == 2) return f.template operator()<64, 2, F8>();
  if (stages == 3) return f.template operator()<64, 3, F8>();
  return f.template operator()<64, 4, F8>();
}
template <class F>
void dispatch(int head_dim, int stages, bool fp8, F&& f) {
  if (fp8) return dispatch_kv<true>(head_dim, stages, f);
  return dispatch_kv<false>(head_dim, stages, f);
}

// Resident decode CTAs per multiprocessor times multiprocessors for the current device.
int decode_slots(int head_dim, int stages, bool fp8) {
  static std::mutex mu;
  static std::array<std::array<int, 12>, 64> cache{};
  int dev = 0;
  ZIPAGE_CUDA_CHECK(cudaGetDevice(&dev));
  const int which = (fp8 ? 6 : 0) + (head_dim == 128 ? 3 : 0) + (stages - 2);
  std::lock_guard lock(mu);
  if (dev < 64 && cache[std::size_t(dev)][std::size_t(which)] > 0) return cache[std::size_t(dev)][std::size_t(which)];
  int per_sm = 0;
  dispatch(head_dim, stages, fp8, [&]<int D, int S, bool F8>() {
    prepare_kernel<D, S, F8>();
    ZIPAGE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, detail::paged_decode_kernel<D, S, F8>,
                                                                    decode_config<D, S, F8>::kThreads,
                                                                    decode_config<D, S, F8>::kSmemBytes));
  });
  const int slots = std::max(1, per_sm) * detail::device_multiprocessors();
  if (dev < 64) cache[std::size_t(dev)][std::size_t(which)] = slots;
  return slots;
}

int round_up(int x, int m) { return (x + m - 1) / m * m; }

template <int D, int S, bool F8>
void launch(const decode_params& p, const decode_plan& plan, void* workspace, cuda_stream stream) {
  prepare_kernel<D, S, F8>();
  decode_args a = detail::make_decode_args(p, plan.num_splits, plan.chunk_tokens);
  if (plan.num_splits > 1) {
    a.ws_o = static_cast<float*>(workspace);
    a.ws_lse = a.ws_o + std::size_t(p.num_seqs) * p.num_q_heads * plan.num_splits * D;
  }
  const dim3 grid(plan.num_splits, p.kv.num_kv_heads * a.head_chunks, p.num_seqs);
  detail::paged_decode_kernel<D, S, F8>
      <<<grid, decode_config<D, S, F8>::kThreads, decode_config<D, S, F8>::kSmemBytes, stream>>>(a);
  ZIPAGE_CUDA_CHECK_LAUNCH();
  if (plan.num_splits > 1) {
    // Programmatic dependent launch: the merge grid is launched while the decode grid runs and waits
    // for its completion on the device (griddepcontrol.wait), which hides one launch latency.
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(p.num_seqs) * static_cast<unsigned>(p.num_q_heads));
    config.blockDim = dim3(256);
    config.dynamicSmemBytes = 0;
    config.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attr;
    config.numAttrs = 1;
    ZIPAGE_CUDA_CHECK(cudaLaunchKernelEx(&config, detail::decode_merge_kernel<D>, a));
    ZIPAGE_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

decode_plan plan_decode(const decode_params& p, int force_splits, int stages) {
  validate(p);
  check(stages == 0 || (stages >= 2 && stages <= 4), "plan_decode: stages ", stages, " (2..4, or 0 for the default)");
  if (stages == 0) stages = default_stages(p.kv.head_dim, p.kv.k_scale != nullptr);
  const int len = std::max(1, p.max_kv_len);
  const int max_splits = std::min(detail::kMaxDecodeSplits, (len + detail::kKvTile - 1) / detail::kKvTile);
  auto make = [&](int splits) {
    decode_plan plan;
    plan.chunk_tokens = round_up((len + splits - 1) / splits, detail::kKvTile);
    plan.num_splits = (len + plan.chunk_tokens - 1) / plan.chunk_tokens;
    plan.stages = stages;
    return plan;
  };
  if (force_splits > 0) return make(std::min(force_splits, max_splits));

  // Estimated time ~ waves x (tokens per CTA + start-up cost), plus a merge pass when split.
  const int group = p.num_q_heads / p.kv.num_kv_heads;
  const long long ctas_per_split = static_cast<long long>(p.num_seqs) * p.kv.num_kv_heads * ((group + 15) / 16);
  if (ctas_per_split == 0) return make(1);
  const long long slots = decode_slots(p.kv.head_dim, stages, p.kv.k_scale != nullptr);
  constexpr long long kStartupTokens = 96;  // a CTA's fixed cost in tokens streamed
  constexpr long long kMergeTokens = 64;
  decode_plan best = make(1);
  long long best_cost = -1;
  for (int s = 1; s <= std::min(max_splits, 128); ++s) {
    const decode_plan plan = make(s);
    if (plan.num_splits != s) continue;
    const long long waves = (ctas_per_split * plan.num_splits + slots - 1) / slots;
    const long long cost = waves * (plan.chunk_tokens + kStartupTokens) + (plan.num_splits > 1 ? kMergeTokens : 0);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best = plan;
    }
  }
  return best;
}

bool decode_writes_fp8_copy(const decode_params& p, const decode_plan& plan) {
  return p.kv.head_dim == 128 && plan.num_splits == 1;
}

std::size_t decode_workspace_bytes(const decode_params& p, const decode_plan& plan) {
  if (plan.num_splits <= 1) return 0;
  return std::size_t(p.num_seqs) * p.num_q_heads * plan.num_splits * (p.kv.head_dim + 1) * sizeof(float);
}

void paged_decode_attention(const decode_params& p, const decode_plan& plan, void* workspace,
                            std::size_t workspace_bytes, cuda_stream stream) {
  validate(p);
  check(plan.num_splits >= 1 && plan.chunk_tokens > 0 && plan.chunk_tokens % detail::kKvTile == 0 &&
            std::int64_t{plan.num_splits} * plan.chunk_tokens >= p.max_kv_len,
        "paged_decode_attention: plan (", plan.num_splits, " splits of ", plan.chunk_tokens,
        " tokens) does not cover max_kv_len ", p.max_kv_len);
  check(plan.num_splits <= detail::kMaxDecodeSplits, "paged_decode_attention: ", plan.num_splits, " splits (at most ",
        detail::kMaxDecodeSplits, ")");
  check(workspace_bytes >= decode_workspace_bytes(p, plan) && (plan.num_splits == 1 || workspace != nullptr),
        "paged_decode_attention: workspace of ", workspace_bytes, " bytes, the plan needs ",
        decode_workspace_bytes(p, plan));
  check(plan.stages == 0 || (plan.stages >= 2 && plan.stages <= 4), "paged_decode_attention: plan.stages ", plan.stages);
  validate_fp8_copy(p, plan);
  if (p.num_seqs == 0) return;
  const int stages = plan.stages == 0 ? default_stages(p.kv.head_dim, p.kv.k_scale != nullptr) : plan.stages;
  dispatch(p.kv.head_dim, stages, p.kv.k_scale != nullptr,
           [&]<int D, int S, bool F8>() { launch<D, S, F8>(p, plan, workspace, stream); });
}

}  // namespace zipage::cuda
