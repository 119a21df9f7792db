// zipage::cuda_backend (backend/cuda/cuda_backend.hpp): the elementwise ops of a forward pass — embedding, RMSNorm,
// bias, RoPE, SwiGLU, residual add, row gathers — one launcher each (backend/cuda/ops.hpp), which picks the tuned
// bf16 or the reference kernel itself; the backend only says which it prefers (cuda_backend_options::fast_kernels).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "context.cuh"
#include "fp8_linear.cuh"  // fp8_copy_for
#include "zipage/backend/cuda/ops.hpp"

namespace zipage {

namespace {

// The kernel the backend asks each op for: tuned unless the options turn the fast kernels off.
cuda::kernel_variant preferred(const context& c) {
  return c.opts.fast_kernels ? cuda::kernel_variant::tuned : cuda::kernel_variant::reference;
}

// The (scaled) inverse frequencies on the device, in double as cpu::rope computes them, once per configuration.
// Copied on the backend's stream, which the kernels reading the table follow. (A plain cudaMemcpy runs on the legacy
// default stream, which the backend's non-blocking streams do not wait for, and may return once the host values are
// staged: the first step's RoPE could then read the table before the copy lands.)
const double* rope_table(context& c, int head_dim, float theta, const rope_scaling_config& scaling) {
  char head[160];
  std::snprintf(head, sizeof head, "%d/%.9g/%d/%.9g/%.9g/%.9g/%d", head_dim, double(theta), int(scaling.type),
                double(scaling.factor), double(scaling.low_freq_factor), double(scaling.high_freq_factor),
                scaling.original_max_position);
  std::string key = head;
  for (float f : scaling.freq_factors) {  // a GGUF file's per-frequency factors: the exact values in the key
    char x[24];
    std::snprintf(x, sizeof x, "/%a", double(f));
    key += x;
  }
  double*& table = c.rope_tables[key];
  if (table == nullptr) {
    std::vector<double> inv(static_cast<std::size_t>(head_dim / 2));
    for (int i = 0; i < head_dim / 2; ++i)
      inv[static_cast<std::size_t>(i)] = scaling.apply(i, std::pow(double(theta), -2.0 * i / head_dim));
    check(!c.capturing(), "cuda graphs: a RoPE table was first needed during stream capture");
    ZIPAGE_CUDA_CHECK(cudaMalloc(&table, inv.size() * sizeof(double)));
    ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(table, inv.data(), inv.size() * sizeof(double), cudaMemcpyHostToDevice, c.stream));
    ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.stream));  // `inv` goes out of scope
  }
  return table;
}

}  // namespace

void cuda_backend::embedding(const cuda_tensor& table, std::span<const token_id> ids, cuda_tensor& out) const {
  context& c = use(ctx_);
  for (const token_id id : ids)
    check(id >= 0 && id < table.rows(), "embedding: token id ", id, " outside the vocabulary of ", table.rows());
  const section s{ids.data(), ids.size_bytes()};
  const auto* d_ids = c.upload(c.ids_up, cuda_detail::up_ids, {&s, 1}).at<std::int32_t>(0);
  access::shape(ctx_, out, static_cast<int>(ids.size()), table.cols(), table.dtype());
  if (ids.empty()) return;
  const cuda::kernel_variant v = preferred(c);
  if (c.skip_launch(1, table.data(), table.rows(), table.cols(), table.dtype(), d_ids, ids.size(), out.data(), v)) return;
  const auto timed = time_op(c, "embedding");
  cuda::gather_rows(table.dtype(), table.data(), table.rows(), table.cols(), d_ids, static_cast<int>(ids.size()),
                    out.data(), v, as_stream(c.stream));
}

void cuda_backend::rms_norm(const cuda_tensor& x, const cuda_tensor& w, float eps, cuda_tensor& out) const {
  context& c = use(ctx_);
  const int width = w.cols();
  check(width > 0 && x.cols() % width == 0, "rms_norm: row of ", x.cols(), " is not a multiple of the weight width ",
        width);
  access::shape(ctx_, out, x.rows(), x.cols(), x.dtype());
  if (x.empty()) return;
  const cuda::kernel_variant v = preferred(c);
  if (c.skip_launch(2, x.data(), w.data(), w.dtype(), out.data(), x.rows(), x.cols(), width, eps, v)) return;
  const auto timed = time_op(c, "rms_norm");
  cuda::rms_norm(x.dtype(), x.data(), w.dtype(), w.data(), out.data(), x.rows(), x.cols(), width, eps, v,
                 as_stream(c.stream));
}
void cuda_backend::add_bias(cuda_tensor& x, const cuda_tensor& bias) const {
  check(bias.cols() == x.cols() && bias.rows() >= 1, "add_bias: bias of ", bias.cols(), " for rows of ", x.cols());
  if (ctx_->skip_launch(5, x.data(), x.dtype(), bias.data(), bias.dtype(), x.rows(), x.cols())) return;
  const auto timed = time_op(*ctx_, "add_bias");
  cuda::add_bias(x.dtype(), x.data(), bias.dtype(), bias.data(), x.rows(), x.cols(), as_stream(ctx_->stream));
}

