#pragma once
// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (GPT-2 style, as Qwen2/Qwen3 and
// Llama 3 use it). Its Unicode pieces are in unicode.hpp, the chat templates in chat_template.hpp.
//
// Encoding:
//   1. added tokens (<|im_start|>, <think>, ...) are cut out of the raw text first: at each position the
//      longest one that matches exactly (lstrip/rstrip tokens also take the whitespace beside them, Unicode's
//      as the tokenizers library strips it, NBSP and U+3000 included);
//   2. the text between them is normalized (NFC when tokenizer.json asks for it) and split by the
//      pre-tokenizer regex — Qwen2/3's
//        (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//      or Llama 3's (the same with \p{N}{1,3}) — matched by hand over code points (unicode_tables.hpp);
//   3. each piece's bytes become byte-level symbols (GPT-2's byte↔unicode map), which are merged by
//      rank, lowest first and leftmost on ties (a priority queue: O(n log n) per piece).
// Decoding maps each token's characters back to bytes (a token with a character outside the map keeps
// its UTF-8 bytes, as the tokenizers library does) and replaces invalid UTF-8 with U+FFFD;
// bpe_stream_decoder holds back a character cut between tokens until it is complete.
// Text that is not valid UTF-8 is encoded anyway: each bad byte is a symbol of its own.
//
// All const member functions are safe to call concurrently.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/json.hpp"
#include "zipage/core/types.hpp"
#include "zipage/gguf/gguf.hpp"
#include "zipage/tokenizer/chat_template.hpp"
#include "zipage/tokenizer/unicode.hpp"
#include "zipage/tokenizer/utf8.hpp"

namespace zipage {

// ---------------------------------------------------------------------------------------------
// bpe_tokenizer
// ---------------------------------------------------------------------------------------------

// An added token of tokenizer.json's "added_tokens".
struct bpe_added_token {
  std::string content;
  token_id id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
};

namespace detail {

// GPT-2's byte → unicode map: printable Latin-1 bytes stand for themselves, the other 68 bytes (controls,
// space, DEL, NBSP, soft hyphen) for U+0100 + i in byte order.
inline const std::array<char32_t, 256>& byte_to_unicode() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[static_cast<std::size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

// The inverse: code point (< 0x144) → byte, or -1.
inline const std::array<std::int16_t, 0x144>& unicode_to_byte() {
  static const std::array<std::int16_t, 0x144> table = [] {
    std::array<std::int16_t, 0x144> t{};
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_to_unicode()[static_cast<std::size_t>(b)]] = static_cast<std::int16_t>(b);
    return t;
  }();
  return table;
}

struct bpe_string_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

}  // namespace detail

class bpe_tokenizer {
 public:
  // The pre-tokenizer regexes zipage implements (matched by hand, see pre_tokenize()).
  static constexpr std::string_view qwen2_pattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  static constexpr std::string_view llama3_pattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

  // A checkpoint directory: tokenizer.json, tokenizer_config.json when present, chat_template.jinja
  // when present (where transformers 4.43+ saves the template; it takes precedence over the config's), and
  // named templates from additional_chat_templates/<name>.jinja (load_named_template_files).
  static bpe_tokenizer from_dir(const std::filesystem::path& dir) {
    std::error_code ec;
    const auto cfg = dir / "tokenizer_config.json";
    bpe_tokenizer t = from_files(dir / "tokenizer.json", std::filesystem::is_regular_file(cfg, ec) ? cfg : std::filesystem::path{});
    if (const auto jinja = dir / "chat_template.jinja"; std::filesystem::is_regular_file(jinja, ec)) {
      const std::string source = json::read_text_file(jinja, "chat template");
      std::shared_ptr<const jinja::template_> parsed;
      std::string why;
      parse_template(source, jinja.string(), parsed, why);
      if (why.empty()) {
        t.replace_template(source, std::move(parsed));
      } else {  // as a config's template: the tokenizer loads, chat requests report it
        t.jinja_.reset();
        t.jinja_error_ = std::move(why);
      }
    }
    t.load_named_template_files(dir / "additional_chat_templates");
    return t;
  }
  static bpe_tokenizer from_files(const std::filesystem::path& tokenizer_json, const std::filesystem::path& config_json = {}) {
    const std::string text = json::read_text_file(tokenizer_json, "tokenizer");
    const std::string cfg = config_json.empty() ? std::string() : json::read_text_file(config_json, "tokenizer config");
    return from_json(text, cfg, tokenizer_json.string(), config_json.string());
  }
  // tokenizer_config may be empty (no chat template, eos/bos from tokenizer.json only).
  static bpe_tokenizer from_json(std::string_view tokenizer_json, std::string_view tokenizer_config = {},
                                 std::string source = "tokenizer.json", std::string config_source = "tokenizer_config.json") {
    bpe_tokenizer t;
    json::read_document(tokenizer_json, source, [&](const json::value& doc) { t.load(doc, source); });
    if (!tokenizer_config.empty())
      json::read_document(tokenizer_config, config_source,
                          [&](const json::value& cfg) { t.load_config(cfg, config_source); });
    return t;
  }

