#pragma once
// Host API of the FP8 linear layers' quantisation kernels (src/cuda/fp8_gemm.cu; docs/fp8.md "FP8 weights"),
// without any CUDA header. Both are bit-exact with the CPU reference (core/fp8_linear.hpp) on the same values:
// amax with fmaxf (NaN ignored), scale = __fdiv_rn(amax, 448), code = SATFINITE e4m3 of __fdiv_rn(x, scale),
// zero codes under a zero scale. The layouts are the ones cuBLASLt's block-scaled FP8 GEMM reads.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "zipage/backend/cuda/dtype.hpp"

namespace zipage::cuda::fp8 {

// Rows of the activation workspace: cuBLASLt's VEC128_32F scales are token-major, one column of `padded_rows`
// per 128-column group, so the token count is padded to a multiple of 4 (16-byte columns).
[[nodiscard]] constexpr int padded_rows(int rows) { return (rows + 3) & ~3; }
// Leading dimension of a weight's BLK128x128_32F scales: its 128-column blocks, padded to a multiple of 4.
[[nodiscard]] constexpr int weight_scale_ld(int cols) { return (((cols + 127) / 128) + 3) & ~3; }

// w [rows][cols] (bf16 or f32) -> codes [rows][cols] and scales [ceil(rows/128)][weight_scale_ld(cols)]
// (block (i, j) at i * ld + j; the padding columns are written 0). One CTA per 128x128 block.
void quantize_weight_blocks(cuda_dtype t, const void* w, int rows, int cols, std::uint8_t* codes, float* scales,
                            cuda_stream stream);

// x [rows][cols] (bf16 or f32) -> codes [padded][cols] and scales [ceil(cols/128)][padded], group g of token r at
// g * padded + r; the rows from `rows` to `padded` get zero codes and zero scales. One warp per (token, group).
void quantize_activations(cuda_dtype t, const void* x, int rows, int padded, int cols, std::uint8_t* codes,
                          float* scales, cuda_stream stream);

}  // namespace zipage::cuda::fp8

namespace zipage::cuda::fp8 {

// ---- The block-scaled FP8 GEMM of our own (src/cuda/fp8_gemm_sm90.cu, fp8_gemm_sm90.cuh): Hopper wgmma and TMA, tiles
// of 64 or 128 tokens x 128 outputs, for the decode batches at which cuBLASLt's 128-token tiles leave a round of
// tiles mostly idle. out [m][n] bf16 (row stride n) = dequantised x codes [m][k] . dequantised W codes [n][k]^T,
// with x's codes and scales in quantize_activations' layout (padded = padded_rows(m)) and W's in
// quantize_weight_blocks'.
struct gemm_sm90_args {
  const std::uint8_t* x_codes = nullptr;  // [padded_rows(m)][k]
  const float* x_scales = nullptr;        // [k/128][padded_rows(m)]
  const std::uint8_t* w_codes = nullptr;  // [n][k]
  const float* w_scales = nullptr;        // [n/128][weight_scale_ld(k)]
  void* out = nullptr;                    // [m][n] bf16
  int m = 0, n = 0, k = 0;
  // How CTAs share K (gemm_sm90_plan): 0 automatic, lowered to what `workspace` holds (no sharing without
  // counters); 1 none; > 1 that many equal splits per tile; gemm_sm90_stream_k stream-K. Sharing needs a workspace
  // of gemm_sm90_plan::workspace_bytes() and `counters`: gemm_sm90_max_split_tiles zero ints, which every launch
  // leaves zero.
  int splits = 0;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  int* counters = nullptr;
  // Tile height in tokens: 0 automatic (64 up to 128 tokens, else 128), 64 or 128.
  int tile_rows = 0;
  // Multiprocessors the plan fills: 0 all of the device's (fewer where another stream's kernels hold the rest).
  int sms = 0;
};

inline constexpr int gemm_sm90_max_split_tiles = 1024;
inline constexpr int gemm_sm90_stream_k = -1;  // gemm_sm90_args::splits
// A tile: 64 or 128 tokens x 128 outputs, K in 128-column groups (one scale each).
inline constexpr int gemm_sm90_tile_cols = 128, gemm_sm90_group = 128;
[[nodiscard]] constexpr bool is_gemm_sm90_tile_rows(int rows) { return rows == 64 || rows == 128; }
// Automatic: 64-token tiles with equal splits beat 128-token ones up to 128 tokens, and lose from 300 on
// (docs/benchmarks.md, 2026-12-04 04:50).
[[nodiscard]] constexpr int gemm_sm90_tile_rows_for(int requested, int m) {
  return requested ? requested : m <= 128 ? 64 : 128;
}
// CTAs of a tile height that share a multiprocessor (their shared memory and registers).
[[nodiscard]] constexpr int gemm_sm90_ctas_per_sm(int tile_rows) { return tile_rows == 64 ? 2 : 1; }

// How a launch's CTAs share the work: `ctas` CTAs (one per multiprocessor for 128-token tiles, two for 64).
// Tiles [0, dp_tiles) are whole, CTA c taking tiles c, c + ctas, ...; the k-groups of the other tiles, in tile
// order, are cut into `ctas` contiguous ranges (stream-K), so every CTA gets the same work to within a group.
// A tile whose groups fall to several CTAs ("shared") is summed from their fp32 partials, in CTA order, by the
// last of them to finish: deterministic. Tile t covers tokens [tile_rows (t % m_tiles), +tile_rows) and outputs
// [128 (t / m_tiles), +128), so CTAs that run together share weight tiles through L2.
struct gemm_sm90_plan {
  int tile_rows = 64, m_tiles = 0, tiles = 0, groups = 0, ctas = 0, dp_tiles = 0;

