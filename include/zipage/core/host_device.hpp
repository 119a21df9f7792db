#pragma once
// ZIPAGE_HOST_DEVICE marks a function that a CUDA kernel calls as well as host code (kv_scale.hpp's scale
// encoding, sampling_params.hpp's sampling_uniform): __host__ __device__ in a CUDA translation unit, nothing
// otherwise, so that the headers using it need no CUDA header.
#ifndef ZIPAGE_HOST_DEVICE
#if defined(__CUDACC__)
#define ZIPAGE_HOST_DEVICE __host__ __device__
#else
#define ZIPAGE_HOST_DEVICE
#endif
#endif