  // A GGUF file's byte-level BPE vocabulary (tokenizer.ggml.model = gpt2), as llama.cpp's converter writes a
  // Hugging Face tokenizer and llama.cpp reads it: tokens with their types (1 normal; 3 control = a special
  // added token, matched in text only when parsing specials; 4 user-defined = an added token matched always;
  // 5 unused = the converter's [PAD<id>] fillers, left undefined as a Hugging Face tokenizer leaves them), the
  // merges, the pre-tokenizer by name (tokenizer.ggml.pre: qwen2 / deepseek-r1-qwen, or llama3 / llama-bpe),
  // bos / eos ids, add_bos_token and the chat template. llama.cpp applies no Unicode normalizer to these
  // vocabularies, and neither does this tokenizer (a tokenizer.json's NFC is not in the file).
  static bpe_tokenizer from_gguf(const gguf::file& f) {
    const std::string src = f.name();
    const std::string model = f.get_string("tokenizer.ggml.model");
    check(model == "gpt2", src, ": tokenizer.ggml.model '", json::printable(model),
          "' is not a byte-level BPE vocabulary (gpt2)");
    const std::string pre = f.has("tokenizer.ggml.pre") ? f.get_string("tokenizer.ggml.pre") : "";
    const bool qwen2 = pre == "qwen2" || pre == "deepseek-r1-qwen";
    const bool llama3 = pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe";
    check(qwen2 || llama3, src, ": tokenizer.ggml.pre '", json::printable(pre),
          "' is not supported (zipage implements qwen2, deepseek-r1-qwen, llama3 and llama-bpe)");
    const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
    // Without token types every token is a normal one, as llama.cpp reads such a file.
    const auto types = f.has("tokenizer.ggml.token_type") ? f.get_int_array("tokenizer.ggml.token_type")
                                                          : std::vector<std::int64_t>(tokens.size(), 1);
    check(types.size() == tokens.size(), src, ": tokenizer.ggml.token_type has ", types.size(), " entries for ",
          tokens.size(), " tokens");
    // The same document a tokenizer.json of that model would be, read by the same code.
    json::value doc = json::value::object();
    doc["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"behavior", "Isolated"}, {"invert", false},
           {"pattern", {{"Regex", std::string(qwen2 ? qwen2_pattern : llama3_pattern)}}}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
    doc["decoder"] = {{"type", "ByteLevel"}};
    json::value vocab = json::value::object(), added = json::value::array();
    for (std::size_t id = 0; id < tokens.size(); ++id) {
      const std::int64_t type = types[id];
      check(type >= 1 && type <= 6, src, ": tokenizer.ggml.token_type[", id, "] = ", type, " is not a token type");
      if (type == 5) continue;  // unused
      if (type == 3 || type == 4)
        added.push_back({{"id", id}, {"content", tokens[id]}, {"special", type == 3}});
      else if (!vocab.emplace(tokens[id], id).second)
        fail(src, ": tokenizer.ggml.tokens[", id, "] '", json::printable(tokens[id]), "' is listed twice");
    }
    json::value merges = json::value::array();
    if (f.has("tokenizer.ggml.merges"))
      for (auto& m : f.get_string_array("tokenizer.ggml.merges")) merges.push_back(std::move(m));
    // Llama 3's tokenizer looks a whole pre-token up in the vocabulary before merging (llama.cpp does the same).
    doc["model"] = {{"type", "BPE"}, {"vocab", std::move(vocab)}, {"merges", std::move(merges)}, {"ignore_merges", llama3}};
    doc["added_tokens"] = std::move(added);
    bpe_tokenizer t;
    t.load(doc, src + " (tokenizer.ggml)");
    auto id_of = [&](const char* key) {
      const std::string full = std::string("tokenizer.ggml.") + key;
      const std::int64_t id = f.get_int(full, -1);
      check(id >= -1 && id < static_cast<std::int64_t>(tokens.size()), src, ": ", full, " = ", id,
            " is not a token id (the vocabulary has ", tokens.size(), ")");
      check(id < 0 || (static_cast<std::size_t>(id) < t.tokens_.size() && !t.tokens_[static_cast<std::size_t>(id)].text.empty()),
            src, ": ", full, " = ", id, " is an unused token");
      return static_cast<token_id>(id);
    };
    t.bos_ = id_of("bos_token_id");
    t.eos_ = id_of("eos_token_id");
    // llama.cpp's default for add_bos_token: on for Llama 3's pre-tokenizer, off otherwise.
    t.add_bos_ = f.has("tokenizer.ggml.add_bos_token") ? f.get_bool("tokenizer.ggml.add_bos_token") : llama3;
    check(!t.add_bos_ || t.bos_ >= 0, src, ": tokenizer.ggml.add_bos_token is true but there is no bos_token_id");
    if (f.has("tokenizer.chat_template")) {
      json::value cfg = json::value::object();
      cfg["chat_template"] = f.get_string("tokenizer.chat_template");
      t.load_config(cfg, src + " (tokenizer.chat_template)");
    }
    t.load_named_gguf_templates(f, src);
    // The template's bos_token / eos_token: the texts of the file's ids (as llama.cpp passes them).
    const std::vector<token_id> bos_eos = {t.bos_, t.eos_};
    for (std::size_t k = 0; k < 2; ++k)
      if (bos_eos[k] >= 0) t.chat_special_tokens_[k == 0 ? "bos_token" : "eos_token"] = t.decode(std::span(&bos_eos[k], 1));
    return t;
  }

  // Token ids of `text`; added tokens are recognised in it (special ones only when `parse_special`).
  [[nodiscard]] std::vector<token_id> encode(std::string_view text, bool add_bos = false, bool parse_special = true) const {
    std::vector<token_id> out;
    if (add_bos) {
      check(bos_ >= 0, "encode: BOS requested but the tokenizer has no BOS token");
      out.push_back(bos_);
    }
    std::size_t pos = 0;  // start of the text not yet encoded
    for (std::size_t i = 0; i < text.size();) {
      const bpe_added_token* a = match_added(text, i, parse_special);
      if (a == nullptr) {
        ++i;
        continue;
      }
      std::size_t seg_end = i, next = i + a->content.size();
      if (a->lstrip)
        while (const std::size_t n = space_before(text, seg_end, pos)) seg_end -= n;
      if (a->rstrip)
        while (const std::size_t n = space_at(text, next)) next += n;
      encode_text(text.substr(pos, seg_end - pos), out);
      out.push_back(a->id);
      pos = i = next;
    }
    encode_text(text.substr(pos), out);
    return out;
  }

  // Text of the ids: invalid UTF-8 becomes U+FFFD; ids the tokenizer does not know produce nothing (as in
  // the tokenizers library; a model's vocabulary is often padded past the tokenizer's).
  [[nodiscard]] std::string decode(std::span<const token_id> ids, bool skip_special = false) const {
    std::string bytes;
    for (token_id id : ids) append_token_bytes(bytes, id, skip_special);
    return utf8::sanitize(bytes);
  }

  // Appends the bytes of one token (possibly part of a UTF-8 character).
  void append_token_bytes(std::string& out, token_id id, bool skip_special = false) const {
    if (id < 0 || static_cast<std::size_t>(id) >= tokens_.size()) return;
    const token_entry& e = tokens_[static_cast<std::size_t>(id)];
    if (e.special && skip_special) return;
    if (e.raw) {
      out += e.text;
      return;
    }
    for (const unicode::unit& u : unicode::decode_units(e.text))
      out.push_back(static_cast<char>(detail::unicode_to_byte()[u.cp]));
  }

  // The pieces the pre-tokenizer splits (already normalized) text into.
  [[nodiscard]] std::vector<std::string_view> pre_tokenize(std::string_view text) const {
    std::vector<std::string_view> pieces;
    const auto units = unicode::decode_units(text);
    for (std::size_t i = 0; i < units.size();) {
      const std::size_t j = match_piece(units, i);
      const std::size_t end = j < units.size() ? units[j].begin : text.size();
      pieces.push_back(text.substr(units[i].begin, end - units[i].begin));
      i = j;
    }
    return pieces;
  }
  [[nodiscard]] std::string normalize(std::string_view text) const { return nfc_ ? unicode::nfc(text) : std::string(text); }

  // The id of a token given as tokenizer.json spells it (byte-level form, e.g. "Ġworld") or of an added token.
  [[nodiscard]] std::optional<token_id> find(std::string_view token) const {
    if (const auto it = added_index_.find(token); it != added_index_.end()) return it->second;
    if (const auto it = vocab_.find(token); it != vocab_.end()) return it->second;
    return std::nullopt;
  }
  // The token as tokenizer.json spells it ("" for ids it does not define).
  [[nodiscard]] std::string_view token_text(token_id id) const {
    check(id >= 0 && static_cast<std::size_t>(id) < tokens_.size(), "token_text: token id ", id, " is out of range [0, ",
          tokens_.size(), ")");
    return tokens_[static_cast<std::size_t>(id)].text;
  }
  [[nodiscard]] bool is_special(token_id id) const noexcept {
    return id >= 0 && static_cast<std::size_t>(id) < tokens_.size() && tokens_[static_cast<std::size_t>(id)].special;
  }
  [[nodiscard]] const std::vector<bpe_added_token>& added_tokens() const noexcept { return added_; }

  // One past the largest id the tokenizer defines.
  [[nodiscard]] std::int32_t vocab_size() const noexcept { return static_cast<std::int32_t>(tokens_.size()); }
  [[nodiscard]] std::size_t num_merges() const noexcept { return merges_.size(); }
  [[nodiscard]] token_id bos() const noexcept { return bos_; }
  [[nodiscard]] token_id eos() const noexcept { return eos_; }
  [[nodiscard]] bool add_bos() const noexcept { return add_bos_; }
  [[nodiscard]] bool normalizes_nfc() const noexcept { return nfc_; }
  [[nodiscard]] int max_digits() const noexcept { return max_digits_; }

  // The family the checkpoint's template is recognised as (none: not one zipage has built in). With a Jinja
  // template, informational: the template itself renders (use_builtin_chat_format switches to the built-in).
  [[nodiscard]] chat_format chat() const noexcept { return chat_; }
  // Whether a conversation can be rendered: a Jinja template (the checkpoint's or set_chat_template's, even
  // one that failed to parse: rendering then names the problem) or a built-in format.
  [[nodiscard]] bool has_chat_template() const noexcept {
    return jinja_ != nullptr || !jinja_error_.empty() || (chat_ != chat_format::none && builtin_);
  }
  // "jinja" (the template renders, recognised family in parentheses when there is one), or a built-in
  // format's name, or "none".
  [[nodiscard]] std::string chat_template_name() const {
    if (!builtin_ && (jinja_ || !jinja_error_.empty()))
      return chat_ == chat_format::none ? std::string("jinja") : "jinja (" + std::string(chat_format_name(chat_)) + ")";
    return std::string(chat_format_name(builtin_ ? chat_ : chat_format::none));
  }
  // Why the Jinja template cannot be used (empty when it can or there is none).
  [[nodiscard]] const std::string& chat_template_error() const noexcept { return jinja_error_; }
  // qwen2, qwen2_5: the default system message the checkpoint's template writes (empty otherwise).
  [[nodiscard]] const std::string& chat_default_system() const noexcept { return chat_default_system_; }
  // The variables transformers passes a template for the tokenizer's special tokens (bos_token, eos_token,
  // unk_token, pad_token, ..., additional_special_tokens), an object.
  [[nodiscard]] const nlohmann::ordered_json& chat_special_tokens() const noexcept { return chat_special_tokens_; }

  // Uses `source` as the chat template (vLLM's --chat-template FILE); a syntax error is an error here.
  void set_chat_template(const std::string& source, const std::string& where) {
    std::shared_ptr<const jinja::template_> parsed;
    std::string why;
    parse_template(source, where, parsed, why);
    if (!why.empty()) fail(why);
    replace_template(source, std::move(parsed));
  }
  // Renders conversations with zipage's built-in `format` instead of the Jinja template (none: back to it).
  void use_builtin_chat_format(chat_format format) {
    builtin_ = format != chat_format::none;
    if (builtin_) chat_ = format;
  }

  // The conversation as the checkpoint's chat template renders it (see render_chat_template); with a
  // built-in format, qwen2/qwen2_5 write the template's own default system message unless
  // `o.default_system` is set.
  [[nodiscard]] std::string apply_chat_template(std::span<const chat_message> messages, const chat_options& o = {}) const {
    if (!builtin_) return apply_chat_template_json(chat_messages_json(messages), o);
    if ((chat_ == chat_format::qwen2 || chat_ == chat_format::qwen2_5) && !o.default_system) {
      chat_options with = o;
      with.default_system = chat_default_system_;
      return zipage::apply_chat_template(chat_, messages, with);
    }
    return zipage::apply_chat_template(chat_, messages, o);
  }
  // OpenAI message objects (tool calls, tool results, reasoning_content: whatever the template reads).
  // A built-in format takes plain role/content messages only.
  [[nodiscard]] std::string apply_chat_template_json(const nlohmann::ordered_json& messages, const chat_options& o = {},
                                                     const jinja::render_options& render = {}) const {
    if (builtin_) {
      check(messages.is_array(), "chat template: the messages must be a list");
      std::vector<chat_message> plain;
      for (const auto& m : messages) {
        check(m.is_object() && m.contains("role") && m["role"].is_string(), "chat template ", chat_format_name(chat_),
              " (built in): each message needs a string role");
        for (const auto& [k, v] : m.items())
          check(k == "role" || (k == "content" && (v.is_string() || v.is_null())), "chat template ", chat_format_name(chat_),
                " (built in) takes messages of a role and a text content only, not '", json::printable(k),
                "'; the checkpoint's own (Jinja) template renders the rest");
        plain.push_back({m["role"].get<std::string>(), m.value("content", nlohmann::ordered_json("")).is_string()
                                                           ? m["content"].get<std::string>() : std::string()});
      }
      return apply_chat_template(std::span<const chat_message>(plain), o);
    }
    check(!o.default_system, "chat_options.default_system is for the built-in formats (use_builtin_chat_format); the "
                             "checkpoint's template writes its own default: give a system message to replace it");
    if (!o.tools.is_null() && (jinja_tool_use_ || !jinja_tool_use_error_.empty())) {  // transformers' choice
      check(jinja_tool_use_error_.empty(), "the chat template cannot be used: ", jinja_tool_use_error_);
      return render_chat_template(*jinja_tool_use_, messages, o, chat_special_tokens_, render);
    }
    check(jinja_error_.empty(), "the chat template cannot be used: ", jinja_error_);
    check(jinja_ != nullptr, "the tokenizer has no chat template");
    return render_chat_template(*jinja_, messages, o, chat_special_tokens_, render);
  }

 private:
  struct token_entry {
    std::string text;     // as tokenizer.json spells it
    bool raw = false;     // decode as the UTF-8 of `text` (a character outside the byte map, as the library does)
    bool special = false;
    bool added = false;
  };
  struct merge_info {
    std::int32_t rank;
    token_id id;
  };
  struct symbol {
    token_id id;
    std::int32_t prev, next;
  };
  struct candidate {
    std::int32_t rank, left;  // left symbol index
    token_id left_id, right_id, merged;
  };
  struct later {  // min-heap on (rank, left)
    bool operator()(const candidate& a, const candidate& b) const noexcept {
      return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
    }
  };

  bpe_tokenizer() = default;

  // The bytes of the whitespace character at text[i], 0 if none. Unicode's White_Space (NBSP, U+3000, ...), as
  // the tokenizers library's lstrip / rstrip take it (Rust's char::is_whitespace), not ASCII's alone.
  static std::size_t space_at(std::string_view text, std::size_t i) noexcept {
    if (i >= text.size()) return 0;
    const auto r = utf8::scan(text.substr(i));
    if (r.state != utf8::status::valid) return 0;
    return unicode::is_space(utf8::decode_valid(text.substr(i), r.length)) ? r.length : 0;
  }
  // The bytes of the whitespace character that ends just before text[end], starting at `floor` or later; 0 if none.
  static std::size_t space_before(std::string_view text, std::size_t end, std::size_t floor) noexcept {
    for (std::size_t n = 1; n <= 3 && n <= end - floor; ++n)  // a White_Space character takes 3 bytes at most
      if (space_at(text, end - n) == n) return n;
    return 0;
  }
  static std::uint64_t pair_key(token_id a, token_id b) noexcept {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
  }

  // ---- loading ----

  void load(const json::value& root, const std::string& src) {
    check(root.is_object(), src, ": must be a JSON object, got ", json::type_name(root));
    const json::value& model = json::require(root, "model", src);
    check(model.is_object(), src, ": 'model' must be an object");
    const std::string msrc = src + ": model";
    const std::string& type = json::as_string(json::require(model, "type", msrc), msrc, "type");
    check(type == "BPE", src, ": model type '", json::printable(type), "' is not supported (zipage reads BPE)");
    check(!json::find(model, "dropout") || json::as_number(model.at("dropout"), msrc, "dropout") == 0.0, src,
          ": BPE dropout is not supported");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const json::value* v = json::find(model, key);
      check(v == nullptr || json::as_string(*v, msrc, key).empty(), src, ": model.", key, " is not supported");
    }
    check(!json::get_bool(model, "byte_fallback", msrc, false), src, ": byte_fallback BPE is not supported");
    ignore_merges_ = json::get_bool(model, "ignore_merges", msrc, false);
    read_normalizer(root, src);
    read_pre_tokenizer(root, src);
    if (const json::value* dec = json::find(root, "decoder")) {
      check(json::string_or_empty(*dec, "type") == "ByteLevel", src,
            ": decoder must be ByteLevel, got ", json::printable(dec->dump(), 80));
    }
    // Ids are bounded by what the file declares (vocab entries + added tokens: ids below twice that plus
    // 1024, room for the gaps real files leave), so the id table stays proportional to the file and a 4 KB
    // file cannot name an id of 2^26 and make it take gigabytes.
    {
      const json::value* vocab = json::find(model, "vocab");
      const json::value* added = json::find(root, "added_tokens");
      declared_ = (vocab && vocab->is_object() ? vocab->size() : 0) + (added && added->is_array() ? added->size() : 0);
      max_id_ = 2 * declared_ + 1024;
    }
    read_vocab(model, src);
    read_added_tokens(root, src);
    read_merges(model, src);
    read_post_processor(root, src);
  }

