// Tests for Hugging Face checkpoints: config.json parsing (Qwen3, Qwen2 / DeepSeek-R1-Distill-Qwen, Llama,
// including Llama 3.1 RoPE scaling and transformers 5's rope_parameters) with its errors; Llama 3 frequency
// scaling against hand-computed values; and tiny random checkpoints written here (config.json +
// safetensors) that load, match an independent double-precision forward pass written in this file, and
// generate through the engine.
#include <doctest/doctest.h>

#include "prefill_logits.hpp"
#include "test_support.hpp"

#include <zipage/engine/engine.hpp>
#include <zipage/models/hf_config.hpp>
#include <zipage/models/hf_loader.hpp>
#include <zipage/safetensors/writer.hpp>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <numbers>
#include <numeric>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

namespace fs = std::filesystem;
namespace st = zipage::safetensors;
using zipage::model_config;
using zipage::token_id;

namespace {

using zipage::testing::contains;
using zipage::testing::error_of;
using zipage::testing::temp_dir;




std::string config_error(const std::string& json) {
  return error_of([&] { (void)zipage::hf_config_from_string(json); });
}

// ---------------------------------------------------------------------------------------------
// Tiny random checkpoints
// ---------------------------------------------------------------------------------------------

struct tensor_data {
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};
using weight_map = std::map<std::string, tensor_data>;

struct tiny_spec {
  std::string type = "llama";  // qwen3, qwen2, llama
  int hidden = 32, layers = 2, heads = 4, kv_heads = 2, head_dim = 8, ffn = 48, vocab = 96;
  bool tied = false;
  float theta = 10000.0f;
  bool llama3_scaling = false;  // factor 4, low 1, high 4, original 64 (so the tiny head_dim sees all regimes)
  std::uint32_t seed = 1;
};

nlohmann::json config_json(const tiny_spec& s) {
  nlohmann::json c = {{"model_type", s.type},         {"hidden_size", s.hidden},       {"num_hidden_layers", s.layers},
                      {"num_attention_heads", s.heads}, {"num_key_value_heads", s.kv_heads}, {"intermediate_size", s.ffn},
                      {"vocab_size", s.vocab},          {"rms_norm_eps", 1e-6},          {"rope_theta", s.theta},
                      {"tie_word_embeddings", s.tied},  {"hidden_act", "silu"},          {"max_position_embeddings", 256},
                      {"bos_token_id", 1},              {"eos_token_id", 2}};
  if (s.type == "qwen3" || s.head_dim != s.hidden / s.heads) c["head_dim"] = s.head_dim;
  if (s.llama3_scaling)
    c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 4.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 64}};
  return c;
}

weight_map random_weights(const tiny_spec& s) {
  std::mt19937 rng(s.seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  weight_map w;
  auto mat = [&](const std::string& name, int rows, int cols, float scale) {
    tensor_data t{{rows, cols}, std::vector<float>(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols))};
    for (float& x : t.values) x = u(rng) * scale;
    w[name] = std::move(t);
  };
  auto vec = [&](const std::string& name, int n, float center, float spread) {
    tensor_data t{{n}, std::vector<float>(static_cast<std::size_t>(n))};
    for (float& x : t.values) x = center + spread * u(rng);
    w[name] = std::move(t);
  };
  const int q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  const float in_scale = 1.0f / std::sqrt(float(s.hidden));
  mat("model.embed_tokens.weight", s.vocab, s.hidden, 1.0f);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    vec(p + "input_layernorm.weight", s.hidden, 1.0f, 0.2f);
    mat(p + "self_attn.q_proj.weight", q, s.hidden, 2.0f * in_scale);
    mat(p + "self_attn.k_proj.weight", kv, s.hidden, 2.0f * in_scale);
    mat(p + "self_attn.v_proj.weight", kv, s.hidden, in_scale);
    mat(p + "self_attn.o_proj.weight", s.hidden, q, 1.0f / std::sqrt(float(q)));
    if (s.type == "qwen2") {
      vec(p + "self_attn.q_proj.bias", q, 0.0f, 0.5f);
      vec(p + "self_attn.k_proj.bias", kv, 0.0f, 0.5f);
      vec(p + "self_attn.v_proj.bias", kv, 0.0f, 0.5f);
    }
    if (s.type == "qwen3") {
      vec(p + "self_attn.q_norm.weight", s.head_dim, 1.0f, 0.5f);
      vec(p + "self_attn.k_norm.weight", s.head_dim, 1.0f, 0.5f);
    }
    vec(p + "post_attention_layernorm.weight", s.hidden, 1.0f, 0.2f);
    mat(p + "mlp.gate_proj.weight", s.ffn, s.hidden, in_scale);
    mat(p + "mlp.up_proj.weight", s.ffn, s.hidden, in_scale);
    mat(p + "mlp.down_proj.weight", s.hidden, s.ffn, 1.0f / std::sqrt(float(s.ffn)));
  }
  vec("model.norm.weight", s.hidden, 1.0f, 0.2f);
  if (!s.tied) mat("lm_head.weight", s.vocab, s.hidden, 1.0f);
  return w;
}

// Rounds every value to bfloat16 (what a BF16 checkpoint holds).
void round_to_bf16(weight_map& w) {
  for (auto& [name, t] : w)
    for (float& x : t.values) x = zipage::bf16_to_f32(zipage::f32_to_bf16(x));
}

void write_safetensors(const fs::path& file, const weight_map& w, st::dtype type = st::dtype::f32) {
  st::writer wr;
  wr.set_metadata("format", "pt");
  for (const auto& [name, t] : w) wr.add(name, t.shape, t.values, type);
  wr.write(file);
}

