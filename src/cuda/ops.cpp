// The one launcher per op of backend/cuda/ops.hpp: each checks what both of its kernels need, then
// applies the rule written next to its declaration and calls the tuned bf16 launcher or the reference
// one (kernel_launchers.hpp). Host code only; the kernels are in elementwise.cu and reference_ops.cu.
#include <cstdint>

#include "kernel_launchers.hpp"
#include "launch_checks.hpp"
#include "zipage/backend/cuda/ops.hpp"
#include "zipage/core/error.hpp"

namespace zipage::cuda {

namespace {

using detail::aligned;
using detail::aligned16;

// The first condition of every rule: the caller asked for the tuned kernel and the data is bf16.
bool tuned_bf16(cuda_dtype t, kernel_variant v) { return v == kernel_variant::tuned && t == cuda_dtype::bf16; }

}  // namespace

void gather_rows(cuda_dtype t, const void* table, std::int64_t num_rows, int cols, const std::int32_t* ids,
                 int num_ids, void* out, kernel_variant v, cuda_stream stream) {
  check(num_rows >= 0 && cols >= 0 && num_ids >= 0, "gather_rows: negative shape (num_rows ", num_rows, ", cols ", cols,
        ", num_ids ", num_ids, ")");
  if (tuned_bf16(t, v))
    tuned::gather_rows(table, num_rows, cols, ids, num_ids, out, stream);
  else
    reference::gather_rows(t, table, num_rows, cols, ids, num_ids, out, stream);
}

void rms_norm(cuda_dtype t, const void* x, cuda_dtype wt, const void* weight, void* out, std::int64_t rows, int cols,
              int width, float eps, kernel_variant v, cuda_stream stream) {
  check(width > 0 && cols % width == 0, "rms_norm: width ", width, " does not divide the row of ", cols);
  if (tuned_bf16(t, v) && width % 8 == 0 && aligned16(x) && aligned16(weight) && aligned16(out))
    tuned::rms_norm(x, wt, weight, out, rows, cols, width, eps, stream);
  else
    reference::rms_norm(t, x, wt, weight, out, rows, cols, width, eps, stream);
}

void rope(cuda_dtype t, const rope_params& p, kernel_variant v, cuda_stream stream) {
  check(p.head_dim > 0 && p.head_dim % 2 == 0 && p.head_dim <= 512, "rope: head_dim ", p.head_dim,
        " must be even and <= 512");
  check(p.row_stride == 0 || p.row_stride >= std::int64_t{p.num_heads} * p.head_dim, "rope: row_stride ", p.row_stride,
        " is shorter than num_heads * head_dim");
  const bool pairs_aligned = p.style == rope_style::half || (aligned(p.x, 4) && p.row_stride % 2 == 0);
  if (tuned_bf16(t, v) && p.inv_freq == nullptr && pairs_aligned)
    tuned::rope(p.x, p.positions, p.rows, p.num_heads, p.head_dim, p.row_stride, p.theta, p.style, stream);
  else
    reference::rope(t, p, stream);
}

void silu_mul(cuda_dtype t, const void* gate, const void* up, void* out, std::int64_t rows, int cols,
              std::int64_t in_row_stride, kernel_variant v, cuda_stream stream) {
  check(in_row_stride == 0 || in_row_stride >= cols, "silu_mul: in_row_stride ", in_row_stride,
        " is shorter than the row of ", cols);
  if (tuned_bf16(t, v))
    tuned::silu_mul(gate, up, out, rows, cols, in_row_stride, stream);
  else
    reference::silu_mul(t, gate, up, out, rows, cols, in_row_stride, stream);
}

void add_rms_norm(cuda_dtype t, void* x, const void* y, cuda_dtype wt, const void* weight, void* out, std::int64_t rows,
                  int cols, float eps, kernel_variant v, cuda_stream stream) {
  check(rows >= 0 && cols > 0, "add_rms_norm: shape ", rows, "x", cols);
  if (tuned_bf16(t, v) && cols % 8 == 0 && aligned16(x) && aligned16(y) && aligned16(weight) && aligned16(out)) {
    tuned::add_rms_norm(x, y, wt, weight, out, rows, cols, eps, fp8_copy{}, stream);
    return;
  }
  add(t, x, y, x, rows * cols, v, stream);
  rms_norm(t, x, wt, weight, out, rows, cols, cols, eps, v, stream);
}

bool fp8_copy_supported(cuda_dtype t, kernel_variant v, int cols, std::int64_t in_row_stride,
                        std::initializer_list<const void*> pointers) {
  bool ok = tuned_bf16(t, v) && cols > 0 && cols % 128 == 0 && in_row_stride % 8 == 0;
  for (const void* p : pointers) ok = ok && aligned16(p);
  return ok;
}

void add_rms_norm(cuda_dtype t, void* x, const void* y, cuda_dtype wt, const void* weight, void* out, std::int64_t rows,
                  int cols, float eps, kernel_variant v, const fp8_copy& copy, cuda_stream stream) {
  if (!copy.wanted()) {
    add_rms_norm(t, x, y, wt, weight, out, rows, cols, eps, v, stream);
    return;
  }
  check(rows >= 0 && cols > 0, "add_rms_norm: shape ", rows, "x", cols);
  check(fp8_copy_supported(t, v, cols, 0, {x, y, weight, out}), "add_rms_norm: an FP8 copy needs the tuned bf16 kernel, ",
        "rows of whole 128-column groups (got ", cols, ") and 16-byte aligned tensors");
  detail::check_fp8_copy("add_rms_norm", copy, rows);
  tuned::add_rms_norm(x, y, wt, weight, out, rows, cols, eps, copy, stream);
}

void silu_mul(cuda_dtype t, const void* gate, const void* up, void* out, std::int64_t rows, int cols,
              std::int64_t in_row_stride, kernel_variant v, const fp8_copy& copy, cuda_stream stream) {
  if (!copy.wanted()) {
    silu_mul(t, gate, up, out, rows, cols, in_row_stride, v, stream);
    return;
  }
  if (in_row_stride == 0) in_row_stride = cols;
  check(in_row_stride >= cols, "silu_mul: in_row_stride ", in_row_stride, " is shorter than the row of ", cols);
  check(fp8_copy_supported(t, v, cols, in_row_stride, {gate, up, out}), "silu_mul: an FP8 copy needs the tuned bf16 ",
        "kernel, rows of whole 128-column groups (got ", cols, "), a stride of whole 8-element vectors and 16-byte aligned tensors");
  detail::check_fp8_copy("silu_mul", copy, rows);
  tuned::silu_mul_fp8(gate, up, out, rows, cols, in_row_stride, copy, stream);
}

bool qkv_epilogue_supported(const qkv_epilogue_params& p) {
  const int d = p.head_dim;
  bool ok = d > 0 && d % 16 == 0 && d <= 256 && p.num_q_heads > 0 && p.num_kv_heads > 0;
  for (const void* ptr : {p.qkv, static_cast<const void*>(p.q), static_cast<const void*>(p.k), static_cast<const void*>(p.v)})
    ok = ok && ptr != nullptr && aligned16(ptr);
  for (const void* ptr : {p.q_bias, p.k_bias, p.v_bias, p.q_norm, p.k_norm}) ok = ok && (ptr == nullptr || aligned16(ptr));
  return ok;
}

void qkv_epilogue(const qkv_epilogue_params& p, cuda_stream stream) {
  check(qkv_epilogue_supported(p), "qkv_epilogue: head_dim ", p.head_dim,
        " must be a multiple of 16 and at most 256, with 16-byte aligned tensors");
  check(p.positions != nullptr && p.inv_freq != nullptr, "qkv_epilogue: positions and inv_freq are required");
  tuned::qkv_epilogue(p, stream);
}

void add(cuda_dtype t, const void* a, const void* b, void* out, std::int64_t n, kernel_variant v, cuda_stream stream) {
  if (tuned_bf16(t, v))
    tuned::add(a, b, out, n, stream);
  else
    reference::add(t, a, b, out, n, stream);
}

bool append_kv_runs_tuned_fp8(cuda_dtype t, const append_kv_params& p, kernel_variant v) {
  return p.kv.fp8() && tuned_bf16(t, v) && tuned::append_kv_fp8_supported(p);
}

void append_kv(cuda_dtype t, const append_kv_params& p, kernel_variant v, cuda_stream stream) {
  check((p.kv.k_scale == nullptr) == (p.kv.v_scale == nullptr), "append_kv: an FP8 cache needs both kv.k_scale and "
        "kv.v_scale");
  const std::int64_t width = p.packed_row();
  check(p.k_stride() >= width && p.v_stride() >= width, "append_kv: k_row_stride ", p.k_row_stride, " / v_row_stride ",
        p.v_row_stride, " shorter than the row of ", width);
  if (p.kv.fp8()) {
    // Both quantise bit-exactly alike; the tuned kernel spreads a head over a half-warp (bf16, head_dim 128).
    if (tuned_bf16(t, v) && tuned::append_kv_fp8_supported(p)) return tuned::append_kv_fp8(p, stream);
    return reference::append_kv_fp8(t, p, stream);
  }
  const bool vectors = width % 8 == 0 && p.k_stride() % 8 == 0 && p.v_stride() % 8 == 0 &&
                       aligned16(p.kv.k_cache) && aligned16(p.kv.v_cache) && aligned16(p.k) && aligned16(p.v);
  if (tuned_bf16(t, v) && vectors)
    tuned::append_kv(p.kv.k_cache, p.kv.v_cache, p.k, p.v, p.slots, p.num_tokens, p.kv.num_kv_heads, p.kv.head_dim,
                     p.k_stride(), p.v_stride(), stream);
  else
    reference::append_kv(t, p, stream);
}

}  // namespace zipage::cuda
