#pragma once
// A pushdown guide: structured output for grammars with recursion (a GBNF grammar whose rules nest, a JSON schema
// with a recursive $ref, free-form JSON values at any depth), which no DFA can hold exactly.
//
// The grammar (byte_pda) is a set of rules, each a byte_dfa whose states may also call rules (byte_dfa::calls):
// rule 0 is the root. A parse is a stack of frames (rule, state), bottom first; the text so far leaves a set of
// them (the grammar may be ambiguous). Without reading a byte a stack may call (push the called rule at its start,
// the caller's frame moved to the state after the call) or, at an accepting state, return (pop); the root's return
// is the end of a whole match. A byte moves each stack's top frame along its rule's byte edges.
//
// The set of stacks is kept as a graph-structured stack (GLL's: Scott and Johnstone), not one vector per stack: a
// node is a frame that a return resumes, over the nodes below it, and a head is a top frame over a node. An
// ambiguous grammar's stacks share their parts, so k ways to reach a call cost k edges, not k copies of each stack
// above it, and the ways to parse a text (exponentially many for `root ::= "(" root "(" root ")" | "(" root ")" root
// | ""`) stay polynomially many heads and nodes (at most a head per frame and node, a node per frame and position).
//
// Which tokens may follow: the part that depends only on the top frame is computed once per (rule, state) and kept
// (xgrammar's adaptive token mask cache, re-derived): a walk of the vocabulary's byte trie from that frame alone
// sorts each token into accepted (its bytes read within the frame and the calls it makes), rejected, or uncertain
// (some path returns from the frame before the token's last byte, so what follows depends on the frames below).
// At a step only the uncertain tokens are walked with the real stacks. The stacks after a request's last tokens are
// kept (keyed by the tokens' hash) so that the next step reads one token, not the whole text, and the allowed sets
// of the last sets of stacks met (which repeat: along a string, between an object's members; compared by structure).
//
// Bounds: a rule that derives no text, or left recursion (a rule that can call itself before reading a byte:
// rewrite it right-recursively, as llama.cpp requires too), is refused when the grammar is compiled. A stack deeper
// than pushdown_max_depth frames, or past pushdown_max_heads ways to parse (pushdown_max_work offered) at one
// position, is not followed: text nested deeper, or parses past the bound, are not generated.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/types.hpp"
#include "zipage/sampling/byte_dfa.hpp"

namespace zipage {

inline constexpr std::uint32_t pushdown_max_depth = 4096;
inline constexpr std::size_t pushdown_max_heads = 16384;  // ways to parse followed at one position
inline constexpr std::size_t pushdown_max_work = 65536;   // and offered there (returns through shared nodes)

// A grammar with calls: rules[0] is the root, names[r] names rule r in errors.
struct byte_pda {
  std::vector<byte_dfa> rules;
  std::vector<std::string> names;
};

namespace pushdown_detail {

struct frame {
  std::int32_t rule, state;
  friend bool operator==(const frame&, const frame&) = default;  // (spelt out: nvcc's front end wants it)
  friend auto operator<=>(const frame&, const frame&) = default;
};

// splitmix64's finaliser over h and v: the hashes of token sequences and of sets of stacks.
inline std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  std::uint64_t x = h ^ (v + 0x9e3779b97f4a7c15ull);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
inline std::uint64_t frame_key(frame f) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(f.rule)) << 32) | static_cast<std::uint32_t>(f.state);
}

// A node of the graph-structured stack (GLL's, Scott and Johnstone): the frame a return resumes (the caller's rule at
// the state after its call) over every way the caller was reached (`below`, each node standing for the stacks it
// holds). The bottom (resume.rule < 0) is the empty stack. Sharing is what keeps an ambiguous grammar polynomial: N
// ways to reach a call are one node with N edges below it, not N copies of every stack above. Nodes are made while
// one position's stacks are expanded and are not changed after it.
struct gss_node {
  frame resume{-1, -1};
  std::vector<std::shared_ptr<const gss_node>> below;  // sorted by (hash, address) once complete
  std::uint64_t hash = 0;                              // of the stacks it holds: equal stacks, equal hashes
  std::uint32_t depth = 0;                             // frames on its deepest stack
  [[nodiscard]] bool bottom() const { return resume.rule < 0; }