void write_checkpoint(const fs::path& dir, const nlohmann::json& config, const weight_map& w,
                      st::dtype type = st::dtype::f32) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump(2);
  write_safetensors(dir / "model.safetensors", w, type);
}

// ---------------------------------------------------------------------------------------------
// An independent reference forward pass (double precision, straight from the HF modelling code's
// definitions): RMSNorm, GQA attention with per-head q/k norm before RoPE over rotated halves,
// SwiGLU MLP.
// ---------------------------------------------------------------------------------------------

struct ref_model {
  tiny_spec s;
  const weight_map* w;

  const std::vector<float>& get(const std::string& name) const { return w->at(name).values; }

  // y[r] = sum_c W[r][c] x[c] (+ b[r])
  static std::vector<double> matvec(const std::vector<float>& W, int rows, int cols, const std::vector<double>& x,
                                    const std::vector<float>* b = nullptr) {
    std::vector<double> y(static_cast<std::size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      double acc = b ? (*b)[static_cast<std::size_t>(r)] : 0.0;
      for (int c = 0; c < cols; ++c) acc += double(W[static_cast<std::size_t>(r) * cols + c]) * x[static_cast<std::size_t>(c)];
      y[static_cast<std::size_t>(r)] = acc;
    }
    return y;
  }
  static void rmsnorm(std::vector<double>& x, std::size_t off, int n, const std::vector<float>& g, double eps) {
    double ss = 0;
    for (int i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
    const double inv = 1.0 / std::sqrt(ss / n + eps);
    for (int i = 0; i < n; ++i) x[off + i] = x[off + i] * inv * g[static_cast<std::size_t>(i)];
  }
  // Llama 3.1's published scaling of one inverse frequency.
  double inv_freq(int i) const {
    const double f = std::pow(double(s.theta), -2.0 * i / s.head_dim);
    if (!s.llama3_scaling) return f;
    const double factor = 4, low = 1, high = 4, old = 64;
    const double wavelen = 2 * std::numbers::pi / f;
    if (wavelen < old / high) return f;
    if (wavelen > old / low) return f / factor;
    const double smooth = (old / wavelen - low) / (high - low);
    return (1 - smooth) * f / factor + smooth * f;
  }
  void rope(std::vector<double>& x, int heads, int pos) const {
    const int half = s.head_dim / 2;
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < half; ++i) {
        const double a = pos * inv_freq(i);
        double& x0 = x[static_cast<std::size_t>(h * s.head_dim + i)];
        double& x1 = x[static_cast<std::size_t>(h * s.head_dim + i + half)];
        const double r0 = x0 * std::cos(a) - x1 * std::sin(a), r1 = x0 * std::sin(a) + x1 * std::cos(a);
        x0 = r0;
        x1 = r1;
      }
  }

  // Logits [tokens][vocab].
  std::vector<std::vector<double>> forward(const std::vector<token_id>& tokens) const {
    const int T = static_cast<int>(tokens.size()), H = s.hidden, D = s.head_dim;
    const int q_size = s.heads * D, kv_size = s.kv_heads * D, group = s.heads / s.kv_heads;
    const double eps = 1e-6;
    std::vector<std::vector<double>> x(static_cast<std::size_t>(T));
    const auto& emb = get("model.embed_tokens.weight");
    for (int t = 0; t < T; ++t)
      x[static_cast<std::size_t>(t)].assign(emb.begin() + std::ptrdiff_t{tokens[static_cast<std::size_t>(t)]} * H,
                                            emb.begin() + (std::ptrdiff_t{tokens[static_cast<std::size_t>(t)]} + 1) * H);
    for (int l = 0; l < s.layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      const bool bias = s.type == "qwen2", qk = s.type == "qwen3";
      std::vector<std::vector<double>> q(static_cast<std::size_t>(T)), k(q.size()), v(q.size());
      for (int t = 0; t < T; ++t) {
        auto h = x[static_cast<std::size_t>(t)];
        rmsnorm(h, 0, H, get(p + "input_layernorm.weight"), eps);
        q[t] = matvec(get(p + "self_attn.q_proj.weight"), q_size, H, h, bias ? &get(p + "self_attn.q_proj.bias") : nullptr);
        k[t] = matvec(get(p + "self_attn.k_proj.weight"), kv_size, H, h, bias ? &get(p + "self_attn.k_proj.bias") : nullptr);
        v[t] = matvec(get(p + "self_attn.v_proj.weight"), kv_size, H, h, bias ? &get(p + "self_attn.v_proj.bias") : nullptr);
        if (qk) {
          for (int hd = 0; hd < s.heads; ++hd) rmsnorm(q[t], static_cast<std::size_t>(hd * D), D, get(p + "self_attn.q_norm.weight"), eps);
          for (int hd = 0; hd < s.kv_heads; ++hd) rmsnorm(k[t], static_cast<std::size_t>(hd * D), D, get(p + "self_attn.k_norm.weight"), eps);
        }
        rope(q[t], s.heads, t);
        rope(k[t], s.kv_heads, t);
      }
      for (int t = 0; t < T; ++t) {
        std::vector<double> attn(static_cast<std::size_t>(q_size), 0.0);
        for (int hd = 0; hd < s.heads; ++hd) {
          const int kvh = hd / group;
          std::vector<double> sc(static_cast<std::size_t>(t + 1));
          double mx = -1e300;
          for (int j = 0; j <= t; ++j) {
            double dot = 0;
            for (int i = 0; i < D; ++i) dot += q[t][hd * D + i] * k[j][kvh * D + i];
            sc[j] = dot / std::sqrt(double(D));
            mx = std::max(mx, sc[j]);
          }
          double den = 0;
          for (double& z : sc) den += (z = std::exp(z - mx));
          for (int j = 0; j <= t; ++j)
            for (int i = 0; i < D; ++i) attn[hd * D + i] += sc[j] / den * v[j][kvh * D + i];
        }
        const auto o = matvec(get(p + "self_attn.o_proj.weight"), H, q_size, attn);
        for (int i = 0; i < H; ++i) x[t][i] += o[i];
        auto h = x[t];
        rmsnorm(h, 0, H, get(p + "post_attention_layernorm.weight"), eps);
        auto g = matvec(get(p + "mlp.gate_proj.weight"), s.ffn, H, h);
        const auto up = matvec(get(p + "mlp.up_proj.weight"), s.ffn, H, h);
        for (int i = 0; i < s.ffn; ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * up[i];
        const auto d = matvec(get(p + "mlp.down_proj.weight"), H, s.ffn, g);
        for (int i = 0; i < H; ++i) x[t][i] += d[i];
      }
    }
    std::vector<std::vector<double>> logits;
    for (int t = 0; t < T; ++t) {
      auto h = x[t];
      rmsnorm(h, 0, H, get("model.norm.weight"), eps);
      logits.push_back(matvec(get(s.tied ? "model.embed_tokens.weight" : "lm_head.weight"), s.vocab, H, h));
    }
    return logits;
  }
};

using model_type = zipage::llama_model<zipage::cpu_backend>;

// One prefill of a single sequence with full KV, returning the logits of every position [T][vocab].
std::vector<std::vector<float>> model_logits(model_type& m, const std::vector<token_id>& tokens) {
  const auto& c = m.config();
  const int T = static_cast<int>(tokens.size());
  const auto flat = zipage::testing::prefill_logits(m, tokens);
  std::vector<std::vector<float>> out;
  for (int t = 0; t < T; ++t)
    out.emplace_back(flat.begin() + std::ptrdiff_t{t} * c.vocab_size, flat.begin() + std::ptrdiff_t{t + 1} * c.vocab_size);
  return out;
}

// max |a - b| over all entries, relative to max |b|.
double max_rel_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<double>>& b) {
  double diff = 0, scale = 0;
  for (std::size_t t = 0; t < a.size(); ++t)
    for (std::size_t i = 0; i < a[t].size(); ++i) {
      diff = std::max(diff, std::abs(double(a[t][i]) - b[t][i]));
      scale = std::max(scale, std::abs(b[t][i]));
    }
  return diff / scale;
}

