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
// FP8 checkpoints (Qwen3-*-FP8, models/hf_fp8.hpp): a matrix stored as F8_E4M3 needs its
// `<name>_scale_inv` block scales ([ceil(rows/br)][ceil(cols/bc)], finite and > 0) and a
// quantization_config in config.json; it is dequantised exactly at load into the backend's weights (and, on a
// backend with FP8 linear weights, re-quantised from those fp32 values: docs/fp8.md "FP8 weights").
// Every shape is checked; a tensor the model would not use (other than a tied lm_head or old
// rotary_emb.inv_freq buffers) is an error, so an unsupported variant never loads silently wrong.
#include <cmath>
#include <filesystem>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "zipage/backend/cpu/cpu_backend.hpp"
#include "zipage/core/error.hpp"
#include "zipage/core/json.hpp"
#include "zipage/models/hf_config.hpp"
#include "zipage/models/hf_fp8.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/safetensors/safetensors.hpp"

namespace zipage {

namespace detail {

template <class Backend>
class hf_weight_reader {
 public:
  using tensor = typename Backend::tensor;
  hf_weight_reader(const safetensors::checkpoint& ckpt, const Backend& backend, const hf_quantization& quant = {})
      : ckpt_(ckpt), backend_(backend), quant_(quant) {}

