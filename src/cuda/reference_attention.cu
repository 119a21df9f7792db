// The generic paged attention (the `reference` launcher of kernel_launchers.hpp that paged_attention.cpp picks
// when the tuned decode / prefill kernels cannot take the inputs): any head_dim up to 512 and block size, fp32
// or bf16, FP8 K/V read as float(code) * scale; the softmax over each token's whole KV range as
// cpu::paged_attention computes it.
#include <cstdint>

#include "kernel_launchers.hpp"
#include "reference_common.cuh"
#include "zipage/backend/cuda/attention.hpp"
#include "zipage/backend/cuda/fp8.cuh"

namespace zipage::cuda {

namespace {

// ---- generic paged attention: one 128-thread CTA per (token, query head).
constexpr int kAttnThreads = 128;
constexpr int kAttnChunk = 64;
constexpr int kAttnMaxDim = 512;

// K/V element i of the head at `row` (= slot * kv_heads + head): bf16/fp32 as stored, or FP8
// float(code) * scale (the bf16 scale as an fp32, kv_scale_to_f32).
template <class T, bool FP8>
__device__ __forceinline__ float kv_at(const void* cache, const std::uint16_t* scales, std::int64_t row, int d, int i) {
  if constexpr (FP8)
    return detail::e4m3_to_f32(static_cast<const std::uint8_t*>(cache)[row * d + i]) * kv_scale_to_f32(scales[row]);
  else
    return load_f(static_cast<const T*>(cache), row * d + i);
}

template <class T, bool FP8>
__global__ void __launch_bounds__(kAttnThreads) paged_attention_kernel(attention_params p) {
  __shared__ float qs[kAttnMaxDim];
  __shared__ float ss[kAttnChunk];
  const int t = blockIdx.x;
  const int h = blockIdx.y;
  const int d = p.kv.head_dim;
  const int kvh = h / (p.num_q_heads / p.kv.num_kv_heads);
  const T* q = static_cast<const T*>(p.q) + (std::int64_t{t} * p.num_q_heads + h) * d;
  T* out = static_cast<T*>(p.out) + (std::int64_t{t} * p.num_q_heads + h) * d;
  const int s = p.token_seq[t];
  const int len = p.token_kv_len[t];
  const std::int32_t* pages = p.kv.page_indices + p.kv.page_indptr[s];
  for (int i = threadIdx.x; i < d; i += kAttnThreads) qs[i] = load_f(q, i);
  __syncthreads();

  constexpr int kPer = kAttnMaxDim / kAttnThreads;
  float acc[kPer] = {};
  float m = -INFINITY, l = 0.0f;
  for (int j0 = 0; j0 < len; j0 += kAttnChunk) {
    const int n = min(kAttnChunk, len - j0);
    for (int jj = threadIdx.x; jj < n; jj += kAttnThreads) {
      const int j = j0 + jj;
      const std::int64_t slot = std::int64_t{pages[j / p.kv.block_size]} * p.kv.block_size + j % p.kv.block_size;
      const std::int64_t row = slot * p.kv.num_kv_heads + kvh;
      float dot = 0.0f;
      for (int i = 0; i < d; ++i) dot += qs[i] * kv_at<T, FP8>(p.kv.k_cache, p.kv.k_scale, row, d, i);
      ss[jj] = dot * p.scale;
    }
    __syncthreads();
    float cm = -INFINITY;
    for (int jj = 0; jj < n; ++jj) cm = fmaxf(cm, ss[jj]);
    const float m_new = fmaxf(m, cm);
    const float corr = m == -INFINITY ? 0.0f : expf(m - m_new);
    l *= corr;
#pragma unroll
    for (int r = 0; r < kPer; ++r) acc[r] *= corr;
    for (int jj = 0; jj < n; ++jj) {
      const int j = j0 + jj;
      const float pj = expf(ss[jj] - m_new);
      l += pj;
      const std::int64_t slot = std::int64_t{pages[j / p.kv.block_size]} * p.kv.block_size + j % p.kv.block_size;
      const std::int64_t row = slot * p.kv.num_kv_heads + kvh;
#pragma unroll
      for (int r = 0; r < kPer; ++r) {
        const int i = threadIdx.x + r * kAttnThreads;
        if (i < d) acc[r] += pj * kv_at<T, FP8>(p.kv.v_cache, p.kv.v_scale, row, d, i);
      }
    }
    m = m_new;
    __syncthreads();
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    const int i = threadIdx.x + r * kAttnThreads;
    if (i < d) store_f(out, i, acc[r] * inv);
  }
}

}  // namespace

namespace reference {

void paged_attention(cuda_dtype t, const attention_params& p, cuda_stream stream) {
  check(p.kv.head_dim > 0 && p.kv.head_dim <= kAttnMaxDim, "paged_attention: head_dim ", p.kv.head_dim, " (at most ",
        kAttnMaxDim, ")");
  check(p.kv.num_kv_heads > 0 && p.num_q_heads % p.kv.num_kv_heads == 0, "paged_attention: ", p.num_q_heads,
        " query heads are not a multiple of ", p.kv.num_kv_heads, " KV heads");
  check(p.num_q_heads < 65536 && p.kv.block_size > 0, "paged_attention: bad head count or block size");
  if (p.num_tokens <= 0) return;
  const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(p.num_q_heads));
  check((p.kv.k_scale == nullptr) == (p.kv.v_scale == nullptr), "paged_attention: FP8 needs both k_scale and v_scale");
  if (p.kv.k_scale != nullptr)
    dispatch(t, [&]<class T>() { paged_attention_kernel<T, true><<<grid, kAttnThreads, 0, stream>>>(p); });
  else
    dispatch(t, [&]<class T>() { paged_attention_kernel<T, false><<<grid, kAttnThreads, 0, stream>>>(p); });
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace reference

}  // namespace zipage::cuda