const std::vector<token_id> prompt{1, 17, 42, 5, 88, 23, 9, 64, 3, 31, 77, 12, 50, 6, 95, 40, 11, 70};

}  // namespace

// ---------------------------------------------------------------------------------------------
// config.json
// ---------------------------------------------------------------------------------------------

TEST_CASE("hf config: Qwen3 (shaped like Qwen3-0.6B)") {
  const auto c = zipage::hf_config_from_string(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
    "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
    "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 151936})");
  CHECK(c.architecture == "qwen3");
  CHECK(c.hidden_size == 1024);
  CHECK(c.num_layers == 28);
  CHECK(c.num_q_heads == 16);
  CHECK(c.num_kv_heads == 8);
  CHECK(c.head_dim == 128);  // explicit, != 1024 / 16
  CHECK(c.q_size() == 2048);
  CHECK(c.ffn_size == 3072);
  CHECK(c.vocab_size == 151936);
  CHECK(c.max_context == 40960);
  CHECK(c.rope_theta == 1000000.0f);
  CHECK(c.rms_eps == doctest::Approx(1e-6));
  CHECK(c.rope == zipage::rope_style::half);
  CHECK_FALSE(c.rope_scaling.enabled());
  CHECK(c.tied_embeddings);
  CHECK(c.qk_norm);
  CHECK_FALSE(c.qkv_bias);
  CHECK(c.bos == 151643);
  CHECK(c.eos == 151645);
  CHECK(c.extra_eos.empty());
}

TEST_CASE("hf config: Qwen2 (shaped like DeepSeek-R1-Distill-Qwen-1.5B)") {
  const auto c = zipage::hf_config_from_string(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 1536, "initializer_range": 0.02,
    "intermediate_size": 8960, "max_position_embeddings": 131072, "max_window_layers": 21, "model_type": "qwen2",
    "num_attention_heads": 12, "num_hidden_layers": 28, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 10000, "sliding_window": 4096, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_cache": true, "use_mrope": false, "use_sliding_window": false, "vocab_size": 151936})");
  CHECK(c.architecture == "qwen2");
  CHECK(c.head_dim == 128);  // hidden_size / heads
  CHECK(c.num_kv_heads == 2);
  CHECK(c.gqa_group() == 6);
  CHECK(c.qkv_bias);
  CHECK_FALSE(c.qk_norm);
  CHECK_FALSE(c.tied_embeddings);
  CHECK(c.rope_theta == 10000.0f);
  CHECK(c.eos == 151643);
}

TEST_CASE("hf config: Llama 3.1 with llama3 RoPE scaling, eos list") {
  const auto c = zipage::hf_config_from_string(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": false,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 128256})");
  CHECK(c.architecture == "llama");
  CHECK(c.head_dim == 128);
  CHECK(c.rms_eps == doctest::Approx(1e-5));
  CHECK(c.rope_theta == 500000.0f);
  CHECK(c.rope_scaling.type == zipage::rope_scaling_type::llama3);
  CHECK(c.rope_scaling.factor == 8.0f);
  CHECK(c.rope_scaling.low_freq_factor == 1.0f);
  CHECK(c.rope_scaling.high_freq_factor == 4.0f);
  CHECK(c.rope_scaling.original_max_position == 8192);
  CHECK(c.bos == 128000);
  CHECK(c.eos == 128001);
  CHECK(c.extra_eos == std::vector<token_id>{128008, 128009});
  CHECK_FALSE(c.qk_norm);
  CHECK_FALSE(c.qkv_bias);
}