void cuda_backend::rope(cuda_tensor& x, std::span<const std::int32_t> pos, int head_dim, float theta,
                        rope_style style) const {
  rope(x, pos, head_dim, theta, style, rope_scaling_config{});
}

void cuda_backend::rope(cuda_tensor& x, std::span<const std::int32_t> pos, int head_dim, float theta, rope_style style,
                        const rope_scaling_config& scaling) const {
  context& c = use(ctx_);
  check(static_cast<std::size_t>(x.rows()) == pos.size(), "rope: ", x.rows(), " rows but ", pos.size(), " positions");
  check(head_dim > 0 && x.cols() % head_dim == 0, "rope: row of ", x.cols(), " is not a multiple of head_dim ", head_dim);
  if (x.empty()) return;
  const double* table = rope_table(c, head_dim, theta, scaling);
  const section s{pos.data(), pos.size_bytes()};
  const auto* d_pos = c.upload(c.pos_up, cuda_detail::up_pos, {&s, 1}).at<std::int32_t>(0);
  if (c.skip_launch(6, x.data(), x.dtype(), d_pos, x.rows(), x.cols(), head_dim, table, style)) return;
  cuda::rope_params p;
  p.x = x.data();
  p.positions = d_pos;
  p.rows = x.rows();
  p.num_heads = x.cols() / head_dim;
  p.head_dim = head_dim;
  p.style = style;
  p.theta = theta;
  p.inv_freq = table;  // as cpu::rope, scaling included: the reference kernel, whatever the variant
  const auto timed = time_op(c, "rope");
  cuda::rope(x.dtype(), p, preferred(c), as_stream(c.stream));
}

void cuda_backend::silu_mul(const cuda_tensor& gate, const cuda_tensor& up, cuda_tensor& out) const {
  context& c = use(ctx_);
  check(gate.rows() == up.rows() && gate.cols() == up.cols() && gate.dtype() == up.dtype(),
        "silu_mul: gate and up differ in shape or type");
  access::shape(ctx_, out, gate.rows(), gate.cols(), gate.dtype());
  if (gate.empty()) return;
  const cuda::kernel_variant v = preferred(c);
  const cuda::fp8_copy copy = cuda_detail::fp8_copy_for(c, out, v, gate.cols(), {gate.data(), up.data(), out.data()});
  const bool skip = c.skip_launch(7, gate.data(), up.data(), out.data(), gate.rows(), gate.cols(), gate.dtype(), v, copy.codes);
  cuda_detail::fp8_copy_written(c, out, copy);
  if (skip) return;
  const auto timed = time_op(c, copy.wanted() ? "silu_mul + fp8 quantize" : "silu_mul");
  cuda::silu_mul(gate.dtype(), gate.data(), up.data(), out.data(), gate.rows(), gate.cols(), 0, v, copy, as_stream(c.stream));
}

void cuda_backend::swiglu(const cuda_tensor& gate_up, cuda_tensor& out) const {
  context& c = use(ctx_);
  check(gate_up.cols() % 2 == 0, "swiglu: a gate|up row of ", gate_up.cols(), " columns is not two halves");
  check(&gate_up != &out, "swiglu: the output may not alias the input");
  const int cols = gate_up.cols() / 2;
  access::shape(ctx_, out, gate_up.rows(), cols, gate_up.dtype());
  if (out.empty()) return;
  const cuda::kernel_variant v = preferred(c);
  const auto* gate = static_cast<const char*>(gate_up.data());
  const char* up = gate + static_cast<std::size_t>(cols) * dtype_bytes(gate_up.dtype());
  const cuda::fp8_copy copy = cuda_detail::fp8_copy_for(c, out, v, gate_up.cols(), {gate, up, out.data()});
  const bool skip = c.skip_launch(15, gate_up.data(), out.data(), gate_up.rows(), cols, gate_up.dtype(), v, copy.codes);
  cuda_detail::fp8_copy_written(c, out, copy);
  if (skip) return;
  const auto timed = time_op(c, copy.wanted() ? "swiglu + fp8 quantize" : "swiglu");
  cuda::silu_mul(gate_up.dtype(), gate, up, out.data(), gate_up.rows(), cols, gate_up.cols(), v, copy, as_stream(c.stream));
}

