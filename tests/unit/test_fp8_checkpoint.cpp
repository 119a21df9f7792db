// FP8 checkpoints in the format of Qwen's Qwen3-*-FP8 releases (issue 14, part 2): quantization_config
// parsing and its errors, block dequantisation against hand-computed values (whole and ragged blocks), the
// loader's errors (missing / misshapen / non-positive scales, FP8 weights without a quantization_config),
// and the whole engine on a random FP8 Qwen3 against the same model written as a plain checkpoint of the
// dequantised fp32 weights: identical logits and greedy tokens.
#include <doctest/doctest.h>

#include "fp8_checkpoint.hpp"
#include "prefill_logits.hpp"
#include "test_support.hpp"

#include <zipage/engine/engine.hpp>
#include <zipage/models/hf_config.hpp>
#include <zipage/models/hf_fp8.hpp>
#include <zipage/models/hf_loader.hpp>
#include <zipage/safetensors/writer.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace fs = std::filesystem;
namespace st = zipage::safetensors;
using zipage::token_id;
using zipage::testing::contains;
using zipage::testing::error_of;
using zipage::testing::temp_dir;

namespace {

using model_type = zipage::llama_model<zipage::cpu_backend>;

std::string quant_error(const std::string& qc) {
  return error_of([&] {
    (void)zipage::hf_quantization_from_json(zipage::json::parse(R"({"quantization_config": )" + qc + "}", "cfg"),
                                            "config.json");
  });
}

// One prefill of a single sequence with full KV: the logits of every position, flattened [T][vocab].
std::vector<float> model_logits(model_type& m, const std::vector<token_id>& tokens) {
  return zipage::testing::prefill_logits(m, tokens);
}

// Rewrites dir/model.safetensors tensor by tensor; `edit` may change a tensor's dtype text, shape and bytes,
// or return false to drop it.
using tensor_edit = std::function<bool(const std::string& name, std::string& dtype, std::vector<std::int64_t>& shape,
                                       std::vector<std::byte>& bytes)>;
void rewrite(const fs::path& dir, const tensor_edit& edit, const std::function<void(st::writer&)>& extra = {}) {
  std::vector<std::byte> out;
  {
    const auto f = st::file::open(dir / "model.safetensors");
    st::writer w;
    for (const auto& t : f.tensors()) {
      std::string dtype(st::dtype_name(t.type));
      std::vector<std::int64_t> shape = t.shape;
      std::vector<std::byte> bytes(t.data, t.data + t.nbytes);
      if (edit(t.name, dtype, shape, bytes)) w.add_raw(t.name, dtype, std::move(shape), std::move(bytes));
    }
    if (extra) extra(w);
    out = w.bytes();
  }  // unmapped before the file is rewritten
  st::writer::write_bytes(dir / "model.safetensors", out);
}

std::vector<std::byte> f32_bytes(const std::vector<float>& v) {
  std::vector<std::byte> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

const std::vector<token_id> prompt{1, 17, 300, 42, 511, 7, 99, 256, 3, 64, 128, 5};

}  // namespace

TEST_CASE("fp8 checkpoints: quantization_config is read, and what zipage cannot load is refused by name") {
  const auto q = zipage::hf_quantization_from_json(
      zipage::json::parse(R"({"quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
        "quant_method": "fp8", "weight_block_size": [128, 64], "modules_to_not_convert": null}})", "cfg"),
      "config.json");
  CHECK(q.fp8);
  CHECK(q.block_rows == 128);
  CHECK(q.block_cols == 64);
  CHECK(q.scale_rows(129) == 2);
  CHECK(q.scale_cols(64) == 1);
  CHECK(q.scale_cols(65) == 2);
  CHECK_FALSE(zipage::hf_quantization_from_json(zipage::json::parse("{}", "cfg"), "config.json").fp8);
  // fmt and activation_scheme may be absent (transformers' fine-grained FP8 config writes neither).
  CHECK(quant_error(R"({"quant_method": "fp8", "weight_block_size": [128, 128]})") == "<no error>");

  CHECK(contains(quant_error(R"({"quant_method": "gptq", "weight_block_size": [128, 128]})"),
                 "config.json: quantization_config.quant_method 'gptq' is not supported"));
  CHECK(contains(quant_error(R"({"weight_block_size": [128, 128]})"), "quantization_config: missing field 'quant_method'"));
  CHECK(contains(quant_error(R"({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]})"),
                 "config.json: quantization_config.fmt 'e5m2' is not supported (zipage loads e4m3)"));
  CHECK(contains(quant_error(R"({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]})"),
                 "config.json: quantization_config.activation_scheme 'static' is not supported"));
  CHECK(contains(quant_error(R"({"quant_method": "fp8"})"), "quantization_config.weight_block_size is missing"));
  CHECK(contains(quant_error(R"({"quant_method": "fp8", "weight_block_size": [128]})"),
                 "quantization_config.weight_block_size must be two integers > 0, got [128]"));
  CHECK(contains(quant_error(R"({"quant_method": "fp8", "weight_block_size": 128})"),
                 "quantization_config.weight_block_size must be two integers > 0, got 128"));
  CHECK(contains(quant_error(R"({"quant_method": "fp8", "weight_block_size": [128, 0]})"),
                 "field 'quantization_config.weight_block_size[1]' = 0 is out of range"));
  CHECK(contains(quant_error(R"({"quant_method": "fp8", "weight_block_size": [128.5, 128]})"),
                 "field 'quantization_config.weight_block_size[0]' must be an integer"));
  CHECK(contains(quant_error(R"({"quant_method": "fp8", "weight_block_size": [128, 128], "modules_to_not_convert": 3})"),
                 "quantization_config.modules_to_not_convert must be a list or null"));
  CHECK(contains(quant_error(R"("fp8")"), "field 'quantization_config' must be an object"));

  // hf_config refuses the same configs up front, before any weight is read.
  zipage::testing::fp8_qwen3_spec s;
  auto cfg = zipage::testing::fp8_qwen3_config(s, true);
  CHECK(error_of([&] { (void)zipage::hf_config_from_json(cfg); }) == "<no error>");
  cfg["quantization_config"]["fmt"] = "e5m2";
  CHECK(contains(error_of([&] { (void)zipage::hf_config_from_json(cfg); }), "quantization_config.fmt 'e5m2'"));
}

