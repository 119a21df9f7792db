// Config values a black-box probe found passing validation (2026-12-07): numbers that overflow or underflow the float a
// model holds (rms_norm_eps 1e300 in config.json became inf, a GGUF file's inf rope.freq_base ran), GGUF integers
// narrowed without a range check (context_length 2^32 + 16 wrapped to 16), and error messages that printed every
// non-ASCII byte as '?'.
#include <doctest/doctest.h>

#include "gguf_edit.hpp"
#include "test_support.hpp"

#include <zipage/core/checked.hpp>
#include <zipage/core/json.hpp>
#include <zipage/core/printable.hpp>
#include <zipage/gguf/gguf.hpp>
#include <zipage/model/model_config.hpp>
#include <zipage/models/gguf_generation.hpp>
#include <zipage/models/hf_config.hpp>
#include <zipage/models/llama.hpp>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>

using zipage::testing::contains;
using zipage::testing::error_of;
namespace gg = zipage::gguf;

namespace {

std::string config_error(const std::string& extra) {
  const std::string json = R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1,
      "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 100)" + extra + "}";
  return error_of([&] { (void)zipage::hf_config_from_string(json); });
}

const gg::file& stories() {
  static const gg::file f = gg::file::open(ZIPAGE_TEST_MODEL);
  return f;
}

std::string gguf_config_error(const std::function<void(gg::writer&)>& edit) {
  const gg::file f = zipage::testing::gguf_edited(stories(), edit);
  return error_of([&] { (void)zipage::llama_config_from_gguf(f); });
}

}  // namespace

TEST_CASE("checked_float: a double a float cannot hold is named, not turned into inf or 0") {
  CHECK(zipage::checked_float(1e-6, "x") == doctest::Approx(1e-6));
  CHECK(zipage::checked_float(0.0, "x") == 0.0f);
  CHECK(zipage::checked_float(-2.5, "x") == -2.5f);
  CHECK(zipage::checked_float(1e-40, "x") > 0.0f);  // a subnormal float still holds it
  CHECK(contains(error_of([] { (void)zipage::checked_float(1e300, "f: field 'x'"); }),
                 "f: field 'x' = 1e+300 is too large for a 32-bit float"));
  CHECK(contains(error_of([] { (void)zipage::checked_float(-1e39, "x"); }), "is too large for a 32-bit float"));
  CHECK(contains(error_of([] { (void)zipage::checked_float(1e-50, "x"); }),
                 "x = 1e-50 is too small for a 32-bit float (it would round to 0)"));
  CHECK(contains(error_of([] { (void)zipage::checked_float(std::numeric_limits<double>::infinity(), "x"); }),
                 "x = inf is not a finite number"));
}

TEST_CASE("config.json: float fields are checked after narrowing to float, naming the field and the value") {
  CHECK(contains(config_error(R"(, "rms_norm_eps": 1e300)"),
                 "config.json: field 'rms_norm_eps' = 1e+300 is too large for a 32-bit float"));
  CHECK(contains(config_error(R"(, "rms_norm_eps": 1e-50)"),
                 "config.json: field 'rms_norm_eps' = 1e-50 is too small for a 32-bit float"));
  CHECK(contains(config_error(R"(, "rope_theta": 1e300)"), "field 'rope_theta' = 1e+300 is too large"));
  CHECK(contains(config_error(R"(, "rope_parameters": {"rope_type": "default", "rope_theta": 1e39})"),
                 "field 'rope_parameters.rope_theta' = 1e+39 is too large"));
  const std::string llama3 = R"(, "rope_scaling": {"rope_type": "llama3", "factor": F, "low_freq_factor": L,
      "high_freq_factor": 4, "original_max_position_embeddings": 8192})";
  auto scaling = [&](const std::string& factor, const std::string& low) {
    std::string s = llama3;
    s.replace(s.find('F'), 1, factor);
    s.replace(s.find('L'), 1, low);
    return config_error(s);
  };
  CHECK(contains(scaling("1e300", "1"), "field 'rope_scaling.factor' = 1e+300 is too large"));
  CHECK(contains(scaling("8", "1e-50"), "field 'rope_scaling.low_freq_factor' = 1e-50 is too small"));
  CHECK(contains(config_error(R"(, "rope_theta": 0)"), "rope_theta must be finite and positive, got 0"));
  CHECK(contains(config_error(R"(, "rms_norm_eps": -1e-6)"), "rms_norm_eps must be finite and positive"));
  CHECK(zipage::hf_config_from_string(R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1,
      "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 100, "rms_norm_eps": 1e-6,
      "rope_theta": 1000000})").rope_theta == 1e6f);
}

TEST_CASE("generation_config.json and GGUF general.sampling: sampling values past a float are refused by name") {
  auto gen_error = [](const std::string& json) {
    return error_of([&] {
      (void)zipage::generation_defaults_from_json(zipage::json::parse(json, "generation_config.json"),
                                                  "generation_config.json");
    });
  };
  CHECK(contains(gen_error(R"({"temperature": 1e300})"),
                 "generation_config.json: field 'temperature' = 1e+300 is too large for a 32-bit float"));
  CHECK(contains(gen_error(R"({"top_p": 1e-50})"), "field 'top_p' = 1e-50 is too small for a 32-bit float"));
  CHECK(contains(gen_error(R"({"repetition_penalty": 1e39})"), "field 'repetition_penalty' = 1e+39 is too large"));
  auto gguf_gen_error = [](const std::function<void(gg::writer&)>& edit) {
    const gg::file f = zipage::testing::gguf_edited(stories(), edit);
    return error_of([&] { (void)zipage::generation_defaults_from_gguf(f); });
  };
  CHECK(contains(gguf_gen_error([](gg::writer& w) { w.set("general.sampling.temp", 1e300); }),
                 "edited.gguf: metadata general.sampling.temp = 1e+300 is too large for a 32-bit float"));
  CHECK(contains(gguf_gen_error([](gg::writer& w) {
                   w.set("general.sampling.temp", std::numeric_limits<float>::infinity());
                 }),
                 "metadata general.sampling.temp = inf is not a finite number"));
}