  gss_node() = default;
  gss_node(const gss_node&) = delete;
  gss_node& operator=(const gss_node&) = delete;
  // A chain thousands of frames deep is released in a loop: the default would recurse once per frame.
  ~gss_node() {
    std::vector<std::shared_ptr<const gss_node>> drop = std::move(below);
    while (!drop.empty()) {
      std::shared_ptr<const gss_node> n = std::move(drop.back());
      drop.pop_back();
      if (n.use_count() == 1) {  // the last owner: take its edges before it goes (made non-const: make_shared)
        auto& edges = const_cast<gss_node&>(*n).below;
        for (auto& e : edges) drop.push_back(std::move(e));
        edges.clear();
      }
    }
  }
};
using node_ptr = std::shared_ptr<const gss_node>;

// The empty stack (one for all guides: it holds nothing).
inline const node_ptr& bottom_node() {
  static const node_ptr b = [] {
    auto n = std::make_shared<gss_node>();
    n->hash = 0x452821e638d01377ull;
    return n;
  }();
  return b;
}

// One way to parse the text so far: `top`, a rule's frame, over the stacks of `node`.
struct head {
  frame top;
  node_ptr node;
};

// Whether two nodes hold the same stacks (by structure, so nodes made at different places compare equal). Sound:
// true only when they do; two equal nodes whose edges tie on hash may read as different (a cache miss, no more).
inline bool same_stacks(const gss_node* a, const gss_node* b) {
  std::vector<std::pair<const gss_node*, const gss_node*>> todo{{a, b}};
  std::set<std::pair<const gss_node*, const gss_node*>> done;
  while (!todo.empty()) {
    const auto [x, y] = todo.back();
    todo.pop_back();
    if (x == y) continue;
    if (x->hash != y->hash || x->resume != y->resume || x->below.size() != y->below.size()) return false;
    if (!done.emplace(x, y).second) continue;
    for (std::size_t i = 0; i < x->below.size(); ++i) todo.emplace_back(x->below[i].get(), y->below[i].get());
  }
  return true;
}

// The ways to parse some text, each with a byte edge at its top frame (heads that can only call or return are
// expanded away), and whether the bottom frame returned on the way (at the root: the text so far is a whole match).
struct config {
  std::vector<head> heads;  // sorted by (top, node hash, node address); no two hold the same stacks
  bool bottom_returned = false;
  [[nodiscard]] bool empty() const { return heads.empty() && !bottom_returned; }
  friend bool operator==(const config& a, const config& b) {
    if (a.bottom_returned != b.bottom_returned || a.heads.size() != b.heads.size()) return false;
    for (std::size_t i = 0; i < a.heads.size(); ++i)
      if (a.heads[i].top != b.heads[i].top || !same_stacks(a.heads[i].node.get(), b.heads[i].node.get()))
        return false;
    return true;
  }
};

struct config_hash {
  std::size_t operator()(const config& c) const {
    std::uint64_t h = c.bottom_returned ? 1 : 0;
    for (const head& x : c.heads) h = mix(mix(h, frame_key(x.top)), x.node->hash);
    return static_cast<std::size_t>(h);
  }
};

