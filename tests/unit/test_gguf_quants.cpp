// GGUF files as llama.cpp writes them: its block-quantised tensor types, and stories260K's logits against
// llama.cpp's own (tests/data/gguf/, made by tests/gguf_oracle/run.sh with llama.cpp's libraries).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "gguf_edit.hpp"
#include "greedy.hpp"
#include "stories_model.hpp"
#include "test_support.hpp"
#include "zipage/backend/cpu/prefill_logits.hpp"
#include "zipage/core/json.hpp"
#include "zipage/engine/engine.hpp"
#include "zipage/gguf/writer.hpp"
#include "zipage/models/gguf_generation.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/tokenizer/spm_tokenizer.hpp"

namespace gg = zipage::gguf;
using namespace zipage;
using zipage::testing::contains;
using zipage::testing::error_of;
using zipage::testing::greedy_ignoring_eos;

namespace {

std::string data_path(const std::string& name) { return std::string(ZIPAGE_TEST_DATA_DIR) + "/gguf/" + name; }

// Units in the last place between two floats of the same sign (a large number otherwise).
std::int64_t ulps_apart(float a, float b) {
  if (a == b) return 0;
  if ((a < 0) != (b < 0)) return 1LL << 40;
  std::int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::llabs(static_cast<std::int64_t>(ia) - ib);
}

const std::vector<gg::tensor_type> quantised_types = {
    gg::tensor_type::q4_0, gg::tensor_type::q4_1, gg::tensor_type::q5_0, gg::tensor_type::q5_1,
    gg::tensor_type::q8_0, gg::tensor_type::iq4_nl, gg::tensor_type::q2_k, gg::tensor_type::q3_k,
    gg::tensor_type::q4_k, gg::tensor_type::q5_k, gg::tensor_type::q6_k, gg::tensor_type::iq4_xs};

}  // namespace

TEST_CASE("gguf quants: every block type dequantises to what ggml's own dequantisation gives") {
  // quants.gguf: per type, 4 rows of 512 that ggml quantised (Gaussian, weight-like with outliers, one-signed
  // with a block of zeros, tiny values) and ggml's dequantisation of them ("<type>.ggml", F32).
  const gg::file f = gg::file::open(data_path("quants.gguf"));
  std::set<gg::tensor_type> seen;
  for (const gg::tensor_info& t : f.tensors()) {
    if (!gg::is_quantized(t.type)) continue;
    CAPTURE(t.name);
    seen.insert(t.type);
    const auto ours = f.to_f32(t);
    const auto ggml = f.to_f32(f.tensor(t.name + ".ggml"));
    REQUIRE(ours.size() == ggml.size());
    std::size_t exact = 0;
    std::int64_t worst = 0;
    for (std::size_t i = 0; i < ours.size(); ++i) {
      exact += std::memcmp(&ours[i], &ggml[i], sizeof(float)) == 0;
      worst = std::max(worst, ulps_apart(ours[i], ggml[i]));
    }
    // The same products in the same order: bit for bit, unless a compiler asked for FMA fuses a·b + c
    // (one rounding instead of two, so at most an ulp apart).
    CHECK(worst <= 1);
    const std::string note = std::string(gg::tensor_type_name(t.type)) + ": " + std::to_string(exact) + " of " +
                             std::to_string(ours.size()) + " values bit-identical to ggml's";
    MESSAGE(note);
    // The fixture is not degenerate: codes span a range, so a wrong bit layout would show.
    const auto [lo, hi] = std::minmax_element(ggml.begin(), ggml.end());
    CHECK(*hi - *lo > 1.0f);
  }
  CHECK(seen == std::set<gg::tensor_type>(quantised_types.begin(), quantised_types.end()));
}

