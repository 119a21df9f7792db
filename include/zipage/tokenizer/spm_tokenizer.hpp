#pragma once
// SentencePiece-style BPE tokenizer as stored in a GGUF file (tokenizer.ggml.model = "llama").
//
// Encoding follows SentencePiece's BPE model (and llama.cpp's "SPM" tokenizer):
//   1. optionally prefix one space (the "dummy prefix"), then write every space as U+2581 "▁";
//   2. split into UTF-8 characters (user-defined pieces are cut out first, whole and frozen;
//      a byte that does not start a well-formed character becomes a one-byte symbol);
//   3. repeatedly merge the adjacent pair whose concatenation is a vocab piece with the highest
//      score, leftmost pair first on ties; a max-heap of candidate pairs keeps this O(n log n);
//   4. a symbol that is not a piece falls back to its bytes as <0xXX> tokens (or to unk when the
//      vocab has no byte tokens); pieces of type "unused" are split back into what formed them.
// Decoding drops control tokens, turns byte tokens into raw bytes and "▁" back into spaces, and
// drops the dummy-prefix space of the first piece, so decode(encode(s)) == s for valid UTF-8 s.
//
// All const member functions are safe to call concurrently.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
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
#include "zipage/core/types.hpp"
#include "zipage/gguf/gguf.hpp"
#include "zipage/tokenizer/utf8.hpp"