TEST_CASE("hf config: older and newer spellings of RoPE settings") {
  const std::string base = R"("model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1,
      "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 100)";
  // Older: "type" instead of "rope_type".
  auto c = zipage::hf_config_from_string("{" + base + R"(, "rope_scaling": {"type": "llama3", "factor": 2.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}})");
  CHECK(c.rope_scaling.type == zipage::rope_scaling_type::llama3);
  CHECK(c.rope_scaling.original_max_position == 1024);
  // transformers 5: rope_parameters holds rope_theta and the scaling.
  c = zipage::hf_config_from_string("{" + base + R"(, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}})");
  CHECK(c.rope_theta == 1000000.0f);
  CHECK_FALSE(c.rope_scaling.enabled());
  c = zipage::hf_config_from_string("{" + base + R"(, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,
      "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})");
  CHECK(c.rope_theta == 500000.0f);
  CHECK(c.rope_scaling.factor == 8.0f);
  // Defaults: kv heads = heads, head_dim = hidden / heads, theta 10000, eps 1e-6, untied, no bos/eos.
  c = zipage::hf_config_from_string("{" + base + "}");
  CHECK(c.num_kv_heads == 4);
  CHECK(c.head_dim == 16);
  CHECK(c.rope_theta == 10000.0f);
  CHECK(c.rms_eps == doctest::Approx(1e-6));
  CHECK_FALSE(c.tied_embeddings);
  CHECK(c.bos == -1);
  CHECK(c.eos == -1);
  CHECK(c.max_context == 0);
}

TEST_CASE("hf config: errors name the field") {
  const std::string ok = R"("hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
      "intermediate_size": 96, "vocab_size": 100)";
  auto with = [&](const std::string& type, const std::string& extra) {
    return config_error(R"({"model_type": ")" + type + "\", " + ok + extra + "}");
  };
  CHECK(contains(config_error("{}"), "config.json: missing field 'model_type'"));
  CHECK(contains(config_error("[]"), "config.json: must be a JSON object, got array"));
  CHECK(contains(config_error("{"), "config.json: invalid JSON"));
  CHECK(contains(with("mistral", ""), "model_type 'mistral' is not supported (zipage loads qwen3, qwen2 and llama)"));
  CHECK(contains(config_error(R"({"model_type": "llama", "num_hidden_layers": 1})"), "missing field 'hidden_size'"));
  CHECK(contains(config_error(R"({"model_type": "llama", "hidden_size": "64"})"), "field 'hidden_size' must be an integer, got string"));
  CHECK(contains(config_error(R"({"model_type": "llama", "hidden_size": 64.0})"), "field 'hidden_size' must be an integer, got 64.0"));
  CHECK(contains(config_error(R"({"model_type": "llama", "hidden_size": 0})"), "field 'hidden_size' = 0 is out of range"));
  CHECK(contains(config_error(R"({"model_type": "llama", "hidden_size": 4294967296})"), "is out of range"));
  CHECK(contains(with("qwen3", ""), "missing field 'head_dim' (Qwen3 configs give it explicitly)"));
  CHECK(contains(with("llama", R"(, "num_key_value_heads": 3)"), "num_attention_heads (4) is not a multiple of num_key_value_heads (3)"));
  CHECK(contains(with("llama", R"(, "head_dim": 7)"), "head_dim 7 must be even"));
  CHECK(contains(with("llama", R"(, "hidden_act": "gelu")"), "hidden_act 'gelu' is not supported"));
  CHECK(contains(with("llama", R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0})"),
                 "rope_scaling.rope_type 'yarn' is not supported"));
  CHECK(contains(with("llama", R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0})"),
                 "config.json: rope_scaling: missing field 'low_freq_factor'"));
  CHECK(contains(with("llama", R"(, "rope_scaling": {"rope_type": "llama3", "factor": 0.5, "low_freq_factor": 1,
      "high_freq_factor": 4, "original_max_position_embeddings": 8192})"),
                 "rope scaling factor must be finite and >= 1"));
  CHECK(contains(with("llama", R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4,
      "high_freq_factor": 4, "original_max_position_embeddings": 8192})"), "high_freq_factor (4) must exceed low_freq_factor (4)"));
  CHECK(contains(with("llama", R"(, "rope_scaling": "llama3")"), "field 'rope_scaling' must be an object, got string"));
  CHECK(contains(with("llama", R"(, "rope_theta": -1)"), "rope_theta must be finite and positive"));
  CHECK(contains(with("llama", R"(, "rms_norm_eps": "small")"), "field 'rms_norm_eps' must be a number, got string"));
  CHECK(contains(with("llama", R"(, "tie_word_embeddings": 1)"), "field 'tie_word_embeddings' must be true or false"));
  CHECK(contains(with("qwen2", R"(, "use_sliding_window": true)"), "use_sliding_window = true is not supported"));
  CHECK(contains(with("llama", R"(, "layer_types": ["sliding_attention"])"), "layer_types[0] = 'sliding_attention' is not supported"));
  CHECK(contains(with("llama", R"(, "attention_bias": true)"), "attention_bias = true is not supported"));
  CHECK(contains(with("llama", R"(, "mlp_bias": true)"), "mlp_bias = true is not supported"));
  CHECK(contains(with("llama", R"(, "eos_token_id": 100)"), "config.json: model config: bos/eos (-1/100) outside the vocabulary of 100"));
  CHECK(contains(with("llama", R"(, "eos_token_id": [2, "x"])"), "field 'eos_token_id[1]' must be an integer"));
  CHECK(contains(with("llama", R"(, "eos_token_id": [2, 500])"), "extra eos id 500 outside the vocabulary"));
  CHECK(contains(error_of([] { (void)zipage::load_hf_config("/nonexistent/dir/config.json"); }),
                 "cannot read model config '/nonexistent/dir/config.json': no such file"));
}