  void read_normalizer(const json::value& root, const std::string& src) {
    const json::value* n = json::find(root, "normalizer");
    if (n == nullptr) return;
    const bool is_nfc = json::string_or_empty(*n, "type") == "NFC";
    check(is_nfc, src, ": normalizer ", json::printable(n->dump(), 80), " is not supported (zipage implements NFC or none)");
    nfc_ = true;
  }

  void read_pre_tokenizer(const json::value& root, const std::string& src) {
    const json::value& pt = json::require(root, "pre_tokenizer", src);
    const std::string shown = json::printable(pt.dump(), 200);
    bool ok = json::string_or_empty(pt, "type") == "Sequence" && pt.contains("pretokenizers") &&
              pt["pretokenizers"].is_array() && pt["pretokenizers"].size() == 2;
    if (ok) {
      const auto& split = pt["pretokenizers"][0];
      const auto& bl = pt["pretokenizers"][1];
      const bool split_ok = json::string_or_empty(split, "type") == "Split" &&
                            json::string_or_empty(split, "behavior") == "Isolated" &&
                            json::bool_or(split, "invert", false) == false && split.contains("pattern") &&
                            split["pattern"].is_object() && split["pattern"].contains("Regex") &&
                            split["pattern"]["Regex"].is_string();
      const bool byte_level_ok = json::string_or_empty(bl, "type") == "ByteLevel" &&
                                 json::bool_or(bl, "add_prefix_space", false) == false &&
                                 json::bool_or(bl, "use_regex", true) == false;
      ok = split_ok && byte_level_ok;
      if (ok) {
        const auto& re = split["pattern"]["Regex"].get_ref<const std::string&>();
        if (re == qwen2_pattern) max_digits_ = 1;
        else if (re == llama3_pattern) max_digits_ = 3;
        else ok = false;
      }
    }
    check(ok, src, ": pre_tokenizer ", shown,
          " is not supported (zipage implements the Split + ByteLevel sequences of Qwen2/Qwen3 and Llama 3)");
  }

