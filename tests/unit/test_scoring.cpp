// The scoring pieces and built-in policies against hand-computed values on tiny tensors. Expected numbers
// are worked out in the comments (or with a line of explicit arithmetic written independently of the
// implementation); each case says what it demonstrates.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "zipage/policy/policies.hpp"
#include "zipage/policy/scoring.hpp"

using namespace zipage;
using doctest::Approx;

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();
const float sqrt2 = std::sqrt(2.0f);

void check_close(std::span<const float> got, const std::vector<double>& want, double eps = 1e-6) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("index ", i);
    CHECK(got[i] == Approx(want[i]).epsilon(eps));
  }
}

// softmax(x / t), spelled out for the expected values.
std::vector<double> softmax_over(const std::vector<double>& x, double t) {
  std::vector<double> e;
  double sum = 0;
  for (double v : x) sum += e.emplace_back(std::exp(v / t));
  for (double& v : e) v /= sum;
  return e;
}

// The k highest-scoring token indices of one head's row.
std::set<int> top_k(std::span<const float> row, int k) {
  std::vector<int> idx(row.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) { return row[a] > row[b]; });
  return {idx.begin(), idx.begin() + k};
}

// The GQA case: kv_len 4, head_dim 2, 2 KV heads, 4 query heads (group 2), window 2.
// KV head 0: k_j = sqrt2 * (ln a_j, ln b_j) with a = (2,1,1,4), b = (1,1,2,4), and its query heads are
// g0 = (1,0), g1 = (0,1) in both window slots, so q.k_j / sqrt(2) = ln a_j (g0) or ln b_j (g1): the
// softmax is simply a (or b) normalised over the visible tokens.
// KV head 1: any keys, all-zero queries: the softmax is uniform over the visible tokens.
struct gqa_case {
  std::vector<float> keys, queries;
  score_context ctx;

  gqa_case() {
    const float a[] = {2, 1, 1, 4}, b[] = {1, 1, 2, 4};
    for (int j = 0; j < 4; ++j) keys.insert(keys.end(), {sqrt2 * std::log(a[j]), sqrt2 * std::log(b[j])});
    keys.insert(keys.end(), {1, 2, 3, 4, 5, 6, 7, 8});
    for (int w = 0; w < 2; ++w) queries.insert(queries.end(), {1, 0, 0, 1, 0, 0, 0, 0});
    ctx = {.kv_len = 4, .num_kv_heads = 2, .num_q_heads = 4, .head_dim = 2, .block_size = 2, .window = 2,
           .keys = keys, .queries = queries};
  }
};

// Random tensors big enough that pooling, blocks and history all matter: kv_len 12 (3 blocks of 4),
// head_dim 4, 2 KV heads, group 2, window 2; prev_scores for later compressions.
struct random_case {
  std::vector<float> keys, queries, prev;
  score_context ctx;

  explicit random_case(bool first, int kv_len = 12, int block_size = 4, int window = 2, int head_dim = 4) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    keys.resize(2 * static_cast<std::size_t>(kv_len) * head_dim);
    queries.resize(static_cast<std::size_t>(window) * 4 * head_dim);
    prev.resize(2 * static_cast<std::size_t>(kv_len));
    for (float& v : keys) v = 2.0f * u(rng);
    for (float& v : queries) v = 2.0f * u(rng);
    for (float& v : prev) v = 0.5f + 0.5f * u(rng);
    ctx = {.kv_len = kv_len, .num_kv_heads = 2, .num_q_heads = 4, .head_dim = head_dim, .block_size = block_size,
           .window = window, .first_compression = first, .keys = keys, .queries = queries, .prev_scores = prev};
  }
  [[nodiscard]] std::vector<float> scores() const { return std::vector<float>(2 * ctx.kv_len); }
  [[nodiscard]] std::vector<float> attention() const {
    auto a = scores();
    scoring::window_attention(ctx, a);
    return a;
  }
};

}  // namespace

