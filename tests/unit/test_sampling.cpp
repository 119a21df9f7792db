// Sampling parameters, counter-based random numbers and the CPU reference sampler.
//
// Statistical checks use fixed seeds, so they are deterministic: a pass is permanent, and a change to the
// pipeline that skews the distribution shows up as a large chi-square. Bounds are the chi-square critical
// values at p = 0.001 for the test's degrees of freedom.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <new>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "zipage/sampling/logits_processors.hpp"
#include "zipage/sampling/logprobs.hpp"
#include "zipage/sampling/sampler.hpp"
#include "zipage/sampling/sampling_params.hpp"

// Counts heap allocations in this executable, to check that sample() reuses its scratch buffers.
namespace {
std::atomic<std::size_t> g_allocations{0};
// Out of line so GCC does not inline free() into callers and misreport a new/free mismatch.
[[gnu::noinline]] void release(void* p) noexcept { std::free(p); }
}  // namespace

void* operator new(std::size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { release(p); }
void operator delete(void* p, std::size_t) noexcept { release(p); }
// The nothrow forms too (std::stable_sort's temporary buffer uses them): otherwise the library's nothrow
// new pairs with the delete above, a new/free mismatch under AddressSanitizer.
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(size == 0 ? 1 : size);
}
void operator delete(void* p, const std::nothrow_t&) noexcept { release(p); }

namespace {

using zipage::encode_bad_words;
using zipage::sampler;
using zipage::sampling_params;
using zipage::token_id;
using zipage::token_logprob_of;
using zipage::token_rules;

constexpr float inf_f = std::numeric_limits<float>::infinity();
constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();
constexpr int draws = 20000;

// Chi-square critical values at p = 0.001, indexed by degrees of freedom.
constexpr double chi2_critical[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88};

std::vector<float> logits_from_probs(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(p > 0 ? static_cast<float>(std::log(p)) : -inf_f);
  return logits;
}

std::vector<double> softmax(const std::vector<float>& logits, double temperature = 1.0) {
  const double m = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p;
  for (float l : logits) p.push_back(std::exp((l - m) / temperature));
  const double z = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& x : p) x /= z;
  return p;
}

// Empirical token frequencies over `draws` requests with seeds 0..draws-1, all at step 0.
std::vector<double> frequencies(const std::vector<float>& logits, sampling_params p,
                                const std::vector<token_id>& context = {}) {
  sampler s;
  std::vector<double> freq(logits.size(), 0.0);
  for (int i = 0; i < draws; ++i) {
    p.seed = static_cast<std::uint64_t>(i);
    freq[static_cast<std::size_t>(s.sample(logits, p, context, 0))] += 1.0;
  }
  for (double& f : freq) f /= draws;  // counts are exact, so a token drawn every time has frequency exactly 1
  return freq;
}

// Asserts the frequencies fit `expected`: tokens with probability 0 are never drawn, the chi-square over the
// rest is below the p = 0.001 critical value, and no frequency is off by more than 0.015 (> 5 standard
// errors, since the standard error is at most 0.5 / sqrt(20000) = 0.0035).
void check_distribution(const std::vector<double>& freq, const std::vector<double>& expected) {
  REQUIRE(freq.size() == expected.size());
  double chi2 = 0.0;
  int support = 0;
  for (std::size_t i = 0; i < freq.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(freq[i] - expected[i]) < 0.015);
    if (expected[i] == 0.0) {
      CHECK(freq[i] == 0.0);
      continue;
    }
    const double diff = (freq[i] - expected[i]) * draws;
    chi2 += diff * diff / (expected[i] * draws);
    ++support;
  }
  REQUIRE(support >= 1);
  if (support >= 2) CHECK(chi2 < chi2_critical[support - 1]);
}

std::vector<double> renormalised(std::vector<double> probs, const std::set<std::size_t>& keep) {
  double z = 0.0;
  for (std::size_t i = 0; i < probs.size(); ++i) {
    if (!keep.count(i)) probs[i] = 0.0;
    z += probs[i];
  }
  for (double& p : probs) p /= z;
  return probs;
}

sampling_params with(float temperature, int top_k = 0, float top_p = 1.0f, float min_p = 0.0f) {
  sampling_params p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  return p;
}

std::string validation_error(const sampling_params& p) {
  try {
    p.validate();
  } catch (const zipage::error& e) {
    return e.what();
  }
  return "";
}

