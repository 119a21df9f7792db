#pragma once
// Hugging Face config.json → zipage::model_config for the Llama family: model_type "llama", "qwen2"
// (Qwen2 / Qwen2.5 / DeepSeek-R1-Distill-Qwen) and "qwen3".
//
// Read (HF's defaults when a field is absent or null):
//   model_type, hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size (required)
//   num_key_value_heads (= num_attention_heads), head_dim (required for qwen3; else hidden_size / heads),
//   rope_theta (10000; transformers 5 writes it inside rope_parameters), rms_norm_eps (1e-6),
//   tie_word_embeddings (false), max_position_embeddings (0 = unknown), bos_token_id, eos_token_id
//   (an id or a list: the first becomes `eos`, the rest `extra_eos`), rope_scaling / rope_parameters
//   (type "default" or "llama3" with factor, low_freq_factor, high_freq_factor,
//   original_max_position_embeddings).
// Refused with an error naming the field: other model types, hidden_act other than silu, other RoPE
// scaling types, sliding-window attention, and the biases llama_model has no slot for (attention_bias on
// o_proj, mlp_bias). Hugging Face checkpoints rotate halves: rope_style::half.
// quantization_config (FP8 checkpoints, models/hf_fp8.hpp) is validated here, with errors naming the field,
// and read by the loader with hf_quantization_from_json / load_hf_quantization.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zipage/core/checked.hpp"
#include "zipage/core/error.hpp"
#include "zipage/core/json.hpp"
#include "zipage/model/model_config.hpp"
#include "zipage/models/hf_fp8.hpp"
#include "zipage/sampling/sampling_params.hpp"

