// Tests for the SentencePiece BPE tokenizer and the UTF-8 streaming decoder.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "zipage/gguf/gguf.hpp"
#include "zipage/tokenizer/spm_tokenizer.hpp"
#include "zipage/tokenizer/utf8.hpp"

using zipage::spm_token_type;
using zipage::spm_tokenizer;
using zipage::spm_vocab;
using zipage::stream_decoder;
using zipage::token_id;
using ids = std::vector<token_id>;

namespace {

const spm_tokenizer& stories() {
  static const spm_tokenizer tok = spm_tokenizer::from_gguf(zipage::gguf::file::open(ZIPAGE_TEST_MODEL));
  return tok;
}

constexpr auto normal = static_cast<std::int32_t>(spm_token_type::normal);

// A small vocab: <unk>, <s>, </s>, then the given (piece, score) pairs as normal tokens.
spm_vocab tiny_vocab(std::vector<std::pair<std::string, float>> pieces, bool space_prefix = false) {
  spm_vocab v;
  v.pieces = {"<unk>", "<s>", "</s>"};
  v.scores = {0, 0, 0};
  v.types = {2, 3, 3};
  for (auto& [p, s] : pieces) {
    v.pieces.push_back(p);
    v.scores.push_back(s);
    v.types.push_back(normal);
  }
  v.bos = 1;
  v.eos = 2;
  v.unk = 0;
  v.add_space_prefix = space_prefix;
  return v;
}

std::vector<std::string> pieces_of(const spm_tokenizer& tok, const ids& v) {
  std::vector<std::string> out;
  for (token_id id : v) out.emplace_back(tok.piece(id));
  return out;
}

// The textbook O(n^2) BPE: rescan every adjacent pair each round, merge the best-scoring one
// (strict '>' keeps the leftmost on ties). The tokenizer's heap-based merge must agree with it.
ids naive_encode(const spm_tokenizer& tok, std::string_view text) {
  std::string norm = text.empty() ? "" : "\xE2\x96\x81";
  for (char c : text) norm += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
  std::vector<std::string> syms;
  for (std::size_t pos = 0; pos < norm.size();) {
    const auto r = zipage::utf8::scan(std::string_view(norm).substr(pos));
    const std::size_t len = r.state == zipage::utf8::status::valid ? r.length : 1;
    syms.push_back(norm.substr(pos, len));
    pos += len;
  }
  for (;;) {
    int best = -1;
    float best_score = 0;
    for (std::size_t i = 0; i + 1 < syms.size(); ++i) {
      auto id = tok.find(syms[i] + syms[i + 1]);
      if (!id || tok.type(*id) != spm_token_type::normal) continue;
      if (best < 0 || tok.score(*id) > best_score) {
        best = static_cast<int>(i);
        best_score = tok.score(*id);
      }
    }
    if (best < 0) break;
    syms[static_cast<std::size_t>(best)] += syms[static_cast<std::size_t>(best) + 1];
    syms.erase(syms.begin() + best + 1);
  }
  ids out;
  for (const auto& s : syms) {
    auto id = tok.find(s);
    if (id && tok.type(*id) == spm_token_type::normal) {
      out.push_back(*id);
    } else {
      for (unsigned char c : s) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", c);
        out.push_back(*tok.find(name));
      }
    }
  }
  return out;
}