namespace zipage {

// Values of tokenizer.ggml.token_type (llama.cpp's numbering; SentencePiece's plus one).
enum class spm_token_type : std::int32_t {
  undefined = 0,  // treated like normal
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

struct spm_vocab {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<std::int32_t> types;  // spm_token_type values
  std::int32_t bos = -1, eos = -1, unk = -1;
  bool add_bos = true;           // the model's preference; encode() takes the actual choice
  bool add_space_prefix = true;  // SentencePiece's add_dummy_prefix
};

namespace detail {

inline constexpr std::string_view spm_space = "\xE2\x96\x81";      // U+2581, stands for ' '
inline constexpr std::string_view spm_unk_surface = " \xE2\x81\x87 ";  // " ⁇ ", as SentencePiece

// Lets the piece map be probed with string_views into the text without building strings.
struct transparent_string_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

// "<0x0A>" -> 10; anything else -> -1. Hex digits may be either case.
[[nodiscard]] inline int parse_byte_piece(std::string_view p) noexcept {
  if (p.size() != 6 || !p.starts_with("<0x") || p[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(p[3]), lo = hex(p[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// GGUF writers store "no such token" as -1 or as uint32 0xFFFFFFFF.
[[nodiscard]] inline std::int32_t gguf_token_id(std::int64_t v, std::string_view key) {
  if (v < 0 || v == 0xFFFFFFFFll) return -1;
  check(v <= std::numeric_limits<std::int32_t>::max(), "GGUF ", key, " = ", v, " is not a valid token id");
  return static_cast<std::int32_t>(v);
}

}  // namespace detail

class spm_tokenizer {
 public:
  explicit spm_tokenizer(spm_vocab vocab) : v_(std::move(vocab)) {
    validate_sizes();
    validate_special_ids();
    index_pieces();
  }

  // Reads the tokenizer.ggml.* keys. Throws zipage::error if the tokenizer is not SentencePiece
  // ("llama") or its arrays are missing or disagree.
  static spm_tokenizer from_gguf(const gguf::file& f) {
    constexpr std::string_view model_key = "tokenizer.ggml.model";
    check(f.has(model_key), "GGUF file has no ", model_key, ": it carries no tokenizer");
    const std::string model = f.get_string(model_key);
    check(model == "llama", "tokenizer model '", model, "' is not SentencePiece ('llama')",
          model == "gpt2" ? ": byte-level BPE vocabularies load with bpe_tokenizer::from_gguf" : "");
    for (std::string_view key : {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"}) {
      check(f.has(key), "GGUF SentencePiece tokenizer lacks the array ", key);
    }
    spm_vocab v;
    v.pieces = f.get_string_array("tokenizer.ggml.tokens");
    v.scores = f.get_float_array("tokenizer.ggml.scores");
    for (std::int64_t t : f.get_int_array("tokenizer.ggml.token_type")) {
      check(t >= 0 && t <= 6, "GGUF tokenizer.ggml.token_type holds unknown type ", t);
      v.types.push_back(static_cast<std::int32_t>(t));
    }
    // Defaults are llama.cpp's for SentencePiece vocabs when a key is absent.
    v.bos = detail::gguf_token_id(f.get_int("tokenizer.ggml.bos_token_id", 1), "bos_token_id");
    v.eos = detail::gguf_token_id(f.get_int("tokenizer.ggml.eos_token_id", 2), "eos_token_id");
    v.unk = detail::gguf_token_id(f.get_int("tokenizer.ggml.unknown_token_id", 0), "unknown_token_id");
    v.add_bos = f.get_bool("tokenizer.ggml.add_bos_token", v.bos >= 0);  // absent: add BOS if there is one
    v.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix", true);
    return spm_tokenizer(std::move(v));
  }

  [[nodiscard]] std::vector<token_id> encode(std::string_view text, bool add_bos) const {
    std::vector<token_id> out;
    if (add_bos) {
      check(v_.bos >= 0, "encode: BOS requested but the vocab has no BOS token");
      out.push_back(v_.bos);
    }
    const std::string norm = normalize(text);
    std::vector<symbol> syms = split(norm);
    rev_merge_map rev;
    merge_pairs(norm, syms, rev);
    // Symbol 0 always survives: a merge keeps the left symbol, so walk the list from it.
    for (std::int32_t i = syms.empty() ? -1 : 0; i >= 0; i = syms[static_cast<std::size_t>(i)].next) {
      const symbol& s = syms[static_cast<std::size_t>(i)];
      emit(norm.substr(s.begin, s.size), rev, out);
    }
    return out;
  }

  [[nodiscard]] std::string decode(std::span<const token_id> ids) const {
    std::string out;
    bool at_start = true;
    for (token_id id : ids) append_token_text(out, id, at_start);
    return out;
  }

  // Appends what decode() produces for `id`. `at_start` is true until the first visible piece;
  // it decides whether the dummy-prefix space is dropped. Shared by decode() and stream_decoder.
  void append_token_text(std::string& out, token_id id, bool& at_start) const {
    check_id(id, "decode");
    if (is_control(id)) return;
    const std::string_view p = v_.pieces[static_cast<std::size_t>(id)];
    switch (type(id)) {
      case spm_token_type::unknown: out.append(detail::spm_unk_surface); break;
      case spm_token_type::byte: out.push_back(static_cast<char>(detail::parse_byte_piece(p))); break;
      case spm_token_type::user_defined: out.append(p); break;  // verbatim, as SentencePiece
      default: append_piece_text(out, p, at_start && v_.add_space_prefix); break;
    }
    at_start = false;
  }

  [[nodiscard]] std::string_view piece(token_id id) const {
    check_id(id, "piece");
    return v_.pieces[static_cast<std::size_t>(id)];
  }
  [[nodiscard]] float score(token_id id) const {
    check_id(id, "score");
    return v_.scores[static_cast<std::size_t>(id)];
  }
  [[nodiscard]] spm_token_type type(token_id id) const {
    check_id(id, "type");
    return static_cast<spm_token_type>(v_.types[static_cast<std::size_t>(id)]);
  }
  // The id of a piece that encoding can produce (normal, user-defined, unused), or of a byte
  // token "<0xXX>"; control/unknown pieces such as "<s>" are not text and are not found.
  [[nodiscard]] std::optional<token_id> find(std::string_view p) const {
    if (auto it = mergeable_.find(p); it != mergeable_.end()) return it->second;
    const int b = detail::parse_byte_piece(p);
    if (b >= 0 && has_byte_fallback()) return byte_ids_[static_cast<std::size_t>(b)];
    return std::nullopt;
  }

  [[nodiscard]] std::int32_t vocab_size() const noexcept { return static_cast<std::int32_t>(v_.pieces.size()); }
  [[nodiscard]] token_id bos() const noexcept { return v_.bos; }
  [[nodiscard]] token_id eos() const noexcept { return v_.eos; }
  [[nodiscard]] token_id unk() const noexcept { return v_.unk; }
  [[nodiscard]] bool add_bos() const noexcept { return v_.add_bos; }
  [[nodiscard]] bool add_space_prefix() const noexcept { return v_.add_space_prefix; }
  [[nodiscard]] bool has_byte_fallback() const noexcept { return byte_ids_[0] >= 0; }

  // True for tokens that carry no text: control-type tokens and the BOS/EOS ids.
  [[nodiscard]] bool is_control(token_id id) const {
    return type(id) == spm_token_type::control || id == v_.bos || id == v_.eos;  // type() checks the range
  }
  [[nodiscard]] bool is_byte(token_id id) const { return type(id) == spm_token_type::byte; }

 private:
  // A run of the normalized text; size 0 once merged into its left neighbour.
  struct symbol {
    std::size_t begin, size;
    std::int32_t prev, next;
    bool frozen;  // a user-defined piece: never merged
  };
  // A candidate merge of symbols left and right (adjacent when pushed) into piece `id`.
  struct candidate {
    float score;
    std::int32_t left, right;
    std::size_t size;  // merged byte length; detects a candidate made stale by other merges
    token_id id;
  };
  struct lower_priority {  // max-heap on score; on equal score the leftmost pair wins
    bool operator()(const candidate& a, const candidate& b) const noexcept {
      return a.score != b.score ? a.score < b.score : a.left > b.left;
    }
  };
  // Unused pieces may be merged through but not emitted; remember what formed them.
  using rev_merge_map = std::unordered_map<std::string_view, std::pair<std::string_view, std::string_view>>;
  using candidate_queue = std::priority_queue<candidate, std::vector<candidate>, lower_priority>;

  void check_id(token_id id, std::string_view what) const {
    check(id >= 0 && id < vocab_size(), what, ": token id ", id, " is out of range [0, ", vocab_size(), ")");
  }

  void validate_sizes() const {
    const std::size_t n = v_.pieces.size();
    check(n > 0, "SentencePiece vocab is empty");
    check(n <= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()),
          "SentencePiece vocab has ", n, " pieces, more than token_id can address");
    check(v_.scores.size() == n, "SentencePiece vocab has ", n, " pieces but ", v_.scores.size(), " scores");
    check(v_.types.size() == n, "SentencePiece vocab has ", n, " pieces but ", v_.types.size(), " token types");
    for (std::size_t i = 0; i < n; ++i) {
      check(v_.types[i] >= 0 && v_.types[i] <= 6, "SentencePiece token ", i, " has unknown type ", v_.types[i]);
    }
  }

  void validate_special_ids() const {
    auto ok = [&](std::int32_t id) { return id >= -1 && id < vocab_size(); };
    check(ok(v_.bos), "BOS id ", v_.bos, " is outside the vocab of ", vocab_size(), " tokens");
    check(ok(v_.eos), "EOS id ", v_.eos, " is outside the vocab of ", vocab_size(), " tokens");
    check(ok(v_.unk), "unknown-token id ", v_.unk, " is outside the vocab of ", vocab_size(), " tokens");
    check(!v_.add_bos || v_.bos >= 0, "vocab asks for a BOS token but has no BOS id");
  }

  // Builds the piece map and the byte table, and checks byte fallback is complete.
  void index_pieces() {
    byte_ids_.fill(-1);
    std::size_t n_bytes = 0;
    for (std::size_t i = 0; i < v_.pieces.size(); ++i) {
      const auto id = static_cast<token_id>(i);
      const std::string& p = v_.pieces[i];
      const auto t = static_cast<spm_token_type>(v_.types[i]);
      if (t == spm_token_type::byte) {
        index_byte_piece(p, id);
        ++n_bytes;
        continue;
      }
      if (t == spm_token_type::control || t == spm_token_type::unknown) continue;  // not text
      check(!p.empty(), "SentencePiece token ", i, " has an empty piece");
      if (t == spm_token_type::user_defined) index_user_defined(p.size());
      // Duplicates keep the lowest id, so the result does not depend on map internals.
      mergeable_.try_emplace(p, id);
      max_piece_size_ = std::max(max_piece_size_, p.size());
    }
    check(n_bytes == 0 || n_bytes == 256, "SentencePiece vocab has ", n_bytes,
          " of the 256 byte tokens <0x00>..<0xFF>: byte fallback needs all of them");
    check(n_bytes == 256 || v_.unk >= 0,
          "SentencePiece vocab has neither byte tokens nor an unknown token to encode unseen characters");
  }

  void index_byte_piece(const std::string& p, token_id id) {
    const int b = detail::parse_byte_piece(p);
    check(b >= 0, "byte token ", id, " is '", p, "', not of the form <0xXX>");
    token_id& slot = byte_ids_[static_cast<std::size_t>(b)];
    check(slot < 0, "byte token ", p, " appears twice (ids ", slot, " and ", id, ")");
    slot = id;
  }

  void index_user_defined(std::size_t size) {
    // Kept longest first: the splitter takes the longest user-defined piece at each position.
    auto pos = std::lower_bound(user_defined_sizes_.begin(), user_defined_sizes_.end(), size, std::greater<>{});
    if (pos == user_defined_sizes_.end() || *pos != size) user_defined_sizes_.insert(pos, size);
  }

  [[nodiscard]] std::string normalize(std::string_view text) const {
    std::string norm;
    norm.reserve(text.size() + text.size() / 2 + detail::spm_space.size());
    if (v_.add_space_prefix && !text.empty()) norm.append(detail::spm_space);
    for (char c : text) {
      // 0x20 never occurs inside a multi-byte UTF-8 sequence, so byte-wise replacement is safe.
      if (c == ' ') norm.append(detail::spm_space);
      else norm.push_back(c);
    }
    return norm;
  }

  // Length of the longest user-defined piece starting the text, or 0.
  [[nodiscard]] std::size_t match_user_defined(std::string_view rest) const {
    for (std::size_t len : user_defined_sizes_) {
      if (len > rest.size()) continue;
      auto it = mergeable_.find(rest.substr(0, len));
      if (it != mergeable_.end() && type(it->second) == spm_token_type::user_defined) return len;
    }
    return 0;
  }

  [[nodiscard]] std::vector<symbol> split(std::string_view norm) const {
    std::vector<symbol> syms;
    for (std::size_t pos = 0; pos < norm.size();) {
      const std::string_view rest = norm.substr(pos);
      std::size_t len = match_user_defined(rest);
      const bool frozen = len > 0;
      if (!frozen) {
        const auto r = utf8::scan(rest);
        len = r.state == utf8::status::valid ? r.length : 1;  // a bad byte stands alone
      }
      const auto idx = static_cast<std::int32_t>(syms.size());
      syms.push_back({pos, len, idx - 1, idx + 1, frozen});
      pos += len;
    }
    if (!syms.empty()) syms.back().next = -1;
    return syms;
  }

  void push_candidate(std::string_view norm, const std::vector<symbol>& syms, std::int32_t left, std::int32_t right,
                      candidate_queue& queue) const {
    if (left < 0 || right < 0) return;
    const symbol& l = syms[static_cast<std::size_t>(left)];
    const symbol& r = syms[static_cast<std::size_t>(right)];
    if (l.frozen || r.frozen || l.size + r.size > max_piece_size_) return;
    const std::string_view merged = norm.substr(l.begin, l.size + r.size);
    const auto it = mergeable_.find(merged);
    if (it == mergeable_.end()) return;
    queue.push({v_.scores[static_cast<std::size_t>(it->second)], left, right, merged.size(), it->second});
  }

  void merge_pairs(std::string_view norm, std::vector<symbol>& syms, rev_merge_map& rev) const {
    candidate_queue queue;
    for (std::size_t i = 1; i < syms.size(); ++i) {
      push_candidate(norm, syms, static_cast<std::int32_t>(i - 1), static_cast<std::int32_t>(i), queue);
    }
    while (!queue.empty()) {
      const candidate c = queue.top();
      queue.pop();
      symbol& l = syms[static_cast<std::size_t>(c.left)];
      symbol& r = syms[static_cast<std::size_t>(c.right)];
      // Stale if either side was merged away or grew since the candidate was pushed.
      if (l.size == 0 || r.size == 0 || l.next != c.right || l.size + r.size != c.size) continue;
      if (type(c.id) == spm_token_type::unused) {
        rev[norm.substr(l.begin, c.size)] = {norm.substr(l.begin, l.size), norm.substr(r.begin, r.size)};
      }
      l.size += r.size;
      l.next = r.next;
      if (r.next >= 0) syms[static_cast<std::size_t>(r.next)].prev = c.left;
      r.size = 0;
      push_candidate(norm, syms, l.prev, c.left, queue);
      push_candidate(norm, syms, c.left, l.next, queue);
    }
  }

  // Emits a final symbol: its piece, or what formed it if that piece is unused, or its bytes.
  void emit(std::string_view text, const rev_merge_map& rev, std::vector<token_id>& out) const {
    const auto it = mergeable_.find(text);
    if (it != mergeable_.end() && type(it->second) != spm_token_type::unused) {
      out.push_back(it->second);
      return;
    }
    if (const auto r = rev.find(text); r != rev.end()) {
      emit(r->second.first, rev, out);
      emit(r->second.second, rev, out);
      return;
    }
    if (!has_byte_fallback()) {
      out.push_back(v_.unk);  // validated to exist when there are no byte tokens
      return;
    }
    for (char c : text) out.push_back(byte_ids_[static_cast<unsigned char>(c)]);
  }

  // Appends a piece with "▁" turned back into spaces, dropping a leading one if asked.
  static void append_piece_text(std::string& out, std::string_view p, bool drop_leading_space) {
    if (drop_leading_space && p.starts_with(detail::spm_space)) p.remove_prefix(detail::spm_space.size());
    for (std::size_t pos; (pos = p.find(detail::spm_space)) != std::string_view::npos;) {
      out.append(p.substr(0, pos));
      out.push_back(' ');
      p.remove_prefix(pos + detail::spm_space.size());
    }
    out.append(p);
  }

  spm_vocab v_;
  std::unordered_map<std::string, token_id, detail::transparent_string_hash, std::equal_to<>> mergeable_;
  std::array<token_id, 256> byte_ids_{};
  std::vector<std::size_t> user_defined_sizes_;  // distinct lengths, longest first
  std::size_t max_piece_size_ = 0;
};

// Turns generated tokens into printable text one token at a time. Output is always valid UTF-8:
// bytes of a character split across byte-fallback tokens are held until it is complete, bytes
// that can never form a character become U+FFFD. For valid output, the concatenation of all
// push() results and flush() equals tokenizer.decode() of the same ids.
class stream_decoder {
 public:
  explicit stream_decoder(const spm_tokenizer& tokenizer) : tok_(&tokenizer) {}

  std::string push(token_id id) {
    tok_->append_token_text(pending_.buffer(), id, at_start_);
    return pending_.take();
  }

  // Returns the held bytes of an unfinished character (as U+FFFD) and empties the buffer.
  std::string flush() { return pending_.flush(); }

  // Starts a new text: the next piece's dummy-prefix space is dropped again.
  void reset() {
    pending_.clear();
    at_start_ = true;
  }

  [[nodiscard]] bool has_pending() const noexcept { return !pending_.empty(); }

 private:
  const spm_tokenizer* tok_;
  utf8::holdback pending_;
  bool at_start_ = true;
};

}  // namespace zipage
