// Plugging your own model type into zipage::engine.
//
// A model supplies its config and a forward pass; the engine supplies the paged KV cache, the
// scheduler and sampling. The forward pass calls ctx.attention(layer, q, k, v, out) once per layer:
// that one call appends the new K/V to the request's pages and attends over everything cached.
//
// This one is a single attention layer with random weights: small enough to read in a minute.
#include <cstdio>
#include <random>
#include <string_view>

#include "zipage/backend/cpu/cpu_backend.hpp"
#include "zipage/engine/engine.hpp"

namespace {

class tiny_attention_model {
 public:
  using backend_type = zipage::cpu_backend;
  using tensor = backend_type::tensor;

  explicit tiny_attention_model(unsigned seed) {
    cfg_.vocab_size = 32;
    cfg_.hidden_size = 16;
    cfg_.num_layers = 1;
    cfg_.num_q_heads = 4;
    cfg_.num_kv_heads = 2;  // grouped-query attention: two query heads share each KV head
    cfg_.head_dim = 4;
    cfg_.ffn_size = 16;
    cfg_.bos = 0;
    cfg_.eos = 31;
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 0.5f);
    auto random = [&](int rows, int cols) {
      tensor t(rows, cols);
      for (Eigen::Index i = 0; i < t.size(); ++i) t.data()[i] = normal(rng);
      return t;
    };
    embedding_ = random(cfg_.vocab_size, cfg_.hidden_size);
    wq_ = random(cfg_.q_size(), cfg_.hidden_size);
    wk_ = random(cfg_.kv_size(), cfg_.hidden_size);
    wv_ = random(cfg_.kv_size(), cfg_.hidden_size);
    wo_ = random(cfg_.hidden_size, cfg_.q_size());
  }

  const zipage::model_config& config() const { return cfg_; }

  // Returns logits [ctx.logits_rows().size()][vocab].
  tensor forward(zipage::forward_context<backend_type>& ctx) {
    auto& ops = ctx.backend();
    tensor x, q, k, v, attn, out, last;
    ops.embedding(embedding_, ctx.tokens(), x);
    ops.linear(x, wq_, q);
    ops.linear(x, wk_, k);
    ops.linear(x, wv_, v);
    ops.rope(q, ctx.positions(), cfg_.head_dim, cfg_.rope_theta, zipage::rope_style::half);
    ops.rope(k, ctx.positions(), cfg_.head_dim, cfg_.rope_theta, zipage::rope_style::half);
    ctx.attention(0, q, k, v, attn);
    ops.linear(attn, wo_, out);
    ops.add(x, out);
    ops.gather_rows(x, ctx.logits_rows(), last);
    tensor logits;
    ops.linear(last, embedding_, logits);  // tied output projection
    return logits;
  }

 private:
  zipage::model_config cfg_;
  tensor embedding_, wq_, wk_, wv_, wo_;
};

}  // namespace

int main(int argc, char** argv) {
  // It builds its own model: nothing to pass (an argument given is a mistake, not a model to load).
  if (argc > 1) {
    const bool help = std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h";
    std::fprintf(help ? stdout : stderr, "usage: zipage-example-custom-model  (no arguments: it runs a tiny model "
                 "of its own, defined in examples/custom_model/custom_model.cpp)\n");
    return help ? 0 : 2;
  }
  // Defaults: full KV (no eviction), the Zipage scheduler (zipage_scheduler), the model's backend.
  zipage::engine<tiny_attention_model> engine(tiny_attention_model(42), {.block_size = 4, .num_blocks = 64});

  zipage::sampling_params greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 12;
  greedy.ignore_eos = true;

  const std::vector<std::vector<zipage::token_id>> prompts = {{0, 5, 9}, {0, 1, 2, 3, 4, 5, 6}, {0, 17}};
  const auto batched = engine.generate(prompts, greedy);

  // Each request alone must give what it gave in the batch.
  bool ok = true;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const auto alone = engine.generate({prompts[i]}, greedy)[0];
    std::printf("request %zu:", i);
    for (auto t : batched[i].output) std::printf(" %d", t);
    std::printf("\n");
    ok = ok && alone.output == batched[i].output && batched[i].output.size() == 12;
  }
  const auto stats = engine.stats();
  std::printf("steps %lld, peak KV blocks %d of %d\n", static_cast<long long>(stats.steps), stats.peak_blocks_used,
              stats.num_blocks);
  std::printf("custom model: %s\n", ok ? "OK" : "MISMATCH");
  return ok ? 0 : 1;
}
