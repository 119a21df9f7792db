// The user-facing API: zipage::llm (text in, text out, streaming, checkpoint sampling defaults) and the
// early, field-naming errors of engine_config and requests (issue 13). This file is compiled with
// -Werror=missing-field-initializers (tests/CMakeLists.txt), so the designated initialisers below — the
// README's style — must not warn.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zipage/gguf/writer.hpp"
#include "zipage/safetensors/writer.hpp"
#include "zipage/zipage.hpp"
#include "counting_model.hpp"
#include "gguf_edit.hpp"
#include "stories_model.hpp"
#include "test_support.hpp"

using namespace zipage;
using zipage::testing::contains;
using zipage::testing::error_of;

namespace {

// The bundled model's greedy story, as zipage-generate prints it.
const std::string story = ", there was a little girl named Lily. She loved to play outside in the park.";

llm& stories_llm() {
  static llm l(zipage::testing::stories_model_path(), llm_options{.device = llm_device::cpu});
  return l;
}

using echo_model = zipage::testing::counting_model;  // after token t it emits t + 1

// A tiny random Qwen3 checkpoint directory with the Qwen3 tokenizer and a generation_config.json. With
// `always` >= 0 the weights are not random: every step's greedy token is `always` (its embedding row is twice
// the others', all (1, ..., 1); the layer's matrices are zero), and config.json's eos is `eos`.
void write_qwen3_checkpoint(const std::filesystem::path& out, int eos = 151645, int always = -1) {
  namespace fs = std::filesystem;
  const int hidden = 16, heads = 2, kv_heads = 1, head_dim = 8, ffn = 32, vocab = 151936;
  const nlohmann::json config = {
      {"architectures", {"Qwen3ForCausalLM"}}, {"model_type", "qwen3"}, {"hidden_size", hidden},
      {"num_hidden_layers", 1}, {"num_attention_heads", heads}, {"num_key_value_heads", kv_heads},
      {"head_dim", head_dim}, {"intermediate_size", ffn}, {"vocab_size", vocab}, {"rms_norm_eps", 1e-6},
      {"rope_theta", 1000000.0}, {"tie_word_embeddings", true}, {"max_position_embeddings", 4096},
      {"bos_token_id", 151643}, {"eos_token_id", eos}, {"torch_dtype", "bfloat16"}};
  std::ofstream(out / "config.json") << config.dump();
  const nlohmann::json gen = {{"do_sample", true}, {"temperature", 0.6}, {"top_k", 20}, {"top_p", 0.95}};
  std::ofstream(out / "generation_config.json") << gen.dump();
  const fs::path tok = fs::path(ZIPAGE_TEST_DATA_DIR) / "qwen3";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(tok / f, out / f);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  safetensors::writer w;
  auto tensor = [&](const std::string& name, std::vector<std::int64_t> shape) {
    std::size_t n = 1;
    for (auto d : shape) n *= static_cast<std::size_t>(d);
    std::vector<float> v(n);
    for (float& x : v) x = shape.size() == 1 ? 1.0f : always >= 0 ? 0.0f : u(rng);
    if (always >= 0 && name == "model.embed_tokens.weight")
      for (std::size_t i = 0; i < n; ++i)
        v[i] = i / static_cast<std::size_t>(hidden) == static_cast<std::size_t>(always) ? 2.0f : 1.0f;
    w.add(name, shape, v, safetensors::dtype::bf16);
  };
  tensor("model.embed_tokens.weight", {vocab, hidden});
  const std::string p = "model.layers.0.";
  tensor(p + "input_layernorm.weight", {hidden});
  tensor(p + "self_attn.q_proj.weight", {heads * head_dim, hidden});
  tensor(p + "self_attn.k_proj.weight", {kv_heads * head_dim, hidden});
  tensor(p + "self_attn.v_proj.weight", {kv_heads * head_dim, hidden});
  tensor(p + "self_attn.o_proj.weight", {hidden, heads * head_dim});
  tensor(p + "self_attn.q_norm.weight", {head_dim});
  tensor(p + "self_attn.k_norm.weight", {head_dim});
  tensor(p + "post_attention_layernorm.weight", {hidden});
  tensor(p + "mlp.gate_proj.weight", {ffn, hidden});
  tensor(p + "mlp.up_proj.weight", {ffn, hidden});
  tensor(p + "mlp.down_proj.weight", {hidden, ffn});
  tensor("model.norm.weight", {hidden});
  w.write(out / "model.safetensors");
}

}  // namespace