TEST_CASE("fp8 checkpoints: block dequantisation is exact against hand-computed values") {
  // A [2][4] weight in 2x2 blocks: scales 0.25 (left block) and 3 (right block).
  // Codes: 0x38 = 1, 0x40 = 2, 0xb8 = -1, 0x3c = 1.5, 0x30 = 0.5, 0x7e = 448, 0x01 = 2^-9, 0x00 = 0.
  const std::vector<std::uint8_t> codes{0x38, 0x40, 0x7e, 0x01,  //
                                        0xb8, 0x3c, 0x30, 0x00};
  const std::vector<float> scale{0.25f, 3.0f};
  std::vector<float> out(8);
  zipage::dequantize_fp8_blocks(codes, 2, 4, scale, 2, 2, out);
  CHECK(out == std::vector<float>{0.25f, 0.5f, 1344.0f, 3.0f / 512.0f,  //
                                  -0.25f, 0.375f, 1.5f, 0.0f});

  // Ragged: [3][5] in 2x2 blocks -> scales [2][3]; row 2 and column 4 are partial blocks.
  const std::vector<float> s2{1.0f, 2.0f, 4.0f,  //
                              8.0f, 16.0f, 32.0f};
  const std::vector<std::uint8_t> ones(15, 0x38);  // every code 1.0: out is the block's scale
  std::vector<float> out2(15);
  zipage::dequantize_fp8_blocks(ones, 3, 5, s2, 2, 2, out2);
  CHECK(out2 == std::vector<float>{1, 1, 2, 2, 4,  //
                                   1, 1, 2, 2, 4,  //
                                   8, 8, 16, 16, 32});
  // A NaN code and mismatched sizes are errors.
  std::vector<std::uint8_t> nan = ones;
  nan[7] = 0x7f;
  CHECK(contains(error_of([&] { zipage::dequantize_fp8_blocks(nan, 3, 5, s2, 2, 2, out2, "w"); }),
                 "w: NaN E4M3 code at [1, 2]"));
  CHECK(contains(error_of([&] { zipage::dequantize_fp8_blocks(ones, 3, 5, scale, 2, 2, out2, "w"); }),
                 "w: dequantize_fp8_blocks: sizes do not match [3, 5]"));

  // Quantising as the official releases do (scale = amax / 448 per block) and dequantising: every block's
  // largest magnitude is exact (code 448), every value within e4m3's half-ulp (2^-4 relative, or half the
  // smallest subnormal step for tiny values), an all-zero block gets scale 1 and zero codes.
  const int rows = 130, cols = 259;  // 2 x 3 blocks of 128, both ragged
  std::vector<float> w(static_cast<std::size_t>(rows) * cols);
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 0.02f);
  for (float& x : w) x = n(rng);
  for (int i = 128; i < rows; ++i)
    for (int j = 256; j < cols; ++j) w[static_cast<std::size_t>(i) * cols + j] = 0.0f;  // the corner block
  std::vector<float> sc;
  const auto q = zipage::quantize_fp8_blocks(w, rows, cols, 128, 128, sc);
  REQUIRE(sc.size() == 6);
  CHECK(sc[5] == 1.0f);
  std::vector<float> deq(w.size());
  zipage::dequantize_fp8_blocks(q, rows, cols, sc, 128, 128, deq);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) {
      const std::size_t k = static_cast<std::size_t>(i) * cols + j;
      const float s = sc[static_cast<std::size_t>(i / 128) * 3 + j / 128];
      CHECK(deq[k] == zipage::fp8_e4m3_to_f32(q[k]) * s);
      REQUIRE(std::abs(deq[k] - w[k]) <= std::max(std::abs(w[k]) / 16.0f, s * 0x1p-10f) * 1.0001f);
    }
  float amax = 0;
  for (int i = 0; i < 128; ++i)
    for (int j = 0; j < 128; ++j) amax = std::max(amax, std::abs(w[static_cast<std::size_t>(i) * cols + j]));
  CHECK(sc[0] == amax / 448.0f);
}