// A map that keeps its `capacity` most recently used entries. Not thread-safe (the guide locks around it).
template <class Key, class Value, class Hash>
class lru_map {
 public:
  explicit lru_map(std::size_t capacity) : capacity_(capacity) {}
  // The value of `k` (made the most recently used), or null.
  const Value* find(const Key& k) {
    const auto it = index_.find(k);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }
  // Keeps `v` for `k` unless `k` is kept already; the least recently used go beyond the capacity.
  void insert(const Key& k, Value v) {
    if (index_.contains(k)) return;
    order_.emplace_front(k, std::move(v));
    index_.emplace(k, order_.begin());
    while (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }
  template <class F>
  void for_each(F&& f) const {
    for (const auto& [k, v] : order_) f(k, v);
  }

 private:
  std::size_t capacity_;
  std::list<std::pair<Key, Value>> order_;  // most recently used first
  std::unordered_map<Key, typename std::list<std::pair<Key, Value>>::iterator, Hash> index_;
};

// For each rule, whether it derives some text through `passable` moves: its byte edges where `bytes`, and calls of
// the rules found so far (a least fixpoint). bytes = false: the rules that derive the empty text (nullable);
// true: those that derive some finite text (productive).
inline std::vector<std::uint8_t> rules_deriving(const byte_pda& g, bool bytes) {
  std::vector<std::uint8_t> found(g.rules.size(), 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t r = 0; r < g.rules.size(); ++r) {
      if (found[r]) continue;
      const byte_dfa& d = g.rules[r];
      std::vector<std::uint8_t> seen(static_cast<std::size_t>(d.size()), 0);
      std::vector<std::int32_t> todo{byte_dfa::start};
      seen[0] = 1;
      const auto visit = [&](std::int32_t t) {
        if (!seen[static_cast<std::size_t>(t)]) {
          seen[static_cast<std::size_t>(t)] = 1;
          todo.push_back(t);
        }
      };
      while (!todo.empty() && !found[r]) {
        const std::int32_t s = todo.back();
        todo.pop_back();
        if (d.accepts(s)) found[r] = 1;
        if (bytes)
          for (const byte_dfa::range& e : d.edges[static_cast<std::size_t>(s)]) visit(e.to);
        for (const byte_dfa::call_edge& e : d.calls_of(s))
          if (found[static_cast<std::size_t>(e.rule)]) visit(e.to);
      }
      changed = changed || found[r];
    }
  }
  return found;
}
inline std::vector<std::uint8_t> nullable_rules(const byte_pda& g) { return rules_deriving(g, false); }
inline std::vector<std::uint8_t> productive_rules(const byte_pda& g) { return rules_deriving(g, true); }

// The rules each rule may call before reading a byte (through calls of nullable rules).
inline std::vector<std::vector<std::int32_t>> left_calls(const byte_pda& g, const std::vector<std::uint8_t>& nullable) {
  std::vector<std::vector<std::int32_t>> out(g.rules.size());
  for (std::size_t r = 0; r < g.rules.size(); ++r) {
    const byte_dfa& d = g.rules[r];
    std::vector<std::uint8_t> seen(static_cast<std::size_t>(d.size()), 0);
    std::vector<std::int32_t> todo{byte_dfa::start};
    seen[0] = 1;
    while (!todo.empty()) {
      const std::int32_t s = todo.back();
      todo.pop_back();
      for (const byte_dfa::call_edge& e : d.calls_of(s)) {
        out[r].push_back(e.rule);
        if (nullable[static_cast<std::size_t>(e.rule)] && !seen[static_cast<std::size_t>(e.to)]) {
          seen[static_cast<std::size_t>(e.to)] = 1;
          todo.push_back(e.to);
        }
      }
    }
    std::sort(out[r].begin(), out[r].end());
    out[r].erase(std::unique(out[r].begin(), out[r].end()), out[r].end());
  }
  return out;
}

