#pragma once
// The Llama family as an engine model type: RMSNorm → GQA attention with RoPE → SwiGLU MLP, tied or
// untied embeddings, with the optional pieces of its descendants (q/k/v bias as in Qwen2, per-head q/k
// RMSNorm as in Qwen3) so one implementation serves them all. Generic over the backend.
#include <algorithm>
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "zipage/backend/cpu/cpu_backend.hpp"
#include "zipage/core/error.hpp"
#include "zipage/gguf/gguf.hpp"
#include "zipage/model/concepts.hpp"
#include "zipage/model/forward_context.hpp"
#include "zipage/model/model_config.hpp"
#include "zipage/model/qkv_epilogue.hpp"

namespace zipage {

template <class Backend>
struct llama_layer_weights {
  using tensor = typename Backend::tensor;
  tensor attn_norm;             // [1][hidden]
  tensor wq, wk, wv, wo;        // [out][in]
  std::optional<tensor> bq, bk, bv;          // [1][out] (Qwen2)
  std::optional<tensor> q_norm, k_norm;      // [1][head_dim] (Qwen3)
  tensor ffn_norm;              // [1][hidden]
  tensor w_gate, w_up, w_down;  // [out][in]
  // The fused projections (fuse_projections): one GEMM instead of three and of two. When set, they replace
  // wq/wk/wv and w_gate/w_up, which are then left empty.
  std::optional<tensor> wqkv;       // [q_size + 2 kv_size][hidden]: wq | wk | wv
  std::optional<tensor> w_gate_up;  // [2 ffn][hidden]: w_gate | w_up
};

template <class Backend>
struct llama_weights {
  using tensor = typename Backend::tensor;
  tensor embedding;                 // [vocab][hidden]
  std::vector<llama_layer_weights<Backend>> layers;
  tensor final_norm;                // [1][hidden]
  std::optional<tensor> lm_head;    // [vocab][hidden]; empty when tied to the embedding
};

// A backend that can run a layer's q/k/v and gate/up projections as one GEMM each says so with four ops:
// stack_rows(parts) stacks linear weights [n_i][in] into one [sum n_i][in] in the backend's storage (nullopt
// when that storage cannot be stacked: cuda_backend's FP8 weights unless every part but the last is a whole
// number of 128-row scale blocks, or parts of different storage); split_columns(x, widths, outs) cuts x
// [rows][sum widths] into outs [rows][width_i]; swiglu(gate_up, out) is silu_mul of gate_up's two halves;
// qkv_epilogue(qkv, e, q, k, v) is what follows the fused q|k|v GEMM (model/qkv_epilogue.hpp; a backend without
// a kernel of its own for it calls separate_qkv_epilogue).
template <class Backend>
concept fuses_projections = requires(const Backend& b, const typename Backend::tensor& ct, typename Backend::tensor& t,
                                     std::span<const typename Backend::tensor* const> parts, std::span<const int> widths,
                                     std::span<typename Backend::tensor* const> outs,
                                     const qkv_epilogue<typename Backend::tensor>& e) {
  { b.stack_rows(parts) } -> std::same_as<std::optional<typename Backend::tensor>>;
  b.split_columns(ct, widths, outs);
  b.swiglu(ct, t);
  b.qkv_epilogue(ct, e, t, t, t);
};

// The attention block's input half, shared by llama_model and tensor_parallel_llama (models/llama_tp.hpp, which
// runs it on each rank's shard): any layer-weights type with llama_layer_weights' field names.
namespace llama_block {

// Backends that take a rope_scaling_config get it; the models check that others only see unscaled configs.
template <class Backend>
inline constexpr bool scales_rope = requires(Backend& b, typename Backend::tensor& x, std::span<const std::int32_t> p,
                                             const rope_scaling_config& s) { b.rope(x, p, 2, 1.0f, rope_style::half, s); };

template <class Backend>
void rope(Backend& ops, const model_config& c, typename Backend::tensor& x, std::span<const std::int32_t> positions) {
  if constexpr (scales_rope<Backend>) {
    if (c.rope_scaling.enabled()) {
      ops.rope(x, positions, c.head_dim, c.rope_theta, c.rope, c.rope_scaling);
      return;
    }
  }
  ops.rope(x, positions, c.head_dim, c.rope_theta, c.rope);
}

template <class Backend, class Tensor>
void project(Backend& ops, const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias, Tensor& out) {
  ops.linear(x, w, out);
  if (bias) ops.add_bias(out, *bias);
}


// A backend with one op for a residual add followed by RMSNorm: x += y; out = rms_norm(x, w) (out may be y).
template <class Backend>
concept fuses_add_rms_norm = requires(const Backend& b, typename Backend::tensor& t, const typename Backend::tensor& ct) {
  b.add_rms_norm(t, ct, ct, 1e-5f, t);
};

template <class Layer, class Tensor>
qkv_epilogue<Tensor> epilogue_of(const model_config& c, const Layer& lw, std::span<const std::int32_t> positions) {
  auto ptr = [](const std::optional<Tensor>& t) { return t ? &*t : nullptr; };
  qkv_epilogue<Tensor> e;
  e.num_q_heads = c.num_q_heads;
  e.num_kv_heads = c.num_kv_heads;
  e.head_dim = c.head_dim;
  e.q_bias = ptr(lw.bq);
  e.k_bias = ptr(lw.bk);
  e.v_bias = ptr(lw.bv);
  e.q_norm = ptr(lw.q_norm);
  e.k_norm = ptr(lw.k_norm);
  e.rms_eps = c.rms_eps;
  e.positions = positions;
  e.rope_theta = c.rope_theta;
  e.style = c.rope;
  e.scaling = c.rope_scaling;
  return e;
}

// RMSNorm, q/k/v (with bias and q/k norm where the checkpoint has them), RoPE: q, k, v from x (h, qkv: scratch;
// a fused layer's q|k|v output).
// `normed`: h already holds RMSNorm(x) (the previous layer's add_rms_norm wrote it).
template <class Backend, class Layer, class Tensor>
void attention_input(Backend& ops, const model_config& c, const Layer& lw, const Tensor& x, Tensor& h, Tensor& qkv,
                     Tensor& q, Tensor& k, Tensor& v, std::span<const std::int32_t> positions, bool normed = false) {
  if (!normed) ops.rms_norm(x, lw.attn_norm, c.rms_eps, h);
  if constexpr (fuses_projections<Backend> && requires { lw.wqkv.has_value(); }) {
    if (lw.wqkv) {  // the fused projection, then cut, biases, q/k norms and RoPE in one op
      ops.linear(h, *lw.wqkv, qkv);
      ops.qkv_epilogue(qkv, epilogue_of<Layer, Tensor>(c, lw, positions), q, k, v);
      return;
    }
  }
  project(ops, h, lw.wq, lw.bq, q);
  project(ops, h, lw.wk, lw.bk, k);
  project(ops, h, lw.wv, lw.bv, v);
  if (lw.q_norm) ops.rms_norm(q, *lw.q_norm, c.rms_eps, q);
  if (lw.k_norm) ops.rms_norm(k, *lw.k_norm, c.rms_eps, k);
  rope(ops, c, q, positions);
  rope(ops, c, k, positions);
}

// silu(h · w_gateᵀ) * (h · w_upᵀ) into act, by the fused projection when the layer has one (scratch: gate_up,
// up).
template <class Backend, class Layer, class Tensor>
void gated_mlp_input(Backend& ops, const Layer& lw, const Tensor& h, Tensor& gate_up, Tensor& up, Tensor& act) {
  if constexpr (fuses_projections<Backend> && requires { lw.w_gate_up.has_value(); }) {
    if (lw.w_gate_up) {
      ops.linear(h, *lw.w_gate_up, gate_up);
      ops.swiglu(gate_up, act);
      return;
    }
  }
  ops.linear(h, lw.w_gate, act);
  ops.linear(h, lw.w_up, up);
  ops.silu_mul(act, up, act);
}

}  // namespace llama_block

template <class Backend = cpu_backend>
class llama_model {
 public:
  using backend_type = Backend;
  using tensor = typename Backend::tensor;

