#pragma once
// One (token, KV head) of append_kv into an FP8 cache (head_dim 128), by one warp: lanes 0-15 quantise the K head,
// lanes 16-31 the V head, 8 values each (one 16-byte load, one 8-byte store). The reference kernel's arithmetic
// (reference_ops.cu: a NaN gives the NaN scale, else kv_scale_from_amax(amax) = bf16_rne(amax / 448) with IEEE
// division; codes e4m3_code(x, float(scale)), IEEE division and the SATFINITE conversion), so the same bytes.
// append_kv's tuned kernel runs it per warp; the swapped decode kernels run it for their own (sequence, KV head)
// before reading the cache (decode_params::append).
#include "zipage/backend/cuda/common.cuh"
#include "zipage/backend/cuda/fp8.cuh"

namespace zipage::cuda::detail {

// k_row / v_row: the token's head (128 bf16 each); the slot's codes at (slot * heads + h) * 128 of kc / vc and its
// bf16 scales at slot * heads + h of ks / vs. Every lane of the warp calls it.
__device__ __forceinline__ void append_head_fp8(std::uint8_t* kc, std::uint8_t* vc, std::uint16_t* ks,
                                                std::uint16_t* vs, const bf16* k_row, const bf16* v_row,
                                                std::int64_t slot, int heads, int h, int lane) {
  constexpr int D = 128;
  const bool is_v = lane >= 16;
  const int c = (lane & 15) * 8;
  float f[8];
  bf16x8_to_float(*reinterpret_cast<const uint4*>((is_v ? v_row : k_row) + c), f);
  float amax = 0.0f;
  bool nan = false;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float a = fabsf(f[e]);
    nan |= isnan(a);
    amax = fmaxf(amax, a);
  }
  const unsigned half_warp = 0xffffu << (lane & 16);
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  nan = (__ballot_sync(0xffffffffu, nan) & half_warp) != 0;
  const std::uint16_t sbits = nan ? kv_scale_nan : kv_scale_from_amax(amax);
  const float scale = kv_scale_to_f32(sbits);
  std::uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    lo |= std::uint32_t{e4m3_code(f[e], scale)} << (8 * e);
    hi |= std::uint32_t{e4m3_code(f[e + 4], scale)} << (8 * e);
  }
  const std::int64_t dst = (slot * heads + h) * D;
  *reinterpret_cast<uint2*>((is_v ? vc : kc) + dst + c) = make_uint2(lo, hi);
  if ((lane & 15) == 0) (is_v ? vs : ks)[slot * heads + h] = sbits;
}

}  // namespace zipage::cuda::detail