TEST_CASE("llm: a GGUF file by path, text in, text out, tokens and finish reasons") {
  llm& l = stories_llm();
  CHECK(std::string(l.device()) == "cpu");
  // The bundled file sets no general.sampling.* keys: vLLM's defaults (temperature 1, no filters, seed 0), so
  // a run with no parameters samples, and repeats.
  CHECK(l.default_sampling().temperature == 1.0f);
  CHECK(l.default_sampling().top_k == 0);
  CHECK(l.default_sampling().top_p == 1.0f);
  CHECK(l.default_sampling().seed == 0);
  const auto sampled = l.generate({"Once upon a time"});
  CHECK(sampled[0].token_ids.size() > 0);
  CHECK(l.generate({"Once upon a time"})[0].text == sampled[0].text);
  const auto out = l.generate({"Once upon a time", "Once upon a time"}, {.temperature = 0.0f, .max_tokens = 30});
  REQUIRE(out.size() == 2);
  CHECK(out[0].prompt == "Once upon a time");
  CHECK(out[0].text.rfind(story, 0) == 0);
  CHECK(out[0].token_ids.size() == 30);
  CHECK(out[0].reason == finish_reason::length);
  CHECK(out[0].stop_reason == stopped_by{});  // vLLM's stop_reason: none for length
  CHECK(out[0].ok());
  CHECK(out[1].text == out[0].text);
  CHECK(l.decode(out[0].token_ids) == out[0].text);
  CHECK(out[0].prompt_token_ids == l.encode("Once upon a time"));

  // Stop strings work: the detokenizer is wired in.
  const auto stopped = l.generate({"Once upon a time"}, {.temperature = 0.0f, .max_tokens = 100, .stop = {"Lily"}});
  CHECK(stopped[0].reason == finish_reason::stop_string);
  CHECK(stopped[0].stop_reason == stopped_by(std::string("Lily")));  // the stop string that matched
  CHECK(stopped[0].text == ", there was a little girl named ");
  CHECK(l.stats().waiting == 0);
  CHECK(l.stats().blocks_in_use == 0);

  // Log-probabilities: each token's, and the most likely alternatives (greedy: the first is the token).
  const auto lp = l.generate({"Once upon a time"}, {.temperature = 0.0f, .max_tokens = 5, .logprobs = true, .top_logprobs = 3});
  REQUIRE(lp[0].logprobs.size() == 5);
  REQUIRE(lp[0].top_logprobs.size() == 5);
  for (std::size_t i = 0; i < 5; ++i) {
    REQUIRE(lp[0].top_logprobs[i].size() == 3);
    CHECK(lp[0].top_logprobs[i][0].id == lp[0].token_ids[i]);
    CHECK(lp[0].top_logprobs[i][0].logprob == doctest::Approx(lp[0].logprobs[i]));
  }
}

TEST_CASE("load_model: a model and its text side by path, for tools that build their own engine") {
  const auto m = load_model(zipage::testing::stories_model_path());
  REQUIRE(m.spm != nullptr);
  CHECK(m.bpe == nullptr);
  CHECK_FALSE(m.generation.sets_sampling());
  CHECK(m.stop_token_ids.empty());
  CHECK(m.encode("Once upon a time") == stories_llm().encode("Once upon a time"));
  const auto make = m.detokenizer();
  const auto ids = m.encode("Once upon a time");
  auto detok = make(ids);
  std::string text;
  for (token_id t : stories_llm().encode(" there was")) if (t != m.model.config().bos) text += detok(t);
  CHECK(contains(text, "there was"));
  CHECK(contains(error_of([] { (void)load_model("/nonexistent"); }), "/nonexistent: no such file or directory"));
}

