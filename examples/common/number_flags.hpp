#pragma once
// Numeric flag checks shared by the tools (engine_cli.hpp's engine flags, zipage-eval's grid): finite numbers only,
// with an error that names a readable range.
#include <CLI/CLI.hpp>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <system_error>

#include "zipage/core/checked.hpp"
#include "zipage/core/error.hpp"
#include "zipage/core/host_memory.hpp"

namespace zipage_cli {

// A numeric flag's check: the value must parse as a finite number (NaN and inf are refused: converting
// them is undefined) satisfying `ok`; the error names the flag (CLI11 prefixes it) and a readable range,
// not CLI11's 309-digit bounds of double.
inline CLI::Validator number_check(const std::string& range, std::function<bool(double)> ok) {
  return CLI::Validator(
      [range, ok](std::string& input) -> std::string {
        errno = 0;
        char* end = nullptr;
        const double v = std::strtod(input.c_str(), &end);
        if (input.empty() || end == input.c_str() || *end != '\0') return "'" + input + "' is not a number";
        if (!std::isfinite(v)) return "'" + input + "' is not a finite number";
        if (!ok(v)) return input + " is out of range: it must be " + range;
        return {};
      },
      range);
}
// A flag held in a float (the sampling flags): `range`'s check, then the value as typed must survive narrowing to
// float. The range is checked on the double, so without this 1e308 passed as an inf temperature and --top-p 1e-50
// became 0 (the library then named the wrong value or field).
inline CLI::Validator float_value(CLI::Validator range) {
  const std::string description = range.get_description();
  return CLI::Validator(
      [range](std::string& input) mutable -> std::string {
        if (std::string problem = range(input); !problem.empty()) return problem;
        if (const char* problem = zipage::float_narrowing_problem(std::strtod(input.c_str(), nullptr)))
          return input + " " + problem;
        return {};
      },
      description);
}
inline CLI::Validator positive() { return number_check("> 0", [](double v) { return v > 0; }); }
inline CLI::Validator non_negative() { return number_check(">= 0", [](double v) { return v >= 0; }); }
inline CLI::Validator in_range(double lo, double hi) {
  std::ostringstream r;
  r << "in [" << lo << ", " << hi << "]";
  return number_check(r.str(), [lo, hi](double v) { return v >= lo && v <= hi; });
}
// (lo, hi]: a mass that must keep something (--top-p 0 would keep no token).
inline CLI::Validator in_half_open(double lo, double hi) {
  std::ostringstream r;
  r << "in (" << lo << ", " << hi << "]";
  return number_check(r.str(), [lo, hi](double v) { return v > lo && v <= hi; });
}
// Flags that count something held in an int (tokens, blocks, requests): 1 .. 2^31 - 1.
inline CLI::Validator positive_count() {
  return number_check("in [1, 2147483647]", [](double v) { return v >= 1 && v <= 2147483647.0; });
}
inline CLI::Validator count() {
  return number_check("in [0, 2147483647]", [](double v) { return v >= 0 && v <= 2147483647.0; });
}
// --top-k: a count, or -1 (vLLM's "off", as 0 is).
inline CLI::Validator top_k_check() {
  return number_check("in [-1, 2147483647] (-1 or 0 = off)", [](double v) { return v >= -1 && v <= 2147483647.0; });
}
// A 64-bit seed: a whole number in [0, 2^64 - 1], written as one (no sign, exponent or fraction), so that no
// value is silently wrapped or clamped.
inline CLI::Validator seed_check() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        std::uint64_t v = 0;
        const auto [end, ec] = std::from_chars(input.data(), input.data() + input.size(), v);
        if (input.empty() || ec == std::errc::invalid_argument || end != input.data() + input.size())
          return "'" + input + "' is not a whole number";
        if (ec == std::errc::result_out_of_range) return input + " is out of range: it must be in [0, 2^64 - 1]";
        return {};
      },
      "in [0, 2^64 - 1]");
}

// --kv-cache-mib: at most 2^30 MiB (1 PiB) on the flag; on the CPU also at most the machine's available memory.
// Its lower end is one byte: a smaller positive size (1e-300) was accepted here and became a pool of 0 bytes.
inline constexpr double max_kv_cache_mib = 1073741824.0;
inline constexpr double min_kv_cache_mib = 1.0 / 1048576.0;
inline CLI::Validator kv_cache_mib_check() {
  return number_check("in [2^-20 (one byte), 1073741824 (1 PiB)]",
                      [](double v) { return v >= min_kv_cache_mib && v <= max_kv_cache_mib; });
}

// A CPU pool of `kv_cache_mib` lives in host memory: more than the machine has available (MemAvailable +
// SwapFree, or the process's cgroup limit less its usage where that is tighter) is an error now, not a
// std::bad_alloc after seconds of allocating or the OOM killer (nothing to check when --num-blocks sizes the pool
// instead; the engine checks again once the weights are loaded).
inline void check_host_kv_cache_mib(double kv_cache_mib, int num_blocks) {
  const zipage::available_memory available = zipage::host_available_memory();
  if (!available.known() || num_blocks > 0) return;
  const double mib = static_cast<double>(available.bytes) / 1048576.0;
  zipage::check(kv_cache_mib <= mib, "--kv-cache-mib ", kv_cache_mib, " is more than this machine's available memory (",
                static_cast<long long>(mib), " MiB: ", available.source, ")");
}

}  // namespace zipage_cli