TEST_CASE("gguf quants: block sizes, row lengths and the writer's checks") {
  for (gg::tensor_type t : quantised_types) {
    const auto f = gg::format_of(t);
    CHECK((f.elements == 32 || f.elements == 256));
    CHECK(gg::is_supported_tensor_type(static_cast<std::uint32_t>(t)));
  }
  CHECK(gg::format_of(gg::tensor_type::q4_k).bytes == 144);
  CHECK(gg::format_of(gg::tensor_type::q8_0).bytes == 34);
  CHECK_FALSE(gg::format_of(16u).has_value());  // IQ2_XXS: lattice codebooks, not loaded

  gg::writer w;
  const std::vector<float> v(64, 1.0f);
  CHECK(contains(error_of([&] { w.add_tensor("q", {64}, gg::tensor_type::q8_0, v); }),
                 "add_tensor converts to F32, F16 or BF16; Q8_0 data goes in encoded with add_encoded_tensor"));
  const std::vector<std::byte> two_blocks(68);
  CHECK(contains(error_of([&] { w.add_encoded_tensor("q", {48}, gg::tensor_type::q8_0, two_blocks); }),
                 "Q8_0 rows are whole blocks of 32 values, but dimension 0 is 48"));
  CHECK(contains(error_of([&] { w.add_encoded_tensor("q", {32}, gg::tensor_type::q8_0, two_blocks); }),
                 "tensor 'q' has 68 bytes but its dims take 34 as Q8_0"));
  w.add_encoded_tensor("q", {32, 2}, gg::tensor_type::q8_0, two_blocks);
  const gg::file f = gg::file::from_bytes(w.bytes(), "two_blocks.gguf");
  CHECK(f.tensor("q").nbytes == 68);
  CHECK(f.to_f32(f.tensor("q")) == std::vector<float>(64, 0.0f));  // zero scale, zero codes
}

namespace {

// llama.cpp's reference run (llama_golden golden): per prompt, its tokens (BOS, prompt, greedy continuation)
// and its logits at every position but the last.
struct llama_cpp_run {
  std::vector<std::string> prompts;
  std::vector<std::vector<token_id>> tokens;
  std::vector<std::vector<float>> logits;  // [positions][vocab]
  int steps = 0;
};

llama_cpp_run read_llama_cpp_run(const std::string& path) {
  const gg::file g = gg::file::open(path);
  llama_cpp_run r;
  r.prompts = g.get_string_array("golden.prompts");
  r.steps = static_cast<int>(g.get_int("golden.steps"));
  for (std::size_t k = 0; k < r.prompts.size(); ++k) {
    const auto ids = g.get_int_array("golden.tokens." + std::to_string(k));
    r.tokens.emplace_back(ids.begin(), ids.end());
    r.logits.push_back(g.to_f32(g.tensor("logits." + std::to_string(k))));
  }
  return r;
}

// Our model and tokenizer on llama.cpp's sequences: the same prompt tokens, logits within `tolerance` at every
// position (teacher-forced on llama.cpp's tokens), the same greedy continuation from the engine.
void check_against_llama_cpp(const std::string& model_path, const std::string& run_path, float tolerance) {
  const gg::file f = gg::file::open(model_path);
  const auto tokenizer = spm_tokenizer::from_gguf(f);
  auto model = load_llama_gguf<cpu_backend>(f);
  const int vocab = model.config().vocab_size;
  const llama_cpp_run run = read_llama_cpp_run(run_path);
  REQUIRE(run.prompts.size() == 3);
  for (std::size_t k = 0; k < run.prompts.size(); ++k) {
    CAPTURE(run.prompts[k]);
    const auto& seq = run.tokens[k];
    const auto prompt = tokenizer.encode(run.prompts[k], true);
    REQUIRE(prompt.size() + static_cast<std::size_t>(run.steps) == seq.size());
    CHECK(std::equal(prompt.begin(), prompt.end(), seq.begin()));

    const std::vector<token_id> inputs(seq.begin(), seq.end() - 1);
    std::vector<std::int32_t> rows(inputs.size());
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<std::int32_t>(i);
    const auto ours = cpu_prefill_logits(model, inputs, rows);
    REQUIRE(ours.size() == run.logits[k].size());
    float worst = 0.0f;
    for (std::size_t i = 0; i < ours.size(); ++i) worst = std::max(worst, std::fabs(ours[i] - run.logits[k][i]));
    CHECK(worst <= tolerance);
    const std::string note = "max |logit - llama.cpp's| over " + std::to_string(rows.size()) + " positions x " +
                             std::to_string(vocab) + ": " + std::to_string(worst);
    MESSAGE(note);

    engine<llama_model<cpu_backend>> eng(load_llama_gguf<cpu_backend>(f), engine_config{});
    const auto out = eng.generate({prompt}, greedy_ignoring_eos(run.steps))[0].output;
    CHECK(out == std::vector<token_id>(seq.begin() + static_cast<std::ptrdiff_t>(prompt.size()), seq.end()));
  }
}

}  // namespace