TEST_CASE("fp8 checkpoints: the engine on a random FP8 Qwen3 equals the dequantised fp32 checkpoint exactly") {
  for (const bool bf16_scales : {false, true}) {
    CAPTURE(bf16_scales);
    temp_dir dir("zipage_fp8ckpt");
    zipage::testing::fp8_qwen3_spec s;
    s.bf16_scales = bf16_scales;
    write_fp8_qwen3(dir.path / "fp8", dir.path / "ref", s);
    auto fp8 = zipage::load_hf_checkpoint(dir.path / "fp8");
    auto ref = zipage::load_hf_checkpoint(dir.path / "ref");
    const auto a = model_logits(fp8, prompt), b = model_logits(ref, prompt);
    REQUIRE(a.size() == prompt.size() * static_cast<std::size_t>(s.vocab));
    CHECK(a == b);  // bit for bit: the dequantised weights are the same floats

    zipage::sampling_params sp;
    sp.temperature = 0.0f;
    sp.max_tokens = 24;
    sp.ignore_eos = true;
    zipage::engine<model_type> e1(std::move(fp8), {.block_size = 4, .num_blocks = 64});
    zipage::engine<model_type> e2(std::move(ref), {.block_size = 4, .num_blocks = 64});
    const auto o1 = e1.generate({prompt, {5, 6, 7}}, sp);
    const auto o2 = e2.generate({prompt, {5, 6, 7}}, sp);
    REQUIRE(o1.size() == 2);
    REQUIRE(o2.size() == 2);
    CHECK(o1[0].output.size() == 24);
    CHECK(o1[0].output == o2[0].output);
    CHECK(o1[1].output == o2[1].output);
  }
}