// Straightforward full-sort version of the pipeline, to cross-check the lazy partial sorting.
token_id reference_sample(const std::vector<float>& logits, const sampling_params& p, std::uint64_t step) {
  const float m = *std::max_element(logits.begin(), logits.end());
  std::vector<std::pair<float, token_id>> c;
  for (std::size_t i = 0; i < logits.size(); ++i)
    c.push_back({std::exp((logits[i] - m) / p.temperature), static_cast<token_id>(i)});
  std::sort(c.begin(), c.end(), [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  if (p.top_k > 0 && static_cast<std::size_t>(p.top_k) < c.size()) c.resize(static_cast<std::size_t>(p.top_k));
  double mass = 0.0;
  for (auto& x : c) mass += x.first;
  std::size_t keep = 0;
  double cum = 0.0;
  while (keep < c.size() && (keep == 0 || cum < p.top_p * mass)) cum += c[keep++].first;
  if (p.top_p < 1.0f) c.resize(keep);
  std::erase_if(c, [&](auto& x) { return x.first < p.min_p; });
  double kept = 0.0;
  for (auto& x : c) kept += x.first;
  const double target = zipage::sampling_uniform(p.seed, step) * kept;
  cum = 0.0;
  for (auto& x : c)
    if ((cum += x.first) > target) return x.second;
  return c.back().second;
}

}  // namespace

TEST_SUITE("sampling") {

TEST_CASE("sampling_uniform is in [0, 1), 24-bit, uniform and pinned") {
  static_assert(zipage::sampling_uniform(0, 0) >= 0.0f && zipage::sampling_uniform(0, 0) < 1.0f);
  constexpr std::uint64_t extremes[] = {0, 1, 2, 0xFFFFFFFFull, std::numeric_limits<std::uint64_t>::max()};
  for (std::uint64_t seed : extremes)
    for (std::uint64_t step : extremes) {
      const float u = zipage::sampling_uniform(seed, step);
      CHECK(u >= 0.0f);
      CHECK(u < 1.0f);
      CHECK(u * 16777216.0f == std::floor(u * 16777216.0f));  // a multiple of 2^-24
    }

  // Mean 0.5 and variance 1/12 over 100k draws (standard error of the mean ~0.0009); 16 equal buckets
  // pass a chi-square test with 15 degrees of freedom (critical value 37.70 at p = 0.001).
  const int n = 100000;
  double sum = 0.0, sum_sq = 0.0;
  int out_of_range = 0;
  std::vector<double> buckets(16, 0.0);
  for (int i = 0; i < n; ++i) {
    const double u = zipage::sampling_uniform(static_cast<std::uint64_t>(i % 100), static_cast<std::uint64_t>(i / 100));
    if (!(u >= 0.0 && u < 1.0)) {
      ++out_of_range;
      continue;
    }
    sum += u;
    sum_sq += u * u;
    buckets[static_cast<std::size_t>(u * 16)] += 1.0;
  }
  REQUIRE(out_of_range == 0);
  const double mean = sum / n;
  CHECK(mean == doctest::Approx(0.5).epsilon(0.01));
  CHECK(sum_sq / n - mean * mean == doctest::Approx(1.0 / 12).epsilon(0.03));
  double chi2 = 0.0;
  for (double b : buckets) chi2 += (b - n / 16.0) * (b - n / 16.0) / (n / 16.0);
  CHECK(chi2 < 37.70);

  // Pinned so that an accidental change of formula, which would change every seeded output and break
  // parity with GPU backends, fails here. Values are k * 2^-24 for the stated k.
  CHECK(zipage::sampling_uniform(0, 0) * 16777216.0f == 14819496.0f);
  CHECK(zipage::sampling_uniform(42, 7) * 16777216.0f == 2565124.0f);
}

TEST_CASE("greedy is argmax with ties to the lowest id, whatever the seed") {
  sampler s;
  sampling_params p = with(0.0f);
  CHECK(p.greedy());
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 2.9f};
  const std::vector<float> tied = {1.0f, 4.0f, 2.0f, 4.0f, 4.0f};
  for (std::uint64_t seed = 0; seed < 50; ++seed) {
    p.seed = seed;
    CHECK(s.sample(logits, p, {}, seed * 3) == 1);
    CHECK(s.sample(tied, p, {}, seed) == 1);
  }
  // Greedy ignores the truncation knobs.
  CHECK(s.sample(tied, with(0.0f, 1, 0.1f, 0.9f), {}, 0) == 1);
}

TEST_CASE("same (seed, step) gives the same token; other seeds give other sequences") {
  const std::vector<float> logits = {0.1f, 0.3f, 0.0f, 0.2f, 0.25f, 0.05f, 0.15f, 0.3f};
  const std::vector<float> other = {5.0f, -2.0f, 1.0f, 0.0f, 3.0f, 2.0f, 1.0f, 0.5f};
  sampling_params p = with(1.0f);
  const int steps = 64;

  std::set<std::vector<token_id>> sequences;
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    p.seed = seed;
    sampler a, b;
    std::vector<token_id> seq;
    for (int step = 0; step < steps; ++step) {
      const token_id t = a.sample(logits, p, {}, static_cast<std::uint64_t>(step));
      // Another sampler that has just worked on a different row (another request in the batch, with a
      // different vocabulary size) must agree: no state leaks through the scratch buffers.
      sampling_params q = with(0.7f, 3, 0.8f);
      b.sample(std::span(other).first(static_cast<std::size_t>(step % 8 + 1)), q, {}, 99);
      CHECK(b.sample(logits, p, {}, static_cast<std::uint64_t>(step)) == t);
      seq.push_back(t);
    }
    CHECK(std::set<token_id>(seq.begin(), seq.end()).size() > 3);  // varies with the step
    sequences.insert(seq);
  }
  CHECK(sequences.size() == 20);  // every seed's 64-token sequence is different

  // Recomputing the same step later (e.g. after preemption) reproduces the token.
  sampler s;
  p.seed = 1234;
  const token_id first = s.sample(logits, p, {}, 17);
  for (int i = 0; i < 10; ++i) s.sample(logits, p, {}, static_cast<std::uint64_t>(i));
  CHECK(s.sample(logits, p, {}, 17) == first);
}

TEST_CASE("the draw is the inverse CDF over tokens in descending probability order") {
  // probs 0.1, 0.2, 0.3, 0.4: walking ids 3, 2, 1, 0, the CDF steps are 0.4, 0.7, 0.9, 1.0.
  const std::vector<float> logits = logits_from_probs({0.1, 0.2, 0.3, 0.4});
  const double steps[] = {0.4, 0.7, 0.9};
  sampler s;
  sampling_params p = with(1.0f);
  int checked = 0;
  for (std::uint64_t seed = 0; seed < 2000; ++seed) {
    p.seed = seed;
    const double u = zipage::sampling_uniform(seed, 5);
    if (std::any_of(std::begin(steps), std::end(steps), [u](double c) { return std::abs(u - c) < 1e-5; })) continue;
    const token_id expected = u < 0.4 ? 3 : u < 0.7 ? 2 : u < 0.9 ? 1 : 0;
    CHECK(s.sample(logits, p, {}, 5) == expected);
    ++checked;
  }
  CHECK(checked > 1990);

  // Equal probabilities: ties walk in id order, so the token is floor(4u).
  const std::vector<float> flat(4, 0.25f);
  for (std::uint64_t seed = 0; seed < 500; ++seed) {
    p.seed = seed;
    const float u = zipage::sampling_uniform(seed, 0);
    CHECK(s.sample(flat, p, {}, 0) == static_cast<token_id>(u * 4));
  }
}

TEST_CASE("frequencies match the softmax") {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
  check_distribution(frequencies(logits, with(1.0f)), softmax(logits));
}

TEST_CASE("temperature scales the logits") {
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f, 1.5f};
  SUBCASE("T = 2 matches softmax(logits / 2)") {
    check_distribution(frequencies(logits, with(2.0f)), softmax(logits, 2.0));
  }
  SUBCASE("T -> 0+ approaches greedy") {
    const auto freq = frequencies(logits, with(1e-3f));
    CHECK(freq[0] == 1.0);
  }
  SUBCASE("high temperature flattens towards uniform") {
    check_distribution(frequencies(logits, with(1e4f)), std::vector<double>(4, 0.25));
  }
  SUBCASE("the top token's share falls as temperature rises") {
    double previous = 1.1;
    for (float t : {0.25f, 0.5f, 1.0f, 2.0f, 8.0f}) {
      const double share = frequencies(logits, with(t))[0];
      CAPTURE(t);
      CHECK(share < previous);
      previous = share;
    }
  }
}

TEST_CASE("top-k keeps only the k most likely, renormalised") {
  const std::vector<float> logits = {0.3f, 2.0f, -0.5f, 1.2f, 1.8f, 0.9f};
  const auto probs = softmax(logits);
  check_distribution(frequencies(logits, with(1.0f, 3)), renormalised(probs, {1, 3, 4}));

  // k >= vocabulary size is the same as off, token for token; k = 1 is greedy.
  CHECK(frequencies(logits, with(1.0f, 6)) == frequencies(logits, with(1.0f, 0)));
  CHECK(frequencies(logits, with(1.0f, 100)) == frequencies(logits, with(1.0f, 0)));
  CHECK(frequencies(logits, with(1.0f, -1)) == frequencies(logits, with(1.0f, 0)));  // vLLM's "off"
  CHECK(frequencies(logits, with(1.0f, 1))[1] == 1.0);

  // A tie at the boundary goes to the lower id.
  const std::vector<float> tie = {2.0f, 1.0f, 1.0f, 0.0f};
  const auto freq = frequencies(tie, with(1.0f, 2));
  CHECK(freq[2] == 0.0);
  CHECK(freq[3] == 0.0);
  CHECK(freq[1] > 0.0);
}

