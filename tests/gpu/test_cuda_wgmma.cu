// The Hopper warpgroup-MMA building blocks of the wgmma prefill kernel (backend/cuda/wgmma.cuh,
// prefill_wgmma.cuh), one at a time, against fp32 products on the host: the 128-byte-swizzled tile layout
// (sw128_offset) with K-major descriptors (S = Q K^T from shared memory), the N-major descriptor of V with P from
// registers (O = P V), and the accumulator layout the kernel's softmax and epilogue read. When the whole prefill
// kernel disagrees with the reference (test_cuda_kernels), these say which piece is wrong. The last case checks
// the synchronisation of the warp-specialised kernel: stages handed over by mbarriers (cp.async
// arrivals, consumer-warp releases) and the two consumers' alternating turns on named barriers; a hang there
// (the runner's timeout) points at that protocol.
// Skipped (exit 77, reported) without a device that runs wgmma (an sm_90a build on compute capability 9.0).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_buffers.hpp"
#include "zipage/backend/cuda/attention.hpp"
#include "zipage/backend/cuda/prefill_wgmma.cuh"
#include "zipage/cuda/device.hpp"

namespace {

namespace zd = zipage::cuda::detail;
namespace wsp = zipage::cuda::ws_protocol;
template <class T>
using dbuf = zipage::testing::device_buffer<T>;

// [ROWS][128] bf16 row-major (global) -> the swizzled shared tile (sw128_offset<ROWS>), by one warpgroup.
template <int ROWS>
__device__ void load_tile(unsigned char* smem, const std::uint16_t* src) {
  for (int c = threadIdx.x; c < ROWS * 16; c += 128) {
    const int r = c / 16, ch = c % 16;
    *reinterpret_cast<uint4*>(smem + zd::sw128_offset<ROWS>(r, ch)) =
        *reinterpret_cast<const uint4*>(src + r * 128 + ch * 8);
  }
}

// The accumulators' layout as the kernel reads it: d[j][e] is row 16 * warp + lane / 4 + 8 * (e / 2), column
// 8j + 2 * (lane % 4) + e % 2.
template <int NT>
__device__ void store_accumulators(const float (&d)[NT][4], float* out, int ld) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int j = 0; j < NT; ++j)
    for (int e = 0; e < 4; ++e)
      out[(16 * warp + lane / 4 + 8 * (e / 2)) * ld + 8 * j + 2 * (lane % 4) + (e & 1)] = d[j][e];
}