TEST_CASE("fp8 checkpoints: sharded, a weight and its scale in different shards (as in the releases)") {
  temp_dir dir("zipage_fp8ckpt_shards");
  zipage::testing::fp8_qwen3_spec s;
  write_fp8_qwen3(dir.path / "fp8", dir.path / "ref", s);
  const fs::path fp8 = dir.path / "fp8";
  std::vector<std::byte> shard1, shard2;
  zipage::json::value map = zipage::json::value::object();
  {
    const auto f = st::file::open(fp8 / "model.safetensors");
    st::writer w1, w2;
    for (const auto& t : f.tensors()) {
      // Weights of layer 0 in shard 1, their scales in shard 2; the rest split by layer.
      const bool second = t.name.ends_with("_scale_inv") ? t.name.starts_with("model.layers.0.")
                                                         : t.name.starts_with("model.layers.1.");
      (second ? w2 : w1).add_raw(t.name, st::dtype_name(t.type), t.shape,
                                 std::vector<std::byte>(t.data, t.data + t.nbytes));
      map[t.name] = second ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    }
    shard1 = w1.bytes();
    shard2 = w2.bytes();
  }
  fs::remove(fp8 / "model.safetensors");
  st::writer::write_bytes(fp8 / "model-00001-of-00002.safetensors", shard1);
  st::writer::write_bytes(fp8 / "model-00002-of-00002.safetensors", shard2);
  std::ofstream(fp8 / "model.safetensors.index.json") << zipage::json::value{{"metadata", zipage::json::value::object()},
                                                                            {"weight_map", map}}.dump();
  auto a = zipage::load_hf_checkpoint(fp8);
  auto b = zipage::load_hf_checkpoint(dir.path / "ref");
  CHECK(model_logits(a, prompt) == model_logits(b, prompt));
}

