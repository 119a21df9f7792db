#pragma once
// Private to src/cuda/backend/: linear() with an FP8 weight (fp8_linear.cu), called by gemm.cu.
#include "context.cuh"

namespace zipage::cuda_detail {

// out [x.rows][w.rows] (bf16) = x (bf16, quantised per token and 128-column group into c.fp8_ws) times the
// e4m3 weight w, by cuBLASLt's block-scaled FP8 GEMM.
void fp8_linear(const std::shared_ptr<context>& ctx, const cuda_tensor& x, const cuda_tensor& w, cuda_tensor& out);

}  // namespace zipage::cuda_detail