TEST_CASE("llm: a GGUF file's general.sampling.* keys are its sampling defaults") {
  const zipage::testing::temp_dir dir("gguf_sampling");
  {
    gguf::writer w = zipage::testing::gguf_copy(gguf::file::open(zipage::testing::stories_model_path()));
    w.set("general.sampling.temp", 0.6f);
    w.set("general.sampling.top_k", std::int32_t{20});
    w.set("general.sampling.top_p", 0.95f);
    w.write(dir.path / "sampling.gguf");
  }
  llm l((dir.path / "sampling.gguf").string());
  CHECK(l.default_sampling().temperature == doctest::Approx(0.6f));
  CHECK(l.default_sampling().top_k == 20);
  CHECK(l.default_sampling().top_p == doctest::Approx(0.95f));
  CHECK(l.default_sampling().min_p == 0.0f);  // not set: vLLM's default
  const auto m = load_model(dir.path / "sampling.gguf");
  CHECK(m.generation.sets_sampling());
  CHECK(contains(m.generation.source, "sampling.gguf (general.sampling)"));
}

TEST_CASE("llm, load_model: a SentencePiece GGUF file's tokenizer.ggml.add_bos_token = false puts no BOS first") {
  // llama.cpp reads the key; zipage's encoders added BOS to every SentencePiece prompt whatever it said.
  const zipage::testing::temp_dir dir("gguf_no_bos");
  {
    gguf::writer w = zipage::testing::gguf_copy(gguf::file::open(zipage::testing::stories_model_path()));
    w.set("tokenizer.ggml.add_bos_token", false);
    w.write(dir.path / "no_bos.gguf");
  }
  const auto with_bos = load_model(zipage::testing::stories_model_path());
  const auto m = load_model(dir.path / "no_bos.gguf");
  REQUIRE(m.spm != nullptr);
  CHECK_FALSE(m.spm->add_bos());
  const auto ids = m.encode("Once upon a time");
  CHECK(with_bos.encode("Once upon a time").front() == with_bos.spm->bos());  // the bundled file: no key, BOS
  CHECK(ids == m.spm->encode("Once upon a time", false));
  CHECK(ids.front() != m.spm->bos());
  llm l((dir.path / "no_bos.gguf").string());
  CHECK(l.encode("Once upon a time") == ids);
}

TEST_CASE("llm: streaming, as an iterator and with a callback, adds up to the generated text") {
  llm& l = stories_llm();
  const sampling_params p{.temperature = 0.0f, .max_tokens = 30};
  const auto whole = l.generate({"Once upon a time", "The little dog"}, p);

  std::vector<std::string> streamed(2);
  int finished = 0;
  auto s = l.stream({"Once upon a time", "The little dog"}, p);
  for (const stream_piece& piece : s) {
    REQUIRE(piece.index < 2);
    streamed[piece.index] += piece.text;
    finished += piece.finished;
  }
  CHECK(finished == 2);
  CHECK(streamed[0] == whole[0].text);
  CHECK(streamed[1] == whole[1].text);
  REQUIRE(s.results().size() == 2);
  CHECK(s.results()[1].text == whole[1].text);

  // The last piece says which stop string ended it, as the completion does (vLLM's stop_reason).
  sampling_params stop_p = p;
  stop_p.stop = {"Lily"};
  stopped_by last_stop{};
  for (const stream_piece& piece : l.stream({"Once upon a time"}, stop_p)) {
    if (!piece.finished) CHECK(piece.stop_reason == stopped_by{});
    if (piece.finished) last_stop = piece.stop_reason;
  }
  CHECK(last_stop == stopped_by(std::string("Lily")));

  std::string via_callback;
  const auto out = l.generate({"Once upon a time"}, p, [&](const stream_piece& piece) { via_callback += piece.text; });
  CHECK(via_callback == out[0].text);
  CHECK(out[0].text == whole[0].text);

  // A stream dropped half-way cancels what is left and frees its blocks.
  {
    auto partial = l.stream({"Once upon a time"}, p);
    auto it = partial.begin();
    for (int i = 0; i < 3; ++i) ++it;
  }
  CHECK(l.stats().blocks_in_use == 0);
  CHECK(l.generate({"Once upon a time"}, p)[0].text == whole[0].text);
}

