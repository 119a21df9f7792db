// GGUF files with a byte-level BPE vocabulary: Qwen2 / Qwen3 (qwen2 / qwen3 architectures) and Llama 3 (llama with
// Llama 3's pre-tokenizer, a BOS and its RoPE scaling as rope_freqs.weight), checked two ways:
// - against the Hugging Face checkpoint they were written from (make_gguf_fixture, the way llama.cpp's converter
//   writes them): same configuration, vocabulary, chat template and logits;
// - against llama.cpp itself on that file (tests/gguf_oracle/run.sh wrote tests/data/gguf/llama_cpp_qwen*): its
//   token ids for 400 random texts and its logits (the 32 largest and the log-sum-exp at every position).
// The fixtures are written by ctest (zipage_eval_fixture, zipage_qwen2_fixture, zipage_gguf_fixture*) into the
// directory ZIPAGE_QWEN_FIXTURES names; run through ctest.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "gguf_edit.hpp"
#include "greedy.hpp"
#include "test_support.hpp"
#include "zipage/backend/cpu/prefill_logits.hpp"
#include "zipage/core/json.hpp"
#include "zipage/engine/engine.hpp"
#include "zipage/gguf/writer.hpp"
#include "zipage/models/hf_loader.hpp"
#include "zipage/models/load_model.hpp"
#include "zipage/tokenizer/bpe_tokenizer.hpp"

namespace fs = std::filesystem;
namespace gg = zipage::gguf;
using namespace zipage;
using zipage::testing::contains;
using zipage::testing::error_of;
using zipage::testing::greedy_ignoring_eos;

