// A downstream program: builds the engine around its own one-layer model and generates, and reads the
// bundled model at the path the package exports (zipage_MODEL_DIR); linked with zipage::prebuilt, it also
// generates with zipage::llm on that model.
#include <cstdio>

#include <zipage/zipage.hpp>  // the umbrella header, as installed

namespace {

struct echo_model {
  using backend_type = zipage::cpu_backend;
  using tensor = backend_type::tensor;

  zipage::model_config cfg = [] {
    zipage::model_config c;
    c.vocab_size = 8;
    c.hidden_size = 8;
    c.num_layers = 1;
    c.num_q_heads = 2;
    c.num_kv_heads = 1;
    c.head_dim = 4;
    c.ffn_size = 8;
    c.bos = 0;
    c.eos = 7;
    return c;
  }();
  tensor embedding = tensor::Identity(8, 8);

  const zipage::model_config& config() const { return cfg; }

  // Attends over the cache and maps the hidden state of token t to logits favouring t + 1.
  tensor forward(zipage::forward_context<backend_type>& ctx) {
    tensor x, attn, last, logits;
    ctx.backend().embedding(embedding, ctx.tokens(), x);
    ctx.attention(0, x, x.leftCols(4), x.leftCols(4), attn);
    ctx.backend().gather_rows(x, ctx.logits_rows(), last);
    logits = tensor::Zero(last.rows(), 8);
    for (Eigen::Index r = 0; r < last.rows(); ++r) {
      Eigen::Index best;
      last.row(r).maxCoeff(&best);
      logits(r, (best + 1) % 8) = 10.0f;
    }
    return logits;
  }
};

}  // namespace

int main() {
  zipage::engine<echo_model> engine(echo_model{}, {.block_size = 4, .num_blocks = 8});
  zipage::sampling_params p;
  p.temperature = 0.0f;
  p.max_tokens = 5;
  p.ignore_eos = true;
  const auto out = engine.generate({{0, 1}}, p)[0].output;
  const auto model = zipage::gguf::file::open(ZIPAGE_MODEL_DIR "/stories260K.gguf");
  bool ok = out == std::vector<zipage::token_id>{2, 3, 4, 5, 6} && model.get_string("general.architecture") == "llama";
#if ZIPAGE_PREBUILT
  // Linked with zipage::prebuilt: zipage::llm's engine and loader come from the installed library.
  zipage::llm llm(ZIPAGE_MODEL_DIR "/stories260K.gguf");
  const auto text = llm.generate({"Once upon a time"}, {.temperature = 0.0f, .max_tokens = 8});
  std::printf("consumer: zipage::llm (zipage::prebuilt): %zu tokens:%s\n", text[0].token_ids.size(), text[0].text.c_str());
  ok = ok && text[0].token_ids.size() == 8 && text[0].reason == zipage::finish_reason::length;
#endif
  std::printf("consumer: %s\n", ok ? "OK" : "WRONG");
  return ok ? 0 : 1;
}
