// Writes a tiny random-weight Qwen3 checkpoint directory for the zipage-eval smoke tests: config.json,
// model.safetensors (BF16), generation_config.json (T = 0.6, top_p 0.95, top_k 20, as Qwen3's) and the
// Qwen3 tokenizer files copied from tests/data/qwen3. The model's answers are noise; the tests check the
// harness's counts, not accuracy. For the GGUF tests (test_gguf_qwen), `qwen2` as the third argument writes a
// Qwen2 checkpoint instead (q/k/v biases, no q/k norms), and `llama3` a Llama 3-style one: model_type llama,
// Llama 3.1's RoPE scaling, an untied output, and the tokenizer given Llama 3's pre-tokenizer and a BOS.
// `end_of_turn` writes a Qwen3 base-style checkpoint (config and generation_config eos <|endoftext|>, the
// tokenizer's <|im_end|>) whose greedy token is always <|im_end|>: its embedding row is 2s, the others 1s, every
// layer matrix is zero (so the residual stream is the input's row, and the tied output scores <|im_end|> highest).
// `nan_weights` writes the Qwen3 checkpoint with a final norm of NaNs (every logit NaN: zipage-logits' JSON).
//   make_eval_fixture OUT_DIR TOKENIZER_DIR [qwen2 | llama3 | end_of_turn | nan_weights]
#include <algorithm>
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
  const std::string variant = argc == 4 ? argv[3] : "qwen3";
  if (argc < 3 || argc > 4 ||
      (variant != "qwen3" && variant != "qwen2" && variant != "llama3" && variant != "end_of_turn" &&
       variant != "nan_weights")) {
    std::fprintf(stderr,
                 "usage: make_eval_fixture OUT_DIR TOKENIZER_DIR [qwen2 | llama3 | end_of_turn | nan_weights]\n");
    return 2;
  }
  const bool qwen2 = variant == "qwen2", llama3 = variant == "llama3", end_of_turn = variant == "end_of_turn",
             nan_weights = variant == "nan_weights";
  constexpr int im_end = 151645, endoftext = 151643;
  try {
    const fs::path out = argv[1], tok = argv[2];
    // Qwen2's and Llama's head size is hidden / heads (llama.cpp reads no other); Qwen3's is its own head_dim.
    const int hidden = 16, layers = 2, heads = 2, kv_heads = 1,
              head_dim = variant == "qwen3" || nan_weights ? 16 : 8, ffn = 32, vocab = 151936;
    fs::create_directories(out);
    nlohmann::json config = {
        {"architectures", {qwen2 ? "Qwen2ForCausalLM" : llama3 ? "LlamaForCausalLM" : "Qwen3ForCausalLM"}},
        {"model_type", qwen2 ? "qwen2" : llama3 ? "llama" : "qwen3"},
        {"hidden_size", hidden},
        {"num_hidden_layers", layers}, {"num_attention_heads", heads}, {"num_key_value_heads", kv_heads},
        {"head_dim", head_dim}, {"intermediate_size", ffn}, {"vocab_size", vocab}, {"rms_norm_eps", 1e-6},
        {"rope_theta", 1000000.0}, {"tie_word_embeddings", true}, {"hidden_act", "silu"},
        {"max_position_embeddings", 4096}, {"bos_token_id", endoftext},
        {"eos_token_id", end_of_turn ? endoftext : im_end}, {"torch_dtype", "bfloat16"}};
    if (llama3) {
      // Wavelengths 6, 167, 4,443 and 118,000 positions: one frequency each side of the scaled band and one in it.
      config["rope_theta"] = 500000.0;
      config["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
      config["tie_word_embeddings"] = false;
    }
    std::ofstream(out / "config.json") << config.dump(2) << "\n";
    nlohmann::json gen = {{"bos_token_id", endoftext}, {"do_sample", true}, {"eos_token_id", {im_end, endoftext}},
                          {"temperature", 0.6}, {"top_k", 20}, {"top_p", 0.95}};
    if (end_of_turn) gen["eos_token_id"] = endoftext;
    std::ofstream(out / "generation_config.json") << gen.dump(2) << "\n";
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      fs::copy_file(tok / f, out / f, fs::copy_options::overwrite_existing);
    if (llama3) {  // the Qwen3 vocabulary under Llama 3's pre-tokenizer (digits in threes), merges ignored, a BOS
      nlohmann::json t = nlohmann::json::parse(std::ifstream(tok / "tokenizer.json"));
      t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
          R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
      t["model"]["ignore_merges"] = true;
      t.erase("normalizer");  // Llama 3's tokenizer.json has none
      std::ofstream(out / "tokenizer.json") << t.dump() << "\n";
      nlohmann::json c = nlohmann::json::parse(std::ifstream(tok / "tokenizer_config.json"));
      c["bos_token"] = "<|endoftext|>";
      c["add_bos_token"] = true;
      std::ofstream(out / "tokenizer_config.json") << c.dump(2) << "\n";
    }

    std::mt19937 rng(20240611);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    zipage::safetensors::writer w;
    w.set_metadata("format", "pt");
    auto mat = [&](const std::string& name, int rows, int cols, float scale) {
      std::vector<float> v(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
      for (float& x : v) x = end_of_turn ? 0.0f : u(rng) * scale;
      if (end_of_turn && name == "model.embed_tokens.weight")
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = i / static_cast<std::size_t>(cols) == im_end ? 2.0f : 1.0f;
      w.add(name, {rows, cols}, v, zipage::safetensors::dtype::bf16);
    };
    auto vec = [&](const std::string& name, int n) {
      std::vector<float> v(static_cast<std::size_t>(n));
      for (float& x : v) x = 1.0f + 0.2f * u(rng);
      if (nan_weights && name == "model.norm.weight") std::fill(v.begin(), v.end(), std::nanf(""));
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
      } else if (!llama3) {
        vec(p + "self_attn.q_norm.weight", head_dim);
        vec(p + "self_attn.k_norm.weight", head_dim);
      }
      vec(p + "post_attention_layernorm.weight", hidden);
      mat(p + "mlp.gate_proj.weight", ffn, hidden, in_scale);
      mat(p + "mlp.up_proj.weight", ffn, hidden, in_scale);
      mat(p + "mlp.down_proj.weight", hidden, ffn, 1.0f / std::sqrt(float(ffn)));
    }
    vec("model.norm.weight", hidden);
    if (llama3) mat("lm_head.weight", vocab, hidden, in_scale);
    w.write(out / "model.safetensors");
    std::printf("make_eval_fixture: wrote %s\n", out.string().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_eval_fixture: error: %s\n", e.what());
    return 1;
  }
}