TEST_CASE("llm: a stop token's text is left out of the output, as vLLM, unless include_stop_str_in_output") {
  // It stayed in the text (EOS's never did). vLLM's detokenizer leaves it out; its id stays in the tokens.
  llm& l = stories_llm();
  const auto whole = l.generate({"Once upon a time"}, {.temperature = 0.0f, .max_tokens = 12})[0];
  std::size_t k = 4;  // the first token from the 5th on that did not occur before, with some text
  while (std::find(whole.token_ids.begin(), whole.token_ids.begin() + static_cast<std::ptrdiff_t>(k),
                   whole.token_ids[k]) != whole.token_ids.begin() + static_cast<std::ptrdiff_t>(k))
    ++k;
  REQUIRE(k < whole.token_ids.size());
  const std::vector<token_id> before(whole.token_ids.begin(), whole.token_ids.begin() + static_cast<std::ptrdiff_t>(k));
  std::vector<token_id> with = before;
  with.push_back(whole.token_ids[k]);
  REQUIRE(l.decode(with).size() > l.decode(before).size());
  for (bool include : {false, true}) {
    CAPTURE(include);
    const sampling_params p{.temperature = 0.0f, .max_tokens = 12, .stop_token_ids = {whole.token_ids[k]},
                            .include_stop_str_in_output = include};
    std::string streamed;
    const auto out = l.generate({"Once upon a time"}, p, [&](const stream_piece& piece) { streamed += piece.text; })[0];
    CHECK(out.reason == finish_reason::stop_token);
    CHECK(out.stop_reason == stopped_by(whole.token_ids[k]));  // vLLM's stop_reason: the stop token's id
    CHECK(out.token_ids == with);  // the stop token's id stays in the output tokens
    CHECK(out.text == l.decode(include ? with : before));
    CHECK(streamed == out.text);  // nor is it streamed
  }
  // include_stop_str_in_output keeps a stop string too, and cuts only what follows it.
  std::string streamed;
  const auto kept = l.generate({"Once upon a time"}, {.temperature = 0.0f, .max_tokens = 100, .stop = {"Lil"},
                                                      .include_stop_str_in_output = true},
                               [&](const stream_piece& piece) { streamed += piece.text; })[0];
  CHECK(kept.reason == finish_reason::stop_string);
  CHECK(kept.text == ", there was a little girl named Lil");
  CHECK(streamed == kept.text);
}

TEST_CASE("llm: generate() is atomic: a bad prompt among several leaves nothing queued") {
  llm& l = stories_llm();
  std::string too_long;
  for (int i = 0; i < 200; ++i) too_long += " and then the cat sat down";
  const std::string e = error_of([&] { (void)l.generate({"Once upon a time", too_long}); });
  CHECK(contains(e, "prompt 1 of 2"));
  CHECK(contains(e, "max_context"));
  CHECK(contains(e, "no request was queued"));
  CHECK(l.stats().waiting == 0);
  CHECK(l.stats().running == 0);
  CHECK(l.generate({"Once upon a time"}, {.temperature = 0.0f, .max_tokens = 30})[0].text.rfind(story, 0) == 0);
}

TEST_CASE("llm: a Hugging Face directory by path, sampling defaults from its generation_config.json") {
  zipage::testing::temp_dir dir("zipage_llm_hf");
  write_qwen3_checkpoint(dir.path);
  llm l(dir.path, llm_options{.device = llm_device::cpu, .engine = {.block_size = 16, .num_blocks = 160}});
  const sampling_params& d = l.default_sampling();
  CHECK(d.temperature == doctest::Approx(0.6f));
  CHECK(d.top_k == 20);
  CHECK(d.top_p == doctest::Approx(0.95f));
  CHECK(l.hf_tokenizer() != nullptr);
  CHECK(l.encode("Hello world") == l.hf_tokenizer()->encode("Hello world"));
  sampling_params p = l.default_sampling();
  p.max_tokens = 5;
  p.ignore_eos = true;
  p.stop_token_ids.clear();
  const auto out = l.generate({"Hello world", "The capital of France is"}, p);
  REQUIRE(out.size() == 2);
  CHECK(out[0].token_ids.size() == 5);
  CHECK(out[1].reason == finish_reason::length);

  // Chat through the checkpoint's template (Qwen3's): the rendered prompt ends ready for the answer.
  chat_options no_thinking;
  no_thinking.enable_thinking = false;
  const auto chat = l.chat({{{"user", "What is 2+2?"}}}, p, no_thinking);
  REQUIRE(chat.size() == 1);
  CHECK(chat[0].prompt == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  CHECK(chat[0].prompt_token_ids == l.hf_tokenizer()->encode(chat[0].prompt));
  CHECK(chat[0].token_ids.size() == 5);
  // OpenAI message objects and tools (vLLM's LLM.chat(messages, tools=...)): Qwen3's template writes the tools
  // into a system turn and the tool call into the assistant's.
  chat_options with_tools;
  with_tools.tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather"}}])");
  const auto calls = l.chat_json({nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "22C"}])")}, p, with_tools);
  REQUIRE(calls.size() == 1);
  CHECK(calls[0].prompt.starts_with("<|im_start|>system\n# Tools\n"));
  CHECK(calls[0].prompt.find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}\n</tools>") != std::string::npos);
  CHECK(calls[0].prompt.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>") != std::string::npos);
  CHECK(calls[0].prompt.ends_with("<tool_response>\n22C\n</tool_response><|im_end|>\n<|im_start|>assistant\n"));
  CHECK(calls[0].token_ids.size() == 5);
  // A GGUF model has no chat template.
  CHECK(contains(error_of([] { (void)stories_llm().chat({{{"user", "hi"}}}); }), "chat needs a checkpoint"));
}

