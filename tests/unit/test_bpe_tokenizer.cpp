// Tests for the byte-level BPE tokenizer: the real Qwen3 tokenizer (tests/data/qwen3, copied from the
// Qwen3 release) against known token ids, the pre-tokenizer regex against matches of a regex engine,
// NFC, round trips, streaming decode and chat templates; then small synthetic tokenizer.json files for the
// Llama 3 variant (digits in threes, ignore_merges, BOS from the post-processor), added-token options
// and every load error.
#include <doctest/doctest.h>

#include "test_support.hpp"

#include <zipage/tokenizer/bpe_tokenizer.hpp>
#include <zipage/tokenizer/detokenizer.hpp>

#include <string>
#include <vector>

using zipage::bpe_tokenizer;
using zipage::chat_message;
using zipage::token_id;
using ids = std::vector<token_id>;

namespace {

using zipage::testing::contains;
using zipage::testing::error_of;
using zipage::testing::temp_dir;



const bpe_tokenizer& qwen3() {
  static const bpe_tokenizer tok = bpe_tokenizer::from_dir(std::string(ZIPAGE_TEST_DATA_DIR) + "/qwen3");
  return tok;
}

std::vector<std::string> strings(const std::vector<std::string_view>& v) { return {v.begin(), v.end()}; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// The Qwen3 tokenizer
// ---------------------------------------------------------------------------------------------

TEST_CASE("qwen3 tokenizer: vocabulary facts") {
  const auto& t = qwen3();
  CHECK(t.vocab_size() == 151669);  // 151,643 BPE entries + 26 added tokens (151643..151668)
  CHECK(t.num_merges() == 151387);
  CHECK(t.added_tokens().size() == 26);
  CHECK(t.normalizes_nfc());
  CHECK(t.max_digits() == 1);
  CHECK(t.find("<|endoftext|>") == 151643);
  CHECK(t.find("<|im_start|>") == 151644);
  CHECK(t.find("<|im_end|>") == 151645);
  CHECK(t.find("<think>") == 151667);
  CHECK(t.find("</think>") == 151668);
  CHECK(t.find("Hello") == 9707);
  CHECK(t.find("\xC4\xA0world") == 1879);  // "Ġworld": the byte-level form of " world"
  CHECK_FALSE(t.find("no such token").has_value());
  CHECK(t.token_text(151644) == "<|im_start|>");
  CHECK(t.is_special(151645));
  CHECK_FALSE(t.is_special(151667));  // <think> is an added token but not a special one
  CHECK_FALSE(t.is_special(9707));
  CHECK(t.eos() == 151645);  // tokenizer_config.json's eos_token
  CHECK(t.bos() == -1);
  CHECK_FALSE(t.add_bos());
  CHECK(t.chat() == zipage::chat_format::qwen3);
}

TEST_CASE("qwen3 tokenizer: known token ids") {
  const auto& t = qwen3();
  CHECK(t.encode("Hello world") == ids{9707, 1879});
  CHECK(t.encode("<|im_start|><|im_end|><think></think>") == ids{151644, 151645, 151667, 151668});
  CHECK(t.encode("") == ids{});
  // Expected ids below come from Hugging Face tokenizers 0.23.2 (Tokenizer.from_file on this tokenizer.json,
  // add_special_tokens=False); a naive Python reference (the `regex` module's matches of the pattern,
  // unicodedata's NFC, lowest-ranked merge first) gives the same.
  struct example {
    const char* text;
    ids expected;
  };
  const std::vector<example> examples = {
      {"Hello, world! How's it going? I'M fine, you'LL see.",
       {9707, 11, 1879, 0, 2585, 594, 432, 2087, 30, 358, 27603, 6915, 11, 498, 6, 4086, 1490, 13}},
      {"  leading and trailing  ", {220, 6388, 323, 27748, 256}},
      {"line1\nline2\r\n\r\n  indented\n\n\nx", {1056, 16, 198, 1056, 17, 871, 220, 1257, 15864, 1406, 87}},
      {"numbers 1234567 and 3.14159", {37378, 220, 16, 17, 18, 19, 20, 21, 22, 323, 220, 18, 13, 16, 19, 16, 20, 24}},
      {"emoji \xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD family "
       "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7",
       {37523, 90316, 144349, 145375, 2997, 61804, 101, 378, 235, 145233, 378, 235, 145665}},
      {"\xE4\xB8\xAD\xE6\x96\x87\xE6\xB5\x8B\xE8\xAF\x95\xEF\xBC\x8C\xE4\xBD\xA0\xE5\xA5\xBD\xE4\xB8\x96\xE7\x95\x8C"
       "\xE3\x80\x82\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88",
       {104811, 81705, 3837, 108386, 99489, 1773, 101059, 102819, 15767, 56833, 61803, 70534}},
      {"\xC3\x9Cn\xC3\xAF" "c\xC3\xB6" "d\xC3\xA9 caf\xC3\xA9 na\xC3\xAFve r\xC3\xA9sum\xC3\xA9",
       {52491, 77, 37572, 66, 2956, 128505, 51950, 94880, 586, 9333, 1242, 963}},
      // NFC: e + U+0301 becomes é; the Hangul jamo L V T compose to one syllable.
      {"e\xCC\x81 vs \xC3\xA9, Hangul \xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", {963, 6165, 3958, 11, 40775, 360, 126804}},
      {"<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
       {151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271}},
      {"def f(x):\n    return x**2  # comment\n\t\tif a != b: pass",
       {750, 282, 2075, 982, 262, 470, 856, 334, 17, 220, 671, 3980, 198, 197, 743, 264, 961, 293, 25, 1494}},
      {"don't won't can't shouldn't've", {15007, 944, 2765, 944, 646, 944, 13133, 944, 3003}},
      {"tabs\tand\xC2\xA0nbsp \xE3\x80\x80ideographic", {30993, 52477, 4102, 5674, 220, 22441, 94007}},
      {"$$$ ((( ))) ... !!! ??? --- ___", {74573, 11600, 98952, 2503, 32870, 51317, 12448, 7436}},
      {"\xCE\xA9\xE2\x89\x88\xC3\xA7\xE2\x88\x9A\xE2\x88\xAB\xCB\x9C\xC2\xB5\xE2\x89\xA4\xE2\x89\xA5\xC3\xB7 \xC2\xBD "
       "\xE2\x85\xAB \xD9\xA1\xD9\xA2\xD9\xA3",
       {144572, 144540, 3131, 144336, 145706, 144775, 73048, 144570, 144481, 144422, 220, 26062, 220, 70467, 104, 220,
        149, 94, 149, 95, 149, 96}},
  };
  for (const auto& e : examples) {
    CAPTURE(e.text);
    CHECK(t.encode(e.text) == e.expected);
  }
}

TEST_CASE("qwen3 tokenizer: 815 strings against Hugging Face tokenizers") {
  // tests/data/qwen3/hf_golden.jsonl: {"text", "ids"} per line, ids from Hugging Face tokenizers 0.23.2.
  // The texts are the examples above and random strings over ASCII, whitespace of every kind, contractions,
  // combining marks, Hangul jamo, CJK, emoji, controls and the added tokens.
  const auto& t = qwen3();
  const std::string text = zipage::json::read_text_file(std::string(ZIPAGE_TEST_DATA_DIR) + "/qwen3/hf_golden.jsonl", "golden");
  std::size_t count = 0, start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) {
      const auto line = zipage::json::parse(std::string_view(text).substr(start, end - start), "hf_golden.jsonl");
      const auto& s = line.at("text").get_ref<const std::string&>();
      CAPTURE(s);
      CHECK(t.encode(s) == line.at("ids").get<ids>());
      CHECK(t.decode(t.encode(s)) == zipage::unicode::nfc(s));
      ++count;
    }
    start = end + 1;
  }
  CHECK(count == 815);
}