TEST_CASE("window_attention: causal inside the window, max over the GQA group, mean over the window") {
  gqa_case c;
  std::vector<float> a(8);
  scoring::window_attention(c.ctx, a);
  // Head 0. w = 0 sits at p = 2, so token 3 is masked: g0 = (2,1,1)/4, g1 = (1,1,2)/4, group max
  // (.5, .25, .5, 0). w = 1 (p = 3) sees all: g0 = (2,1,1,4)/8, g1 = (1,1,2,4)/8, max (.25, .125, .25, .5).
  // Mean over the window: (.375, .1875, .375, .25). (Averaging the group instead of max would give
  // .28125 for token 0; forgetting the mask would give token 3 a .5.)
  // Head 1, zero queries: w = 0 uniform 1/3 over tokens 0..2, w = 1 uniform 1/4 over 0..3:
  // (1/3 + 1/4) / 2 = 7/24 for tokens 0..2, (0 + 1/4) / 2 = 1/8 for token 3.
  check_close(a, {.375, .1875, .375, .25, 7.0 / 24, 7.0 / 24, 7.0 / 24, 1.0 / 8});
}

TEST_CASE("window_attention: stable for large logits, and each query's softmax sums to one") {
  // Head 0 of the GQA case with every logit shifted by +1000: exp() would overflow without the max shift,
  // and the shift cancels in the softmax. (1000 + ln a in float carries ~1e-4 absolute error.)
  gqa_case c;
  for (int j = 0; j < 4; ++j) c.keys[2 * j] += sqrt2 * 1000.0f, c.keys[2 * j + 1] += sqrt2 * 1000.0f;
  std::vector<float> a(8);
  scoring::window_attention(c.ctx, a);
  for (int j = 0; j < 4; ++j) CHECK(std::isfinite(a[j]));
  check_close(std::span(a).first(4), {.375, .1875, .375, .25}, 1e-3);

  // Group 1: no max to take, so sum_j A_j = mean over the window of (sum of one softmax) = 1.
  random_case r(true, 12, 4, 3);
  r.ctx.num_q_heads = 2;
  r.queries.resize(3 * 2 * 4);
  r.ctx.queries = r.queries;
  const auto att = r.attention();
  CHECK(std::accumulate(att.begin(), att.begin() + 12, 0.0) == Approx(1.0).epsilon(1e-6));
  CHECK(std::accumulate(att.begin() + 12, att.end(), 0.0) == Approx(1.0).epsilon(1e-6));
}

TEST_CASE("global_score: decayed max with the history, except at the first compression and in the newest block") {
  // kv_len 8, block 4: tokens 0..3 have history, tokens 4..7 are the newest block (never scored before).
  const std::vector<float> a = {0.1f, 0.5f, 0.2f, 0.0f, 0.3f, 0.3f, 0.3f, 0.3f};
  const std::vector<float> prev = {1.0f, 0.5f, 0.25f, 0.0f, 9.0f, 9.0f, 9.0f, 9.0f};
  score_context ctx{.kv_len = 8, .num_kv_heads = 1, .block_size = 4, .first_compression = false, .prev_scores = prev};
  std::vector<float> s(8);
  scoring::global_score(ctx, a, 0.8f, s);
  // 0: max(.1, .8*1) = .8, the decayed past wins; 1: max(.5, .4) = .5, the fresh score wins;
  // 2: max(.2, .2); 3: 0; 4..7: A, the stale 9s of the newest block are ignored.
  check_close(s, {0.8, 0.5, 0.2, 0.0, 0.3, 0.3, 0.3, 0.3});

  // First compression: prev_scores hold nothing (here: not even provided), S = A everywhere.
  ctx.first_compression = true;
  ctx.prev_scores = {};
  scoring::global_score(ctx, a, 0.8f, s);
  CHECK(s == a);
}

