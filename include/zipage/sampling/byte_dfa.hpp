#pragma once
// What every structured-output guide is built on: the vocabulary as bytes in trie order (guide_vocabulary), a DFA
// over bytes (byte_dfa: a regex's, or one rule's of a pushdown grammar, whose states may also call other rules), and
// the tokens allowed at a step as the shorter list (guide_tokens). guided.hpp compiles constraints to these.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zipage/core/types.hpp"

namespace zipage {

// Each token id's bytes, sorted so that a walk over them is a walk over the vocabulary's byte trie. A token
// with no bytes (special, control, unknown) is never allowed by a guide. Built once per tokenizer; immutable.
class guide_vocabulary {
 public:
  explicit guide_vocabulary(std::vector<std::string> bytes) : bytes_(std::move(bytes)) {
    for (std::size_t i = 0; i < bytes_.size(); ++i)
      if (!bytes_[i].empty()) order_.push_back(static_cast<token_id>(i));
    std::sort(order_.begin(), order_.end(), [&](token_id a, token_id b) { return bytes_of(a) < bytes_of(b); });
    lcp_.resize(order_.size(), 0);
    for (std::size_t i = 1; i < order_.size(); ++i) {
      const std::string &a = bytes_of(order_[i - 1]), &b = bytes_of(order_[i]);
      std::size_t n = 0;
      while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
      lcp_[i] = static_cast<std::uint32_t>(n);
    }
  }
  // From a tokenizer: `bytes_of(id)` gives the bytes a token adds to the output text ("" = none).
  template <class BytesOf>
  [[nodiscard]] static std::shared_ptr<const guide_vocabulary> make(std::int32_t vocab, BytesOf&& bytes_of) {
    std::vector<std::string> bytes(static_cast<std::size_t>(std::max(vocab, 0)));
    for (std::int32_t i = 0; i < vocab; ++i) bytes[static_cast<std::size_t>(i)] = bytes_of(static_cast<token_id>(i));
    return std::make_shared<const guide_vocabulary>(std::move(bytes));
  }

  [[nodiscard]] std::int32_t size() const { return static_cast<std::int32_t>(bytes_.size()); }
  // The token's bytes; "" for a token a guide never allows or an id outside the vocabulary.
  [[nodiscard]] const std::string& bytes_of(token_id id) const {
    static const std::string none;
    return id >= 0 && static_cast<std::size_t>(id) < bytes_.size() ? bytes_[static_cast<std::size_t>(id)] : none;
  }
  // Tokens with bytes, in byte order, and each one's common prefix length with the one before.
  [[nodiscard]] const std::vector<token_id>& sorted() const { return order_; }
  [[nodiscard]] const std::vector<std::uint32_t>& lcp() const { return lcp_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<token_id> order_;
  std::vector<std::uint32_t> lcp_;
};

// A DFA over bytes whose every state can still reach an accepting one (transitions into dead states are -1). As one
// rule of a pushdown grammar (pushdown.hpp) a state may also call other rules: on `calls` edge {rule, to} the rule's
// text is matched (its own DFA, from its start to an accepting state), then this DFA goes on from `to`. A plain
// DFA (a regex's) has no calls: `calls` is empty.
struct byte_dfa {
  struct range {
    std::uint8_t lo, hi;
    std::int32_t to;
  };
  struct call_edge {
    std::int32_t rule, to;
    friend bool operator==(const call_edge&, const call_edge&) = default;
  };
  std::vector<std::vector<range>> edges;  // per state, sorted disjoint byte ranges
  std::vector<std::uint8_t> accepting;
  std::vector<std::vector<call_edge>> calls;  // per state (or empty: no state calls), by rule
  static constexpr std::int32_t start = 0;

  [[nodiscard]] bool has_calls() const { return !calls.empty(); }
  [[nodiscard]] std::span<const call_edge> calls_of(std::int32_t s) const {
    if (calls.empty()) return {};
    return calls[static_cast<std::size_t>(s)];
  }

  [[nodiscard]] std::int32_t size() const { return static_cast<std::int32_t>(edges.size()); }
  [[nodiscard]] std::int32_t next(std::int32_t s, unsigned char b) const {
    for (const range& r : edges[static_cast<std::size_t>(s)])
      if (b >= r.lo && b <= r.hi) return r.to;
    return -1;
  }
  [[nodiscard]] bool accepts(std::int32_t s) const { return accepting[static_cast<std::size_t>(s)] != 0; }
  // The state after `text` from `s` (-1 = dead).
  [[nodiscard]] std::int32_t walk(std::int32_t s, std::string_view text) const {
    for (const char c : text) {
      if (s < 0) return -1;
      s = next(s, static_cast<unsigned char>(c));
    }
    return s;
  }
  [[nodiscard]] bool matches(std::string_view text) const {
    const std::int32_t s = walk(start, text);
    return s >= 0 && accepts(s);
  }
};

// The tokens that may follow at a DFA state, as the shorter list: the allowed ids, or (complement) the ids of
// [0, vocabulary size) that are not allowed, when most are (a permissive regex over a large vocabulary). Ascending.
struct guide_tokens {
  bool complement = false;
  std::vector<token_id> ids;

  [[nodiscard]] bool allows(token_id t) const {
    return std::binary_search(ids.begin(), ids.end(), t) != complement;
  }
  // The allowed ids of [0, vocab_size), ascending, whichever form the list has.
  [[nodiscard]] std::vector<token_id> allowed_ids(std::int32_t vocab_size) const {
    if (!complement) return ids;
    std::vector<token_id> out;
    for (token_id t = 0; t < vocab_size; ++t)
      if (allows(t)) out.push_back(t);
    return out;
  }
};

// What may follow a generated text: whether it is still a prefix of a match (alive), whether it is a whole one
// (at_match: EOS may end it), and the tokens that keep it a prefix (null where it is not alive).
struct guide_lookahead {
  bool alive = false;
  bool at_match = false;
  std::shared_ptr<const guide_tokens> next{};
};

}  // namespace zipage
