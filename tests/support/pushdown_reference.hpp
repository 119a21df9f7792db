#pragma once
// The pushdown guide's parse, done the plain way for the tests: every stack a vector of frames, each kept apart (no
// sharing, exponential in an ambiguous grammar's ways to parse), against which the guide's graph-structured stack
// (zipage/sampling/pushdown.hpp) is compared. `exact` is false where the reference gave up (more than `max_stacks`
// stacks or a stack deeper than `max_depth`): its answer is then no oracle.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "zipage/sampling/pushdown.hpp"

namespace zipage_test {

struct reference_stacks {
  using frame = zipage::pushdown_detail::frame;
  using stack = std::vector<frame>;  // bottom first
  std::vector<stack> stacks;         // each with a byte edge at its top; sorted, unique
  bool bottom_returned = false;
  bool exact = true;
  [[nodiscard]] bool empty() const { return stacks.empty() && !bottom_returned; }
};

// Every stack reachable from `seeds` by calls and returns, those with a byte edge at the top kept.
inline reference_stacks reference_expanded(const zipage::byte_pda& g, std::vector<reference_stacks::stack> seeds,
                                           std::size_t max_stacks = 4096, std::size_t max_depth = 256) {
  using zipage::byte_dfa;
  reference_stacks out;
  std::set<reference_stacks::stack> seen;
  std::vector<reference_stacks::stack> todo = std::move(seeds);
  while (!todo.empty()) {
    reference_stacks::stack s = std::move(todo.back());
    todo.pop_back();
    if (!seen.insert(s).second) continue;
    if (seen.size() > max_stacks * 4) {
      out.exact = false;
      break;
    }
    const auto top = s.back();
    const byte_dfa& d = g.rules[static_cast<std::size_t>(top.rule)];
    if (!d.edges[static_cast<std::size_t>(top.state)].empty()) out.stacks.push_back(s);
    for (const byte_dfa::call_edge& e : d.calls_of(top.state)) {
      if (s.size() >= max_depth) {
        out.exact = false;
        break;
      }
      reference_stacks::stack t = s;
      t.back().state = e.to;
      t.push_back({e.rule, byte_dfa::start});
      todo.push_back(std::move(t));
    }
    if (d.accepts(top.state)) {
      if (s.size() == 1) {
        out.bottom_returned = true;
      } else {
        s.pop_back();
        todo.push_back(std::move(s));
      }
    }
  }
  if (out.stacks.size() > max_stacks) out.exact = false;
  std::sort(out.stacks.begin(), out.stacks.end());
  return out;
}

inline reference_stacks reference_step(const zipage::byte_pda& g, const reference_stacks& c, unsigned char b) {
  std::vector<reference_stacks::stack> seeds;
  for (const auto& s : c.stacks) {
    const auto top = s.back();
    const std::int32_t t = g.rules[static_cast<std::size_t>(top.rule)].next(top.state, b);
    if (t < 0) continue;
    seeds.push_back(s);
    seeds.back().back().state = t;
  }
  reference_stacks out = reference_expanded(g, std::move(seeds));
  out.exact = out.exact && c.exact;
  return out;
}

// The stacks after `text` from the start of `g`.
inline reference_stacks reference_after(const zipage::byte_pda& g, std::string_view text) {
  reference_stacks c = reference_expanded(g, {{{0, zipage::byte_dfa::start}}});
  for (const char b : text) {
    if (c.stacks.empty()) return reference_stacks{{}, false, c.exact};
    c = reference_step(g, c, static_cast<unsigned char>(b));
  }
  return c;
}

}  // namespace zipage_test
