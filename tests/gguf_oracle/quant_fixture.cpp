// Writes tests/data/gguf/quants.gguf: for each block-quantised type zipage loads, random rows that ggml
// itself quantised (tensor "<type>", ggml's bytes) and what ggml's own dequantisation makes of them
// (tensor "<type>.ggml", F32). tests/unit/test_gguf_quants.cpp checks zipage's dequantisation against them.
// Built and run by tests/gguf_oracle/run.sh against llama.cpp's ggml (README.md there); not part of the
// build, and the tests need only the file it writes.
#include <ggml.h>

#include <zipage/gguf/writer.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace gg = zipage::gguf;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: quant_fixture OUT.gguf\n");
    return 2;
  }
  const gg::tensor_type types[] = {gg::tensor_type::q4_0, gg::tensor_type::q4_1, gg::tensor_type::q5_0,
                                   gg::tensor_type::q5_1, gg::tensor_type::q8_0, gg::tensor_type::iq4_nl,
                                   gg::tensor_type::q2_k, gg::tensor_type::q3_k, gg::tensor_type::q4_k,
                                   gg::tensor_type::q5_k, gg::tensor_type::q6_k, gg::tensor_type::iq4_xs};
  constexpr std::int64_t row = 512, rows = 4;
  std::mt19937 rng(20261205);
  gg::writer w;
  w.set("general.architecture", "zipage-quant-fixture");
  w.set("general.description", "ggml-quantised rows and ggml's dequantisation of them");
  for (gg::tensor_type t : types) {
    // Row 0: unit Gaussian. Row 1: a weight-like scale with outliers. Row 2: all of one sign, with a
    // block of zeros. Row 3: tiny values (scales near fp16's subnormals).
    std::vector<float> x(row * rows);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::int64_t j = 0; j < row; ++j) {
      x[j] = normal(rng);
      x[row + j] = 0.02f * normal(rng) * (rng() % 61 == 0 ? 40.0f : 1.0f);
      x[2 * row + j] = (j >= 64 && j < 96) ? 0.0f : std::fabs(normal(rng)) + 0.5f;
      x[3 * row + j] = 1e-6f * normal(rng);
    }
    const auto type = static_cast<ggml_type>(t);
    const ggml_type_traits* traits = ggml_get_type_traits(type);
    std::vector<std::byte> q(ggml_row_size(type, row) * rows);
    const std::size_t written = ggml_quantize_chunk(type, x.data(), q.data(), 0, rows, row, nullptr);
    if (written != q.size()) {
      std::fprintf(stderr, "%s: ggml wrote %zu bytes, expected %zu\n", traits->type_name, written, q.size());
      return 1;
    }
    std::vector<float> y(row * rows);
    traits->to_float(q.data(), y.data(), row * rows);
    const std::string name = std::string(gg::tensor_type_name(t));
    w.add_encoded_tensor(name, {row, rows}, t, q);
    w.add_tensor(name + ".ggml", {row, rows}, gg::tensor_type::f32, y);
    std::printf("%-7s %zu bytes\n", traits->type_name, q.size());
  }
  w.write(argv[1]);
  return 0;
}