TEST_CASE("qwen3 tokenizer: the pre-tokenizer splits as the regex does") {
  // Expected pieces: the matches of the tokenizer's pattern by Python's `regex` module.
  const auto& t = qwen3();
  using v = std::vector<std::string>;
  CHECK(strings(t.pre_tokenize("Hello world")) == v{"Hello", " world"});
  CHECK(strings(t.pre_tokenize("I'm here, you'RE there")) == v{"I", "'m", " here", ",", " you", "'RE", " there"});
  CHECK(strings(t.pre_tokenize("  a\n\n  b")) == v{" ", " a", "\n\n", " ", " b"});
  CHECK(strings(t.pre_tokenize("x   y")) == v{"x", "  ", " y"});
  CHECK(strings(t.pre_tokenize("$hello (world)")) == v{"$hello", " (", "world", ")"});
  CHECK(strings(t.pre_tokenize("123 4567")) == v{"1", "2", "3", " ", "4", "5", "6", "7"});
  CHECK(strings(t.pre_tokenize("a\tb \n")) == v{"a", "\tb", " \n"});
  CHECK(strings(t.pre_tokenize("end  ")) == v{"end", "  "});
  CHECK(strings(t.pre_tokenize("\xE4\xB8\xAD\xE6\x96\x87\xEF\xBC\x8C\xE6\xA0\x87\xE7\x82\xB9\xE3\x80\x82")) ==
        v{"\xE4\xB8\xAD\xE6\x96\x87", "\xEF\xBC\x8C\xE6\xA0\x87\xE7\x82\xB9", "\xE3\x80\x82"});
  CHECK(strings(t.pre_tokenize("don't!!!\n\n")) == v{"don", "'t", "!!!\n\n"});
  // Invalid UTF-8: a bad byte is a piece of punctuation of its own kind.
  CHECK(strings(t.pre_tokenize("a\xFF\xFE" "b")) == v{"a", "\xFF\xFE", "b"});
  CHECK(strings(t.pre_tokenize("a \xFF" "b")) == v{"a", " \xFF", "b"});
}

