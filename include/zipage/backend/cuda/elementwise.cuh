#pragma once
// Elementwise / row-wise kernels on bf16 data with fp32 arithmetic: KV append by slot, RMSNorm (rows or
// heads), RoPE (interleaved and half-split), SwiGLU silu_mul, row gather (embedding), add. Memory-bound:
// 16-byte vector accesses where the shapes allow (widths multiple of 8 elements).
#include "zipage/backend/cuda/append_fp8.cuh"
#include "zipage/backend/cuda/common.cuh"
#include "zipage/backend/cuda/fp8_copy.cuh"
#include "zipage/backend/cuda/ops.hpp"  // qkv_epilogue_params

namespace zipage::cuda::detail {

// ---- append_kv: one thread per 16-byte chunk of a token's K (and V) row.
__global__ void append_kv_kernel(bf16* __restrict__ kc, bf16* __restrict__ vc, const bf16* __restrict__ k,
                                 const bf16* __restrict__ v, const std::int64_t* __restrict__ slots, int num_tokens,
                                 int width, std::int64_t k_stride, std::int64_t v_stride) {
  const int chunks = width / 8;
  const std::int64_t total = std::int64_t{num_tokens} * chunks;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const int t = static_cast<int>(i / chunks);
    const int c = static_cast<int>(i % chunks);
    const std::int64_t slot = slots[t];
    if (slot < 0) continue;
    const uint4 kx = *reinterpret_cast<const uint4*>(k + t * k_stride + c * 8);
    const uint4 vx = *reinterpret_cast<const uint4*>(v + t * v_stride + c * 8);
    *reinterpret_cast<uint4*>(kc + slot * width + c * 8) = kx;
    *reinterpret_cast<uint4*>(vc + slot * width + c * 8) = vx;
  }
}

// ---- append_kv into an FP8 cache (head_dim 128): one warp per (token, KV head) (append_head_fp8).
__global__ void __launch_bounds__(256) append_kv_fp8_kernel(std::uint8_t* __restrict__ kc, std::uint8_t* __restrict__ vc,
                                                            std::uint16_t* __restrict__ ks,
                                                            std::uint16_t* __restrict__ vs,
                                                            const bf16* __restrict__ k, const bf16* __restrict__ v,
                                                            const std::int64_t* __restrict__ slots, int num_tokens,
                                                            int heads, std::int64_t k_stride, std::int64_t v_stride) {
  constexpr int D = 128;
  const std::int64_t item = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5;
  if (item >= std::int64_t{num_tokens} * heads) return;  // whole warps leave together
  const std::int64_t t = item / heads;
  const int h = static_cast<int>(item % heads);
  const std::int64_t slot = slots[t];
  if (slot < 0) return;
  append_head_fp8(kc, vc, ks, vs, k + t * k_stride + h * D, v + t * v_stride + h * D, slot, heads, h,
                  static_cast<int>(threadIdx.x & 31));
}

// ---- RMSNorm
template <class W>
__device__ __forceinline__ void load_weight8(const W* w, float (&f)[8]);
template <>
__device__ __forceinline__ void load_weight8<bf16>(const bf16* w, float (&f)[8]) {
  bf16x8_to_float(*reinterpret_cast<const uint4*>(w), f);
}
template <>
__device__ __forceinline__ void load_weight8<float>(const float* w, float (&f)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(w);
  const float4 b = *reinterpret_cast<const float4*>(w + 4);
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

// kFp8: also the FP8 copy of row `row` of the output (q).
template <class W, bool kFp8 = false>
__device__ __forceinline__ void rms_norm_apply(const bf16* xs, const W* w, bf16* os, int width, float inv, int first,
                                               int step, const fp8_copy& q = {}, std::int64_t row = 0) {
  for (int c = first; c < width; c += step) {
    float f[8], wf[8];
    bf16x8_to_float(*reinterpret_cast<const uint4*>(xs + c), f);
    load_weight8<W>(w + c, wf);
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = f[e] * inv * wf[e];
    const uint4 o = float_to_bf16x8(f);
    *reinterpret_cast<uint4*>(os + c) = o;
    if constexpr (kFp8) store_fp8_copy8(q, row, width, c, o);
  }
}

// The sum of squares of 8 values, in this order (qkv_epilogue_kernel sums its values as the tuned rms_norm does).
__device__ __forceinline__ float sum_squares8(const float (&f)[8]) {
  float s = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) s += f[e] * f[e];
  return s;
}
__device__ __forceinline__ float sum_squares8(const bf16* p) {
  float f[8];
  bf16x8_to_float(*reinterpret_cast<const uint4*>(p), f);
  return sum_squares8(f);
}

