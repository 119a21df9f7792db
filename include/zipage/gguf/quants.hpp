#pragma once
// The block-quantised tensor types of llama.cpp's GGUF files, dequantised to fp32 at load.
//
// A quantised row is a sequence of blocks; each block stores `elements` weights in `bytes` bytes: one or two
// fp16 scales and the weights' small integer codes. zipage reads them once, when a model loads, into the
// weights its backends run (fp32 on the CPU, bf16 or FP8 on the GPU), so a Q4_K_M file is an 8B model on
// disk and an fp32/bf16 one in memory: quantisation here saves download and disk, not GPU memory.
//
// Every value is computed the way ggml's own dequantisation computes it (the same products in the same
// order, in fp32), so the weights equal llama.cpp's; tests/unit/test_gguf_quants.cpp checks each type
// against blocks that ggml itself quantised and dequantised (made by tests/gguf_oracle/run.sh; docs/gguf.md).
//
// Layouts (little-endian; "fp16" is an IEEE half; a row's length must be a multiple of `elements`):
//   Q4_0    32 weights, 18 B: fp16 d, 16 B of 4-bit codes q     w = (q - 8)·d
//   Q4_1    32 weights, 20 B: fp16 d, fp16 m, 16 B of codes     w = q·d + m
//   Q5_0    32 weights, 22 B: fp16 d, 4 B of fifth bits, 16 B   w = (q - 16)·d
//   Q5_1    32 weights, 24 B: fp16 d, fp16 m, 4 B, 16 B         w = q·d + m
//   Q8_0    32 weights, 34 B: fp16 d, 32 int8 codes             w = q·d
//   IQ4_NL  32 weights, 18 B: fp16 d, 16 B of 4-bit indices     w = d·table[q]
//   Q2_K   256 weights, 84 B: 16 sub-blocks of 16, 4-bit scale and min each, 2-bit codes, fp16 d, dmin
//   Q3_K   256 weights, 110 B: 16 sub-blocks of 16, 6-bit signed scales, 3-bit codes (2 + a high-bit mask), fp16 d
//   Q4_K   256 weights, 144 B: fp16 d, dmin, 8 sub-blocks of 32 with 6-bit scale and min, 4-bit codes
//   Q5_K   256 weights, 176 B: as Q4_K plus a fifth bit per code
//   Q6_K   256 weights, 210 B: 16 sub-blocks of 16 with int8 scales, 6-bit codes (4 + 2), fp16 d
//   IQ4_XS 256 weights, 136 B: fp16 d, 8 sub-blocks of 32 with 6-bit scales, 4-bit indices into IQ4_NL's table
// Types not listed (the IQ1-IQ3 families with their lattice codebooks, TQ*, MXFP4, the repacked _4_4 forms)
// are rejected when the file opens, naming the type.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>

#include "zipage/core/half.hpp"

namespace zipage::gguf {

// ggml type ids (the numbering of ggml.h's enum ggml_type).
enum class tensor_type : std::uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  iq4_nl = 20,
  iq4_xs = 23,
  bf16 = 30,
};

// How a type stores its values: `elements` values in `bytes` bytes (1 value for the float types).
struct block_format {
  std::int64_t elements;
  std::size_t bytes;
};

// The format of a type zipage loads; nullopt for every other ggml type id.
inline std::optional<block_format> format_of(std::uint32_t raw) noexcept {
  switch (static_cast<tensor_type>(raw)) {
    case tensor_type::f32: return block_format{1, 4};
    case tensor_type::f16: return block_format{1, 2};
    case tensor_type::bf16: return block_format{1, 2};
    case tensor_type::q4_0: return block_format{32, 18};
    case tensor_type::q4_1: return block_format{32, 20};
    case tensor_type::q5_0: return block_format{32, 22};
    case tensor_type::q5_1: return block_format{32, 24};
    case tensor_type::q8_0: return block_format{32, 34};
    case tensor_type::iq4_nl: return block_format{32, 18};
    case tensor_type::q2_k: return block_format{256, 84};
    case tensor_type::q3_k: return block_format{256, 110};
    case tensor_type::q4_k: return block_format{256, 144};
    case tensor_type::q5_k: return block_format{256, 176};
    case tensor_type::q6_k: return block_format{256, 210};
    case tensor_type::iq4_xs: return block_format{256, 136};
  }
  return std::nullopt;
}
inline block_format format_of(tensor_type t) noexcept { return *format_of(static_cast<std::uint32_t>(t)); }

