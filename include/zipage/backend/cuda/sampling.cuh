#pragma once
// Kernels of batched sampling (host API: backend/cuda/sampling.hpp). One CTA per request:
//
//   P0  (edited rows: logits processors) a bitmap of the ids the row's edit names, whose adds are then found by
//       binary search in its sorted list.
//       (penalised rows) a bitmap of the context in shared memory, so the logits are never copied; with
//       a frequency or presence penalty, the counts of the generated tokens in the row's workspace (only
//       the entries of context tokens are zeroed and counted: no pass over the vocabulary).
//   P1  value(i) = sanitise(edited logit), penalised where the token is in the bitmap (repetition penalty, then
//       frequency and presence from its count); block argmax (ties: lowest id). Greedy rows,
//       rows whose temperature is not > 0 and rows that are all -inf stop here.
//   P2  weight(i) = expf((value(i) - max) / temperature), bit-identical to the CPU's std::exp (glibc's
//       expf evaluated step by step in double precision), stored as raw bits in the workspace row;
//       per-row totals and the level-1 histogram (count and mass by weight bits 30..20).
//   selection  Every filter keeps a prefix of one total order (descending weight, ties by ascending id),
//       so each is found by a radix select on the weight bits in that unfiltered order: the first
//       position at which the running count reaches k (top-k), or the running mass reaches a target
//       (top-p: >= top_p * top-k mass; the draw: > u * kept mass). Three 10/11-bit digits, the first from
//       P2's histogram, the next two by passes over the workspace row, CUB block scans over the 1024
//       bins; ties at the threshold weight are taken in id order. The kept prefix is the shortest of
//       the top-k, min-p (weight >= min_p, counted in P2) and top-p prefixes; the drawn token is the one
//       at the draw's position.
//
// Masses are unsigned 64-bit fixed point: W(w) = round(w * 2^scale_bits) with scale_bits = 63 -
// floor(log2 vocab), so a row's total never overflows and every sum is exact, whatever the order of the
// shared-memory atomics: the result is deterministic.
#include <cub/block/block_scan.cuh>
#include <cuda_bf16.h>

#include <cstdint>

#include "zipage/backend/cuda/common.cuh"
#include "zipage/sampling/sampling_params.hpp"  // sampling_uniform (host + device)

