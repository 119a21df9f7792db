#pragma once
// How closely greedy decoding on a perturbed KV cache (FP8, bf16-rounded) follows a reference KV cache,
// for the FP8 KV tests on the CPU (tests/unit/test_fp8_kv.cpp) and on the GPU (tests/gpu/test_cuda_fp8_kv.cpp).
// Each request runs three times: on the reference cache; free-running on the cache under test; and on
// the cache under test teacher-forced on the reference's tokens, so every step's logits can be compared.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "zipage/core/types.hpp"
#include "stories_model.hpp"

namespace zipage::testing {

// One request's greedy run: its generated tokens, every logits row its model returned (prefill rows
// first, where the model logs them), and the engine's compression count.
struct greedy_run {
  std::vector<token_id> tokens;
  std::vector<std::vector<float>> logits;
  std::int64_t compressions = 0;
};

struct agreement {
  int tokens = 0;            // generated tokens compared
  int same_position = 0;     // free-running: tokens equal at the same position
  int common_prefix = 0;     // free-running: tokens before the first difference, summed over requests
  int diverged = 0;          // free-running: requests whose outputs differ somewhere
  int forced_top1 = 0;       // teacher-forced on the reference tokens: steps whose argmax is the reference token
  int requests = 0;          // requests compared
  double max_drift = 0.0;    // teacher-forced: max |logit - logit_ref| over every step and vocabulary entry
  double sum_drift = 0.0;    // teacher-forced: sum over steps of max |logit - logit_ref| (mean = / tokens)
  double max_logit = 0.0;    // max |logit_ref| (the drift's scale)
};

// Adds one request. The generated steps' logits are each run's last ref.tokens.size() rows: the engine
// samples from the prefill's last row, then one row per decode step.
inline void add_request(agreement& a, const greedy_run& ref, const greedy_run& free, const greedy_run& forced) {
  const std::size_t n = ref.tokens.size();
  ++a.requests;
  std::size_t prefix = 0;
  while (prefix < n && prefix < free.tokens.size() && ref.tokens[prefix] == free.tokens[prefix]) ++prefix;
  a.tokens += static_cast<int>(n);
  a.common_prefix += static_cast<int>(prefix);
  a.diverged += prefix < n;
  for (std::size_t i = 0; i < n; ++i) {
    a.same_position += i < free.tokens.size() && ref.tokens[i] == free.tokens[i];
    const auto& got = forced.logits[forced.logits.size() - n + i];
    const auto& want = ref.logits[ref.logits.size() - n + i];
    a.forced_top1 += std::max_element(got.begin(), got.end()) - got.begin() == ref.tokens[i];
    double step_drift = 0.0;
    for (std::size_t j = 0; j < want.size(); ++j) {
      step_drift = std::max(step_drift, double(std::abs(got[j] - want[j])));
      a.max_logit = std::max(a.max_logit, double(std::abs(want[j])));
    }
    a.max_drift = std::max(a.max_drift, step_drift);
    a.sum_drift += step_drift;
  }
}

inline void check_sane(const agreement& a) {
  CHECK(std::isfinite(a.max_drift));
  CHECK(a.max_drift < a.max_logit);
  CHECK(a.forced_top1 * 2 >= a.tokens);  // teacher-forced top-1 agreement >= 50%
}

// The six stories260K prompts both FP8 KV agreement tests run.
inline std::vector<std::vector<token_id>> kv_agreement_prompts() {
  return encode_stories({"Once upon a time", "Once upon a time, a little girl went to the park.",
                         "Tom had a big red ball. One day", "The cat and the dog were friends. They",
                         "Lily wanted to play in the garden, but", "One day, a small bird found a shiny box"});
}

}  // namespace zipage::testing