TEST_CASE("accumulated_score (H2O): sum with the history under the same conditions") {
  const std::vector<float> a = {0.1f, 0.5f, 0.2f, 0.0f, 0.3f, 0.3f, 0.3f, 0.3f};
  const std::vector<float> prev = {1.0f, 0.5f, 0.25f, 0.0f, 9.0f, 9.0f, 9.0f, 9.0f};
  score_context ctx{.kv_len = 8, .num_kv_heads = 1, .block_size = 4, .first_compression = false, .prev_scores = prev};
  std::vector<float> s(8);
  scoring::accumulated_score(ctx, a, s);
  check_close(s, {1.1, 1.0, 0.45, 0.0, 0.3, 0.3, 0.3, 0.3});
  ctx.first_compression = true;
  scoring::accumulated_score(ctx, a, s);
  CHECK(s == a);
}

TEST_CASE("max_pool: centred window clipped at the edges, heads pooled separately") {
  // Negative values show the clipping: zero padding would lift both ends to 0. Head 1's 9 must not
  // leak into head 0, nor head 1's leading 0s lift head 0's last token.
  const std::vector<float> input = {-3, -1, -2, -5, -4, -6, /* head 1 */ 0, 0, 0, 0, 0, 9};
  auto s = input;
  scoring::max_pool(s, 2, 6, 3);
  // j0: max(-3,-1); j1: max(-3,-1,-2); j2: max(-1,-2,-5); j3: max(-2,-5,-4); j4: max(-5,-4,-6); j5: max(-4,-6).
  CHECK(s == std::vector<float>{-1, -1, -1, -2, -4, -4, 0, 0, 0, 0, 9, 9});
  s = input;
  scoring::max_pool(s, 2, 6, 5);
  // Radius 2: j3 sees -1 at j1; j4 sees j2..j5; j5 sees j3..j5.
  CHECK(s == std::vector<float>{-1, -1, -1, -1, -2, -4, 0, 0, 0, 9, 9, 9});
  s = input;
  scoring::max_pool(s, 2, 6, 1);  // kernel 1: identity
  CHECK(s == input);
  CHECK_THROWS_AS(scoring::max_pool(s, 2, 6, 4), zipage::error);
  CHECK_THROWS_AS(scoring::max_pool(s, 2, 6, 0), zipage::error);
  CHECK_THROWS_AS(scoring::max_pool(s, 2, 5, 3), zipage::error);
}

namespace {
// Head 0, block 0: e1, 3*e1, 2*e2, 0.5*e1 (tokens 0, 1, 3 are exact duplicates in direction, with
// different norms, so normalisation matters). Block 1: e1, e2, -e1, -e2 (no duplicates inside it).
const std::vector<float> head0_keys = {1, 0, 3, 0, 0, 2, 0.5f, 0, /* block 1 */ 1, 0, 0, 1, -1, 0, 0, -1};
}  // namespace

TEST_CASE("block_redundancy: the newest duplicate survives, one softmax over the sequence at temperature tau * block_size") {
  // Head 1: all-zero keys, which normalise to 0 thanks to the eps: no similarity, uniform R.
  std::vector<float> keys = head0_keys;
  keys.resize(32, 0.0f);
  const score_context ctx{.kv_len = 8, .num_kv_heads = 2, .head_dim = 2, .block_size = 4, .keys = keys};
  for (const float tau : {0.4f, 0.2f}) {
    CAPTURE(tau);
    std::vector<float> r(16);
    scoring::block_redundancy(ctx, tau, r);
    // Block 0 similarity with a zero diagonal: tokens 0, 1, 3 pairwise 1, token 2 orthogonal (0).
    // Column 0: duplicates in rows 1, 3 -> newest row 3 loses sim(3,0). Column 1: rows 0, 3 -> sim(3,1).
    // Column 3: rows 0, 1 -> sim(1,3). Column 2: none. Row sums r = (2, 1, 0, 0): the newest duplicate,
    // token 3, ends with the lowest redundancy of the three and the oldest with the highest.
    // Block 1: every token is orthogonal to two and opposite to one: r = -1 each. Block 0's copies of e1
    // do not count against token 4: similarity stays within the block. The softmax runs over all eight
    // tokens of the head (the reference's normalisation), so the repetitive block 0 carries more of the
    // redundancy mass than the diverse block 1 - a per-block softmax would give each block mass 1.
    const auto head0 = softmax_over({2, 1, 0, 0, -1, -1, -1, -1}, tau * 4.0);
    std::vector<double> want(head0.begin(), head0.end());
    want.insert(want.end(), 8, 0.125);  // head 1: zero keys, uniform over the sequence
    check_close(r, want);
    CHECK(std::accumulate(r.begin(), r.begin() + 8, 0.0) == Approx(1.0).epsilon(1e-6));
    CHECK(std::accumulate(r.begin() + 4, r.begin() + 8, 0.0) < 0.25);  // per block it would be 1
  }
}

