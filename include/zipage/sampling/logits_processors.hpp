#pragma once
// vLLM V1's logits processors (allowed_token_ids, bad_words, logit_bias, min_tokens) as one sparse edit of a
// row of logits, the form both samplers apply: the CPU reference (sampler.hpp) on a copy of the row, the
// CUDA sampler (backend/cuda/sampling.hpp) inside its kernel, from the same list, so a step with such a
// request keeps its logits on the device.
//
//   processed(i) = raw(i) + add(i)   where the list names token i (add: a bias, 0, or -inf: a ban, -inf always)
//                = -inf             where it does not and others_banned (allowed_token_ids)
//                = raw(i)           otherwise
//
// In vLLM's order the processors give exactly this: allowed_token_ids (or a structured-output guide,
// token_rules::guided) keeps its ids' raw logits and bans the rest, bad_words and min_tokens ban (and a ban then
// stays -inf whatever bias is added), logit_bias adds.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/types.hpp"
#include "zipage/sampling/guided.hpp"
#include "zipage/sampling/sampling_params.hpp"

namespace zipage {

// One row's edit: ids sorted ascending and unique, adds beside them.
struct logit_edits {
  struct edit_entry {
    token_id id;
    float add;
    bool allowed;
  };
  bool others_banned = false;  // allowed_token_ids: every id the list does not name is -inf
  std::vector<token_id> ids;
  std::vector<float> adds;
  std::vector<edit_entry> scratch;  // make_logit_edits' sort buffer, kept to reuse its memory