  // True when every character of `s` is one of the byte map's 256 (all below U+0144). Read with the decoder that
  // append_token_bytes uses, so invalid UTF-8 (unicode::invalid, a malformed vocabulary) makes a token raw.
  static bool in_byte_map(std::string_view s) {
    const auto& to_byte = detail::unicode_to_byte();
    return std::ranges::all_of(unicode::decode_units(s),
                               [&](const unicode::unit& u) { return u.cp < to_byte.size() && to_byte[u.cp] >= 0; });
  }

  void define(token_id id, std::string text, const std::string& src) {
    check(id >= 0 && id < (1 << 30), src, ": token id ", id, " is out of range");
    check(static_cast<std::size_t>(id) < max_id_, src, ": token id ", id, " is out of range: the file declares ",
          declared_, " tokens (model.vocab + added_tokens), so ids must be below 2 x ", declared_, " + 1024 = ", max_id_);
    if (static_cast<std::size_t>(id) >= tokens_.size()) tokens_.resize(static_cast<std::size_t>(id) + 1);
    token_entry& e = tokens_[static_cast<std::size_t>(id)];
    check(e.text.empty(), src, ": token id ", id, " is given to both '", json::printable(e.text), "' and '",
          json::printable(text), "'");
    check(!text.empty(), src, ": token id ", id, " has an empty string");
    e.raw = !in_byte_map(text);
    e.text = std::move(text);
  }