// ---------------------------------------------------------------------------------------------
// Llama 3 RoPE scaling
// ---------------------------------------------------------------------------------------------

TEST_CASE("hf config: products of fields that each pass their range check (issue 13)") {
  // 536870916 heads x head_dim 8 = 2^32 + 32: q_size() wrapped to 32, a checkpoint with [32, hidden]
  // projections loaded, and the engine read and wrote out of bounds (or divided by 0 in the memory plan).
  const std::string base = R"("model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1,
      "intermediate_size": 48, "vocab_size": 96, "head_dim": 8)";
  CHECK(contains(config_error("{" + base + R"(, "num_attention_heads": 536870916})"),
                 "config.json: num_attention_heads (536870916) x head_dim (8) = 4294967328 is too large"));
  CHECK(contains(config_error("{" + base + R"(, "num_attention_heads": 536870912, "num_key_value_heads": 268435456})"),
                 "num_attention_heads (536870912) x head_dim (8) = 4294967296 is too large"));
  // The model_config itself refuses to hand out a wrapped size.
  model_config c;
  c.num_q_heads = 536870916;
  c.head_dim = 8;
  CHECK(contains(error_of([&] { (void)c.q_size(); }), "num_q_heads x head_dim = 536870916 x 8 is too large"));

  // A checkpoint whose tensors match the wrapped sizes is refused, naming the field.
  tiny_spec spec;
  spec.heads = 4;
  spec.kv_heads = 4;
  auto w = random_weights(spec);  // q/k/v/o of 4 heads x 8 = 32: what the wrapped q_size() expected
  auto cfg = config_json(spec);
  cfg["num_attention_heads"] = 536870916;
  cfg["num_key_value_heads"] = 536870916;
  cfg["head_dim"] = 8;
  temp_dir dir("zipage_hf_overflow");
  write_checkpoint(dir.path, cfg, w);
  CHECK(contains(error_of([&] { (void)zipage::load_hf_checkpoint(dir.path); }),
                 "num_attention_heads (536870916) x head_dim (8) = 4294967328 is too large"));
}

TEST_CASE("llama3 rope scaling: frequencies and rotations against hand-computed values") {
  // Llama 3.1's settings: theta 500000, head_dim 128, factor 8, low 1, high 4, original context 8192.
  // Wavelengths below 8192/4 = 2048 keep their frequency, above 8192/1 are divided by 8, in between
  // interpolate. Expected values computed by hand (Python, double) from the published formula.
  zipage::rope_scaling_config s{zipage::rope_scaling_type::llama3, 8.0f, 1.0f, 4.0f, 8192};
  auto f = [](int i) { return std::pow(500000.0, -2.0 * i / 128); };
  CHECK(s.apply(f(0)) == doctest::Approx(1.0).epsilon(1e-12));                      // wavelength 6.3: kept
  CHECK(s.apply(f(16)) == doctest::Approx(0.03760603093086393).epsilon(1e-12));      // 167: kept
  CHECK(s.apply(f(30)) == doctest::Approx(0.0013718935677611381).epsilon(1e-12));    // 2948: interpolated
  CHECK(s.apply(f(32)) == doctest::Approx(0.0005248461609929547).epsilon(1e-12));    // 4443: interpolated
  CHECK(s.apply(f(34)) == doctest::Approx(0.0001785078127679964).epsilon(1e-12));    // 6695: interpolated
  CHECK(s.apply(f(50)) == doctest::Approx(4.411534674558404e-06).epsilon(1e-12));    // 178033: divided by 8
  CHECK(s.apply(f(63)) == doctest::Approx(3.068925988914511e-07).epsilon(1e-12));
  zipage::rope_scaling_config none;
  CHECK(none.apply(f(50)) == f(50));

  // cpu::rope with the scaling: a unit vector in pair i (halves layout) at position 1000 turns by
  // 1000 · scaled frequency.
  zipage::cpu::matrix x = zipage::cpu::matrix::Zero(1, 128);
  x(0, 32) = 1.0f;  // pair 32: (x[32], x[96])
  x(0, 50) = 1.0f;  // pair 50: (x[50], x[114])
  const std::vector<std::int32_t> pos{1000};
  zipage::cpu::rope(x, pos, 128, 500000.0f, zipage::rope_style::half, s);
  CHECK(x(0, 32) == doctest::Approx(0.8654010374940257).epsilon(1e-5));
  CHECK(x(0, 96) == doctest::Approx(0.5010798781674073).epsilon(1e-5));
  CHECK(x(0, 50) == doctest::Approx(0.9999902691966891).epsilon(1e-6));
  CHECK(x(0, 114) == doctest::Approx(0.004411520365290382).epsilon(1e-4));
  // The backend overload passes it through; the old signature still rotates unscaled.
  zipage::cpu::matrix y = zipage::cpu::matrix::Zero(1, 128), z = y;
  y(0, 32) = z(0, 32) = 1.0f;
  zipage::cpu_backend{}.rope(y, pos, 128, 500000.0f, zipage::rope_style::half, s);
  zipage::cpu_backend{}.rope(z, pos, 128, 500000.0f, zipage::rope_style::half);
  CHECK(y(0, 96) == doctest::Approx(0.5010798781674073).epsilon(1e-5));
  CHECK(z(0, 96) == doctest::Approx(std::sin(1000 * f(32))).epsilon(1e-5));
}