// A policy whose scoring fails: the request ends with an error when it reaches its first compression.
struct failing_policy : policy_base {
  std::string_view name() const { return "failing"; }
  void score(const score_context&, std::span<float>, std::span<float>) const { fail("the policy failed on purpose"); }
};

TEST_CASE("llm: ignore_eos also ignores the tokenizer's end of turn that llm adds as a stop id (vLLM's ignore_eos)") {
  // A base checkpoint: config.json's eos is <|endoftext|>, the tokenizer's <|im_end|> (151645), which llm adds
  // as a stop id. The model always emits <|im_end|>.
  zipage::testing::temp_dir dir("zipage_llm_ignore_eos");
  write_qwen3_checkpoint(dir.path, 151643, 151645);
  llm l(dir.path, llm_options{.device = llm_device::cpu, .engine = {.block_size = 16, .num_blocks = 160}});
  const auto stops = l.generate({"Hello"}, {.temperature = 0.0f, .max_tokens = 4})[0];
  CHECK(stops.reason == finish_reason::stop_token);
  CHECK(stops.token_ids == std::vector<token_id>{151645});
  // The tokenizer's EOS is the model's own to vLLM (its eos_token_id): no stop_reason, as for the config's eos.
  CHECK(stops.stop_reason == stopped_by{});
  // ignore_eos keeps generating past it (it stopped after one token), from the defaults too.
  const auto past = l.generate({"Hello"}, {.temperature = 0.0f, .max_tokens = 4, .ignore_eos = true})[0];
  CHECK(past.reason == finish_reason::length);
  CHECK(past.token_ids == std::vector<token_id>(4, 151645));
  sampling_params d = l.default_sampling();
  d.max_tokens = 3;
  d.ignore_eos = true;
  CHECK(l.generate({"Hello"}, d)[0].token_ids.size() == 3);
  // An id the caller names stays a stop id under ignore_eos.
  const auto named = l.generate({"Hello"}, {.temperature = 0.0f, .max_tokens = 4, .ignore_eos = true,
                                            .stop_token_ids = {151645}})[0];
  CHECK(named.reason == finish_reason::stop_token);
  CHECK(named.stop_reason == stopped_by(token_id{151645}));  // named by the caller under ignore_eos: its id
}

