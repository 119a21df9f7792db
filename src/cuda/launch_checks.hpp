#pragma once
// Private to src/cuda/ (host code, no CUDA header): the predicates the launchers' kernel choices and
// argument checks are written with, in one place.
#include <cstdint>

#include "zipage/backend/cuda/fp8_copy.hpp"
#include "zipage/core/error.hpp"

namespace zipage::cuda::detail {

[[nodiscard]] inline bool aligned(const void* p, std::uintptr_t bytes) {
  return (reinterpret_cast<std::uintptr_t>(p) % bytes) == 0;
}
// 16-byte alignment: what the vectorised loads and cp.async copies of the tuned kernels need.
[[nodiscard]] inline bool aligned16(const void* p) { return aligned(p, 16); }
[[nodiscard]] inline bool power_of_two(int x) { return x > 0 && (x & (x - 1)) == 0; }

// An fp8_copy (fp8_copy.hpp) that a kernel of `op` is asked to write beside its output of `rows` rows: 8-byte
// aligned codes (the kernels store 8 codes at a time), scales, and rows padded as fp8::padded_rows pads them.
inline void check_fp8_copy(const char* op, const fp8_copy& copy, std::int64_t rows) {
  check(copy.scales != nullptr && aligned(copy.codes, 8), op, ": an FP8 copy needs 8-byte aligned codes and scales");
  check(copy.padded >= rows && copy.padded % 4 == 0, op, ": an FP8 copy of ", rows, " rows padded to ", copy.padded,
        " (fp8::padded_rows)");
}

}  // namespace zipage::cuda::detail
