#pragma once
// fp8_copy: where an op writes the FP8 copy of its bf16 output that the FP8 linear reading that output next would
// otherwise make itself (cuda_backend_options::fuse_fp8_quantize). Host-side, no CUDA header: the kernels that
// write it are add_rms_norm and silu_mul (ops.hpp) and the decode attention kernel (attention.hpp); their device
// helpers are in fp8_copy.cuh.
#include <cstdint>

namespace zipage::cuda {

// An FP8 copy of a bf16 op's output [rows][cols], byte for byte what fp8::quantize_activations writes from that
// output: codes [padded][cols], scales [cols / 128][padded] (one per token and 128-column group), the padding rows'
// codes and scales zero. add_rms_norm, silu_mul and decode attention write it beside their output when asked, so
// that the FP8 linear reading the output next need not launch a quantisation of its own.
struct fp8_copy {
  std::uint8_t* codes = nullptr;  // 8-byte aligned
  float* scales = nullptr;
  int padded = 0;  // rows rounded up by fp8::padded_rows
  // constexpr: the kernels ask it too.
  [[nodiscard]] constexpr bool wanted() const { return codes != nullptr; }
};

}  // namespace zipage::cuda