namespace zipage {

namespace detail {

// A number field held as a float: one float cannot hold (past its range, or nonzero but rounding to 0) is an
// error naming the field, not a silent inf or 0.
inline float hf_float(const json::value& v, std::string_view src, std::string_view field) {
  return checked_float(json::as_number(v, src, field), detail::concat(src, ": field '", field, "'"));
}

inline int hf_positive_int(const json::value& cfg, std::string_view key, std::string_view src) {
  return static_cast<int>(json::as_int(json::require(cfg, key, src), src, key, 1, (1LL << 31) - 1));
}

// eos_token_id / bos_token_id: an id, a list of ids, or null.
inline std::vector<token_id> hf_token_ids(const json::value& cfg, std::string_view key, std::string_view src) {
  std::vector<token_id> ids;
  const json::value* v = json::find(cfg, key);
  if (v == nullptr) return ids;
  if (v->is_array()) {
    for (std::size_t i = 0; i < v->size(); ++i)
      ids.push_back(static_cast<token_id>(
          json::as_int((*v)[i], src, std::string(key) + "[" + std::to_string(i) + "]", 0, (1LL << 31) - 1)));
  } else {
    ids.push_back(static_cast<token_id>(json::as_int(*v, src, key, 0, (1LL << 31) - 1)));
  }
  return ids;
}

inline void hf_rope_scaling(const json::value& cfg, const std::string& src, model_config& c) {
  // transformers < 5: rope_theta + rope_scaling; transformers 5: rope_parameters {rope_type, rope_theta, ...}.
  const json::value* params = json::find(cfg, "rope_parameters");
  const json::value* scaling = json::find(cfg, "rope_scaling");
  std::string field = "rope_scaling";
  if (params != nullptr) {
    check(params->is_object(), src, ": field 'rope_parameters' must be an object, got ", json::type_name(*params));
    if (json::find(*params, "rope_theta"))
      c.rope_theta = detail::hf_float(params->at("rope_theta"), src, "rope_parameters.rope_theta");
    if (scaling == nullptr) {
      scaling = params;
      field = "rope_parameters";
    }
  }
  if (scaling == nullptr) return;
  check(scaling->is_object(), src, ": field '", field, "' must be an object, got ", json::type_name(*scaling));
  const json::value* type = json::find(*scaling, "rope_type");
  if (type == nullptr) type = json::find(*scaling, "type");
  const std::string kind = type ? json::as_string(*type, src, field + ".rope_type") : "default";
  if (kind == "default") return;
  check(kind == "llama3", src, ": ", field, ".rope_type '", json::printable(kind),
        "' is not supported (zipage implements 'default' and 'llama3')");
  auto number = [&](const char* key) {
    return detail::hf_float(json::require(*scaling, key, src + std::string(": ") + field), src, field + "." + key);
  };
  auto& s = c.rope_scaling;
  s.type = rope_scaling_type::llama3;
  s.factor = number("factor");
  s.low_freq_factor = number("low_freq_factor");
  s.high_freq_factor = number("high_freq_factor");
  s.original_max_position = static_cast<int>(json::as_int(
      json::require(*scaling, "original_max_position_embeddings", src + std::string(": ") + field), src,
      field + ".original_max_position_embeddings", 1, (1LL << 31) - 1));
}

}  // namespace detail

// `source` names the config in errors.
inline model_config hf_config_from_json(const json::value& cfg, std::string_view source = "config.json") {
  const std::string src(source);
  check(cfg.is_object(), src, ": must be a JSON object, got ", json::type_name(cfg));
  const std::string& type = json::as_string(json::require(cfg, "model_type", src), src, "model_type");
  check(type == "qwen3" || type == "qwen2" || type == "llama", src, ": model_type '", json::printable(type),
        "' is not supported (zipage loads qwen3, qwen2 and llama)");
  model_config c;
  c.architecture = type;
  c.rope = rope_style::half;
  c.hidden_size = detail::hf_positive_int(cfg, "hidden_size", src);
  c.num_layers = detail::hf_positive_int(cfg, "num_hidden_layers", src);
  c.num_q_heads = detail::hf_positive_int(cfg, "num_attention_heads", src);
  c.num_kv_heads = json::find(cfg, "num_key_value_heads") ? detail::hf_positive_int(cfg, "num_key_value_heads", src)
                                                          : c.num_q_heads;
  check(c.num_q_heads % c.num_kv_heads == 0, src, ": num_attention_heads (", c.num_q_heads,
        ") is not a multiple of num_key_value_heads (", c.num_kv_heads, ")");
  c.ffn_size = detail::hf_positive_int(cfg, "intermediate_size", src);
  c.vocab_size = detail::hf_positive_int(cfg, "vocab_size", src);
  if (json::find(cfg, "head_dim")) {
    c.head_dim = detail::hf_positive_int(cfg, "head_dim", src);
  } else {
    check(type != "qwen3", src, ": missing field 'head_dim' (Qwen3 configs give it explicitly)");
    check(c.hidden_size % c.num_q_heads == 0, src, ": hidden_size ", c.hidden_size,
          " is not divisible by num_attention_heads ", c.num_q_heads, " and there is no head_dim");
    c.head_dim = c.hidden_size / c.num_q_heads;
  }
  check(c.head_dim % 2 == 0, src, ": head_dim ", c.head_dim, " must be even for RoPE");
  // Each field passes its own range check; their products must too (they size the q/k/v rows).
  for (const auto& [heads, name] : {std::pair{c.num_q_heads, "num_attention_heads"}, std::pair{c.num_kv_heads, "num_key_value_heads"}}) {
    const std::int64_t width = std::int64_t{heads} * c.head_dim;
    check(width <= std::numeric_limits<int>::max(), src, ": ", name, " (", heads, ") x head_dim (", c.head_dim, ") = ",
          width, " is too large (a q/k/v row holds at most ", std::numeric_limits<int>::max(), " values)");
  }
  c.max_context = static_cast<int>(json::get_int(cfg, "max_position_embeddings", src, 0, 0, (1LL << 31) - 1));
  // Checked after narrowing to float: 1e300 passes as a double and becomes inf in the model.
  if (const json::value* v = json::find(cfg, "rope_theta")) c.rope_theta = detail::hf_float(*v, src, "rope_theta");
  detail::hf_rope_scaling(cfg, src, c);
  check(std::isfinite(c.rope_theta) && c.rope_theta > 0.0f, src, ": rope_theta must be finite and positive, got ",
        c.rope_theta);
  c.rms_eps = 1e-6f;
  if (const json::value* v = json::find(cfg, "rms_norm_eps")) c.rms_eps = detail::hf_float(*v, src, "rms_norm_eps");
  check(std::isfinite(c.rms_eps) && c.rms_eps > 0.0f, src, ": rms_norm_eps must be finite and positive, got ",
        c.rms_eps);
  c.tied_embeddings = json::get_bool(cfg, "tie_word_embeddings", src, false);

  if (const json::value* act = json::find(cfg, "hidden_act")) {
    const std::string& a = json::as_string(*act, src, "hidden_act");
    check(a == "silu", src, ": hidden_act '", json::printable(a), "' is not supported (zipage implements silu)");
  }
  check(!json::get_bool(cfg, "use_sliding_window", src, false), src,
        ": use_sliding_window = true is not supported (zipage attends over the full context)");
  if (const json::value* layers = json::find(cfg, "layer_types")) {
    check(layers->is_array(), src, ": field 'layer_types' must be an array, got ", json::type_name(*layers));
    for (std::size_t i = 0; i < layers->size(); ++i) {
      const auto& t = json::as_string((*layers)[i], src, "layer_types[" + std::to_string(i) + "]");
      check(t == "full_attention", src, ": layer_types[", i, "] = '", json::printable(t),
            "' is not supported (zipage implements full_attention)");
    }
  }
  check(!json::get_bool(cfg, "mlp_bias", src, false), src, ": mlp_bias = true is not supported");
  if (type == "qwen2") {
    c.qkv_bias = true;  // Qwen2 always has q/k/v biases and no o_proj bias
  } else {
    check(!json::get_bool(cfg, "attention_bias", src, false), src,
          ": attention_bias = true is not supported (it adds an o_proj bias, which llama_model does not have)");
  }
  c.qk_norm = type == "qwen3";
  (void)hf_quantization_from_json(cfg, src);  // refuses what the loader cannot load, before any weight is read

  const auto bos = detail::hf_token_ids(cfg, "bos_token_id", src);
  const auto eos = detail::hf_token_ids(cfg, "eos_token_id", src);
  c.bos = bos.empty() ? -1 : bos.front();
  c.eos = eos.empty() ? -1 : eos.front();
  for (std::size_t i = 1; i < eos.size(); ++i) c.extra_eos.push_back(eos[i]);
  try {
    c.validate();
  } catch (const error& e) {
    fail(src, ": ", e.what());
  }
  return c;
}

inline model_config hf_config_from_string(std::string_view text, std::string_view source = "config.json") {
  return json::read_document(text, source, [&](const json::value& cfg) { return hf_config_from_json(cfg, source); });
}

// `path` is a config.json or a directory holding one.
inline model_config load_hf_config(const std::filesystem::path& path) {
  std::error_code ec;
  const auto file = std::filesystem::is_directory(path, ec) ? path / "config.json" : path;
  return json::read_document_file(file, "model config",
                                  [&](const json::value& cfg) { return hf_config_from_json(cfg, file.string()); });
}

// The quantization_config of a config.json (or of the directory holding one); none when it has none.
inline hf_quantization load_hf_quantization(const std::filesystem::path& path) {
  std::error_code ec;
  const auto file = std::filesystem::is_directory(path, ec) ? path / "config.json" : path;
  return json::read_document_file(file, "model config", [&](const json::value& cfg) {
    return hf_quantization_from_json(cfg, file.string());
  });
}

// Adds the eos ids of a generation_config.json (an id or a list) that the config does not list already.
inline void merge_hf_generation_eos(model_config& c, const json::value& gen, std::string_view source) {
  check(gen.is_object(), source, ": must be a JSON object, got ", json::type_name(gen));
  for (token_id id : detail::hf_token_ids(gen, "eos_token_id", source)) {
    check(id < c.vocab_size, source, ": eos_token_id ", id, " outside the vocabulary of ", c.vocab_size);
    if (c.eos < 0) {
      c.eos = id;
    } else if (id != c.eos && std::find(c.extra_eos.begin(), c.extra_eos.end(), id) == c.extra_eos.end()) {
      c.extra_eos.push_back(id);
    }
  }
}

// The sampling defaults a checkpoint sets (vLLM's default `--generation-config auto`): its
// generation_config.json, or a GGUF file's general.sampling.* keys (models/gguf_generation.hpp). Each field
// holds a value only when the file sets it (a null counts as absent); a field it does not set keeps
// sampling_params' own default, which is vLLM's and OpenAI's (temperature 1, no filters). `do_sample: false`
// means greedy decoding, as in transformers (vLLM ignores do_sample and applies the values).
struct generation_defaults {
  std::optional<bool> do_sample;
  std::optional<float> temperature;
  std::optional<int> top_k;  // as written: -1 (vLLM's off) or 0 (transformers' off) or k; apply() writes 0 for off
  std::optional<float> top_p;
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
  // max_new_tokens: the output length of a request that sets none (vLLM maps it to max_tokens' default).
  std::optional<int> max_new_tokens;
  std::string source;  // the file they came from; empty when there was none
  std::vector<std::string> ignored;  // settings the file turns on that zipage has no sampler for (GGUF only)