// ---------------------------------------------------------------------------------------------
// Tiny checkpoints
// ---------------------------------------------------------------------------------------------

TEST_CASE("hf checkpoint: each architecture loads and matches the reference forward pass") {
  tiny_spec qwen3{.type = "qwen3", .head_dim = 16, .tied = true, .theta = 1000000.0f, .seed = 3};
  tiny_spec qwen2{.type = "qwen2", .seed = 4};
  tiny_spec llama{.type = "llama", .kv_heads = 1, .seed = 5};
  tiny_spec llama31{.type = "llama", .llama3_scaling = true, .seed = 6};
  for (const tiny_spec& spec : {qwen3, qwen2, llama, llama31}) {
    CAPTURE(spec.type);
    CAPTURE(spec.llama3_scaling);
    temp_dir dir;
    const auto w = random_weights(spec);
    write_checkpoint(dir.path, config_json(spec), w);
    auto m = zipage::load_hf_checkpoint(dir.path);
    const auto& c = m.config();
    CHECK(c.architecture == spec.type);
    CHECK(c.head_dim == spec.head_dim);
    CHECK(c.rope == zipage::rope_style::half);
    CHECK(c.rope_scaling.enabled() == spec.llama3_scaling);
    const auto got = model_logits(m, prompt);
    const auto want = ref_model{spec, &w}.forward(prompt);
    CHECK(max_rel_diff(got, want) < 2e-5);
  }
}

TEST_CASE("hf checkpoint: what each optional piece changes") {
  // Qwen3's q/k norm is wired: the same weights without it give different logits.
  tiny_spec spec{.type = "qwen3", .head_dim = 16, .seed = 7};
  temp_dir dir;
  auto w = random_weights(spec);
  write_checkpoint(dir.path, config_json(spec), w);
  auto with_norm = zipage::load_hf_checkpoint(dir.path);
  auto without = w;
  for (int l = 0; l < spec.layers; ++l) {
    without.erase("model.layers." + std::to_string(l) + ".self_attn.q_norm.weight");
    without.erase("model.layers." + std::to_string(l) + ".self_attn.k_norm.weight");
  }
  write_safetensors(dir.path / "model.safetensors", without);
  // Loading it as Qwen3 names the missing tensor ...
  CHECK(contains(error_of([&] { (void)zipage::load_hf_checkpoint(dir.path); }),
                 "no tensor named 'model.layers.0.self_attn.q_norm.weight'"));
  // ... and as a model without q/k norm it loads, with other logits.
  auto c = zipage::load_hf_config(dir.path);
  c.qk_norm = false;
  auto no_norm = zipage::load_hf_model(c, st::checkpoint::open(dir.path));
  const auto a = model_logits(with_norm, prompt);
  const auto b = model_logits(no_norm, prompt);
  double diff = 0;
  for (std::size_t t = 0; t < a.size(); ++t)
    for (std::size_t i = 0; i < a[t].size(); ++i) diff = std::max(diff, double(std::abs(a[t][i] - b[t][i])));
  CHECK(diff > 1e-2);

  // Llama 3 scaling changes the logits of later positions, not of position 0.
  tiny_spec plain{.type = "llama", .seed = 8}, scaled = plain;
  scaled.llama3_scaling = true;
  temp_dir d1, d2;
  const auto lw = random_weights(plain);
  write_checkpoint(d1.path, config_json(plain), lw);
  write_checkpoint(d2.path, config_json(scaled), lw);
  auto m1 = zipage::load_hf_checkpoint(d1.path);
  auto m2 = zipage::load_hf_checkpoint(d2.path);
  const auto l1 = model_logits(m1, prompt), l2 = model_logits(m2, prompt);
  CHECK(l1[0] == l2[0]);
  double late = 0;
  for (std::size_t i = 0; i < l1.back().size(); ++i) late = std::max(late, double(std::abs(l1.back()[i] - l2.back()[i])));
  CHECK(late > 1e-3);
}