// Every head reachable from `seeds` by calls and returns (GLL's loop over descriptors), those with a byte edge at the
// top kept; a return of the bottom frame is noted. The nodes made here (one per frame a return resumes) collect their
// edges below as the callers come; a node whose callee has returned already also resumes every caller that comes
// later (a nullable rule called again). A node deeper than pushdown_max_depth frames, or heads past
// pushdown_max_heads (or offered past pushdown_max_work) in one expansion: not followed. The bounds matter only for
// grammars ambiguous without limit (`a ::= "x" a | "x" a a | ""`: every earlier position's call may return at each
// "x", so an exact expansion grows with the text, as Earley's parser's does); they keep a step's cost bounded.
[[nodiscard]] inline config expanded(const byte_pda& g, std::vector<head> seeds) {
  struct made_node {
    std::shared_ptr<gss_node> node;
    bool returned = false;  // its callee returned at this position
    bool done = false;      // hash, depth and order below computed
  };
  std::map<frame, made_node> made;                             // this position's nodes, by the frame they resume
  std::unordered_map<const gss_node*, made_node*> made_here;   // the same, by address
  std::set<std::pair<const gss_node*, const gss_node*>> edges;  // (node made here, node below)
  std::set<std::pair<frame, const gss_node*>> seen;
  config out;
  std::vector<head> todo = std::move(seeds);
  std::size_t work = todo.size();  // heads offered: at most pushdown_max_work, then the rest is not followed
  const auto queue = [&](frame f, const node_ptr& n) {
    if (work >= pushdown_max_work) return;
    ++work;
    if (!seen.contains({f, n.get()})) todo.push_back({f, n});
  };
  while (!todo.empty() && seen.size() < pushdown_max_heads) {
    head h = std::move(todo.back());
    todo.pop_back();
    if (!seen.emplace(h.top, h.node.get()).second) continue;
    const byte_dfa& d = g.rules[static_cast<std::size_t>(h.top.rule)];
    if (!d.edges[static_cast<std::size_t>(h.top.state)].empty()) out.heads.push_back(h);
    if (h.node->depth < pushdown_max_depth) {
      for (const byte_dfa::call_edge& e : d.calls_of(h.top.state)) {
        const frame resume{h.top.rule, e.to};
        auto [it, fresh] = made.try_emplace(resume);
        made_node& m = it->second;
        if (fresh) {
          m.node = std::make_shared<gss_node>();
          m.node->resume = resume;
          made_here.emplace(m.node.get(), &m);
        }
        if (edges.emplace(m.node.get(), h.node.get()).second) {
          m.node->below.push_back(h.node);
          m.node->depth = std::max(m.node->depth, h.node->depth + 1);
          if (m.returned) queue(resume, h.node);
        }
        queue({e.rule, byte_dfa::start}, m.node);  // (a node may resume after calls of several rules)
      }
    }
    if (d.accepts(h.top.state)) {
      if (h.node->bottom()) {
        out.bottom_returned = true;
      } else {
        if (const auto it = made_here.find(h.node.get()); it != made_here.end()) it->second->returned = true;
        for (const node_ptr& u : h.node->below) queue(h.node->resume, u);
      }
    }
  }
  // Complete this position's nodes: hash and depth from the nodes below (those made here first: a node made here
  // stands over others made here only through calls made before any byte was read, which check_pushdown bounds by
  // the rules' count, so the recursion is shallow).
  const auto complete = [&](const auto& self, made_node& m) -> void {
    if (m.done) return;
    m.done = true;
    gss_node& n = *m.node;
    for (const node_ptr& u : n.below)
      if (const auto it = made_here.find(u.get()); it != made_here.end()) self(self, *it->second);
    std::uint64_t sum = 0;
    for (const node_ptr& u : n.below) {
      sum += mix(0x13198a2e03707344ull, u->hash);  // order-free: equal sets of edges, equal sums
      n.depth = std::max(n.depth, u->depth + 1);
    }
    n.hash = mix(mix(frame_key(n.resume), sum), n.below.size());
    std::sort(n.below.begin(), n.below.end(), [](const node_ptr& a, const node_ptr& b) {
      return a->hash != b->hash ? a->hash < b->hash : std::less<const gss_node*>{}(a.get(), b.get());
    });
  };
  for (auto& [f, m] : made) complete(complete, m);
  std::sort(out.heads.begin(), out.heads.end(), [](const head& a, const head& b) {
    if (a.top != b.top) return a.top < b.top;
    if (a.node->hash != b.node->hash) return a.node->hash < b.node->hash;
    return std::less<const gss_node*>{}(a.node.get(), b.node.get());
  });
  out.heads.erase(std::unique(out.heads.begin(), out.heads.end(),
                              [](const head& a, const head& b) {
                                return a.top == b.top && same_stacks(a.node.get(), b.node.get());
                              }),
                  out.heads.end());
  return out;
}