// Writes a minimal GGUF v3 file (no tensors) holding the given string and string-array keys,
// so from_gguf's error paths can be exercised through the real reader.
struct gguf_writer {
  std::string bytes;
  std::uint64_t n_kv = 0;
  template <class T>
  void raw(T v) { bytes.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void str(std::string_view s) {
    raw<std::uint64_t>(s.size());
    bytes.append(s);
  }
  void kv_string(std::string_view key, std::string_view value) {
    str(key);
    raw<std::uint32_t>(8);
    str(value);
    ++n_kv;
  }
  void kv_string_array(std::string_view key, const std::vector<std::string>& values) {
    str(key);
    raw<std::uint32_t>(9);
    raw<std::uint32_t>(8);
    raw<std::uint64_t>(values.size());
    for (const auto& s : values) str(s);
    ++n_kv;
  }
  void kv_float_array(std::string_view key, const std::vector<float>& values) {
    str(key);
    raw<std::uint32_t>(9);
    raw<std::uint32_t>(6);
    raw<std::uint64_t>(values.size());
    for (float f : values) raw(f);
    ++n_kv;
  }
  void kv_int_array(std::string_view key, const std::vector<std::int32_t>& values) {
    str(key);
    raw<std::uint32_t>(9);
    raw<std::uint32_t>(5);
    raw<std::uint64_t>(values.size());
    for (std::int32_t v : values) raw(v);
    ++n_kv;
  }
  std::filesystem::path save(const std::string& name) const {
    std::string file = "GGUF";
    auto put = [&](auto v) { file.append(reinterpret_cast<const char*>(&v), sizeof v); };
    put(std::uint32_t{3});
    put(std::uint64_t{0});  // tensors
    put(n_kv);
    file += bytes;
    file.resize((file.size() + 31) / 32 * 32, '\0');  // data section starts aligned
    auto path = std::filesystem::temp_directory_path() / name;
    std::ofstream(path, std::ios::binary).write(file.data(), static_cast<std::streamsize>(file.size()));
    return path;
  }
};

}  // namespace

TEST_CASE("stories260K vocab loads from GGUF") {
  const auto& tok = stories();
  CHECK(tok.vocab_size() == 512);
  CHECK(tok.bos() == 1);
  CHECK(tok.eos() == 2);
  CHECK(tok.unk() == 0);
  CHECK(tok.add_space_prefix());
  CHECK(tok.has_byte_fallback());
  CHECK(tok.is_control(1));
  CHECK(tok.is_control(2));
  CHECK_FALSE(tok.is_control(403));
  CHECK(tok.piece(403) == "\xE2\x96\x81Once");
  CHECK(tok.piece(13) == "<0x0A>");
  CHECK(tok.is_byte(13));
  CHECK(tok.find("\xE2\x96\x81time") == 378);
  CHECK_FALSE(tok.find("<s>").has_value());  // control pieces are not text
  CHECK_THROWS_AS((void)tok.piece(512), zipage::error);
}

TEST_CASE("known encoding of 'Once upon a time'") {
  const auto& tok = stories();
  CHECK(tok.encode("Once upon a time", true) == ids{1, 403, 407, 261, 378});
  CHECK(tok.encode("Once upon a time", false) == ids{403, 407, 261, 378});
  CHECK(tok.encode("", true) == ids{1});
  CHECK(tok.encode("", false).empty());
}

TEST_CASE("known decoding of a generated story") {
  const auto& tok = stories();
  const ids story = {403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337,
                     410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352};
  // The story goes on "... she saw a big, red ball."; these 40 ids stop inside "red" ("▁r").
  const std::string expected =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
      "One day, she saw a big, r";
  const std::string text = tok.decode(story);
  CHECK(text == expected);

  // BOS/EOS are skipped and do not disturb the dummy-prefix stripping.
  ids with_specials = {1};
  with_specials.insert(with_specials.end(), story.begin(), story.end());
  with_specials.push_back(2);
  CHECK(tok.decode(with_specials) == text);
  CHECK(tok.decode(ids{}) == "");
  CHECK_THROWS_AS((void)tok.decode(ids{403, 9999}), zipage::error);
}

TEST_CASE("encode then decode round-trips") {
  const auto& tok = stories();
  const std::vector<std::string> texts = {
      "",
      "a",
      "Hello, world!",
      "The quick brown fox jumps over the lazy dog.",
      "Lily said: \"Let's go to the park!\" (and Tim agreed?) 1 + 2 = 3; 50% off #tag @user ~{}[]|\\^",
      "line one\nline two\n\nline four\r\n\ttabbed",
      " leading space",
      "  two leading spaces",
      "trailing spaces   ",
      "multiple    inner     spaces",
      " ",
      "   ",
      "\n",
      "emoji 😀 and 🎉🎉 here",
      "中文分词测试 日本語 한국어",
      "mixed: café naïve — “quotes” ‘single’ … ™ €",
      "😀",
  };
  for (std::size_t i = 0; i < texts.size(); ++i) {
    CAPTURE(texts[i]);
    const ids enc = tok.encode(texts[i], true);
    CHECK(enc.front() == tok.bos());
    CHECK(tok.decode(enc) == texts[i]);
    CHECK(tok.decode(tok.encode(texts[i], false)) == texts[i]);
  }
  // Long inputs stay correct (and fast: merging uses a heap, not rescans).
  const std::string long_text = [] {
    std::string t;
    while (t.size() < 50000) t += "Lily and Tim played in the park, 😀 all day.\n";
    return t;
  }();
  CHECK(tok.decode(tok.encode(long_text, true)) == long_text);
  CHECK(tok.decode(tok.encode(std::string(20000, 'a'), false)) == std::string(20000, 'a'));

  // "▁" typed in the input comes back as a space, as with SentencePiece: it is the space marker.
  CHECK(tok.decode(tok.encode("a\xE2\x96\x81" "b", false)) == "a b");
}

