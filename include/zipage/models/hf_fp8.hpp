#pragma once
// Hugging Face FP8 checkpoints in the format of Qwen's official Qwen3-*-FP8 releases (issue 14, part 2).
//
// config.json carries
//   "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
//                           "weight_block_size": [128, 128], "modules_to_not_convert": null}
// and every quantised nn.Linear weight `W` ([out][in]) is stored as F8_E4M3 (float8_e4m3fn codes) with a
// companion `W_scale_inv` ([ceil(out/bo)][ceil(in/bi)], F32, BF16 or F16) such that the weight is
//   W[i][j] = e4m3(code[i][j]) * scale_inv[i / bo][j / bi].
// (The name is the exporter's: the tensor holds the dequantisation multiplier, amax / 448 per block.)
// Embeddings, norms and lm_head stay in bf16.
//
// zipage dequantises at load, exactly (fp32 = decode(code) * scale, one float product): the CPU backend runs
// its GEMMs on those fp32 weights; the CUDA backend re-quantises the blocks' linear weights from them to E4M3
// with 128x128 block scales (recovering the checkpoint's codes; `--quantization auto`, the default) and runs FP8
// GEMMs, or converts them to bf16 with `--quantization none` (docs/fp8.md, "FP8 weights").
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/fp8.hpp"
#include "zipage/core/fp8_linear.hpp"
#include "zipage/core/json.hpp"

namespace zipage {

// The weight quantisation a config.json declares; `fp8` false for an unquantised checkpoint.
struct hf_quantization {
  bool fp8 = false;
  int block_rows = 128;  // weight_block_size[0]: along a weight's output dimension
  int block_cols = 128;  // weight_block_size[1]: along its input dimension