TEST_CASE("top-p keeps the smallest nucleus") {
  // Sorted probs 0.5, 0.3, 0.15, 0.05: cumulative 0.5, 0.8, 0.95, 1.0.
  const std::vector<double> probs = {0.15, 0.5, 0.05, 0.3};
  const auto logits = logits_from_probs(probs);
  SUBCASE("p = 0.7 keeps {0.5, 0.3}") {
    check_distribution(frequencies(logits, with(1.0f, 0, 0.7f)), renormalised(probs, {1, 3}));
  }
  SUBCASE("p = 0.85 keeps {0.5, 0.3, 0.15}") {
    check_distribution(frequencies(logits, with(1.0f, 0, 0.85f)), renormalised(probs, {0, 1, 3}));
  }
  SUBCASE("p = 0.4 keeps only the top token") {
    CHECK(frequencies(logits, with(1.0f, 0, 0.4f))[1] == 1.0);
  }
  SUBCASE("tiny p is argmax, ties to the lowest id") {
    CHECK(frequencies(logits, with(1.0f, 0, 1e-6f))[1] == 1.0);
    CHECK(frequencies({0.0f, 1.0f, 1.0f}, with(1.0f, 0, 1e-6f))[1] == 1.0);
  }
  SUBCASE("after top-k, top-p measures mass in the renormalised top-k distribution") {
    // probs 0.4, 0.3, 0.2, 0.1; top-2 renormalised is 0.571, 0.429, so p = 0.5 keeps only the top token.
    // (Measured against the full distribution, 0.4 < 0.5 would have kept two.)
    const auto l = logits_from_probs({0.4, 0.3, 0.2, 0.1});
    CHECK(frequencies(l, with(1.0f, 2, 0.5f))[0] == 1.0);
    // p = 0.6 needs both of the top 2, and never a third.
    check_distribution(frequencies(l, with(1.0f, 2, 0.6f)), {4.0 / 7, 3.0 / 7, 0, 0});
  }
}

TEST_CASE("min-p drops tokens below min_p times the top probability") {
  // probs 0.5, 0.3, 0.15, 0.05
  const std::vector<double> probs = {0.5, 0.3, 0.15, 0.05};
  const auto logits = logits_from_probs(probs);
  SUBCASE("min_p = 0.2: threshold 0.1 drops 0.05") {
    check_distribution(frequencies(logits, with(1.0f, 0, 1.0f, 0.2f)), renormalised(probs, {0, 1, 2}));
  }
  SUBCASE("min_p = 0.5: threshold 0.25 keeps 0.5 and 0.3") {
    check_distribution(frequencies(logits, with(1.0f, 0, 1.0f, 0.5f)), renormalised(probs, {0, 1}));
  }
  SUBCASE("min_p = 1 keeps only the top token") {
    CHECK(frequencies(logits, with(1.0f, 0, 1.0f, 1.0f))[0] == 1.0);
  }
  SUBCASE("combined with top-p the smaller set wins") {
    // top-p 0.85 keeps three tokens, min-p 0.5 keeps two.
    check_distribution(frequencies(logits, with(1.0f, 0, 0.85f, 0.5f)), renormalised(probs, {0, 1}));
    // top-p 0.7 keeps two tokens, min-p 0.2 keeps three.
    check_distribution(frequencies(logits, with(1.0f, 0, 0.7f, 0.2f)), renormalised(probs, {0, 1}));
  }
}

TEST_CASE("repetition penalty divides positive and multiplies negative logits") {
  CHECK(zipage::apply_repetition_penalty(2.0f, 2.0f) == 1.0f);
  CHECK(zipage::apply_repetition_penalty(-1.0f, 2.0f) == -2.0f);
  CHECK(zipage::apply_repetition_penalty(0.0f, 2.0f) == 0.0f);
  CHECK(zipage::apply_repetition_penalty(1.5f, 0.5f) == 3.0f);

  sampler s;
  sampling_params p = with(0.0f);
  p.repetition_penalty = 2.0f;
  // [2.0, 1.5, -1.0, -0.5] with tokens 0 and 2 seen -> [1.0, 1.5, -2.0, -0.5]: the greedy choice moves to 1.
  const std::vector<float> logits = {2.0f, 1.5f, -1.0f, -0.5f};
  CHECK(s.sample(logits, with(0.0f), std::vector<token_id>{0, 2}, 0) == 0);
  CHECK(s.sample(logits, p, std::vector<token_id>{0, 2}, 0) == 1);

  // Negative logits are multiplied: -1.0 -> -2.0 falls below -1.5. (Dividing would give -0.5 and keep 0.)
  CHECK(s.sample(std::vector<float>{-1.0f, -1.5f}, p, std::vector<token_id>{0}, 0) == 1);

  // A token repeated in the context is penalised once: 2.0 -> 1.0 still beats 0.9 (twice would be 0.5).
  CHECK(s.sample(std::vector<float>{2.0f, 0.9f}, p, std::vector<token_id>{0, 0, 0}, 0) == 0);

  // A penalty below 1 favours seen tokens: 1.0 -> 2.0 beats 1.5.
  p.repetition_penalty = 0.5f;
  CHECK(s.sample(std::vector<float>{1.5f, 1.0f}, p, std::vector<token_id>{1}, 0) == 1);

  // When sampling, the distribution is the softmax of the penalised logits.
  sampling_params q = with(1.0f);
  q.repetition_penalty = 2.0f;
  check_distribution(frequencies(logits, q, {0, 2}), softmax({1.0f, 1.5f, -2.0f, -0.5f}));

  // A context token outside the vocabulary is an error, not a write out of bounds.
  CHECK_THROWS_AS(s.sample(logits, q, std::vector<token_id>{4}, 0), zipage::error);
  CHECK_THROWS_AS(s.sample(logits, q, std::vector<token_id>{-1}, 0), zipage::error);
}

// Frequencies as above, at `step` with `context` (prompt + generated): the output penalties need step > 0.
std::vector<double> frequencies_at(const std::vector<float>& logits, sampling_params p, const std::vector<token_id>& context,
                                   std::uint64_t step) {
  sampler s;
  std::vector<double> freq(logits.size(), 0.0);
  for (int i = 0; i < draws; ++i) {
    p.seed = static_cast<std::uint64_t>(i);
    freq[static_cast<std::size_t>(s.sample(logits, p, context, step))] += 1.0;
  }
  for (double& f : freq) f /= draws;
  return freq;
}