// 1 / RMS of a row of `width` values from the sum of their squares (every kernel's, so the bits agree).
__device__ __forceinline__ float inv_rms(float sum_squares, int width, float eps) {
  return rsqrtf(sum_squares / static_cast<float>(width) + eps);
}

// A row's 1 / RMS from each thread's sum of squares over its chunks, reduced in a fixed order: over a warp (one
// row per warp), or over a 256-thread block (one row per block; every thread must call it).
__device__ __forceinline__ float warp_inv_rms(float ss, int width, float eps) { return inv_rms(warp_sum(ss), width, eps); }
__device__ __forceinline__ float block_inv_rms(float ss, int width, float eps) {
  __shared__ float partial[8];
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) total += partial[i];
  return inv_rms(total, width, eps);
}

// One warp per segment (width <= 1024).
template <class W>
__global__ void rms_norm_warp_kernel(const bf16* x, const W* __restrict__ w, bf16* out, std::int64_t num_segments,
                                     int width, float eps) {
  const std::int64_t seg = std::int64_t{blockIdx.x} * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (seg >= num_segments) return;
  const int lane = threadIdx.x & 31;
  const bf16* xs = x + seg * width;
  float ss = 0.0f;
  for (int c = lane * 8; c < width; c += 256) ss += sum_squares8(xs + c);
  rms_norm_apply<W>(xs, w, out + seg * width, width, warp_inv_rms(ss, width, eps), lane * 8, 256);
}

// One 256-thread block per segment (wide rows).
template <class W>
__global__ void __launch_bounds__(256) rms_norm_block_kernel(const bf16* x, const W* __restrict__ w, bf16* out,
                                                             int width, float eps) {
  const std::int64_t seg = blockIdx.x;
  const bf16* xs = x + seg * width;
  float ss = 0.0f;
  for (int c = threadIdx.x * 8; c < width; c += 256 * 8) ss += sum_squares8(xs + c);
  rms_norm_apply<W>(xs, w, out + seg * width, width, block_inv_rms(ss, width, eps), threadIdx.x * 8, 256 * 8);
}

// ---- add_rms_norm: x = x + y (rounded to bf16, as add_kernel), then out = rms_norm(x) * w, with the tuned
// rms_norm kernels' chunk-to-thread mapping and reduction order (warp per row up to 1024 wide, else a 256-thread
// block), so the bits are add's then rms_norm's. Each thread reads y and writes out at the same chunks, so out may
// be y.
__device__ __forceinline__ float add_store_sum_squares8(bf16* x, const bf16* y) {
  float f[8], g[8];
  bf16x8_to_float(*reinterpret_cast<const uint4*>(x), f);
  bf16x8_to_float(*reinterpret_cast<const uint4*>(y), g);
#pragma unroll
  for (int e = 0; e < 8; ++e) f[e] += g[e];
  const uint4 sum = float_to_bf16x8(f);
  *reinterpret_cast<uint4*>(x) = sum;
  bf16x8_to_float(sum, f);
  return sum_squares8(f);
}

// kFp8: also out's FP8 copy q (width % 128 == 0); the grid then covers q.padded rows, the padding ones zeroed.
template <class W, bool kFp8>
__global__ void add_rms_norm_warp_kernel(bf16* x, const bf16* y, const W* __restrict__ w, bf16* out, std::int64_t rows,
                                         int width, float eps, fp8_copy q) {
  const std::int64_t row = std::int64_t{blockIdx.x} * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if constexpr (kFp8)
    if (row >= rows && row < q.padded) {
      for (int c = lane * 8; c < width; c += 256) zero_fp8_copy8(q, row, width, c);
      return;
    }
  if (row >= rows) return;
  bf16* xs = x + row * width;
  const bf16* ys = y + row * width;
  float ss = 0.0f;
  for (int c = lane * 8; c < width; c += 256) ss += add_store_sum_squares8(xs + c, ys + c);
  rms_norm_apply<W, kFp8>(xs, w, out + row * width, width, warp_inv_rms(ss, width, eps), lane * 8, 256, q, row);
}