TEST_CASE("qwen3 tokenizer: decode round trips; invalid UTF-8; unknown ids") {
  const auto& t = qwen3();
  for (const char* s : {"Hello world", "  x\n\n\ty  ", "caf\xC3\xA9 \xF0\x9F\x98\x80 \xE4\xB8\xAD",
                        "<|im_start|>user\nhi<|im_end|>", "'s 'RE 12345", "\r\n\r\n", "\xE2\x80\xA8"}) {
    CAPTURE(s);
    CHECK(t.decode(t.encode(s)) == s);
  }
  // NFC changes the text, so decode gives the composed form back.
  CHECK(t.decode(t.encode("e\xCC\x81")) == "\xC3\xA9");
  // Bytes that are not UTF-8 are still encoded (byte-level BPE covers all 256) and decode to U+FFFD.
  const auto bad = t.encode("a\xFF" "b\xC3");
  CHECK(bad.size() >= 3);
  CHECK(t.decode(bad) == "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
  // Special tokens can be skipped; ids past the tokenizer's table produce nothing (as in the tokenizers
  // library: a model's vocabulary is often padded, 151936 for Qwen3).
  CHECK(t.decode(ids{151644, 9707, 151645}, true) == "Hello");
  CHECK(t.decode(ids{151644, 9707, 151645}) == "<|im_start|>Hello<|im_end|>");
  CHECK(t.decode(ids{151669, 151935, -1, 9707}) == "Hello");
  CHECK(contains(error_of([&] { (void)t.token_text(151669); }), "token id 151669 is out of range [0, 151669)"));
  // parse_special = false: special tokens in user text are plain text; <think> (not special) still matches.
  const auto plain = t.encode("<|im_start|><think>", false, false);
  CHECK(std::find(plain.begin(), plain.end(), 151644) == plain.end());
  CHECK(plain.back() == 151667);
  CHECK(t.decode(plain) == "<|im_start|><think>");
}

TEST_CASE("qwen3 tokenizer: streaming decode holds split characters") {
  const auto& t = qwen3();
  // Arabic-Indic digits are byte tokens here: 149 is the byte 0xD9 that starts each of them.
  const std::string text = "emoji \xF0\x9F\x98\x80\xF0\x9F\x91\x8D family \xE4\xB8\xAD\xE6\x96\x87 \xD9\xA1\xD9\xA2 done";
  const auto tokens = t.encode(text);
  zipage::bpe_stream_decoder dec(t);
  std::string streamed;
  bool held_back = false;
  for (token_id id : tokens) {
    const std::string piece = dec.push(id);
    CHECK(zipage::utf8::is_valid(piece));
    held_back = held_back || dec.has_pending();
    streamed += piece;
  }
  streamed += dec.flush();
  CHECK(held_back);
  CHECK(streamed == text);
  // A character that never completes becomes U+FFFD at flush.
  zipage::bpe_stream_decoder d2(t);
  CHECK(d2.push(149).empty());
  CHECK(d2.flush() == "\xEF\xBF\xBD");
  // Special tokens are skipped by default, kept on request.
  zipage::bpe_stream_decoder d3(t), d4(t, false);
  CHECK(d3.push(151645).empty());
  CHECK(d4.push(151645) == "<|im_end|>");
  // The engine-side factory.
  auto factory = zipage::detokenizer_factory(t);
  auto detok = factory(ids{1, 2, 3});
  std::string out;
  for (token_id id : t.encode("Hi there")) out += detok(id);
  out += detok(151645);
  CHECK(out == "Hi there");
}

TEST_CASE("qwen3 tokenizer: chat template, thinking on and off") {
  const auto& t = qwen3();
  const std::vector<chat_message> msgs{{"system", "You are terse."}, {"user", "What is 2+2?"}};
  const std::string on = t.apply_chat_template(msgs);
  CHECK(on == "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
              "<|im_start|>assistant\n");
  const std::string off = t.apply_chat_template(msgs, {.enable_thinking = false});
  CHECK(off == on + "<think>\n\n</think>\n\n");
  const auto on_ids = t.encode(on), off_ids = t.encode(off);
  CHECK(on_ids.front() == 151644);
  CHECK(ids(on_ids.end() - 3, on_ids.end()) == ids{151644, 77091, 198});  // <|im_start|> "assistant" "\n"
  CHECK(ids(off_ids.end() - 4, off_ids.end()) == ids{151667, 271, 151668, 271});  // <think> "\n\n" </think> "\n\n"
  CHECK(std::count(on_ids.begin(), on_ids.end(), 151645) == 2);
  CHECK(t.apply_chat_template(msgs, {.add_generation_prompt = false}) ==
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n");

  // Earlier answers lose their reasoning; the answer after the last user turn keeps it.
  const std::vector<chat_message> turns{{"user", "a"},
                                        {"assistant", "<think>\nr1\n</think>\n\nA1"},
                                        {"user", "b"},
                                        {"assistant", "<think>\nr2\n</think>\n\nA2"}};
  CHECK(t.apply_chat_template(turns, {.add_generation_prompt = false}) ==
        "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nb<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nr2\n</think>\n\nA2<|im_end|>\n");
  // Tool results are wrapped into a user turn.
  const std::vector<chat_message> tools{{"user", "q"}, {"assistant", "calling"}, {"tool", "42"}, {"tool", "43"}};
  CHECK(t.apply_chat_template(tools, {.add_generation_prompt = false}) ==
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\ncalling<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n"
        "</tool_response>\n<tool_response>\n43\n</tool_response><|im_end|>\n");
  // A role the template does not know: Qwen3's template writes nothing for it (jinja2 renders the same);
  // the built-in format refuses it.
  CHECK(t.apply_chat_template(std::vector<chat_message>{{"robot", "x"}}) == "<|im_start|>assistant\n");
  auto builtin = t;
  builtin.use_builtin_chat_format(zipage::chat_format::qwen3);
  CHECK(contains(error_of([&] { (void)builtin.apply_chat_template(std::vector<chat_message>{{"robot", "x"}}); }),
                 "unsupported role 'robot'"));
}

TEST_CASE("chat templates of the other families") {
  const std::vector<chat_message> msgs{{"system", "Be brief. "}, {"user", " Hi!\n"}};
  CHECK(zipage::apply_chat_template(zipage::chat_format::llama3, msgs) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(zipage::apply_chat_template(zipage::chat_format::chatml, msgs) ==
        "<|im_start|>system\nBe brief. <|im_end|>\n<|im_start|>user\n Hi!\n<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<chat_message> r1{{"system", "S"}, {"user", "Q1"}, {"assistant", "<think>x</think>A1"}, {"user", "Q2"}};
  CHECK(zipage::apply_chat_template(zipage::chat_format::deepseek_r1, r1) ==
        "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>S<\xEF\xBD\x9CUser\xEF\xBD\x9C>Q1"
        "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>A1<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"
        "<\xEF\xBD\x9CUser\xEF\xBD\x9C>Q2<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C><think>\n");
  CHECK(zipage::detect_chat_format("{{ '<|start_header_id|>' }}") == zipage::chat_format::llama3);
  CHECK(zipage::detect_chat_format("{{ '<|im_start|>' }}") == zipage::chat_format::chatml);
  CHECK(zipage::detect_chat_format("<|im_start|> enable_thinking") == zipage::chat_format::qwen3);
  CHECK(zipage::detect_chat_format("{{'<\xEF\xBD\x9CUser\xEF\xBD\x9C>'}}") == zipage::chat_format::deepseek_r1);
  CHECK(zipage::detect_chat_format("{{ messages }}") == zipage::chat_format::none);
  CHECK(contains(error_of([&] { (void)zipage::apply_chat_template(zipage::chat_format::none, msgs); }),
                 "no chat template zipage knows"));
}

// ---------------------------------------------------------------------------------------------
// Synthetic tokenizers
// ---------------------------------------------------------------------------------------------

namespace {

// GPT-2's byte-level character for byte b, as UTF-8.
std::string byte_char(int b) {
  std::string s;
  zipage::unicode::append_utf8(s, zipage::detail::byte_to_unicode()[static_cast<std::size_t>(b)]);
  return s;
}

// A tokenizer.json with the 256 byte tokens (id = byte), then `extra` tokens from id 256, and `merges`.
nlohmann::json synthetic(const std::vector<std::string>& extra, const nlohmann::json& merges,
                         std::string_view pattern = bpe_tokenizer::llama3_pattern) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  for (std::size_t i = 0; i < extra.size(); ++i) vocab[extra[i]] = 256 + i;
  return {{"version", "1.0"},
          {"added_tokens", nlohmann::json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
            {"vocab", vocab}, {"merges", merges}}}};
}

bpe_tokenizer make(const nlohmann::json& j, const std::string& config = {}) {
  return bpe_tokenizer::from_json(j.dump(), config);
}

std::string load_error(const nlohmann::json& j, const std::string& config = {}) {
  return error_of([&] { (void)make(j, config); });
}

}  // namespace

TEST_CASE("synthetic tokenizer: merges by rank, both merge spellings, Llama 3 digit groups") {
  // Vocab: 256 "ab" 257 "abc" 258 "bc" 259 "123"; merges: (b c) first, then (a b), then (a bc), (12 3)...
  const std::string G = byte_char(' ');  // "Ġ"
  auto j = synthetic({"ab", "abc", "bc", "12", "123", G + "a"},
                     nlohmann::json::array({nlohmann::json::array({"b", "c"}), nlohmann::json::array({"a", "b"}),
                                            nlohmann::json::array({"a", "bc"}), nlohmann::json::array({"1", "2"}),
                                            nlohmann::json::array({"12", "3"}), nlohmann::json::array({G, "a"})}));
  const auto t = make(j);
  CHECK(t.max_digits() == 3);
  CHECK_FALSE(t.normalizes_nfc());
  // "abc": (b,c) has the better rank, then (a,bc) → abc.
  CHECK(t.encode("abc") == ids{257});
  CHECK(t.encode("ab") == ids{256});
  // Digits are grouped in threes before BPE: 1234567 → 123 | 456 | 7.
  CHECK(t.encode("1234567") == ids{260, '4', '5', '6', '7'});
  CHECK(strings(t.pre_tokenize("1234567")) == std::vector<std::string>{"123", "456", "7"});
  CHECK(t.encode(" a") == ids{261});
  CHECK(t.decode(t.encode(" abc 1234567\n")) == " abc 1234567\n");
  // The same merges written "left right".
  j["model"]["merges"] = nlohmann::json::array({"b c", "a b", "a bc", "1 2", "12 3", G + " a"});
  CHECK(make(j).encode("abc") == ids{257});
  // A repeated pair keeps its first rank.
  j["model"]["merges"] = nlohmann::json::array({"a b", "b c", "a b", "a bc"});
  CHECK(make(j).encode("abc") == ids{256, 'c'});
}

TEST_CASE("synthetic tokenizer: ignore_merges takes whole words from the vocab") {
  // "abc" is in the vocab but no merge path reaches it.
  auto j = synthetic({"ab", "abc"}, nlohmann::json::array({nlohmann::json::array({"a", "b"})}));
  CHECK(make(j).encode("abc") == ids{256, 'c'});
  j["model"]["ignore_merges"] = true;
  CHECK(make(j).encode("abc") == ids{257});
}

TEST_CASE("synthetic tokenizer: added tokens, lstrip/rstrip, BOS from the post-processor, config") {
  auto j = synthetic({}, nlohmann::json::array());
  j["added_tokens"] = {
      {{"id", 300}, {"content", "<s>"}, {"special", true}, {"lstrip", false}, {"rstrip", false}, {"single_word", false}},
      {{"id", 301}, {"content", "<ss>"}, {"special", true}},
      {{"id", 302}, {"content", "[M]"}, {"special", false}, {"lstrip", true}, {"rstrip", true}},
      {{"id", 303}, {"content", "\xE2\x96\x81x y"}, {"special", false}},
  };
  j["post_processor"] = {{"type", "Sequence"},
                         {"processors",
                          {{{"type", "ByteLevel"}},
                           {{"type", "TemplateProcessing"},
                            {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                            {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {300}}}}}}}}}};
  const auto t = make(j, R"({"eos_token": {"content": "<ss>"}, "chat_template": [{"name": "default", "template": "<|im_start|>"}]})");
  CHECK(t.bos() == 300);
  CHECK(t.add_bos());
  CHECK(t.eos() == 301);
  CHECK(t.chat() == zipage::chat_format::chatml);
  CHECK(t.vocab_size() == 304);
  CHECK(t.encode("a", true) == ids{300, 'a'});
  // Longest match first: <ss> is not <s> + "s>".
  CHECK(t.encode("<ss><s>") == ids{301, 300});
  // [M] takes the whitespace on both sides.
  CHECK(t.encode("a  [M]\tb") == ids{'a', 302, 'b'});
  // Unicode whitespace too, as the tokenizers library strips it (char::is_whitespace): U+3000, NBSP, U+2003.
  CHECK(t.encode("a\xE3\x80\x80 [M]\xC2\xA0\xE2\x80\x83" "b") == ids{'a', 302, 'b'});
  // ... but not a character that merely ends in a space's last byte ("\xC3\xA0" is a-grave, NBSP is C2 A0).
  ids grave = t.encode("\xC3\xA0");
  grave.push_back(302);
  CHECK(t.encode("\xC3\xA0[M]") == grave);
  // An added token outside the byte map decodes as its own UTF-8 (as the tokenizers library does).
  CHECK(t.encode("\xE2\x96\x81x y") == ids{303});
  CHECK(t.decode(ids{303}) == "\xE2\x96\x81x y");
  CHECK(t.decode(ids{300, 'a', 301}, true) == "a");

  // Without a BOS.
  const auto u = make(synthetic({}, nlohmann::json::array()));
  CHECK(u.bos() == -1);
  CHECK(contains(error_of([&] { (void)u.encode("x", true); }), "BOS requested but the tokenizer has no BOS token"));
}