TEST_CASE("block_redundancy: a partial last block sums within itself, normalised with the rest at tau * block_size") {
  // kv_len 7, block 4: block 0 as above, block 1 holds 3 tokens e1, -e1, e2: r = (-1, -1, 0).
  std::vector<float> keys(head0_keys.begin(), head0_keys.begin() + 8);
  keys.insert(keys.end(), {1, 0, -1, 0, 0, 1});
  const score_context ctx{.kv_len = 7, .num_kv_heads = 1, .head_dim = 2, .block_size = 4, .keys = keys};
  std::vector<float> r(7);
  scoring::block_redundancy(ctx, 0.4f, r);
  check_close(r, softmax_over({2, 1, 0, 0, -1, -1, 0}, 0.4 * 4));
}

TEST_CASE("block_redundancy: of near-identical tokens 0, 1, 3 the newest is the least redundant") {
  // Tokens 0, 1, 3 within 0.02 rad of e1; token 2 far from them (cos ~0.3, under the 0.5 threshold).
  const std::vector<float> keys = {1, 0.02f, 2, 0, 0.3f, 1, 1, -0.02f};
  const score_context ctx{.kv_len = 4, .num_kv_heads = 1, .head_dim = 2, .block_size = 4, .keys = keys};
  std::vector<float> r(4);
  scoring::block_redundancy(ctx, 0.4f, r);
  // r ~ (1 + .29 + 1, 1 + .29, .86, .27): token 3 lost both its duplicate similarities, token 1 one.
  CHECK(r[3] < r[1]);
  CHECK(r[1] < r[0]);
  CHECK(r[3] < r[2]);
}

TEST_CASE("full_redundancy: duplicates across blocks count, softmax at tau * kv_len") {
  const score_context ctx{.kv_len = 8, .num_kv_heads = 1, .head_dim = 2, .block_size = 4, .keys = head0_keys};
  std::vector<float> r(8);
  scoring::full_redundancy(ctx, 0.4f, r);
  // Directions: e1 = {0,1,3,4}, e2 = {2,5}, -e1 = {6}, -e2 = {7}. Newest duplicate per column:
  // col 0,1,3 -> row 4; col 4 -> row 3; col 2 -> row 5; col 5 -> row 2. Row sums after zeroing:
  // r0 = r1 = 3 - 1 = 2; r3 = 2 - 1 (sim(3,4) zeroed) = 1; r4 = -1 (its e1 sims zeroed, -e1 left);
  // r2 = r5 = -1 (e2 pair zeroed, -e2 left); r6 = -4; r7 = -2.
  check_close(r, softmax_over({2, 2, -1, 1, -1, -1, -4, -2}, 0.4 * 8));

  // It is block_redundancy with the whole sequence as one block.
  auto one_block = ctx;
  one_block.block_size = 8;
  std::vector<float> r2(8);
  scoring::block_redundancy(one_block, 0.4f, r2);
  CHECK(r2 == r);
}