void cuda_backend::split_columns(const cuda_tensor& x, std::span<const int> widths, std::span<cuda_tensor* const> outs) const {
  context& c = use(ctx_);
  check(widths.size() == outs.size(), "split_columns: ", widths.size(), " widths for ", outs.size(), " outputs");
  check(!outs.empty() && outs.size() <= cuda::column_split::max_parts, "split_columns: ", outs.size(), " outputs (1 to ",
        cuda::column_split::max_parts, ")");
  std::int64_t sum = 0;
  cuda::column_split parts;
  parts.parts = static_cast<int>(outs.size());
  for (std::size_t i = 0; i < outs.size(); ++i) {
    check(widths[i] >= 0, "split_columns: negative width ", widths[i]);
    check(outs[i] != &x, "split_columns: an output may not alias the input");
    sum += widths[i];
    access::shape(ctx_, *outs[i], x.rows(), widths[i], x.dtype());
    parts.out[i] = outs[i]->data();
    parts.width[i] = widths[i];
  }
  check(sum == x.cols(), "split_columns: widths add up to ", sum, ", not the row of ", x.cols());
  if (x.empty()) return;
  if (c.skip_launch(16, x.data(), x.rows(), x.dtype(), parts.out[0], parts.out[1], parts.out[2], parts.out[3],
                    parts.width[0], parts.width[1], parts.width[2], parts.width[3]))
    return;
  const auto timed = time_op(c, "split_columns");
  cuda::split_columns(x.dtype(), x.data(), x.rows(), parts, as_stream(c.stream));
}

void cuda_backend::add_rms_norm(cuda_tensor& x, const cuda_tensor& y, const cuda_tensor& w, float eps,
                                cuda_tensor& out) const {
  context& c = use(ctx_);
  check(x.rows() == y.rows() && x.cols() == y.cols() && x.dtype() == y.dtype(), "add_rms_norm: shapes or types differ (",
        x.rows(), "x", x.cols(), " and ", y.rows(), "x", y.cols(), ")");
  check(w.cols() == x.cols(), "add_rms_norm: a weight of ", w.cols(), " for rows of ", x.cols());
  check(&out != &x, "add_rms_norm: the output may not be x (it may be y)");
  access::shape(ctx_, out, x.rows(), x.cols(), x.dtype());
  if (x.empty()) return;
  const cuda::kernel_variant v = preferred(c);
  const cuda::fp8_copy copy = cuda_detail::fp8_copy_for(c, out, v, 0, {x.data(), y.data(), w.data(), out.data()});
  const bool skip = c.skip_launch(18, x.data(), y.data(), w.data(), w.dtype(), out.data(), x.rows(), x.cols(), x.dtype(),
                                  eps, v, copy.codes);
  cuda_detail::fp8_copy_written(c, out, copy);
  if (skip) return;
  const auto timed = time_op(c, copy.wanted() ? "add_rms_norm + fp8 quantize" : "add_rms_norm");
  cuda::add_rms_norm(x.dtype(), x.data(), y.data(), w.dtype(), w.data(), out.data(), x.rows(), x.cols(), eps, v, copy,
                     as_stream(c.stream));
}