TEST_CASE("load_model: engine_settings() gives an engine of your own the tokenizer's end of turn, which min_tokens "
          "masks under ignore_eos too (vLLM's all_stop_token_ids)") {
  // The base checkpoint of the case above: config eos <|endoftext|>, the tokenizer's <|im_end|> (151645), which the
  // model always emits. Built by hand as the README says, with the end of turn added per request (with_end_of_turn),
  // an engine masked it before min_tokens only without ignore_eos: with it, with_end_of_turn leaves it out and the
  // engine did not know it (engine_config::tokenizer_eos unset), so the first token was <|im_end|>.
  zipage::testing::temp_dir dir("zipage_load_model_end_of_turn");
  write_qwen3_checkpoint(dir.path, 151643, 151645);
  auto m = load_model(dir.path);
  REQUIRE(m.stop_token_ids == std::vector<token_id>{151645});
  const engine_config cfg = m.engine_settings({.block_size = 16, .num_blocks = 160});
  CHECK(cfg.tokenizer_eos == 151645);
  engine<llama_model<cpu_backend>> eng(std::move(m.model), cfg);
  const auto prompt = m.encode("Hello");
  sampling_params p{.temperature = 0.0f, .max_tokens = 5, .ignore_eos = true, .min_tokens = 2};
  auto out = eng.generate({prompt}, with_end_of_turn(p, m.stop_token_ids))[0];
  CHECK(out.reason == finish_reason::length);
  REQUIRE(out.output.size() == 5);
  CHECK(out.output[0] != 151645);
  CHECK(out.output[1] != 151645);
  CHECK(std::count(out.output.begin(), out.output.end(), 151645) == 3);
  // Without ignore_eos the same two tokens, then it ends the request, with no stop_reason (vLLM's eos_token_id).
  p.ignore_eos = false;
  const auto stops = eng.generate({prompt}, with_end_of_turn(p, m.stop_token_ids))[0];
  CHECK(stops.reason == finish_reason::stop_token);
  CHECK(stops.output == std::vector<token_id>{out.output[0], out.output[1], 151645});
  CHECK(stops.stop_reason == stopped_by{});
  // And the rest of the wiring: text and bad words.
  CHECK(!stops.text.empty());
  p.bad_words = {"Hello"};
  CHECK(eng.generate({prompt}, with_end_of_turn(p, m.stop_token_ids))[0].output == stops.output);
}

TEST_CASE("load_model: engine_settings() keeps a detokenizer, words encoder and tokenizer_eos the caller set") {
  auto m = load_model(zipage::testing::stories_model_path());
  engine_config mine;
  int detokenizers = 0;
  const auto theirs = m.detokenizer();
  mine.make_detokenizer = [&](std::span<const token_id> prompt) {
    ++detokenizers;
    return theirs(prompt);
  };
  mine.encode_words = [](const std::string&) { return std::vector<token_id>{7}; };
  mine.tokenizer_eos = 5;
  const engine_config cfg = m.engine_settings(mine);
  (void)cfg.make_detokenizer(std::vector<token_id>{1});
  CHECK(detokenizers == 1);
  CHECK(cfg.encode_words("anything") == std::vector<token_id>{7});
  CHECK(cfg.tokenizer_eos == 5);
  CHECK(cfg.guide_vocab != nullptr);  // what the caller left unset is still wired
  // Unset, each comes from the model's tokenizer.
  const engine_config wired = m.engine_settings();
  REQUIRE(m.spm != nullptr);
  CHECK(wired.encode_words("Once") == m.spm->encode("Once", false));
  CHECK(wired.make_detokenizer);
}

TEST_CASE("llm: a request whose compression fails ends the stream with an error instead of hanging") {
  basic_llm<failing_policy> l(zipage::testing::stories_model_path(),
                              llm_options{.device = llm_device::cpu, .engine = {.block_size = 16, .budget_tokens = 32, .window = 8}});
  int finished = 0;
  auto s = l.stream({"Once upon a time", "Once upon a time"}, {.temperature = 0.0f, .max_tokens = 100});
  for (const stream_piece& piece : s) finished += piece.finished;
  CHECK(finished == 2);
  REQUIRE(s.results().size() == 2);
  CHECK(s.results()[0].reason == finish_reason::error);
  CHECK(contains(s.results()[0].error, "the policy failed on purpose"));
  CHECK_FALSE(s.results()[1].ok());
  CHECK(l.stats().blocks_in_use == 0);
}

TEST_CASE("llm: a missing model or an unavailable device is a clear error") {
  CHECK(contains(error_of([] { llm l("/nonexistent/model.gguf"); }), "/nonexistent/model.gguf: no such file or directory"));
#if !ZIPAGE_WITH_CUDA
  CHECK(contains(error_of([] { llm l(zipage::testing::stories_model_path(), {.device = llm_device::cuda}); }),
                 "does not link zipage::cuda"));
#endif
}

