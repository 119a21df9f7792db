// Smoke test of the CUDA library from host code: skipped (exit 77, reported as skipped by ctest) where
// no GPU is present.
#include <cstdio>

#include "zipage/cuda/device.hpp"

int main() {
  const int n = zipage::cuda::device_count();
  if (n == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", zipage::cuda::describe_device().c_str());
    return 77;
  }
  const std::string d = zipage::cuda::describe_device(0);
  std::printf("device 0: %s\n", d.c_str());
  return d.find("sm_") != std::string::npos ? 0 : 1;
}
