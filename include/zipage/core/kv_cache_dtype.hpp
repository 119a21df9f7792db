#pragma once
// The KV cache's storage type, chosen at run time (vLLM's --kv-cache-dtype): `auto_` keeps K/V in the
// model's compute dtype (bf16 or fp32); `fp8_e4m3` stores OCP E4M3 codes with one bf16 scale (core/kv_scale.hpp)
// per (token, KV head) and side (docs/fp8.md). A backend that has no FP8 path refuses fp8_e4m3 at construction
// with an error naming it.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "zipage/core/error.hpp"

namespace zipage {

enum class kv_cache_dtype : std::uint8_t { auto_, fp8_e4m3 };

[[nodiscard]] constexpr const char* to_string(kv_cache_dtype t) { return t == kv_cache_dtype::fp8_e4m3 ? "fp8_e4m3" : "auto"; }

// --kv-cache-dtype's spellings (vLLM's; "fp8" means E4M3, as in vLLM).
inline constexpr std::array<std::string_view, 3> kv_cache_dtype_names{"auto", "fp8", "fp8_e4m3"};

// One of kv_cache_dtype_names; anything else is an error.
[[nodiscard]] inline kv_cache_dtype parse_kv_cache_dtype(std::string_view s) {
  if (s == "auto") return kv_cache_dtype::auto_;
  if (s == "fp8" || s == "fp8_e4m3") return kv_cache_dtype::fp8_e4m3;
  fail("--kv-cache-dtype: '", std::string(s), "' is not one of auto, fp8, fp8_e4m3");
}

}  // namespace zipage