inline bool is_quantized(tensor_type t) noexcept { return format_of(t).elements > 1; }

namespace quants {

inline float half_at(const std::uint8_t* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_f32(h);
}

// The 16 values IQ4_NL's and IQ4_XS's 4-bit indices select (a non-uniform grid, part of the format).
inline constexpr std::array<std::int8_t, 16> iq4_grid = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                         1,    13,   25,  38,  53,  69,  89,  113};

// Blocks of 32: codes q[0..15] hold weights j (low nibble) and j + 16 (high nibble).
inline void q4_0(const std::uint8_t* b, float* y) {
  const float d = half_at(b);
  const std::uint8_t* q = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((q[j] & 0x0F) - 8) * d;
    y[j + 16] = static_cast<float>((q[j] >> 4) - 8) * d;
  }
}

inline void q4_1(const std::uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  const std::uint8_t* q = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(q[j] & 0x0F) * d + m;
    y[j + 16] = static_cast<float>(q[j] >> 4) * d + m;
  }
}

// Q5: bit j of the 32-bit word is weight j's fifth bit (weights 0-15 low nibbles, 16-31 high nibbles).
inline std::uint32_t fifth_bits(const std::uint8_t* p) {
  std::uint32_t h;
  std::memcpy(&h, p, 4);
  return h;
}

inline void q5_0(const std::uint8_t* b, float* y) {
  const float d = half_at(b);
  const std::uint32_t h = fifth_bits(b + 2);
  const std::uint8_t* q = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = static_cast<int>((q[j] & 0x0F) | (((h >> j) & 1u) << 4));
    const int hi = static_cast<int>((q[j] >> 4) | (((h >> (j + 16)) & 1u) << 4));
    y[j] = static_cast<float>(lo - 16) * d;
    y[j + 16] = static_cast<float>(hi - 16) * d;
  }
}

inline void q5_1(const std::uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  const std::uint32_t h = fifth_bits(b + 4);
  const std::uint8_t* q = b + 8;
  for (int j = 0; j < 16; ++j) {
    const auto lo = (q[j] & 0x0F) | (((h >> j) & 1u) << 4);
    const auto hi = (q[j] >> 4) | (((h >> (j + 16)) & 1u) << 4);
    y[j] = static_cast<float>(lo) * d + m;
    y[j + 16] = static_cast<float>(hi) * d + m;
  }
}

inline void q8_0(const std::uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<std::int8_t>(b[2 + j])) * d;
}

inline void iq4_nl(const std::uint8_t* b, float* y) {
  const float d = half_at(b);
  const std::uint8_t* q = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(iq4_grid[q[j] & 0x0F]);
    y[j + 16] = d * static_cast<float>(iq4_grid[q[j] >> 4]);
  }
}

// ---- the 256-weight "K" super-blocks ----
// The 2-bit (Q2_K, Q3_K) and 6-bit (Q6_K) codes are packed four weights to a byte across 32-byte groups:
// in each half of 128 weights, byte l of the group holds weights l, l + 32, l + 64 and l + 96 in its bit
// pairs 0-1, 2-3, 4-5 and 6-7.

// Q2_K: scales[16] (low nibble: scale, high nibble: min, one per 16 weights), codes[64], fp16 d, fp16 dmin.
inline void q2_k(const std::uint8_t* b, float* y) {
  const std::uint8_t* scales = b;
  const std::uint8_t* codes = b + 16;
  const float d = half_at(b + 80), dmin = half_at(b + 82);
  for (int half = 0; half < 2; ++half) {
    const std::uint8_t* q = codes + 32 * half;
    for (int pair = 0; pair < 4; ++pair) {
      const int shift = 2 * pair;
      for (int sub = 0; sub < 2; ++sub) {
        const std::uint8_t sc = scales[8 * half + 2 * pair + sub];
        const float dl = d * static_cast<float>(sc & 0x0F), ml = dmin * static_cast<float>(sc >> 4);
        float* out = y + 128 * half + 32 * pair + 16 * sub;
        for (int l = 0; l < 16; ++l) out[l] = dl * static_cast<float>((q[16 * sub + l] >> shift) & 3) - ml;
      }
    }
  }
}