namespace {

fs::path fixtures() {
  const char* dir = std::getenv("ZIPAGE_QWEN_FIXTURES");
  REQUIRE_MESSAGE(dir != nullptr, "ZIPAGE_QWEN_FIXTURES is not set: run this test through ctest, which writes the fixtures");
  return dir;
}

std::string data_path(const std::string& name) { return std::string(ZIPAGE_TEST_DATA_DIR) + "/gguf/" + name; }

// Full logits of `model` at every position of `tokens` but the last ([positions][vocab]).
template <class Model>
std::vector<float> logits_of(Model& model, const std::vector<token_id>& tokens) {
  const std::vector<token_id> inputs(tokens.begin(), tokens.end() - 1);
  std::vector<std::int32_t> rows(inputs.size());
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<std::int32_t>(i);
  return cpu_prefill_logits(model, inputs, rows);
}

void check_same_config(const model_config& g, const model_config& h) {
  CHECK(g.hidden_size == h.hidden_size);
  CHECK(g.num_layers == h.num_layers);
  CHECK(g.num_q_heads == h.num_q_heads);
  CHECK(g.num_kv_heads == h.num_kv_heads);
  CHECK(g.head_dim == h.head_dim);
  CHECK(g.ffn_size == h.ffn_size);
  CHECK(g.vocab_size == h.vocab_size);
  CHECK(g.max_context == h.max_context);
  CHECK(g.rope_theta == h.rope_theta);
  CHECK(g.rms_eps == doctest::Approx(h.rms_eps));
  CHECK(g.rope == h.rope);
  CHECK(g.qk_norm == h.qk_norm);
  CHECK(g.qkv_bias == h.qkv_bias);
  CHECK(g.tied_embeddings == h.tied_embeddings);
  CHECK(g.eos == h.eos);
}

// llama.cpp's run on a Qwen GGUF file (llama_golden golden_top).
struct llama_cpp_top_run {
  std::vector<std::string> prompts;
  std::vector<std::vector<token_id>> tokens;
  std::vector<std::vector<std::int64_t>> top_ids;   // [positions * K]
  std::vector<std::vector<float>> top_logits;       // [positions * K]
  std::vector<std::vector<float>> logsumexp;        // [positions]
  int steps = 0, top = 0;
};

llama_cpp_top_run read_top_run(const std::string& path) {
  const gg::file g = gg::file::open(path);
  llama_cpp_top_run r;
  r.prompts = g.get_string_array("golden.prompts");
  r.steps = static_cast<int>(g.get_int("golden.steps"));
  for (std::size_t k = 0; k < r.prompts.size(); ++k) {
    const std::string i = std::to_string(k);
    const auto ids = g.get_int_array("golden.tokens." + i);
    r.tokens.emplace_back(ids.begin(), ids.end());
    r.top_ids.push_back(g.get_int_array("golden.top_ids." + i));
    const auto& t = g.tensor("top_logits." + i);
    r.top = static_cast<int>(t.dims[0]);
    r.top_logits.push_back(g.to_f32(t));
    r.logsumexp.push_back(g.to_f32(g.tensor("logsumexp." + i)));
  }
  return r;
}

// The GGUF model (its own tokenizer, teacher-forced on llama.cpp's tokens) against llama.cpp's logits and greedy
// tokens, and against the Hugging Face checkpoint it was written from.
void check_against_llama_cpp(const std::string& name, float tolerance) {
  const fs::path gguf_path = fixtures() / (name + ".gguf"), hf_path = fixtures() / name;
  auto loaded = load_model(gguf_path);
  REQUIRE(loaded.bpe != nullptr);
  auto hf_model = load_hf_checkpoint<cpu_backend>(hf_path);
  const auto run = read_top_run(data_path("llama_cpp_" + name + ".gguf"));
  REQUIRE(run.prompts.size() == 3);
  for (std::size_t k = 0; k < run.prompts.size(); ++k) {
    CAPTURE(run.prompts[k]);
    const auto& seq = run.tokens[k];
    const auto prompt = loaded.bpe->encode(run.prompts[k], loaded.bpe->add_bos());
    REQUIRE(prompt.size() + static_cast<std::size_t>(run.steps) == seq.size());
    CHECK(std::equal(prompt.begin(), prompt.end(), seq.begin()));

    const auto ours = logits_of(loaded.model, seq);
    const auto theirs = logits_of(hf_model, seq);
    const int vocab = loaded.model.config().vocab_size;
    const std::size_t positions = seq.size() - 1;
    REQUIRE(ours.size() == positions * static_cast<std::size_t>(vocab));
    float vs_hf = 0.0f, vs_llama = 0.0f, lse_gap = 0.0f;
    for (std::size_t i = 0; i < ours.size(); ++i) vs_hf = std::max(vs_hf, std::fabs(ours[i] - theirs[i]));
    for (std::size_t p = 0; p < positions; ++p) {
      const float* row = ours.data() + p * static_cast<std::size_t>(vocab);
      for (int j = 0; j < run.top; ++j) {
        const std::size_t at = p * static_cast<std::size_t>(run.top) + static_cast<std::size_t>(j);
        vs_llama = std::max(vs_llama, std::fabs(row[run.top_ids[k][at]] - run.top_logits[k][at]));
      }
      double m = *std::max_element(row, row + vocab), sum = 0.0;
      for (int v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - m);
      lse_gap = std::max(lse_gap, std::fabs(static_cast<float>(m + std::log(sum)) - run.logsumexp[k][p]));
    }
    // The same weights and code; only Llama 3's RoPE factors differ, float32 in the file against the double formula.
    CHECK(vs_hf <= 1e-5f);
    CHECK(vs_llama <= tolerance);
    CHECK(lse_gap <= tolerance);
    const std::string note = name + ": max |logit - Hugging Face path's| " + std::to_string(vs_hf) +
                             ", |logit - llama.cpp's| over its top " + std::to_string(run.top) + " at " +
                             std::to_string(positions) + " positions " + std::to_string(vs_llama) +
                             ", |log-sum-exp - llama.cpp's| " + std::to_string(lse_gap);
    MESSAGE(note);

    engine<llama_model<cpu_backend>> eng(load_model(gguf_path).model, engine_config{});
    const auto out = eng.generate({prompt}, greedy_ignoring_eos(run.steps))[0].output;
    CHECK(out == std::vector<token_id>(seq.begin() + static_cast<std::ptrdiff_t>(prompt.size()), seq.end()));
  }
}

}  // namespace

