#pragma once
// Loads a Hugging Face checkpoint directory (config.json + model.safetensors or sharded safetensors,
// optional generation_config.json) of Qwen3, Qwen2 or Llama into llama_model.
//
// Tensor names (HF stores nn.Linear weights [out][in], row-major — zipage's layout as is):
//   model.embed_tokens.weight                      [vocab][hidden]
//   model.layers.N.input_layernorm.weight          [hidden]
//   model.layers.N.self_attn.{q,k,v,o}_proj.weight
//   model.layers.N.self_attn.{q,k,v}_proj.bias     (qwen2)
//   model.layers.N.self_attn.{q,k}_norm.weight     [head_dim] (qwen3; applied per head before RoPE)
//   model.layers.N.post_attention_layernorm.weight [hidden]
//   model.layers.N.mlp.{gate,up,down}_proj.weight
//   model.norm.weight                              [hidden]
//   lm_head.weight                                 [vocab][hidden] (absent, or ignored, when tied)
// Every shape is checked; a tensor the model would not use (other than a tied lm_head or old
// rotary_emb.inv_freq buffers) is an error, so an unsupported variant never loads silently wrong.
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "zipage/backend/cpu/cpu_backend.hpp"
#include "zipage/core/error.hpp"
#include "zipage/core/json.hpp"
#include "zipage/models/hf_config.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/safetensors/safetensors.hpp"

namespace zipage {

namespace detail {

template <class Backend>
class hf_weight_reader {
 public:
  using tensor = typename Backend::tensor;
  hf_weight_reader(const safetensors::checkpoint& ckpt, const Backend& backend) : ckpt_(ckpt), backend_(backend) {}

  // A 2-D [rows][cols] tensor.
  tensor matrix(const std::string& name, int rows, int cols) {
    const auto& t = ckpt_.tensor(name);
    check(t.shape.size() == 2 && t.shape[0] == rows && t.shape[1] == cols, *t.file, ": tensor '", name,
          "' has shape ", t.shape_string(), ", expected [", rows, ", ", cols, "]");
    return load(t, rows, cols);
  }
  // A 1-D [n] tensor, as a [1][n] backend tensor.
  tensor vector(const std::string& name, int n) {
    const auto& t = ckpt_.tensor(name);
    check(t.shape.size() == 1 && t.shape[0] == n, *t.file, ": tensor '", name, "' has shape ", t.shape_string(),
          ", expected [", n, "]");
    return load(t, 1, n);
  }
  bool has(const std::string& name) const { return ckpt_.find(name) != nullptr; }
  void skip(const std::string& name) { used_.insert(name); }

  // Every tensor of the checkpoint must have been used (or skipped on purpose).
  void check_all_used() const {
    for (const safetensors::tensor_info* t : ckpt_.tensors()) {
      if (used_.count(t->name) != 0) continue;
      if (t->name.ends_with(".rotary_emb.inv_freq")) continue;  // recomputed buffers of old checkpoints
      fail(*t->file, ": unexpected tensor '", json::printable(t->name), "' (shape ", t->shape_string(),
           "): this model type does not use it");
    }
  }

 private:
  tensor load(const safetensors::tensor_info& t, int rows, int cols) {
    used_.insert(t.name);
    buffer_.resize(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
    ckpt_.to_f32(t, buffer_);
    return backend_.from_host(buffer_, rows, cols);
  }

  const safetensors::checkpoint& ckpt_;
  const Backend& backend_;
  std::set<std::string> used_;
  std::vector<float> buffer_;
};

}  // namespace detail

// Builds the model from a parsed config and opened tensors.
template <class Backend = cpu_backend>
llama_model<Backend> load_hf_model(const model_config& c, const safetensors::checkpoint& ckpt, const Backend& backend = {}) {
  c.validate();
  detail::hf_weight_reader<Backend> r(ckpt, backend);
  llama_weights<Backend> w;
  w.embedding = r.matrix("model.embed_tokens.weight", c.vocab_size, c.hidden_size);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    llama_layer_weights<Backend> lw;
    lw.attn_norm = r.vector(p + "input_layernorm.weight", c.hidden_size);
    lw.wq = r.matrix(p + "self_attn.q_proj.weight", c.q_size(), c.hidden_size);
    lw.wk = r.matrix(p + "self_attn.k_proj.weight", c.kv_size(), c.hidden_size);
    lw.wv = r.matrix(p + "self_attn.v_proj.weight", c.kv_size(), c.hidden_size);
    lw.wo = r.matrix(p + "self_attn.o_proj.weight", c.hidden_size, c.q_size());
    if (c.qkv_bias) {
      lw.bq = r.vector(p + "self_attn.q_proj.bias", c.q_size());
      lw.bk = r.vector(p + "self_attn.k_proj.bias", c.kv_size());
      lw.bv = r.vector(p + "self_attn.v_proj.bias", c.kv_size());
    }
    if (c.qk_norm) {
      lw.q_norm = r.vector(p + "self_attn.q_norm.weight", c.head_dim);
      lw.k_norm = r.vector(p + "self_attn.k_norm.weight", c.head_dim);
    }
    lw.ffn_norm = r.vector(p + "post_attention_layernorm.weight", c.hidden_size);
    lw.w_gate = r.matrix(p + "mlp.gate_proj.weight", c.ffn_size, c.hidden_size);
    lw.w_up = r.matrix(p + "mlp.up_proj.weight", c.ffn_size, c.hidden_size);
    lw.w_down = r.matrix(p + "mlp.down_proj.weight", c.hidden_size, c.ffn_size);
    w.layers.push_back(std::move(lw));
  }
  w.final_norm = r.vector("model.norm.weight", c.hidden_size);
  if (c.tied_embeddings) {
    r.skip("lm_head.weight");  // some exporters store the tied copy; the embedding is used either way
  } else {
    check(r.has("lm_head.weight"), ckpt.describe(),
          ": no tensor 'lm_head.weight' but the config has tie_word_embeddings = false");
    w.lm_head = r.matrix("lm_head.weight", c.vocab_size, c.hidden_size);
  }
  r.check_all_used();
  return llama_model<Backend>(c, std::move(w));
}

// The config of a checkpoint directory: config.json, plus the eos ids of generation_config.json if present.
inline model_config load_hf_checkpoint_config(const std::filesystem::path& dir) {
  model_config c = load_hf_config(dir);
  const auto gen = dir / "generation_config.json";
  std::error_code ec;
  if (std::filesystem::is_regular_file(gen, ec))
    merge_hf_generation_eos(c, json::parse_file(gen, "generation config"), gen.string());
  return c;
}

template <class Backend = cpu_backend>
llama_model<Backend> load_hf_checkpoint(const std::filesystem::path& dir, const Backend& backend = {}) {
  std::error_code ec;
  check(std::filesystem::is_directory(dir, ec), "'", dir.string(), "' is not a checkpoint directory");
  const model_config c = load_hf_checkpoint_config(dir);
  const auto ckpt = safetensors::checkpoint::open(dir);
  return load_hf_model(c, ckpt, backend);
}

}  // namespace zipage
