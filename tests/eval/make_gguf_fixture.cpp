// Writes a Hugging Face Qwen2 / Qwen3 / Llama checkpoint directory (make_eval_fixture's) as a GGUF file the way
// llama.cpp's converter (convert_hf_to_gguf.py) writes one, with F32 tensors: the fixture of zipage's Qwen GGUF tests, and
// the file tests/gguf_oracle/run.sh hands to llama.cpp for its reference logits and token ids (so a convention
// this gets wrong shows up as llama.cpp disagreeing with zipage's Hugging Face path).
//   make_gguf_fixture HF_DIR OUT.gguf
// What it follows of the converter:
// - metadata <arch>.{block_count, context_length, embedding_length, feed_forward_length, attention.head_count,
//   attention.head_count_kv, rope.freq_base, attention.layer_norm_rms_epsilon, attention.key_length,
//   attention.value_length}; general.sampling.* from generation_config.json (top_k, top_p, temp);
// - tensor names (token_embd, blk.N.attn_{norm,q,k,v,output}, attn_{q,k}_norm, attn_{q,k,v}.bias, ffn_{norm,gate,
//   up,down}, output_norm, output unless tied); for `llama` the Q and K rows permuted (LlamaModel.permute) and
//   Llama 3's RoPE scaling as the divisors of rope_freqs.weight (LlamaModel.generate_extra_tensors, in float32);
// - the vocabulary: one token per id below vocab_size, [PAD<id>] (type 5) where the tokenizer has none, added
//   tokens as control (3) when special or "<|...|>"-looking, else user-defined (4), the rest normal (1); merges
//   as "left right"; tokenizer.ggml.pre = qwen2, or llama-bpe for Llama 3's regex; bos / eos / padding ids, add_bos_token and the chat template
//   from tokenizer_config.json (bos from config.json when the tokenizer has none).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "zipage/core/json.hpp"
#include "zipage/gguf/writer.hpp"
#include "zipage/safetensors/safetensors.hpp"

namespace fs = std::filesystem;
namespace gg = zipage::gguf;
namespace json = zipage::json;