TEST_CASE("frequency and presence penalties: OpenAI's, over the generated tokens only") {
  CHECK(zipage::apply_output_penalties(2.0f, 3, 0.5f, 0.25f) == 0.25f);
  CHECK(zipage::apply_output_penalties(-1.0f, 1, -1.0f, 0.0f) == 0.0f);
  CHECK(zipage::apply_output_penalties(-inf_f, 2, 1.0f, 1.0f) == -inf_f);

  sampler s;
  sampling_params f = with(0.0f);
  f.frequency_penalty = 0.15f;
  const std::vector<float> logits = {2.0f, 1.8f, 0.0f};
  // Prompt {0}, then token 0 generated twice (step 2): 2.0 - 2 * 0.15 = 1.7 < 1.8.
  CHECK(s.sample(logits, f, std::vector<token_id>{0, 0, 0}, 2) == 1);
  // Generated once: 2.0 - 0.15 = 1.85 still wins.
  CHECK(s.sample(logits, f, std::vector<token_id>{0, 0, 0}, 1) == 0);
  // The same tokens in the prompt only (step 0): no penalty.
  CHECK(s.sample(logits, f, std::vector<token_id>{0, 0, 0}, 0) == 0);
  // A step beyond the context counts the whole context as generated (no read out of bounds).
  CHECK(s.sample(logits, f, std::vector<token_id>{0, 0}, 9) == 1);

  sampling_params pr = with(0.0f);
  pr.presence_penalty = 0.3f;
  // Presence counts once however often: 2.0 - 0.3 = 1.7 beats 1.65 after three generations.
  CHECK(s.sample(std::vector<float>{2.0f, 1.65f}, pr, std::vector<token_id>{0, 0, 0}, 3) == 0);
  CHECK(s.sample(std::vector<float>{2.0f, 1.75f}, pr, std::vector<token_id>{0, 0, 0}, 3) == 1);
  // Both: 2.0 - 3 * 0.1 - 0.3 = 1.4.
  sampling_params both = pr;
  both.frequency_penalty = 0.1f;
  CHECK(s.sample(std::vector<float>{2.0f, 1.45f}, both, std::vector<token_id>{0, 0, 0}, 3) == 1);
  CHECK(s.sample(std::vector<float>{2.0f, 1.35f}, both, std::vector<token_id>{0, 0, 0}, 3) == 0);

  // Negative penalties encourage repetition: 1.0 + 2 * 0.6 = 2.2 beats 2.0.
  sampling_params neg = with(0.0f);
  neg.frequency_penalty = -0.6f;
  CHECK(s.sample(std::vector<float>{1.0f, 2.0f}, neg, std::vector<token_id>{1, 0, 0}, 2) == 0);

  // When sampling, the distribution is the softmax of the penalised logits; after the repetition
  // penalty (over prompt + output): token 0 (generated twice) 2.0 / 2 - 2 * 0.5 - 0.25 = -0.25, token 1
  // (prompt) 1.0 / 2 = 0.5, token 2 untouched 0.5, token 3 (generated once) 1.0 / 2 - 0.5 - 0.25 = -0.25.
  sampling_params q = with(1.0f);
  q.repetition_penalty = 2.0f;
  q.frequency_penalty = 0.5f;
  q.presence_penalty = 0.25f;
  const std::vector<token_id> context = {1, 0, 3, 0};  // prompt {1}, generated {0, 3, 0}
  check_distribution(frequencies_at({2.0f, 1.0f, 0.5f, 1.0f}, q, context, 3), softmax({-0.25f, 0.5f, 0.5f, -0.25f}));

  // +inf stays the largest float, never NaN, under a negative penalty.
  sampling_params boost = with(1.0f);
  boost.presence_penalty = -2.0f;
  const auto freq = frequencies_at({inf_f, inf_f, 0.0f}, boost, {0}, 1);
  CHECK(freq[0] == doctest::Approx(0.5).epsilon(0.05));
  CHECK(freq[2] == 0.0);

  // A generated token outside the vocabulary is an error, and leaves no count behind for the next call.
  CHECK_THROWS_AS(s.sample(logits, f, std::vector<token_id>{0, 0, 7}, 2), zipage::error);
  CHECK(s.sample(logits, f, std::vector<token_id>{2, 0}, 1) == 0);
}

TEST_CASE("top log-probabilities: log-softmax of the raw row, most likely first, ties by id") {
  const std::vector<float> row = {1.0f, 3.0f, -inf_f, 3.0f, 0.5f, 2.0f};
  const auto top = zipage::top_logprobs(row, 4);
  REQUIRE(top.size() == 4);
  CHECK(top[0].id == 1);
  CHECK(top[1].id == 3);
  CHECK(top[2].id == 5);
  CHECK(top[3].id == 0);
  double z = 0.0;
  for (float x : row) z += std::exp(static_cast<double>(x));
  for (const auto& t : top) {
    CAPTURE(t.id);
    CHECK(t.logprob == doctest::Approx(row[static_cast<std::size_t>(t.id)] - std::log(z)).epsilon(1e-6));
    // The same value as the sampled token's log-probability.
    CHECK(t.logprob == zipage::token_logprob_of(row, t.id));
  }
  CHECK(top[0].logprob == top[1].logprob);
  CHECK(zipage::token_logprob_of(row, 2) == -inf_f);
  // k beyond the vocabulary: every token, -inf last; k = 0: none.
  const auto all = zipage::top_logprobs(row, 20);
  REQUIRE(all.size() == row.size());
  CHECK(all.back().id == 2);
  CHECK(all.back().logprob == -inf_f);
  CHECK(zipage::top_logprobs(row, 0).empty());
  // The probabilities of the whole row sum to 1.
  double mass = 0.0;
  for (const auto& t : all) mass += std::exp(static_cast<double>(t.logprob));
  CHECK(mass == doctest::Approx(1.0).epsilon(1e-6));
  // NaN counts as -inf (ties by id), +inf as the largest float: never a NaN log-probability.
  const auto with_nan = zipage::top_logprobs(std::vector<float>{nan_f, -inf_f, 0.0f}, 3);
  CHECK(with_nan[0].id == 2);
  CHECK(with_nan[0].logprob == 0.0f);
  CHECK(with_nan[1].id == 0);
  CHECK(with_nan[1].logprob == -inf_f);
  CHECK(with_nan[2].id == 1);
  const auto with_inf = zipage::top_logprobs(std::vector<float>{1.0f, inf_f, inf_f}, 3);
  CHECK(with_inf[0].id == 1);
  CHECK(with_inf[0].logprob == doctest::Approx(std::log(0.5)));
  CHECK(with_inf[2].logprob < -1e38f);
  CHECK_THROWS_AS((void)zipage::top_logprobs(row, -1), zipage::error);
  CHECK_THROWS_AS((void)zipage::token_logprob_of(row, 6), zipage::error);

  // A large row against a full sort.
  std::vector<float> big(3000);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = std::floor(40.0f * zipage::sampling_uniform(5, i)) / 4.0f;
  std::vector<token_id> order(big.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](token_id a, token_id b) { return big[a] > big[b]; });
  const auto top20 = zipage::top_logprobs(big, 20);
  REQUIRE(top20.size() == 20);
  for (std::size_t i = 0; i < 20; ++i) CHECK(top20[i].id == order[i]);
}

