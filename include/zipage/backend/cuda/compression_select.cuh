#pragma once
// Compression kernels, stages 6-7: top-keep selection and in-place compaction.
// Arguments, segments and shared helpers: compression.cuh (with the overview of every stage).
#include "zipage/backend/cuda/compression.cuh"

namespace zipage::cuda::detail {

// ---------------------------------------------------------------------------------------------------
// Stage 6: top-keep selection.

// Order-preserving map of a float to an unsigned key (larger float -> larger key); NaN -> -inf, -0 -> +0.
__device__ __forceinline__ unsigned ordered_key(float f) {
  if (f != f) f = -INFINITY;
  if (f == 0.0f) f = 0.0f;
  const unsigned u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(kSelThreads) select_kernel(const compress_args a) {
  using scan_u32 = cub::BlockScan<unsigned, kSelThreads>;
  using scan_u64 = cub::BlockScan<unsigned long long, kSelThreads>;
  __shared__ union {
    typename scan_u32::TempStorage u32;
    typename scan_u64::TempStorage u64;
  } temp;
  __shared__ unsigned hist[256];
  __shared__ unsigned s_digit, s_remaining;
  extern __shared__ __align__(128) unsigned char smem[];

  const int sh = blockIdx.x;
  const segment sg = decompose(a, sh);
  const int len = a.kv_len[sg.req];
  if (len <= 0) return;
  const int k = min(a.keep, len);
  const int tid = threadIdx.x, lane = tid & 31;
  std::int32_t* kept = a.kept + static_cast<std::int64_t>(sh) * a.keep;
  if (k == len) {
    for (int j = tid; j < len; j += kSelThreads) kept[j] = j;
    return;
  }
  // Keys in shared memory when they fit, else recomputed from F at every pass (F is left intact).
  const float* f = a.fscore + static_cast<std::int64_t>(sh) * a.max_len;
  unsigned* keys = reinterpret_cast<unsigned*>(smem);
  const bool in_smem = a.select_smem;
  auto key_at = [&](int j) { return in_smem ? keys[j] : ordered_key(f[j]); };
  if (in_smem) {
    for (int j = tid; j < len; j += kSelThreads) keys[j] = ordered_key(f[j]);
    __syncthreads();
  }

  // Radix select of the k-th largest key, 8 bits at a time from the top.
  unsigned prefix = 0, mask = 0, remaining = static_cast<unsigned>(k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    hist[tid] = 0;  // kSelThreads == 256 bins
    __syncthreads();
    for (int j0 = 0; j0 < len; j0 += kSelThreads) {
      const int j = j0 + tid;
      unsigned digit = 256;  // no bin
      if (j < len) {
        const unsigned key = key_at(j);
        if ((key & mask) == prefix) digit = (key >> shift) & 255u;
      }
      const unsigned peers = __match_any_sync(0xffffffffu, digit);
      if (digit < 256 && lane == __ffs(peers) - 1) atomicAdd(&hist[digit], static_cast<unsigned>(__popc(peers)));
    }
    __syncthreads();
    const unsigned h = hist[255 - tid];
    unsigned cum;  // keys (matching the prefix) with digit >= 255 - tid
    scan_u32(temp.u32).InclusiveSum(h, cum);
    if (cum >= remaining && cum - h < remaining) {
      s_digit = 255u - static_cast<unsigned>(tid);
      s_remaining = remaining - (cum - h);
    }
    __syncthreads();
    prefix |= s_digit << shift;
    mask |= 255u << shift;
    remaining = s_remaining;
    __syncthreads();
  }
  const unsigned thr = prefix;          // the k-th largest key
  const unsigned need_eq = remaining;   // how many keys equal to it are kept (the oldest ones)

  // Ordered pass: kept position of token j = (# greater before j) + min(# equal before j, need_eq).
  unsigned long long carry = 0;
  constexpr int kTile = kSelThreads * kSelItems;
  for (int base = 0; base < len; base += kTile) {
    unsigned kk[kSelItems];
    unsigned long long cnt = 0;
#pragma unroll
    for (int i = 0; i < kSelItems; ++i) {
      const int j = base + tid * kSelItems + i;
      kk[i] = j < len ? key_at(j) : 0u;
      if (j < len) cnt += kk[i] > thr ? (1ull << 32) : (kk[i] == thr ? 1ull : 0ull);
    }
    unsigned long long run, total;
    scan_u64(temp.u64).ExclusiveSum(cnt, run, total);
    run += carry;
#pragma unroll
    for (int i = 0; i < kSelItems; ++i) {
      const int j = base + tid * kSelItems + i;
      if (j >= len) break;
      const unsigned gt_before = static_cast<unsigned>(run >> 32), eq_before = static_cast<unsigned>(run);
      if (kk[i] > thr) {
        kept[gt_before + min(eq_before, need_eq)] = j;
        run += 1ull << 32;
      } else if (kk[i] == thr) {
        if (eq_before < need_eq) kept[gt_before + eq_before] = j;
        run += 1ull;
      }
    }
    carry += total;
    __syncthreads();  // temp storage reuse
  }
}

// ---------------------------------------------------------------------------------------------------
// Stage 7: in-place compaction.

// One segment (layer, request, KV head) per CTA: kept token i moves from slot kept[i] to slot i, front to back in
// tiles of kCompactTileBytes of K (bf16, head_dim 128: 64 tokens; FP8: 128), so that either cache has the same bytes in
// flight between two barriers. Its K and V rows move in 16-byte chunks (bf16: D / 8 per token; FP8 codes:
// D / 16), and with them its score-cache entry and, in an FP8 cache, its K and V scales, bit for bit.
template <int D, bool kFp8>
__global__ void __launch_bounds__(kCompactThreads) compact_kernel(const compress_args a) {
  constexpr int kElementBytes = kFp8 ? 1 : 2;
  constexpr int kChunks = D * kElementBytes / 16;
  constexpr int kCompactTile = kCompactTileBytes / (D * kElementBytes);  // tokens per tile
  constexpr int kPer = (kCompactTile * kChunks + kCompactThreads - 1) / kCompactThreads;  // chunks per thread per side
  static_assert(kCompactTile <= kCompactThreads);
  const int sh = blockIdx.x;
  const segment sg = decompose(a, sh);
  const int len = a.kv_len[sg.req];
  const int k = min(a.keep, len);
  if (k >= len) return;  // nothing evicted
  const std::int32_t* kept = a.kept + static_cast<std::int64_t>(sh) * a.keep;
  const std::int32_t* pages = a.page_indices + a.page_indptr[sg.req];
  const std::int64_t token_bytes = std::int64_t{a.num_kv_heads} * D * kElementBytes;
  const std::int64_t head_off = (sg.layer * a.kv_layer_stride + sg.head * D) * kElementBytes;
  char* kb = (kFp8 ? reinterpret_cast<char*>(a.k8) : reinterpret_cast<char*>(a.k)) + head_off;
  char* vb = (kFp8 ? reinterpret_cast<char*>(a.v8) : reinterpret_cast<char*>(a.v)) + head_off;
  const std::int64_t sl = sg.layer * a.score_layer_stride + sg.head;
  float* sb = a.scores == nullptr ? nullptr : a.scores + sl;
  const int tid = threadIdx.x;

  for (int t0 = 0; t0 < k; t0 += kCompactTile) {
    const int t1 = min(k, t0 + kCompactTile);
    if (kept[t1 - 1] == t1 - 1) continue;  // ascending and kept[i] >= i: the whole tile stays in place
    uint4 kr[kPer], vr[kPer];
    std::int64_t dst_off[kPer];
    bool move[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int item = tid + i * kCompactThreads;
      const int dst = t0 + item / kChunks, ch = item % kChunks;
      move[i] = false;
      if (item < kCompactTile * kChunks && dst < t1) {
        const int src = kept[dst];
        if (src != dst) {
          move[i] = true;
          const std::int64_t so = token_slot(pages, a.bs_shift, src) * token_bytes + ch * 16;
          dst_off[i] = token_slot(pages, a.bs_shift, dst) * token_bytes + ch * 16;
          kr[i] = *reinterpret_cast<const uint4*>(kb + so);
          vr[i] = *reinterpret_cast<const uint4*>(vb + so);
        }
      }
    }
    // The token's per-(slot, head) entries: score-cache entry (fp32), FP8 scales (bf16).
    float sv = 0.0f;
    std::uint16_t ks = 0, vs = 0;
    std::int64_t s_dst = -1;
    if ((kFp8 || sb != nullptr) && tid < kCompactTile) {
      const int dst = t0 + tid;
      if (dst < t1) {
        const int src = kept[dst];
        if (src != dst) {
          const std::int64_t from = token_slot(pages, a.bs_shift, src) * a.num_kv_heads;
          s_dst = token_slot(pages, a.bs_shift, dst) * a.num_kv_heads;
          if constexpr (kFp8) {
            ks = a.k_scale[sl + from];
            vs = a.v_scale[sl + from];
          }
          if (sb != nullptr) sv = sb[from];
        }
      }
    }
    __syncthreads();  // every source of the tile is read before any slot of it is written
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (move[i]) {
        *reinterpret_cast<uint4*>(kb + dst_off[i]) = kr[i];
        *reinterpret_cast<uint4*>(vb + dst_off[i]) = vr[i];
      }
    if (s_dst >= 0) {
      if constexpr (kFp8) {
        a.k_scale[sl + s_dst] = ks;
        a.v_scale[sl + s_dst] = vs;
      }
      if (sb != nullptr) sb[s_dst] = sv;
    }
    __syncthreads();
  }
}

}  // namespace zipage::cuda::detail