TEST_CASE("combine and force_keep_sinks") {
  const std::vector<float> s = {1.0f, 0.5f}, r = {0.25f, 1.0f};
  std::vector<float> f(2);
  scoring::combine(0.2f, s, r, f);
  check_close(f, {0.2 * 1 - 0.8 * 0.25, 0.2 * 0.5 - 0.8 * 1});  // (0, -0.7)
  CHECK(f[0] == Approx(0.0).epsilon(1e-6));

  // Sinks: the first n physical tokens of every head become +inf; the rest are untouched.
  const score_context ctx{.kv_len = 3, .num_kv_heads = 2};
  std::vector<float> k = {1, 2, 3, 4, 5, 6};
  scoring::force_keep_sinks(ctx, 2, k);
  CHECK(k == std::vector<float>{inf, inf, 3, inf, inf, 6});
  scoring::force_keep_sinks(ctx, 10, k);  // more sinks than tokens: all of them
  CHECK(std::all_of(k.begin(), k.end(), [](float v) { return v == inf; }));
  std::vector<float> z = {1, 2, 3, 4, 5, 6};
  scoring::force_keep_sinks(ctx, 0, z);
  CHECK(z == std::vector<float>{1, 2, 3, 4, 5, 6});
}

TEST_CASE("scoring rejects bad shapes") {
  gqa_case c;
  std::vector<float> a(8), small(7);
  CHECK_THROWS_AS(scoring::window_attention(c.ctx, small), zipage::error);
  c.ctx.window = 5;  // wider than the cache
  CHECK_THROWS_AS(scoring::window_attention(c.ctx, a), zipage::error);
  c.ctx.window = 2;
  c.ctx.num_q_heads = 3;  // not a multiple of kv heads
  CHECK_THROWS_AS(scoring::window_attention(c.ctx, a), zipage::error);
  c.ctx.num_q_heads = 4;
  CHECK_THROWS_AS(scoring::block_redundancy(c.ctx, 0.0f, a), zipage::error);
  c.ctx.first_compression = false;  // history needed but prev_scores missing
  c.ctx.block_size = 1;
  CHECK_THROWS_AS(scoring::global_score(c.ctx, a, 0.8f, a), zipage::error);
  CHECK_THROWS_AS(scoring::combine(0.2f, a, small, a), zipage::error);
}

TEST_CASE("policies satisfy the concept and report their names") {
  // Every built-in, through the list the tools pick from (so a policy added there is checked too).
  for_each_builtin_policy([](const auto& p) { static_assert(eviction_policy<std::remove_cvref_t<decltype(p)>>); });
  static_assert(h2o::uses_score_cache && gkv::uses_score_cache && zipage_policy::uses_score_cache);
  static_assert(!streaming_llm::uses_score_cache && !snapkv::uses_score_cache && !rkv::uses_score_cache);
  static_assert(streaming_llm::evicts && zipage_policy::evicts && !full_kv::evicts);
  std::vector<std::string_view> names;
  for_each_builtin_policy([&](const auto& p) { names.push_back(p.name()); });
  CHECK(names == builtin_policy_names());
  CHECK(names == std::vector<std::string_view>{"full_kv", "streaming_llm", "h2o", "snapkv", "rkv", "gkv", "zipage"});

  // Defaults of the tunables.
  CHECK(streaming_llm{}.sinks == 4);
  CHECK(snapkv{}.pool_kernel == 5);
  const rkv r;
  CHECK((r.lambda == 0.1f && r.tau == 0.4f && r.pool_kernel == 5));
  const gkv g;
  CHECK((g.gamma == 0.8f && g.first_pool_kernel == 5));
  const zipage_policy z;
  CHECK((z.gamma == 0.8f && z.lambda == 0.2f && z.tau == 0.4f && z.first_pool_kernel == 5));
  CHECK((!z.full_redundancy && z.sinks == 0));
  const cache_geometry params{.block_size = 4, .budget_tokens = 8, .window = 2};
  CHECK(z.keep_tokens(params) == 8);
  CHECK(z.should_compress(12, params));
  CHECK_FALSE(z.should_compress(8, params));
}