TEST_CASE("non-finite logits do not crash") {
  sampler s;
  const sampling_params p = with(1.0f);
  SUBCASE("NaN is never drawn") {
    const auto freq = frequencies({1.0f, nan_f, 1.0f, nan_f}, p);
    CHECK(freq[1] == 0.0);
    CHECK(freq[3] == 0.0);
    CHECK(freq[0] == doctest::Approx(0.5).epsilon(0.05));
    CHECK(s.sample(std::vector<float>{nan_f, 0.0f, nan_f}, with(0.0f), {}, 0) == 1);
  }
  SUBCASE("all -inf or NaN gives token 0") {
    for (std::uint64_t seed = 0; seed < 20; ++seed) {
      sampling_params q = with(1.0f, 2, 0.5f, 0.1f);
      q.seed = seed;
      CHECK(s.sample(std::vector<float>{-inf_f, -inf_f, -inf_f}, q, {}, seed) == 0);
      CHECK(s.sample(std::vector<float>{nan_f, nan_f}, q, {}, seed) == 0);
      CHECK(s.sample(std::vector<float>{nan_f, -inf_f}, with(0.0f), {}, seed) == 0);
    }
  }
  SUBCASE("+inf wins; several +inf share the mass") {
    CHECK(frequencies({0.0f, inf_f, 3.0f}, p)[1] == 1.0);
    const auto freq = frequencies({inf_f, 0.0f, inf_f}, p);
    CHECK(freq[1] == 0.0);
    CHECK(freq[0] == doctest::Approx(0.5).epsilon(0.05));
    CHECK(s.sample(std::vector<float>{1.0f, inf_f, inf_f}, with(0.0f), {}, 0) == 1);
    // A penalty below 1 on +inf must not turn into inf - inf = NaN.
    sampling_params q = with(1.0f);
    q.repetition_penalty = 0.5f;
    CHECK(s.sample(std::vector<float>{0.0f, inf_f}, q, std::vector<token_id>{1}, 0) == 1);
    // Boosted +inf is still the largest float, so it keeps tying with the other +inf.
    const auto boosted = frequencies({inf_f, inf_f, 0.0f}, q, {0});
    CHECK(boosted[0] == doctest::Approx(0.5).epsilon(0.05));
    CHECK(boosted[2] == 0.0);
  }
  SUBCASE("an empty row is an error") {
    CHECK_THROWS_AS(s.sample(std::span<const float>{}, p, {}, 0), zipage::error);
  }
}

TEST_CASE("lazy partial sorting agrees with a full-sort reference on a large vocabulary") {
  // 5000 logits from the counter RNG (deterministic), spread over ~12 nats so the tail is long.
  std::vector<float> logits(5000);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = 12.0f * zipage::sampling_uniform(777, i);
  logits[123] = logits[4000];  // an exact tie
  sampler s;
  const sampling_params configs[] = {with(1.0f), with(0.7f, 40), with(1.3f, 0, 0.9f), with(1.0f, 200, 0.95f, 0.01f),
                                     with(2.0f, 0, 0.999f), with(1.0f, 0, 1.0f, 0.05f), with(0.5f, 1000, 0.5f)};
  for (const sampling_params& base : configs) {
    for (std::uint64_t seed = 0; seed < 40; ++seed) {
      sampling_params p = base;
      p.seed = seed;
      CAPTURE(seed);
      CHECK(s.sample(logits, p, {}, seed + 1) == reference_sample(logits, p, seed + 1));
    }
  }
}

TEST_CASE("sample does not allocate once its buffers have grown") {
  std::vector<float> logits(1000);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = 5.0f * zipage::sampling_uniform(3, i);
  const std::vector<token_id> context = {1, 5, 9, 5, 700};
  sampling_params p = with(0.8f, 50, 0.9f, 0.05f);
  p.repetition_penalty = 1.3f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = -0.2f;
  sampler s;
  s.sample(logits, p, context, 3);  // grows the buffers to the vocabulary size
  const std::size_t before = g_allocations.load();
  token_id sink = 0;
  for (std::uint64_t step = 0; step < 50; ++step) {
    sink += s.sample(logits, p, context, step);
    sink += s.sample(logits, with(1.0f), context, step);
    sink += s.sample(logits, with(0.0f), context, step);
  }
  CHECK(g_allocations.load() == before);
  CHECK(sink >= 0);
}

