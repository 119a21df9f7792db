#pragma once
// The log-probability kernel of batched sampling (host API: backend/cuda/sampling.hpp); its value helpers and
// block reductions are sampling.cuh's.
#include "zipage/backend/cuda/sampling.cuh"

namespace zipage::cuda::detail::sampling {

// ---- log-probabilities under the raw logits (zipage/sampling/logprobs.hpp), one CTA per row: the row's
// max and log-sum-exp (double; sanitised values), the sampled token's logprob, then the k most likely
// tokens one block argmax at a time, each strictly after the previous in the order (descending value,
// ascending id). k <= 20 passes over the row: cheap next to the forward pass, and only for rows that ask.
struct logprob_args {
  const void* logits;
  std::int64_t row_stride;
  int vocab;
  bool vec_ok;
  const std::int32_t* tokens;  // [batch] the sampled tokens
  const std::int32_t* top;     // [batch] alternatives wanted (null = 0)
  int max_top;                 // stride of the outputs
  float* out_logprob;          // [batch]
  std::int32_t* out_top_ids;   // [batch][max_top]
  float* out_top_logprobs;
};

template <class T>
__global__ void __launch_bounds__(kThreads) logprob_kernel(logprob_args a) {
  __shared__ argmax_t red[kThreads / 32];
  __shared__ double red_d[kThreads / 32];
  __shared__ argmax_t found;
  __shared__ double log_sum;
  const int row = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int vocab = a.vocab;
  const int groups = (vocab + 3) / 4;
  const T* logits = static_cast<const T*>(a.logits) + row * a.row_stride;

  // The best (value, id) strictly after `prev` in the order; prev = {+inf, -1} for the first.
  auto block_best = [&](argmax_t prev) {
    argmax_t best{__int_as_float(0xff800000), 0x7fffffff};
    for (int g = tid; g < groups; g += kThreads) {
      float v[4];
      load_group(logits, g, vocab, a.vec_ok, v);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = 4 * g + j;
        const float x = sanitize(v[j]);
        if (i < vocab && (x < prev.v || (x == prev.v && i > prev.i))) best = better(best, argmax_t{x, i});
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      best = better(best, argmax_t{__shfl_xor_sync(0xffffffffu, best.v, o), __shfl_xor_sync(0xffffffffu, best.i, o)});
    if (lane == 0) red[warp] = best;
    __syncthreads();
    if (tid == 0) {
      argmax_t b = red[0];
      for (int w = 1; w < kThreads / 32; ++w) b = better(b, red[w]);
      found = b;
    }
    __syncthreads();
    const argmax_t r = found;
    __syncthreads();  // `found` and `red` are reused
    return r;
  };

  const argmax_t top1 = block_best(argmax_t{__int_as_float(0x7f800000), -1});
  const float max = top1.v;
  double sum = 0.0;
  if (max != __int_as_float(0xff800000)) {
    for (int g = tid; g < groups; g += kThreads) {
      float v[4];
      load_group(logits, g, vocab, a.vec_ok, v);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (4 * g + j < vocab) sum += exp(static_cast<double>(__fsub_rn(sanitize(v[j]), max)));
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) red_d[warp] = sum;
  __syncthreads();
  if (tid == 0) {
    double s = 0.0;
    for (int w = 0; w < kThreads / 32; ++w) s += red_d[w];
    log_sum = log(s);
  }
  __syncthreads();
  const double ls = log_sum;
  auto logprob = [&](float x) { return __double2float_rn(static_cast<double>(__fsub_rn(x, max)) - ls); };
  if (tid == 0) {
    const int t = a.tokens[row];
    a.out_logprob[row] = t >= 0 && t < vocab ? logprob(sanitize(to_float(logits[t]))) : __int_as_float(0x7fc00000);
  }
  const int k = a.top ? min(min(a.top[row], a.max_top), vocab) : 0;
  argmax_t prev = top1;
  for (int j = 0; j < k; ++j) {
    if (j > 0) prev = block_best(prev);
    if (tid == 0) {
      a.out_top_ids[row * a.max_top + j] = prev.i;
      a.out_top_logprobs[row * a.max_top + j] = logprob(prev.v);
    }
  }
}

}  // namespace zipage::cuda::detail::sampling