TEST_CASE("characters outside the vocab fall back to exact byte tokens") {
  const auto& tok = stories();
  // "\n" is not a piece: <0x0A> is the byte token for it.
  const ids nl = tok.encode("a\nb", false);
  CHECK(pieces_of(tok, nl) == std::vector<std::string>{"\xE2\x96\x81" "a", "<0x0A>", "b"});

  // U+1F600 is F0 9F 98 80: four byte tokens in order, after the lone "▁" piece.
  const ids emoji = tok.encode("😀", false);
  REQUIRE(emoji.size() == 5);
  CHECK(tok.piece(emoji[0]) == "\xE2\x96\x81");
  CHECK(pieces_of(tok, ids(emoji.begin() + 1, emoji.end())) ==
        std::vector<std::string>{"<0xF0>", "<0x9F>", "<0x98>", "<0x80>"});
  for (token_id id : ids(emoji.begin() + 1, emoji.end())) CHECK(tok.is_byte(id));

  // Decoding byte tokens alone yields exactly those raw bytes, even when they are not UTF-8.
  CHECK(tok.decode(ids{*tok.find("<0xE4>"), *tok.find("<0xB8>"), *tok.find("<0xAD>")}) == "中");
  CHECK(tok.decode(ids{*tok.find("<0xFF>"), *tok.find("<0x00>")}) == std::string("\xFF\0", 2));
}

TEST_CASE("invalid UTF-8 input is encoded byte by byte and round-trips") {
  const auto& tok = stories();
  const std::vector<std::string> bad = {
      "\xFF",
      "\x80\x80",
      "abc\xC0\xAF" "def",           // overlong '/'
      "\xED\xA0\x80",                // UTF-16 surrogate
      "\xE2\x82",                    // cut short at the end
      "\xE2\x82 x",                  // cut short in the middle
      "\xF4\x90\x80\x80",            // above U+10FFFF
      std::string("nul\0inside", 10),
  };
  for (const auto& s : bad) {
    CAPTURE(s);
    ids enc;
    REQUIRE_NOTHROW(enc = tok.encode(s, false));
    CHECK(tok.decode(enc) == s);
  }
  // Each ill-formed byte is its own byte token.
  const ids ff = tok.encode("\xFF", false);
  CHECK(pieces_of(tok, ff) == std::vector<std::string>{"\xE2\x96\x81", "<0xFF>"});
}

TEST_CASE("heap-based merging agrees with naive BPE on random text") {
  const auto& tok = stories();
  const std::vector<std::string> alphabet = {"a", "e", "t", "h", "o", "n", "s", "i", "r", "l", "d", " ", " ", " ",
                                             "T", "L", ".", ",", "\n", "é", "中", "😀", "—", "\xFF", "\x80", "ing",
                                             "the", "Lily", "was"};
  std::mt19937 rng(12345);
  std::uniform_int_distribution<std::size_t> pick(0, alphabet.size() - 1), len(0, 40);
  for (int round = 0; round < 300; ++round) {
    std::string s;
    for (std::size_t n = len(rng); n > 0; --n) s += alphabet[pick(rng)];
    CAPTURE(s);
    const ids fast = tok.encode(s, false);
    CHECK(fast == naive_encode(tok, s));
    CHECK(tok.decode(fast) == s);
  }
}