TEST_CASE("validate rejects bad fields, naming the field and value") {
  CHECK_NOTHROW(sampling_params{}.validate());
  sampling_params edge = with(0.0f, 0, 1.0f, 1.0f);
  edge.repetition_penalty = 0.01f;
  edge.max_tokens = 1;
  edge.stop = {"\n\n"};
  edge.stop_token_ids = {0, 2};
  edge.frequency_penalty = -2.0f;
  edge.presence_penalty = 2.0f;
  edge.logprobs = true;
  edge.top_logprobs = 20;
  CHECK_NOTHROW(edge.validate());
  CHECK_NOTHROW(with(5.0f, 3, 1e-6f, 0.0f).validate());
  CHECK_NOTHROW(with(1.0f, -1).validate());  // vLLM's "off"
  sampling_params processors;
  processors.logit_bias = {{0, -100.0f}, {7, 100.0f}};
  processors.allowed_token_ids = std::vector<token_id>{0};
  processors.bad_words = {" word"};
  processors.max_tokens = processors.min_tokens = 3;
  CHECK_NOTHROW(processors.validate());

  struct bad_case {
    sampling_params p;
    std::string message;
  };
  auto make = [](auto edit) {
    sampling_params p;
    edit(p);
    return p;
  };
  const bad_case cases[] = {
      {make([](auto& p) { p.temperature = -0.5f; }), "sampling: temperature must be finite and >= 0 (0 = greedy), got -0.5"},
      {make([](auto& p) { p.temperature = nan_f; }), "temperature"},
      {make([](auto& p) { p.temperature = inf_f; }), "temperature"},
      {make([](auto& p) { p.top_k = -2; }), "sampling: top_k must be >= -1 (0 or -1 = off), got -2"},
      {make([](auto& p) { p.top_p = 1.5f; }), "sampling: top_p must be in (0, 1], got 1.5"},
      {make([](auto& p) { p.top_p = 0.0f; }), "sampling: top_p must be in (0, 1], got 0"},
      {make([](auto& p) { p.top_p = nan_f; }), "sampling: top_p must be in (0, 1], got nan"},
      {make([](auto& p) { p.min_p = -0.1f; }), "sampling: min_p must be in [0, 1], got -0.1"},
      {make([](auto& p) { p.min_p = 1.5f; }), "sampling: min_p must be in [0, 1], got 1.5"},
      {make([](auto& p) { p.min_p = nan_f; }), "min_p"},
      {make([](auto& p) { p.repetition_penalty = 0.0f; }), "sampling: repetition_penalty must be finite and > 0 (1 = off), got 0"},
      {make([](auto& p) { p.repetition_penalty = -1.0f; }), "repetition_penalty"},
      {make([](auto& p) { p.repetition_penalty = nan_f; }), "repetition_penalty"},
      {make([](auto& p) { p.frequency_penalty = 2.5f; }), "sampling: frequency_penalty must be in [-2, 2] (0 = off), got 2.5"},
      {make([](auto& p) { p.frequency_penalty = nan_f; }), "frequency_penalty"},
      {make([](auto& p) { p.presence_penalty = -2.01f; }), "sampling: presence_penalty must be in [-2, 2] (0 = off), got -2.01"},
      {make([](auto& p) { p.presence_penalty = inf_f; }), "presence_penalty"},
      {make([](auto& p) { p.logprobs = true, p.top_logprobs = 21; }), "sampling: top_logprobs must be in [0, 20], got 21"},
      {make([](auto& p) { p.logprobs = true, p.top_logprobs = -1; }), "top_logprobs"},
      {make([](auto& p) { p.top_logprobs = 3; }), "sampling: top_logprobs > 0 needs logprobs"},
      {make([](auto& p) { p.max_tokens = 0; }), "sampling: max_tokens must be >= 1, got 0"},
      {make([](auto& p) { p.stop = {"ok", ""}; }), "sampling: stop[1] must not be empty"},
      {make([](auto& p) { p.stop_token_ids = {3, -2}; }), "sampling: stop_token_ids[1] must be >= 0, got -2"},
      {make([](auto& p) { p.logit_bias = {{5, 100.5f}}; }),
       "sampling: logit_bias[5] must be in [-100, 100], got 100.5"},
      {make([](auto& p) { p.logit_bias = {{5, nan_f}}; }), "logit_bias[5]"},
      {make([](auto& p) { p.logit_bias = {{-1, 1.0f}}; }), "sampling: logit_bias holds token id -1"},
      {make([](auto& p) { p.allowed_token_ids = std::vector<token_id>{}; }),
       "sampling: allowed_token_ids is set but empty"},
      {make([](auto& p) { p.allowed_token_ids = std::vector<token_id>{1, -3}; }),
       "sampling: allowed_token_ids[1] must be >= 0, got -3"},
      {make([](auto& p) { p.bad_words = {"ok", " \t"}; }), "sampling: bad_words[1] must hold more than whitespace"},
      {make([](auto& p) { p.min_tokens = -1; }), "sampling: min_tokens must be in [0, max_tokens = 256], got -1"},
      {make([](auto& p) { p.max_tokens = 4, p.min_tokens = 5; }),
       "sampling: min_tokens must be in [0, max_tokens = 4]"},
  };
  for (const bad_case& c : cases) {
    const std::string message = validation_error(c.p);
    CAPTURE(message);
    CHECK(message.find(c.message) != std::string::npos);
    CHECK(message.rfind("sampling: ", 0) == 0);
  }
}

TEST_CASE("logits processors: vLLM's allowed_token_ids, bad_words, logit_bias and min_tokens, before the rest") {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f, 4.0f, 0.5f};
  sampler s;
  const std::vector<token_id> none;
  auto greedy_with = [](auto edit) {
    sampling_params p = with(0.0f);
    edit(p);
    return p;
  };
  CHECK(s.sample(logits, with(0.0f), none, 0) == 3);
  CHECK_FALSE(with(0.0f).processes_logits(0));

  SUBCASE("logit_bias is added to the token's logit, also before greedy's argmax") {
    CHECK(s.sample(logits, greedy_with([](auto& p) { p.logit_bias = {{3, -100.0f}}; }), none, 0) == 2);
    CHECK(s.sample(logits, greedy_with([](auto& p) { p.logit_bias = {{3, -1.5f}}; }), none, 0) == 2);
    CHECK(s.sample(logits, greedy_with([](auto& p) { p.logit_bias = {{3, -0.5f}}; }), none, 0) == 3);
    CHECK(s.sample(logits, greedy_with([](auto& p) { p.logit_bias = {{4, 3.6f}}; }), none, 0) == 4);
    // Sampled: a +100 bias makes a token certain, whatever the seed.
    sampling_params p = with(1.0f);
    p.logit_bias = {{0, 100.0f}};
    for (std::uint64_t seed = 0; seed < 50; ++seed) {
      p.seed = seed;
      CHECK(s.sample(logits, p, none, seed) == 0);
    }
  }
  SUBCASE("allowed_token_ids: only they are sampled; a bias on another token does not bring it back") {
    sampling_params p = with(1.0f);
    p.allowed_token_ids = std::vector<token_id>{0, 4};
    p.logit_bias = {{3, 100.0f}};
    std::set<token_id> seen;
    for (std::uint64_t seed = 0; seed < 200; ++seed) {
      p.seed = seed;
      seen.insert(s.sample(logits, p, none, 0));
    }
    CHECK(seen == std::set<token_id>{0, 4});
    const auto two = greedy_with([](auto& p) { p.allowed_token_ids = std::vector<token_id>{1, 4}; });
    CHECK(s.sample(logits, two, none, 0) == 1);
  }
  SUBCASE("bad_words: a one-token word at every step; a longer one when the generated tokens end with its prefix") {
    token_rules rules;
    rules.bad_words = {{3}};
    CHECK(s.sample(logits, greedy_with([](auto& p) { p.bad_words = {"x"}; }), none, 0, rules) == 2);
    rules.bad_words = {{1, 4, 3}};
    const auto p = greedy_with([](auto& p) { p.bad_words = {"x"}; });
    const std::vector<token_id> ends_with_prefix = {0, 1, 4};  // prompt {0}, generated {1, 4}
    CHECK(s.sample(logits, p, ends_with_prefix, 2, rules) == 2);
    CHECK(s.sample(logits, p, ends_with_prefix, 1, rules) == 3);  // the prefix's first token is the prompt's
    CHECK(s.sample(logits, p, std::vector<token_id>{1, 4, 0}, 3, rules) == 3);
    CHECK(s.sample(logits, p, std::vector<token_id>{4}, 1, rules) == 3);  // shorter than the prefix
  }
  SUBCASE("min_tokens: EOS ids and stop_token_ids are -inf before min_tokens tokens") {
    token_rules rules;
    rules.eos_ids = {3};
    sampling_params p = greedy_with([](auto& p) { p.min_tokens = 2, p.stop_token_ids = {2}; });
    CHECK(p.processes_logits(1));
    CHECK_FALSE(p.processes_logits(2));
    CHECK(s.sample(logits, p, none, 0, rules) == 1);
    CHECK(s.sample(logits, p, none, 1, rules) == 1);
    CHECK(s.sample(logits, p, none, 2, rules) == 3);
    p.logit_bias = {{3, 100.0f}};  // a bias does not bring an EOS back before min_tokens
    CHECK(s.sample(logits, p, none, 0, rules) == 1);
  }
  SUBCASE("the penalties apply to the processed logits") {
    // Token 0 biased to 11 then repetition-penalised to 5.5 still wins; from its raw logit it would be 0.5.
    sampling_params p = greedy_with([](auto& p) { p.logit_bias = {{0, 10.0f}}, p.repetition_penalty = 2.0f; });
    CHECK(s.sample(logits, p, std::vector<token_id>{0}, 0) == 0);
  }
  SUBCASE("log-probabilities stay the raw model's") {
    const float raw = token_logprob_of(logits, 3);
    CHECK(s.sample(logits, greedy_with([](auto& p) { p.logit_bias = {{1, 50.0f}}; }), none, 0) == 1);
    CHECK(token_logprob_of(logits, 3) == raw);
  }
  SUBCASE("an id outside the row is an error, not a write past it") {
    CHECK_THROWS_AS(s.sample(logits, greedy_with([](auto& p) { p.logit_bias = {{5, 1.0f}}; }), none, 0), zipage::error);
    CHECK_THROWS_AS(s.sample(logits, greedy_with([](auto& p) { p.allowed_token_ids = std::vector<token_id>{9}; }), none,
                             0),
                    zipage::error);
  }
}

