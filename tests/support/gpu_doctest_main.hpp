#pragma once
// The main() of a doctest GPU test program: where there is no CUDA device it prints SKIPPED and exits 77
// (the tests' SKIP_RETURN_CODE, so ctest reports them skipped); else it names device 0 and runs the tests.
// Include after <doctest/doctest.h> with DOCTEST_CONFIG_IMPLEMENT defined.
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "zipage/cuda/device.hpp"

namespace zipage::testing {

// `more`, when given, adds to device 0's line (e.g. "; NCCL 2.21.5").
inline int gpu_doctest_main(int argc, char** argv, std::string (*more)() = nullptr) {
  if (cuda::device_count() == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", cuda::describe_device().c_str());
    return 77;
  }
  std::printf("device 0: %s%s\n", cuda::describe_device(0).c_str(), more != nullptr ? more().c_str() : "");
  doctest::Context context(argc, argv);
  return context.run();
}

}  // namespace zipage::testing