TEST_CASE("streaming_llm keeps the sinks and the most recent tokens") {
  const score_context ctx{.kv_len = 8, .num_kv_heads = 2};
  std::vector<float> keep(16), unused;
  streaming_llm p;
  p.sinks = 2;
  p.score(ctx, keep, unused);
  CHECK(std::vector<float>(keep.begin(), keep.begin() + 8) == std::vector<float>{inf, inf, 2, 3, 4, 5, 6, 7});
  CHECK(top_k(std::span(keep).first(8), 4) == std::set<int>{0, 1, 6, 7});
  CHECK(top_k(std::span(keep).last(8), 4) == std::set<int>{0, 1, 6, 7});
  p.sinks = 4;  // the default
  p.score(ctx, keep, unused);
  CHECK(top_k(std::span(keep).first(8), 6) == std::set<int>{0, 1, 2, 3, 6, 7});
}

TEST_CASE("h2o: accumulated window attention, stored to the score cache") {
  // GQA case with block 2, compressed before, history 1 for every token: tokens 0, 1 (older than the
  // newest block 2..3) add 1 to their attention; 2, 3 keep plain A.
  gqa_case c;
  const std::vector<float> prev(8, 1.0f);
  c.ctx.first_compression = false;
  c.ctx.prev_scores = prev;
  std::vector<float> keep(8), cache(8);
  h2o{}.score(c.ctx, keep, cache);
  check_close(keep, {1.375, 1.1875, .375, .25, 1 + 7.0 / 24, 1 + 7.0 / 24, 7.0 / 24, 1.0 / 8});
  CHECK(cache == keep);
}

TEST_CASE("snapkv and rkv are compositions of the pieces") {
  for (const bool first : {true, false}) {  // neither keeps history: the same either way
    random_case c(first);
    auto want = c.attention();
    scoring::max_pool(want, 2, 12, 5);
    std::vector<float> keep(24), unused;
    snapkv{}.score(c.ctx, keep, unused);
    CHECK(keep == want);

    std::vector<float> red(24);
    scoring::full_redundancy(c.ctx, 0.4f, red);
    scoring::combine(0.1f, want, red, want);
    rkv{}.score(c.ctx, keep, unused);
    CHECK(keep == want);
  }
}

TEST_CASE("gkv: global score to the cache, pooled only at the first compression") {
  random_case first(true);
  const auto a = first.attention();
  std::vector<float> keep(24), cache(24);
  gkv{}.score(first.ctx, keep, cache);
  CHECK(cache == a);  // no history yet: S = A, stored unpooled
  auto pooled = a;
  scoring::max_pool(pooled, 2, 12, 5);
  CHECK(keep == pooled);
  CHECK(keep != cache);

  random_case later(false);
  gkv{}.score(later.ctx, keep, cache);
  auto s = later.scores();
  scoring::global_score(later.ctx, later.attention(), 0.8f, s);
  CHECK(cache == s);
  CHECK(keep == s);  // not pooled after the first compression
}

TEST_CASE("zipage_policy == hand composition of the pieces") {
  const auto compose = [](const random_case& c, const zipage_policy& p, std::vector<float>& cache_want) {
    auto s = c.scores();
    scoring::global_score(c.ctx, c.attention(), p.gamma, s);
    cache_want = s;
    if (c.ctx.first_compression) scoring::max_pool(s, 2, c.ctx.kv_len, p.first_pool_kernel);
    auto r = c.scores();
    if (p.full_redundancy) {
      scoring::full_redundancy(c.ctx, p.tau, r);
    } else {
      scoring::block_redundancy(c.ctx, p.tau, r);
    }
    auto f = c.scores();
    scoring::combine(p.lambda, s, r, f);
    if (p.sinks > 0) scoring::force_keep_sinks(c.ctx, p.sinks, f);
    return f;
  };
  for (const bool first : {true, false}) {
    for (const bool full : {false, true}) {
      for (const int sinks : {0, 2}) {
        CAPTURE(first);
        CAPTURE(full);
        CAPTURE(sinks);
        random_case c(first);
        zipage_policy p;
        p.full_redundancy = full;
        p.sinks = sinks;
        std::vector<float> keep(24), cache(24), cache_want;
        p.score(c.ctx, keep, cache);
        CHECK(keep == compose(c, p, cache_want));
        CHECK(cache == cache_want);  // the cache holds the unpooled global score, without redundancy
        CHECK((keep[0] == inf) == (sinks > 0));
      }
    }
  }
}