TEST_CASE("encode_bad_words: as vLLM, as written and with a leading space when that is a new word token") {
  // A toy encoder: a word is one token per letter, with a leading space the first letter's token + 100; "ab"
  // with a space splits into a space token (99) and two letters.
  auto encode = [](const std::string& text) {
    std::vector<token_id> ids;
    if (text == " ab") return std::vector<token_id>{99, 'a', 'b'};
    for (std::size_t i = 0; i < text.size(); ++i) {
      if (text[i] == ' ') continue;
      ids.push_back(static_cast<token_id>(text[i]) + (i == 1 && text[0] == ' ' ? 100 : 0));
    }
    return ids;
  };
  const auto words = encode_bad_words({"  x", "yz", "ab"}, encode);
  const std::vector<std::vector<token_id>> want = {{'x'}, {'x' + 100}, {'y', 'z'}, {'y' + 100, 'z'}, {'a', 'b'}};
  CHECK(words == want);
  CHECK_THROWS_WITH_AS((void)encode_bad_words({"x", "??"}, [](const std::string& t) {
                         return t.find('?') != std::string::npos ? std::vector<token_id>{} : std::vector<token_id>{1};
                       }),
                       "sampling: bad_words[1] (\"??\") encodes to no tokens", zipage::error);
}

TEST_CASE("logits processors do not allocate once the buffers have grown") {
  std::vector<float> logits(1000);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = 5.0f * zipage::sampling_uniform(5, i);
  sampling_params p = with(0.8f, 50);
  p.logit_bias = {{3, 2.0f}, {40, -100.0f}};
  p.allowed_token_ids = std::vector<token_id>{1, 3, 5, 40, 700};
  p.min_tokens = 100;
  p.stop_token_ids = {5};
  token_rules rules;
  rules.bad_words = {{1}, {5, 700}};
  rules.eos_ids = {3};
  const std::vector<token_id> context = {1, 5, 9, 5, 700};
  sampler s;
  s.sample(logits, p, context, 2, rules);
  const std::size_t before = g_allocations.load();
  token_id sink = 0;
  for (std::uint64_t step = 0; step < 50; ++step) sink += s.sample(logits, p, context, step % 4, rules);
  CHECK(g_allocations.load() == before);
  CHECK(sink >= 0);
}


// vLLM's processors applied one after the other on a dense row, as the sampler did before the sparse edit.
std::vector<float> processors_one_by_one(const std::vector<float>& raw, const sampling_params& p,
                                         const std::vector<token_id>& context, std::uint64_t step,
                                         const token_rules& rules) {
  constexpr float ban = -std::numeric_limits<float>::infinity();
  std::vector<float> row = raw;
  if (p.allowed_token_ids) {
    std::fill(row.begin(), row.end(), ban);
    for (const token_id t : *p.allowed_token_ids) row[static_cast<std::size_t>(t)] = raw[static_cast<std::size_t>(t)];
  }
  const std::size_t gen = std::min<std::size_t>(step, context.size());
  for (const auto& word : rules.bad_words) {
    if (word.size() - 1 > gen) continue;
    bool match = true;
    for (std::size_t i = 0; i + 1 < word.size(); ++i)
      match = match && context[context.size() - (word.size() - 1) + i] == word[i];
    if (match) row[static_cast<std::size_t>(word.back())] = ban;
  }
  for (const auto& [t, bias] : p.logit_bias) row[static_cast<std::size_t>(t)] += bias;
  if (step < static_cast<std::uint64_t>(p.min_tokens)) {
    for (const token_id t : rules.eos_ids) row[static_cast<std::size_t>(t)] = ban;
    for (const token_id t : p.stop_token_ids) row[static_cast<std::size_t>(t)] = ban;
  }
  return row;
}