  llama_model(model_config config, llama_weights<Backend> weights)
      : config_(std::move(config)), w_(std::move(weights)) {
    config_.validate();
    check(static_cast<int>(w_.layers.size()) == config_.num_layers, "llama: ", w_.layers.size(),
          " layers of weights for a config of ", config_.num_layers);
    check(!config_.rope_scaling.enabled() || llama_block::scales_rope<Backend>,
          "llama: the config asks for RoPE frequency scaling, which this backend does not implement");
  }

  [[nodiscard]] const model_config& config() const { return config_; }
  // The weights (tensor parallelism shards them: models/llama_tp.hpp).
  [[nodiscard]] const llama_weights<Backend>& weights() const { return w_; }

  // logits [logits_rows][vocab], kept in the model until the next forward (stable storage, so a backend
  // can capture the step into a graph).
  const tensor& forward(forward_context<Backend>& ctx) {
    if constexpr (overlapping_backend<Backend>) {
      if (ctx.num_nano_batches() == 2) return forward_overlapped(ctx);
    }
    const auto& c = config_;
    Backend& ops = ctx.backend();
    activations& a = act_[0];
    embed(ops, ctx.tokens(), a);
    for (int l = 0; l < c.num_layers; ++l) {
      attention_input(ops, layer(l), a, ctx.positions());
      ctx.attention(l, a.q, a.k, a.v, a.attn);
      attention_output_and_mlp(ops, l, a);
    }
    // Only the rows the engine samples from go through the final norm and the vocabulary projection.
    ops.gather_rows(a.x, ctx.logits_rows(), a.h);
    return logits(ops, a.h);
  }

