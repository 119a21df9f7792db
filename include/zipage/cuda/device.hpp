#pragma once
// Host-side questions about CUDA devices, answered by the compiled zipage::cuda library. This header
// includes no CUDA header, so CPU-only code can ask whether a GPU is there.
#include <string>

namespace zipage::cuda {

// Number of usable CUDA devices; 0 when there is no driver or no device (never throws).
int device_count();

// "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)", or why no device could be opened.
std::string describe_device(int device = 0);

}  // namespace zipage::cuda
