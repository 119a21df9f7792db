// Writes a small random Qwen3 checkpoint quantised like Qwen's official Qwen3-*-FP8 releases (128x128
// E4M3 blocks, weight_scale_inv = amax / 448, quantization_config in config.json) and its reference:
//   OUT_DIR/fp8  the FP8 checkpoint          OUT_DIR/ref  the same model, linears as dequantised F32
// With TOKENIZER_DIR (tests/data/qwen3) the vocabulary is Qwen3's (151,936) and the tokenizer files are
// copied into both, so zipage-generate --model runs on them; without it the vocabulary is 512.
// The layout is tests/support/fp8_checkpoint.hpp's (every quantised matrix ragged: 144, 160, 272, 80).
//   make_fp8_checkpoint OUT_DIR [TOKENIZER_DIR]
#include <cstdio>
#include <exception>
#include <filesystem>

#include "fp8_checkpoint.hpp"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: make_fp8_checkpoint OUT_DIR [TOKENIZER_DIR]\n");
    return 2;
  }
  try {
    const fs::path out = argv[1];
    zipage::testing::fp8_qwen3_spec spec;
    if (argc == 3) {
      spec.vocab = 151936;
      spec.bos = 151643;
      spec.eos = 151645;
    }
    zipage::testing::write_fp8_qwen3(out / "fp8", out / "ref", spec);
    if (argc == 3) {
      const fs::path tok = argv[2];
      for (const char* d : {"fp8", "ref"})
        for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
          fs::copy_file(tok / f, out / d / f, fs::copy_options::overwrite_existing);
    }
    std::printf("make_fp8_checkpoint: wrote %s and %s\n", (out / "fp8").string().c_str(), (out / "ref").string().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_fp8_checkpoint: error: %s\n", e.what());
    return 1;
  }
}