TEST_CASE("engine_config: num_blocks < 0 names num_blocks, not bytes") {
  const std::string e = error_of([] { engine<echo_model> eng(echo_model{}, {.block_size = 4, .num_blocks = -5}); });
  CHECK(contains(e, "engine_config::num_blocks must be >= 0"));
  CHECK(contains(e, "got -5"));
  CHECK_FALSE(contains(e, "bytes hold"));
  CHECK(contains(error_of([] { engine<echo_model> eng(echo_model{}, {.num_blocks = 0, .kv_cache_bytes = 0}); }),
                 "engine_config::kv_cache_bytes must be > 0"));
  CHECK(contains(error_of([] { engine<echo_model> eng(echo_model{}, {.num_query_slots = -1}); }),
                 "engine_config::num_query_slots must be >= 0"));
}

TEST_CASE("engine_config: a budget larger than the pool is refused at construction") {
  const std::string e = error_of([] {
    engine<echo_model, zipage_policy> eng(echo_model{}, {.block_size = 4, .num_blocks = 16, .budget_tokens = 64, .window = 4});
  });
  CHECK(contains(e, "engine_config::budget_tokens = 64 (16 blocks of 4 tokens) needs 17 KV blocks per request (the budget "
                    "and the write block)"));
  CHECK(contains(e, "the pool has 16 (engine_config::num_blocks)"));
  // A model whose whole context is smaller than the budget needs its context's blocks, and the message says so.
  const std::string c = error_of([] {
    engine<echo_model, zipage_policy> eng(echo_model(32), {.block_size = 4, .num_blocks = 7, .budget_tokens = 64, .window = 4});
  });
  CHECK(contains(c, "needs 8 KV blocks per request (the model's whole context of 32 tokens), but the pool has 7"));
  // Exactly B + 1 blocks is enough; and a model whose context fits the pool needs no more than its context.
  CHECK_NOTHROW((engine<echo_model, zipage_policy>(echo_model{}, {.block_size = 4, .num_blocks = 17, .budget_tokens = 64, .window = 4})));
  CHECK_NOTHROW((engine<echo_model, zipage_policy>(echo_model(32), {.block_size = 4, .num_blocks = 8, .budget_tokens = 64, .window = 4})));
  // Unless the context is opted out of.
  CHECK_THROWS_AS((engine<echo_model, zipage_policy>(echo_model(32), {.block_size = 4, .num_blocks = 8, .budget_tokens = 64,
                                                                      .window = 4, .allow_beyond_context = true})),
                  zipage::error);
}

TEST_CASE("requests: max_context is enforced unless engine_config::allow_beyond_context") {
  engine<echo_model> eng(echo_model(16), {.block_size = 4, .num_blocks = 32});
  const sampling_params p{.temperature = 0.0f, .max_tokens = 100, .ignore_eos = true};
  const std::string e = error_of([&] { (void)eng.add_request(std::vector<token_id>(16, 1), p); });
  CHECK(contains(e, "a prompt of 16 tokens does not fit the model's context of 16 tokens"));
  CHECK(contains(e, "engine_config::allow_beyond_context"));
  CHECK_FALSE(eng.has_unfinished());
  // A prompt that fits stops at the context (finish_reason::length).
  const auto out = eng.generate({std::vector<token_id>(10, 1)}, p)[0];
  CHECK(out.output.size() == 6);
  CHECK(out.reason == finish_reason::length);

  engine<echo_model> open(echo_model(16), {.block_size = 4, .num_blocks = 32, .allow_beyond_context = true});
  const auto beyond = open.generate({std::vector<token_id>(20, 1)}, {.temperature = 0.0f, .max_tokens = 8, .ignore_eos = true})[0];
  CHECK(beyond.output.size() == 8);
}

TEST_CASE("requests: generate() is all or none; stop strings need a detokenizer") {
  engine<echo_model> eng(echo_model{}, {.block_size = 4, .num_blocks = 16});
  const sampling_params p{.temperature = 0.0f, .max_tokens = 3};
  const std::string e = error_of([&] { (void)eng.generate({{0, 1}, {0, 2}, {}}, p); });
  CHECK(contains(e, "prompt 2 of 3"));
  CHECK(contains(e, "the prompt is empty"));
  CHECK_FALSE(eng.has_unfinished());
  CHECK(eng.requests().empty());
  CHECK(eng.generate({{0, 1}}, p)[0].output == std::vector<token_id>{2, 3, 4});

  const std::string s = error_of([&] { (void)eng.add_request({0, 1}, {.max_tokens = 3, .stop = {"\n"}}); });
  CHECK(contains(s, "sampling_params::stop"));
  CHECK(contains(s, "engine_config::make_detokenizer"));
  CHECK_FALSE(eng.has_unfinished());
}