 private:
  // A batch's activations, reused across steps (one set per nano-batch). `fused`: the output of a fused projection
  // (q|k|v, then gate|up): each is scratch within its half of the layer, so one buffer, sized by the larger, serves
  // both.
  struct activations {
    tensor x, h, q, k, v, attn, fused, gate, up;
  };

  [[nodiscard]] const llama_layer_weights<Backend>& layer(int l) const { return w_.layers[static_cast<std::size_t>(l)]; }

  // With a backend that fuses the residual add into the RMSNorm after it, each layer's attention input arrives
  // normed: by the embedding step for layer 0, by the previous layer's last add for the others.
  static constexpr bool fused_add_norm = llama_block::fuses_add_rms_norm<Backend>;

  void embed(Backend& ops, std::span<const token_id> tokens, activations& a) const {
    ops.embedding(w_.embedding, tokens, a.x);
    if constexpr (fused_add_norm) ops.rms_norm(a.x, layer(0).attn_norm, config_.rms_eps, a.h);
  }

  void attention_input(Backend& ops, const llama_layer_weights<Backend>& lw, activations& a,
                       std::span<const std::int32_t> positions) const {
    llama_block::attention_input(ops, config_, lw, a.x, a.h, a.fused, a.q, a.k, a.v, positions, fused_add_norm);
  }

  // x += y, then h = RMSNorm(x) with w: one op where the backend fuses them.
  void add_then_norm(Backend& ops, tensor& x, tensor& y_then_h, const tensor& w) const {
    if constexpr (fused_add_norm) {
      ops.add_rms_norm(x, y_then_h, w, config_.rms_eps, y_then_h);
    } else {
      ops.add(x, y_then_h);
      ops.rms_norm(x, w, config_.rms_eps, y_then_h);
    }
  }

  // Output projection and residual, then the SwiGLU MLP and residual: a.x from a.attn (layer l). With a fused
  // add+norm the last residual also norms a.x for layer l + 1 into a.h.
  void attention_output_and_mlp(Backend& ops, int l, activations& a) const {
    const llama_layer_weights<Backend>& lw = layer(l);
    ops.linear(a.attn, lw.wo, a.h);
    add_then_norm(ops, a.x, a.h, lw.ffn_norm);
    llama_block::gated_mlp_input(ops, lw, a.h, a.fused, a.up, a.gate);
    ops.linear(a.gate, lw.w_down, a.h);
    if (fused_add_norm && l + 1 < config_.num_layers)
      add_then_norm(ops, a.x, a.h, layer(l + 1).attn_norm);
    else
      ops.add(a.x, a.h);
  }