// Q3_K's 16 six-bit scales in 12 bytes: scale i's low four bits are the low (i < 8) or high (i >= 8) nibble
// of byte i % 8, its top two bits are bits 2·(i / 4) of byte 8 + i % 4; stored with an offset of 32.
inline int q3_k_scale(const std::uint8_t* s, int i) {
  const int low = i < 8 ? (s[i] & 0x0F) : (s[i - 8] >> 4);
  const int top = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (low | (top << 4)) - 32;
}

// Q3_K: hmask[32] (the third bit, one bit plane per 32-weight column), codes[64], scales[12], fp16 d.
// A weight whose third bit is clear is 4 lower: w = d·scale·(q2 - (bit ? 0 : 4)).
inline void q3_k(const std::uint8_t* b, float* y) {
  const std::uint8_t* hmask = b;
  const std::uint8_t* codes = b + 32;
  const std::uint8_t* scales = b + 96;
  const float d = half_at(b + 108);
  for (int half = 0; half < 2; ++half) {
    const std::uint8_t* q = codes + 32 * half;
    for (int pair = 0; pair < 4; ++pair) {
      const int shift = 2 * pair;
      const std::uint8_t bit = static_cast<std::uint8_t>(1u << (4 * half + pair));
      for (int sub = 0; sub < 2; ++sub) {
        const float dl = d * static_cast<float>(q3_k_scale(scales, 8 * half + 2 * pair + sub));
        float* out = y + 128 * half + 32 * pair + 16 * sub;
        for (int l = 0; l < 16; ++l) {
          const int k = 16 * sub + l;
          const int code = ((q[k] >> shift) & 3) - ((hmask[k] & bit) ? 0 : 4);
          out[l] = dl * static_cast<float>(code);
        }
      }
    }
  }
}

