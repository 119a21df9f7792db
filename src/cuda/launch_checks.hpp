#pragma once
// Private to src/cuda/ (host code, no CUDA header): the predicates the launchers' kernel choices and
// argument checks are written with, in one place.
#include <cstdint>

namespace zipage::cuda::detail {

[[nodiscard]] inline bool aligned(const void* p, std::uintptr_t bytes) {
  return (reinterpret_cast<std::uintptr_t>(p) % bytes) == 0;
}
// 16-byte alignment: what the vectorised loads and cp.async copies of the tuned kernels need.
[[nodiscard]] inline bool aligned16(const void* p) { return aligned(p, 16); }
[[nodiscard]] inline bool power_of_two(int x) { return x > 0 && (x & (x - 1)) == 0; }

}  // namespace zipage::cuda::detail