TEST_CASE("qwen GGUF: configuration, vocabulary and chat template as the Hugging Face checkpoint's") {
  for (const char* name : {"qwen3_random", "qwen2_random"}) {
    CAPTURE(name);
    const fs::path gguf_path = fixtures() / (std::string(name) + ".gguf"), hf_path = fixtures() / name;
    const gg::file f = gg::file::open(gguf_path);
    CHECK(gguf_has_bpe_vocab(f));
    const model_config g = llama_config_from_gguf(f), h = load_hf_checkpoint_config(hf_path);
    check_same_config(g, h);
    CHECK(g.architecture == std::string(name).substr(0, 5));
    CHECK(g.bos == 151643);
    // <|endoftext|> ends generation too (generation_config.json's eos list on the Hugging Face side).
    CHECK(std::find(g.extra_eos.begin(), g.extra_eos.end(), 151643) != g.extra_eos.end());
    CHECK(std::find(g.extra_eos.begin(), g.extra_eos.end(), g.eos) == g.extra_eos.end());

    const auto gt = bpe_tokenizer::from_gguf(f);
    const auto ht = bpe_tokenizer::from_dir(hf_path);
    CHECK(gt.vocab_size() == ht.vocab_size());  // the [PAD] fillers past the tokenizer's ids are left undefined
    int text_diff = 0, special_diff = 0;
    for (token_id id = 0; id < ht.vocab_size(); ++id) {
      text_diff += gt.token_text(id) != ht.token_text(id);
      special_diff += gt.is_special(id) != ht.is_special(id);
    }
    CHECK(text_diff == 0);
    // Qwen's <|fim_*|>, <|repo_name|> and <|file_sep|> are not special in tokenizer.json; llama.cpp's converter
    // makes every "<|...|>" token a control token, and control tokens are special here.
    CHECK(special_diff == 6);
    CHECK(gt.eos() == ht.eos());
    CHECK(gt.bos() == 151643);
    CHECK_FALSE(gt.add_bos());
    CHECK(gt.chat() == ht.chat());
    CHECK(gt.chat() == chat_format::qwen3);
    const std::vector<chat_message> messages = {{"system", "Be brief."}, {"user", "What is 2+3?"}};
    CHECK(gt.apply_chat_template(messages, {}) == ht.apply_chat_template(messages, {}));

    const auto loaded = load_model(gguf_path);
    REQUIRE(loaded.bpe != nullptr);
    CHECK(loaded.spm == nullptr);
    CHECK(loaded.generation.temperature == doctest::Approx(0.6f));  // generation_config.json, through general.sampling
    CHECK(loaded.generation.top_k == 20);
  }
}