namespace {

bool looks_special(const std::string& t) {
  return t.size() >= 4 && t.starts_with("<|") && t.ends_with("|>");
}

void write_vocab(gg::writer& w, const fs::path& dir, const json::value& config) {
  const json::value tok = json::parse_file(dir / "tokenizer.json", "tokenizer");
  const json::value cfg = json::parse_file(dir / "tokenizer_config.json", "tokenizer config");
  const int vocab_size = config.at("vocab_size").get<int>();
  std::map<int, std::string> text;
  std::map<int, int> type;
  for (const auto& [piece, id] : tok.at("model").at("vocab").items()) text[id.get<int>()] = piece, type[id.get<int>()] = 1;
  std::map<std::string, int> id_of;
  for (const auto& a : tok.at("added_tokens")) {
    const int id = a.at("id").get<int>();
    const std::string content = a.at("content").get<std::string>();
    text[id] = content;
    type[id] = (a.value("special", false) || looks_special(content)) ? 3 : 4;
  }
  for (const auto& [id, t] : text) id_of[t] = id;
  std::vector<std::string> tokens;
  std::vector<std::int32_t> types;
  for (int id = 0; id < vocab_size; ++id) {
    const auto it = text.find(id);
    tokens.push_back(it == text.end() ? "[PAD" + std::to_string(id) + "]" : it->second);
    types.push_back(it == text.end() ? 5 : type[id]);
  }
  std::vector<std::string> merges;
  for (const auto& m : tok.at("model").at("merges"))
    merges.push_back(m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>());
  w.set("tokenizer.ggml.model", "gpt2");
  const std::string regex = tok.at("pre_tokenizer").at("pretokenizers")[0].at("pattern").at("Regex").get<std::string>();
  w.set("tokenizer.ggml.pre", regex.find("\\p{N}{1,3}") != std::string::npos ? "llama-bpe" : "qwen2");
  w.set("tokenizer.ggml.tokens", tokens);
  w.set("tokenizer.ggml.token_type", types);
  w.set("tokenizer.ggml.merges", merges);
  auto token_id = [&](const char* key) -> int {
    const json::value* v = json::find(cfg, key);
    if (v == nullptr || v->is_null()) return -1;
    const std::string s = v->is_object() ? v->at("content").get<std::string>() : v->get<std::string>();
    return id_of.at(s);
  };
  const int eos = token_id("eos_token"), pad = token_id("pad_token");
  int bos = token_id("bos_token");
  if (bos < 0 && config.contains("bos_token_id")) bos = config.at("bos_token_id").get<int>();
  if (eos >= 0) w.set("tokenizer.ggml.eos_token_id", static_cast<std::uint32_t>(eos));
  if (bos >= 0) w.set("tokenizer.ggml.bos_token_id", static_cast<std::uint32_t>(bos));
  if (pad >= 0) w.set("tokenizer.ggml.padding_token_id", static_cast<std::uint32_t>(pad));
  if (cfg.contains("add_bos_token")) w.set("tokenizer.ggml.add_bos_token", cfg.at("add_bos_token").get<bool>());
  if (cfg.contains("chat_template")) w.set("tokenizer.chat_template", cfg.at("chat_template").get<std::string>());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: make_gguf_fixture HF_DIR OUT.gguf\n");
    return 2;
  }
  try {
    const fs::path dir = argv[1], out = argv[2];
    const json::value config = json::parse_file(dir / "config.json", "config");
    const std::string arch = config.at("model_type").get<std::string>();
    if (arch != "qwen2" && arch != "qwen3" && arch != "llama")
      throw std::runtime_error("model_type must be qwen2, qwen3 or llama, got " + arch);
    const int hidden = config.at("hidden_size").get<int>(), heads = config.at("num_attention_heads").get<int>();
    const int head_dim = config.value("head_dim", hidden / heads);
    gg::writer w;
    w.set("general.architecture", arch);
    w.set("general.name", dir.filename().string());
    w.set("general.file_type", static_cast<std::uint32_t>(0));  // all F32
    const std::string k = arch + ".";
    w.set(k + "block_count", static_cast<std::uint32_t>(config.at("num_hidden_layers").get<int>()));
    w.set(k + "context_length", static_cast<std::uint32_t>(config.at("max_position_embeddings").get<int>()));
    w.set(k + "embedding_length", static_cast<std::uint32_t>(hidden));
    w.set(k + "feed_forward_length", static_cast<std::uint32_t>(config.at("intermediate_size").get<int>()));
    w.set(k + "attention.head_count", static_cast<std::uint32_t>(heads));
    w.set(k + "attention.head_count_kv", static_cast<std::uint32_t>(config.at("num_key_value_heads").get<int>()));
    w.set(k + "rope.freq_base", config.at("rope_theta").get<float>());
    w.set(k + "attention.layer_norm_rms_epsilon", config.at("rms_norm_eps").get<float>());
    w.set(k + "attention.key_length", static_cast<std::uint32_t>(head_dim));
    w.set(k + "attention.value_length", static_cast<std::uint32_t>(head_dim));
    if (arch == "llama") {
      w.set(k + "rope.dimension_count", static_cast<std::uint32_t>(head_dim));
      w.set(k + "vocab_size", static_cast<std::uint32_t>(config.at("vocab_size").get<int>()));
    }
    if (fs::exists(dir / "generation_config.json")) {
      const json::value gen = json::parse_file(dir / "generation_config.json", "generation config");
      if (gen.contains("top_k")) w.set("general.sampling.top_k", gen.at("top_k").get<std::int32_t>());
      if (gen.contains("top_p")) w.set("general.sampling.top_p", gen.at("top_p").get<float>());
      if (gen.contains("temperature")) w.set("general.sampling.temp", gen.at("temperature").get<float>());
    }
    write_vocab(w, dir, config);

    const auto ckpt = zipage::safetensors::checkpoint::open(dir);
    const int kv_heads = config.at("num_key_value_heads").get<int>();
    // LlamaModel.permute: rows of each head reordered [2][half] -> [half][2], so RoPE rotates adjacent pairs.
    auto permute = [](std::vector<float>& v, std::int64_t rows, std::int64_t cols, int n_head) {
      const std::vector<float> src = v;
      const std::int64_t half = rows / n_head / 2;
      for (int h = 0; h < n_head; ++h)
        for (int two = 0; two < 2; ++two)
          for (std::int64_t j = 0; j < half; ++j) {
            const std::int64_t from = (h * 2 + two) * half + j, to = (h * half + j) * 2 + two;
            std::copy_n(src.begin() + from * cols, cols, v.begin() + to * cols);
          }
    };
    auto add = [&](const std::string& hf, const std::string& name) {
      const auto& t = ckpt.tensor(hf);
      std::vector<std::int64_t> dims(t.shape.rbegin(), t.shape.rend());  // GGUF lists the fastest dimension first
      std::vector<float> v = ckpt.to_f32(t);
      if (arch == "llama" && hf.ends_with("q_proj.weight")) permute(v, t.shape[0], t.shape[1], heads);
      if (arch == "llama" && hf.ends_with("k_proj.weight")) permute(v, t.shape[0], t.shape[1], kv_heads);
      w.add_tensor(name, dims, gg::tensor_type::f32, v);
    };
    if (const json::value* rs = json::find(config, "rope_scaling"); rs != nullptr && rs->value("rope_type", "") == "llama3") {
      const float base = config.at("rope_theta").get<float>(), factor = rs->value("factor", 8.0f);
      const float low = rs->value("low_freq_factor", 1.0f), high = rs->value("high_freq_factor", 4.0f);
      const float old_len = rs->value("original_max_position_embeddings", 8192.0f);
      std::vector<float> factors;
      for (int i = 0; i < head_dim; i += 2) {
        const float freq = 1.0f / std::pow(base, static_cast<float>(i) / static_cast<float>(head_dim));
        const float wavelen = 2.0f * 3.14159265358979323846f / freq;
        if (wavelen < old_len / high) {
          factors.push_back(1.0f);
        } else if (wavelen > old_len / low) {
          factors.push_back(factor);
        } else {
          const float smooth = (old_len / wavelen - low) / (high - low);
          factors.push_back(1.0f / ((1.0f - smooth) / factor + smooth));
        }
      }
      w.add_tensor("rope_freqs.weight", {static_cast<std::int64_t>(factors.size())}, gg::tensor_type::f32, factors);
    }
    add("model.embed_tokens.weight", "token_embd.weight");
    for (int l = 0; l < config.at("num_hidden_layers").get<int>(); ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".", b = "blk." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", b + "attn_norm.weight");
      for (const char* x : {"q", "k", "v"}) {
        add(p + "self_attn." + x + "_proj.weight", b + "attn_" + x + ".weight");
        if (ckpt.find(p + "self_attn." + x + "_proj.bias") != nullptr)
          add(p + "self_attn." + x + "_proj.bias", b + "attn_" + x + ".bias");
      }
      add(p + "self_attn.o_proj.weight", b + "attn_output.weight");
      if (arch == "qwen3") {
        add(p + "self_attn.q_norm.weight", b + "attn_q_norm.weight");
        add(p + "self_attn.k_norm.weight", b + "attn_k_norm.weight");
      }
      add(p + "post_attention_layernorm.weight", b + "ffn_norm.weight");
      add(p + "mlp.gate_proj.weight", b + "ffn_gate.weight");
      add(p + "mlp.up_proj.weight", b + "ffn_up.weight");
      add(p + "mlp.down_proj.weight", b + "ffn_down.weight");
    }
    add("model.norm.weight", "output_norm.weight");
    if (!config.value("tie_word_embeddings", false)) add("lm_head.weight", "output.weight");
    w.write(out);
    std::printf("make_gguf_fixture: wrote %s\n", out.string().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_gguf_fixture: error: %s\n", e.what());
    return 1;
  }
}