TEST_CASE("gguf: stories260K's logits and greedy tokens equal llama.cpp's (fp32 weights)") {
  // llama.cpp in fp32: fp32 KV cache, plain attention (its CPU flash attention rounds through fp16).
  // Measured: at most 1.6e-5 apart on logits of magnitude ~20.
  check_against_llama_cpp(ZIPAGE_TEST_MODEL, data_path("llama_cpp_stories260K.gguf"), 1e-4f);
}

TEST_CASE("gguf: a Q4_K_M file from llama.cpp's quantiser runs as llama.cpp's dequantised weights do") {
  // stories260K-Q4_K_M.gguf is llama.cpp's own quantisation (Q5_0, Q8_0 and F16 tensors: rows of 64 are too
  // short for K blocks). The reference is llama.cpp in fp32 on ggml's dequantisation of those weights, so
  // it differs from ours only by fp32 rounding. (llama.cpp's quantised run also rounds activations to 8
  // bits: 0.34 apart at most, 115 of 116 argmax equal; see docs/gguf.md.)
  const gg::file f = gg::file::open(data_path("stories260K-Q4_K_M.gguf"));
  std::set<gg::tensor_type> types;
  for (const auto& t : f.tensors()) types.insert(t.type);
  CHECK(types.count(gg::tensor_type::q5_0) == 1);
  CHECK(types.count(gg::tensor_type::q8_0) == 1);
  CHECK(types.count(gg::tensor_type::f16) == 1);
  check_against_llama_cpp(data_path("stories260K-Q4_K_M.gguf"), data_path("llama_cpp_stories260K-Q4_K_M.gguf"),
                          1e-4f);
}

TEST_CASE("gguf: stories260K's tokenizer gives llama.cpp's ids on 400 random texts") {
  // llama_cpp_stories260K_tokens.jsonl: {"text", "ids"} per line, ids from llama.cpp's tokenizer (BOS first,
  // special-token spellings as text): whitespace runs, punctuation, digits, accents, CJK, emoji, "<s>".
  const gg::file f = gg::file::open(ZIPAGE_TEST_MODEL);
  const auto tokenizer = spm_tokenizer::from_gguf(f);
  const std::string text = json::read_text_file(data_path("llama_cpp_stories260K_tokens.jsonl"), "llama.cpp tokens");
  int rows = 0, same = 0;
  for (std::size_t start = 0; start < text.size();) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    const auto row = json::parse(std::string_view(text).substr(start, end - start), "llama_cpp_stories260K_tokens.jsonl");
    start = end + 1;
    const std::string input = row.at("text").get<std::string>();
    const auto want = row.at("ids").get<std::vector<token_id>>();
    const auto got = tokenizer.encode(input, true);
    CAPTURE(input);
    CHECK(got == want);
    ++rows;
    same += got == want;
    CHECK(tokenizer.decode(got) == tokenizer.decode(want));
  }
  CHECK(rows == 400);
  const std::string note = std::to_string(same) + " of " + std::to_string(rows) + " texts tokenised as llama.cpp does";
  MESSAGE(note);
}

namespace {

// stories260K re-written with `edit` applied to a writer holding its metadata and tensors.
gg::file edited_stories(const std::function<void(gg::writer&)>& edit) {
  return zipage::testing::gguf_edited(gg::file::open(ZIPAGE_TEST_MODEL), edit);
}

std::string load_error(const gg::file& f) {
  return error_of([&] { (void)load_llama_gguf<cpu_backend>(f); });
}

}  // namespace

