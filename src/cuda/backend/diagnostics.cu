// zipage::cuda_backend (backend/cuda/cuda_backend.hpp): diagnostics — KV cache contents for tests, counters, the
// device's name, and measured copy bandwidth and GEMM throughput.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "context.cuh"
#include "zipage/backend/cuda/event_timer.cuh"
#include "zipage/backend/cuda/ops.hpp"
#include "zipage/core/fp8.hpp"
#include "zipage/core/kv_scale.hpp"

namespace zipage {

void cuda_backend::read_stream(const tensor& t, int passes) const {
  context& c = use(ctx_);
  c.activate();
  check(passes >= 0, "read_stream: passes ", passes, " is negative");
  unsigned* sink = static_cast<unsigned*>(c.to_host_dev.reserve(sizeof(unsigned), c.stream));
  for (int i = 0; i < passes; ++i) cuda::read_stream(t.data(), t.bytes(), sink, as_stream(c.stream));
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.stream));
}

void cuda_backend::kv_fp8_to_host(const cuda_kv_storage& kv, bool values, std::vector<std::uint8_t>& codes,
                                  std::vector<std::uint16_t>& scales) const {
  context& c = use(ctx_);
  c.activate();
  check(kv.fp8(), "kv_fp8_to_host: the KV cache is not FP8");
  codes.resize(static_cast<std::size_t>(kv.shape.elements_per_side()));
  scales.resize(static_cast<std::size_t>(kv.scale_layer_elements() * kv.shape.num_layers));
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  // legacy stream: after the backend's stream is synchronised, and a copy into pageable memory returns when done
  ZIPAGE_CUDA_CHECK(cudaMemcpy(codes.data(), values ? kv.v.data() : kv.k.data(), codes.size(), cudaMemcpyDeviceToHost));
  // legacy stream: as above
  ZIPAGE_CUDA_CHECK(cudaMemcpy(scales.data(), values ? kv.v_scale.data() : kv.k_scale.data(),
                               scales.size() * sizeof(std::uint16_t), cudaMemcpyDeviceToHost));
}

std::vector<float> cuda_backend::kv_to_host(const cuda_kv_storage& kv, bool values) const {
  if (kv.fp8()) {
    std::vector<std::uint8_t> codes;
    std::vector<std::uint16_t> scales;
    kv_fp8_to_host(kv, values, codes, scales);
    std::vector<float> out(codes.size());
    const std::size_t d = static_cast<std::size_t>(kv.shape.head_dim);
    for (std::size_t i = 0; i < codes.size(); ++i) out[i] = fp8_e4m3_to_f32(codes[i]) * kv_scale_to_f32(scales[i / d]);
    return out;
  }
  context& c = use(ctx_);
  c.activate();
  const auto n = static_cast<std::size_t>(kv.shape.elements_per_side());
  std::vector<float> out(n);
  void* f = c.to_host_dev.reserve(n * sizeof(float), c.stream);
  cuda::to_f32(kv.dtype, values ? kv.v.data() : kv.k.data(), static_cast<float*>(f), static_cast<std::int64_t>(n),
               as_stream(c.stream));
  ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(out.data(), f, n * sizeof(float), cudaMemcpyDeviceToHost, c.stream));
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  return out;
}
cuda_backend_counters cuda_backend::counters() const {
  std::lock_guard lock(ctx_->counters_mu);
  return ctx_->counters;
}

void cuda_backend::reset_counters() const {
  std::lock_guard lock(ctx_->counters_mu);
  ctx_->counters = {};
}
std::vector<cuda_op_time> cuda_backend::take_op_times() const {
  context& c = use(ctx_);
  std::vector<cuda_op_time> out;
  std::unordered_map<std::string, std::size_t> index;
  for (auto& t : c.timed_ops) {
    ZIPAGE_CUDA_CHECK(cudaEventSynchronize(t.stop));
    float ms = 0.0f;
    ZIPAGE_CUDA_CHECK(cudaEventElapsedTime(&ms, t.start, t.stop));
    const auto [at, fresh] = index.try_emplace(t.name, out.size());
    if (fresh) out.push_back({t.name, 0, 0.0});
    cuda_op_time& sum = out[at->second];
    ++sum.calls;
    sum.ms += ms;
    c.spare_events.push_back(t.start);
    c.spare_events.push_back(t.stop);
  }
  c.timed_ops.clear();
  return out;
}

std::string cuda_backend::device_name() const {
  cudaDeviceProp p{};
  ZIPAGE_CUDA_CHECK(cudaGetDeviceProperties(&p, ctx_->opts.device));
  return p.name;
}

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}
}  // namespace

double cuda_backend::measure_copy_bandwidth(std::size_t bytes, int reps) const {
  context& c = use(ctx_);
  c.activate();
  void *a = nullptr, *b = nullptr;
  ZIPAGE_CUDA_CHECK(cudaMalloc(&a, bytes));
  ZIPAGE_CUDA_CHECK(cudaMalloc(&b, bytes));
  cuda::fill_uniform(cuda_dtype::f32, a, static_cast<std::int64_t>(bytes / 4), 1.0f, 7, as_stream(c.stream));
  std::vector<double> times;
  {
    cuda::event_timer timer;
    for (int r = 0; r < reps + 2; ++r) {
      const double s = timer.time(
          c.stream, [&] { ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, c.stream)); });
      if (r >= 2) times.push_back(s);
    }
  }
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(bytes) / median(times) / 1e9;
}

double cuda_backend::measure_gemm_tflops(int n, int reps) const {
  context& c = use(ctx_);
  c.activate();
  cuda_backend_options o = c.opts;
  o.dtype = cuda_dtype::bf16;
  o.batch_invariant = false;
  const cuda_backend bf(o);
  const cuda_tensor x = bf.random_tensor(n, n, 1.0f, 1), w = bf.random_tensor(n, n, 1.0f, 2);
  cuda_tensor out;
  bf.linear(x, w, out);
  bf.synchronize();
  const auto& bc = *bf.ctx_;
  std::vector<double> times;
  {
    cuda::event_timer timer;
    for (int r = 0; r < reps + 1; ++r) {
      const double s = timer.time(bc.stream, [&] { bf.linear(x, w, out); });
      if (r >= 1) times.push_back(s);
    }
  }
  return 2.0 * double(n) * n * n / median(times) / 1e12;
}

}  // namespace zipage