TEST_CASE("tiny vocab: highest score merges first, leftmost on ties") {
  SUBCASE("higher score wins over position") {
    // "abc": bc (5) beats ab (1), so the result is a|bc, not ab|c.
    spm_tokenizer tok(tiny_vocab({{"a", 0}, {"b", 0}, {"c", 0}, {"ab", 1}, {"bc", 5}}));
    CHECK(pieces_of(tok, tok.encode("abc", false)) == std::vector<std::string>{"a", "bc"});
  }
  SUBCASE("swapping the scores flips the result") {
    spm_tokenizer tok(tiny_vocab({{"a", 0}, {"b", 0}, {"c", 0}, {"ab", 5}, {"bc", 1}}));
    CHECK(pieces_of(tok, tok.encode("abc", false)) == std::vector<std::string>{"ab", "c"});
  }
  SUBCASE("equal scores: the leftmost pair merges first") {
    spm_tokenizer tok(tiny_vocab({{"a", 0}, {"aa", 1}}));
    CHECK(pieces_of(tok, tok.encode("aaa", false)) == std::vector<std::string>{"aa", "a"});
    CHECK(pieces_of(tok, tok.encode("aaaaa", false)) == std::vector<std::string>{"aa", "aa", "a"});
  }
  SUBCASE("merge order is by score, not longest match") {
    // bc (4) merges first; then neither "abc" nor "bcd" is a piece, so "abcd" is never reached.
    spm_tokenizer tok(
        tiny_vocab({{"a", 0}, {"b", 0}, {"c", 0}, {"d", 0}, {"ab", 3}, {"cd", 2}, {"bc", 4}, {"abcd", 1}}));
    CHECK(pieces_of(tok, tok.encode("abcd", false)) == std::vector<std::string>{"a", "bc", "d"});
  }
  SUBCASE("chains of merges: new pairs are scored as they form") {
    // ab(3) then ab+c -> abc(2) then abc+d -> abcd(1); cd(0.5) loses to abc.
    spm_tokenizer tok(
        tiny_vocab({{"a", 0}, {"b", 0}, {"c", 0}, {"d", 0}, {"ab", 3}, {"abc", 2}, {"abcd", 1}, {"cd", 0.5f}}));
    CHECK(pieces_of(tok, tok.encode("abcd", false)) == std::vector<std::string>{"abcd"});
  }
  SUBCASE("dummy prefix and spaces become ▁") {
    spm_tokenizer tok(tiny_vocab({{"\xE2\x96\x81", 0}, {"a", 0}, {"\xE2\x96\x81" "a", 1}}, true));
    CHECK(pieces_of(tok, tok.encode("a a", false)) ==
          std::vector<std::string>{"\xE2\x96\x81" "a", "\xE2\x96\x81" "a"});
    CHECK(tok.decode(tok.encode("a a", true)) == "a a");
  }
  SUBCASE("no byte tokens: unknown characters become unk") {
    spm_tokenizer tok(tiny_vocab({{"a", 0}}));
    CHECK(tok.encode("aza", true) == ids{1, 3, 0, 3});
    CHECK(tok.decode(tok.encode("aza", false)) == "a \xE2\x81\x87 a");
  }
}

TEST_CASE("tiny vocab: unused and user-defined pieces") {
  SUBCASE("unused pieces are merged through but split back when final") {
    spm_vocab v = tiny_vocab({{"a", 0}, {"b", 0}, {"c", 0}, {"ab", 2}, {"abc", 1}});
    v.types[6] = static_cast<std::int32_t>(spm_token_type::unused);  // "ab"
    spm_tokenizer tok(std::move(v));
    CHECK(pieces_of(tok, tok.encode("abc", false)) == std::vector<std::string>{"abc"});
    CHECK(pieces_of(tok, tok.encode("ab", false)) == std::vector<std::string>{"a", "b"});
  }
  SUBCASE("user-defined pieces are cut out whole and never merged") {
    spm_vocab v = tiny_vocab({{"a", 0}, {"<", 0}, {">", 0}, {"x", 0}, {"a<", 5}, {"<x>", 0}, {"<x", 0}});
    v.types[8] = static_cast<std::int32_t>(spm_token_type::user_defined);  // "<x>"
    spm_tokenizer tok(std::move(v));
    CHECK(pieces_of(tok, tok.encode("a<x>a", false)) == std::vector<std::string>{"a", "<x>", "a"});
    CHECK(pieces_of(tok, tok.encode("a<xa", false)) == std::vector<std::string>{"a<", "x", "a"});
    CHECK(tok.decode(tok.encode("a<x>a", false)) == "a<x>a");
  }
}

