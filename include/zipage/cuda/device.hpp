#pragma once
// Host-side questions about CUDA devices, answered by the compiled zipage::cuda library. This header
// includes no CUDA header, so CPU-only code can ask whether a GPU is there.
#include <string>

namespace zipage::cuda {

// Number of usable CUDA devices; 0 when there is no driver or no device (never throws).
int device_count();

// "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)", or why no device could be opened.
std::string describe_device(int device = 0);

// Whether the current device runs this build's sm_90a kernels (wgmma, setmaxnreg): the library was built for sm_90a
// (CMAKE_CUDA_ARCHITECTURES=90a) and the device is compute capability 9.0. Asked per launch by the kernels that need
// it: the answer is kept per device (devices past 63 are asked every time). Never throws.
bool current_device_runs_sm90a();

}  // namespace zipage::cuda