// The heads after one more byte (a return of the bottom before it ends the text: nothing follows it).
[[nodiscard]] inline config step(const byte_pda& g, const config& c, unsigned char b) {
  std::vector<head> seeds;
  for (const head& h : c.heads) {
    const std::int32_t t = g.rules[static_cast<std::size_t>(h.top.rule)].next(h.top.state, b);
    if (t >= 0) seeds.push_back({{h.top.rule, t}, h.node});
  }
  if (seeds.empty()) return {};
  if (seeds.size() == 1) {  // the common case, a byte within a rule: nothing to call or return, nothing to expand
    const frame top = seeds[0].top;
    const byte_dfa& d = g.rules[static_cast<std::size_t>(top.rule)];
    if (d.calls_of(top.state).empty() && !d.accepts(top.state)) return config{std::move(seeds), false};
  }
  return expanded(g, std::move(seeds));
}
// The heads at the start of `g`: its root rule's frame over the empty stack, expanded.
[[nodiscard]] inline config start(const byte_pda& g) {
  return expanded(g, {head{{0, byte_dfa::start}, bottom_node()}});
}

// The stacks after `bytes` from `c`: empty where they leave the language (the root's return ends the text: no
// byte may follow it).
[[nodiscard]] inline config read(const byte_pda& g, config c, std::string_view bytes) {
  for (const char b : bytes) {
    if (c.heads.empty()) return {};
    c = step(g, c, static_cast<unsigned char>(b));
  }
  return c;
}

}  // namespace pushdown_detail

// Throws zipage::error naming `what` and the rule for a grammar a pushdown guide cannot follow: no rules, a call of
// no rule, a rule that derives no text, or left recursion.
inline void check_pushdown(const byte_pda& g, const std::string& what) {
  check(!g.rules.empty() && g.names.size() == g.rules.size(), what, ": a pushdown grammar needs rules, each named");
  for (std::size_t r = 0; r < g.rules.size(); ++r) {
    const byte_dfa& d = g.rules[r];
    check(d.size() > 0, what, ": the rule '", g.names[r], "' matches no text");
    check(d.calls.empty() || d.calls.size() == d.edges.size(), what, ": the rule '", g.names[r], "' is malformed");
    for (std::int32_t s = 0; s < d.size(); ++s)
      for (const byte_dfa::call_edge& e : d.calls_of(s))
        check(e.rule >= 0 && static_cast<std::size_t>(e.rule) < g.rules.size() && e.to >= 0 && e.to < d.size(),
              what, ": the rule '", g.names[r], "' calls a rule or state that does not exist");
  }
  const auto productive = pushdown_detail::productive_rules(g);
  for (std::size_t r = 0; r < g.rules.size(); ++r)
    check(productive[r] != 0, what, ": the rule '", g.names[r], "' derives no finite text (it only recurses)");
  // Left recursion: a cycle among the rules' calls made before any byte is read (a depth-first search).
  const auto left = pushdown_detail::left_calls(g, pushdown_detail::nullable_rules(g));
  std::vector<std::uint8_t> mark(g.rules.size(), 0);  // 1: on the search's path, 2: done
  const auto visit = [&](const auto& self, std::size_t r) -> void {
    mark[r] = 1;
    for (const std::int32_t c : left[r]) {
      const auto k = static_cast<std::size_t>(c);
      check(mark[k] != 1, what, ": left recursion: the rule '", g.names[k], "' can call itself before reading ",
            "any text (write the recursion on the right, e.g. x ::= item x?, as llama.cpp requires)");
      if (mark[k] == 0) self(self, k);
    }
    mark[r] = 2;
  };
  for (std::size_t r = 0; r < g.rules.size(); ++r)
    if (mark[r] == 0) visit(visit, r);
}

// The stacks after `text` from the start of `g` (a checked grammar): empty where the text left the language;
// bottom_returned where it is a whole match.
[[nodiscard]] inline pushdown_detail::config pushdown_after(const byte_pda& g, std::string_view text) {
  return pushdown_detail::read(g, pushdown_detail::start(g), text);
}
// Whether `g` (a checked grammar) derives `text` whole.
[[nodiscard]] inline bool pushdown_matches(const byte_pda& g, std::string_view text) {
  return pushdown_after(g, text).bottom_returned;
}