TEST_CASE("stream_decoder holds split characters and matches decode") {
  const auto& tok = stories();
  const std::string text = "Hi 😀 there, 中文 and café!\nBye";
  ids enc = tok.encode(text, true);
  enc.push_back(tok.eos());

  stream_decoder stream(tok);
  std::string streamed;
  for (token_id id : enc) {
    const std::string part = stream.push(id);
    CHECK(zipage::utf8::is_valid(part));  // never a partial character
    streamed += part;
  }
  streamed += stream.flush();
  CHECK(streamed == tok.decode(enc));
  CHECK(streamed == text);

  SUBCASE("bytes of one character: nothing until the last byte") {
    stream_decoder s(tok);
    CHECK(s.push(*tok.find("\xE2\x96\x81" "a")) == "a");  // dummy-prefix space dropped
    CHECK(s.push(*tok.find("<0xF0>")) == "");
    CHECK(s.push(*tok.find("<0x9F>")) == "");
    CHECK(s.push(*tok.find("<0x98>")) == "");
    CHECK(s.has_pending());
    CHECK(s.push(*tok.find("<0x80>")) == "😀");
    CHECK_FALSE(s.has_pending());
    CHECK(s.push(*tok.find("\xE2\x96\x81" "a")) == " a");
    CHECK(s.flush() == "");
  }
  SUBCASE("an unfinished character is flushed as U+FFFD") {
    stream_decoder s(tok);
    CHECK(s.push(*tok.find("<0xE4>")) == "");
    CHECK(s.push(*tok.find("<0xB8>")) == "");
    CHECK(s.flush() == "\xEF\xBF\xBD");
    CHECK(s.flush() == "");
  }
  SUBCASE("bytes that can never form a character are replaced at once") {
    stream_decoder s(tok);
    CHECK(s.push(*tok.find("<0xFF>")) == "\xEF\xBF\xBD");
    CHECK(s.push(*tok.find("<0xE4>")) == "");
    // 'b' cannot continue E4: the held byte becomes U+FFFD and 'b' comes through.
    CHECK(s.push(*tok.find("b")) == "\xEF\xBF\xBD" "b");
  }
  SUBCASE("reset starts a new text") {
    stream_decoder s(tok);
    CHECK(s.push(*tok.find("\xE2\x96\x81" "a")) == "a");
    CHECK(s.push(*tok.find("\xE2\x96\x81" "a")) == " a");
    s.reset();
    CHECK(s.push(*tok.find("\xE2\x96\x81" "a")) == "a");
  }
}

TEST_CASE("utf8 helpers follow the Unicode well-formedness table") {
  using zipage::utf8::scan;
  using zipage::utf8::status;
  CHECK(scan("a").state == status::valid);
  CHECK(scan("\xC3\xA9").length == 2);
  CHECK(scan("\xF0\x9F\x98\x80").length == 4);
  CHECK(scan("\xC0\xAF").state == status::invalid);
  CHECK(scan("\xE0\x80\x80").state == status::invalid);  // overlong
  CHECK(scan("\xED\xA0\x80").state == status::invalid);  // surrogate
  CHECK(scan("\xF0\x9F\x98").state == status::incomplete);
  CHECK(scan("\xF0\x9F\x98").length == 3);
  CHECK(scan("\xF0\x9F" "a").length == 2);  // maximal subpart
  CHECK(zipage::utf8::sanitize("a\xF0\x9F" "b\xFF") == "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
}

TEST_CASE("vocab validation rejects inconsistent vocabs") {
  auto base = [] { return tiny_vocab({{"a", 0}, {"b", 0}}); };
  CHECK_NOTHROW(spm_tokenizer{base()});

  auto expect_error = [](spm_vocab v, std::string_view fragment) {
    try {
      spm_tokenizer tok(std::move(v));
      FAIL("expected zipage::error mentioning: " << fragment);
    } catch (const zipage::error& e) {
      CHECK(std::string_view(e.what()).find(fragment) != std::string_view::npos);
    }
  };
  spm_vocab v = base();
  v.scores.pop_back();
  expect_error(v, "scores");
  v = base();
  v.types.push_back(normal);
  expect_error(v, "token types");
  v = base();
  v.bos = 5;
  expect_error(v, "BOS id 5");
  v = base();
  v.eos = -7;
  expect_error(v, "EOS id -7");
  v = base();
  v.unk = 100;
  expect_error(v, "unknown-token id 100");
  v = base();
  v.bos = -1;  // add_bos defaults to true
  expect_error(v, "no BOS id");
  v = base();
  v.types[3] = 9;
  expect_error(v, "unknown type 9");
  v = base();
  v.unk = -1;  // no bytes and no unk: unseen characters could not be encoded
  expect_error(v, "neither byte tokens");
  v = base();
  v.pieces.push_back("<0x41>");
  v.scores.push_back(0);
  v.types.push_back(static_cast<std::int32_t>(spm_token_type::byte));
  expect_error(v, "1 of the 256 byte tokens");
  v = base();
  v.pieces.back() = "<0xZZ>";
  v.types.back() = static_cast<std::int32_t>(spm_token_type::byte);
  expect_error(v, "not of the form <0xXX>");
  v = spm_vocab{};
  expect_error(v, "empty");
  v = base();  // all 256 byte tokens, but one of them twice
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    v.pieces.emplace_back(name);
    v.scores.push_back(0);
    v.types.push_back(static_cast<std::int32_t>(spm_token_type::byte));
  }
  v.pieces.back() = "<0x00>";
  expect_error(v, "appears twice");

  // A vocab with no BOS can still encode without one, but asking for BOS is an error.
  v = base();
  v.bos = -1;
  v.add_bos = false;
  spm_tokenizer no_bos(v);
  CHECK(no_bos.encode("ab", false).size() == 2);
  CHECK_THROWS_AS((void)no_bos.encode("ab", true), zipage::error);
}

