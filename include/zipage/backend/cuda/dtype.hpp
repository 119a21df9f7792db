#pragma once
// Element types and the stream handle of the CUDA backend, without any CUDA header: one place that the
// kernel launchers, the backend and the tests name them from.
#include <cstddef>
#include <cstdint>

struct CUstream_st;

namespace zipage {

// Element type of a CUDA tensor or KV cache.
enum class cuda_dtype : std::uint8_t { f32, bf16 };

[[nodiscard]] constexpr std::size_t dtype_bytes(cuda_dtype t) { return t == cuda_dtype::f32 ? 4 : 2; }
[[nodiscard]] constexpr const char* to_string(cuda_dtype t) { return t == cuda_dtype::f32 ? "f32" : "bf16"; }

namespace cuda {
// A `cudaStream_t` (nullptr = the legacy default stream).
using cuda_stream = CUstream_st*;
}  // namespace cuda

}  // namespace zipage
