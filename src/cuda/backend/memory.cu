// zipage::cuda_backend (backend/cuda/cuda_backend.hpp): device memory — buffers and tensors, the backend's
// construction, host <-> device tensor copies, the KV storage, filled tensors, synchronisation and free memory.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "context.cuh"
#include "zipage/backend/cuda/attention.hpp"  // wgmma_prefill_available
#include "zipage/backend/cuda/fp8_gemm.hpp"   // gemm_sm90_available
#include "zipage/backend/cuda/ops.hpp"
#include "zipage/cuda/device.hpp"

namespace zipage {

// ---------------------------------------------------------------------------------------------------
// buffer / tensor

cuda_buffer::~cuda_buffer() { access::release(*this); }

cuda_tensor::cuda_tensor(const cuda_tensor& o) : rows_(0), cols_(0), dtype_(o.dtype_) { *this = o; }

cuda_tensor& cuda_tensor::operator=(const cuda_tensor& o) {
  if (this == &o) return *this;
  const auto ctx = access::owner(o);
  if (!ctx || o.empty()) {
    rows_ = o.rows_;
    cols_ = o.cols_;
    dtype_ = o.dtype_;
    return *this;
  }
  if (o.dtype_ == cuda_dtype::e4m3) {  // an FP8 weight: codes and block scales
    cuda_buffer codes, scales;
    const std::size_t sbytes = o.scale_.capacity();
    access::reserve(ctx, codes, o.bytes());
    access::reserve(ctx, scales, sbytes);
    ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(codes.data(), o.data(), o.bytes(), cudaMemcpyDeviceToDevice, ctx->stream));
    ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(scales.data(), o.scales(), sbytes, cudaMemcpyDeviceToDevice, ctx->stream));
    access::set_e4m3(*this, std::move(codes), std::move(scales), o.rows_, o.cols_);
    return *this;
  }
  access::shape(ctx, *this, o.rows_, o.cols_, o.dtype_);
  ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(data(), o.data(), o.bytes(), cudaMemcpyDeviceToDevice, ctx->stream));
  return *this;
}

namespace {

std::uint16_t to_bf16_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

}  // namespace

cuda_backend::cuda_backend() : cuda_backend(cuda_backend_options{}) {}

namespace {
const cuda_backend_options& validated(const cuda_backend_options& o) {
  o.validate();
  return o;
}
}  // namespace

cuda_backend::cuda_backend(const cuda_backend_options& options)
    : ctx_(std::make_shared<context>(validated(options))) {
  if (options.wgmma_prefill()) {
    ctx_->activate();
    check(cuda::wgmma_prefill_available(), "cuda_backend_options::prefill_kernel ", cuda::to_string(options.prefill_kernel),
          " needs an sm_90a build of zipage (CMAKE_CUDA_ARCHITECTURES=90a) and a compute-capability-9.0 device; ",
          "this is ", cuda::describe_device(options.device));
  }
  if (options.fp8_decode_kernel == cuda::fp8_decode_kernel::swapped_e4m3_qk) {
    ctx_->activate();
    check(cuda::current_device_runs_sm90a(), "cuda_backend_options::fp8_decode_kernel swapped_e4m3_qk (wgmma) needs an ",
          "sm_90a build of zipage (CMAKE_CUDA_ARCHITECTURES=90a) and a compute-capability-9.0 device; this is ",
          cuda::describe_device(options.device));
  }
  if (options.fp8_gemm_kernel == cuda::fp8_gemm_kernel::sm90) {
    ctx_->activate();
    check(cuda::fp8::gemm_sm90_available(), "cuda_backend_options::fp8_gemm_kernel sm90 needs an sm_90a build of zipage ",
          "(CMAKE_CUDA_ARCHITECTURES=90a), a compute-capability-9.0 device and a driver with TMA tensor maps; this is ",
          cuda::describe_device(options.device));
  }
}

const cuda_backend_options& cuda_backend::options() const { return ctx_->opts; }

