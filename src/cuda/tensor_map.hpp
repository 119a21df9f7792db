#pragma once
// Private to src/cuda/: the driver's TMA descriptor encoder, which the launchers of TMA-fed kernels (the sm90 FP8
// GEMM, the TMA-fed swapped decode kernel) find at run time, so that nothing links against libcuda.
#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

namespace zipage::cuda::detail {

// cuTensorMapEncodeTiled from the driver; null when the driver does not have it.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      return PFN_cuTensorMapEncodeTiled_v12000{nullptr};
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

}  // namespace zipage::cuda::detail
