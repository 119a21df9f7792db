#pragma once
// Element types and the stream handle of the CUDA backend, without any CUDA header: one place that the
// kernel launchers, the backend and the tests name them from.
#include <cstddef>
#include <cstdint>

struct CUstream_st;

namespace zipage {

// Element type of a CUDA tensor or KV cache. e4m3 is only an FP8 linear weight (E4M3 codes plus 128x128
// block scales, made by cuda_backend::prepare_linear_weight; docs/fp8.md "FP8 weights"): linear() takes it as
// its weight, every other op refuses it.
enum class cuda_dtype : std::uint8_t { f32, bf16, e4m3 };

[[nodiscard]] constexpr std::size_t dtype_bytes(cuda_dtype t) {
  return t == cuda_dtype::f32 ? 4 : t == cuda_dtype::bf16 ? 2 : 1;
}
[[nodiscard]] constexpr const char* to_string(cuda_dtype t) {
  return t == cuda_dtype::f32 ? "f32" : t == cuda_dtype::bf16 ? "bf16" : "e4m3";
}

namespace cuda {
// A `cudaStream_t` (nullptr = the legacy default stream).
using cuda_stream = CUstream_st*;
}  // namespace cuda

}  // namespace zipage