template <class W, bool kFp8>
__global__ void __launch_bounds__(256) add_rms_norm_block_kernel(bf16* x, const bf16* y, const W* __restrict__ w,
                                                                 bf16* out, std::int64_t rows, int width, float eps,
                                                                 fp8_copy q) {
  const std::int64_t row = blockIdx.x;
  if constexpr (kFp8)
    if (row >= rows) {  // the whole block: padding row of the copy
      for (int c = threadIdx.x * 8; c < width; c += 256 * 8) zero_fp8_copy8(q, row, width, c);
      return;
    }
  bf16* xs = x + row * width;
  const bf16* ys = y + row * width;
  float ss = 0.0f;
  for (int c = threadIdx.x * 8; c < width; c += 256 * 8) ss += add_store_sum_squares8(xs + c, ys + c);
  rms_norm_apply<W, kFp8>(xs, w, out + row * width, width, block_inv_rms(ss, width, eps), threadIdx.x * 8, 256 * 8, q,
                          row);
}

// ---- RoPE: one block per row; the row's cos/sin table (double-precision angles, as cpu::rope) first.
__global__ void rope_kernel(bf16* x, const std::int32_t* __restrict__ positions, int num_heads, int head_dim,
                            std::int64_t row_stride, double theta, bool interleaved) {
  __shared__ float cs[256];
  __shared__ float sn[256];
  const std::int64_t row = blockIdx.x;
  const int half = head_dim / 2;
  const double pos = positions[row];
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const double angle = pos * pow(theta, -2.0 * i / head_dim);
    double s, c;
    sincos(angle, &s, &c);
    cs[i] = static_cast<float>(c);
    sn[i] = static_cast<float>(s);
  }
  __syncthreads();
  bf16* xr = x + row * row_stride;
  if (interleaved) {
    for (int idx = threadIdx.x; idx < num_heads * half; idx += blockDim.x) {
      const int h = idx / half, i = idx % half;
      __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(xr + h * head_dim + 2 * i);
      const float2 v = __bfloat1622float2(*p);
      *p = __floats2bfloat162_rn(v.x * cs[i] - v.y * sn[i], v.x * sn[i] + v.y * cs[i]);
    }
  } else {
    for (int idx = threadIdx.x; idx < num_heads * half; idx += blockDim.x) {
      const int h = idx / half, i = idx % half;
      bf16* p = xr + h * head_dim + i;
      const float x0 = __bfloat162float(p[0]), x1 = __bfloat162float(p[half]);
      p[0] = __float2bfloat16_rn(x0 * cs[i] - x1 * sn[i]);
      p[half] = __float2bfloat16_rn(x0 * sn[i] + x1 * cs[i]);
    }
  }
}

// ---- qkv_epilogue (ops.hpp): one 256-thread block per row; a head per group of L lanes (L = head_dim / 8
// rounded up to a power of two: two heads per warp at head_dim 128, so every lane works and twice the bytes are in
// flight), lane l of a group holding the head's elements [8l, 8l + 8). Each step rounds to bf16 where the separate
// ops store their output (bias, norm, RoPE), sums squares as rms_norm_warp_kernel (its warp_sum over one head's
// lanes, the others adding zeros, is this group sum: the same bits) and rotates with unfused multiplies as the
// reference rope kernel, so the bits are theirs.
__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