cuda_tensor cuda_backend::from_host(std::span<const float> values, int rows, int cols) const {
  check(values.size() == static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols), "cuda_backend: ",
        values.size(), " values do not fill a ", rows, "x", cols, " tensor");
  ctx_->activate();
  ++ctx_->launch_seq;  // a host write: new memory may reuse that of an activation whose FP8 codes are recorded
  cuda_tensor t;
  access::shape(ctx_, t, rows, cols, ctx_->opts.dtype);
  if (t.empty()) return t;
  if (ctx_->opts.dtype == cuda_dtype::f32) {
    ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(t.data(), values.data(), t.bytes(), cudaMemcpyHostToDevice, ctx_->stream));
  } else {
    std::vector<std::uint16_t> bits(values.size());
    std::transform(values.begin(), values.end(), bits.begin(), to_bf16_bits);
    ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(t.data(), bits.data(), t.bytes(), cudaMemcpyHostToDevice, ctx_->stream));
  }
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));  // the host values may go away
  return t;
}

std::vector<float> cuda_backend::to_host(const cuda_tensor& t) const {
  const auto t0 = cuda_detail::clock::now();
  context& c = use(ctx_);
  c.activate();
  check(t.dtype() != cuda_dtype::e4m3, "to_host: an e4m3 tensor is an FP8 linear weight; read it with fp8_weight_to_host");
  const auto n = static_cast<std::size_t>(t.size());
  std::vector<float> out;
  if (n == 0) {
    ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.stream));
    return out;
  }
  c.to_host_pinned.reserve(n * sizeof(float));
  const void* src = t.data();
  if (t.dtype() != cuda_dtype::f32) {
    void* f = c.to_host_dev.reserve(n * sizeof(float), c.stream);
    cuda::to_f32(t.dtype(), t.data(), static_cast<float*>(f), static_cast<std::int64_t>(n), as_stream(c.stream));
    src = f;
  }
  // In chunks, each with an event, so that copying chunk i into the vector overlaps the device-to-host
  // transfer of the chunks after it (the logits of a big batch are ~100 MB).
  const std::size_t bytes = n * sizeof(float);
  constexpr std::size_t kChunkBytes = std::size_t{8} << 20;
  const std::size_t chunks = std::clamp<std::size_t>((bytes + kChunkBytes - 1) / kChunkBytes, 1, c.chunk_events.size());
  const std::size_t per = (n + chunks - 1) / chunks;
  float* h = c.to_host_pinned.as<float>();
  const auto* s = static_cast<const float*>(src);
  for (std::size_t i = 0; i < chunks; ++i) {
    const std::size_t off = i * per, len = std::min(per, n - std::min(n, off));
    if (len) ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(h + off, s + off, len * sizeof(float), cudaMemcpyDeviceToHost, c.stream));
    ZIPAGE_CUDA_CHECK(cudaEventRecord(c.chunk_events[i], c.stream));
  }
  out.reserve(n);
  for (std::size_t i = 0; i < chunks; ++i) {
    const std::size_t off = i * per, len = std::min(per, n - std::min(n, off));
    ZIPAGE_CUDA_CHECK(cudaEventSynchronize(c.chunk_events[i]));
    out.insert(out.end(), h + off, h + off + len);
  }
  const double dt = cuda_detail::seconds_since(t0);
  c.count([&](cuda_backend_counters& k) {
    k.to_host_seconds += dt;
    k.to_host_bytes += static_cast<std::int64_t>(n * sizeof(float));
  });
  return out;
}