  [[nodiscard]] constexpr long long shared_groups() const { return static_cast<long long>(tiles - dp_tiles) * groups; }
  // CTA c's stream-K range begins at shared group begin(c) (ends at begin(c + 1)).
  [[nodiscard]] constexpr long long begin(int c) const { return shared_groups() * c / ctas; }
  // The CTA whose range holds shared group i.
  [[nodiscard]] constexpr int cta_of(long long i) const { return static_cast<int>(((i + 1) * ctas - 1) / shared_groups()); }
  // Each CTA writes at most two partials: of its range's first tile (slot 2c) and of its last (slot 2c + 1).
  [[nodiscard]] constexpr std::size_t workspace_bytes() const {
    return shared_groups() > 0 ? std::size_t{2} * static_cast<std::size_t>(ctas) * static_cast<std::size_t>(tile_rows) *
                                     gemm_sm90_tile_cols * sizeof(float)
                               : 0;
  }
  // Shared tile u (tile dp_tiles + u): its first and last CTA, and where CTA c in between put its partial.
  [[nodiscard]] constexpr int first_cta(int u) const { return cta_of(static_cast<long long>(u) * groups); }
  [[nodiscard]] constexpr int last_cta(int u) const { return cta_of(static_cast<long long>(u + 1) * groups - 1); }
  [[nodiscard]] constexpr int slot(int c, int u) const {
    return begin(c) < static_cast<long long>(u) * groups ? 2 * c + 1 : 2 * c;
  }