__global__ void __launch_bounds__(256) qkv_epilogue_kernel(const qkv_epilogue_params p) {
  __shared__ float cs[128];
  __shared__ float sn[128];
  const std::int64_t row = blockIdx.x;
  const int d = p.head_dim, half = d / 2, chunks = d / 8;
  const double pos = p.positions[row];
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    double s, c;
    sincos(pos * p.inv_freq[i], &s, &c);
    cs[i] = static_cast<float>(c);
    sn[i] = static_cast<float>(s);
  }
  __syncthreads();
  int group = 1;  // lanes per head
  while (group < chunks) group <<= 1;
  const int lane = threadIdx.x & 31, heads_per_warp = 32 / group, warps = blockDim.x >> 5;
  const int slot = lane / group, gl = lane % group;  // the warp's head slot, the lane within the head
  const unsigned mask = group == 32 ? 0xffffffffu : ((1u << group) - 1u) << (slot * group);
  const bool active = gl < chunks;
  const int hq = p.num_q_heads, hkv = p.num_kv_heads, heads = hq + 2 * hkv;
  const bf16* in = static_cast<const bf16*>(p.qkv) + row * std::int64_t{heads} * d;
  for (int h0 = static_cast<int>(threadIdx.x >> 5) * heads_per_warp; h0 < heads; h0 += warps * heads_per_warp) {
    const int h = h0 + slot;
    if (h >= heads) continue;  // uniform in the group: its shuffles below name only its own lanes
    const int kind = h < hq ? 0 : (h < hq + hkv ? 1 : 2);  // q, k, v
    const int local = kind == 0 ? h : (kind == 1 ? h - hq : h - hq - hkv);
    const std::int64_t width = std::int64_t{kind == 0 ? hq : hkv} * d;
    bf16* out = static_cast<bf16*>(kind == 0 ? p.q : (kind == 1 ? p.k : p.v)) + row * width + std::int64_t{local} * d;
    const void* bias = kind == 0 ? p.q_bias : (kind == 1 ? p.k_bias : p.v_bias);
    const void* norm = kind == 0 ? p.q_norm : (kind == 1 ? p.k_norm : nullptr);
    float f[8] = {};
    if (active) bf16x8_to_float(*reinterpret_cast<const uint4*>(in + std::int64_t{h} * d + gl * 8), f);
    if (bias != nullptr && active) {
      float b[8];
      bf16x8_to_float(*reinterpret_cast<const uint4*>(static_cast<const bf16*>(bias) + std::int64_t{local} * d + gl * 8), b);
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] = round_bf16(f[e] + b[e]);
    }
    if (kind == 2) {
      if (active) *reinterpret_cast<uint4*>(out + gl * 8) = float_to_bf16x8(f);
      continue;
    }
    if (norm != nullptr) {
      float ss = active ? sum_squares8(f) : 0.0f;
      for (int o = group / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(mask, ss, o);
      const float inv = inv_rms(ss, d, p.eps);
      if (active) {
        float w[8];
        bf16x8_to_float(*reinterpret_cast<const uint4*>(static_cast<const bf16*>(norm) + gl * 8), w);
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] = round_bf16(f[e] * inv * w[e]);
      }
    }
    float r[8];
    if (p.style == rope_style::interleaved) {
#pragma unroll
      for (int e = 0; e < 8; e += 2) {
        const int i = (gl * 8 + e) / 2;
        const float c = active ? cs[i] : 0.0f, s = active ? sn[i] : 0.0f;
        r[e] = __fsub_rn(__fmul_rn(f[e], c), __fmul_rn(f[e + 1], s));
        r[e + 1] = __fadd_rn(__fmul_rn(f[e], s), __fmul_rn(f[e + 1], c));
      }
    } else {
      // Element j pairs with j + half: lane l with lane l + half / 8 of the group (half is a multiple of 8).
      const int step = half / 8;
      const bool first = gl < step;
      const int partner = active ? (first ? gl + step : gl - step) : gl;
      float g[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) g[e] = __shfl_sync(mask, f[e], partner, group);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int i = active ? (first ? gl * 8 + e : gl * 8 + e - half) : 0;
        if (first)
          r[e] = __fsub_rn(__fmul_rn(f[e], cs[i]), __fmul_rn(g[e], sn[i]));  // x0 = f, x1 = g
        else
          r[e] = __fadd_rn(__fmul_rn(g[e], sn[i]), __fmul_rn(f[e], cs[i]));  // x0 = g, x1 = f
      }
    }
    if (active) *reinterpret_cast<uint4*>(out + gl * 8) = float_to_bf16x8(r);
  }
}

// ---- silu_mul
__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + __expf(-g)) * u; }