TEST_CASE("hf checkpoint: BF16 and sharded checkpoints") {
  tiny_spec spec{.type = "qwen2", .seed = 9};
  auto w = random_weights(spec);
  round_to_bf16(w);  // the reference then sees exactly what the BF16 file holds
  temp_dir single, sharded;
  write_checkpoint(single.path, config_json(spec), w, st::dtype::bf16);
  auto m = zipage::load_hf_checkpoint(single.path);
  const auto want = ref_model{spec, &w}.forward(prompt);
  CHECK(max_rel_diff(model_logits(m, prompt), want) < 2e-5);

  // The same weights over two shards (alternately F32 and BF16) with an index.
  std::ofstream(sharded.path / "config.json") << config_json(spec).dump();
  st::writer s1, s2;
  nlohmann::json map = nlohmann::json::object();
  int i = 0;
  for (const auto& [name, t] : w) {
    const bool first = (i++ % 2) == 0;
    (first ? s1 : s2).add(name, t.shape, t.values, first ? st::dtype::f32 : st::dtype::bf16);
    map[name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  s1.write(sharded.path / "model-00001-of-00002.safetensors");
  s2.write(sharded.path / "model-00002-of-00002.safetensors");
  std::ofstream(sharded.path / "model.safetensors.index.json") << nlohmann::json{{"metadata", {{"total_size", 0}}},
                                                                                  {"weight_map", map}}.dump();
  auto ms = zipage::load_hf_checkpoint(sharded.path);
  CHECK(model_logits(ms, prompt) == model_logits(m, prompt));
}

TEST_CASE("hf checkpoint: generates through the engine; generation_config adds eos ids") {
  tiny_spec spec{.type = "qwen3", .head_dim = 16, .tied = true, .seed = 10};
  temp_dir dir;
  const auto w = random_weights(spec);
  write_checkpoint(dir.path, config_json(spec), w);
  std::ofstream(dir.path / "generation_config.json") << R"({"bos_token_id": 1, "eos_token_id": [2, 7, 2], "do_sample": true})";
  auto m = zipage::load_hf_checkpoint(dir.path);
  CHECK(m.config().eos == 2);
  CHECK(m.config().extra_eos == std::vector<token_id>{7});

  const auto want = ref_model{spec, &w}.forward(prompt);
  const auto& last = want.back();
  const auto argmax = static_cast<token_id>(std::max_element(last.begin(), last.end()) - last.begin());

  zipage::engine<model_type> eng(std::move(m), {.block_size = 4, .num_blocks = 32});
  zipage::sampling_params sp;
  sp.temperature = 0.0f;
  sp.max_tokens = 12;
  sp.ignore_eos = true;
  const auto out = eng.generate({prompt, prompt}, sp);
  REQUIRE(out.size() == 2);
  CHECK(out[0].output.size() == 12);
  CHECK(out[0].output == out[1].output);
  CHECK(out[0].output.front() == argmax);

  std::ofstream(dir.path / "generation_config.json") << R"({"eos_token_id": 1000})";
  CHECK(contains(error_of([&] { (void)zipage::load_hf_checkpoint(dir.path); }),
                 "generation_config.json: eos_token_id 1000 outside the vocabulary of 96"));
  std::ofstream(dir.path / "generation_config.json") << "[";
  CHECK(contains(error_of([&] { (void)zipage::load_hf_checkpoint(dir.path); }), "generation_config.json: invalid JSON"));
}

TEST_CASE("generation_config.json: sampling defaults present, absent, greedy and malformed") {
  temp_dir dir;
  // Absent: nothing set, and applying it changes nothing.
  auto none = zipage::load_generation_config(dir.path);
  CHECK_FALSE(none.sets_sampling());
  CHECK(none.source.empty());
  zipage::sampling_params p;
  p.temperature = 0.0f;
  none.apply(p);
  CHECK(p.temperature == 0.0f);

  // Qwen3's file: every value it sets, nothing else.
  std::ofstream(dir.path / "generation_config.json")
      << R"({"bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
            "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"})";
  const auto qwen3 = zipage::load_generation_config(dir.path);
  CHECK(qwen3.sets_sampling());
  CHECK(contains(qwen3.source, "generation_config.json"));
  CHECK(*qwen3.do_sample);
  CHECK(*qwen3.temperature == doctest::Approx(0.6f));
  CHECK(*qwen3.top_k == 20);
  CHECK(*qwen3.top_p == doctest::Approx(0.95f));
  CHECK_FALSE(qwen3.min_p.has_value());
  CHECK_FALSE(qwen3.repetition_penalty.has_value());
  zipage::sampling_params q;
  q.temperature = 0.0f;
  q.min_p = 0.05f;
  qwen3.apply(q);
  CHECK(q.temperature == doctest::Approx(0.6f));
  CHECK(q.top_k == 20);
  CHECK(q.top_p == doctest::Approx(0.95f));
  CHECK(q.min_p == doctest::Approx(0.05f));  // not in the file: left as it was
  CHECK_NOTHROW(q.validate());

  // min_p, repetition_penalty; null counts as absent.
  std::ofstream(dir.path / "generation_config.json")
      << R"({"temperature": null, "min_p": 0.1, "repetition_penalty": 1.05, "top_k": 0})";
  const auto extra = zipage::load_generation_config(dir.path);
  CHECK_FALSE(extra.temperature.has_value());
  CHECK(*extra.min_p == doctest::Approx(0.1f));
  CHECK(*extra.repetition_penalty == doctest::Approx(1.05f));
  CHECK(*extra.top_k == 0);

  // do_sample false: greedy whatever the temperature says (transformers' meaning).
  std::ofstream(dir.path / "generation_config.json") << R"({"do_sample": false, "temperature": 0.7, "top_p": 0.8})";
  zipage::sampling_params g;
  zipage::load_generation_config(dir.path).apply(g);
  CHECK(g.greedy());
  CHECK(g.top_p == doctest::Approx(0.8f));

  // Only eos ids: nothing for sampling.
  std::ofstream(dir.path / "generation_config.json") << R"({"eos_token_id": 2})";
  CHECK_FALSE(zipage::load_generation_config(dir.path).sets_sampling());

  // top_k -1 is vLLM's "off" (it was refused): kept as written, applied as zipage's 0. max_new_tokens is the
  // default max_tokens (vLLM's get_diff_sampling_param); without it max_tokens is left as it was.
  std::ofstream(dir.path / "generation_config.json") << R"({"top_k": -1, "max_new_tokens": 300})";
  const auto vllm_style = zipage::load_generation_config(dir.path);
  CHECK(*vllm_style.top_k == -1);
  CHECK(*vllm_style.max_new_tokens == 300);
  zipage::sampling_params k;
  k.top_k = 20;
  vllm_style.apply(k);
  CHECK(k.top_k == 0);
  CHECK(k.max_tokens == 300);
  CHECK_NOTHROW(k.validate());
  CHECK_FALSE(qwen3.max_new_tokens.has_value());
  CHECK(qwen3.defaults().max_tokens == zipage::sampling_params{}.max_tokens);

  // Malformed: the file and the field are named.
  auto gen_error = [&](const char* text) {
    std::ofstream(dir.path / "generation_config.json") << text;
    return error_of([&] { (void)zipage::load_generation_config(dir.path); });
  };
  CHECK(contains(gen_error(R"({"temperature": "hot"})"), "generation_config.json: field 'temperature' must be a number, got string"));
  CHECK(contains(gen_error(R"({"temperature": -0.5})"), "generation_config.json: field 'temperature' = -0.5 must be >= 0"));
  CHECK(contains(gen_error(R"({"top_p": 0})"), "field 'top_p' = 0 must be in (0, 1]"));
  CHECK(contains(gen_error(R"({"top_p": 1.5})"), "field 'top_p' = 1.5 must be in (0, 1]"));
  CHECK(contains(gen_error(R"({"min_p": 2})"), "field 'min_p' = 2 must be in [0, 1]"));
  CHECK(contains(gen_error(R"({"repetition_penalty": 0})"), "field 'repetition_penalty' = 0 must be > 0"));
  CHECK(contains(gen_error(R"({"top_k": 2.5})"), "field 'top_k' must be an integer, got 2.5"));
  CHECK(contains(gen_error(R"({"top_k": -2})"), "field 'top_k' = -2 is out of range [-1, 2147483647]"));
  CHECK(contains(gen_error(R"({"max_new_tokens": 0})"), "field 'max_new_tokens' = 0 is out of range [1, 2147483647]"));
  CHECK(contains(gen_error(R"({"max_new_tokens": "many"})"), "field 'max_new_tokens' must be an integer, got string"));
  CHECK(contains(gen_error(R"({"do_sample": "yes"})"), "field 'do_sample' must be true or false, got string"));
  CHECK(contains(gen_error("[1]"), "generation_config.json: must be a JSON object, got array"));
  CHECK(contains(gen_error("{"), "generation_config.json: invalid JSON"));
}