TEST_CASE("qwen GGUF: the tokenizer gives llama.cpp's ids on 400 random texts, with and without control tokens") {
  const gg::file f = gg::file::open(fixtures() / "qwen3_random.gguf");
  const auto tokenizer = bpe_tokenizer::from_gguf(f);
  const auto hf = bpe_tokenizer::from_dir(fixtures() / "qwen3_random");
  std::ifstream in(data_path("llama_cpp_qwen3_tokens.jsonl"));
  REQUIRE(in.good());
  int rows = 0, same = 0, same_special = 0, as_hf = 0, nfc_stable = 0;
  for (std::string line; std::getline(in, line);) {
    const auto row = json::parse(line, "llama_cpp_qwen3_tokens.jsonl");
    const std::string text = row.at("text").get<std::string>();
    const auto want = row.at("ids").get<std::vector<token_id>>();
    const auto want_special = row.at("ids_special").get<std::vector<token_id>>();
    CAPTURE(text);
    const auto got = tokenizer.encode(text, false, /*parse_special=*/false);
    const auto got_special = tokenizer.encode(text, false, /*parse_special=*/true);
    CHECK(got == want);
    CHECK(got_special == want_special);
    ++rows;
    same += got == want;
    same_special += got_special == want_special;
    // The Hugging Face tokenizer normalises to NFC first, which llama.cpp does not: equal where NFC changes nothing
    // (the texts with a combining accent are the ones it changes).
    if (text.find("e\xcc\x81") == std::string::npos) {
      ++nfc_stable;
      as_hf += hf.encode(text) == got_special;
    }
  }
  CHECK(rows == 400);
  CHECK(as_hf == nfc_stable);
  const std::string note = std::to_string(same) + " / " + std::to_string(same_special) + " of " + std::to_string(rows) +
                           " texts as llama.cpp tokenises them (plain / control tokens parsed); " +
                           std::to_string(as_hf) + " of " + std::to_string(nfc_stable) +
                           " NFC-stable ones as the Hugging Face tokenizer";
  MESSAGE(note);
}

TEST_CASE("qwen GGUF: Qwen3's logits and greedy tokens equal llama.cpp's and the Hugging Face path's") {
  check_against_llama_cpp("qwen3_random", 1e-4f);
}

TEST_CASE("qwen GGUF: Qwen2's (q/k/v biases) logits and greedy tokens equal llama.cpp's and the Hugging Face path's") {
  check_against_llama_cpp("qwen2_random", 1e-4f);
}

TEST_CASE("llama 3 GGUF: rope_freqs, permuted Q/K, Llama 3's pre-tokenizer and BOS, against llama.cpp") {
  const fs::path gguf_path = fixtures() / "llama3_random.gguf", hf_path = fixtures() / "llama3_random";
  const gg::file f = gg::file::open(gguf_path);
  const model_config g = llama_config_from_gguf(f), h = load_hf_checkpoint_config(hf_path);
  CHECK(g.architecture == "llama");
  CHECK(g.rope == rope_style::interleaved);  // the converter permuted Q and K
  CHECK(h.rope == rope_style::half);
  CHECK_FALSE(g.tied_embeddings);
  REQUIRE(g.rope_scaling.type == rope_scaling_type::factors);
  REQUIRE(h.rope_scaling.type == rope_scaling_type::llama3);
  REQUIRE(g.rope_scaling.freq_factors.size() == 4);
  // Each frequency scaled as Hugging Face's llama3 formula scales it: one kept, one in the band, two by 8.
  for (int i = 0; i < 4; ++i) {
    const double inv = std::pow(double(g.rope_theta), -2.0 * i / g.head_dim);
    CHECK(g.rope_scaling.apply(i, inv) == doctest::Approx(h.rope_scaling.apply(i, inv)).epsilon(1e-6));
  }
  CHECK(g.rope_scaling.freq_factors[0] == 1.0f);
  CHECK(g.rope_scaling.freq_factors[3] == 8.0f);
  const auto tok = bpe_tokenizer::from_gguf(f);
  CHECK(tok.add_bos());
  CHECK(tok.bos() == 151643);
  CHECK(tok.max_digits() == 3);

  // llama.cpp's ids for the 400 texts (control tokens parsed, BOS first) and the Hugging Face tokenizer's.
  const auto hf = bpe_tokenizer::from_dir(hf_path);
  std::ifstream in(data_path("llama_cpp_qwen3_tokens.jsonl"));
  REQUIRE(in.good());
  int rows = 0, same = 0, as_hf = 0;
  for (std::string line; std::getline(in, line);) {
    const auto row = json::parse(line, "llama_cpp_qwen3_tokens.jsonl");
    const std::string text = row.at("text").get<std::string>();
    const auto want = row.at("ids_llama3").get<std::vector<token_id>>();
    CAPTURE(text);
    const auto got = tok.encode(text, tok.add_bos());
    CHECK(got == want);
    ++rows;
    same += got == want;
    as_hf += hf.encode(text, hf.add_bos()) == got;
  }
  CHECK(rows == 400);
  CHECK(as_hf == rows);  // this fixture's tokenizer.json has no normaliser, as Llama 3's
  const std::string note = std::to_string(same) + " of " + std::to_string(rows) + " texts as llama.cpp tokenises them";
  MESSAGE(note);
  check_against_llama_cpp("llama3_random", 1e-4f);
}

