// The reference kernels of the CUDA backend's ops (backend/cuda/ops.hpp), for fp32 and bf16 data of any
// shape: the `reference` launchers of kernel_launchers.hpp, which ops.cpp and paged_attention.cpp pick
// when an op's tuned bf16 kernel cannot take the inputs or the caller asks for the reference kernel, and
// the ops that have one kernel only (compaction, gathers, copies, fills). They mirror the zipage::cpu
// reference closely (same formulas, double where the CPU uses double) so that the fp32 engine gives the
// CPU backend's tokens; speed matters less here than for the tuned ones. The generic paged attention is in
// reference_attention.cu.
#include <algorithm>
#include <cstdint>

#include "kernel_launchers.hpp"
#include "reference_common.cuh"
#include "zipage/backend/cuda/common.cuh"
#include "zipage/backend/cuda/attention.hpp"
#include "zipage/backend/cuda/fp8.cuh"
#include "zipage/backend/cuda/ops.hpp"

namespace zipage::cuda {

namespace {

// load_f / store_f, grid_for, dispatch and GRID_STRIDE: reference_common.cuh.

// ---- gather rows
// An id outside [0, num_rows) gives zeros, as the tuned kernel.
template <class T>
__global__ void gather_rows_kernel(const T* __restrict__ table, std::int64_t num_rows, int cols,
                                   const std::int32_t* __restrict__ ids, std::int64_t total, T* __restrict__ out) {
  GRID_STRIDE(i, total) {
    const std::int64_t t = i / cols;
    const int c = static_cast<int>(i % cols);
    const std::int32_t id = ids[t];
    if (id >= 0 && id < num_rows)
      out[i] = table[std::int64_t{id} * cols + c];
    else
      store_f(out, i, 0.0f);
  }
}

// ---- RMSNorm: one warp per segment; double sum of squares as cpu::rms_norm.
template <class T, class W>
__global__ void rms_norm_kernel(const T* x, const W* __restrict__ w, T* out, std::int64_t segments, int width,
                                float eps) {
  const std::int64_t seg = std::int64_t{blockIdx.x} * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (seg >= segments) return;
  const int lane = threadIdx.x & 31;
  const T* xs = x + seg * width;
  double ss = 0.0;
  for (int c = lane; c < width; c += 32) {
    const double v = load_f(xs, c);
    ss += v * v;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float inv = 1.0f / sqrtf(static_cast<float>(ss / double(width)) + eps);
  T* os = out + seg * width;
  for (int c = lane; c < width; c += 32) store_f(os, c, load_f(xs, c) * inv * load_f(w, c));
}

// ---- RoPE: one block per row; cos/sin of the row's angles (double) first, as cpu::rope. Frequencies
// from inv_freq (the host's, scaled), else theta^(-2i / head_dim) as the tuned kernel computes them.
template <class T>
__global__ void rope_kernel(T* x, const std::int32_t* __restrict__ positions, int num_heads, int head_dim,
                            std::int64_t row_stride, const double* __restrict__ inv_freq, double theta,
                            bool interleaved) {
  __shared__ float cs[256];
  __shared__ float sn[256];
  const std::int64_t row = blockIdx.x;
  const int half = head_dim / 2;
  const double pos = positions[row];
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const double f = inv_freq != nullptr ? inv_freq[i] : pow(theta, -2.0 * i / head_dim);
    double s, c;
    sincos(pos * f, &s, &c);
    cs[i] = static_cast<float>(c);
    sn[i] = static_cast<float>(s);
  }
  __syncthreads();
  T* xr = x + row * row_stride;
  for (int idx = threadIdx.x; idx < num_heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    const int a = interleaved ? 2 * i : i;
    const int b = interleaved ? 2 * i + 1 : i + half;
    T* v = xr + h * head_dim;
    const float x0 = load_f(v, a), x1 = load_f(v, b);
    // Each product rounded, no fused multiply-add: cpu::rope's arithmetic, and qkv_epilogue_kernel's.
    store_f(v, a, __fsub_rn(__fmul_rn(x0, cs[i]), __fmul_rn(x1, sn[i])));
    store_f(v, b, __fadd_rn(__fmul_rn(x0, sn[i]), __fmul_rn(x1, cs[i])));
  }
}

// ---- elementwise
// out [rows][cols]; gate/up rows at in_stride (== cols: contiguous, read at i).
template <class T>
__global__ void silu_mul_kernel(const T* gate, const T* up, T* out, std::int64_t n, int cols, std::int64_t in_stride) {
  GRID_STRIDE(i, n) {
    const std::int64_t at = in_stride == cols ? i : i / cols * in_stride + i % cols;
    const float g = load_f(gate, at);
    store_f(out, i, g / (1.0f + expf(-g)) * load_f(up, at));
  }
}

template <class T>
__global__ void add_kernel(const T* a, const T* b, T* out, std::int64_t n) {
  GRID_STRIDE(i, n) store_f(out, i, load_f(a, i) + load_f(b, i));
}

template <class T, class B>
__global__ void add_bias_kernel(T* x, const B* __restrict__ bias, std::int64_t n, int cols) {
  GRID_STRIDE(i, n) store_f(x, i, load_f(x, i) + load_f(bias, i % cols));
}

// ---- fixed-order GEMM: 64x64 output tile, 16-wide k slices, 256 threads x 4x4 outputs each.
template <class T>
__global__ void __launch_bounds__(256) gemm_kernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ out,
                                                   int m, int n, int k) {
  constexpr int BM = 64, BN = 64, BK = 16;
  __shared__ float xs[BK][BM + 4];
  __shared__ float ws[BK][BN + 4];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < k; k0 += BK) {
    for (int e = threadIdx.x; e < BM * BK; e += 256) {
      const int r = e / BK, c = e % BK;
      const int gm = m0 + r, gn = n0 + r, gk = k0 + c;
      xs[c][r] = (gm < m && gk < k) ? load_f(x, std::int64_t{gm} * k + gk) : 0.0f;
      ws[c][r] = (gn < n && gk < k) ? load_f(w, std::int64_t{gn} * k + gk) : 0.0f;
    }
    __syncthreads();
    const int kk_end = min(BK, k - k0);
    for (int kk = 0; kk < kk_end; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = xs[kk][ty * 4 + i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = ws[kk][tx * 4 + j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int gm = m0 + ty * 4 + i;
    if (gm >= m) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int gn = n0 + tx * 4 + j;
      if (gn < n) store_f(out, std::int64_t{gm} * n + gn, acc[i][j]);
    }
  }
}

// ---- KV append / window queries
template <class T>
__global__ void append_kv_kernel(T* kc, T* vc, const T* __restrict__ k, const T* __restrict__ v,
                                 const std::int64_t* __restrict__ slots, std::int64_t total, int width,
                                 std::int64_t k_stride, std::int64_t v_stride) {
  GRID_STRIDE(i, total) {
    const std::int64_t t = i / width;
    const int c = static_cast<int>(i % width);
    const std::int64_t slot = slots[t];
    if (slot < 0) continue;
    kc[slot * width + c] = k[t * k_stride + c];
    vc[slot * width + c] = v[t * v_stride + c];
  }
}

// One warp per (token, KV head): amax over the head (NaN propagates, as cpu::fp8::head_scale), the bf16 scale
// kv_scale_from_amax(amax) = bf16_rne(amax / 448) (IEEE division; the NaN scale for a NaN), codes = e4m3(x / scale)
// (IEEE division), or zeros for scale 0.
template <class T>
__global__ void append_kv_fp8_kernel(std::uint8_t* kc, std::uint8_t* vc, std::uint16_t* ks, std::uint16_t* vs,
                                     const T* __restrict__ k, const T* __restrict__ v,
                                     const std::int64_t* __restrict__ slots, int num_tokens, int heads, int d,
                                     std::int64_t k_stride, std::int64_t v_stride) {
  const std::int64_t warp = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp >= std::int64_t{num_tokens} * heads) return;
  const std::int64_t t = warp / heads;
  const int h = static_cast<int>(warp % heads);
  const std::int64_t slot = slots[t];
  if (slot < 0) return;
  const std::int64_t dst = (slot * heads + h) * d;
#pragma unroll
  for (int side = 0; side < 2; ++side) {
    const T* x = side == 0 ? k + t * k_stride + h * d : v + t * v_stride + h * d;
    float amax = 0.0f;
    bool nan = false;
    for (int i = lane; i < d; i += 32) {
      const float a = fabsf(load_f(x, i));
      nan |= isnan(a);
      amax = fmaxf(amax, a);
    }
    amax = detail::warp_max(amax);
    nan = __any_sync(0xffffffffu, nan);
    const std::uint16_t sbits = nan ? kv_scale_nan : kv_scale_from_amax(amax);
    const float scale = kv_scale_to_f32(sbits);
    std::uint8_t* codes = (side == 0 ? kc : vc) + dst;
    for (int i = lane; i < d; i += 32)
      codes[i] = detail::e4m3_code(load_f(x, i), scale);
    if (lane == 0) (side == 0 ? ks : vs)[slot * heads + h] = sbits;
  }
}

template <class T>
__global__ void record_queries_kernel(T* rows, const std::int32_t* __restrict__ token_row, const T* __restrict__ q,
                                      std::int64_t total, int width) {
  GRID_STRIDE(i, total) {
    const std::int64_t t = i / width;
    const int c = static_cast<int>(i % width);
    const std::int32_t r = token_row[t];
    if (r >= 0) rows[std::int64_t{r} * width + c] = q[i];
  }
}

// ---- compression gathers
template <class T>
__global__ void gather_keys_kernel(const T* __restrict__ k, const std::int32_t* __restrict__ pages, int block_size,
                                   int heads, int d, int kv_len, float* __restrict__ out) {
  const std::int64_t total = std::int64_t{heads} * kv_len * d;
  GRID_STRIDE(i, total) {
    const int c = static_cast<int>(i % d);
    const std::int64_t hj = i / d;
    const int j = static_cast<int>(hj % kv_len);
    const int h = static_cast<int>(hj / kv_len);
    const std::int64_t slot = std::int64_t{pages[j / block_size]} * block_size + j % block_size;
    out[i] = load_f(k, (slot * heads + h) * d + c);
  }
}

__global__ void gather_keys_fp8_kernel(const std::uint8_t* __restrict__ k, const std::uint16_t* __restrict__ ks,
                                       const std::int32_t* __restrict__ pages, int block_size, int heads, int d,
                                       int kv_len, float* __restrict__ out) {
  const std::int64_t total = std::int64_t{heads} * kv_len * d;
  GRID_STRIDE(i, total) {
    const int c = static_cast<int>(i % d);
    const std::int64_t hj = i / d;
    const int j = static_cast<int>(hj % kv_len);
    const int h = static_cast<int>(hj / kv_len);
    const std::int64_t slot = std::int64_t{pages[j / block_size]} * block_size + j % block_size;
    out[i] = detail::e4m3_to_f32(k[(slot * heads + h) * d + c]) * kv_scale_to_f32(ks[slot * heads + h]);
  }
}

__global__ void gather_scores_kernel(const float* __restrict__ scores, const std::int32_t* __restrict__ pages,
                                     int block_size, int heads, int kv_len, float* __restrict__ out) {
  const std::int64_t total = std::int64_t{heads} * kv_len;
  GRID_STRIDE(i, total) {
    const int j = static_cast<int>(i % kv_len);
    const int h = static_cast<int>(i / kv_len);
    const std::int64_t slot = std::int64_t{pages[j / block_size]} * block_size + j % block_size;
    out[i] = scores[slot * heads + h];
  }
}

template <class T>
__global__ void to_f32_kernel(const T* in, float* out, std::int64_t n) {
  GRID_STRIDE(i, n) out[i] = load_f(in, i);
}

template <class T>
__global__ void from_f32_kernel(const float* in, T* out, std::int64_t n) {
  GRID_STRIDE(i, n) store_f(out, i, in[i]);
}

// ---- compaction: one CTA per (head, layer); kept tokens move front to back in chunks, every read of
// a chunk before any write of it (a kept token's source slot is never before its destination). Rows move as
// `Unit`s: 4-byte words, or 2-byte units for 2-byte rows (an FP8 cache's bf16 scales).
constexpr int kCompactThreads = 256;
constexpr int kCompactRegs = 8;

template <class Unit>
__global__ void __launch_bounds__(kCompactThreads) compaction_kernel(compaction_params p, int row_words) {
  const int h = blockIdx.x;
  const int l = blockIdx.y;
  const std::int64_t eb = p.element_bytes > 0 ? p.element_bytes : static_cast<std::int64_t>(dtype_bytes(p.dtype));
  const std::int64_t layer_words = p.layer_elements * eb / static_cast<std::int64_t>(sizeof(Unit));
  auto* k = static_cast<Unit*>(p.kv.k_cache) + l * layer_words;
  auto* v = static_cast<Unit*>(p.kv.v_cache) + l * layer_words;
  const std::int32_t* kept = p.keep + (std::int64_t{l} * p.kv.num_kv_heads + h) * p.new_len;
  auto slot_of = [&](int j) {
    return std::int64_t{p.kv.page_indices[j / p.kv.block_size]} * p.kv.block_size + j % p.kv.block_size;
  };
  const int chunk = max(1, kCompactThreads * kCompactRegs / row_words);
  for (int c0 = 0; c0 < p.new_len; c0 += chunk) {
    const int n = min(chunk, p.new_len - c0);
    const int items = n * row_words;
    Unit kr[kCompactRegs], vr[kCompactRegs];
#pragma unroll
    for (int r = 0; r < kCompactRegs; ++r) {
      const int item = threadIdx.x + r * kCompactThreads;
      if (item < items) {
        const int t = c0 + item / row_words, w = item % row_words;
        const std::int64_t at = (slot_of(kept[t]) * p.kv.num_kv_heads + h) * row_words + w;
        kr[r] = k[at];
        vr[r] = v[at];
      }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kCompactRegs; ++r) {
      const int item = threadIdx.x + r * kCompactThreads;
      if (item < items) {
        const int t = c0 + item / row_words, w = item % row_words;
        const std::int64_t at = (slot_of(t) * p.kv.num_kv_heads + h) * row_words + w;
        k[at] = kr[r];
        v[at] = vr[r];
      }
    }
    __syncthreads();
  }
  if (p.scores != nullptr && p.kept_scores != nullptr) {
    float* sc = p.scores + l * p.score_layer_elements;
    const float* ks = p.kept_scores + (std::int64_t{l} * p.kv.num_kv_heads + h) * p.new_len;
    for (int t = threadIdx.x; t < p.new_len; t += kCompactThreads) sc[slot_of(t) * p.kv.num_kv_heads + h] = ks[t];
  }
}

// ---- batched copy: blockIdx.x = descriptor, blockIdx.y splits a long copy.
__global__ void batched_copy_kernel(const copy_desc* __restrict__ descs) {
  const copy_desc d = descs[blockIdx.x];
  const auto* src = reinterpret_cast<const char*>(d.src);
  auto* dst = reinterpret_cast<char*>(d.dst);
  const std::uint64_t per = ((d.bytes + gridDim.y - 1) / gridDim.y + 15) / 16 * 16;  // split points 16-aligned
  const std::uint64_t begin = std::min<std::uint64_t>(d.bytes, per * blockIdx.y);
  const std::uint64_t end = std::min<std::uint64_t>(d.bytes, begin + per);
  const bool vec = ((d.src | d.dst | begin | end) & 15u) == 0;
  if (vec) {
    for (std::uint64_t i = begin + threadIdx.x * 16ull; i < end; i += blockDim.x * 16ull)
      *reinterpret_cast<uint4*>(dst + i) = *reinterpret_cast<const uint4*>(src + i);
  } else {
    for (std::uint64_t i = begin + threadIdx.x * 4ull; i < end; i += blockDim.x * 4ull)
      *reinterpret_cast<std::uint32_t*>(dst + i) = *reinterpret_cast<const std::uint32_t*>(src + i);
  }
}

// ---- column split: grid.y = the part; `Unit`-byte words (16, 4 or 2) of each row's block.
struct split_args {
  const char* x = nullptr;
  std::int64_t rows = 0;
  std::int64_t row_bytes = 0;
  char* out[column_split::max_parts] = {};
  std::int64_t begin[column_split::max_parts] = {};  // bytes into an input row
  std::int64_t bytes[column_split::max_parts] = {};  // per row
};

template <class Unit>
__global__ void split_columns_kernel(split_args a) {
  const int part = static_cast<int>(blockIdx.y);
  const std::int64_t words = a.bytes[part] / static_cast<std::int64_t>(sizeof(Unit));
  const std::int64_t total = a.rows * words;
  const char* src = a.x + a.begin[part];
  char* dst = a.out[part];
  GRID_STRIDE(i, total) {
    const std::int64_t r = i / words, w = i % words;
    reinterpret_cast<Unit*>(dst + r * a.bytes[part])[w] = reinterpret_cast<const Unit*>(src + r * a.row_bytes)[w];
  }
}

// ---- fills
__device__ __forceinline__ std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

template <class T>
__global__ void fill_uniform_kernel(T* out, std::int64_t n, float scale, std::uint64_t seed) {
  GRID_STRIDE(i, n) {
    const std::uint64_t r = mix64(seed * 0x632be59bd9b4e019ull + static_cast<std::uint64_t>(i));
    const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    store_f(out, i, (2.0f * u - 1.0f) * scale);
  }
}

template <class T>
__global__ void fill_constant_kernel(T* out, std::int64_t n, float value) {
  GRID_STRIDE(i, n) store_f(out, i, value);
}

#undef GRID_STRIDE

}  // namespace