  // Final norm and vocabulary projection of the gathered rows `h` (overwritten).
  const tensor& logits(Backend& ops, tensor& h) {
    ops.rms_norm(h, w_.final_norm, config_.rms_eps, h);
    ops.linear(h, w_.lm_head ? *w_.lm_head : w_.embedding, logits_);
    return logits_;
  }

  // The same layers over two nano-batches, ordered so that one's attention runs beside the other's GEMMs
  // (NanoFlow's idea; the backend runs attention on a stream of its own): A's attention of layer l beside B's
  // q/k/v of layer l and its o/MLP of layer l-1, B's attention beside A's o/MLP of layer l and q/k/v of l+1.
  // Each nano-batch runs exactly the ops of forward() on its rows, so the logits are those of the whole batch
  // up to GEMM rounding at the smaller M.
  const tensor& forward_overlapped(forward_context<Backend>& ctx) {
    const auto& c = config_;
    Backend& ops = ctx.backend();
    const forward_context<Backend> half[2] = {ctx.nano_batch(0), ctx.nano_batch(1)};
    for (int i = 0; i < 2; ++i) embed(ops, half[i].tokens(), act_[i]);
    auto attend = [&](int i, int l) {
      activations& a = act_[i];
      attention_input(ops, layer(l), a, half[i].positions());
      half[i].attention(l, a.q, a.k, a.v, a.attn);
    };
    auto finish = [&](int i, int l) {
      half[i].wait_attention();
      attention_output_and_mlp(ops, l, act_[i]);
    };
    attend(0, 0);
    for (int l = 0; l < c.num_layers; ++l) {
      attend(1, l);
      finish(0, l);
      if (l + 1 < c.num_layers) attend(0, l + 1);
      finish(1, l);
    }
    for (int i = 0; i < 2; ++i) ops.gather_rows(act_[i].x, half[i].logits_rows(), act_[i].h);
    ops.concat_rows(act_[0].h, act_[1].h, gathered_);
    return logits(ops, gathered_);
  }