  // A piece of a CTA's work: groups [g0, g1) of tile `tile`, its partial in `slot` (-1: the whole tile, stored).
  struct piece {
    int tile = 0, g0 = 0, g1 = 0, slot = -1;
  };
  // Where CTA c is in its walk: `next` is its next whole tile, then `at` its next shared group.
  struct cursor {
    int next = 0;
    long long at = 0;
  };
  [[nodiscard]] constexpr cursor start(int c) const { return {c, begin(c)}; }
  // CTA c's next piece into p, in the order it runs them; false when it has none left. Host and device: the
  // kernel's producer and consumers walk the same pieces.
  constexpr bool next(int c, cursor& at, piece& p) const {
    if (at.next < dp_tiles) {
      p = {at.next, 0, groups, -1};
      at.next += ctas;
      return true;
    }
    if (shared_groups() == 0) return false;
    const long long e = begin(c + 1);
    if (at.at >= e) return false;
    const int u = static_cast<int>(at.at / groups), g0 = static_cast<int>(at.at % groups);
    const int g1 = static_cast<int>(std::min<long long>(groups, g0 + (e - at.at)));
    p = {dp_tiles + u, g0, g1, g0 == 0 && g1 == groups ? -1 : at.at == begin(c) ? 2 * c : 2 * c + 1};
    at.at += g1 - g0;
    return true;
  }
};

// The equal split count of 64-token tiles for `requested` (gemm_sm90_args::splits) on a device of `sms`
// multiprocessors: requested if > 0 (at most one per 128-column group), else about one CTA per multiprocessor
// (floor(sms / tiles)), at least 2 groups each; 1 from gemm_sm90_max_split_tiles tiles on.
[[nodiscard]] constexpr int gemm_sm90_splits(int requested, int tiles, int groups, int sms) {
  if (groups <= 1 || tiles <= 0 || tiles > gemm_sm90_max_split_tiles) return 1;
  if (requested > 0) return std::min(requested, groups);
  // In graphs over weights read from HBM, 4 splits of the 32 tiles of a 4096-wide output beat 8 (9.9 against 11.7 us
  // at 8 tokens) and 2 of 48 tiles beat 5 (docs/benchmarks.md, 2026-12-04).
  return std::clamp(sms / tiles, 1, groups / 2);
}

// The plan gemm_sm90 runs (gemm_sm90_args' m, n, k, splits, tile_rows; `sms` > 0). Automatic (splits 0) lowers
// itself to `workspace_bytes` (0: no sharing); an explicit split count or stream-K does not (the launcher checks).
//  - Equal splits (automatic: gemm_sm90_splits' count, none from sms tiles on): one tile or part of one per CTA.
//  - Stream-K (asked for only): persistent CTAs filling every multiprocessor (gemm_sm90_ctas_per_sm each). Where
//    the tiles are not a whole number of rounds, the last round and the one before it are shared, so that their
//    tiles end together (192 tiles on 132 multiprocessors as 1.45 rounds, not 2). Not automatic: it lost to
//    whole tiles in most of the shapes measured (docs/benchmarks.md, 2026-12-04 04:50).
[[nodiscard]] constexpr gemm_sm90_plan plan_gemm_sm90(int m, int n, int k, int splits, int tile_rows, int sms,
                                                      std::size_t workspace_bytes) {
  gemm_sm90_plan p;
  p.tile_rows = gemm_sm90_tile_rows_for(tile_rows, m);
  p.m_tiles = (padded_rows(m) + p.tile_rows - 1) / p.tile_rows;
  p.tiles = p.m_tiles * (n / gemm_sm90_tile_cols);
  p.groups = k / gemm_sm90_group;
  const auto whole_tiles = [&](int ctas) {
    p.ctas = std::max(1, std::min(ctas, p.tiles)), p.dp_tiles = p.tiles;
    return p;
  };
  if (p.tiles <= 0 || p.groups <= 0) return whole_tiles(1);
  if (splits != gemm_sm90_stream_k) {  // equal splits (or none): CTA c takes part c % s of tile c / s
    const auto partial_bytes = [&](int s) {  // of s equal splits of every tile
      return gemm_sm90_plan{p.tile_rows, p.m_tiles, p.tiles, p.groups, p.tiles * s, 0}.workspace_bytes();
    };
    int s = gemm_sm90_splits(splits, p.tiles, p.groups, sms);
    while (splits == 0 && s > 1 && partial_bytes(s) > workspace_bytes) --s;
    if (s <= 1) return whole_tiles(p.tiles);
    p.ctas = p.tiles * s, p.dp_tiles = 0;
    return p;
  }
  const int slots = sms * gemm_sm90_ctas_per_sm(p.tile_rows);
  const int rounds = p.tiles / slots, rest = p.tiles % slots;
  if (rest == 0 || p.groups < 2) return whole_tiles(slots);
  p.dp_tiles = rounds > 0 ? (rounds - 1) * slots : 0;
  // At least 2 groups per CTA where the shared tiles are fewer than the CTAs.
  p.ctas = static_cast<int>(std::min<long long>(slots, p.shared_groups() / 2));
  return p.ctas >= 2 && p.tiles - p.dp_tiles <= gemm_sm90_max_split_tiles ? p : whole_tiles(slots);
}

// Whether this build and device run it (an sm_90a build on a compute-capability 9.0 device whose driver
// encodes TMA tensor maps) — asked once per device.
[[nodiscard]] bool gemm_sm90_available();
// Whether it takes the shape: n and k multiples of 128, 16-byte aligned pointers (and gemm_sm90_available()).
[[nodiscard]] bool gemm_sm90_supported(const gemm_sm90_args& a);
// The plan gemm_sm90 runs for `a` on the current device (plan_gemm_sm90 with its multiprocessors).
[[nodiscard]] gemm_sm90_plan gemm_sm90_plan_for(const gemm_sm90_args& a);
// Throws (naming the field) where gemm_sm90_supported does not hold.
void gemm_sm90(const gemm_sm90_args& a, cuda_stream stream);

}  // namespace zipage::cuda::fp8