TEST_CASE("the README's designated initialisers compile without warnings") {
  // Compiled with -Werror=missing-field-initializers: these would not build if they warned.
  const engine_config cfg{.block_size = 16, .num_blocks = 1024};
  const sampling_params p{.temperature = 0.6f, .top_p = 0.95f, .max_tokens = 64};
  const llm_options o{.device = llm_device::cpu, .engine = {.block_size = 16, .num_blocks = 64}};
  CHECK(cfg.num_blocks == 1024);
  CHECK(p.max_tokens == 64);
  CHECK(o.engine.block_size == 16);
}

TEST_CASE("llm: structured output (sampling_params::guided) on a SentencePiece and a byte-level BPE vocabulary") {
  // zipage::llm wires each token's bytes (engine_config::guide_vocab) itself: the caller only sets the spec.
  zipage::testing::temp_dir dir("zipage_llm_guided");
  write_qwen3_checkpoint(dir.path);
  llm qwen(dir.path, llm_options{.device = llm_device::cpu, .engine = {.block_size = 16, .num_blocks = 160}});
  const std::vector<std::string> choices = {"red", "green", "blue sky", "日本"};
  for (llm* l : {&stories_llm(), &qwen}) {
    for (std::uint64_t seed = 0; seed < 3; ++seed) {
      sampling_params p;
      p.temperature = 1.0f;
      p.seed = seed;
      p.max_tokens = 32;
      p.guided.choice = choices;
      const auto out = l->generate({"Once upon a time"}, p)[0];
      CAPTURE(out.text);
      CHECK(std::find(choices.begin(), choices.end(), out.text) != choices.end());
      p.guided = {};
      p.guided.regex = "[0-9]{3}-[a-z]{2}";
      const auto re = l->generate({"Once upon a time"}, p)[0];
      CAPTURE(re.text);
      CHECK(re.text.size() == 6);
      CHECK(compile_guided_regex("[0-9]{3}-[a-z]{2}").matches(re.text));
      // Most tokens allowed at each step (the guide bans the others): on Qwen3's vocabulary any line of 1 to 12
      // characters, whole UTF-8 characters only.
      p.guided.regex = "[^\\n]{1,12}";
      const auto line = l->generate({"Once upon a time"}, p)[0];
      CAPTURE(line.text);
      CHECK(compile_guided_regex("[^\\n]{1,12}").matches(line.text));
      CHECK(line.reason == finish_reason::eos);
      // A JSON schema (bounded, so that the output ends within max_tokens): the text parses and has its keys.
      p.guided = {};
      p.max_tokens = 80;
      p.guided.json_schema = R"({"type":"object","properties":{"word":{"type":"string","maxLength":4},
                                 "n":{"enum":[1,2,3]},"ok":{"type":"boolean"}},"required":["word","n"]})";
      const auto js = l->generate({"Once upon a time"}, p)[0];
      CAPTURE(js.text);
      CHECK(js.reason == finish_reason::eos);
      nlohmann::json v;
      REQUIRE_NOTHROW(v = nlohmann::json::parse(js.text));
      CHECK(v.at("word").is_string());
      CHECK((v.at("n") == 1 || v.at("n") == 2 || v.at("n") == 3));
      CHECK((!v.contains("ok") || v["ok"].is_boolean()));
      CHECK(v.size() == (v.contains("ok") ? 3u : 2u));
    }
  }
  sampling_params bad;
  bad.guided.regex = "a(?!b)";
  const std::string msg = error_of([&] { (void)stories_llm().generate({"Once"}, bad); });
  CHECK(contains(msg, "guided_regex"));
  CHECK(contains(msg, "lookaround"));
  bad.guided = {};
  bad.guided.json_schema = R"({"type":"object","properties":{"a":{"not":{}}}})";
  const std::string json_msg = error_of([&] { (void)stories_llm().generate({"Once"}, bad); });
  CHECK(contains(json_msg, "guided_json"));
  CHECK(contains(json_msg, "'not' at /properties/a"));
}
