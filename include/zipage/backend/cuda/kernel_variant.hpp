#pragma once
// Which kernel an op of the CUDA backend may run. Every op has one launcher (backend/cuda/ops.hpp,
// backend/cuda/attention.hpp) that takes the data type and a kernel_variant and picks the kernel itself;
// the rule for each op is written next to its declaration. No CUDA header here.
#include <cstdint>

namespace zipage::cuda {

enum class kernel_variant : std::uint8_t {
  // The op's tuned bf16 kernel (16-byte vectors, tensor cores for attention) when the data type, the
  // shape and the alignment allow it; otherwise, silently, the reference kernel. What the engine asks
  // for unless cuda_backend_options::fast_kernels is off.
  tuned,
  // Always the reference kernel: fp32 or bf16 data of any shape, written to mirror the zipage::cpu
  // reference operation by operation (double RoPE angles and RMSNorm sums, a softmax over the whole row,
  // fixed summation orders), so that the fp32 engine gives the CPU backend's tokens.
  reference,
};

[[nodiscard]] constexpr const char* to_string(kernel_variant v) {
  return v == kernel_variant::tuned ? "tuned" : "reference";
}

}  // namespace zipage::cuda