namespace zipage::cuda::detail::sampling {

inline constexpr int kThreads = 512;
inline constexpr int kBins = 1024;  // per digit: bits 30..20 (<= 0x3f8 since w <= 1), 19..10, 9..0
inline constexpr std::uint32_t kNoId = 0xffffffffu;
// Dynamic shared memory of a sampling CTA before the context bitmap: two mass and three count arrays.
inline constexpr int kHistBytes = kBins * (2 * 8 + 3 * 4);

struct kernel_args {
  const void* logits;
  std::int64_t row_stride;  // elements
  int vocab;
  const float* temperature;
  const std::int32_t* top_k;
  const float* top_p;
  const float* min_p;
  const float* penalty;
  const float* frequency;
  const float* presence;
  const std::uint64_t* seed;
  const std::uint64_t* step;
  const std::int32_t* ctx_indptr;
  const std::int32_t* ctx_ids;
  const std::int32_t* edit_indptr;  // logits processors (sampling.hpp), null = none
  const std::int32_t* edit_ids;
  const float* edit_adds;
  const std::int32_t* edit_others_banned;
  std::int32_t* out;
  std::uint32_t* scratch;  // [batch][scratch_stride] weight bits
  std::int64_t scratch_stride;
  float scale;      // 2^scale_bits
  bool vec_ok;      // every row starts 4-element aligned: full groups load as one vector
  bool use_bitmap;  // penalties and a context exist: the bitmap follows the histograms
  bool output_penalties;  // frequency or presence penalties and a context exist: counts in `scratch`
};

// ---- glibc's expf (sysdeps/ieee754/flt-32/e_expf.c, EXP2F_TABLE_BITS 5, as built for x86-64 with FMA),
// every double operation spelled out so that nvcc neither contracts nor reorders it. Verified against
// glibc 2.36's expf on every float in [-104, 0] (the only arguments the sampler passes).
__device__ __forceinline__ float glibc_expf(float x, const std::uint64_t* tab) {
  constexpr double kInvLn2N = 0x1.71547652b82fep+0 * 32;
  constexpr double kShift = 0x1.8p+52;
  constexpr double kC0 = 0x1.c6af84b912394p-5 / 32 / 32 / 32;
  constexpr double kC1 = 0x1.ebfce50fac4f3p-3 / 32 / 32;
  constexpr double kC2 = 0x1.62e42ff0c52d6p-1 / 32;
  const std::uint32_t ux = __float_as_uint(x);
  const std::uint32_t abstop = (ux >> 20) & 0x7ffu;
  if (abstop >= 0x42bu) {  // |x| >= 88 or NaN
    if (ux == 0xff800000u) return 0.0f;
    if (abstop >= 0x7f8u) return x + x;
    if (x > 0x1.62e42ep6f) return __int_as_float(0x7f800000);
    if (x < -0x1.9fe368p6f) return 0.0f;
  }
  const double xd = static_cast<double>(x);
  double kd = __fma_rn(kInvLn2N, xd, kShift);
  const std::uint64_t ki = static_cast<std::uint64_t>(__double_as_longlong(kd));
  kd = __dsub_rn(kd, kShift);
  const double r = __fma_rn(kInvLn2N, xd, -kd);
  const std::uint64_t t = tab[ki % 32] + (ki << 47);
  const double s = __longlong_as_double(static_cast<long long>(t));
  const double z = __fma_rn(kC0, r, kC1);
  const double r2 = __dmul_rn(r, r);
  double y = __fma_rn(kC2, r, 1.0);
  y = __fma_rn(z, r2, y);
  y = __dmul_rn(y, s);
  return __double2float_rn(y);
}

// glibc's __exp2f_data.tab: tab[i] = uint(2^(i/32)) - (i << 47). Copied to shared memory by each CTA.
static __constant__ std::uint64_t kExp2fTable[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540};

// ---- values, as the CPU sampler computes them
__device__ __forceinline__ float sanitize(float x) {
  if (x != x) return __int_as_float(0xff800000);                  // NaN -> -inf
  if (x == __int_as_float(0x7f800000)) return 3.402823466e+38f;  // +inf -> largest float
  return x;
}
__device__ __forceinline__ float penalize(float logit, float penalty) {
  return logit > 0.0f ? __fdiv_rn(logit, penalty) : __fmul_rn(logit, penalty);
}
// zipage::apply_output_penalties: logit - frequency * count - presence, rounded after each operation.
__device__ __forceinline__ float penalize_output(float logit, std::uint32_t count, float frequency, float presence) {
  return __fsub_rn(__fsub_rn(logit, __fmul_rn(frequency, __uint2float_rn(count))), presence);
}

template <class T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ float to_float<bf16>(bf16 x) {
  return __bfloat162float(x);
}

// The 4 logits of group g (elements 4g .. 4g+3 of the row; those past `vocab` are -inf).
template <class T>
__device__ __forceinline__ void load_group(const T* row, int g, int vocab, bool vec_ok, float (&v)[4]) {
  const int i0 = 4 * g;
  if (vec_ok && i0 + 4 <= vocab) {
    if constexpr (sizeof(T) == 4) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(row) + g);
      v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else {
      const uint2 b = __ldg(reinterpret_cast<const uint2*>(row) + g);
      v[0] = __uint_as_float(b.x << 16), v[1] = __uint_as_float(b.x & 0xffff0000u);
      v[2] = __uint_as_float(b.y << 16), v[3] = __uint_as_float(b.y & 0xffff0000u);
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = i0 + j < vocab ? to_float(row[i0 + j]) : __int_as_float(0xff800000);
}

// ---- fixed-point mass of a weight (given by its bits; 0 for weight 0)
__device__ __forceinline__ std::uint64_t fixed_mass(std::uint32_t u, float scale) {
  return __float2ull_rn(__fmul_rn(__uint_as_float(u), scale));
}

// ---- block reductions (kThreads threads; `red` holds kThreads / 32 entries)
struct argmax_t {
  float v;
  int i;
};
__device__ __forceinline__ argmax_t better(argmax_t a, argmax_t b) {
  return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
}

template <class T>
__device__ __forceinline__ T warp_sum_t(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

struct cm_t {  // running (count, mass) of the selection scans
  std::uint32_t cnt;
  std::uint64_t mass;
};
struct cm_sum {
  __device__ __forceinline__ cm_t operator()(const cm_t& a, const cm_t& b) const { return {a.cnt + b.cnt, a.mass + b.mass}; }
};

enum class goal : int { count, mass_ge, mass_gt };

struct criterion {
  goal g;
  std::uint32_t k;  // goal::count: the position wanted (1-based)
  double target;    // goal::mass_*: the mass compared against
  __device__ __forceinline__ bool reached(std::uint32_t cnt, std::uint64_t mass) const {
    if (g == goal::count) return cnt >= k;
    const double m = static_cast<double>(mass);
    return g == goal::mass_ge ? m >= target : m > target;
  }
};

// One element of the order, found by a selection: all weights > tau come first (`above`), then the ties
// at tau in id order, of which this is number m (1-based). pos = above.cnt + m; mass = mass of the prefix
// that ends here; min_id = the lowest id among the ties.
struct pick_t {
  std::uint32_t tau;
  std::uint32_t m;
  std::uint32_t pos;
  std::uint64_t mass;
  std::uint32_t ties;
  std::uint32_t min_id;
};

struct shared_state {
  union {
    cub::BlockScan<cm_t, kThreads>::TempStorage scan_cm;
    cub::BlockScan<std::uint32_t, kThreads>::TempStorage scan_u32;
  } cub;
  argmax_t red_arg[kThreads / 32];
  std::uint64_t red_u64[2][kThreads / 32];
  std::uint32_t red_u32[2][kThreads / 32];
  std::uint64_t exp_tab[32];
  // Broadcast values.
  argmax_t best;
  std::uint64_t total_mass, minp_mass;
  std::uint32_t npos, minp_cnt;
  std::uint32_t digit;  // the bin a scan found
  cm_t digit_above;     // count and mass of everything above that bin
  pick_t pick;
  std::uint32_t found_id;
};

// Scans `cnt`/`mass` (kBins bins) from the highest bin down, on top of `base` (everything above these
// bins), and finds the bin in which `c` becomes reached; writes it to s.digit / s.digit_above. The caller
// guarantees !c.reached(base) and c.reached(base + all bins).
__device__ __forceinline__ void scan_bins(shared_state& s, const std::uint32_t* cnt, const std::uint64_t* mass,
                                          cm_t base, const criterion& c) {
  static_assert(kBins == 2 * kThreads);
  const int t = threadIdx.x;
  const int b0 = kBins - 1 - 2 * t, b1 = b0 - 1;  // this thread's bins, highest first
  const cm_t x0{cnt[b0], mass[b0]}, x1{cnt[b1], mass[b1]};
  cm_t excl;
  cub::BlockScan<cm_t, kThreads>(s.cub.scan_cm).ExclusiveScan(cm_sum{}(x0, x1), excl, cm_t{0, 0}, cm_sum{});
  const cm_t a0 = cm_sum{}(base, excl);  // above b0
  const cm_t a1 = cm_sum{}(a0, x0);      // above b1
  const cm_t e1 = cm_sum{}(a1, x1);
  if (!c.reached(a0.cnt, a0.mass) && c.reached(a1.cnt, a1.mass)) {
    s.digit = static_cast<std::uint32_t>(b0);
    s.digit_above = a0;
  } else if (!c.reached(a1.cnt, a1.mass) && c.reached(e1.cnt, e1.mass)) {
    s.digit = static_cast<std::uint32_t>(b1);
    s.digit_above = a1;
  }
  __syncthreads();
}

// Histogram pass over the workspace row: weights whose bits >> shift == prefix, binned by the next
// 10 bits. With `ids`, also the lowest id per bin (the last digit).
__device__ __forceinline__ void histogram_pass(const std::uint32_t* w_row, int vocab, int shift, std::uint32_t prefix,
                                               float scale, std::uint32_t* cnt, std::uint64_t* mass,
                                               std::uint32_t* min_id, bool ids) {
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    cnt[b] = 0;
    mass[b] = 0;
    if (ids) min_id[b] = kNoId;
  }
  __syncthreads();
  const int groups = (vocab + 3) / 4;
  const int sub = shift - 10;
  for (int g = threadIdx.x; g < groups; g += kThreads) {
    const uint4 q = reinterpret_cast<const uint4*>(w_row)[g];
    const std::uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = 4 * g + j;
      if (i < vocab && u[j] != 0 && (u[j] >> shift) == prefix) {
        const std::uint32_t b = (u[j] >> sub) & (kBins - 1);
        atomicAdd(&cnt[b], 1u);
        atomicAdd(reinterpret_cast<unsigned long long*>(&mass[b]),
                  static_cast<unsigned long long>(fixed_mass(u[j], scale)));
        if (ids) atomicMin(&min_id[b], static_cast<std::uint32_t>(i));
      }
    }
  }
  __syncthreads();
}

struct hist_arrays {
  std::uint64_t* mass1;  // level 1, from P2
  std::uint64_t* mass;   // levels 2 and 3
  std::uint32_t* cnt1;
  std::uint32_t* cnt;
  std::uint32_t* min_id;
};

// The element at which `c` is first reached, walking the order from the top. The caller guarantees
// !c.reached(0, 0) and c.reached(npos, total).
__device__ __noinline__ pick_t select(shared_state& s, const hist_arrays& h, const std::uint32_t* w_row, int vocab, float scale,
                         const criterion& c) {
  scan_bins(s, h.cnt1, h.mass1, cm_t{0, 0}, c);
  const std::uint32_t d1 = s.digit;
  histogram_pass(w_row, vocab, 20, d1, scale, h.cnt, h.mass, h.min_id, false);
  scan_bins(s, h.cnt, h.mass, s.digit_above, c);
  const std::uint32_t d12 = (d1 << 10) | s.digit;
  histogram_pass(w_row, vocab, 10, d12, scale, h.cnt, h.mass, h.min_id, true);
  scan_bins(s, h.cnt, h.mass, s.digit_above, c);
  if (threadIdx.x == 0) {
    const std::uint32_t d3 = s.digit;
    const cm_t above = s.digit_above;
    pick_t p;
    p.tau = (d12 << 10) | d3;
    p.ties = h.cnt[d3];
    p.min_id = h.min_id[d3];
    const std::uint64_t w = fixed_mass(p.tau, scale);
    if (c.g == goal::count) {
      p.m = c.k - above.cnt;
    } else {  // smallest m in [1, ties] with c reached at above + m ties
      std::uint32_t lo = 1, hi = p.ties;
      while (lo < hi) {
        const std::uint32_t mid = lo + (hi - lo) / 2;
        if (c.reached(above.cnt + mid, above.mass + mid * w)) hi = mid;
        else lo = mid + 1;
      }
      p.m = lo;
    }
    p.pos = above.cnt + p.m;
    p.mass = above.mass + p.m * w;
    s.pick = p;
  }
  __syncthreads();
  return s.pick;
}

// Id of the m-th element (in id order) of the row whose weight bits are tau.
__device__ __noinline__ std::uint32_t nth_tie(shared_state& s, const std::uint32_t* w_row, int vocab, std::uint32_t tau,
                                 std::uint32_t m) {
  if (threadIdx.x == 0) s.found_id = kNoId;
  std::uint32_t seen = 0;
  for (int base = 0; base < vocab; base += 4 * kThreads) {
    const int g = base / 4 + threadIdx.x;
    std::uint32_t u[4] = {0, 0, 0, 0};
    if (4 * g < vocab) {
      const uint4 q = reinterpret_cast<const uint4*>(w_row)[g];
      u[0] = q.x, u[1] = q.y, u[2] = q.z, u[3] = q.w;
    }
    std::uint32_t hits = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) hits += (4 * g + j < vocab && u[j] == tau) ? 1u : 0u;
    std::uint32_t excl, total;
    __syncthreads();  // temp storage reuse
    cub::BlockScan<std::uint32_t, kThreads>(s.cub.scan_u32).ExclusiveSum(hits, excl, total);
    if (seen + excl < m && m <= seen + excl + hits) {
      std::uint32_t want = m - seen - excl;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (4 * g + j < vocab && u[j] == tau && --want == 0) s.found_id = static_cast<std::uint32_t>(4 * g + j);
    }
    seen += total;
    if (seen >= m) break;
  }
  __syncthreads();
  return s.found_id;
}