  void read_vocab(const json::value& model, const std::string& src) {
    const json::value& vocab = json::require(model, "vocab", src + ": model");
    check(vocab.is_object() && !vocab.empty(), src, ": model.vocab must be a non-empty object");
    vocab_.reserve(vocab.size());
    tokens_.reserve(vocab.size() + 1024);
    for (const auto& [piece, id_value] : vocab.items()) {
      const bool plain = id_value.is_number_unsigned() && id_value.get<std::uint64_t>() < (1u << 30);
      const auto id = plain ? static_cast<token_id>(id_value.get<std::uint64_t>())  // fast path; else a named error
                            : static_cast<token_id>(json::as_int(id_value, src, "model.vocab['" + json::printable(piece) + "']",
                                                                 0, (1 << 30) - 1));
      define(id, piece, src);
      vocab_.emplace(piece, id);
    }
    const auto& b2u = detail::byte_to_unicode();
    for (int b = 0; b < 256; ++b) {
      std::string s;
      unicode::append_utf8(s, b2u[static_cast<std::size_t>(b)]);
      const auto it = vocab_.find(s);
      check(it != vocab_.end(), src, ": the vocab lacks the byte-level token '", s, "' for byte ", b,
            " (every byte needs one)");
      byte_token_[static_cast<std::size_t>(b)] = it->second;
    }
  }

  void read_added_tokens(const json::value& root, const std::string& src) {
    const json::value* added = json::find(root, "added_tokens");
    if (added == nullptr) return;
    check(added->is_array(), src, ": added_tokens must be an array");
    for (std::size_t i = 0; i < added->size(); ++i) {
      const json::value& a = (*added)[i];
      const std::string where = src + ": added_tokens[" + std::to_string(i) + "]";
      check(a.is_object(), where, " must be an object");
      bpe_added_token t;
      t.id = static_cast<token_id>(json::as_int(json::require(a, "id", where), where, "id", 0, (1 << 30) - 1));
      t.content = json::as_string(json::require(a, "content", where), where, "content");
      check(!t.content.empty(), where, ": empty content");
      t.special = json::get_bool(a, "special", where, false);
      t.lstrip = json::get_bool(a, "lstrip", where, false);
      t.rstrip = json::get_bool(a, "rstrip", where, false);
      check(!json::get_bool(a, "single_word", where, false), where, ": single_word added tokens are not supported");
      const auto in_vocab = vocab_.find(t.content);
      if (in_vocab != vocab_.end()) {
        // An added token that is also a vocab entry (as some exporters list them): same id required.
        check(in_vocab->second == t.id, where, ": '", json::printable(t.content), "' has id ", t.id,
              " but the vocab gives it ", in_vocab->second);
      } else {
        define(t.id, t.content, where);
      }
      // Decoded like any token (define() set `raw`): through the byte map when every character is in it.
      token_entry& e = tokens_[static_cast<std::size_t>(t.id)];
      e.special = t.special;
      e.added = true;
      check(added_index_.emplace(t.content, t.id).second, where, ": '", json::printable(t.content), "' is listed twice");
      added_.push_back(std::move(t));
    }
    // Candidates by first byte, longest first, so the longest match at a position wins.
    for (std::size_t i = 0; i < added_.size(); ++i)
      added_by_first_[static_cast<unsigned char>(added_[i].content[0])].push_back(static_cast<std::uint32_t>(i));
    for (auto& v : added_by_first_)
      std::stable_sort(v.begin(), v.end(),
                       [&](std::uint32_t a, std::uint32_t b) { return added_[a].content.size() > added_[b].content.size(); });
  }

