#pragma once
// Private to src/cuda/backend/: linear() with an FP8 weight (fp8_linear.cu), called by gemm.cu.
#include <initializer_list>
#include <optional>

#include "context.cuh"
#include "zipage/backend/cuda/ops.hpp"  // fp8_copy

namespace zipage::cuda_detail {

// out [x.rows][w.rows] (bf16) = x (bf16, quantised per token and 128-column group into c.fp8_ws) times the
// e4m3 weight w, by cuBLASLt's block-scaled FP8 GEMM or fp8::gemm_sm90 (resolve_fp8_gemm_kernel).
// `kernel`: which GEMM (cuda_backend_options::fp8_gemm_kernel unless given: the self-test asks for cuBLASLt's).
void fp8_linear(const std::shared_ptr<context>& ctx, const cuda_tensor& x, const cuda_tensor& w, cuda_tensor& out,
                std::optional<cuda::fp8_gemm_kernel> kernel = std::nullopt);

// The FP8 copy an op should write beside its bf16 output `out` (cuda_backend_options::fuse_fp8_quantize): room in
// the activation workspace where fp8_linear looks for out's codes, or none (option off, no e4m3 weight loaded, a
// shape, variant or alignment the fused kernels do not take: `in_row_stride` and `pointers` as fp8_copy_supported).
// Call before the op's skip_launch; after it, fp8_copy_written records that the workspace holds out's codes.
cuda::fp8_copy fp8_copy_for(context& c, const cuda_tensor& out, cuda::kernel_variant v, std::int64_t in_row_stride,
                            std::initializer_list<const void*> pointers);
void fp8_copy_written(context& c, const cuda_tensor& out, const cuda::fp8_copy& copy);

}  // namespace zipage::cuda_detail