// ---- The reference launchers (kernel_launchers.hpp): ops.cpp calls them when an op's tuned kernel does
// not apply.
namespace reference {

void gather_rows(cuda_dtype t, const void* table, std::int64_t num_rows, int cols, const std::int32_t* ids,
                 int num_ids, void* out, cuda_stream stream) {
  if (num_ids <= 0 || cols <= 0) return;
  const std::int64_t total = std::int64_t{num_ids} * cols;
  dispatch(t, [&]<class T>() {
    gather_rows_kernel<T><<<grid_for(total, 256), 256, 0, stream>>>(static_cast<const T*>(table), num_rows, cols, ids,
                                                                    total, static_cast<T*>(out));
  });
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void rms_norm(cuda_dtype t, const void* x, cuda_dtype wt, const void* weight, void* out, std::int64_t rows, int cols,
              int width, float eps, cuda_stream stream) {
  check(width > 0 && cols % width == 0, "rms_norm: width ", width, " does not divide the row of ", cols);
  if (rows <= 0) return;
  const std::int64_t segments = rows * (cols / width);
  constexpr int kWarps = 8;
  const std::int64_t blocks = (segments + kWarps - 1) / kWarps;
  check(blocks < (1ll << 31), "rms_norm: too many rows");
  dispatch(t, [&]<class T>() {
    dispatch(wt, [&]<class W>() {
      rms_norm_kernel<T, W><<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(
          static_cast<const T*>(x), static_cast<const W*>(weight), static_cast<T*>(out), segments, width, eps);
    });
  });
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void rope(cuda_dtype t, const rope_params& p, cuda_stream stream) {
  check(p.head_dim > 0 && p.head_dim % 2 == 0 && p.head_dim <= 512, "rope: head_dim ", p.head_dim,
        " must be even and <= 512");
  check(p.rows < (1ll << 31), "rope: too many rows");
  if (p.rows <= 0 || p.num_heads <= 0) return;
  const std::int64_t row_stride = p.row_stride != 0 ? p.row_stride : std::int64_t{p.num_heads} * p.head_dim;
  const int threads = std::clamp((p.num_heads * p.head_dim / 2 + 31) / 32 * 32, 32, 256);
  dispatch(t, [&]<class T>() {
    rope_kernel<T><<<static_cast<unsigned>(p.rows), threads, 0, stream>>>(
        static_cast<T*>(p.x), p.positions, p.num_heads, p.head_dim, row_stride, p.inv_freq, static_cast<double>(p.theta),
        p.style == rope_style::interleaved);
  });
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void silu_mul(cuda_dtype t, const void* gate, const void* up, void* out, std::int64_t rows, int cols,
              std::int64_t in_row_stride, cuda_stream stream) {
  if (rows <= 0 || cols <= 0) return;
  const std::int64_t n = rows * cols;
  const std::int64_t stride = in_row_stride != 0 ? in_row_stride : cols;
  dispatch(t, [&]<class T>() {
    silu_mul_kernel<T><<<grid_for(n, 256), 256, 0, stream>>>(static_cast<const T*>(gate), static_cast<const T*>(up),
                                                              static_cast<T*>(out), n, cols, stride);
  });
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void add(cuda_dtype t, const void* a, const void* b, void* out, std::int64_t n, cuda_stream stream) {
  if (n <= 0) return;
  dispatch(t, [&]<class T>() {
    add_kernel<T><<<grid_for(n, 256), 256, 0, stream>>>(static_cast<const T*>(a), static_cast<const T*>(b),
                                                         static_cast<T*>(out), n);
  });
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void append_kv(cuda_dtype t, const append_kv_params& p, cuda_stream stream) {
  const int width = p.kv.num_kv_heads * p.kv.head_dim;
  const std::int64_t total = std::int64_t{p.num_tokens} * width;
  if (total <= 0) return;
  dispatch(t, [&]<class T>() {
    append_kv_kernel<T><<<grid_for(total, 256), 256, 0, stream>>>(
        static_cast<T*>(p.kv.k_cache), static_cast<T*>(p.kv.v_cache), static_cast<const T*>(p.k),
        static_cast<const T*>(p.v), p.slots, total, width, p.k_stride(), p.v_stride());
  });
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void append_kv_fp8(cuda_dtype t, const append_kv_params& p, cuda_stream stream) {
  const int heads = p.kv.num_kv_heads, d = p.kv.head_dim;
  check(heads > 0 && d > 0, "append_kv (FP8): num_kv_heads ", heads, " and head_dim ", d, " must be positive");
  const std::int64_t warps = std::int64_t{p.num_tokens} * heads;
  if (warps <= 0) return;
  const std::int64_t blocks = (warps * 32 + 255) / 256;
  check(blocks < (std::int64_t{1} << 31), "append_kv (FP8): too many tokens (", p.num_tokens, ")");
  dispatch(t, [&]<class T>() {
    append_kv_fp8_kernel<T><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
        static_cast<std::uint8_t*>(p.kv.k_cache), static_cast<std::uint8_t*>(p.kv.v_cache), p.kv.k_scale, p.kv.v_scale,
        static_cast<const T*>(p.k), static_cast<const T*>(p.v), p.slots, p.num_tokens, heads, d, p.k_stride(), p.v_stride());
  });
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace reference

// ---- Ops with one kernel (ops.hpp).

void add_bias(cuda_dtype t, void* x, cuda_dtype bt, const void* bias, std::int64_t rows, int cols, cuda_stream stream) {
  const std::int64_t n = rows * cols;
  if (n <= 0) return;
  dispatch(t, [&]<class T>() {
    dispatch(bt, [&]<class B>() {
      add_bias_kernel<T, B><<<grid_for(n, 256), 256, 0, stream>>>(static_cast<T*>(x), static_cast<const B*>(bias), n,
                                                                    cols);
    });
  });
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void gemm_fixed_order(cuda_dtype t, const void* x, const void* w, void* out, int m, int n, int k, cuda_stream stream) {
  if (m <= 0 || n <= 0) return;
  check(k > 0, "gemm: k must be positive");
  const dim3 grid(static_cast<unsigned>((n + 63) / 64), static_cast<unsigned>((m + 63) / 64));
  check(grid.y < 65536, "gemm: too many rows (", m, ")");
  dispatch(t, [&]<class T>() {
    gemm_kernel<T><<<grid, 256, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(w), static_cast<T*>(out),
                                             m, n, k);
  });
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void record_queries(cuda_dtype t, void* rows, const std::int32_t* token_row, const void* q, int num_tokens, int width,
                    cuda_stream stream) {
  const std::int64_t total = std::int64_t{num_tokens} * width;
  if (total <= 0) return;
  dispatch(t, [&]<class T>() {
    record_queries_kernel<T><<<grid_for(total, 256), 256, 0, stream>>>(static_cast<T*>(rows), token_row,
                                                                        static_cast<const T*>(q), total, width);
  });
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void gather_keys(cuda_dtype t, const void* k_layer, const std::uint16_t* k_scale_layer, const std::int32_t* pages,
                 int block_size, int num_kv_heads, int head_dim, int kv_len, float* out, cuda_stream stream) {
  const std::int64_t total = std::int64_t{num_kv_heads} * kv_len * head_dim;
  if (total <= 0) return;
  if (k_scale_layer != nullptr)
    gather_keys_fp8_kernel<<<grid_for(total, 256), 256, 0, stream>>>(static_cast<const std::uint8_t*>(k_layer),
                                                                     k_scale_layer, pages, block_size, num_kv_heads,
                                                                     head_dim, kv_len, out);
  else
    dispatch(t, [&]<class T>() {
      gather_keys_kernel<T><<<grid_for(total, 256), 256, 0, stream>>>(static_cast<const T*>(k_layer), pages,
                                                                       block_size, num_kv_heads, head_dim, kv_len, out);
    });
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void gather_scores(const float* scores_layer, const std::int32_t* pages, int block_size, int num_kv_heads, int kv_len,
                   float* out, cuda_stream stream) {
  const std::int64_t total = std::int64_t{num_kv_heads} * kv_len;
  if (total <= 0) return;
  gather_scores_kernel<<<grid_for(total, 256), 256, 0, stream>>>(scores_layer, pages, block_size, num_kv_heads, kv_len,
                                                                 out);
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void to_f32(cuda_dtype t, const void* in, float* out, std::int64_t n, cuda_stream stream) {
  if (n <= 0) return;
  dispatch(t, [&]<class T>() {
    to_f32_kernel<T><<<grid_for(n, 256), 256, 0, stream>>>(static_cast<const T*>(in), out, n);
  });
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void from_f32(cuda_dtype t, const float* in, void* out, std::int64_t n, cuda_stream stream) {
  if (n <= 0) return;
  dispatch(t, [&]<class T>() {
    from_f32_kernel<T><<<grid_for(n, 256), 256, 0, stream>>>(in, static_cast<T*>(out), n);
  });
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void apply_compaction(const compaction_params& p, cuda_stream stream) {
  if (p.new_len <= 0 || p.num_layers <= 0 || p.kv.num_kv_heads <= 0) return;
  const std::int64_t row_bytes =
      std::int64_t{p.kv.head_dim} * (p.element_bytes > 0 ? p.element_bytes : static_cast<std::int64_t>(dtype_bytes(p.dtype)));
  // Rows of 2 bytes (FP8 scales: one bf16) move as one 2-byte unit; others as 4-byte words.
  const bool halves = row_bytes == 2;
  check(halves || row_bytes % 4 == 0, "apply_compaction: a head row of ", row_bytes,
        " bytes is neither 2 nor a multiple of 4");
  const int row_words = static_cast<int>(halves ? 1 : row_bytes / 4);
  check(row_words <= kCompactThreads * kCompactRegs, "apply_compaction: head_dim ", p.kv.head_dim, " is too large");
  check(p.num_layers < 65536, "apply_compaction: too many layers");
  const dim3 grid(static_cast<unsigned>(p.kv.num_kv_heads), static_cast<unsigned>(p.num_layers));
  if (halves) compaction_kernel<std::uint16_t><<<grid, kCompactThreads, 0, stream>>>(p, row_words);
  else compaction_kernel<std::uint32_t><<<grid, kCompactThreads, 0, stream>>>(p, row_words);
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void batched_copy(const copy_desc* descs, int count, std::uint64_t max_bytes, cuda_stream stream) {
  if (count <= 0 || max_bytes == 0) return;
  // Split long copies so that each CTA moves about 64 KiB.
  const std::uint64_t splits = std::clamp<std::uint64_t>((max_bytes + 65535) / 65536, 1, 1024);
  const dim3 grid(static_cast<unsigned>(count), static_cast<unsigned>(splits));
  batched_copy_kernel<<<grid, 256, 0, stream>>>(descs);
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void split_columns(cuda_dtype t, const void* x, std::int64_t rows, const column_split& parts, cuda_stream stream) {
  check(parts.parts >= 1 && parts.parts <= column_split::max_parts, "split_columns: ", parts.parts,
        " parts (1 to ", column_split::max_parts, ")");
  check(t != cuda_dtype::e4m3, "split_columns: takes bf16 or fp32 data");
  check(rows >= 0, "split_columns: negative row count ", rows);
  const std::int64_t eb = static_cast<std::int64_t>(dtype_bytes(t));
  split_args a;
  a.x = static_cast<const char*>(x);
  a.rows = rows;
  std::int64_t largest = 0;
  std::uint64_t alignment_bits = reinterpret_cast<std::uintptr_t>(x);
  for (int i = 0; i < parts.parts; ++i) {
    check(parts.width[i] >= 0, "split_columns: part ", i, " has negative width ", parts.width[i]);
    check(parts.width[i] == 0 || parts.out[i] != nullptr, "split_columns: part ", i, " has no output");
    a.out[i] = static_cast<char*>(parts.out[i]);
    a.begin[i] = a.row_bytes;
    a.bytes[i] = parts.width[i] * eb;
    a.row_bytes += a.bytes[i];
    largest = std::max(largest, a.bytes[i]);
    alignment_bits |= reinterpret_cast<std::uintptr_t>(parts.out[i]) | static_cast<std::uint64_t>(a.begin[i]) |
                      static_cast<std::uint64_t>(a.bytes[i]);
  }
  if (rows == 0 || largest == 0) return;
  alignment_bits |= static_cast<std::uint64_t>(a.row_bytes);
  auto launch = [&]<class Unit>() {
    const dim3 grid(grid_for(rows * largest / static_cast<std::int64_t>(sizeof(Unit)), 256),
                    static_cast<unsigned>(parts.parts));
    split_columns_kernel<Unit><<<grid, 256, 0, stream>>>(a);
  };
  if (alignment_bits % 16 == 0)
    launch.template operator()<uint4>();
  else if (alignment_bits % 4 == 0)
    launch.template operator()<std::uint32_t>();
  else
    launch.template operator()<std::uint16_t>();
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void fill_uniform(cuda_dtype t, void* out, std::int64_t n, float scale, std::uint64_t seed, cuda_stream stream) {
  if (n <= 0) return;
  dispatch(t, [&]<class T>() {
    fill_uniform_kernel<T><<<grid_for(n, 256), 256, 0, stream>>>(static_cast<T*>(out), n, scale, seed);
  });
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

namespace {

__global__ void read_stream_kernel(const uint4* __restrict__ p, std::size_t n, unsigned* sink) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  unsigned acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
                d = __ldcs(p + i + 3 * stride);
    acc ^= a.x ^ b.y ^ c.z ^ d.w;
  }
  for (; i < n; i += stride) acc ^= __ldcs(p + i).x;
  if (acc == 0x9e3779b9u) *sink = acc;
}

}  // namespace

void read_stream(const void* p, std::size_t bytes, unsigned* sink, cuda_stream stream) {
  check(bytes % 16 == 0 && reinterpret_cast<std::uintptr_t>(p) % 16 == 0, "read_stream: ", bytes,
        " bytes: must be 16-byte aligned and a multiple of 16");
  if (bytes == 0) return;
  read_stream_kernel<<<detail::device_multiprocessors() * 8, 256, 0, stream>>>(static_cast<const uint4*>(p), bytes / 16, sink);
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void fill_constant(cuda_dtype t, void* out, std::int64_t n, float value, cuda_stream stream) {
  if (n <= 0) return;
  dispatch(t, [&]<class T>() {
    fill_constant_kernel<T><<<grid_for(n, 256), 256, 0, stream>>>(static_cast<T*>(out), n, value);
  });
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace zipage::cuda