  void read_merges(const json::value& model, const std::string& src) {
    const json::value& merges = json::require(model, "merges", src + ": model");
    check(merges.is_array(), src, ": model.merges must be an array");
    merges_.reserve(merges.size());
    std::string left, right;
    for (std::size_t i = 0; i < merges.size(); ++i) {
      const json::value& m = merges[i];
      auto where = [&] { return src + ": model.merges[" + std::to_string(i) + "]"; };
      if (m.is_string()) {  // "left right" (older files)
        const auto& s = m.get_ref<const std::string&>();
        const auto sp = s.find(' ');
        if (!(sp != std::string::npos && sp > 0 && sp + 1 < s.size() && s.find(' ', sp + 1) == std::string::npos))
          fail(where(), ": '", json::printable(s), "' is not two tokens separated by one space");
        left = s.substr(0, sp);
        right = s.substr(sp + 1);
      } else {  // ["left", "right"]
        if (!(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()))
          fail(where(), " must be a string pair, got ", json::printable(m.dump(), 80));
        left = m[0].get_ref<const std::string&>();
        right = m[1].get_ref<const std::string&>();
      }
      const auto l = vocab_.find(left), r = vocab_.find(right);
      if (l == vocab_.end() || r == vocab_.end())
        fail(where(), ": '", json::printable(left), "' or '", json::printable(right), "' is not in the vocab");
      left += right;
      const auto lr = vocab_.find(left);
      if (lr == vocab_.end()) fail(where(), ": the merged token '", json::printable(left), "' is not in the vocab");
      // A repeated pair keeps its first (best) rank, as the library does.
      merges_.try_emplace(pair_key(l->second, r->second), merge_info{static_cast<std::int32_t>(i), lr->second});
    }
  }

  void read_post_processor(const json::value& root, const std::string& src) {
    if (const json::value* pp = json::find(root, "post_processor")) {
      if (const auto id = template_bos(*pp, src)) {
        bos_ = *id;
        add_bos_ = true;
      }
    }
  }

  // The special token a TemplateProcessing puts before a single sequence, if any.
  std::optional<token_id> template_bos(const json::value& pp, const std::string& src) const {
    if (!pp.is_object()) return std::nullopt;
    const std::string_view type = json::string_or_empty(pp, "type");
    if (type == "Sequence" && pp.contains("processors") && pp["processors"].is_array()) {
      for (const auto& p : pp["processors"])
        if (const auto id = template_bos(p, src)) return id;
      return std::nullopt;
    }
    if (type != "TemplateProcessing" || !pp.contains("single") || !pp["single"].is_array() || pp["single"].empty())
      return std::nullopt;
    const auto& first = pp["single"][0];
    if (!first.is_object() || !first.contains("SpecialToken")) return std::nullopt;
    const auto& st = first["SpecialToken"];
    check(st.is_object() && st.contains("id") && st["id"].is_string(), src, ": post_processor SpecialToken lacks an id");
    const auto& name = st["id"].get_ref<const std::string&>();
    const auto found = find(name);
    check(found.has_value(), src, ": post_processor adds '", json::printable(name), "', which is not a token");
    return found;
  }

  // Parses a Jinja template into `t`, or leaves `t` empty and says why in `why` (prefixed with `where`): a
  // template zipage cannot parse does not stop the tokenizer loading, chat requests report it.
  static void parse_template(const std::string& source, const std::string& where,
                             std::shared_ptr<const jinja::template_>& t, std::string& why) {
    t.reset();
    why.clear();
    try {
      t = std::make_shared<const jinja::template_>(jinja::template_::parse(source));
    } catch (const error& e) {
      why = where + ": " + e.what();
    }
  }
  // `source` (parsed into `parsed`, or not: `why`) as the template that renders conversations (the Jinja
  // one: the built-in format is left), and the family it is recognised as.
  void adopt_template(const std::string& source, std::shared_ptr<const jinja::template_> parsed, std::string why) {
    jinja_ = std::move(parsed);
    jinja_error_ = std::move(why);
    builtin_ = false;
    chat_ = detect_chat_format(source);
    chat_default_system_.clear();
    if (chat_ == chat_format::qwen2 || chat_ == chat_format::qwen2_5)
      chat_default_system_ = *chat_template_default_system(source);  // detection found it
  }
  // A template given instead of the checkpoint's (--chat-template FILE, chat_template.jinja): it replaces the
  // named tool_use template too.
  void replace_template(const std::string& source, std::shared_ptr<const jinja::template_> parsed) {
    adopt_template(source, std::move(parsed), {});
    jinja_tool_use_.reset();
    jinja_tool_use_error_.clear();
  }
  // The config's template (a string, or the default one of named templates).
  void adopt_config_template(const std::string& source, const std::string& where) {
    std::shared_ptr<const jinja::template_> parsed;
    std::string why;
    parse_template(source, where, parsed, why);
    adopt_template(source, std::move(parsed), std::move(why));
  }

  // additional_chat_templates/<name>.jinja, where recent transformers saves named templates: as its loader does,
  // they join the template already read as "default" and replace same-named ones (the config's list included).
  // zipage renders two names, as transformers chooses: tool_use when tools are given, default otherwise.
  void load_named_template_files(const std::filesystem::path& folder) {
    std::error_code ec;
    if (!std::filesystem::is_directory(folder, ec)) return;
    std::vector<std::filesystem::path> files;
    for (std::filesystem::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code file_ec;  // files only, as transformers lists them (a folder named x.jinja is not one)
      if (it->path().extension() == ".jinja" && it->is_regular_file(file_ec)) files.push_back(it->path());
    }
    check(!ec, "cannot list the chat templates in '", folder.string(), "': ", ec.message());
    std::sort(files.begin(), files.end());
    std::string names;  // for the error when there is no default
    for (const auto& file : files) {
      const std::string name = file.stem().string();
      const std::string source = json::read_text_file(file, "chat template");  // unreadable: named here
      names += (names.empty() ? "'" : ", '") + json::printable(name) + "'";
      if (name == "default") adopt_config_template(source, file.string());
      if (name == "tool_use") parse_template(source, file.string(), jinja_tool_use_, jinja_tool_use_error_);
    }
    // As transformers: named templates without a default leave a chat without tools no template.
    if (!files.empty() && jinja_ == nullptr && jinja_error_.empty())
      adopt_template({}, nullptr, folder.string() + " has no 'default' template and there is no other "
                                  "(chat_template.jinja or tokenizer_config.json's chat_template); it has " + names);
  }

