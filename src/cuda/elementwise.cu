// Launchers of the tuned bf16 elementwise kernels (the kernels live in backend/cuda/elementwise.cuh, which
// only this translation unit includes: its non-template kernels are defined there). Private: the public
// launchers of backend/cuda/ops.hpp (src/cuda/ops.cpp) call these when an op's rule allows.
#include <algorithm>
#include <cstdint>

#include "kernel_launchers.hpp"
#include "launch_checks.hpp"
#include "zipage/backend/cuda/elementwise.cuh"

namespace zipage::cuda::tuned {

namespace {

using detail::aligned16;
using detail::bf16;

// Grid for a grid-stride loop over `items` threads' worth of work.
unsigned grid_for(std::int64_t items, int threads) {
  static const int sms = detail::device_multiprocessors();
  const std::int64_t blocks = (items + threads - 1) / threads;
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min<std::int64_t>(blocks, std::int64_t{sms} * 32)));
}

}  // namespace

void append_kv(void* k_cache, void* v_cache, const void* k, const void* v, const std::int64_t* slot_mapping,
               int num_tokens, int num_kv_heads, int head_dim, std::int64_t k_row_stride, std::int64_t v_row_stride,
               cuda_stream stream) {
  const int width = num_kv_heads * head_dim;
  if (k_row_stride == 0) k_row_stride = width;
  if (v_row_stride == 0) v_row_stride = width;
  check(width % 8 == 0 && k_row_stride % 8 == 0 && v_row_stride % 8 == 0, "append_kv: row width ", width,
        " and strides must be multiples of 8 elements");
  check(aligned16(k_cache) && aligned16(v_cache) && aligned16(k) && aligned16(v), "append_kv: pointers must be 16-byte aligned");
  if (num_tokens <= 0) return;
  const std::int64_t items = std::int64_t{num_tokens} * (width / 8);
  detail::append_kv_kernel<<<grid_for(items, 256), 256, 0, stream>>>(
      static_cast<bf16*>(k_cache), static_cast<bf16*>(v_cache), static_cast<const bf16*>(k),
      static_cast<const bf16*>(v), slot_mapping, num_tokens, width, k_row_stride, v_row_stride);
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

bool append_kv_fp8_supported(const append_kv_params& p) {
  return p.kv.fp8() && p.kv.head_dim == 128 && p.kv.num_kv_heads > 0 && p.k_stride() % 8 == 0 &&
         p.v_stride() % 8 == 0 && aligned16(p.k) &&
         aligned16(p.v) && detail::aligned(p.kv.k_cache, 8) && detail::aligned(p.kv.v_cache, 8);
}

void append_kv_fp8(const append_kv_params& p, cuda_stream stream) {
  check(append_kv_fp8_supported(p), "append_kv (FP8, tuned): needs head_dim 128 (got ", p.kv.head_dim,
        "), strides of whole 8-element vectors, 16-byte aligned k / v and 8-byte aligned caches");
  const int heads = p.kv.num_kv_heads;
  const std::int64_t warps = std::int64_t{p.num_tokens} * heads;
  if (warps <= 0) return;
  const std::int64_t blocks = (warps * 32 + 255) / 256;
  check(blocks < (std::int64_t{1} << 31), "append_kv (FP8): too many tokens (", p.num_tokens, ")");
  detail::append_kv_fp8_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      static_cast<std::uint8_t*>(p.kv.k_cache), static_cast<std::uint8_t*>(p.kv.v_cache), p.kv.k_scale, p.kv.v_scale,
      static_cast<const bf16*>(p.k), static_cast<const bf16*>(p.v), p.slots, p.num_tokens, heads, p.k_stride(), p.v_stride());
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void rms_norm(const void* x, cuda_dtype wt, const void* weight, void* out, std::int64_t rows, int cols, int width,
              float eps, cuda_stream stream) {
  check(width > 0 && width % 8 == 0 && cols % width == 0, "rms_norm: width ", width,
        " must be a multiple of 8 dividing the row of ", cols);
  check(aligned16(x) && aligned16(weight) && aligned16(out), "rms_norm: pointers must be 16-byte aligned");
  if (rows <= 0) return;
  const std::int64_t segments = rows * (cols / width);
  const auto* xb = static_cast<const bf16*>(x);
  auto* ob = static_cast<bf16*>(out);
  if (width <= 1024) {
    constexpr int kWarps = 8;
    const std::int64_t blocks = (segments + kWarps - 1) / kWarps;
    check(blocks < (1ll << 31), "rms_norm: too many rows");
    if (wt == cuda_dtype::bf16)
      detail::rms_norm_warp_kernel<bf16><<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(
          xb, static_cast<const bf16*>(weight), ob, segments, width, eps);
    else
      detail::rms_norm_warp_kernel<float><<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(
          xb, static_cast<const float*>(weight), ob, segments, width, eps);
  } else {
    check(segments < (1ll << 31), "rms_norm: too many rows");
    if (wt == cuda_dtype::bf16)
      detail::rms_norm_block_kernel<bf16><<<static_cast<unsigned>(segments), 256, 0, stream>>>(
          xb, static_cast<const bf16*>(weight), ob, width, eps);
    else
      detail::rms_norm_block_kernel<float><<<static_cast<unsigned>(segments), 256, 0, stream>>>(
          xb, static_cast<const float*>(weight), ob, width, eps);
  }
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void rope(void* x, const std::int32_t* positions, std::int64_t rows, int num_heads, int head_dim,
          std::int64_t row_stride, float theta, rope_style style, cuda_stream stream) {
  check(head_dim > 0 && head_dim % 2 == 0 && head_dim <= 512, "rope: head_dim ", head_dim, " must be even and <= 512");
  if (row_stride == 0) row_stride = std::int64_t{num_heads} * head_dim;
  check(style == rope_style::half || (reinterpret_cast<std::uintptr_t>(x) % 4 == 0 && row_stride % 2 == 0),
        "rope: interleaved style needs 4-byte aligned pairs");
  check(rows < (1ll << 31), "rope: too many rows");
  if (rows <= 0 || num_heads <= 0) return;
  const int threads = std::clamp(num_heads * head_dim / 2, 32, 256);
  detail::rope_kernel<<<static_cast<unsigned>(rows), (threads + 31) / 32 * 32, 0, stream>>>(
      static_cast<bf16*>(x), positions, num_heads, head_dim, row_stride, static_cast<double>(theta),
      style == rope_style::interleaved);
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void silu_mul(const void* gate, const void* up, void* out, std::int64_t rows, int cols, std::int64_t in_row_stride,
              cuda_stream stream) {
  if (in_row_stride == 0) in_row_stride = cols;
  if (rows <= 0 || cols <= 0) return;
  const auto* g = static_cast<const bf16*>(gate);
  const auto* u = static_cast<const bf16*>(up);
  auto* o = static_cast<bf16*>(out);
  if (cols % 8 == 0 && in_row_stride % 8 == 0 && aligned16(gate) && aligned16(up) && aligned16(out)) {
    detail::silu_mul_vec_kernel<<<grid_for(rows * (cols / 8), 256), 256, 0, stream>>>(g, u, o, rows, cols, in_row_stride);
  } else {
    detail::silu_mul_scalar_kernel<<<grid_for(rows * cols, 256), 256, 0, stream>>>(g, u, o, rows, cols, in_row_stride);
  }
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void silu_mul_fp8(const void* gate, const void* up, void* out, std::int64_t rows, int cols, std::int64_t in_row_stride,
                  const fp8_copy& copy, cuda_stream stream) {
  check(cols % 128 == 0 && in_row_stride % 8 == 0 && aligned16(gate) && aligned16(up) && aligned16(out),
        "silu_mul: an FP8 copy needs whole 128-column groups (", cols, "), 8-element strides and aligned tensors");
  if (copy.padded <= 0) return;
  detail::silu_mul_fp8_kernel<<<grid_for(std::int64_t{copy.padded} * (cols / 8), 256), 256, 0, stream>>>(
      static_cast<const bf16*>(gate), static_cast<const bf16*>(up), static_cast<bf16*>(out), rows, cols, in_row_stride,
      copy);
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void gather_rows(const void* table, std::int64_t num_rows, int cols, const std::int32_t* ids, int num_ids, void* out,
                 cuda_stream stream) {
  if (num_ids <= 0 || cols <= 0) return;
  const auto* t = static_cast<const bf16*>(table);
  auto* o = static_cast<bf16*>(out);
  if (cols % 8 == 0 && aligned16(table) && aligned16(out)) {
    detail::gather_rows_kernel<true><<<grid_for(std::int64_t{num_ids} * (cols / 8), 256), 256, 0, stream>>>(
        t, num_rows, cols, ids, num_ids, o);
  } else {
    detail::gather_rows_kernel<false><<<grid_for(std::int64_t{num_ids} * cols, 256), 256, 0, stream>>>(
        t, num_rows, cols, ids, num_ids, o);
  }
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void add(const void* a, const void* b, void* out, std::int64_t n, cuda_stream stream) {
  if (n <= 0) return;
  const bool vec = aligned16(a) && aligned16(b) && aligned16(out);
  detail::add_kernel<<<grid_for(vec ? (n + 7) / 8 : n, 256), 256, 0, stream>>>(
      static_cast<const bf16*>(a), static_cast<const bf16*>(b), static_cast<bf16*>(out), n, vec);
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void add_rms_norm(void* x, const void* y, cuda_dtype wt, const void* weight, void* out, std::int64_t rows, int width,
                  float eps, const fp8_copy& copy, cuda_stream stream) {
  check(width > 0 && width % 8 == 0, "add_rms_norm: width ", width, " must be a multiple of 8");
  check(aligned16(x) && aligned16(y) && aligned16(weight) && aligned16(out), "add_rms_norm: pointers must be 16-byte aligned");
  check(!copy.wanted() || width % 128 == 0, "add_rms_norm: an FP8 copy needs whole 128-column groups, not ", width);
  const std::int64_t grid_rows = copy.wanted() ? std::max<std::int64_t>(rows, copy.padded) : rows;
  if (grid_rows <= 0) return;
  auto* xb = static_cast<bf16*>(x);
  const auto* yb = static_cast<const bf16*>(y);
  auto* ob = static_cast<bf16*>(out);
  // One launch per (weight dtype, copy or not): the kernels' template arguments.
  auto launch = [&]<class W, bool kFp8>() {
    const auto* wp = static_cast<const W*>(weight);
    if (width <= 1024) {
      constexpr int kWarps = 8;
      const std::int64_t blocks = (grid_rows + kWarps - 1) / kWarps;
      check(blocks < (1ll << 31), "add_rms_norm: too many rows");
      detail::add_rms_norm_warp_kernel<W, kFp8><<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(
          xb, yb, wp, ob, rows, width, eps, copy);
    } else {
      check(grid_rows < (1ll << 31), "add_rms_norm: too many rows");
      detail::add_rms_norm_block_kernel<W, kFp8><<<static_cast<unsigned>(grid_rows), 256, 0, stream>>>(
          xb, yb, wp, ob, rows, width, eps, copy);
    }
  };
  if (wt == cuda_dtype::bf16)
    copy.wanted() ? launch.template operator()<bf16, true>() : launch.template operator()<bf16, false>();
  else
    copy.wanted() ? launch.template operator()<float, true>() : launch.template operator()<float, false>();
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

void qkv_epilogue(const qkv_epilogue_params& p, cuda_stream stream) {
  check(p.rows < (1ll << 31), "qkv_epilogue: too many rows");
  if (p.rows <= 0) return;
  detail::qkv_epilogue_kernel<<<static_cast<unsigned>(p.rows), 256, 0, stream>>>(p);
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace zipage::cuda::tuned