  [[nodiscard]] bool sets_sampling() const {
    return do_sample || temperature || top_k || top_p || min_p || repetition_penalty;
  }
  // Writes the values the file sets into `p` (max_new_tokens as max_tokens); with do_sample false,
  // temperature 0 (greedy) and the filters as set (they do not matter to greedy decoding).
  void apply(sampling_params& p) const {
    if (temperature) p.temperature = *temperature;
    if (top_k) p.top_k = std::max(*top_k, 0);  // -1 is vLLM's "off", zipage's 0
    if (top_p) p.top_p = *top_p;
    if (min_p) p.min_p = *min_p;
    if (repetition_penalty) p.repetition_penalty = *repetition_penalty;
    if (do_sample && !*do_sample) p.temperature = 0.0f;
    if (max_new_tokens) p.max_tokens = *max_new_tokens;
  }
  // What a request that sets nothing samples with: sampling_params' defaults (vLLM's) with the file's values.
  [[nodiscard]] sampling_params defaults() const {
    sampling_params p;
    apply(p);
    return p;
  }
};

// Reads the sampling fields of a parsed generation_config.json; a value of the wrong type or out of range
// is an error naming `source` and the field. top_k 0 and -1 both mean off, as vLLM reads them (transformers
// skips top-k at 0; vLLM's own default is -1); below -1 is an error, as in vLLM.
inline generation_defaults generation_defaults_from_json(const json::value& gen, std::string_view source) {
  check(gen.is_object(), source, ": must be a JSON object, got ", json::type_name(gen));
  generation_defaults d;
  d.source = std::string(source);
  if (const auto* v = json::find(gen, "do_sample")) d.do_sample = json::as_bool(*v, source, "do_sample");
  auto number = [&](std::string_view key, auto in_range, std::string_view range) -> std::optional<float> {
    const auto* v = json::find(gen, key);
    if (v == nullptr) return std::nullopt;
    const double x = json::as_number(*v, source, key);
    check(in_range(x), source, ": field '", key, "' = ", x, " must be ", range);
    return checked_float(x, detail::concat(source, ": field '", key, "'"));  // 1e300: an inf temperature
  };
  d.temperature = number("temperature", [](double x) { return x >= 0.0; }, ">= 0 (0 = greedy)");
  d.top_p = number("top_p", [](double x) { return x > 0.0 && x <= 1.0; }, "in (0, 1]");
  d.min_p = number("min_p", [](double x) { return x >= 0.0 && x <= 1.0; }, "in [0, 1]");
  d.repetition_penalty = number("repetition_penalty", [](double x) { return x > 0.0; }, "> 0 (1 = off)");
  if (const auto* v = json::find(gen, "top_k"))
    d.top_k = static_cast<int>(json::as_int(*v, source, "top_k", -1, (1LL << 31) - 1));
  // transformers refuses max_new_tokens <= 0 (GenerationConfig.validate), so zipage does too.
  if (const auto* v = json::find(gen, "max_new_tokens"))
    d.max_new_tokens = static_cast<int>(json::as_int(*v, source, "max_new_tokens", 1, (1LL << 31) - 1));
  return d;
}

// The sampling defaults of checkpoint directory `dir` (its generation_config.json); nothing set when the
// file is absent. Invalid JSON or a malformed value is an error naming the file and the field.
inline generation_defaults load_generation_config(const std::filesystem::path& dir) {
  const auto file = dir / "generation_config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) return {};
  return json::read_document_file(file, "generation config", [&](const json::value& gen) {
    return generation_defaults_from_json(gen, file.string());
  });
}

}  // namespace zipage