TEST_CASE("qwen GGUF: what the model does not run is refused by name") {
  const gg::file f = gg::file::open(fixtures() / "qwen3_random.gguf");
  auto edited = [&](const std::function<void(gg::writer&)>& edit) { return zipage::testing::gguf_edited(f, edit); };
  auto load_error = [](const gg::file& g) { return error_of([&] { (void)load_llama_gguf<cpu_backend>(g); }); };
  auto vocab_error = [](const gg::file& g) { return error_of([&] { (void)bpe_tokenizer::from_gguf(g); }); };
  CHECK(contains(load_error(edited([](gg::writer& w) { w.set("qwen3.rope.scaling.type", "yarn"); })),
                 "edited.gguf: metadata qwen3.rope.scaling.type = 'yarn' is not supported"));
  CHECK(contains(load_error(edited([](gg::writer& w) { w.set("qwen3.attention.key_length", std::uint32_t{8}); })),
                 "metadata qwen3.attention.value_length = 16 is not supported (zipage's qwen3 model needs 8"));
  CHECK(contains(load_error(edited([](gg::writer& w) {
                   const std::vector<float> b(32, 0.0f);
                   w.add_tensor("blk.0.attn_q.bias", {32}, gg::tensor_type::f32, b);
                 })),
                 "tensor 'blk.0.attn_q.bias' is not part of the qwen3 model zipage runs"));
  CHECK(contains(load_error(edited([](gg::writer& w) { w.set("general.architecture", "qwen3moe"); })),
                 "architecture 'qwen3moe' is not supported (zipage reads llama, qwen2 and qwen3)"));
  CHECK(contains(vocab_error(edited([](gg::writer& w) { w.set("tokenizer.ggml.pre", "deepseek-v3"); })),
                 "tokenizer.ggml.pre 'deepseek-v3' is not supported"));
  CHECK(contains(vocab_error(edited([](gg::writer& w) {
                   w.set("tokenizer.ggml.token_type", std::vector<std::int32_t>(3, 1));
                 })),
                 "tokenizer.ggml.token_type has 3 entries for 151936 tokens"));
  // No token types: every token normal, as llama.cpp reads it (so "<|im_end|>" in a text is plain text).
  {
    gg::writer w;
    for (const std::string& key : f.keys())
      if (key != "tokenizer.ggml.token_type") w.set(key, *f.find(key));
    w.add_tensor("token_embd.weight", {16, 151936}, gg::tensor_type::f32, std::vector<float>(16 * 151936, 0.0f));
    const gg::file untyped = gg::file::from_bytes(w.bytes(), "untyped.gguf");
    const auto t = bpe_tokenizer::from_gguf(untyped);
    CHECK(t.encode("<|im_end|>").size() > 1);
    CHECK_FALSE(t.is_special(151645));
  }
  CHECK(contains(vocab_error(edited([](gg::writer& w) { w.set("tokenizer.ggml.eos_token_id", std::uint32_t{151700}); })),
                 "tokenizer.ggml.eos_token_id = 151700 is an unused token"));
  CHECK(contains(vocab_error(edited([](gg::writer& w) { w.set("tokenizer.ggml.merges", std::vector<std::string>{"zz qq"}); })),
                 "is not in the vocab"));
}
