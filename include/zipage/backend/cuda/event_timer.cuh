#pragma once
// One CUDA event timer, shared by the benches (bench/*.cu) and the backend's own measurements
// (cuda_backend::measure_copy_bandwidth / measure_gemm_tflops): the device time between two events
// recorded on a stream. For CUDA translation units (it includes cuda_runtime.h); throws zipage::error
// when a CUDA call fails.
//
//   zipage::cuda::event_timer timer;
//   const double s = timer.time(stream, [&] { launch(stream); });   // start, launch, stop, wait
#include <cuda_runtime.h>

#include "zipage/backend/cuda/common.cuh"

namespace zipage::cuda {

class event_timer {
 public:
  event_timer() {
    ZIPAGE_CUDA_CHECK(cudaEventCreate(&start_));
    ZIPAGE_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~event_timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  event_timer(const event_timer&) = delete;
  event_timer& operator=(const event_timer&) = delete;

  // Records the start (stop) event on `stream` (nullptr: the legacy default stream).
  void start(cudaStream_t stream = nullptr) { ZIPAGE_CUDA_CHECK(cudaEventRecord(start_, stream)); }
  void stop(cudaStream_t stream = nullptr) { ZIPAGE_CUDA_CHECK(cudaEventRecord(stop_, stream)); }

  // Waits for the stop event; the milliseconds between start and stop.
  [[nodiscard]] float elapsed_ms() const {
    ZIPAGE_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0.0f;
    ZIPAGE_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }
  [[nodiscard]] double seconds() const { return elapsed_ms() * 1e-3; }

  // start(stream), f(), stop(stream), then waits: the seconds f's work took on the stream.
  template <class F>
  double time(cudaStream_t stream, F&& f) {
    start(stream);
    f();
    stop(stream);
    return seconds();
  }

 private:
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

}  // namespace zipage::cuda
