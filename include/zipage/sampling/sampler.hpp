#pragma once
// CPU reference sampler: turns one row of logits into a token. Other backends must reproduce its pipeline:
//
//   logits processors (allowed_token_ids, bad_words, logit_bias, min_tokens; only for a request using them)
//   -> repetition penalty -> frequency and presence penalties -> greedy argmax if temperature == 0 (ties: lowest id)
//   -> divide by temperature
//   -> softmax -> top-k -> top-p -> min-p -> renormalise
//   -> inverse-CDF draw with sampling_uniform(seed, step) over the kept tokens, walked in descending
//      probability order with ties broken by ascending id.
//
// Non-finite logits never crash: NaN counts as -inf, +inf as the largest float (so +inf tokens win and tie
// with each other), and a row that is all -inf/NaN yields token 0.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/types.hpp"
#include "zipage/sampling/logits_processors.hpp"
#include "zipage/sampling/sampling_params.hpp"

namespace zipage {

// OpenAI's frequency and presence penalties on one logit of a token generated `count` > 0 times:
// logit - frequency * count - presence, each operation rounded to float (so a device evaluates it with
// the same two roundings: no fused multiply-add).
[[nodiscard]] inline float apply_output_penalties(float logit, int count, float frequency, float presence) {
  const float scaled = frequency * static_cast<float>(count);
  const float once = logit - scaled;
  return once - presence;
}

// HF / llama.cpp repetition penalty on one logit. Dividing a positive logit and multiplying a negative one
// both lower the token's probability when penalty > 1 (and raise it when penalty < 1).
[[nodiscard]] inline float apply_repetition_penalty(float logit, float penalty) {
  return logit > 0.0f ? logit / penalty : logit * penalty;
}

// Holds scratch buffers that grow to the vocabulary size once and are then reused, so sample() does not
// allocate in steady state. Not thread-safe: use one sampler per thread. `p` is expected to have passed
// validate(); out-of-range knobs degrade to "off" rather than crash.
class sampler {
 public:
  // logits: one row [vocab]; context: prompt + generated tokens so far (used only by the penalties: the
  // repetition penalty over all of it, the frequency and presence penalties over its last `step` tokens,
  // the generated ones; and by bad_words, over the generated ones); step: index of the token being generated
  // (number of generated tokens so far); rules: the request's bad words and EOS ids in token form (engine-made).
  token_id sample(std::span<const float> logits, const sampling_params& p, std::span<const token_id> context,
                  std::uint64_t step, const token_rules& rules = {}) {
    check(!logits.empty(), "sampler: empty logits row");
    load_logits(p.processes_logits(step) ? processed(logits, p, context, step, rules) : logits, p, context, step);
    const token_id best = argmax();
    if (p.greedy() || values_[best] == -std::numeric_limits<float>::infinity()) return best;

    double reference_mass = compute_weights(values_[best], p.temperature);
    if (p.top_k > 0 && static_cast<std::size_t>(p.top_k) < cands_.size())
      reference_mass = keep_top_k(static_cast<std::size_t>(p.top_k));
    // min-p runs before top-p here but gives the same set as after it: both keep a prefix of the sorted
    // order, and top-p measures its mass against the (top-k) set *before* min-p.
    if (p.min_p > 0.0f) keep_min_p(p.min_p);
    const double kept_mass = p.top_p < 1.0f ? keep_top_p(p.top_p, reference_mass) : total_weight();
    if (cands_.empty()) return best;  // only reachable with invalid knobs, e.g. a NaN temperature
    return draw(kept_mass, sampling_uniform(p.seed, step));
  }

 private:
  struct candidate {
    float weight;  // unnormalised probability, exp((logit - max) / temperature), in (0, 1]
    token_id id;
  };

  // Descending weight, ties by ascending id. A strict total order, so every selection algorithm below
  // produces the same order and sampling is deterministic.
  static bool before(const candidate& a, const candidate& b) {
    return a.weight > b.weight || (a.weight == b.weight && a.id < b.id);
  }

  static float sanitize(float x) {
    if (std::isnan(x)) return -std::numeric_limits<float>::infinity();
    if (x == std::numeric_limits<float>::infinity()) return std::numeric_limits<float>::max();
    return x;
  }

  // vLLM V1's logits processors on a copy of the row, as the sparse edit the CUDA sampler applies too
  // (logits_processors.hpp): allowed_token_ids, bad_words (over the generated tokens), logit_bias, then
  // min_tokens (EOS and stop ids at -inf while step < min_tokens).
  std::span<const float> processed(std::span<const float> logits, const sampling_params& p,
                                   std::span<const token_id> context, std::uint64_t step, const token_rules& rules) {
    make_logit_edits(edits_, p, context, step, rules, static_cast<std::int64_t>(logits.size()));
    processed_.resize(logits.size());
    apply_logit_edits(logits, edits_, processed_);
    return processed_;
  }