TEST_CASE("hf checkpoint: loading errors name the file, the tensor and the shapes") {
  tiny_spec spec{.type = "qwen2", .seed = 11};
  const auto good = random_weights(spec);
  temp_dir dir;
  auto load_with = [&](const weight_map& w) {
    write_checkpoint(dir.path, config_json(spec), w);
    return error_of([&] { (void)zipage::load_hf_checkpoint(dir.path); });
  };
  auto w = good;
  w["model.layers.1.self_attn.k_proj.weight"].shape = {32, 16};  // transposed
  CHECK(contains(load_with(w), "model.safetensors: tensor 'model.layers.1.self_attn.k_proj.weight' has shape [32, 16], expected [16, 32]"));
  w = good;
  w["model.norm.weight"] = {{1, 32}, std::vector<float>(32, 1.0f)};
  CHECK(contains(load_with(w), "tensor 'model.norm.weight' has shape [1, 32], expected [32]"));
  w = good;
  w.erase("model.layers.0.self_attn.v_proj.bias");
  CHECK(contains(load_with(w), "no tensor named 'model.layers.0.self_attn.v_proj.bias'"));
  w = good;
  w["model.layers.0.self_attn.o_proj.bias"] = {{32}, std::vector<float>(32, 0.0f)};
  CHECK(contains(load_with(w), "unexpected tensor 'model.layers.0.self_attn.o_proj.bias' (shape [32]): this model type does not use it"));
  w = good;
  w["model.layers.2.input_layernorm.weight"] = {{32}, std::vector<float>(32, 1.0f)};  // a layer too many
  CHECK(contains(load_with(w), "unexpected tensor 'model.layers.2.input_layernorm.weight'"));
  w = good;
  w.erase("lm_head.weight");
  CHECK(contains(load_with(w), "no tensor 'lm_head.weight', which an untied output needs: config.json's "
                                 "tie_word_embeddings is false (or absent"));
  // Old checkpoints' rotary buffers are ignored; a tied checkpoint may still store lm_head.
  w = good;
  w["model.layers.0.self_attn.rotary_emb.inv_freq"] = {{4}, std::vector<float>(4, 1.0f)};
  CHECK(load_with(w) == "<no error>");
  tiny_spec tied = spec;
  tied.tied = true;
  write_checkpoint(dir.path, config_json(tied), good);
  CHECK(error_of([&] { (void)zipage::load_hf_checkpoint(dir.path); }) == "<no error>");

  fs::remove(dir.path / "config.json");
  CHECK(contains(error_of([&] { (void)zipage::load_hf_checkpoint(dir.path); }), "cannot read model config"));
  CHECK(contains(error_of([&] { (void)zipage::load_hf_checkpoint(dir.path / "model.safetensors"); }),
                 "is not a checkpoint directory"));
}

namespace {
// A backend whose rope() takes no scaling (its own rope hides cpu_backend's overloads).
struct unscaled_backend : zipage::cpu_backend {
  void rope(tensor& x, std::span<const std::int32_t> pos, int head_dim, float theta, zipage::rope_style style) const {
    zipage::cpu::rope(x, pos, head_dim, theta, style);
  }
};
}  // namespace

TEST_CASE("hf checkpoint: a backend without RoPE scaling refuses a config that needs it") {
  tiny_spec plain{.type = "llama", .seed = 12}, scaled = plain;
  scaled.llama3_scaling = true;
  temp_dir d1, d2;
  const auto w = random_weights(plain);
  write_checkpoint(d1.path, config_json(plain), w);
  write_checkpoint(d2.path, config_json(scaled), w);
  CHECK(error_of([&] { (void)zipage::load_hf_checkpoint<unscaled_backend>(d1.path); }) == "<no error>");
  CHECK(contains(error_of([&] { (void)zipage::load_hf_checkpoint<unscaled_backend>(d2.path); }),
                 "RoPE frequency scaling, which this backend does not implement"));
}
