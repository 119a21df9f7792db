#pragma once
// Shared by the libFuzzer harnesses: bad input must end in a zipage::error (the library's one way of
// saying "this file is wrong"); anything else — a crash, a sanitizer report, another exception type
// escaping, an allocation beyond libFuzzer's -malloc_limit_mb, a hang — is a finding. So is json::unexpected_json,
// the error of json::interpret's net (a nlohmann error that a reader's named checks let through: the user gets a
// named error, but the reader has a gap to close).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/json.hpp"

namespace zipage_fuzz {

inline std::string_view text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

inline std::vector<std::byte> bytes(const std::uint8_t* data, std::size_t size) {
  const auto* p = reinterpret_cast<const std::byte*>(data);
  return {p, p + size};
}

// Runs f; a zipage::error is the expected outcome for bad input and is swallowed, unless it is the JSON net's.
template <class F>
void expect_only_zipage_errors(F&& f) {
  try {
    f();
  } catch (const zipage::json::unexpected_json&) {
    std::abort();
  } catch (const zipage::error&) {
  }
}

// A property that must hold: abort (a finding, with the input saved by libFuzzer) when it does not.
inline void require(bool ok) {
  if (!ok) std::abort();
}

}  // namespace zipage_fuzz