TEST_CASE("from_gguf rejects non-SentencePiece and incomplete tokenizers") {
  auto expect_error = [](const gguf_writer& w, const std::string& name, std::string_view fragment) {
    const auto path = w.save(name);
    try {
      (void)spm_tokenizer::from_gguf(zipage::gguf::file::open(path));
      FAIL("expected zipage::error mentioning: " << fragment);
    } catch (const zipage::error& e) {
      CHECK(std::string_view(e.what()).find(fragment) != std::string_view::npos);
    }
    std::filesystem::remove(path);
  };
  const std::vector<std::string> pieces = {"<unk>", "<s>", "</s>", "a"};
  {
    gguf_writer w;
    w.kv_string("tokenizer.ggml.model", "gpt2");
    w.kv_string_array("tokenizer.ggml.tokens", pieces);
    expect_error(w, "zipage_tok_gpt2.gguf", "gpt2");
  }
  {
    gguf_writer w;
    w.kv_string("general.architecture", "llama");
    expect_error(w, "zipage_tok_none.gguf", "tokenizer.ggml.model");
  }
  {
    gguf_writer w;
    w.kv_string("tokenizer.ggml.model", "llama");
    w.kv_string_array("tokenizer.ggml.tokens", pieces);
    expect_error(w, "zipage_tok_noscores.gguf", "tokenizer.ggml.scores");
  }
  {
    gguf_writer w;
    w.kv_string("tokenizer.ggml.model", "llama");
    w.kv_string_array("tokenizer.ggml.tokens", pieces);
    w.kv_float_array("tokenizer.ggml.scores", {0, 0, 0});
    w.kv_int_array("tokenizer.ggml.token_type", {2, 3, 3, 1});
    expect_error(w, "zipage_tok_mismatch.gguf", "3 scores");
  }
  {
    // A well-formed tiny tokenizer loads, with llama.cpp's default special ids.
    gguf_writer w;
    w.kv_string("tokenizer.ggml.model", "llama");
    w.kv_string_array("tokenizer.ggml.tokens", pieces);
    w.kv_float_array("tokenizer.ggml.scores", {0, 0, 0, 0});
    w.kv_int_array("tokenizer.ggml.token_type", {2, 3, 3, 1});
    const auto path = w.save("zipage_tok_ok.gguf");
    const auto tok = spm_tokenizer::from_gguf(zipage::gguf::file::open(path));
    std::filesystem::remove(path);
    CHECK(tok.vocab_size() == 4);
    CHECK(tok.bos() == 1);
    CHECK(tok.eos() == 2);
    CHECK(tok.encode("a", false) == ids{0, 3});  // "▁" is unknown, "a" is a piece
  }
}