TEST_CASE("GGUF: rope.freq_base and the RMS epsilon must be finite and positive floats") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(contains(gguf_config_error([&](gg::writer& w) { w.set("llama.rope.freq_base", inf); }),
                 "edited.gguf: metadata llama.rope.freq_base = inf is not a finite number"));
  CHECK(contains(gguf_config_error([&](gg::writer& w) { w.set("llama.attention.layer_norm_rms_epsilon", 1e300); }),
                 "metadata llama.attention.layer_norm_rms_epsilon = 1e+300 is too large for a 32-bit float"));
  CHECK(contains(gguf_config_error([&](gg::writer& w) { w.set("llama.attention.layer_norm_rms_epsilon", 0.0f); }),
                 "rms_eps must be finite and positive, got 0"));
  // The library's own check, for a config built in code.
  zipage::model_config c = zipage::llama_config_from_gguf(stories());
  c.rms_eps = inf;
  CHECK(contains(error_of([&] { c.validate(); }), "model config: rms_eps must be finite and positive, got inf"));
  c.rms_eps = 1e-5f;
  c.rope_theta = std::numeric_limits<float>::quiet_NaN();
  CHECK(contains(error_of([&] { c.validate(); }), "model config: rope_theta must be finite and positive"));
}

TEST_CASE("GGUF: integer keys are range-checked before they are narrowed") {
  CHECK(zipage::llama_config_from_gguf(stories()).max_context == 2048);
  CHECK(contains(gguf_config_error([](gg::writer& w) {
                   w.set("llama.context_length", std::uint64_t{(1ULL << 32) + 16});
                 }),
                 "edited.gguf: metadata llama.context_length = 4294967312 is out of range [0, 2147483647]"));
  CHECK(contains(gguf_config_error([](gg::writer& w) { w.set("llama.context_length", std::uint32_t{4294967295u}); }),
                 "metadata llama.context_length = 4294967295 is out of range"));
  CHECK(contains(gguf_config_error([](gg::writer& w) { w.set("llama.context_length", std::int32_t{-5}); }),
                 "metadata llama.context_length = -5 is out of range"));
  CHECK(zipage::llama_config_from_gguf(zipage::testing::gguf_edited(stories(), [](gg::writer& w) {
          w.set("llama.context_length", std::uint32_t{0});  // unknown, as before
        })).max_context == 0);
  CHECK(contains(gguf_config_error([](gg::writer& w) {
                   w.set("tokenizer.ggml.bos_token_id", std::uint64_t{(1ULL << 32) + 1});
                 }),
                 "metadata tokenizer.ggml.bos_token_id = 4294967297 is not a token id"));
  CHECK(contains(gguf_config_error([](gg::writer& w) { w.set("tokenizer.ggml.eos_token_id", std::int32_t{-5}); }),
                 "metadata tokenizer.ggml.eos_token_id = -5 is not a token id"));
  // -1 and uint32 0xFFFFFFFF mean "none", as the tokenizers read them.
  const auto none = zipage::llama_config_from_gguf(zipage::testing::gguf_edited(stories(), [](gg::writer& w) {
    w.set("tokenizer.ggml.bos_token_id", std::uint32_t{0xFFFFFFFFu});
  }));
  CHECK(none.bos == -1);
}

TEST_CASE("printable: valid UTF-8 stays readable, other bytes read as \\xNN") {
  using zipage::detail::printable_text;
  CHECK(printable_text("plain ASCII") == "plain ASCII");
  CHECK(printable_text("\xc4\xa0" "a") == "\xc4\xa0" "a");                 // byte-level BPE's 'Ġa'
  CHECK(printable_text("\xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80") == "\xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80");
  CHECK(printable_text("a\nb\tc\x7f") == "a\\x0ab\\x09c\\x7f");
  CHECK(printable_text("\xff\xfe") == "\\xff\\xfe");                       // not UTF-8
  CHECK(printable_text("\xc0\xaf") == "\\xc0\\xaf");                       // overlong '/'
  CHECK(printable_text("\xed\xa0\x80") == "\\xed\\xa0\\x80");              // a surrogate
  CHECK(printable_text("\xc2\x85") == "\\xc2\\x85");                       // C1 control (NEL)
  CHECK(printable_text("\xe4\xbd") == "\\xe4\\xbd");                       // cut short
  CHECK(printable_text("\xe4\xbd\xa0\xe5\xa5\xbd!", 2) == "\xe4\xbd\xa0\xe5\xa5\xbd...");  // cut by characters
  // As the readers quote a key.
  CHECK(contains(error_of([] { (void)zipage::json::parse(R"({"\u0120a": 1, "\u0120a": 2})", "tokenizer.json"); }),
                 "duplicate key '\xc4\xa0" "a'"));
  CHECK(gg::detail::printable("\xc4\xa0" "b\x01") == "\xc4\xa0" "b\\x01");
}