__global__ void silu_mul_vec_kernel(const bf16* __restrict__ gate, const bf16* __restrict__ up, bf16* __restrict__ out,
                                    std::int64_t rows, int cols, std::int64_t in_stride) {
  const int chunks = cols / 8;
  const std::int64_t total = rows * chunks;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t r = i / chunks;
    const int c = static_cast<int>(i % chunks) * 8;
    float g[8], u[8];
    bf16x8_to_float(*reinterpret_cast<const uint4*>(gate + r * in_stride + c), g);
    bf16x8_to_float(*reinterpret_cast<const uint4*>(up + r * in_stride + c), u);
#pragma unroll
    for (int e = 0; e < 8; ++e) g[e] = silu_times(g[e], u[e]);
    *reinterpret_cast<uint4*>(out + r * cols + c) = float_to_bf16x8(g);
  }
}

// silu_mul_vec_kernel writing out's FP8 copy q too (cols % 128 == 0): over q.padded rows, the padding ones zeroed.
// A 128-column group is 16 consecutive chunks, so 16 consecutive threads (a half-warp) of the grid-stride loop.
__global__ void silu_mul_fp8_kernel(const bf16* __restrict__ gate, const bf16* __restrict__ up, bf16* __restrict__ out,
                                    std::int64_t rows, int cols, std::int64_t in_stride, fp8_copy q) {
  const int chunks = cols / 8;
  const std::int64_t total = std::int64_t{q.padded} * chunks;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t r = i / chunks;
    const int c = static_cast<int>(i % chunks) * 8;
    if (r >= rows) {
      zero_fp8_copy8(q, r, cols, c);
      continue;
    }
    float g[8], u[8];
    bf16x8_to_float(*reinterpret_cast<const uint4*>(gate + r * in_stride + c), g);
    bf16x8_to_float(*reinterpret_cast<const uint4*>(up + r * in_stride + c), u);
#pragma unroll
    for (int e = 0; e < 8; ++e) g[e] = silu_times(g[e], u[e]);
    const uint4 o = float_to_bf16x8(g);
    *reinterpret_cast<uint4*>(out + r * cols + c) = o;
    store_fp8_copy8(q, r, cols, c, o);
  }
}

__global__ void silu_mul_scalar_kernel(const bf16* __restrict__ gate, const bf16* __restrict__ up,
                                       bf16* __restrict__ out, std::int64_t rows, int cols, std::int64_t in_stride) {
  const std::int64_t total = rows * cols;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t r = i / cols;
    const int c = static_cast<int>(i % cols);
    out[i] = __float2bfloat16_rn(
        silu_times(__bfloat162float(gate[r * in_stride + c]), __bfloat162float(up[r * in_stride + c])));
  }
}

// ---- gather rows (embedding): one thread per 16-byte chunk (vec) or element.
template <bool kVec>
__global__ void gather_rows_kernel(const bf16* __restrict__ table, std::int64_t num_rows, int cols,
                                   const std::int32_t* __restrict__ ids, int num_ids, bf16* __restrict__ out) {
  const int per = kVec ? 8 : 1;
  const int chunks = cols / per;
  const std::int64_t total = std::int64_t{num_ids} * chunks;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t t = i / chunks;
    const int c = static_cast<int>(i % chunks) * per;
    const std::int32_t id = ids[t];
    const bool ok = id >= 0 && id < num_rows;
    if constexpr (kVec) {
      const uint4 val = ok ? *reinterpret_cast<const uint4*>(table + std::int64_t{id} * cols + c) : make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(out + t * cols + c) = val;
    } else {
      out[t * cols + c] = ok ? table[std::int64_t{id} * cols + c] : __float2bfloat16_rn(0.0f);
    }
  }
}

// ---- add
__global__ void add_kernel(const bf16* a, const bf16* b, bf16* out, std::int64_t n, bool vec) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  const std::int64_t first = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  std::int64_t done = 0;
  if (vec) {
    const std::int64_t chunks = n / 8;
    for (std::int64_t i = first; i < chunks; i += stride) {
      float x[8], y[8];
      bf16x8_to_float(reinterpret_cast<const uint4*>(a)[i], x);
      bf16x8_to_float(reinterpret_cast<const uint4*>(b)[i], y);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] += y[e];
      reinterpret_cast<uint4*>(out)[i] = float_to_bf16x8(x);
    }
    done = chunks * 8;
  }
  for (std::int64_t i = done + first; i < n; i += stride)
    out[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

}  // namespace zipage::cuda::detail