TEST_CASE("zipage_policy at a realistic shape: finite scores, redundancy one distribution per head") {
  // kv_len 9 blocks of 32, window 8, head_dim 16, group 2: every path runs; R sums to 1 over each head's
  // whole sequence (not per block).
  random_case c(false, 9 * 32, 32, 8, 16);
  std::vector<float> keep(c.scores()), cache(c.scores()), red(c.scores());
  zipage_policy{}.score(c.ctx, keep, cache);
  CHECK(std::all_of(keep.begin(), keep.end(), [](float v) { return std::isfinite(v); }));
  scoring::block_redundancy(c.ctx, 0.4f, red);
  const std::size_t len = 9 * 32;
  for (std::size_t h = 0; h * len < red.size(); ++h) {
    CHECK(std::accumulate(red.begin() + h * len, red.begin() + (h + 1) * len, 0.0) == Approx(1.0).epsilon(1e-5));
    CHECK(std::accumulate(red.begin() + h * len, red.begin() + h * len + 32, 0.0) < 0.5);
  }
}

TEST_CASE("every built-in policy is its recipe, and recipe_scored tells overrides apart") {
  random_case c(false, 6 * 16, 16, 8, 8);
  auto same_as_recipe = [&](const auto& policy) {
    std::vector<float> a(c.scores()), ca(c.scores()), b(c.scores()), cb(c.scores());
    policy.score(c.ctx, a, ca);
    scoring::run_recipe(policy.recipe(), c.ctx, b, cb);
    CHECK(a == b);
    CHECK(ca == cb);
  };
  same_as_recipe(streaming_llm{});
  same_as_recipe(h2o{});
  same_as_recipe(snapkv{});
  same_as_recipe(rkv{});
  same_as_recipe(gkv{});
  same_as_recipe(zipage_policy{});
  static_assert(recipe_scored<streaming_llm> && recipe_scored<h2o> && recipe_scored<snapkv> && recipe_scored<rkv> &&
                recipe_scored<gkv> && recipe_scored<zipage_policy>);
  static_assert(!recipe_scored<full_kv>);
  struct tuned : zipage_policy {};  // other parameters, same score(): still its recipe
  struct own_score : zipage_policy {
    void score(const score_context&, std::span<float> keep_score, std::span<float>) const {
      std::fill(keep_score.begin(), keep_score.end(), 1.0f);
    }
  };
  struct composed : recipe_policy<composed> {
    [[nodiscard]] std::string_view name() const { return "composed"; }
    [[nodiscard]] score_recipe recipe() const { return {}; }
  };
  static_assert(recipe_scored<tuned>);
  static_assert(!recipe_scored<own_score>, "a subclass with its own score() must not be scored by the base's recipe");
  static_assert(recipe_scored<composed>);
  static_assert(eviction_policy<composed>);
}

TEST_CASE("score_recipe rejects what no backend can run") {
  score_recipe r;
  r.pooling = score_recipe::pool_when::always;
  r.pool_kernel = 4;
  CHECK_THROWS_WITH_AS(r.validate(), doctest::Contains("pool_kernel"), error);
  r = {};
  r.redundancy = score_recipe::redundancy_kind::block_local;
  r.tau = 0.0f;
  CHECK_THROWS_WITH_AS(r.validate(), doctest::Contains("tau"), error);
  r = {};
  r.importance = score_recipe::importance_kind::recency;
  r.history = score_recipe::history_kind::accumulate;
  CHECK_THROWS_WITH_AS(r.validate(), doctest::Contains("recency"), error);
}