  model_config config_;
  llama_weights<Backend> w_;
  activations act_[2];  // the whole batch's (or nano-batch 0's), nano-batch 1's
  tensor gathered_;     // both nano-batches' sampled rows
  tensor logits_;
};

// Whether a backend tensor holds no elements (cpu::matrix and cuda_tensor both have size()).
template <class Tensor>
bool is_empty(const Tensor& t) {
  return t.size() == 0;
}

// A backend that can store linear weights its own way (cuda_backend: FP8 E4M3 with 128x128 block scales,
// docs/fp8.md "FP8 weights") says so with prepare_linear_weight(tensor&, bool fp8_checkpoint), which converts a
// loaded weight in place (or leaves it) and returns whether it converted; cpu_backend has none.
template <class Backend>
concept prepares_linear_weights = requires(const Backend& b, typename Backend::tensor& t) {
  { b.prepare_linear_weight(t, true) } -> std::convertible_to<bool>;
};

// Hands every transformer-block linear weight (q/k/v/o, gate/up/down — never the embedding, lm_head or norms)
// to the backend's hook, if it has one; returns how many it converted. `fp8_checkpoint`: the weights come from an
// FP8 checkpoint (a backend's "auto" then converts them, as vLLM runs FP8 checkpoints in FP8).
// One layer's (a builder that makes layers one at a time converts each as it goes, so the unconverted weights
// of the whole model never coexist), or every layer's.
template <class Backend>
int prepare_linear_weights(const Backend& backend, llama_layer_weights<Backend>& l, bool fp8_checkpoint = false) {
  int converted = 0;
  if constexpr (prepares_linear_weights<Backend>) {
    for (auto* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      if (!is_empty(*t)) converted += backend.prepare_linear_weight(*t, fp8_checkpoint) ? 1 : 0;
    for (auto* t : {&l.wqkv, &l.w_gate_up})
      if (*t) converted += backend.prepare_linear_weight(**t, fp8_checkpoint) ? 1 : 0;
  }
  return converted;
}
template <class Backend>
int prepare_linear_weights(const Backend& backend, llama_weights<Backend>& w, bool fp8_checkpoint = false) {
  int converted = 0;
  for (auto& l : w.layers) converted += prepare_linear_weights(backend, l, fp8_checkpoint);
  return converted;
}

// Fuses a layer's q/k/v weights into wqkv and gate/up into w_gate_up (as vLLM's QKVParallelLinear and
// MergedColumnParallelLinear do), when the backend fuses projections and can stack these weights; the parts
// are released. Call it after the weights have their final storage (prepare_linear_weights): FP8 weights stack
// their codes and block scales. Biases stay per projection. Returns how many of the two fusions were made.
// The results equal the unfused layer's up to the GEMM's summation order (a wider product may pick another
// kernel).
template <class Backend>
int fuse_projections(const Backend& backend, llama_layer_weights<Backend>& l) {
  int fused = 0;
  if constexpr (fuses_projections<Backend>) {
    using tensor = typename Backend::tensor;
    auto fuse = [&](std::optional<tensor>& into, std::initializer_list<tensor*> parts) {
      if (into) return;
      for (const tensor* p : parts)
        if (is_empty(*p)) return;
      std::vector<const tensor*> list(parts.begin(), parts.end());
      auto stacked = backend.stack_rows(list);
      if (!stacked) return;
      into = std::move(*stacked);
      for (tensor* p : parts) *p = tensor{};
      ++fused;
    };
    fuse(l.wqkv, {&l.wq, &l.wk, &l.wv});
    fuse(l.w_gate_up, {&l.w_gate, &l.w_up});
  }
  return fused;
}
template <class Backend>
int fuse_projections(const Backend& backend, llama_weights<Backend>& w) {
  int fused = 0;
  for (auto& l : w.layers) fused += fuse_projections(backend, l);
  return fused;
}

namespace detail {

inline std::string shape_string(const gguf::tensor_info& t) {
  std::string s = "[";
  for (std::size_t i = 0; i < t.dims.size(); ++i) s += (i ? ", " : "") + std::to_string(t.dims[i]);
  return s + "]";
}

inline int gguf_int(const gguf::file& f, const std::string& key) {
  const auto v = f.get_int(key);
  check(v > 0 && v < (1LL << 31), f.name(), ": metadata ", key, " = ", v, " is out of range");
  return static_cast<int>(v);
}

// An optional integer key in [lo, hi] (`fallback` when absent), checked before narrowing: a uint64 of 2^32 + 16
// would otherwise wrap to 16, and 4294967295 to -1.
inline int gguf_int_in(const gguf::file& f, const std::string& key, int fallback, int lo, int hi) {
  if (!f.has(key)) return fallback;
  const auto v = f.get_int(key);
  check(v >= lo && v <= hi, f.name(), ": metadata ", key, " = ", v, " is out of range [", lo, ", ", hi, "]");
  return static_cast<int>(v);
}

// An optional token id key: -1 or uint32 0xFFFFFFFF (as the tokenizers read them) is none, else an id that fits a
// token_id (validate() then checks it against the vocabulary).
inline token_id gguf_token_key(const gguf::file& f, const std::string& key, token_id fallback) {
  if (!f.has(key)) return fallback;
  const auto v = f.get_int(key);
  if (v == -1 || v == 0xFFFFFFFFLL) return -1;
  check(v >= 0 && v <= std::numeric_limits<token_id>::max(), f.name(), ": metadata ", key, " = ", v,
        " is not a token id");
  return static_cast<token_id>(v);
}

// An optional float key narrowed to the float the model holds: inf, NaN, or a double past float's range is an error.
inline float gguf_float(const gguf::file& f, const std::string& key, double fallback) {
  return checked_float(f.get_float(key, fallback), concat(f.name(), ": metadata ", key));
}

// A GGUF tensor as a row-major [rows][cols] backend tensor, checking its shape. GGUF lists dims
// fastest first, so a [out][in] matrix has dims {in, out}.
template <class Backend>
typename Backend::tensor gguf_matrix(const Backend& backend, const gguf::file& f, const std::string& name, int rows,
                                     int cols) {
  const auto& t = f.tensor(name);
  const bool is_vector = rows == 1 && t.dims.size() == 1 && t.dims[0] == cols;
  const bool is_matrix = t.dims.size() == 2 && t.dims[0] == cols && t.dims[1] == rows;
  check(is_vector || is_matrix, f.name(), ": tensor '", name, "' has shape ", detail::shape_string(t),
        ", expected [", cols, ", ", rows, "]");
  const auto values = f.to_f32(t);
  return backend.from_host(values, rows, cols);
}

// The variants zipage's model does not run, refused by name rather than loaded wrong: a head size other than
// the one the model reads (embedding_length / head_count for llama and qwen2; attention.key_length for qwen3), RoPE
// on part of a head, scaled RoPE by a type (linear, YaRN: rope.scaling.type; Llama 3's frequency factors in
// rope_freqs.weight are read, for llama), mixture of experts.
inline void check_gguf_llama_features(const gguf::file& f, const std::string& arch, int head_dim) {
  const std::string needs = arch == "qwen3" ? " = attention.key_length" : " = embedding_length / head_count";
  for (const std::string& key : {arch + ".attention.key_length", arch + ".attention.value_length", arch + ".rope.dimension_count"}) {
    if (!f.has(key)) continue;
    const auto v = f.get_int(key);
    check(v == head_dim, f.name(), ": metadata ", key, " = ", v, " is not supported (zipage's ", arch, " model needs ",
          head_dim, needs, ")");
  }
  if (const std::string key = arch + ".rope.scaling.type"; f.has(key)) {
    const auto kind = f.get_string(key);
    check(kind == "none", f.name(), ": metadata ", key, " = '", kind,
          "' is not supported (zipage reads scaled RoPE from Hugging Face checkpoints only)");
  } else {
    // Without a type llama.cpp scales linearly by rope.scaling.factor (or the older rope.scale_linear); 0 and 1
    // mean no scaling.
    std::string factor_key = arch + ".rope.scaling.factor";
    if (!f.has(factor_key)) factor_key = arch + ".rope.scale_linear";
    const double factor = f.get_float(factor_key, 0.0);
    check(factor == 0.0 || factor == 1.0, f.name(), ": metadata ", factor_key, " = ", factor, " without ", key,
          " is linear RoPE scaling as llama.cpp reads it, which is not supported (zipage reads scaled RoPE from "
          "Hugging Face checkpoints only)");
  }
  check(arch == "llama" || f.find_tensor("rope_freqs.weight") == nullptr, f.name(),
        ": tensor 'rope_freqs.weight' (RoPE frequency factors) is not part of the ", arch, " model zipage runs");
  if (const std::string key = arch + ".expert_count"; f.has(key))
    check(f.get_int(key) == 0, f.name(), ": mixture-of-experts models (", key, ") are not supported");
}

// Every tensor of the file must be one the model reads (load_llama_gguf's names): anything else (biases a variant
// does not have, extra norms, a layer past block_count) is a feature it would silently drop.
inline void check_gguf_llama_tensors(const gguf::file& f, const model_config& c) {
  std::set<std::string, std::less<>> read = {"token_embd.weight", "output_norm.weight", "output.weight"};
  if (c.rope_scaling.type == rope_scaling_type::factors) read.insert("rope_freqs.weight");
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    for (const char* name : {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
                             "ffn_up", "ffn_down"})
      read.insert(p + name + ".weight");
    if (c.qkv_bias)
      for (const char* name : {"attn_q", "attn_k", "attn_v"}) read.insert(p + name + ".bias");
    if (c.qk_norm)
      for (const char* name : {"attn_q_norm", "attn_k_norm"}) read.insert(p + name + ".weight");
  }
  for (const auto& t : f.tensors())
    check(read.contains(t.name), f.name(), ": tensor '", gguf::detail::printable(t.name),
          "' is not part of the ", c.architecture, " model zipage runs (an unsupported variant?)");
}

// A byte-level BPE vocabulary's end-of-generation tokens besides eos, as llama.cpp finds them: the eot / eom ids
// and the end-of-turn tokens by their text (<|im_end|>, <|endoftext|>, <|eot_id|>, ...), so a chat model stops at
// the end of its turn whichever of them the file names as eos (the role generation_config.json's eos list plays
// for a Hugging Face checkpoint).
inline void add_gguf_end_of_generation(const gguf::file& f, model_config& c) {
  auto add = [&](std::int64_t id) {
    if (id < 0 || id >= c.vocab_size || id == c.eos) return;
    if (std::find(c.extra_eos.begin(), c.extra_eos.end(), id) == c.extra_eos.end())
      c.extra_eos.push_back(static_cast<token_id>(id));
  };
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) add(f.get_int(key, -1));
  // Read in place (151,936 strings for Qwen); a malformed array is the tokenizer's error to name.
  const gguf::value* list = f.find("tokenizer.ggml.tokens");
  if (list == nullptr || !list->is_array() || list->element_type() != gguf::value_type::string) return;
  static const std::set<std::string, std::less<>> ends = {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>",
                                                          "<|end|>", "<|end_of_text|>", "<\uff5cend\u2581of\u2581sentence\uff5c>"};
  const auto& tokens = list->strings();
  for (std::size_t id = 0; id < tokens.size(); ++id)
    if (ends.contains(tokens[id])) add(static_cast<std::int64_t>(id));
}

}  // namespace detail