  void clear() {
    others_banned = false;
    ids.clear();
    adds.clear();
  }
  [[nodiscard]] bool empty() const { return !others_banned && ids.empty(); }
};

// The generated tokens a guide reads (sampling_params::guided_after_reasoning): all of them, or those after the
// reasoning block's closing tag; none (nullopt) while the block is open. `may_open`: the first token may also open
// the block.
struct guided_text {
  std::optional<std::span<const token_id>> tokens;
  bool may_open = false;
};
inline guided_text guided_tokens(const sampling_params& p, std::span<const token_id> generated) {
  if (!p.guided_after_reasoning) return {generated};
  const reasoning_tags& r = *p.guided_after_reasoning;
  std::size_t from = 0;  // where the block's text starts
  if (!r.opened) {
    if (generated.empty()) return {generated, true};
    if (generated.front() != r.open) return {generated};
    from = 1;
  }
  const auto close = std::find(generated.begin() + static_cast<std::ptrdiff_t>(from), generated.end(), r.close);
  if (close == generated.end()) return {std::nullopt};
  return {generated.subspan(static_cast<std::size_t>(close - generated.begin()) + 1)};
}

// The edit of step `step` (number of tokens generated so far) for a request with parameters `p`, context
// (prompt + generated tokens; bad words match its last `step`) and token-form rules, into `out` (reused: no
// allocation once its vectors have grown). Ids outside [0, vocab) throw zipage::error naming the processor.
inline void make_logit_edits(logit_edits& out, const sampling_params& p, std::span<const token_id> context,
                             std::uint64_t step, const token_rules& rules, std::int64_t vocab) {
  constexpr float ban = -std::numeric_limits<float>::infinity();
  out.clear();
  auto add = [&](token_id t, float v, const char* what) {
    check(t >= 0 && t < vocab, "sampler: ", what, " token ", t, " is outside the vocabulary of ", vocab);
    out.ids.push_back(t);
    out.adds.push_back(v);
  };
  if (p.allowed_token_ids) {
    out.others_banned = true;
    for (const token_id t : *p.allowed_token_ids) add(t, 0.0f, "allowed_token_ids");
  }
  const auto generated = context.last(std::min<std::size_t>(static_cast<std::size_t>(step), context.size()));
  // Structured output: the tokens that keep the text a prefix of a match; EOS at a match. Nothing inside a
  // reasoning block the guide leaves free, and its opening tag beside the guide's tokens where it may start.
  const guided_text text = rules.guided ? guided_tokens(p, generated) : guided_text{};
  if (text.tokens) {
    const guide& g = *rules.guided;
    const guide_lookahead ahead = g.lookahead(*text.tokens);
    const bool at_match = ahead.at_match;
    const auto& next = ahead.next;
    const token_id opening = text.may_open ? p.guided_after_reasoning->open : -1;
    if (next && next->complement) {  // most tokens allowed: ban the others, and every id past the guide's vocabulary
      const auto kept = [&](token_id t) {
        return t == opening ||
               (at_match && std::find(rules.eos_ids.begin(), rules.eos_ids.end(), t) != rules.eos_ids.end());
      };
      for (const token_id t : next->ids)
        if (!kept(t)) add(t, ban, "guided");
      for (auto t = static_cast<token_id>(g.vocabulary().size()); t < vocab; ++t)
        if (!kept(t)) add(t, ban, "guided");
    } else {
      out.others_banned = true;
      if (next)
        for (const token_id t : next->ids) add(t, 0.0f, "guided");
      // At a match EOS may end the text; where nothing else could come (a bad token slipped through), only EOS.
      if (at_match || out.ids.empty())
        for (const token_id t : rules.eos_ids) add(t, 0.0f, "EOS");
      if (opening >= 0) add(opening, 0.0f, "guided_after_reasoning.open");
    }
  }
  const std::size_t allowed = out.others_banned ? out.ids.size() : 0;  // the allowed ids come first
  for (const std::vector<token_id>& word : rules.bad_words) {
    if (word.empty() || word.size() - 1 > generated.size()) continue;
    const std::span<const token_id> prefix(word.data(), word.size() - 1);
    if (std::equal(prefix.begin(), prefix.end(), generated.end() - static_cast<std::ptrdiff_t>(prefix.size())))
      add(word.back(), ban, "bad_words");
  }
  for (const auto& [t, bias] : p.logit_bias) add(t, bias, "logit_bias");
  if (step < static_cast<std::uint64_t>(std::max(p.min_tokens, 0))) {
    for (const token_id t : rules.eos_ids) add(t, ban, "EOS");
    for (const token_id t : p.stop_token_ids) add(t, ban, "stop_token_ids");
  }
  // Sort by id and merge: a ban wins, biases of one id add up (logit_bias is a map, so there is at most one), an
  // allowed id listed twice is one entry. Under allowed_token_ids an id that only a bias or a ban names stays
  // -inf (its first `allowed` entries are the allowed ids).
  const std::size_t n = out.ids.size();
  if (n < 2 && !out.others_banned) return;
  // Already ascending and unique (a guide's list, tens of thousands of ids, alone): nothing to merge or sort, and
  // under others_banned an id outside the allowed ones stays -inf.
  if (std::adjacent_find(out.ids.begin(), out.ids.end(), [](token_id a, token_id b) { return a >= b; }) ==
      out.ids.end()) {
    if (out.others_banned) std::fill(out.adds.begin() + static_cast<std::ptrdiff_t>(allowed), out.adds.end(), ban);
    return;
  }
  using edit_entry = logit_edits::edit_entry;
  std::vector<edit_entry>& entries = out.scratch;
  entries.clear();
  for (std::size_t i = 0; i < n; ++i) entries.push_back({out.ids[i], out.adds[i], i < allowed});
  std::sort(entries.begin(), entries.end(), [](const edit_entry& a, const edit_entry& b) { return a.id < b.id; });
  out.ids.clear();
  out.adds.clear();
  bool kept = false;  // the current id is an allowed one
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const edit_entry& e = entries[i];
    if (!out.ids.empty() && out.ids.back() == e.id) {
      out.adds.back() = (out.adds.back() == ban || e.add == ban) ? ban : out.adds.back() + e.add;
      kept = kept || e.allowed;
    } else {
      out.ids.push_back(e.id);
      out.adds.push_back(e.add);
      kept = e.allowed;
    }
    if (out.others_banned && (i + 1 == entries.size() || entries[i + 1].id != e.id) && !kept) out.adds.back() = ban;
  }
}