TEST_CASE("synthetic tokenizer: ids are bounded by the tokens the file declares (issue 13)") {
  // A few-KB file naming one id of 2^22 used to size the id table to 2^22 entries (2^26: 2.8 GB).
  auto j = synthetic({"ab"}, nlohmann::json::array());
  j["model"]["vocab"]["ab"] = 1 << 22;
  CHECK(contains(load_error(j), "tokenizer.json: token id 4194304 is out of range: the file declares 257 tokens "
                                "(model.vocab + added_tokens), so ids must be below 2 x 257 + 1024 = 1538"));
  j = synthetic({}, nlohmann::json::array());
  j["added_tokens"] = nlohmann::json::array({{{"id", 1 << 22}, {"content", "<big>"}, {"special", true}}});
  CHECK(contains(load_error(j), "added_tokens[0]: token id 4194304 is out of range: the file declares 257 tokens"));
  // Ids with gaps load while the table stays proportional to the file.
  j["added_tokens"][0]["id"] = 1537;
  const auto t = make(j);
  CHECK(t.vocab_size() == 1538);
  CHECK(t.find("<big>") == 1537);
  j["added_tokens"][0]["id"] = 1538;
  CHECK(contains(load_error(j), "token id 1538 is out of range"));
}

TEST_CASE("synthetic tokenizer: load errors name the file and the field") {
  const auto good = synthetic({"ab"}, nlohmann::json::array({nlohmann::json::array({"a", "b"})}));
  CHECK(load_error(good) == "<no error>");
  auto j = good;
  j.erase("model");
  CHECK(contains(load_error(j), "tokenizer.json: missing field 'model'"));
  j = good;
  j["model"]["type"] = "WordPiece";
  CHECK(contains(load_error(j), "model type 'WordPiece' is not supported"));
  j = good;
  j["model"]["vocab"].erase(byte_char(0x0A));
  CHECK(contains(load_error(j), "the vocab lacks the byte-level token"));
  j = good;
  j["model"]["merges"] = nlohmann::json::array({nlohmann::json::array({"a", "zz"})});
  CHECK(contains(load_error(j), "model.merges[0]: 'a' or 'zz' is not in the vocab"));
  j = good;
  j["model"]["merges"] = nlohmann::json::array({nlohmann::json::array({"b", "a"})});
  CHECK(contains(load_error(j), "model.merges[0]: the merged token 'ba' is not in the vocab"));
  j = good;
  j["model"]["merges"] = nlohmann::json::array({"a  b"});
  CHECK(contains(load_error(j), "is not two tokens separated by one space"));
  j = good;
  j["model"]["merges"] = nlohmann::json::array({3});
  CHECK(contains(load_error(j), "model.merges[0] must be a string pair"));
  j = good;
  j["model"]["vocab"]["ab"] = 5;
  CHECK(contains(load_error(j), "token id 5 is given to both"));
  j = good;
  j["model"]["vocab"]["ab"] = -3;
  CHECK(contains(load_error(j), "model.vocab['ab']' = -3 is out of range"));
  j = good;
  j["model"]["byte_fallback"] = true;
  CHECK(contains(load_error(j), "byte_fallback BPE is not supported"));
  j = good;
  j["model"]["continuing_subword_prefix"] = "##";
  CHECK(contains(load_error(j), "model.continuing_subword_prefix is not supported"));
  j = good;
  j["normalizer"] = {{"type", "NFKC"}};
  CHECK(contains(load_error(j), "normalizer {\"type\":\"NFKC\"} is not supported"));
  j = good;
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+";
  CHECK(contains(load_error(j), "pre_tokenizer"));
  CHECK(contains(load_error(j), "is not supported"));
  j = good;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  CHECK(contains(load_error(j), "is not supported (zipage implements the Split + ByteLevel sequences"));
  j = good;
  j["decoder"] = {{"type", "Metaspace"}};
  CHECK(contains(load_error(j), "decoder must be ByteLevel"));
  j = good;
  j["added_tokens"] = {{{"id", 1000}, {"content", "<x>"}, {"single_word", true}}};
  CHECK(contains(load_error(j), "added_tokens[0]: single_word added tokens are not supported"));
  j = good;
  j["added_tokens"] = {{{"id", 256}, {"content", "<x>"}}};
  CHECK(contains(load_error(j), "token id 256 is given to both 'ab' and '<x>'"));
  j = good;
  j["added_tokens"] = {{{"id", 1000}, {"content", "ab"}}};
  CHECK(contains(load_error(j), "'ab' has id 1000 but the vocab gives it 256"));
  j = good;
  j["added_tokens"] = {{{"id", 1000}, {"content", ""}}};
  CHECK(contains(load_error(j), "added_tokens[0]: empty content"));
  j = good;
  j["added_tokens"] = {{{"content", "<x>"}}};
  CHECK(contains(load_error(j), "added_tokens[0]: missing field 'id'"));
  j = good;
  j["post_processor"] = {{"type", "TemplateProcessing"}, {"single", {{{"SpecialToken", {{"id", "<nope>"}}}}}}};
  CHECK(contains(load_error(j), "post_processor adds '<nope>', which is not a token"));
  CHECK(contains(error_of([] { (void)bpe_tokenizer::from_json("{\"model\": "); }), "tokenizer.json: invalid JSON"));
  CHECK(contains(load_error(good, R"({"eos_token": "<nope>"})"), "tokenizer_config.json: eos_token '<nope>' is not a token"));
  CHECK(contains(load_error(good, R"({"add_bos_token": true})"), "add_bos_token is true but there is no bos_token"));
  CHECK(contains(load_error(good, R"({"chat_template": 3})"), "chat_template must be a string or a list"));
  CHECK(contains(load_error(good, "[]"), "tokenizer_config.json: must be a JSON object"));
  CHECK(contains(error_of([] { (void)bpe_tokenizer::from_dir("/nonexistent"); }),
                 "cannot read tokenizer '/nonexistent/tokenizer.json': no such file"));
}