// The warp-specialised kernel's protocol (ws_protocol.hpp's rules, as the kernel calls them) on plain data: warpgroup 0 copies `tiles` tiles of 1,024 ints through
// kStages shared stages (cp.async, mbar_arrive_on_cp_async on `full`); warpgroups 1 and 2 each wait for every
// tile, sum it (sums[tile][consumer]) and take one turn per tile and a last one on named barriers 1 and 2, logging
// each as consumer + 2 * turn (turns[]); a tile's stage is released (`empty`, one arrival per warp) after the
// next tile's turn, as the kernel's P.V of a step reads it then, and the last after the last turn.
__global__ void handover_kernel(const int* src, int tiles, long long* sums, int* turns) {
#if ZIPAGE_WGMMA_DEVICE
  constexpr int kStages = 3, kInts = 1024;
  __shared__ __align__(16) int stage_data[kStages][kInts];
  __shared__ __align__(8) unsigned long long bars[2 * kStages];
  __shared__ int next_turn;
  __shared__ long long partial[2][4];
  const std::uint32_t full = zd::smem_addr(&bars[0]), empty = zd::smem_addr(&bars[kStages]);
  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0), lane = tid & 31;
  if (tid < kStages) {
    zd::wgmma::mbar_init(full + tid * 8, 128);
    zd::wgmma::mbar_init(empty + tid * 8, 8);
  }
  if (tid == 0) next_turn = 0;
  __syncthreads();
  if (wg == 0) {
    for (int it = 0; it < tiles; ++it) {
      const int st = wsp::stage_of(it, kStages);
      if (wsp::producer_waits(it, kStages)) zd::wgmma::mbar_wait(empty + st * 8, wsp::empty_parity(it, kStages));
      for (int c = tid; c < kInts / 4; c += 128)
        zd::cp_async_16(zd::smem_addr(&stage_data[st][4 * c]), src + std::size_t(it) * kInts + 4 * c, true);
      zd::wgmma::mbar_arrive_on_cp_async(full + st * 8);
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }
  const int cw = wg - 1, ctid = tid - 128 * wg, warp = ctid >> 5;
  const int my_turn = 1 + cw, other_turn = 1 + (cw ^ 1);
  const int nturns = wsp::turns(tiles);  // one per tile and a last one
  auto take_turn = [&](int turn) {
    zd::wgmma::named_sync(my_turn, 256);
    if (ctid == 0) turns[atomicAdd(&next_turn, 1)] = cw + 2 * turn;
    __threadfence_block();
    if (wsp::hands_over(cw, turn, nturns)) zd::wgmma::named_arrive(other_turn, 256);
  };
  auto release = [&](int it) {
    __syncwarp();
    if (it >= 0 && lane == 0) zd::wgmma::mbar_arrive(empty + wsp::stage_of(it, kStages) * 8);
  };
  if (wsp::opens_turns(cw, nturns)) zd::wgmma::named_arrive(other_turn, 256);
  for (int it = 0; it < tiles; ++it) {
    const int st = wsp::stage_of(it, kStages);
    zd::wgmma::mbar_wait(full + st * 8, wsp::full_parity(it, kStages));
    long long sum = 0;
    for (int c = ctid; c < kInts; c += 128) sum += stage_data[st][c];
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) partial[cw][warp] = sum;
    take_turn(it);
    release(wsp::released_after_step(it));
    zd::wgmma::named_sync(3 + cw, 128);  // this warpgroup's partial sums are written
    if (ctid == 0) sums[2 * it + cw] = partial[cw][0] + partial[cw][1] + partial[cw][2] + partial[cw][3];
    zd::wgmma::named_sync(3 + cw, 128);  // ... and read before the next tile overwrites them
  }
  if (tiles > 0) {
    take_turn(tiles);
    release(tiles - 1);
  }
#endif
}

// s[64][128] = q[64][128] . k[128][128]^T (the kernel's issue_qk: 8 k-steps of m64n128k16, operands from shared
// memory, K-major).
__global__ void qk_kernel(const std::uint16_t* q, const std::uint16_t* k, float* s) {
#if ZIPAGE_WGMMA_DEVICE
  extern __shared__ unsigned char raw[];
  unsigned char* base = raw + ((1024 - (zd::smem_addr(raw) & 1023)) & 1023);
  unsigned char* sq = base;
  unsigned char* sk = base + 64 * 256;
  load_tile<64>(sq, q);
  load_tile<128>(sk, k);
  zd::wgmma::fence_proxy_async();
  __syncthreads();
  const std::uint32_t aq = zd::smem_addr(sq), ak = zd::smem_addr(sk);
  float d[16][4] = {};
  zd::wgmma::fence();
  zd::wgmma_prefill::issue_qk(d, aq, ak);  // the kernel's 8 k-steps
  zd::wgmma::commit();
  zd::wgmma::wait<0>();
  zd::wgmma::fence_operands(d);
  store_accumulators(d, s, 128);
#endif
}