// Reads a GGUF model of the Llama family as llama.cpp's converter writes it:
// - `llama` (Llama 2 and 3, TinyLlama, the bundled stories260K): Q and K rows permuted so RoPE rotates adjacent
//   pairs; Llama 3's RoPE scaling as per-frequency divisors (rope_freqs.weight);
// - `qwen2` (Qwen2, Qwen2.5, DeepSeek-R1-Distill-Qwen): q/k/v biases, RoPE on halves;
// - `qwen3`: per-head q/k RMSNorm (attn_q_norm / attn_k_norm), head size attention.key_length, RoPE on halves.
// A head size llama.cpp would not read (key_length other than embedding_length / head_count for llama and qwen2)
// is refused.
inline model_config llama_config_from_gguf(const gguf::file& f) {
  const auto arch = f.get_string("general.architecture");
  check(arch == "llama" || arch == "qwen2" || arch == "qwen3", f.name(), ": architecture '", gguf::detail::printable(arch),
        "' is not supported (zipage reads llama, qwen2 and qwen3)");
  const std::string k = arch + ".";
  model_config c;
  c.architecture = arch;
  c.hidden_size = detail::gguf_int(f, k + "embedding_length");
  c.num_layers = detail::gguf_int(f, k + "block_count");
  c.num_q_heads = detail::gguf_int(f, k + "attention.head_count");
  c.num_kv_heads = f.has(k + "attention.head_count_kv") ? detail::gguf_int(f, k + "attention.head_count_kv")
                                                         : c.num_q_heads;
  c.ffn_size = detail::gguf_int(f, k + "feed_forward_length");
  c.max_context = detail::gguf_int_in(f, k + "context_length", 0, 0, std::numeric_limits<int>::max());  // 0: unknown
  // The head size: embedding_length / head_count for llama and qwen2 (llama.cpp's shapes for them), Qwen3's own
  // attention.key_length (e.g. 128 at a hidden size of 1,024 in Qwen3-0.6B).
  if (arch == "qwen3" && f.has(k + "attention.key_length")) {
    c.head_dim = detail::gguf_int(f, k + "attention.key_length");
  } else {
    check(c.hidden_size % c.num_q_heads == 0, f.name(), ": embedding_length ", c.hidden_size,
          " is not divisible by head_count ", c.num_q_heads);
    c.head_dim = c.hidden_size / c.num_q_heads;
  }
  c.rope = arch == "llama" ? rope_style::interleaved : rope_style::half;  // the converter permutes Q/K for llama only
  c.qkv_bias = arch == "qwen2";
  c.qk_norm = arch == "qwen3";
  detail::check_gguf_llama_features(f, arch, c.head_dim);
  // Llama 3's RoPE scaling, as llama.cpp's converter stores it: one divisor per frequency.
  if (const auto* freqs = f.find_tensor("rope_freqs.weight")) {
    check(freqs->dims.size() == 1 && freqs->dims[0] == c.head_dim / 2, f.name(), ": tensor 'rope_freqs.weight' has shape ",
          detail::shape_string(*freqs), ", expected [", c.head_dim / 2, "] (head size / 2)");
    c.rope_scaling.type = rope_scaling_type::factors;
    c.rope_scaling.freq_factors = f.to_f32(*freqs);
  }
  c.rope_theta = detail::gguf_float(f, k + "rope.freq_base", 10000.0);
  c.rms_eps = detail::gguf_float(f, k + "attention.layer_norm_rms_epsilon", arch == "llama" ? 1e-5 : 1e-6);
  const auto& embd = f.tensor("token_embd.weight");
  check(embd.dims.size() == 2, f.name(), ": token_embd.weight must be 2-D, has shape ", detail::shape_string(embd));
  check(embd.dims[1] >= 1 && embd.dims[1] <= std::numeric_limits<int>::max(), f.name(),
        ": token_embd.weight has ", embd.dims[1], " rows, which is out of range for a vocabulary");
  c.vocab_size = static_cast<int>(embd.dims[1]);
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  c.bos = detail::gguf_token_key(f, "tokenizer.ggml.bos_token_id", arch == "llama" ? 1 : -1);
  c.eos = detail::gguf_token_key(f, "tokenizer.ggml.eos_token_id", arch == "llama" ? 2 : -1);
  if (gguf_has_bpe_vocab(f)) detail::add_gguf_end_of_generation(f, c);
  c.validate();
  return c;
}