void cuda_backend::qkv_epilogue(const cuda_tensor& qkv, const zipage::qkv_epilogue<cuda_tensor>& e, cuda_tensor& q,
                                cuda_tensor& k, cuda_tensor& v) const {
  context& c = use(ctx_);
  const int d = e.head_dim, qw = e.num_q_heads * d, kvw = e.num_kv_heads * d;
  check(d > 0 && e.num_q_heads > 0 && e.num_kv_heads > 0, "qkv_epilogue: ", e.num_q_heads, " q heads, ",
        e.num_kv_heads, " KV heads of ", d);
  check(qkv.cols() == qw + 2 * kvw, "qkv_epilogue: a row of ", qkv.cols(), " is not q|k|v of ", qw, " + 2 x ", kvw);
  check(static_cast<std::size_t>(qkv.rows()) == e.positions.size(), "qkv_epilogue: ", qkv.rows(), " rows but ",
        e.positions.size(), " positions");
  auto bf16_or_none = [](const cuda_tensor* t) { return t == nullptr || t->dtype() == cuda_dtype::bf16; };
  auto data = [](const cuda_tensor* t) -> const void* { return t ? t->data() : nullptr; };
  cuda::qkv_epilogue_params p;
  p.qkv = qkv.data();
  p.q_bias = data(e.q_bias);
  p.k_bias = data(e.k_bias);
  p.v_bias = data(e.v_bias);
  p.q_norm = data(e.q_norm);
  p.k_norm = data(e.k_norm);
  p.rows = qkv.rows();
  p.num_q_heads = e.num_q_heads;
  p.num_kv_heads = e.num_kv_heads;
  p.head_dim = d;
  p.eps = e.rms_eps;
  p.style = e.style;
  const bool one_kernel = qkv.dtype() == cuda_dtype::bf16 && c.opts.fast_kernels && bf16_or_none(e.q_bias) &&
                          bf16_or_none(e.k_bias) && bf16_or_none(e.v_bias) && bf16_or_none(e.q_norm) &&
                          bf16_or_none(e.k_norm) && (e.q_norm == nullptr || e.q_norm->cols() == d) &&
                          (e.k_norm == nullptr || e.k_norm->cols() == d);
  if (one_kernel) {
    access::shape(ctx_, q, qkv.rows(), qw, qkv.dtype());
    access::shape(ctx_, k, qkv.rows(), kvw, qkv.dtype());
    access::shape(ctx_, v, qkv.rows(), kvw, qkv.dtype());
    p.q = q.data();
    p.k = k.data();
    p.v = v.data();
  }
  if (!one_kernel || !cuda::qkv_epilogue_supported(p)) {
    separate_qkv_epilogue(*this, qkv, e, q, k, v);
    return;
  }
  if (qkv.empty()) return;
  p.inv_freq = rope_table(c, d, e.rope_theta, e.scaling);
  const section s{e.positions.data(), e.positions.size_bytes()};
  p.positions = c.upload(c.pos_up, cuda_detail::up_pos, {&s, 1}).at<std::int32_t>(0);
  if (c.skip_launch(17, p.qkv, p.q, p.k, p.v, p.q_bias, p.k_bias, p.v_bias, p.q_norm, p.k_norm, p.positions, p.inv_freq,
                    p.rows, qw, kvw, d, p.eps, p.style))
    return;
  const auto timed = time_op(c, "qkv_epilogue");
  cuda::qkv_epilogue(p, as_stream(c.stream));
}

void cuda_backend::add(cuda_tensor& x, const cuda_tensor& y) const {
  context& c = use(ctx_);
  check(x.rows() == y.rows() && x.cols() == y.cols() && x.dtype() == y.dtype(), "add: shapes or types differ (",
        x.rows(), "x", x.cols(), " and ", y.rows(), "x", y.cols(), ")");
  if (x.empty()) return;
  const cuda::kernel_variant v = preferred(c);
  if (c.skip_launch(8, x.data(), y.data(), x.size(), x.dtype(), v)) return;
  const auto timed = time_op(c, "add");
  cuda::add(x.dtype(), x.data(), y.data(), x.data(), x.size(), v, as_stream(c.stream));
}

void cuda_backend::gather_rows(const cuda_tensor& x, std::span<const std::int32_t> rows, cuda_tensor& out) const {
  context& c = use(ctx_);
  check(&x != &out, "gather_rows: the output may not alias the input");
  for (const std::int32_t r : rows) check(r >= 0 && r < x.rows(), "gather_rows: row ", r, " outside ", x.rows());
  const section s{rows.data(), rows.size_bytes()};
  const auto* d_rows = c.upload(c.rows_up, cuda_detail::up_rows, {&s, 1}).at<std::int32_t>(0);
  access::shape(ctx_, out, static_cast<int>(rows.size()), x.cols(), x.dtype());
  if (rows.empty() || x.cols() == 0) return;
  const cuda::kernel_variant v = preferred(c);
  if (c.skip_launch(9, x.data(), x.rows(), x.cols(), x.dtype(), d_rows, rows.size(), out.data(), v)) return;
  const auto timed = time_op(c, "gather_rows");
  cuda::gather_rows(x.dtype(), x.data(), x.rows(), x.cols(), d_rows, static_cast<int>(rows.size()), out.data(), v,
                    as_stream(c.stream));
}

void cuda_backend::concat_rows(const cuda_tensor& a, const cuda_tensor& b, cuda_tensor& out) const {
  context& c = use(ctx_);
  check(&a != &out && &b != &out, "concat_rows: the output may not alias an input");
  check(a.cols() == b.cols() && a.dtype() == b.dtype(), "concat_rows: ", a.rows(), "x", a.cols(), " ",
        to_string(a.dtype()), " over ", b.rows(), "x", b.cols(), " ", to_string(b.dtype()));
  access::shape(ctx_, out, a.rows() + b.rows(), a.cols(), a.dtype());
  if (c.skip_launch(13, a.data(), b.data(), out.data(), a.bytes(), b.bytes())) return;
  const auto timed = time_op(c, "concat_rows");
  if (a.bytes()) ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(out.data(), a.data(), a.bytes(), cudaMemcpyDeviceToDevice, c.stream));
  if (b.bytes())
    ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(out.data()) + a.bytes(), b.data(), b.bytes(),
                                      cudaMemcpyDeviceToDevice, c.stream));
}

}  // namespace zipage