  // llama.cpp's named templates, tokenizer.chat_template.<name>: its converter writes a checkpoint's named
  // templates there (all but "default", which is tokenizer.chat_template; tokenizer.chat_templates lists the names)
  // and llama-server renders a request with tools with "tool_use". Read as a checkpoint's
  // additional_chat_templates: tool_use when tools are given, other names load unused; a template that is not a
  // string is refused, naming its key. tokenizer.chat_template.default is the default only where the file has no
  // tokenizer.chat_template (llama.cpp reads that key); named templates without any default leave a chat without
  // tools an error naming them.
  void load_named_gguf_templates(const gguf::file& f, const std::string& src) {
    constexpr std::string_view prefix = "tokenizer.chat_template.";
    std::string names;  // for the error when there is no default
    for (const std::string& key : f.keys()) {
      if (!key.starts_with(prefix) || key.size() == prefix.size()) continue;
      const std::string name = key.substr(prefix.size()), source = f.get_string(key);
      names += (names.empty() ? "'" : ", '") + json::printable(name) + "'";
      if (name == "tool_use") parse_template(source, src + ": " + key, jinja_tool_use_, jinja_tool_use_error_);
      if (name == "default" && !f.has("tokenizer.chat_template")) adopt_config_template(source, src + ": " + key);
    }
    if (!names.empty() && jinja_ == nullptr && jinja_error_.empty())
      adopt_template({}, nullptr, src + ": no tokenizer.chat_template (the default) beside its named templates " +
                                      names);
  }

  // tokenizer_config.json: bos/eos tokens, add_bos_token, chat template.
  void load_config(const json::value& cfg, const std::string& src) {
    check(cfg.is_object(), src, ": must be a JSON object, got ", json::type_name(cfg));
    auto token_field = [&](const char* key) -> std::optional<token_id> {
      const json::value* v = json::find(cfg, key);
      if (v == nullptr) return std::nullopt;
      const json::value* content = v->is_object() ? json::find(*v, "content") : v;  // {"content": ...} in older files
      check(content != nullptr, src, ": field '", key, "' has no content");
      const std::string& s = json::as_string(*content, src, key);
      const auto id = find(s);
      check(id.has_value(), src, ": ", key, " '", json::printable(s), "' is not a token of the tokenizer");
      return id;
    };
    if (const auto id = token_field("eos_token")) eos_ = *id;
    if (const auto id = token_field("bos_token")) bos_ = *id;
    if (const json::value* v = json::find(cfg, "add_bos_token")) add_bos_ = json::as_bool(*v, src, "add_bos_token");
    check(!add_bos_ || bos_ >= 0, src, ": add_bos_token is true but there is no bos_token");
    jinja_tool_use_.reset();
    jinja_tool_use_error_.clear();
    // transformers passes the special tokens to the template by name (those that are set).
    for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
      const json::value* v = json::find(cfg, key);
      if (v == nullptr || v->is_null()) continue;
      const json::value* content = v->is_object() ? json::find(*v, "content") : v;
      if (content != nullptr && content->is_string()) chat_special_tokens_[key] = content->get<std::string>();
    }
    if (const json::value* extra = json::find(cfg, "additional_special_tokens"); extra && extra->is_array()) {
      nlohmann::ordered_json names = nlohmann::ordered_json::array();
      for (const auto& e : *extra) {
        const json::value* content = e.is_object() ? json::find(e, "content") : &e;
        if (content != nullptr && content->is_string()) names.push_back(content->get<std::string>());
      }
      chat_special_tokens_["additional_special_tokens"] = std::move(names);
    }
    if (const json::value* t = json::find(cfg, "chat_template")) {
      if (t->is_string()) {
        adopt_config_template(t->get_ref<const std::string&>(), src + ": chat_template");
      } else {
        // Named templates (Cohere's): "default", and "tool_use", which transformers picks when tools are given.
        check(t->is_array(), src, ": chat_template must be a string or a list of {name, template}");
        std::string names;  // for the error when there is no default
        bool has_default = false;
        for (std::size_t i = 0; i < t->size(); ++i) {
          const auto& entry = (*t)[i];
          check(entry.is_object() && entry.contains("template") && entry["template"].is_string(), src,
                ": chat_template[", i, "] must be a {name, template} object with a string template");
          const std::string name(json::string_or_empty(entry, "name"));
          names += (names.empty() ? "'" : ", '") + json::printable(name) + "'";
          if (name == "default") {
            adopt_config_template(entry["template"].get_ref<const std::string&>(), src + ": chat_template");
            has_default = true;
          }
          if (name == "tool_use")
            parse_template(entry["template"].get_ref<const std::string&>(), src + ": chat_template 'tool_use'",
                           jinja_tool_use_, jinja_tool_use_error_);
        }
        // As transformers: without a default, a chat (without tools) has no template to use; said when one is asked.
        if (!has_default)
          adopt_template({}, nullptr, src + ": chat_template names no 'default' template (it has " +
                                          (names.empty() ? std::string("none") : names) + ")");
      }
    }
  }

  // ---- encoding ----

  const bpe_added_token* match_added(std::string_view text, std::size_t i, bool parse_special) const {
    for (std::uint32_t k : added_by_first_[static_cast<unsigned char>(text[i])]) {
      const bpe_added_token& a = added_[k];
      if (a.special && !parse_special) continue;
      if (text.compare(i, a.content.size(), a.content) == 0) return &a;
    }
    return nullptr;
  }

  void encode_text(std::string_view raw, std::vector<token_id>& out) const {
    if (raw.empty()) return;
    const std::string text = normalize(raw);
    for (std::string_view piece : pre_tokenize(text)) encode_piece(piece, out);
  }