// A ban is -inf whatever the logit (raw + -inf would be NaN for a NaN or +inf logit).
[[nodiscard]] inline float logit_edited(float raw, float add) {
  return add == -std::numeric_limits<float>::infinity() ? add : raw + add;
}

// processed = raw with the edit applied (both [vocab]; may not alias). The CUDA sampler computes the same values.
inline void apply_logit_edits(std::span<const float> raw, const logit_edits& e, std::span<float> processed) {
  check(raw.size() == processed.size(), "apply_logit_edits: rows of ", raw.size(), " and ", processed.size());
  if (e.others_banned)
    std::fill(processed.begin(), processed.end(), -std::numeric_limits<float>::infinity());
  else
    std::copy(raw.begin(), raw.end(), processed.begin());
  for (std::size_t i = 0; i < e.ids.size(); ++i) {
    const auto t = static_cast<std::size_t>(e.ids[i]);
    check(t < raw.size(), "apply_logit_edits: token ", e.ids[i], " is outside the vocabulary of ", raw.size());
    processed[t] = logit_edited(raw[t], e.adds[i]);
  }
}

// A batch's edits as the CSR the CUDA sampler takes (cuda::sampling_batch's edit_* arrays, in the same element
// types): row r's ids are ids[indptr[r] .. indptr[r + 1]) with their adds beside them, and others_banned[r] is 1
// under allowed_token_ids, 0 otherwise. Rows are appended in batch order; a row without logits processors is an
// empty range (append_none). Host only; its vectors are kept between batches (clear) to reuse their memory.
struct logit_edit_csr {
  std::vector<std::int32_t> indptr{0};      // [rows + 1]
  std::vector<std::int32_t> ids;            // token ids, ascending and unique within a row
  std::vector<float> adds;                  // beside ids: a bias, 0, or -inf (a ban)
  std::vector<std::int32_t> others_banned;  // [rows]

  void clear() {
    indptr.assign(1, 0);
    ids.clear();
    adds.clear();
    others_banned.clear();
  }
  [[nodiscard]] std::size_t rows() const { return others_banned.size(); }
  // The next row's edit: e's ids (in [0, vocab), sorted and unique: make_logit_edits makes them so) and adds.
  void append(const logit_edits& e) {
    static_assert(std::is_same_v<token_id, std::int32_t>, "the CSR's ids are the kernel's int32 token ids");
    check(e.ids.size() == e.adds.size(), "logit_edit_csr: ", e.ids.size(), " ids and ", e.adds.size(), " adds");
    ids.insert(ids.end(), e.ids.begin(), e.ids.end());
    adds.insert(adds.end(), e.adds.begin(), e.adds.end());
    end_row(e.others_banned);
  }
  // The next row, unedited.
  void append_none() { end_row(false); }
  // Row r's edit back as a logit_edits (for checks: applying it equals applying the one appended).
  [[nodiscard]] logit_edits row(std::size_t r) const {
    check(r < rows(), "logit_edit_csr: row ", r, " of ", rows());
    const auto b = static_cast<std::ptrdiff_t>(indptr[r]), e = static_cast<std::ptrdiff_t>(indptr[r + 1]);
    logit_edits out;
    out.others_banned = others_banned[r] != 0;
    out.ids.assign(ids.begin() + b, ids.begin() + e);
    out.adds.assign(adds.begin() + b, adds.begin() + e);
    return out;
  }

 private:
  void end_row(bool banned) {
    check(ids.size() < 0x7fffffffu, "logit_edit_csr: logits processors' edits too large");
    indptr.push_back(static_cast<std::int32_t>(ids.size()));
    others_banned.push_back(banned ? 1 : 0);
  }
};

}  // namespace zipage