template <class T, bool kSampling>
__global__ void __launch_bounds__(kThreads, 2) sample_kernel(kernel_args a) {
  extern __shared__ __align__(16) unsigned char dyn[];
  __shared__ shared_state s;
  const int row = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int vocab = a.vocab;
  const T* logits = static_cast<const T*>(a.logits) + row * a.row_stride;
  const int groups = (vocab + 3) / 4;

  hist_arrays h{};
  std::uint32_t* bitmap = reinterpret_cast<std::uint32_t*>(dyn);
  if constexpr (kSampling) {
    h.mass1 = reinterpret_cast<std::uint64_t*>(dyn);
    h.mass = h.mass1 + kBins;
    h.cnt1 = reinterpret_cast<std::uint32_t*>(h.mass + kBins);
    h.cnt = h.cnt1 + kBins;
    h.min_id = h.cnt + kBins;
    bitmap = h.min_id + kBins;
  }

  // ---- P0, penalties: bitmap of the context (repetition) or of the generated tokens, and their counts
  const float penalty = a.penalty ? a.penalty[row] : 1.0f;
  const float frequency = a.frequency ? a.frequency[row] : 0.0f;
  const float presence = a.presence ? a.presence[row] : 0.0f;
  const std::uint64_t step = a.step ? a.step[row] : 0;
  // The row's workspace: counts of the output penalties, then weights. Null for greedy batches without them.
  std::uint32_t* counts = a.scratch ? a.scratch + row * a.scratch_stride : nullptr;
  bool penalize_row = false, output_row = false;
  if (a.use_bitmap) {
    const int c0 = a.ctx_indptr[row], c1 = a.ctx_indptr[row + 1];
    penalize_row = penalty != 1.0f && c1 > c0;
    output_row = a.output_penalties && (frequency != 0.0f || presence != 0.0f) && step > 0 && c1 > c0;
    // The generated tokens: the last `step` of the context.
    const int g0 = static_cast<std::uint64_t>(c1 - c0) > step ? c1 - static_cast<int>(step) : c0;
    if (penalize_row || output_row) {
      const int words = (vocab + 31) / 32;
      for (int w = tid; w < words; w += kThreads) bitmap[w] = 0;
      const int m0 = penalize_row ? c0 : g0;  // what the bitmap marks
      if (output_row)  // the counts of every marked token start at 0 (the rest of the row is never read)
        for (int j = m0 + tid; j < c1; j += kThreads) {
          const int id = a.ctx_ids[j];
          if (id >= 0 && id < vocab) counts[id] = 0;
        }
      __syncthreads();
      for (int j = m0 + tid; j < c1; j += kThreads) {
        const int id = a.ctx_ids[j];
        if (id >= 0 && id < vocab) {
          atomicOr(&bitmap[id >> 5], 1u << (id & 31));
          if (output_row && j >= g0) atomicAdd(&counts[id], 1u);
        }
      }
      __syncthreads();
    }
  }
  // ---- P0, logits processors: the bitmap of the ids the row's edit names (after the context's, if any).
  std::uint32_t* edited = a.use_bitmap ? bitmap + (vocab + 31) / 32 : bitmap;
  int e0 = 0, e1 = 0;
  bool others_banned = false;
  if (a.edit_indptr != nullptr) {
    e0 = a.edit_indptr[row], e1 = a.edit_indptr[row + 1];
    others_banned = a.edit_others_banned[row] != 0;
    if (e1 > e0) {
      const int words = (vocab + 31) / 32;
      for (int w = tid; w < words; w += kThreads) edited[w] = 0;
      __syncthreads();
      for (int j = e0 + tid; j < e1; j += kThreads) {
        const int id = a.edit_ids[j];
        atomicOr(&edited[id >> 5], 1u << (id & 31));
      }
      __syncthreads();
    }
  }
  // zipage::apply_logit_edits' value of token i: its add (binary search in the row's ascending ids), a ban, or raw.
  auto edit = [&](int i, float logit) {
    if (e1 > e0 && ((edited[i >> 5] >> (i & 31)) & 1u)) {
      int lo = e0, hi = e1 - 1;
      while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (a.edit_ids[mid] < i) lo = mid + 1;
        else hi = mid;
      }
      const float add = a.edit_adds[lo];
      return add == __int_as_float(0xff800000) ? add : __fadd_rn(logit, add);
    }
    return others_banned ? __int_as_float(0xff800000) : logit;
  };
  // P2 overwrites a group's counts with its weights after reading them, in the same thread.
  auto value = [&](int i, float logit) {
    float v = sanitize(edit(i, logit));
    if ((penalize_row || output_row) && ((bitmap[i >> 5] >> (i & 31)) & 1u)) {
      if (penalize_row) v = sanitize(penalize(v, penalty));
      if (output_row) {
        const std::uint32_t c = counts[i];
        if (c != 0) v = sanitize(penalize_output(v, c, frequency, presence));
      }
    }
    return v;
  };

  // ---- P1: argmax
  argmax_t best{__int_as_float(0xff800000), 0x7fffffff};
  for (int g = tid; g < groups; g += kThreads) {
    float v[4];
    load_group(logits, g, vocab, a.vec_ok, v);
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (4 * g + j < vocab) best = better(best, argmax_t{value(4 * g + j, v[j]), 4 * g + j});
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    best = better(best, argmax_t{__shfl_xor_sync(0xffffffffu, best.v, o), __shfl_xor_sync(0xffffffffu, best.i, o)});
  if (lane == 0) s.red_arg[warp] = best;
  __syncthreads();
  if (tid == 0) {
    argmax_t b = s.red_arg[0];
    for (int w = 1; w < kThreads / 32; ++w) b = better(b, s.red_arg[w]);
    s.best = b;
  }
  __syncthreads();
  best = s.best;
  const float temperature = a.temperature ? a.temperature[row] : 0.0f;
  if (!kSampling || !(temperature > 0.0f) || best.v == __int_as_float(0xff800000)) {
    if (tid == 0) a.out[row] = best.i;
    return;
  }
  if constexpr (kSampling) {
    const float min_p = a.min_p ? a.min_p[row] : 0.0f;
    const bool use_min_p = min_p > 0.0f;
    const float scale = a.scale;
    std::uint32_t* w_row = counts;

    // ---- P2: weights, level-1 histogram, totals
    if (tid < 32) s.exp_tab[tid] = kExp2fTable[tid];
    for (int b = tid; b < kBins; b += kThreads) {
      h.cnt1[b] = 0;
      h.mass1[b] = 0;
    }
    __syncthreads();
    std::uint64_t total = 0, minp_mass = 0;
    std::uint32_t npos = 0, minp_cnt = 0;
    for (int g = tid; g < groups; g += kThreads) {
      float v[4];
      load_group(logits, g, vocab, a.vec_ok, v);
      std::uint32_t u[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = 4 * g + j;
        const float x = __fdiv_rn(__fsub_rn(value(i, v[j]), best.v), temperature);
        const float w = i < vocab ? glibc_expf(x, s.exp_tab) : 0.0f;
        u[j] = w > 0.0f ? __float_as_uint(w) : 0u;  // NaN (temperature +inf on a -inf logit) counts as 0, as on the CPU
        if (u[j] != 0) {
          const std::uint64_t m = fixed_mass(u[j], scale);
          atomicAdd(&h.cnt1[u[j] >> 20], 1u);
          atomicAdd(reinterpret_cast<unsigned long long*>(&h.mass1[u[j] >> 20]), static_cast<unsigned long long>(m));
          total += m;
          ++npos;
          if (use_min_p && w >= min_p) {
            minp_mass += m;
            ++minp_cnt;
          }
        }
      }
      reinterpret_cast<uint4*>(w_row)[g] = make_uint4(u[0], u[1], u[2], u[3]);
    }
    total = warp_sum_t(total);
    minp_mass = warp_sum_t(minp_mass);
    npos = warp_sum_t(npos);
    minp_cnt = warp_sum_t(minp_cnt);
    if (lane == 0) {
      s.red_u64[0][warp] = total;
      s.red_u64[1][warp] = minp_mass;
      s.red_u32[0][warp] = npos;
      s.red_u32[1][warp] = minp_cnt;
    }
    __syncthreads();
    if (tid == 0) {
      std::uint64_t t0 = 0, t1 = 0;
      std::uint32_t n0 = 0, n1 = 0;
      for (int w = 0; w < kThreads / 32; ++w) {
        t0 += s.red_u64[0][w], t1 += s.red_u64[1][w];
        n0 += s.red_u32[0][w], n1 += s.red_u32[1][w];
      }
      s.total_mass = t0, s.minp_mass = t1, s.npos = n0, s.minp_cnt = n1;
    }
    __syncthreads();
    total = s.total_mass;
    npos = s.npos;

    // ---- the kept prefix: length `kept` and mass `kept_mass` of the order
    std::uint32_t kept = npos;
    std::uint64_t kept_mass = total;
    std::uint64_t reference_mass = total;  // what top-p is measured against: the top-k set's mass
    const int top_k = a.top_k ? a.top_k[row] : 0;
    if (top_k > 0 && static_cast<std::uint32_t>(top_k) < npos) {
      const pick_t p = select(s, h, w_row, vocab, scale, criterion{goal::count, static_cast<std::uint32_t>(top_k), 0.0});
      kept = p.pos;
      kept_mass = reference_mass = p.mass;
    }
    if (use_min_p && s.minp_cnt < kept) {
      kept = s.minp_cnt;
      kept_mass = s.minp_mass;
    }
    const float top_p = a.top_p ? a.top_p[row] : 1.0f;
    if (top_p < 1.0f && kept > 0) {
      criterion c{goal::mass_ge, 0, static_cast<double>(top_p) * static_cast<double>(reference_mass)};
      if (c.reached(0, 0)) c = criterion{goal::count, 1, 0.0};  // at least one token
      if (c.g == goal::count || c.reached(npos, total)) {
        const pick_t p = select(s, h, w_row, vocab, scale, c);
        if (p.pos < kept) {
          kept = p.pos;
          kept_mass = p.mass;
        }
      }
    }
    if (kept == 0) {  // min_p > 1: nothing left (as the CPU: the argmax)
      if (tid == 0) a.out[row] = best.i;
      return;
    }

    // ---- the draw: the first position whose running mass exceeds u * kept mass
    const float u = sampling_uniform(a.seed ? a.seed[row] : 0, step);
    criterion c{goal::mass_gt, 0, static_cast<double>(u) * static_cast<double>(kept_mass)};
    if (c.reached(0, 0)) c = criterion{goal::count, 1, 0.0};
    if (c.g != goal::count && !c.reached(kept, kept_mass)) c = criterion{goal::count, kept, 0.0};  // rounding
    pick_t p = select(s, h, w_row, vocab, scale, c);
    if (p.pos > kept) p = select(s, h, w_row, vocab, scale, criterion{goal::count, kept, 0.0});
    const std::uint32_t id = p.m == 1 ? p.min_id : nth_tie(s, w_row, vocab, p.tau, p.m);
    if (tid == 0) a.out[row] = static_cast<std::int32_t>(id);
  }
}

}  // namespace zipage::cuda::detail::sampling