  // One pre-tokenized piece → BPE tokens.
  void encode_piece(std::string_view piece, std::vector<token_id>& out) const {
    if (piece.size() == 1) {
      out.push_back(byte_token_[static_cast<unsigned char>(piece[0])]);
      return;
    }
    if (ignore_merges_) {
      std::string chars;
      for (char c : piece) unicode::append_utf8(chars, detail::byte_to_unicode()[static_cast<unsigned char>(c)]);
      if (const auto it = vocab_.find(chars); it != vocab_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    check(piece.size() < static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()), "encode: piece too long");
    std::vector<symbol> syms(piece.size());
    for (std::size_t i = 0; i < piece.size(); ++i) {
      const auto idx = static_cast<std::int32_t>(i);
      syms[i] = {byte_token_[static_cast<unsigned char>(piece[i])], idx - 1, idx + 1};
    }
    syms.back().next = -1;
    std::priority_queue<candidate, std::vector<candidate>, later> queue;
    auto push = [&](std::int32_t left) {
      if (left < 0) return;
      const std::int32_t right = syms[static_cast<std::size_t>(left)].next;
      if (right < 0) return;
      const token_id a = syms[static_cast<std::size_t>(left)].id, b = syms[static_cast<std::size_t>(right)].id;
      const auto it = merges_.find(pair_key(a, b));
      if (it != merges_.end()) queue.push({it->second.rank, left, a, b, it->second.id});
    };
    for (std::int32_t i = 0; i + 1 < static_cast<std::int32_t>(syms.size()); ++i) push(i);
    while (!queue.empty()) {
      const candidate c = queue.top();
      queue.pop();
      symbol& l = syms[static_cast<std::size_t>(c.left)];
      // Stale when the left symbol was merged away or changed, or its right neighbour changed.
      if (l.id != c.left_id || l.next < 0 || syms[static_cast<std::size_t>(l.next)].id != c.right_id) continue;
      symbol& r = syms[static_cast<std::size_t>(l.next)];
      l.id = c.merged;
      l.next = r.next;
      if (r.next >= 0) syms[static_cast<std::size_t>(r.next)].prev = c.left;
      r.id = -1;  // dead
      push(l.prev);
      push(c.left);
    }
    for (std::int32_t i = 0; i >= 0; i = syms[static_cast<std::size_t>(i)].next)
      out.push_back(syms[static_cast<std::size_t>(i)].id);
  }

  // ---- the pre-tokenizer regex, by hand ----

  enum class cls : std::uint8_t { letter, number, newline, space, other };

  static cls classify(char32_t cp) noexcept {
    if (cp == '\r' || cp == '\n') return cls::newline;
    if (unicode::is_letter(cp)) return cls::letter;
    if (unicode::is_number(cp)) return cls::number;
    if (unicode::is_space(cp)) return cls::space;
    return cls::other;
  }

  // Case-insensitive letter of the contractions ('s 't 're 've 'm 'll 'd); U+017F ſ folds to s.
  static char fold(char32_t cp) noexcept {
    if (cp == 0x17F) return 's';
    if (cp < 0x80) return static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
    return 0;
  }

  // End (unit index) of the regex match starting at unit i. Every position starts a match: letters,
  // numbers, whitespace and everything else each have an alternative.
  std::size_t match_piece(const std::vector<unicode::unit>& u, std::size_t i) const {
    const std::size_t n = u.size();
    auto c = [&](std::size_t k) { return classify(u[k].cp); };
    auto run = [&](std::size_t k, auto pred) {
      while (k < n && pred(c(k))) ++k;
      return k;
    };
    const cls ci = c(i);
    // 1. (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if (u[i].cp == '\'' && i + 1 < n) {
      const char a = fold(u[i + 1].cp);
      if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
      if (i + 2 < n) {
        const char b = fold(u[i + 2].cp);
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
      }
    }
    auto is_letter = [](cls k) { return k == cls::letter; };
    // 2. [^\r\n\p{L}\p{N}]?\p{L}+
    if (ci == cls::letter) return run(i + 1, is_letter);
    if (ci != cls::newline && ci != cls::number && i + 1 < n && c(i + 1) == cls::letter) return run(i + 2, is_letter);
    // 3. \p{N} (Qwen) or \p{N}{1,3} (Llama 3)
    if (ci == cls::number) {
      std::size_t j = i + 1;
      while (j < n && j - i < static_cast<std::size_t>(max_digits_) && c(j) == cls::number) ++j;
      return j;
    }
    // 4. ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    std::size_t j = i;
    if (u[i].cp == ' ' && i + 1 < n && c(i + 1) == cls::other) j = i + 1;
    if (c(j) == cls::other) {
      j = run(j + 1, [](cls k) { return k == cls::other; });
      return run(j, [](cls k) { return k == cls::newline; });
    }
    // Whitespace from here on.
    const std::size_t end = run(i, [](cls k) { return k == cls::space || k == cls::newline; });
    // 5. \s*[\r\n]+ : up to the last newline of the whitespace run.
    for (std::size_t k = end; k > i; --k)
      if (c(k - 1) == cls::newline) return k;
    // 6. \s+(?!\S) : the run, less its last character when a non-space follows.
    if (end == n) return end;
    if (end - i >= 2) return end - 1;
    // 7. \s+
    return end;
  }

  std::vector<token_entry> tokens_;  // by id
  std::size_t declared_ = 0;  // vocab entries + added tokens
  std::size_t max_id_ = 0;    // every id is below it (2 x declared_ + 1024)
  std::unordered_map<std::string, token_id, detail::bpe_string_hash, std::equal_to<>> vocab_;
  std::unordered_map<std::string, token_id, detail::bpe_string_hash, std::equal_to<>> added_index_;
  std::unordered_map<std::uint64_t, merge_info> merges_;
  std::vector<bpe_added_token> added_;
  std::array<std::vector<std::uint32_t>, 256> added_by_first_;
  std::array<token_id, 256> byte_token_{};
  bool nfc_ = false;
  bool ignore_merges_ = false;
  int max_digits_ = 1;
  token_id bos_ = -1, eos_ = -1;
  bool add_bos_ = false;
  chat_format chat_ = chat_format::none;
  std::string chat_default_system_;  // qwen2, qwen2_5: parsed from the template
  bool builtin_ = false;             // render with the built-in chat_ instead of the Jinja template
  std::shared_ptr<const jinja::template_> jinja_;
  std::string jinja_error_;          // why the checkpoint's template did not parse
  std::shared_ptr<const jinja::template_> jinja_tool_use_;  // the "tool_use" one of named templates
  std::string jinja_tool_use_error_;
  nlohmann::ordered_json chat_special_tokens_ = nlohmann::ordered_json::object();
};

// Turns generated tokens into printable text one token at a time; output is always valid UTF-8 (a
// character split across tokens is held until complete; bytes that can never form one become U+FFFD).
// The concatenation of all push() results and flush() equals tokenizer.decode(ids, skip_special).
class bpe_stream_decoder {
 public:
  explicit bpe_stream_decoder(const bpe_tokenizer& tokenizer, bool skip_special = true)
      : tok_(&tokenizer), skip_special_(skip_special) {}

  std::string push(token_id id) {
    tok_->append_token_bytes(pending_.buffer(), id, skip_special_);
    return pending_.take();
  }
  std::string flush() { return pending_.flush(); }
  void reset() { pending_.clear(); }
  [[nodiscard]] bool has_pending() const noexcept { return !pending_.empty(); }

 private:
  const bpe_tokenizer* tok_;
  bool skip_special_;
  utf8::holdback pending_;
};

}  // namespace zipage
