// Writes a tiny random-weight Qwen3 checkpoint directory for the zipage-eval smoke tests: config.json,
// model.safetensors (BF16), generation_config.json (T = 0.6, top_p 0.95, top_k 20, as Qwen3's) and the
// Qwen3 tokenizer files copied from tests/data/qwen3. The model's answers are noise; the tests check the
// harness's counts, not accuracy. With qwen2 as the third argument it writes a Qwen2 checkpoint instead (q/k/v
// biases, no q/k norms), for the Qwen2 GGUF test.
//   make_eval_fixture OUT_DIR TOKENIZER_DIR [qwen2]
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zipage/safetensors/writer.hpp"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc != 3 && !(argc == 4 && std::string(argv[3]) == "qwen2")) {
    std::fprintf(stderr, "usage: make_eval_fixture OUT_DIR TOKENIZER_DIR [qwen2]\n");
    return 2;
  }
  const bool qwen2 = argc == 4;
  try {
    const fs::path out = argv[1], tok = argv[2];
    // Qwen2's head size is hidden / heads (llama.cpp reads no other); Qwen3's is its own head_dim.
    const int hidden = 16, layers = 2, heads = 2, kv_heads = 1, head_dim = qwen2 ? 8 : 16, ffn = 32, vocab = 151936;
    fs::create_directories(out);
    const nlohmann::json config = {
        {"architectures", {qwen2 ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM"}}, {"model_type", qwen2 ? "qwen2" : "qwen3"},
        {"hidden_size", hidden},
        {"num_hidden_layers", layers}, {"num_attention_heads", heads}, {"num_key_value_heads", kv_heads},
        {"head_dim", head_dim}, {"intermediate_size", ffn}, {"vocab_size", vocab}, {"rms_norm_eps", 1e-6},
        {"rope_theta", 1000000.0}, {"tie_word_embeddings", true}, {"hidden_act", "silu"},
        {"max_position_embeddings", 4096}, {"bos_token_id", 151643}, {"eos_token_id", 151645},
        {"torch_dtype", "bfloat16"}};
    std::ofstream(out / "config.json") << config.dump(2) << "\n";
    const nlohmann::json gen = {{"bos_token_id", 151643}, {"do_sample", true}, {"eos_token_id", {151645, 151643}},
                                {"temperature", 0.6}, {"top_k", 20}, {"top_p", 0.95}};
    std::ofstream(out / "generation_config.json") << gen.dump(2) << "\n";
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      fs::copy_file(tok / f, out / f, fs::copy_options::overwrite_existing);

    std::mt19937 rng(20240611);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    zipage::safetensors::writer w;
    w.set_metadata("format", "pt");
    auto mat = [&](const std::string& name, int rows, int cols, float scale) {
      std::vector<float> v(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
      for (float& x : v) x = u(rng) * scale;
      w.add(name, {rows, cols}, v, zipage::safetensors::dtype::bf16);
    };
    auto vec = [&](const std::string& name, int n) {
      std::vector<float> v(static_cast<std::size_t>(n));
      for (float& x : v) x = 1.0f + 0.2f * u(rng);
      w.add(name, {n}, v, zipage::safetensors::dtype::bf16);
    };
    const float in_scale = 1.0f / std::sqrt(float(hidden));
    mat("model.embed_tokens.weight", vocab, hidden, 1.0f);
    for (int l = 0; l < layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      vec(p + "input_layernorm.weight", hidden);
      mat(p + "self_attn.q_proj.weight", heads * head_dim, hidden, 2.0f * in_scale);
      mat(p + "self_attn.k_proj.weight", kv_heads * head_dim, hidden, 2.0f * in_scale);
      mat(p + "self_attn.v_proj.weight", kv_heads * head_dim, hidden, in_scale);
      mat(p + "self_attn.o_proj.weight", hidden, heads * head_dim, 1.0f / std::sqrt(float(heads * head_dim)));
      if (qwen2) {
        auto bias = [&](const std::string& name, int n) {
          std::vector<float> v(static_cast<std::size_t>(n));
          for (float& x : v) x = 0.5f * u(rng);
          w.add(name, {n}, v, zipage::safetensors::dtype::bf16);
        };
        bias(p + "self_attn.q_proj.bias", heads * head_dim);
        bias(p + "self_attn.k_proj.bias", kv_heads * head_dim);
        bias(p + "self_attn.v_proj.bias", kv_heads * head_dim);
      } else {
        vec(p + "self_attn.q_norm.weight", head_dim);
        vec(p + "self_attn.k_norm.weight", head_dim);
      }
      vec(p + "post_attention_layernorm.weight", hidden);
      mat(p + "mlp.gate_proj.weight", ffn, hidden, in_scale);
      mat(p + "mlp.up_proj.weight", ffn, hidden, in_scale);
      mat(p + "mlp.down_proj.weight", hidden, ffn, 1.0f / std::sqrt(float(ffn)));
    }
    vec("model.norm.weight", hidden);
    w.write(out / "model.safetensors");
    std::printf("make_eval_fixture: wrote %s\n", out.string().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_eval_fixture: error: %s\n", e.what());
    return 1;
  }
}