// o[64][128] = p[64][128] . v[128][128] (8 k-steps, P from registers in the m16n8k16 A layout, V N-major).
// lbo / sbo: the V descriptor's strides (the kernel's issue_pv: 128 * 128 and 1024).
__global__ void pv_kernel(const float* p, const std::uint16_t* v, float* o, std::uint32_t lbo, std::uint32_t sbo) {
#if ZIPAGE_WGMMA_DEVICE
  extern __shared__ unsigned char raw[];
  unsigned char* sv = raw + ((1024 - (zd::smem_addr(raw) & 1023)) & 1023);
  load_tile<128>(sv, v);
  zd::wgmma::fence_proxy_async();
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // P as S accumulators (the kernel's s[j][e] layout), re-packed the kernel's way.
  float s[16][4];
  for (int j = 0; j < 16; ++j)
    for (int e = 0; e < 4; ++e) s[j][e] = p[(16 * warp + g + 8 * (e / 2)) * 128 + 8 * j + 2 * t + (e & 1)];
  float d[16][4] = {};
  std::uint32_t pa[8][4];
  zd::wgmma_prefill::pack_p(s, pa);  // before the fence: the MMAs read these registers
  const std::uint32_t av = zd::smem_addr(sv);
  zd::wgmma::fence();
  for (int kk = 0; kk < 8; ++kk)
    zd::wgmma::mma_m64n128k16_rs(d, pa[kk], zd::wgmma::desc_sw128(av + kk * 16 * 128, lbo, sbo));
  zd::wgmma::commit();
  zd::wgmma::wait<0>();
  zd::wgmma::fence_operands(d);
  store_accumulators(d, o, 128);
#endif
}

std::uint16_t to_bf16(float x) {  // round to nearest even (finite inputs)
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
float from_bf16(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t{b} << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// n bf16 values uniform in [-1, 1) and their exact floats.
void random_bf16(std::size_t n, unsigned seed, std::vector<std::uint16_t>& bits, std::vector<float>& values) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  bits.resize(n);
  values.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    bits[i] = to_bf16(u(rng));
    values[i] = from_bf16(bits[i]);
  }
}

// Largest |got - want| over the elements, relative to the largest |want|.
double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    err = std::max(err, std::fabs(double(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(double(want[i])));
  }
  return err / scale;
}

constexpr int kSmem = 1024 + (64 + 128) * 256;  // the alignment pad, Q [64][128] and K [128][128] bf16

// sw128_offset against the 128-byte swizzle as the PTX ISA states it for a 1024-byte-aligned block of 128-byte rows
// (CUTLASS's Swizzle<3, 4, 3>): byte address bits [4:6] XOR bits [7:9]. Each column block of 64 bf16 is one such
// block of ROWS rows; the tile is a bijection onto its ROWS * 256 bytes.
template <int ROWS>
constexpr bool sw128_matches_ptx_swizzle() {
  bool seen[ROWS * 16] = {};
  for (int row = 0; row < ROWS; ++row)
    for (int chunk = 0; chunk < 16; ++chunk) {
      const std::uint32_t linear = row * 128 + (chunk & 7) * 16;
      const std::uint32_t swizzled = linear ^ (((linear >> 7) & 7u) << 4);
      const std::uint32_t off = zd::sw128_offset<ROWS>(row, chunk);
      if (off != (chunk >> 3) * ROWS * 128 + swizzled || off % 16 != 0 || off >= ROWS * 256u || seen[off / 16]) return false;
      seen[off / 16] = true;
    }
  return true;
}
static_assert(sw128_matches_ptx_swizzle<64>() && sw128_matches_ptx_swizzle<128>());