  // A 2-D [rows][cols] tensor. `linear`: a transformer block's linear weight, which a backend with
  // linear_weight_from_host (cuda_backend: FP8 weights, docs/fp8.md) stores its own way from the fp32 values.
  tensor matrix(const std::string& name, int rows, int cols, bool linear = false) {
    const auto& t = ckpt_.tensor(name);
    check(t.shape.size() == 2 && t.shape[0] == rows && t.shape[1] == cols, *t.file, ": tensor '", name,
          "' has shape ", t.shape_string(), ", expected [", rows, ", ", cols, "]");
    if (t.type == safetensors::dtype::f8_e4m3) return load_fp8(t, rows, cols, linear);
    return load(t, rows, cols, linear);
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
  tensor load(const safetensors::tensor_info& t, int rows, int cols, bool linear = false) {
    used_.insert(t.name);
    buffer_.resize(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
    ckpt_.to_f32(t, buffer_);
    return upload(rows, cols, linear);
  }

  tensor upload(int rows, int cols, bool linear) {
    if constexpr (requires { backend_.linear_weight_from_host(std::span<const float>(buffer_), rows, cols, true); })
      if (linear) return backend_.linear_weight_from_host(buffer_, rows, cols, quant_.fp8);
    return backend_.from_host(buffer_, rows, cols);
  }

  // An F8_E4M3 [rows][cols] weight and its `_scale_inv`, dequantised: decode(code) * scale.
  tensor load_fp8(const safetensors::tensor_info& t, int rows, int cols, bool linear) {
    check(quant_.fp8, *t.file, ": tensor '", json::printable(t.name),
          "' has dtype F8_E4M3 but config.json has no quantization_config (quant_method 'fp8')");
    const std::string scale_name = t.name + "_scale_inv";
    const safetensors::tensor_info* s = ckpt_.find(scale_name);
    check(s != nullptr, *t.file, ": FP8 tensor '", json::printable(t.name), "' has no scale tensor '",
          json::printable(scale_name), "'");
    const std::int64_t sr = quant_.scale_rows(rows), sc = quant_.scale_cols(cols);
    check(s->shape.size() == 2 && s->shape[0] == sr && s->shape[1] == sc, *s->file, ": scale tensor '",
          json::printable(scale_name), "' has shape ", s->shape_string(), ", expected [", sr, ", ", sc, "] (",
          t.shape_string(), " in ", quant_.block_rows, "x", quant_.block_cols, " blocks)");
    check(safetensors::is_loadable(s->type), *s->file, ": scale tensor '", json::printable(scale_name),
          "' has dtype ", safetensors::dtype_name(s->type), " (expected F32, BF16 or F16)");
    scale_.resize(static_cast<std::size_t>(sr * sc));
    ckpt_.to_f32(*s, scale_);
    for (std::size_t k = 0; k < scale_.size(); ++k)
      check(std::isfinite(scale_[k]) && scale_[k] > 0.0f, *s->file, ": scale tensor '", json::printable(scale_name),
            "' holds ", scale_[k], " at [", k / static_cast<std::size_t>(sc), ", ", k % static_cast<std::size_t>(sc),
            "] (block scales must be finite and > 0)");
    used_.insert(t.name);
    used_.insert(scale_name);
    buffer_.resize(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
    dequantize_fp8_blocks(ckpt_.fp8_e4m3_codes(t), rows, cols, scale_, quant_.block_rows, quant_.block_cols, buffer_,
                          *t.file + ": tensor '" + json::printable(t.name) + "'");
    return upload(rows, cols, linear);
  }

  const safetensors::checkpoint& ckpt_;
  const Backend& backend_;
  hf_quantization quant_;
  std::vector<float> scale_;
  std::set<std::string> used_;
  std::vector<float> buffer_;
};

}  // namespace detail

// Builds the model from a parsed config and opened tensors; `quant` is config.json's quantization_config
// (load_hf_quantization), none by default.
template <class Backend = cpu_backend>
llama_model<Backend> load_hf_model(const model_config& c, const safetensors::checkpoint& ckpt, const Backend& backend = {},
                                   const hf_quantization& quant = {}) {
  c.validate();
  detail::hf_weight_reader<Backend> r(ckpt, backend, quant);
  llama_weights<Backend> w;
  w.embedding = r.matrix("model.embed_tokens.weight", c.vocab_size, c.hidden_size);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    llama_layer_weights<Backend> lw;
    lw.attn_norm = r.vector(p + "input_layernorm.weight", c.hidden_size);
    lw.wq = r.matrix(p + "self_attn.q_proj.weight", c.q_size(), c.hidden_size, true);
    lw.wk = r.matrix(p + "self_attn.k_proj.weight", c.kv_size(), c.hidden_size, true);
    lw.wv = r.matrix(p + "self_attn.v_proj.weight", c.kv_size(), c.hidden_size, true);
    lw.wo = r.matrix(p + "self_attn.o_proj.weight", c.hidden_size, c.q_size(), true);
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
    lw.w_gate = r.matrix(p + "mlp.gate_proj.weight", c.ffn_size, c.hidden_size, true);
    lw.w_up = r.matrix(p + "mlp.up_proj.weight", c.ffn_size, c.hidden_size, true);
    lw.w_down = r.matrix(p + "mlp.down_proj.weight", c.hidden_size, c.ffn_size, true);
    fuse_projections(backend, lw);  // one layer at a time: the unfused copies never add up
    w.layers.push_back(std::move(lw));
  }
  w.final_norm = r.vector("model.norm.weight", c.hidden_size);
  if (c.tied_embeddings) {
    r.skip("lm_head.weight");  // some exporters store the tied copy; the embedding is used either way
    r.skip("lm_head.weight_scale_inv");  // ... quantised, in an FP8 checkpoint
  } else {
    check(r.has("lm_head.weight"), ckpt.describe(),
          ": no tensor 'lm_head.weight', which an untied output needs: config.json's tie_word_embeddings is false "
          "(or absent: false is transformers' default)");
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
    json::read_document_file(gen, "generation config",
                             [&](const json::value& doc) { merge_hf_generation_eos(c, doc, gen.string()); });
  return c;
}

template <class Backend = cpu_backend>
llama_model<Backend> load_hf_checkpoint(const std::filesystem::path& dir, const Backend& backend = {}) {
  std::error_code ec;
  check(std::filesystem::is_directory(dir, ec), "'", dir.string(), "' is not a checkpoint directory");
  const model_config c = load_hf_checkpoint_config(dir);
  const hf_quantization quant = load_hf_quantization(dir);
  const auto ckpt = safetensors::checkpoint::open(dir);
  return load_hf_model(c, ckpt, backend, quant);
}

}  // namespace zipage
