#pragma once
// The device-to-device copy bandwidth that the benches read their kernels against (bench/*.cu): a 2 GiB
// cudaMemcpy of random bf16 data, bytes read + written per second, the median of 15 timed copies after 3 warm-ups.
// For CUDA translation units (event_timer.cuh). Not part of the library.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda_buffers.hpp"
#include "zipage/backend/cuda/event_timer.cuh"
#include "zipage/backend/cuda/ops.hpp"  // fill_uniform

namespace zipage::testing {

inline double measure_copy_bandwidth() {
  const std::size_t bytes = std::size_t(2) << 30;
  device_buffer<std::uint8_t> a(bytes), b(bytes);
  cuda::fill_uniform(cuda_dtype::bf16, a.p, static_cast<std::int64_t>(bytes / 2), 1.0f, 7, nullptr);
  cuda::event_timer timer;
  std::vector<double> times;
  for (int i = 0; i < 18; ++i) {
    const double s = timer.time(nullptr, [&] {
      ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice));
    });
    if (i >= 3) times.push_back(s);
  }
  return 2.0 * bytes / median(times);
}

}  // namespace zipage::testing