TEST_CASE("synthetic tokenizer: a field of the wrong JSON type is a named load error, not a crash") {
  // Each of these once escaped as nlohmann's type_error (found by fuzz_tokenizer_json).
  const auto good = synthetic({"ab"}, nlohmann::json::array({nlohmann::json::array({"a", "b"})}));
  const auto error_with = [&](const char* pointer, const nlohmann::json& bad) {
    auto j = good;
    j[nlohmann::json::json_pointer(pointer)] = bad;
    return load_error(j);
  };
  CHECK(contains(error_with("/normalizer", {{"type", 1}}), "normalizer {\"type\":1} is not supported"));
  CHECK(contains(error_with("/decoder", {{"type", {1, 2}}}), "decoder must be ByteLevel"));
  CHECK(contains(error_with("/pre_tokenizer/type", 7), "pre_tokenizer"));
  for (const char* field : {"/pre_tokenizer/pretokenizers/0/type", "/pre_tokenizer/pretokenizers/0/behavior",
                            "/pre_tokenizer/pretokenizers/0/invert", "/pre_tokenizer/pretokenizers/1/type",
                            "/pre_tokenizer/pretokenizers/1/add_prefix_space", "/pre_tokenizer/pretokenizers/1/use_regex"}) {
    CAPTURE(field);
    CHECK(contains(error_with(field, "x"), "is not supported (zipage implements the Split + ByteLevel sequences"));
    CHECK(contains(error_with(field, 3.5), "is not supported (zipage implements the Split + ByteLevel sequences"));
  }
  // The post-processor and the chat-template list are read only for what they support: another type is ignored.
  CHECK(error_with("/post_processor", {{"type", false}}) == "<no error>");
  CHECK(load_error(good, R"({"chat_template": [{"name": 5, "template": "x"}]})") == "<no error>");
}