TEST_CASE("wgmma m64n128k16: S = Q K^T from 128-byte-swizzled K-major tiles") {
  std::vector<std::uint16_t> qb, kb;
  std::vector<float> qf, kf;
  random_bf16(64 * 128, 1, qb, qf);
  random_bf16(128 * 128, 2, kb, kf);
  std::vector<float> want(64 * 128, 0.0f);
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 128; ++j) {
      double acc = 0.0;
      for (int c = 0; c < 128; ++c) acc += double(qf[i * 128 + c]) * kf[j * 128 + c];
      want[i * 128 + j] = static_cast<float>(acc);
    }
  dbuf<std::uint16_t> dq(qb), dk(kb);
  dbuf<float> ds(std::size_t{64 * 128});
  ds.poison();
  ZIPAGE_CUDA_CHECK(cudaFuncSetAttribute(qk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  qk_kernel<<<1, 128, kSmem>>>(dq.p, dk.p, ds.p);
  ZIPAGE_CUDA_CHECK(cudaDeviceSynchronize());
  const double err = rel_error(ds.get(), want);
  INFO("max |S - S_ref| / max |S_ref| = " << err);
  CHECK(err < 1e-5);  // fp32 accumulation of exact bf16 products
}

TEST_CASE("wgmma m64n128k16: O = P V with P from registers and V N-major") {
  std::vector<std::uint16_t> pb, vb;
  std::vector<float> pf, vf;
  random_bf16(64 * 128, 3, pb, pf);  // bf16 values, so the kernel's re-packing is exact
  random_bf16(128 * 128, 4, vb, vf);
  std::vector<float> want(64 * 128, 0.0f);
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 128; ++j) {
      double acc = 0.0;
      for (int t = 0; t < 128; ++t) acc += double(pf[i * 128 + t]) * vf[t * 128 + j];
      want[i * 128 + j] = static_cast<float>(acc);
    }
  dbuf<float> dp(pf);
  dbuf<std::uint16_t> dv(vb);
  dbuf<float> dout(std::size_t{64 * 128});
  dout.poison();
  ZIPAGE_CUDA_CHECK(cudaFuncSetAttribute(pv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  pv_kernel<<<1, 128, kSmem>>>(dp.p, dv.p, dout.p, 128 * 128, 1024);
  ZIPAGE_CUDA_CHECK(cudaDeviceSynchronize());
  const double err = rel_error(dout.get(), want);
  INFO("max |O - O_ref| / max |O_ref| = " << err);
  CHECK(err < 1e-5);
  if (err >= 1e-5) {
    // Which stride convention the hardware wants, should the kernel's be wrong: LBO and SBO swapped.
    dout.poison();
    pv_kernel<<<1, 128, kSmem>>>(dp.p, dv.p, dout.p, 1024, 128 * 128);
    ZIPAGE_CUDA_CHECK(cudaDeviceSynchronize());
    MESSAGE("with LBO 1024 and SBO 16384 instead: error " << rel_error(dout.get(), want));
  }
}

TEST_CASE("warp specialisation: mbarrier stage hand-over and the consumers' alternating turns") {
  for (const int tiles : {1, 2, 3, 7, 40}) {
    CAPTURE(tiles);
    std::vector<int> src(std::size_t(tiles) * 1024);
    std::mt19937 rng(static_cast<unsigned>(tiles));
    for (auto& x : src) x = static_cast<int>(rng() % 2001) - 1000;
    dbuf<int> dsrc(src), dturns(std::size_t(2 * (tiles + 1)));
    dbuf<long long> dsums(std::size_t(2 * tiles));
    dturns.poison();
    dsums.poison();
    handover_kernel<<<1, 384>>>(dsrc.p, tiles, dsums.p, dturns.p);
    ZIPAGE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<long long> sums = dsums.get();
    const std::vector<int> turns = dturns.get();
    int wrong_sums = 0, wrong_turns = 0;
    for (int it = 0; it < tiles; ++it) {
      long long want = 0;
      for (int c = 0; c < 1024; ++c) want += src[std::size_t(it) * 1024 + c];
      wrong_sums += (sums[2 * it] != want) + (sums[2 * it + 1] != want);
    }
    // Turn order: c0, c1 per turn, tiles + 1 turns.
    for (int k = 0; k < 2 * (tiles + 1); ++k) wrong_turns += turns[std::size_t(k)] != k;
    CHECK(wrong_sums == 0);
    CHECK(wrong_turns == 0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (zipage::cuda::device_count() == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", zipage::cuda::describe_device().c_str());
    return 77;
  }
  if (!zipage::cuda::wgmma_prefill_available()) {
    std::printf("SKIPPED: wgmma needs an sm_90a build and a compute-capability-9.0 device (%s)\n",
                zipage::cuda::describe_device(0).c_str());
    return 77;
  }
  std::printf("device 0: %s\n", zipage::cuda::describe_device(0).c_str());
  doctest::Context context(argc, argv);
  return context.run();
}