TEST_CASE("fp8 checkpoints: loading errors name the tensor") {
  temp_dir dir("zipage_fp8ckpt_err");
  const fs::path fp8 = dir.path / "fp8", ref = dir.path / "ref";
  zipage::testing::fp8_qwen3_spec s;
  s.layers = 1;
  const std::string w = "model.layers.0.mlp.up_proj.weight", sname = w + "_scale_inv";
  auto load_error = [&] { return error_of([&] { (void)zipage::load_hf_checkpoint(fp8); }); };
  auto fresh = [&] { write_fp8_qwen3(fp8, ref, s); };

  fresh();
  CHECK(load_error() == "<no error>");

  // A quantised weight without its scale.
  rewrite(fp8, [&](const std::string& name, auto&, auto&, auto&) { return name != sname; });
  CHECK(contains(load_error(), "FP8 tensor 'model.layers.0.mlp.up_proj.weight' has no scale tensor "
                               "'model.layers.0.mlp.up_proj.weight_scale_inv'"));

  // A scale of the wrong shape: [272][144] in 128x128 blocks needs [3, 2].
  fresh();
  rewrite(fp8, [&](const std::string& name, auto&, auto& shape, auto& bytes) {
    if (name == sname) {
      shape = {2, 3};
      (void)bytes;
    }
    return true;
  });
  CHECK(contains(load_error(), "scale tensor 'model.layers.0.mlp.up_proj.weight_scale_inv' has shape [2, 3], "
                               "expected [3, 2] ([272, 144] in 128x128 blocks)"));

  // Scales that are not finite and positive.
  for (const float bad : {0.0f, -0.5f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    CAPTURE(bad);
    fresh();
    rewrite(fp8, [&](const std::string& name, auto&, auto&, auto& bytes) {
      if (name == sname) std::memcpy(bytes.data() + 3 * 4, &bad, 4);  // entry [1, 1]
      return true;
    });
    CHECK(contains(load_error(), "scale tensor 'model.layers.0.mlp.up_proj.weight_scale_inv' holds "));
    CHECK(contains(load_error(), " at [1, 1] (block scales must be finite and > 0)"));
  }

  // A scale of a dtype that is not a float.
  fresh();
  rewrite(fp8, [&](const std::string& name, auto& dtype, auto&, auto&) {
    if (name == sname) dtype = "I32";
    return true;
  });
  CHECK(contains(load_error(), "scale tensor 'model.layers.0.mlp.up_proj.weight_scale_inv' has dtype I32"));

  // FP8 weights with a config.json that declares no quantisation.
  fresh();
  fs::copy_file(ref / "config.json", fp8 / "config.json", fs::copy_options::overwrite_existing);
  CHECK(contains(load_error(), "tensor 'model.layers.0.self_attn.q_proj.weight' has dtype F8_E4M3 but config.json "
                               "has no quantization_config"));

  // A scale beside an unquantised weight is a tensor the model does not use.
  fresh();
  rewrite(ref, [&](const std::string&, auto&, auto&, auto&) { return true; },
          [&](st::writer& wr) { wr.add_raw(sname, "F32", {3, 2}, f32_bytes(std::vector<float>(6, 1.0f))); });
  CHECK(contains(error_of([&] { (void)zipage::load_hf_checkpoint(ref); }),
                 "unexpected tensor 'model.layers.0.mlp.up_proj.weight_scale_inv'"));

  // A tied lm_head stored anyway, quantised with its scale, is ignored as a BF16 copy would be.
  fresh();
  rewrite(fp8, [&](const std::string&, auto&, auto&, auto&) { return true; }, [&](st::writer& wr) {
    wr.add_raw("lm_head.weight", "F8_E4M3", {s.vocab, s.hidden},
               std::vector<std::byte>(static_cast<std::size_t>(s.vocab * s.hidden), std::byte{0x38}));
    wr.add_raw("lm_head.weight_scale_inv", "F32", {4, 2}, f32_bytes(std::vector<float>(8, 1.0f)));
  });
  CHECK(load_error() == "<no error>");

  // An F8_E4M3 norm (no quantised vector exists in the format) is refused by the reader, naming the dtype.
  fresh();
  rewrite(fp8, [&](const std::string& name, auto& dtype, auto& shape, auto& bytes) {
    if (name == "model.norm.weight") {
      dtype = "F8_E4M3";
      bytes.assign(static_cast<std::size_t>(shape[0]), std::byte{0x38});
    }
    return true;
  });
  CHECK(contains(load_error(), "tensor 'model.norm.weight' has dtype F8_E4M3, which zipage cannot load"));

  // A NaN code in a quantised weight.
  fresh();
  rewrite(fp8, [&](const std::string& name, auto&, auto&, auto& bytes) {
    if (name == w) bytes[144 * 5 + 7] = std::byte{0xff};
    return true;
  });
  CHECK(contains(load_error(), "tensor 'model.layers.0.mlp.up_proj.weight': NaN E4M3 code at [5, 7]"));

  // The safetensors reader checks an F8_E4M3 tensor's byte count like any other dtype's.
  fresh();
  rewrite(fp8, [&](const std::string& name, auto&, auto&, auto& bytes) {
    if (name == w) bytes.pop_back();
    return true;
  });
  CHECK(contains(load_error(), "tensor 'model.layers.0.mlp.up_proj.weight': data_offsets"));
  CHECK(contains(load_error(), "but shape [272, 144] of F8_E4M3 needs 39168"));
}