TEST_CASE("gguf: llama variants the model does not run are refused by name, not loaded wrong") {
  const std::vector<float> eight(8, 1.0f);
  CHECK_NOTHROW((void)load_llama_gguf<cpu_backend>(edited_stories([](gg::writer&) {})));
  // Llama 3's RoPE scaling (rope_freqs.weight, one divisor per frequency: head size 8 here) is read; a wrong length
  // is refused by name.
  CHECK(load_llama_gguf<cpu_backend>(edited_stories([&](gg::writer& w) {
          w.add_tensor("rope_freqs.weight", {4}, gg::tensor_type::f32, std::span(eight).first(4));
        })).config().rope_scaling.type == rope_scaling_type::factors);
  CHECK(contains(load_error(edited_stories([&](gg::writer& w) {
                   w.add_tensor("rope_freqs.weight", {8}, gg::tensor_type::f32, eight);
                 })),
                 "edited.gguf: tensor 'rope_freqs.weight' has shape [8], expected [4] (head size / 2)"));
  CHECK(contains(load_error(edited_stories([&](gg::writer& w) {
                   w.add_tensor("blk.0.attn_q.bias", {8}, gg::tensor_type::f32, eight);
                 })),
                 "edited.gguf: tensor 'blk.0.attn_q.bias' is not part of the llama model zipage runs"));
  CHECK(contains(load_error(edited_stories([&](gg::writer& w) {
                   w.add_tensor("blk.5.attn_norm.weight", {8}, gg::tensor_type::f32, eight);  // 5 layers: 0-4
                 })),
                 "tensor 'blk.5.attn_norm.weight' is not part of the llama model"));
  CHECK(contains(load_error(edited_stories([](gg::writer& w) {
                   w.set("llama.rope.dimension_count", std::uint32_t{4});
                 })),
                 "metadata llama.rope.dimension_count = 4 is not supported (zipage's llama model needs 8"));
  CHECK(contains(load_error(edited_stories([](gg::writer& w) {
                   w.set("llama.attention.key_length", std::uint32_t{16});
                 })),
                 "metadata llama.attention.key_length = 16 is not supported"));
  CHECK(contains(load_error(edited_stories([](gg::writer& w) {
                   w.set("llama.rope.scaling.type", "yarn");
                 })),
                 "llama.rope.scaling.type = 'yarn' is not supported"));
  // A factor without a type is linear scaling to llama.cpp (its default type), as is the older scale_linear key.
  CHECK(contains(load_error(edited_stories([](gg::writer& w) { w.set("llama.rope.scaling.factor", 4.0f); })),
                 "edited.gguf: metadata llama.rope.scaling.factor = 4 without llama.rope.scaling.type is linear"));
  CHECK(contains(load_error(edited_stories([](gg::writer& w) { w.set("llama.rope.scale_linear", 2.0f); })),
                 "edited.gguf: metadata llama.rope.scale_linear = 2 without llama.rope.scaling.type is linear"));
  CHECK_NOTHROW((void)load_llama_gguf<cpu_backend>(edited_stories([](gg::writer& w) {
    w.set("llama.rope.scaling.factor", 1.0f);
  })));
  CHECK_NOTHROW((void)load_llama_gguf<cpu_backend>(edited_stories([](gg::writer& w) {
    w.set("llama.rope.scaling.type", "none");  // llama.cpp never scales under type none
    w.set("llama.rope.scaling.factor", 4.0f);
  })));
  CHECK(contains(load_error(edited_stories([](gg::writer& w) {
                   w.set("llama.expert_count", std::uint32_t{8});
                 })),
                 "mixture-of-experts models (llama.expert_count) are not supported"));
  CHECK_NOTHROW((void)load_llama_gguf<cpu_backend>(edited_stories([](gg::writer& w) {
    w.set("llama.rope.scaling.type", "none");
    w.set("llama.expert_count", std::uint32_t{0});
  })));
}