  void load_logits(std::span<const float> logits, const sampling_params& p, std::span<const token_id> context,
                   std::uint64_t step) {
    values_.resize(logits.size());
    std::transform(logits.begin(), logits.end(), values_.begin(), sanitize);
    const auto vocab = static_cast<std::int64_t>(logits.size());
    if (p.repetition_penalty != 1.0f) {
      for (const token_id t : context) {
        check(t >= 0 && t < vocab, "sampler: context token ", t, " is outside the vocabulary of ", vocab);
        // Recomputed from the original logit, so a token seen many times is penalised once (as in HF).
        // Sanitised again because dividing the largest float by a penalty < 1 overflows to +inf.
        values_[t] = sanitize(apply_repetition_penalty(sanitize(logits[t]), p.repetition_penalty));
      }
    }
    if (p.output_penalties() && step > 0) {
      // The generated tokens are the context's last `step`; counted in a vocabulary-sized array that is
      // left all zero again, so no allocation in steady state.
      const auto generated = context.last(std::min<std::size_t>(static_cast<std::size_t>(step), context.size()));
      for (const token_id t : generated)
        check(t >= 0 && t < vocab, "sampler: context token ", t, " is outside the vocabulary of ", vocab);
      counts_.resize(logits.size(), 0);
      for (const token_id t : generated) ++counts_[static_cast<std::size_t>(t)];
      for (const token_id t : generated) {
        int& c = counts_[static_cast<std::size_t>(t)];
        if (c == 0) continue;  // already penalised
        values_[t] = sanitize(apply_output_penalties(values_[t], c, p.frequency_penalty, p.presence_penalty));
        c = 0;
      }
    }
  }

  // First index of the maximum, so ties go to the lowest id.
  token_id argmax() const {
    return static_cast<token_id>(std::max_element(values_.begin(), values_.end()) - values_.begin());
  }

  // Softmax numerator of every token with a non-zero weight. Subtracting the max before dividing by the
  // temperature keeps every exponent <= 0: no overflow even as temperature -> 0+. Returns the total weight.
  double compute_weights(float max_logit, float temperature) {
    cands_.clear();
    sorted_ = 0;
    double total = 0.0;
    for (std::size_t i = 0; i < values_.size(); ++i) {
      const float w = std::exp((values_[i] - max_logit) / temperature);
      if (w > 0.0f) cands_.push_back({w, static_cast<token_id>(i)});
      total += w;
    }
    return total;
  }

  // Keeps the k best without sorting everything; returns their mass, which top-p is measured against.
  double keep_top_k(std::size_t k) {
    std::nth_element(cands_.begin(), cands_.begin() + static_cast<std::ptrdiff_t>(k), cands_.end(), before);
    cands_.resize(k);
    return total_weight();
  }

  // The max weight is exactly exp(0) = 1, so "prob < min_p * max prob" is "weight < min_p".
  void keep_min_p(float min_p) {
    std::erase_if(cands_, [min_p](const candidate& c) { return c.weight < min_p; });
  }

  // Smallest prefix of the sorted order whose mass reaches top_p of the reference mass (at least one
  // token). Returns the mass kept.
  double keep_top_p(float top_p, double reference_mass) {
    const double target = static_cast<double>(top_p) * reference_mass;
    double cum = 0.0;
    const std::size_t n = scan_sorted([target](double c) { return c >= target; }, cum);
    cands_.resize(n);
    return cum;
  }

  // Inverse CDF: the first token in sorted order whose cumulative mass exceeds u * kept_mass.
  token_id draw(double kept_mass, float u) {
    const double target = static_cast<double>(u) * kept_mass;
    double cum = 0.0;
    const std::size_t n = scan_sorted([target](double c) { return c > target; }, cum);
    // If rounding kept the running sum from ever exceeding target, n == size(): the last token.
    return cands_[n - 1].id;
  }

  // Adds weights in sorted order to `cum` until done(cum); returns how many were added. Sorts lazily in
  // growing chunks, so a peaked distribution only orders its head rather than the whole vocabulary.
  template <class Done>
  std::size_t scan_sorted(Done done, double& cum) {
    for (std::size_t i = 0; i < cands_.size(); ++i) {
      if (i == sorted_) sort_prefix(std::max<std::size_t>(2 * sorted_, 64));
      cum += cands_[i].weight;
      if (done(cum)) return i + 1;
    }
    return cands_.size();
  }

  // Extends the sorted prefix to n elements. Everything past the prefix ranks after it, so selecting the
  // next chunk with nth_element and sorting just that chunk keeps the prefix exact.
  void sort_prefix(std::size_t n) {
    n = std::min(n, cands_.size());
    const auto first = cands_.begin() + static_cast<std::ptrdiff_t>(sorted_);
    const auto last = cands_.begin() + static_cast<std::ptrdiff_t>(n);
    if (n < cands_.size()) std::nth_element(first, last, cands_.end(), before);
    std::sort(first, last, before);
    sorted_ = n;
  }

  double total_weight() const {
    double total = 0.0;
    for (const candidate& c : cands_) total += c.weight;
    return total;
  }

  std::vector<float> processed_;   // the row after the logits processors (only for a request using them)
  logit_edits edits_;              // the row's logits processors as an edit (only for a request using them)
  std::vector<float> values_;      // sanitised, penalised logits
  std::vector<int> counts_;        // scratch of the output penalties: all zero between calls
  std::vector<candidate> cands_;   // tokens still in the running
  std::size_t sorted_ = 0;         // cands_[0, sorted_) are the best sorted_ candidates, in order
};

}  // namespace zipage