cuda_kv_storage cuda_backend::allocate_kv(const kv_cache_shape& shape) const {
  check(shape.num_layers > 0 && shape.num_blocks > 0 && shape.block_size > 0 && shape.num_kv_heads > 0 &&
            shape.head_dim > 0,
        "cuda_backend: bad KV cache shape");
  cuda_kv_storage kv;
  kv.shape = shape;
  kv.dtype = ctx_->opts.dtype;
  kv.kv_dtype = ctx_->opts.kv_dtype;
  check(!kv.fp8() || shape.head_dim % 4 == 0, "cuda_backend: an FP8 KV cache needs head_dim % 4 == 0 (got ",
        shape.head_dim, ")");
  // A block's scales (a bf16 per token and KV head) are whole 4-byte words: the tuned kernels gather each token's
  // scale as the aligned word that holds it (paged_kv_view::fp8_scale_words), copies and swaps move words.
  check(!kv.fp8() || (std::int64_t{shape.block_size} * shape.num_kv_heads) % 2 == 0,
        "cuda_backend: an FP8 KV cache needs block_size x num_kv_heads even (2-byte scales moved as 4-byte words; "
        "got block_size ", shape.block_size, ", ", shape.num_kv_heads, " KV heads)");
  check(!ctx_->opts.wgmma_prefill() || shape.head_dim == 128, "cuda_backend_options::prefill_kernel ",
        cuda::to_string(ctx_->opts.prefill_kernel), " needs head_dim 128; this model has ", shape.head_dim);
  // (A shape without its query heads, num_q_heads 0, is one a caller built by hand: the engine's always has them.)
  check(!cuda::is_swapped(ctx_->opts.fp8_decode_kernel) ||
            (shape.head_dim == 128 && (shape.num_q_heads == 0 || shape.num_q_heads <= 8 * shape.num_kv_heads)),
        "cuda_backend_options::fp8_decode_kernel ", cuda::to_string(ctx_->opts.fp8_decode_kernel),
        " needs head_dim 128 and at most 8 query heads per KV head; this model has head_dim ", shape.head_dim, " and ",
        shape.num_q_heads, " / ", shape.num_kv_heads, " heads (automatic picks the kernel that fits)");
  const std::size_t eb = kv.element_bytes();
  const auto side = static_cast<std::size_t>(shape.elements_per_side()) * eb;
  access::reserve(ctx_, kv.k, side, false);
  access::reserve(ctx_, kv.v, side, false);
  if (shape.score_cache) access::reserve(ctx_, kv.scores, static_cast<std::size_t>(shape.score_elements()) * 4, false);
  if (kv.fp8()) {
    const auto sbytes = static_cast<std::size_t>(kv.scale_layer_elements() * shape.num_layers) * sizeof(std::uint16_t);
    access::reserve(ctx_, kv.k_scale, sbytes, false);
    access::reserve(ctx_, kv.v_scale, sbytes, false);
    ZIPAGE_CUDA_CHECK(cudaMemsetAsync(kv.k_scale.data(), 0, sbytes, ctx_->stream));
    ZIPAGE_CUDA_CHECK(cudaMemsetAsync(kv.v_scale.data(), 0, sbytes, ctx_->stream));
  }
  const auto qbytes = static_cast<std::size_t>(shape.query_layer_stride() * shape.num_layers) * kv.query_element_bytes();
  if (qbytes) access::reserve(ctx_, kv.queries, qbytes, false);
  // Zeroed like the CPU storage (the compressor may read score-cache entries never written).
  ZIPAGE_CUDA_CHECK(cudaMemsetAsync(kv.k.data(), 0, side, ctx_->stream));
  ZIPAGE_CUDA_CHECK(cudaMemsetAsync(kv.v.data(), 0, side, ctx_->stream));
  if (kv.scores.data())
    ZIPAGE_CUDA_CHECK(cudaMemsetAsync(kv.scores.data(), 0, static_cast<std::size_t>(shape.score_elements()) * 4, ctx_->stream));
  if (kv.queries.data()) ZIPAGE_CUDA_CHECK(cudaMemsetAsync(kv.queries.data(), 0, qbytes, ctx_->stream));
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));
  return kv;
}
// ---------------------------------------------------------------------------------------------------
// extras

cuda_tensor cuda_backend::random_tensor(int rows, int cols, float scale, std::uint64_t seed) const {
  ++ctx_->launch_seq;  // as from_host
  cuda_tensor t;
  access::shape(ctx_, t, rows, cols, ctx_->opts.dtype);
  cuda::fill_uniform(t.dtype(), t.data(), t.size(), scale, seed, as_stream(ctx_->stream));
  return t;
}

cuda_tensor cuda_backend::constant_tensor(int rows, int cols, float value) const {
  ++ctx_->launch_seq;  // as from_host
  cuda_tensor t;
  access::shape(ctx_, t, rows, cols, ctx_->opts.dtype);
  cuda::fill_constant(t.dtype(), t.data(), t.size(), value, as_stream(ctx_->stream));
  return t;
}
void cuda_backend::synchronize() const {
  ctx_->activate();
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));
}
std::pair<std::size_t, std::size_t> cuda_backend::memory_info() const {
  ctx_->activate();
  std::size_t free_b = 0, total_b = 0;
  ZIPAGE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return {free_b, total_b};
}

}  // namespace zipage