TEST_CASE("logit edits: sorted, merged, and the same row as the processors applied one after the other") {
  SUBCASE("merging: a ban wins over a bias and an allowed id; ids only a bias names stay out under allowed") {
    sampling_params p;
    p.allowed_token_ids = std::vector<token_id>{7, 2, 7, 5};
    p.logit_bias = {{5, 1.5f}, {9, 3.0f}, {2, -2.0f}};
    p.min_tokens = 3;
    p.stop_token_ids = {2};
    token_rules rules;
    rules.eos_ids = {8};
    zipage::logit_edits e;
    zipage::make_logit_edits(e, p, {}, 0, rules, 10);
    constexpr float ban = -std::numeric_limits<float>::infinity();
    CHECK(e.others_banned);
    CHECK(e.ids == std::vector<token_id>{2, 5, 7, 8, 9});
    CHECK(e.adds == std::vector<float>{ban, 1.5f, 0.0f, ban, ban});
    zipage::make_logit_edits(e, p, {}, 3, rules, 10);  // min_tokens reached: 2 is allowed again, with its bias
    CHECK(e.ids == std::vector<token_id>{2, 5, 7, 9});
    CHECK(e.adds == std::vector<float>{-2.0f, 1.5f, 0.0f, ban});
    p.logit_bias[10] = 1.0f;
    CHECK_THROWS_WITH(zipage::make_logit_edits(e, p, {}, 3, rules, 10),
                      doctest::Contains("logit_bias token 10 is outside the vocabulary of 10"));
  }
  SUBCASE("ids already ascending and unique (no sort): an id outside the allowed ones is banned, others kept") {
    sampling_params p;
    p.allowed_token_ids = std::vector<token_id>{1, 4};
    p.logit_bias = {{6, 2.0f}, {9, -1.0f}};
    zipage::logit_edits e;
    zipage::make_logit_edits(e, p, {}, 0, token_rules{}, 10);
    constexpr float ban = -std::numeric_limits<float>::infinity();
    CHECK(e.others_banned);
    CHECK(e.ids == std::vector<token_id>{1, 4, 6, 9});
    CHECK(e.adds == std::vector<float>{0.0f, 0.0f, ban, ban});
    p.allowed_token_ids.reset();  // biases alone, ascending: kept as they are
    zipage::make_logit_edits(e, p, {}, 0, token_rules{}, 10);
    CHECK_FALSE(e.others_banned);
    CHECK(e.ids == std::vector<token_id>{6, 9});
    CHECK(e.adds == std::vector<float>{2.0f, -1.0f});
  }
  SUBCASE("random requests: every value equal to the one-by-one processors' (NaN and infinities included)") {
    std::uint64_t state = 12345;
    auto next = [&state](std::uint64_t n) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return (state >> 33) % n;
    };
    constexpr int vocab = 64;
    zipage::logit_edits e;
    std::vector<float> edited(vocab);
    for (int trial = 0; trial < 2000; ++trial) {
      std::vector<float> raw(vocab);
      for (float& x : raw) x = static_cast<float>(next(2001)) / 100.0f - 10.0f;
      raw[next(vocab)] = std::numeric_limits<float>::quiet_NaN();
      raw[next(vocab)] = std::numeric_limits<float>::infinity();
      raw[next(vocab)] = -std::numeric_limits<float>::infinity();
      sampling_params p;
      if (next(3) == 0) {
        std::vector<token_id> allowed;
        for (std::uint64_t k = 1 + next(6); k > 0; --k) allowed.push_back(static_cast<token_id>(next(vocab)));
        p.allowed_token_ids = allowed;
      }
      for (std::uint64_t k = next(5); k > 0; --k)
        p.logit_bias[static_cast<token_id>(next(vocab))] = static_cast<float>(next(201)) - 100.0f;
      p.min_tokens = static_cast<int>(next(4));
      for (std::uint64_t k = next(3); k > 0; --k) p.stop_token_ids.push_back(static_cast<token_id>(next(vocab)));
      token_rules rules;
      for (std::uint64_t k = next(3); k > 0; --k) rules.eos_ids.push_back(static_cast<token_id>(next(vocab)));
      std::vector<token_id> context;
      for (std::uint64_t k = next(8); k > 0; --k) context.push_back(static_cast<token_id>(next(4)));
      for (std::uint64_t k = next(4); k > 0; --k) {
        std::vector<token_id> word;
        for (std::uint64_t j = 1 + next(3); j > 0; --j) word.push_back(static_cast<token_id>(next(4)));
        rules.bad_words.push_back(word);
      }
      const std::uint64_t step = next(context.size() + 2);
      zipage::make_logit_edits(e, p, context, step, rules, vocab);
      CHECK(std::is_sorted(e.ids.begin(), e.ids.end()));
      CHECK(std::adjacent_find(e.ids.begin(), e.ids.end()) == e.ids.end());
      zipage::apply_logit_edits(raw, e, edited);
      const std::vector<float> want = processors_one_by_one(raw, p, context, step, rules);
      for (int i = 0; i < vocab; ++i) {
        const auto u = static_cast<std::size_t>(i);
        INFO("trial ", trial, " token ", i);
        if (std::isnan(want[u])) CHECK(std::isnan(edited[u]));
        else CHECK(edited[u] == want[u]);
      }
    }
  }
}

TEST_CASE("logit edits as CSR: rows appended in order, empty rows and others_banned; each slice applies as its row") {
  constexpr float ban = -std::numeric_limits<float>::infinity();
  constexpr int vocab = 12;
  token_rules rules;
  rules.eos_ids = {11};
  std::vector<sampling_params> ps(6);
  ps[1].allowed_token_ids = std::vector<token_id>{7, 2};
  ps[1].logit_bias = {{2, 0.5f}, {4, 1.0f}};
  ps[3].logit_bias = {{9, -2.0f}, {3, 1.5f}};
  ps[4].min_tokens = 1;  // reached at step 1: processes nothing, an empty edit appended as such
  ps[5].min_tokens = 4;
  ps[5].stop_token_ids = {0};
  const std::uint64_t steps[] = {0, 0, 0, 0, 1, 2};
  // Rows 0 and 2 are unedited (append_none), row 4 appends an empty edit: all three are empty ranges.
  std::vector<zipage::logit_edits> want(ps.size());
  zipage::logit_edit_csr csr;
  csr.append_none();  // what clear() must come back to, after a first use
  csr.clear();
  CHECK(csr.indptr == std::vector<std::int32_t>{0});
  CHECK(csr.rows() == 0);
  for (std::size_t r = 0; r < ps.size(); ++r) {
    if (r == 0 || r == 2) {
      csr.append_none();
      continue;
    }
    zipage::make_logit_edits(want[r], ps[r], {}, steps[r], rules, vocab);
    csr.append(want[r]);
  }
  CHECK(want[4].empty());
  CHECK(csr.rows() == 6);
  CHECK(csr.indptr == std::vector<std::int32_t>{0, 0, 3, 3, 5, 5, 7});
  CHECK(csr.ids == std::vector<token_id>{2, 4, 7, 3, 9, 0, 11});
  CHECK(csr.adds == std::vector<float>{0.5f, ban, 0.0f, 1.5f, -2.0f, ban, ban});
  CHECK(csr.others_banned == std::vector<std::int32_t>{0, 1, 0, 0, 0, 0});

  std::vector<float> raw(vocab);
  for (int i = 0; i < vocab; ++i) raw[static_cast<std::size_t>(i)] = 0.25f * static_cast<float>(i) - 1.0f;
  raw[3] = std::numeric_limits<float>::quiet_NaN();
  raw[9] = std::numeric_limits<float>::infinity();
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    for (std::size_t i = 0; i < a.size(); ++i)
      if (std::isnan(a[i]) ? !std::isnan(b[i]) : a[i] != b[i]) return false;
    return a.size() == b.size();
  };
  std::vector<float> expected(vocab), got(vocab), via_row(vocab);
  for (std::size_t r = 0; r < ps.size(); ++r) {
    INFO("row ", r);
    zipage::apply_logit_edits(raw, want[r], expected);
    // As the kernel reads the CSR: the row's flag, then its range of ids and adds.
    got = raw;
    if (csr.others_banned[r] != 0) std::fill(got.begin(), got.end(), ban);
    for (auto k = static_cast<std::size_t>(csr.indptr[r]); k < static_cast<std::size_t>(csr.indptr[r + 1]); ++k) {
      const auto t = static_cast<std::size_t>(csr.ids[k]);
      got[t] = zipage::logit_edited(raw[t], csr.adds[k]);
    }
    CHECK(same(got, expected));
    zipage::apply_logit_edits(raw, csr.row(r), via_row);
    CHECK(same(via_row, expected));
  }
  CHECK_THROWS_WITH((void)csr.row(6), doctest::Contains("row 6 of 6"));
}

}  // TEST_SUITE