template <class Backend = cpu_backend>
llama_model<Backend> load_llama_gguf(const gguf::file& f, const Backend& backend = {}) {
  const auto c = llama_config_from_gguf(f);
  detail::check_gguf_llama_tensors(f, c);
  auto m = [&](const std::string& name, int rows, int cols) { return detail::gguf_matrix(backend, f, name, rows, cols); };
  llama_weights<Backend> w;
  w.embedding = m("token_embd.weight", c.vocab_size, c.hidden_size);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    llama_layer_weights<Backend> lw;
    lw.attn_norm = m(p + "attn_norm.weight", 1, c.hidden_size);
    lw.wq = m(p + "attn_q.weight", c.q_size(), c.hidden_size);
    lw.wk = m(p + "attn_k.weight", c.kv_size(), c.hidden_size);
    lw.wv = m(p + "attn_v.weight", c.kv_size(), c.hidden_size);
    lw.wo = m(p + "attn_output.weight", c.hidden_size, c.q_size());
    if (c.qkv_bias) {
      lw.bq = m(p + "attn_q.bias", 1, c.q_size());
      lw.bk = m(p + "attn_k.bias", 1, c.kv_size());
      lw.bv = m(p + "attn_v.bias", 1, c.kv_size());
    }
    if (c.qk_norm) {
      lw.q_norm = m(p + "attn_q_norm.weight", 1, c.head_dim);
      lw.k_norm = m(p + "attn_k_norm.weight", 1, c.head_dim);
    }
    lw.ffn_norm = m(p + "ffn_norm.weight", 1, c.hidden_size);
    lw.w_gate = m(p + "ffn_gate.weight", c.ffn_size, c.hidden_size);
    lw.w_up = m(p + "ffn_up.weight", c.ffn_size, c.hidden_size);
    lw.w_down = m(p + "ffn_down.weight", c.hidden_size, c.ffn_size);
    w.layers.push_back(std::move(lw));
  }
  w.final_norm = m("output_norm.weight", 1, c.hidden_size);
  if (!c.tied_embeddings) w.lm_head = m("output.weight", c.vocab_size, c.hidden_size);
  prepare_linear_weights(backend, w);
  fuse_projections(backend, w);
  return llama_model<Backend>(c, std::move(w));
}

}  // namespace zipage