// A guide over a pushdown grammar for one vocabulary (see the top of this file). Thread-safe.
class pushdown_guide {
 public:
  using config = pushdown_detail::config;
  // The sets of stacks kept for the next steps (a request's last; each ~ a KB): more requests than this at once on
  // one guide read their whole text again at a step.
  static constexpr std::size_t max_cursors = 4096;
  static constexpr std::size_t max_masks = 256;  // the allowed sets kept, by the stacks they follow

  // What may follow a text: alive (a prefix of some derivation), at_match (a whole one), the tokens allowed next.
  using lookahead_result = guide_lookahead;

  pushdown_guide(byte_pda g, std::shared_ptr<const guide_vocabulary> vocab, const std::string& what = "the grammar")
      : g_(std::move(g)), vocab_(std::move(vocab)) {
    check(vocab_ != nullptr, "guide: no vocabulary");
    check_pushdown(g_, what);
    words_ = (static_cast<std::size_t>(vocab_->size()) + 63) / 64;
    start_ = pushdown_detail::start(g_);
  }

  [[nodiscard]] const byte_pda& grammar() const { return g_; }
  [[nodiscard]] const guide_vocabulary& vocabulary() const { return *vocab_; }

  // After the generated tokens: whether the text is still a prefix of a match, whether it is one, and the tokens
  // that keep it a prefix (none where it is not). The previous step's result is found by the tokens' hash, so a
  // request's step reads one token.
  [[nodiscard]] lookahead_result lookahead(std::span<const token_id> generated) const {
    std::uint64_t h = hash_seed, h_prev = hash_seed;
    for (const token_id t : generated) {
      h_prev = h;
      h = pushdown_detail::mix(h, static_cast<std::uint32_t>(t));
    }
    const key k{generated.size(), h};
    std::shared_ptr<const config> cur, prev;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (const auto* c = cursors_.find(k)) cur = *c;
      else if (!generated.empty())
        if (const auto* p = cursors_.find({generated.size() - 1, h_prev})) prev = *p;
    }
    if (!cur) {
      config made;
      if (prev) {
        made = after_token(*prev, generated.back());
      } else {
        made = start_;
        for (const token_id t : generated) {
          made = after_token(made, t);
          if (made.empty()) break;
        }
      }
      cur = std::make_shared<const config>(std::move(made));
      const std::lock_guard<std::mutex> lock(mutex_);
      cursors_.insert(k, cur);
    }
    lookahead_result out;
    out.alive = !cur->empty();
    out.at_match = cur->bottom_returned;
    if (out.alive) out.next = allowed_cached(*cur);
    return out;
  }

  // The bytes the per-frame token sets and the kept stacks hold.
  [[nodiscard]] std::size_t memo_bytes() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    std::size_t n = 0;
    for (const auto& [f, m] : frame_memo_)
      n += m.accepted.capacity() * sizeof(std::uint64_t) + m.uncertain.capacity() * sizeof(token_id);
    cursors_.for_each([&](const key&, const std::shared_ptr<const config>& c) {  // (not the shared nodes below)
      n += c->heads.capacity() * sizeof(pushdown_detail::head);
    });
    masks_.for_each([&](const config&, const std::shared_ptr<const guide_tokens>& m) {
      n += m->ids.capacity() * sizeof(token_id);
    });
    return n;
  }

 private:
  using frame = pushdown_detail::frame;
  struct key {
    std::size_t length;
    std::uint64_t hash;
    friend bool operator==(const key&, const key&) = default;
  };
  struct key_hash {
    std::size_t operator()(const key& k) const { return static_cast<std::size_t>(k.hash ^ (k.length * 0x9e37u)); }
  };
  // The tokens a frame alone decides: accepted (a bit per id), and those that depend on the frames below (trie order).
  struct frame_tokens {
    std::vector<std::uint64_t> accepted;
    std::vector<token_id> uncertain;
  };
  static constexpr std::uint64_t hash_seed = 0x243f6a8885a308d3ull;

  [[nodiscard]] config expanded(std::vector<pushdown_detail::head> seeds) const {
    return pushdown_detail::expanded(g_, std::move(seeds));
  }
  [[nodiscard]] config step(const config& c, unsigned char b) const { return pushdown_detail::step(g_, c, b); }
  [[nodiscard]] config after_token(const config& c, token_id t) const {
    const std::string& b = vocab_->bytes_of(t);
    return b.empty() ? config{} : pushdown_detail::read(g_, c, b);
  }

  // Walks `tokens` (ids in trie order) from `start`, reading each token's bytes after the shared prefix with the one
  // before, and calls `visit(token)` for every token whose bytes all leave something alive (a stack, or the bottom's
  // return right after the last byte). A dead prefix skips the tokens that share it.
  template <class Visit>
  void walk(std::span<const token_id> tokens, const config& start, Visit&& visit) const {
    std::vector<config> st{start};
    std::string_view prev;
    for (std::size_t i = 0; i < tokens.size();) {
      const std::string& b = vocab_->bytes_of(tokens[i]);
      std::size_t l = 0;
      while (l < prev.size() && l < b.size() && prev[l] == b[l]) ++l;
      prev = b;
      l = std::min(l, st.size() - 1);
      st.resize(l + 1);
      std::size_t dead_at = 0;  // > 0: died after that many bytes
      for (std::size_t d = l; d < b.size(); ++d) {
        config n = step(st[d], static_cast<unsigned char>(b[d]));
        if (n.empty()) {
          dead_at = d + 1;
          break;
        }
        st.push_back(std::move(n));
      }
      if (dead_at == 0) {
        visit(tokens[i++]);
        continue;
      }
      // The tokens after it that share the dead prefix are next to it (byte order): skipped by a binary search (a
      // dead first byte skips thousands of a large vocabulary's tokens at once).
      const std::string_view dead = std::string_view(b).substr(0, dead_at);
      const auto shares = [&](token_id t) { return std::string_view(vocab_->bytes_of(t)).starts_with(dead); };
      ++i;
      if (i < tokens.size() && shares(tokens[i]))
        i = static_cast<std::size_t>(std::partition_point(tokens.begin() + static_cast<std::ptrdiff_t>(i),
                                                          tokens.end(), shares) -
                                     tokens.begin());
    }
  }

  // The tokens frame `f` decides alone (memoised): read from a stack of that frame only, whose return is noted.
  const frame_tokens& tokens_of(frame f) const {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (auto it = frame_memo_.find(f); it != frame_memo_.end()) return it->second;
    }
    frame_tokens m;
    m.accepted.assign(words_, 0);
    sort_tokens(expanded({{f, pushdown_detail::bottom_node()}}), m);
    const std::lock_guard<std::mutex> lock(mutex_);
    return frame_memo_.try_emplace(f, std::move(m)).first->second;  // (std::map: references stay valid)
  }

  // One walk of the vocabulary's trie from a frame alone (`start`). Accepted: read whole on a path inside the frame,
  // or returning from it right after the last byte (the frames below go on from a live state, whatever they are).
  // Uncertain: not accepted, but the frame may return before the last byte (the empty prefix included): the frames
  // below decide. Rejected: the rest.
  void sort_tokens(const config& start, frame_tokens& m) const {
    const auto& order = vocab_->sorted();
    const auto& lcp = vocab_->lcp();
    std::vector<config> st{start};                     // st[d]: after the current token's first d bytes
    std::vector<std::uint8_t> ret{start.bottom_returned};  // ret[d]: the frame returned after at most d bytes
    std::size_t dead_at = 0;  // > 0: the previous token's walk died after dead_at bytes
    for (std::size_t i = 0; i < order.size(); ++i) {
      const token_id id = order[i];
      const std::size_t l = lcp[i];
      if (dead_at > 0 && l >= dead_at) {  // shares the dead prefix: as the token before
        if (ret[dead_at - 1]) m.uncertain.push_back(id);
        continue;
      }
      dead_at = 0;
      const std::string& b = vocab_->bytes_of(id);
      st.resize(l + 1);
      ret.resize(l + 1);
      for (std::size_t d = l; d < b.size(); ++d) {
        config n = step(st[d], static_cast<unsigned char>(b[d]));
        if (n.empty()) {
          dead_at = d + 1;
          break;
        }
        ret.push_back(ret[d] || n.bottom_returned);
        st.push_back(std::move(n));
      }
      if (dead_at == 0) set_bit(m.accepted, id);
      else if (ret[dead_at - 1]) m.uncertain.push_back(id);
    }
  }

  // allowed(c), kept for the last max_masks sets of stacks met (a text's stacks repeat: inside a string, between
  // the members of an object, along a number's digits).
  [[nodiscard]] std::shared_ptr<const guide_tokens> allowed_cached(const config& c) const {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (const auto* m = masks_.find(c)) return *m;
    }
    auto mask = allowed(c);
    const std::lock_guard<std::mutex> lock(mutex_);
    masks_.insert(c, mask);
    return mask;
  }

  // The tokens allowed after `c`: what its top frames accept alone, and their uncertain tokens walked with the
  // real stacks.
  [[nodiscard]] std::shared_ptr<const guide_tokens> allowed(const config& c) const {
    std::vector<std::uint64_t> bits(words_, 0);
    std::vector<const frame_tokens*> tops;
    frame last{-1, -1};
    for (const pushdown_detail::head& h : c.heads) {  // sorted by top: equal tops adjacent
      if (h.top == last) continue;
      last = h.top;
      tops.push_back(&tokens_of(last));
      for (std::size_t w = 0; w < words_; ++w) bits[w] |= tops.back()->accepted[w];
    }
    std::vector<token_id> uncertain;
    if (tops.size() == 1) {  // in trie order already
      uncertain = tops[0]->uncertain;
    } else {  // several frames' lists merged into trie order: by a bit per token, not a sort of them all
      std::vector<std::uint64_t> any(words_, 0);
      std::size_t n = 0;
      for (const frame_tokens* m : tops) {
        for (const token_id t : m->uncertain) set_bit(any, t);
        n = std::max(n, m->uncertain.size());
      }
      uncertain.reserve(n);
      for (const token_id t : vocab_->sorted())
        if (test_bit(any, t)) uncertain.push_back(t);
    }
    std::erase_if(uncertain, [&](token_id t) { return test_bit(bits, t); });
    walk(uncertain, c, [&](token_id id) { set_bit(bits, id); });
    auto out = std::make_shared<guide_tokens>();
    std::size_t count = 0;
    for (const std::uint64_t w : bits) count += static_cast<std::size_t>(std::popcount(w));
    out->complement = count * 2 > static_cast<std::size_t>(vocab_->size());
    for (token_id t = 0; t < vocab_->size(); ++t)
      if (test_bit(bits, t) != out->complement) out->ids.push_back(t);
    return out;
  }

  static void set_bit(std::vector<std::uint64_t>& bits, token_id t) {
    bits[static_cast<std::size_t>(t) / 64] |= std::uint64_t{1} << (static_cast<unsigned>(t) % 64);
  }
  static bool test_bit(const std::vector<std::uint64_t>& bits, token_id t) {
    return (bits[static_cast<std::size_t>(t) / 64] >> (static_cast<unsigned>(t) % 64)) & 1u;
  }

  byte_pda g_;
  std::shared_ptr<const guide_vocabulary> vocab_;
  std::size_t words_ = 0;
  config start_;
  mutable std::mutex mutex_;
  mutable std::map<frame, frame_tokens> frame_memo_;
  // A request's stacks after its tokens (by their count and hash), and the allowed sets by the stacks they follow.
  mutable pushdown_detail::lru_map<key, std::shared_ptr<const config>, key_hash> cursors_{max_cursors};
  mutable pushdown_detail::lru_map<config, std::shared_ptr<const guide_tokens>, pushdown_detail::config_hash> masks_{
      max_masks};
};

}  // namespace zipage