TEST_CASE("gguf: general.sampling.* keys are the file's sampling defaults, as llama.cpp reads them") {
  const auto none = generation_defaults_from_gguf(edited_stories([](gg::writer&) {}));
  CHECK_FALSE(none.sets_sampling());
  CHECK(none.source.empty());
  CHECK(none.defaults().temperature == 1.0f);  // vLLM's default when the checkpoint sets nothing
  CHECK(none.defaults().top_k == 0);
  CHECK(none.defaults().top_p == 1.0f);

  // As llama.cpp's converter writes them: int32 top_k, float32 the rest.
  const auto set = generation_defaults_from_gguf(edited_stories([](gg::writer& w) {
    w.set("general.sampling.temp", 0.7f);
    w.set("general.sampling.top_k", std::int32_t{40});
    w.set("general.sampling.top_p", 0.9f);
    w.set("general.sampling.min_p", 0.05f);
    w.set("general.sampling.penalty_repeat", 1.1f);
    w.set("general.sampling.mirostat", std::int32_t{0});      // off: nothing to report
    w.set("general.sampling.xtc_probability", 0.0f);          // off
    w.set("general.sampling.sequence", "edkypmxt");           // llama.cpp's sampler order: not read
  }));
  CHECK(set.sets_sampling());
  CHECK(set.source == "edited.gguf (general.sampling)");
  CHECK(set.ignored.empty());
  const sampling_params p = set.defaults();
  CHECK(p.temperature == doctest::Approx(0.7f));
  CHECK(p.top_k == 40);
  CHECK(p.top_p == doctest::Approx(0.9f));
  CHECK(p.min_p == doctest::Approx(0.05f));
  CHECK(p.repetition_penalty == doctest::Approx(1.1f));
  CHECK_NOTHROW(p.validate());

  const auto only_temp = generation_defaults_from_gguf(edited_stories([](gg::writer& w) {
    w.set("general.sampling.temp", 0.0f);
    w.set("general.sampling.top_k", std::int32_t{-1});  // llama.cpp: <= 0 is off
  }));
  CHECK(only_temp.defaults().greedy());
  CHECK(only_temp.defaults().top_k == 0);

  // Samplers zipage does not have are reported when the file turns them on, not silently dropped.
  const auto extra = generation_defaults_from_gguf(edited_stories([](gg::writer& w) {
    w.set("general.sampling.mirostat", std::int32_t{2});
    w.set("general.sampling.xtc_probability", 0.5f);
  }));
  REQUIRE(extra.ignored.size() == 2);
  CHECK(contains(extra.ignored[0], "general.sampling.mirostat"));
  CHECK(contains(extra.ignored[1], "general.sampling.xtc_probability"));
  CHECK(extra.source == "edited.gguf (general.sampling)");

  auto error = [](const std::function<void(gg::writer&)>& edit) {
    const gg::file f = edited_stories(edit);
    return error_of([&] { (void)generation_defaults_from_gguf(f); });
  };
  CHECK(contains(error([](gg::writer& w) { w.set("general.sampling.temp", "hot"); }),
                 "edited.gguf: metadata general.sampling.temp must be a number, got string"));
  CHECK(contains(error([](gg::writer& w) { w.set("general.sampling.temp", -0.5f); }),
                 "edited.gguf: metadata general.sampling.temp = -0.5 must be >= 0"));
  CHECK(contains(error([](gg::writer& w) { w.set("general.sampling.top_p", 1.5f); }),
                 "metadata general.sampling.top_p = 1.5 must be in (0, 1]"));
  CHECK(contains(error([](gg::writer& w) { w.set("general.sampling.top_k", 4.5f); }),
                 "metadata general.sampling.top_k must be an integer, got float32"));
  CHECK(contains(error([](gg::writer& w) { w.set("general.sampling.penalty_repeat", 0.0f); }),
                 "metadata general.sampling.penalty_repeat = 0 must be > 0"));
  CHECK(contains(error([](gg::writer& w) { w.set("general.sampling.min_p", std::nanf("")); }),
                 "metadata general.sampling.min_p = nan must be in [0, 1]"));
}