  [[nodiscard]] std::int64_t scale_rows(std::int64_t rows) const { return (rows + block_rows - 1) / block_rows; }
  [[nodiscard]] std::int64_t scale_cols(std::int64_t cols) const { return (cols + block_cols - 1) / block_cols; }
};

// Reads `quantization_config` from a parsed config.json (`src` names it in errors). Absent or null: no
// quantisation. Anything zipage does not load is an error naming the field: another quant_method, fmt other
// than e4m3, activation_scheme other than dynamic (static checkpoints carry activation scales), a
// weight_block_size that is not two integers > 0 (or is absent: per-tensor FP8 is not supported).
inline hf_quantization hf_quantization_from_json(const json::value& cfg, std::string_view source) {
  const std::string src(source);
  hf_quantization q;
  const json::value* qc = json::find(cfg, "quantization_config");
  if (qc == nullptr) return q;
  check(qc->is_object(), src, ": field 'quantization_config' must be an object, got ", json::type_name(*qc));
  const std::string f = "quantization_config.";
  const std::string& method =
      json::as_string(json::require(*qc, "quant_method", src + ": quantization_config"), src, f + "quant_method");
  check(method == "fp8", src, ": ", f, "quant_method '", json::printable(method),
        "' is not supported (zipage loads 'fp8' checkpoints with 128x128-style block scales)");
  if (const json::value* fmt = json::find(*qc, "fmt")) {
    const std::string& s = json::as_string(*fmt, src, f + "fmt");
    check(s == "e4m3", src, ": ", f, "fmt '", json::printable(s), "' is not supported (zipage loads e4m3)");
  }
  if (const json::value* act = json::find(*qc, "activation_scheme")) {
    const std::string& s = json::as_string(*act, src, f + "activation_scheme");
    check(s == "dynamic", src, ": ", f, "activation_scheme '", json::printable(s),
          "' is not supported (zipage loads 'dynamic': no activation scales in the checkpoint)");
  }
  const json::value* block = json::find(*qc, "weight_block_size");
  check(block != nullptr, src, ": ", f,
        "weight_block_size is missing (zipage loads block-scaled FP8, e.g. [128, 128]; per-tensor FP8 is not supported)");
  check(block->is_array() && block->size() == 2, src, ": ", f, "weight_block_size must be two integers > 0, got ",
        json::printable(block->dump()));
  q.block_rows = static_cast<int>(json::as_int((*block)[0], src, f + "weight_block_size[0]", 1, (1LL << 31) - 1));
  q.block_cols = static_cast<int>(json::as_int((*block)[1], src, f + "weight_block_size[1]", 1, (1LL << 31) - 1));
  if (const json::value* skip = json::find(*qc, "modules_to_not_convert"); skip != nullptr && !skip->is_null()) {
    check(skip->is_array(), src, ": ", f, "modules_to_not_convert must be a list or null, got ", json::type_name(*skip));
    for (std::size_t i = 0; i < skip->size(); ++i)
      (void)json::as_string((*skip)[i], src, f + "modules_to_not_convert[" + std::to_string(i) + "]");
    // Which weights are quantised is read from each tensor's dtype; the list needs no other use.
  }
  q.fp8 = true;
  return q;
}

// Dequantises a [rows][cols] block-scaled E4M3 weight: out[i][j] = e4m3(codes[i][j]) * scale[i/br][j/bc],
// `scale` row-major [ceil(rows/br)][ceil(cols/bc)]. Exact: one fp32 product of an exactly decoded code.
// The last block row / column may be partial (ragged shapes). A NaN code is an error naming `what`.
inline void dequantize_fp8_blocks(std::span<const std::uint8_t> codes, int rows, int cols,
                                  std::span<const float> scale, int block_rows, int block_cols,
                                  std::span<float> out, std::string_view what = "weight") {
  const std::size_t R = static_cast<std::size_t>(rows), C = static_cast<std::size_t>(cols);
  const std::size_t sc = (C + static_cast<std::size_t>(block_cols) - 1) / static_cast<std::size_t>(block_cols);
  const std::size_t sr = (R + static_cast<std::size_t>(block_rows) - 1) / static_cast<std::size_t>(block_rows);
  check(codes.size() == R * C && out.size() == R * C && scale.size() == sr * sc, what,
        ": dequantize_fp8_blocks: sizes do not match [", rows, ", ", cols, "] with blocks ", block_rows, "x", block_cols);
  // Every code's exact value, once (a table read is ~4x faster than decoding each byte: load time of an 8B model).
  static const std::array<float, 256> value = [] {
    std::array<float, 256> v{};
    for (int c = 0; c < 256; ++c) v[static_cast<std::size_t>(c)] = fp8_e4m3_to_f32(static_cast<std::uint8_t>(c));
    return v;
  }();
  const std::size_t bc = static_cast<std::size_t>(block_cols);
  for (std::size_t i = 0; i < R; ++i) {
    const float* srow = scale.data() + (i / static_cast<std::size_t>(block_rows)) * sc;
    const std::uint8_t* in = codes.data() + i * C;
    float* o = out.data() + i * C;
    unsigned nan = 0;
    for (std::size_t j0 = 0; j0 < C; j0 += bc) {
      const float s = srow[j0 / bc];
      const std::size_t j1 = std::min(C, j0 + bc);
      for (std::size_t j = j0; j < j1; ++j) {
        nan |= static_cast<unsigned>((in[j] & 0x7fu) == 0x7fu);
        o[j] = value[in[j]] * s;
      }
    }
    if (nan != 0)
      for (std::size_t j = 0; j < C; ++j)
        check(!fp8_e4m3_is_nan(in[j]), what, ": NaN E4M3 code at [", i, ", ", j, "]");
  }
}

// Quantises a [rows][cols] fp32 weight the way the official FP8 releases are made: per block,
// scale = amax / 448 (1 for an all-zero block, so that every stored scale is positive) and
// code = e4m3(w / scale) (IEEE division, round to nearest even, saturating). Returns the codes; `scale`
// receives [ceil(rows/br)][ceil(cols/bc)] multipliers (the checkpoint's `_scale_inv`).
inline std::vector<std::uint8_t> quantize_fp8_blocks(std::span<const float> w, int rows, int cols, int block_rows,
                                                     int block_cols, std::vector<float>& scale) {
  auto q = fp8_linear::quantize_blocks(w, rows, cols, block_rows, block_cols, 1.0f, "quantize_fp8_blocks");
  scale = std::move(q.scales);
  return std::move(q.codes);
}

}  // namespace zipage