// Q4_K's and Q5_K's eight 6-bit (scale, min) pairs in 12 bytes: pairs 0-3 are the low six bits of bytes 0-3
// (scale) and 4-7 (min); pairs 4-7 take their low four bits from the nibbles of bytes 8-11 and their top two
// from the spare bits 6-7 of bytes 0-3 (scale) and 4-7 (min).
inline void k_scale_min(const std::uint8_t* s, int j, int& scale, int& min) {
  if (j < 4) {
    scale = s[j] & 63;
    min = s[j + 4] & 63;
  } else {
    scale = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q4_K: fp16 d, fp16 dmin, scales[12], codes[128]. Each 32-byte group of codes holds 64 weights: the low
// nibbles are sub-block 2g, the high nibbles sub-block 2g + 1.  w = d·scale·q - dmin·min.
// Q5_K: the same with high[32] before the codes: bit 2g of byte l is the fifth bit of weight 64g + l, bit
// 2g + 1 of weight 64g + 32 + l.
template <bool FifthBit>
inline void q4_or_q5_k(const std::uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const std::uint8_t* scales = b + 4;
  const std::uint8_t* high = b + 16;
  const std::uint8_t* q = b + (FifthBit ? 48 : 16);
  for (int g = 0; g < 4; ++g, q += 32) {
    int sc0, m0, sc1, m1;
    k_scale_min(scales, 2 * g, sc0, m0);
    k_scale_min(scales, 2 * g + 1, sc1, m1);
    const float d0 = d * static_cast<float>(sc0), min0 = dmin * static_cast<float>(m0);
    const float d1 = d * static_cast<float>(sc1), min1 = dmin * static_cast<float>(m1);
    for (int l = 0; l < 32; ++l) {
      int lo = q[l] & 0x0F, hi = q[l] >> 4;
      if constexpr (FifthBit) {
        lo += ((high[l] >> (2 * g)) & 1) << 4;
        hi += ((high[l] >> (2 * g + 1)) & 1) << 4;
      }
      y[64 * g + l] = d0 * static_cast<float>(lo) - min0;
      y[64 * g + 32 + l] = d1 * static_cast<float>(hi) - min1;
    }
  }
}
inline void q4_k(const std::uint8_t* b, float* y) { q4_or_q5_k<false>(b, y); }
inline void q5_k(const std::uint8_t* b, float* y) { q4_or_q5_k<true>(b, y); }

// Q6_K: low[128] (4-bit), high[64] (2-bit pairs), int8 scales[16] (one per 16 weights), fp16 d. In each
// half of 128 weights, low byte l (< 64) holds weights l (and l + 64) in its low (high) nibble and high byte
// l (< 32) holds the top bits of weights l, l + 32, l + 64, l + 96 in its bit pairs.  w = d·scale·(q - 32).
inline void q6_k(const std::uint8_t* b, float* y) {
  const std::uint8_t* low = b;
  const std::uint8_t* high = b + 128;
  const auto* scales = reinterpret_cast<const std::int8_t*>(b + 192);
  const float d = half_at(b + 208);
  for (int half = 0; half < 2; ++half) {
    const std::uint8_t* ql = low + 64 * half;
    const std::uint8_t* qh = high + 32 * half;
    const std::int8_t* sc = scales + 8 * half;
    float* out = y + 128 * half;
    for (int l = 0; l < 32; ++l) {
      const int s = l / 16;
      const int c0 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int c1 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int c2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int c3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      out[l] = d * static_cast<float>(sc[s]) * static_cast<float>(c0);
      out[l + 32] = d * static_cast<float>(sc[s + 2]) * static_cast<float>(c1);
      out[l + 64] = d * static_cast<float>(sc[s + 4]) * static_cast<float>(c2);
      out[l + 96] = d * static_cast<float>(sc[s + 6]) * static_cast<float>(c3);
    }
  }
}

// IQ4_XS: fp16 d, uint16 scales_high (2 bits per sub-block), scales_low[4] (a nibble per sub-block),
// indices[128]; sub-block s of 32 weights has scale (low | high << 4) - 32 and indexes IQ4_NL's grid.
inline void iq4_xs(const std::uint8_t* b, float* y) {
  const float d = half_at(b);
  std::uint16_t scales_high;
  std::memcpy(&scales_high, b + 2, 2);
  const std::uint8_t* scales_low = b + 4;
  const std::uint8_t* q = b + 8;
  for (int s = 0; s < 8; ++s, q += 16) {
    const int ls = ((scales_low[s / 2] >> (4 * (s % 2))) & 0x0F) | (((scales_high >> (2 * s)) & 3) << 4);
    const float dl = d * static_cast<float>(ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[32 * s + j] = dl * static_cast<float>(iq4_grid[q[j] & 0x0F]);
      y[32 * s + 16 + j] = dl * static_cast<float>(iq4_grid[q[j] >> 4]);
    }
  }
}

}  // namespace quants

// Dequantises `blocks` consecutive blocks of a quantised type into `out` (blocks · elements floats).
inline void dequantize_blocks(tensor_type t, const std::byte* data, std::int64_t blocks, float* out) {
  void (*one)(const std::uint8_t*, float*) = nullptr;
  switch (t) {
    case tensor_type::q4_0: one = quants::q4_0; break;
    case tensor_type::q4_1: one = quants::q4_1; break;
    case tensor_type::q5_0: one = quants::q5_0; break;
    case tensor_type::q5_1: one = quants::q5_1; break;
    case tensor_type::q8_0: one = quants::q8_0; break;
    case tensor_type::iq4_nl: one = quants::iq4_nl; break;
    case tensor_type::q2_k: one = quants::q2_k; break;
    case tensor_type::q3_k: one = quants::q3_k; break;
    case tensor_type::q4_k: one = quants::q4_k; break;
    case tensor_type::q5_k: one = quants::q5_k; break;
    case tensor_type::q6_k: one = quants::q6_k; break;
    case tensor_type::iq4_xs: one = quants::iq4_xs; break;
    default: return;  // the float types are not block-quantised; callers convert them themselves
  }
  const block_format f = format_of(t);
  const auto* p = reinterpret_cast<const std::uint8_t*>(data);
  for (std::int64_t i = 0; i < blocks; ++i) one(p + static_cast<std::size_t>(i) * f.bytes, out + i * f.elements);
}

}  // namespace zipage::gguf
