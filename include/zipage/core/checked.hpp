#pragma once
// Sizes derived from untrusted fields (config.json, GGUF metadata, flags): products computed in 64 bits
// and checked, so a field that passes its own range check cannot overflow a size built from it.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>

#include "zipage/core/error.hpp"

namespace zipage {

// a · b for non-negative a, b, or an error naming what is computed (`what`, e.g. "num_attention_heads x
// head_dim") when the product exceeds `max`.
[[nodiscard]] inline std::int64_t checked_mul(std::int64_t a, std::int64_t b, std::string_view what,
                                              std::int64_t max = std::numeric_limits<std::int64_t>::max()) {
  check(a >= 0 && b >= 0, what, ": negative factor (", a, " x ", b, ")");
  std::int64_t r = 0;
  check(!__builtin_mul_overflow(a, b, &r) && r <= max, what, " = ", a, " x ", b, " is too large (at most ", max, ")");
  return r;
}

[[nodiscard]] inline std::int64_t checked_add(std::int64_t a, std::int64_t b, std::string_view what,
                                              std::int64_t max = std::numeric_limits<std::int64_t>::max()) {
  std::int64_t r = 0;
  check(!__builtin_add_overflow(a, b, &r) && r <= max, what, " = ", a, " + ", b, " is too large (at most ", max, ")");
  return r;
}

// The product narrowed to int (tensor dimensions are int): an error naming `what` beyond INT_MAX.
[[nodiscard]] inline int checked_dim(std::int64_t a, std::int64_t b, std::string_view what) {
  return static_cast<int>(checked_mul(a, b, what, std::numeric_limits<int>::max()));
}

// Why `x` cannot be stored in a float, or nullptr when it can: a value past float's range would become inf (and
// converting it is undefined), and a nonzero value below its smallest step would become 0 (a positive epsilon or
// probability turned into nothing). Shared by the config readers (checked_float) and the tools' float flags.
[[nodiscard]] inline const char* float_narrowing_problem(double x) noexcept {
  if (!std::isfinite(x)) return "is not a finite number";
  if (std::fabs(x) > static_cast<double>(std::numeric_limits<float>::max()))
    return "is too large for a 32-bit float (at most 3.40282e+38)";
  if (x != 0.0 && static_cast<float>(x) == 0.0f) return "is too small for a 32-bit float (it would round to 0)";
  return nullptr;
}

// `x` as a float, or an error naming `what` (e.g. "config.json: field 'rms_norm_eps'") and the value.
[[nodiscard]] inline float checked_float(double x, std::string_view what) {
  if (const char* problem = float_narrowing_problem(x)) fail(what, " = ", x, " ", problem);
  return static_cast<float>(x);
}

}  // namespace zipage
