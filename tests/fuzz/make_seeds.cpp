// Writes the seed corpora of tests/fuzz/corpus (run once; the output is committed):
//   g++ -std=c++20 -O1 -I include tests/fuzz/make_seeds.cpp -o /tmp/make_seeds && /tmp/make_seeds tests/fuzz/corpus
// Small valid inputs of each format, so the fuzzer starts past the magic numbers and the JSON syntax.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "zipage/gguf/writer.hpp"
#include "zipage/safetensors/writer.hpp"
#include "zipage/tokenizer/bpe_tokenizer.hpp"
#include "zipage/tokenizer/unicode_tables.hpp"

namespace fs = std::filesystem;

namespace {

void put(const fs::path& file, const std::string& s) {
  fs::create_directories(file.parent_path());
  std::ofstream(file, std::ios::binary) << s;
}
void put(const fs::path& file, const std::vector<std::byte>& b) {
  fs::create_directories(file.parent_path());
  std::ofstream(file, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::vector<float> ramp(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
  return v;
}

// The tensors of a one-layer model of hidden size 8 (2 query heads, 1 KV head of 4), ffn 8, tied output; with
// `qk_norm` Qwen3's per-head q/k norms.
void add_tiny_tensors(zipage::gguf::writer& w, zipage::gguf::tensor_type type, std::int64_t vocab, bool qk_norm) {
  auto m = [&](const std::string& name, std::int64_t rows, std::int64_t cols) {
    w.add_tensor(name, {cols, rows}, type, ramp(static_cast<std::size_t>(rows * cols)));
  };
  auto v = [&](const std::string& name, std::int64_t n) { w.add_tensor(name, {n}, type, ramp(static_cast<std::size_t>(n))); };
  m("token_embd.weight", vocab, 8);
  v("blk.0.attn_norm.weight", 8);
  m("blk.0.attn_q.weight", 8, 8);
  m("blk.0.attn_k.weight", 4, 8);
  m("blk.0.attn_v.weight", 4, 8);
  m("blk.0.attn_output.weight", 8, 8);
  if (qk_norm) {
    v("blk.0.attn_q_norm.weight", 4);
    v("blk.0.attn_k_norm.weight", 4);
  }
  v("blk.0.ffn_norm.weight", 8);
  m("blk.0.ffn_gate.weight", 8, 8);
  m("blk.0.ffn_up.weight", 8, 8);
  m("blk.0.ffn_down.weight", 8, 8);
  v("output_norm.weight", 8);
}

// A llama GGUF: hidden 8, 1 layer, 2 heads (1 KV head), ffn 8, a 24-piece SentencePiece vocab.
std::vector<std::byte> tiny_gguf(zipage::gguf::tensor_type type, bool tokenizer, std::uint32_t version) {
  zipage::gguf::writer w;
  w.set("general.architecture", "llama");
  w.set("llama.embedding_length", std::uint32_t{8});
  w.set("llama.block_count", std::uint32_t{1});
  w.set("llama.attention.head_count", std::uint32_t{2});
  w.set("llama.attention.head_count_kv", std::uint32_t{1});
  w.set("llama.feed_forward_length", std::uint32_t{8});
  w.set("llama.context_length", std::uint32_t{64});
  w.set("llama.rope.freq_base", 10000.0f);
  w.set("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  const int vocab = 24;
  if (tokenizer) {
    std::vector<std::string> pieces = {"<unk>", "<s>", "</s>", "<0x0A>", "<0x20>", "\xE2\x96\x81", "a", "b", "c",
                                       "\xE2\x96\x81" "a", "ab", "abc", "H", "e", "l", "o", "\xE2\x96\x81H", "ll",
                                       "lo", "<|user|>", "1", "2", "3", "\xE2\x96\x81" "b"};
    std::vector<float> scores(pieces.size());
    std::vector<std::int32_t> types(pieces.size(), 1);
    for (std::size_t i = 0; i < pieces.size(); ++i) scores[i] = -static_cast<float>(i);
    types[0] = 2;
    types[1] = types[2] = 3;
    types[3] = types[4] = 6;
    types[19] = 4;
    w.set("tokenizer.ggml.model", "llama");
    w.set("tokenizer.ggml.tokens", pieces);
    w.set("tokenizer.ggml.scores", scores);
    w.set("tokenizer.ggml.token_type", types);
    w.set("tokenizer.ggml.bos_token_id", std::uint32_t{1});
    w.set("tokenizer.ggml.eos_token_id", std::uint32_t{2});
  }
  add_tiny_tensors(w, type, vocab, false);
  return w.bytes(version);
}

std::string byte_char(int b) {
  std::string s;
  zipage::unicode::append_utf8(s, zipage::detail::byte_to_unicode()[static_cast<std::size_t>(b)]);
  return s;
}

nlohmann::json tokenizer(std::string_view pattern, bool nfc) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  const std::vector<std::string> extra = {"ab", "abc", "\xC4\xA0" "a", "12", "123", "he", "hel", "hell", "hello"};
  for (std::size_t i = 0; i < extra.size(); ++i) vocab[extra[i]] = 256 + i;
  const auto merges = nlohmann::json::array({"a b", "ab c", "\xC4\xA0 a", "1 2", "12 3", "h e", "he l", "hel l", "hell o"});
  nlohmann::json added = nlohmann::json::array();
  const std::vector<std::string> specials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"};
  for (std::size_t i = 0; i < specials.size(); ++i)
    added.push_back({{"id", 256 + extra.size() + i}, {"content", specials[i]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", i < 3}});
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", nfc ? nlohmann::json{{"type", "NFC"}} : nlohmann::json(nullptr)},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
            {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
            {"vocab", vocab}, {"merges", merges}}}};
}

// A qwen3 GGUF with a byte-level BPE vocabulary (the tokenizer above as llama.cpp's converter writes it: token
// types, "a b" merges, pre-tokenizer qwen2), q/k norms and general.sampling keys: hidden 8, 1 layer, 2 heads of 4.
std::vector<std::byte> tiny_qwen_gguf() {
  const nlohmann::json tok = tokenizer(R"((?i:'s|'t)|\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+)", false);
  std::vector<std::string> tokens(static_cast<std::size_t>(256 + 9 + 5));
  std::vector<std::int32_t> types(tokens.size(), 1);
  for (const auto& [piece, id] : tok["model"]["vocab"].items()) tokens[id.get<std::size_t>()] = piece;
  for (const auto& a : tok["added_tokens"]) {
    tokens[a["id"].get<std::size_t>()] = a["content"].get<std::string>();
    types[a["id"].get<std::size_t>()] = a["special"].get<bool>() ? 3 : 4;
  }
  std::vector<std::string> merges;
  for (const auto& m : tok["model"]["merges"]) merges.push_back(m.get<std::string>());
  zipage::gguf::writer w;
  w.set("general.architecture", "qwen3");
  w.set("qwen3.embedding_length", std::uint32_t{8});
  w.set("qwen3.block_count", std::uint32_t{1});
  w.set("qwen3.attention.head_count", std::uint32_t{2});
  w.set("qwen3.attention.head_count_kv", std::uint32_t{1});
  w.set("qwen3.attention.key_length", std::uint32_t{4});
  w.set("qwen3.feed_forward_length", std::uint32_t{8});
  w.set("qwen3.context_length", std::uint32_t{64});
  w.set("qwen3.rope.freq_base", 1000000.0f);
  w.set("general.sampling.temp", 0.6f);
  w.set("general.sampling.top_k", std::int32_t{20});
  w.set("tokenizer.ggml.model", "gpt2");
  w.set("tokenizer.ggml.pre", "qwen2");
  w.set("tokenizer.ggml.tokens", tokens);
  w.set("tokenizer.ggml.token_type", types);
  w.set("tokenizer.ggml.merges", merges);
  w.set("tokenizer.ggml.bos_token_id", std::uint32_t{265});
  w.set("tokenizer.ggml.eos_token_id", std::uint32_t{267});
  w.set("tokenizer.ggml.add_bos_token", false);
  w.set("tokenizer.chat_template", "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}");
  add_tiny_tensors(w, zipage::gguf::tensor_type::f32, static_cast<std::int64_t>(tokens.size()), true);
  return w.bytes(3);
}

}  // namespace

int main(int argc, char** argv) {
  const fs::path out = argc > 1 ? argv[1] : "tests/fuzz/corpus";
  using tt = zipage::gguf::tensor_type;
  put(out / "fuzz_gguf" / "llama_f32_v3.gguf", tiny_gguf(tt::f32, true, 3));
  put(out / "fuzz_gguf" / "llama_f16_v2.gguf", tiny_gguf(tt::f16, true, 2));
  put(out / "fuzz_gguf" / "llama_bf16_no_tokenizer.gguf", tiny_gguf(tt::bf16, false, 3));
  put(out / "fuzz_gguf" / "qwen3_bpe.gguf", tiny_qwen_gguf());

  {
    zipage::safetensors::writer w;
    w.set_metadata("format", "pt");
    w.add("model.embed_tokens.weight", {4, 3}, ramp(12), zipage::safetensors::dtype::f32);
    w.add("model.norm.weight", {3}, ramp(3), zipage::safetensors::dtype::bf16);
    w.add("lm_head.weight", {2, 2}, ramp(4), zipage::safetensors::dtype::f16);
    put(out / "fuzz_safetensors" / "three_dtypes.safetensors", w.bytes());
    zipage::safetensors::writer e;
    e.add("empty", {0, 4}, {}, zipage::safetensors::dtype::f32);
    e.add("scalar", {}, ramp(1), zipage::safetensors::dtype::f32);
    put(out / "fuzz_safetensors" / "empty_and_scalar.safetensors", e.bytes());
    // An FP8 checkpoint's pair: E4M3 codes and their block scales (issue 14, part 2).
    zipage::safetensors::writer q;
    std::vector<std::byte> codes;
    for (unsigned c : {0x38u, 0x40u, 0xb8u, 0x7eu, 0x01u, 0x00u}) codes.push_back(static_cast<std::byte>(c));
    q.add_raw("model.layers.0.mlp.up_proj.weight", "F8_E4M3", {2, 3}, codes);
    q.add("model.layers.0.mlp.up_proj.weight_scale_inv", {1, 1}, ramp(1), zipage::safetensors::dtype::f32);
    put(out / "fuzz_safetensors" / "fp8_block.safetensors", q.bytes());
  }

  put(out / "fuzz_hf_config" / "qwen3.json", R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
 "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
 "intermediate_size": 3072, "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-06,
 "rope_theta": 1000000, "rope_scaling": null, "tie_word_embeddings": true, "hidden_act": "silu",
 "attention_bias": false, "use_sliding_window": false, "sliding_window": null, "bos_token_id": 151643,
 "eos_token_id": 151645, "torch_dtype": "bfloat16"})");
  put(out / "fuzz_hf_config" / "qwen3_fp8.json", R"({"model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36,
 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936,
 "tie_word_embeddings": false, "hidden_act": "silu", "eos_token_id": 151645, "quantization_config": {"activation_scheme":
 "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128], "modules_to_not_convert": null}})");
  put(out / "fuzz_hf_config" / "qwen2.json", R"({"model_type": "qwen2", "hidden_size": 1536, "num_hidden_layers": 28,
 "num_attention_heads": 12, "num_key_value_heads": 2, "intermediate_size": 8960, "vocab_size": 151936,
 "max_position_embeddings": 131072, "rms_norm_eps": 1e-06, "rope_theta": 10000, "tie_word_embeddings": false,
 "hidden_act": "silu", "bos_token_id": 151643, "eos_token_id": [151643, 151645], "layer_types": ["full_attention"]})");
  put(out / "fuzz_hf_config" / "llama31_generation.json", R"({"model_type": "llama", "hidden_size": 2048,
 "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192,
 "vocab_size": 128256, "rms_norm_eps": 1e-05, "tie_word_embeddings": true, "bos_token_id": 128000,
 "eos_token_id": [128001, 128008, 128009], "mlp_bias": false,
 "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
 "do_sample": true, "temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_p": 0.0, "repetition_penalty": 1.0})");
  put(out / "fuzz_hf_config" / "rope_parameters.json", R"({"model_type": "llama", "hidden_size": 64,
 "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 300,
 "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}})");

  std::ifstream qcfg(fs::path(ZIPAGE_SEED_DATA_DIR) / "qwen3" / "tokenizer_config.json");
  const std::string qwen3_config((std::istreambuf_iterator<char>(qcfg)), std::istreambuf_iterator<char>());
  const std::string llama_config = R"({"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "add_bos_token": true,
 "chat_template": "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"})";
  put(out / "fuzz_tokenizer_json" / "qwen2_pattern_nfc", tokenizer(zipage::bpe_tokenizer::qwen2_pattern, true).dump());
  put(out / "fuzz_tokenizer_json" / "llama3_pattern_with_config",
      tokenizer(zipage::bpe_tokenizer::llama3_pattern, false).dump() + std::string(1, '\0') + llama_config);
  put(out / "fuzz_tokenizer_json" / "qwen2_pattern_qwen3_config",
      tokenizer(zipage::bpe_tokenizer::qwen2_pattern, true).dump() + std::string(1, '\0') + qwen3_config);

  const auto qcfg_json = nlohmann::json::parse(qwen3_config);
  put(out / "fuzz_chat_template" / "qwen3.jinja", qcfg_json["chat_template"].get<std::string>());
  put(out / "fuzz_chat_template" / "qwen2.jinja",
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou "
      "are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' "
      "}}{% endif %}");
  put(out / "fuzz_chat_template" / "chatml.jinja",
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
      "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}");
  put(out / "fuzz_chat_template" / "llama31.jinja",
      "{{- bos_token }}{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}{{- \"Cutting Knowledge Date: December "
      "2023\\n\" }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
      "message['content'] | trim + '<|eot_id|>' }}{%- endfor %}");
  put(out / "fuzz_chat_template" / "deepseek_r1.jinja",
      "{% for message in messages %}{% if message['role'] == 'user' %}{{'<\xEF\xBD\x9CUser\xEF\xBD\x9C>' + "
      "message['content']}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{'<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C><think>\\n'}}{% endif %}");

  put(out / "fuzz_encoders" / "english", std::string("Hello, world! How's it going? I'M fine, you'LL see.\n\n  Tabs\tand 12345 digits."));
  put(out / "fuzz_encoders" / "unicode", std::string("caf\xC3\xA9 e\xCC\x81 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80 \xD0\x9F\xD1\x80\xD0\xB8 \xE2\x80\xAF\r\n"));
  put(out / "fuzz_encoders" / "specials", std::string("<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>x <s></s>"));
  put(out / "fuzz_encoders" / "invalid_utf8", std::string("ok\xFF\xC3(\xE2\x82 \xF0\x9F\x98 \xED\xA0\x80 end", 22));

  // fuzz_answer: a model's output (its final answer boxed or after ####), NUL, the reference answer.
  const std::pair<const char*, std::pair<std::string_view, std::string_view>> answers[] = {
      {"boxed_frac", {"So $x = \\frac{1}{2}$, and the answer is $\\boxed{\\dfrac12}$.", "0.5"}},
      {"hash", {"She pays 3 * 6 = 18 dollars.\n#### 18", "18.0"}},
      {"nested_boxed",
       {"\\boxed{\\frac{\\sqrt{2}}{2}} or rather \\boxed {\\frac{1}{\\sqrt2}}", "\\frac{\\sqrt{2}}{2}"}},
      {"boxed_space", {"The answer is \\boxed 5$.", "five"}},
      {"fbox", {"\\fbox{3\\frac{1}{2}}", "7/2"}},
      {"sqrt_index", {"\\boxed{\\sqrt[3]{8}+2\\sqrt2}", "2+2\\sqrt{2}"}},
      {"trig", {"\\boxed{\\sin^2 x+\\cos^2x}", "1"}},
      {"functions", {"\\boxed{\\log_2 8 + \\ln e + \\operatorname{tan}(\\pi/4)}", "5"}},
      {"binom", {"\\boxed{\\binom{5}{2}}", "{5 \\choose 2}"}},
      {"factorial", {"\\boxed{\\frac{6!}{2!4!}}", "15"}},
      {"set", {"\\boxed{\\{1, 2\\}}", "2, 1"}},
      {"tuple", {"\\boxed{(1, -\\frac{3}{4})}", "(1,-0.75)"}},
      {"interval", {"\\boxed{[0, \\frac12) \\cup (2, \\infty)}", "[0,0.5)\\cup(2,\\infty)"}},
      {"equation", {"\\boxed{y = 2x + 1}", "2x - y + 1 = 0"}},
      {"named_value", {"\\boxed{x_1 = -3}", "-3"}},
      {"percent", {"\\boxed{25\\%}", "0.25"}},
      {"percent_word", {"That is 12\\frac{1}{2} percent of them.\n#### 12\\frac12 percent", "12.5"}},
      {"number_words", {"\\boxed{\\text{Twenty-one}}", "21"}},
      {"units", {"\\boxed{15\\mbox{ cm}^2}", "15 square centimeters"}},
      {"degrees", {"\\boxed{90^\\circ}", "90"}},
      {"scientific", {"\\boxed{1.5\\times10^{3}}", "1{,}500"}},
      {"matrix", {"\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}}",
                  "\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}"}},
      {"vector", {"\\boxed{\\left\\langle 1, 2 \\right\\rangle}", "\\langle1,2\\rangle"}},
      {"expression", {"\\boxed{\\frac{x}{7}+\\frac{2}{7}}", "\\frac{x+2}{7}"}},
      {"abs_power", {"\\boxed{|x|^{2} - e^{x}}", "x^2-\\exp x"}},
      {"choice", {"The correct option is \\boxed{\\textbf{(C) } 12}", "C"}},
      {"text_answer", {"\\boxed{\\text{Evelyn}}", "\\text{Evelyn}"}},
      {"pi", {"\\boxed{\\frac{2\\pi}{3}}", "2.0944"}},
      {"unclosed", {"\\boxed{\\frac{1}{2}", "\\frac{1}{2"}},
      {"minus_sign", {"\\boxed{\xE2\x88\x92 4}", "-4"}},
  };
  for (const auto& [name, pair] : answers)
    put(out / "fuzz_answer" / name, std::string(pair.first) + std::string(1, '\0') + std::string(pair.second));

  // fuzz_guided: the compiler's byte (0 regex, 1 JSON schema, 2 GBNF, 3 structural tag, 4 choices at line breaks),
  // the constraint, NUL, the bytes that steer the walk; refused constraints alone. (sv literals: a regex's byte is
  // a NUL.)
  using namespace std::string_view_literals;
  const std::pair<const char*, std::pair<std::string_view, std::string_view>> guided[] = {
      {"regex-class", {"\x00[a-c]{1,3}(x|yz)*"sv, "\x02\x05\x01\x07"sv}},
      {"regex-utf8", {"\x00(\u65e5\u672c|\u00e9)+[^a]\\d?"sv, "\x03\x03\x02\x02"sv}},
      {"regex-anchors", {"\x00^a.b$"sv, "\x01"sv}},
      {"json-object",
       {"\x01{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":-3,\"maximum\":40},"
        "\"b\":{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"maxItems\":2}},\"required\":[\"a\"]}"sv,
        "\x04\x09\x02\x11\x03\x05\x06\x07"sv}},
      {"json-recursive",
       {"\x01{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"c\":{\"$ref\":\"#/$defs/n\"}}}},"
        "\"$ref\":\"#/$defs/n\"}"sv,
        "\x02\x04\x06\x08\x0a"sv}},
      {"json-any", {"\x01{\"type\":\"object\"}"sv, "\x02\x04\x06\x08"sv}},
      {"json-multiple", {"\x01{\"type\":\"number\",\"multipleOf\":0.25,\"minimum\":-1,\"maximum\":3}"sv, "\x03\x05\x07"sv}},
      {"json-string", {"\x01{\"type\":\"string\",\"pattern\":\"^[a-z]+$\",\"maxLength\":5}"sv, "\x01\x02"sv}},
      {"grammar-recursive", {"\x02root ::= \"(\" root \")\" | \"x\""sv, "\x02\x02\x04"sv}},
      {"grammar-json",
       {"\x02root ::= value\nvalue ::= \"[\" (value (\",\" value)*)? \"]\" | [0-9]+"sv, "\x02\x04\x08\x10"sv}},
      {"tag-legacy",
       {"\x03{\"structures\":[{\"begin\":\"<a>\",\"schema\":{\"type\":\"integer\"},\"end\":\"</a>\"}],"
        "\"triggers\":[\"<a>\"]}"sv,
        "\x02\x04\x06\x08\x0a\x0c"sv}},
      {"tag-format",
       {"\x03{\"type\":\"structural_tag\",\"format\":{\"type\":\"sequence\",\"elements\":[{\"type\":"
        "\"const_string\",\"value\":\"hi\"},{\"type\":\"regex\",\"pattern\":\"[xy]{2}\"}]}}"sv,
        "\x02\x02"sv}},
      {"tag-triggered",
       {"\x03{\"type\":\"structural_tag\",\"format\":{\"type\":\"triggered_tags\",\"triggers\":[\"<a\"],"
        "\"tags\":[{\"begin\":\"<a>\",\"content\":{\"type\":\"json_schema\",\"json_schema\":{\"type\":"
        "\"boolean\"}},\"end\":\"</a>\"}],\"at_least_one\":true}}"sv,
        "\x02\x04\x06"sv}},
      {"choice", {"\x04yes\nno\n\u65e5\u672c\nnot"sv, "\x01\x02\x03"sv}},
  };
  for (const auto& [name, pair] : guided)
    put(out / "fuzz_guided" / name, std::string(pair.first) + std::string(1, '\0') + std::string(pair.second));
  const std::pair<const char*, std::string_view> refused[] = {
      {"regex-bad", "\x00(?=a)b"sv}, {"grammar-bad", "\x02root ::= \"a\" | "sv}, {"choice-empty", "\x04" "a\n\nb"sv}};
  for (const auto& [name, spec] : refused) put(out / "fuzz_guided" / name, std::string(spec));
  return 0;
}
