#pragma once
// How a device backend stores the transformer blocks' linear weights (q/k/v/o, gate/up/down; never the
// embeddings, lm_head or norms), chosen at run time (vLLM's --quantization; docs/fp8.md "FP8 weights"):
//   auto_     the compute dtype, except that an FP8 checkpoint (quantization_config fp8) runs in FP8, as vLLM;
//   compute   always the compute dtype (an FP8 checkpoint is dequantised, as before issue 14 part 2);
//   fp8_e4m3  E4M3 codes with one fp32 scale per 128x128 block, quantised at load, multiplied by FP8 GEMMs
//             with activations quantised per token and 128-column group on the fly.
// The CPU backend keeps fp32 weights and ignores it.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "zipage/core/error.hpp"

namespace zipage {

enum class weight_dtype : std::uint8_t { auto_, compute, fp8_e4m3 };

[[nodiscard]] constexpr const char* to_string(weight_dtype t) {
  return t == weight_dtype::fp8_e4m3 ? "fp8_e4m3" : t == weight_dtype::compute ? "compute" : "auto";
}

// The resolved choice for one model: FP8 when asked for, or for auto_ on an FP8 checkpoint.
[[nodiscard]] constexpr bool fp8_weights(weight_dtype t, bool fp8_checkpoint) {
  return t == weight_dtype::fp8_e4m3 || (t == weight_dtype::auto_ && fp8_checkpoint);
}

// --quantization's spellings (vLLM's flag).
inline constexpr std::array<std::string_view, 4> weight_quantization_names{"auto", "none", "fp8", "fp8_e4m3"};

// --quantization: "auto" (the checkpoint's own: FP8 for an FP8 checkpoint), "fp8" / "fp8_e4m3", or "none"
// (the compute dtype; an FP8 checkpoint is dequantised); anything else is an error naming the flag.
[[nodiscard]] inline weight_dtype parse_weight_quantization(std::string_view s) {
  if (s == "auto") return weight_dtype::auto_;
  if (s == "none") return weight_dtype::compute;
  if (s == "fp8" || s == "fp8_e4m3") return weight_dtype::fp8_e4m3;
  fail("--quantization: '", std::string(s), "' is not one of auto, none, fp8, fp8_e4m3");
}

}  // namespace zipage