TEST_CASE("json::interpret: a nlohmann error a reader lets out is a zipage::error naming the file") {
  // The net under the readers' named checks (tokenizer, config.json, generation_config.json, safetensors header).
  const nlohmann::json number = 1;
  const auto message = [](auto&& read) {
    try {
      zipage::json::interpret("x.json", read);
    } catch (const zipage::error& e) {
      return std::string(e.what());
    } catch (...) {
      return std::string("<another exception>");
    }
    return std::string("<no error>");
  };
  const std::string got = message([&] { return number.get<std::string>(); });
  CHECK(contains(got, "x.json: unexpected JSON content"));
  CHECK(contains(got, "type_error"));
  CHECK_THROWS_AS(zipage::json::interpret("x.json", [&] { return number.get<std::string>(); }),
                  zipage::json::unexpected_json);  // its own type: the fuzz harnesses count it as a finding
  CHECK(contains(message([&] { return number.at("key"); }), "x.json: unexpected JSON content"));
  // The readers' own errors and results pass through unchanged.
  CHECK(message([] { zipage::fail("config.json: field 'x' must be a string"); }) ==
        "config.json: field 'x' must be a string");
  CHECK(zipage::json::interpret("x.json", [&] { return number.get<int>() + 1; }) == 2);
}

TEST_CASE("NFC normalization") {
  using zipage::unicode::nfc;
  CHECK(nfc("plain ascii") == "plain ascii");
  CHECK(nfc("e\xCC\x81") == "\xC3\xA9");                               // e + acute → é
  CHECK(nfc("\xE2\x84\xAB") == "\xC3\x85");                            // Å (U+212B, a singleton) → Å
  CHECK(nfc("a\xCC\xA3\xCC\x87") == "\xE1\xBA\xA1\xCC\x87");           // a + dot below + dot above: ạ̇
  CHECK(nfc("a\xCC\x87\xCC\xA3") == "\xE1\xBA\xA1\xCC\x87");           // marks reordered by combining class
  CHECK(nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8") == "\xEA\xB0\x81");  // Hangul L V T → 각
  CHECK(nfc("\xEA\xB0\x80\xE1\x86\xA8") == "\xEA\xB0\x81");            // LV + T → LVT
  CHECK(nfc("\xF0\x9D\x85\x9E") == "\xF0\x9D\x85\x97\xF0\x9D\x85\xA5");  // U+1D15E: a composition exclusion
  CHECK(nfc("\xFF" "e\xCC\x81\xFE") == "\xFF\xC3\xA9\xFE");            // invalid bytes pass through
}
