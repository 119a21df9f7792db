#pragma once
// Test and benchmark support for CUDA code (host side): an error check that ends the program with the
// failing call named, a device buffer, host bf16 conversions and a median. Not part of the library.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#define ZIPAGE_TEST_CUDA_OK(expr)                                                                            \
  do {                                                                                                       \
    const cudaError_t e_ = (expr);                                                                           \
    if (e_ != cudaSuccess) {                                                                                 \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #expr); \
      std::exit(1);                                                                                          \
    }                                                                                                        \
  } while (0)

namespace zipage::testing {

// `n` elements of T on the device (at least one is allocated, so p is never null).
template <class T>
struct device_buffer {
  T* p = nullptr;
  std::size_t n = 0;

  device_buffer() = default;
  explicit device_buffer(std::size_t count) : n(count) {
    ZIPAGE_TEST_CUDA_OK(cudaMalloc(&p, std::max<std::size_t>(1, n) * sizeof(T)));
  }
  explicit device_buffer(const std::vector<T>& h) : device_buffer(h.size()) { put(h); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  device_buffer(device_buffer&& o) noexcept : p(o.p), n(o.n) { o.p = nullptr, o.n = 0; }
  device_buffer& operator=(device_buffer&& o) noexcept {
    std::swap(p, o.p);
    std::swap(n, o.n);
    return *this;
  }
  ~device_buffer() {
    if (p) cudaFree(p);
  }

  void put(const std::vector<T>& h) {
    if (n) ZIPAGE_TEST_CUDA_OK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  [[nodiscard]] std::vector<T> get() const {
    std::vector<T> h(n);
    ZIPAGE_TEST_CUDA_OK(cudaDeviceSynchronize());
    if (n) ZIPAGE_TEST_CUDA_OK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  // Every byte 0xff: a bf16 0xffff and an fp32 0xffffffff are NaN, so unwritten outputs show.
  void poison() { ZIPAGE_TEST_CUDA_OK(cudaMemset(p, 0xff, std::max<std::size_t>(1, n) * sizeof(T))); }
};

// fp32 -> bf16, round to nearest even; every NaN becomes the canonical quiet NaN 0x7fc0.
inline std::uint16_t to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
inline float from_bf16(std::uint16_t h) {
  const std::uint32_t u = std::uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline constexpr std::uint16_t kBf16NaN = 0x7fc0;

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace zipage::testing
