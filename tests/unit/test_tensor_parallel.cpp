// Tensor parallelism on the CPU (issue 15): the sharding math, the in-process communicator of N threads,
// and the engine over tensor_parallel_llama giving the non-TP engine's greedy tokens (fp32) on stories260K
// and a random Qwen3, with full KV and with compression. Also the fused q/k/v and gate/up projections
// (fuse_projections, which the loaders apply): the ops, the fused model against the unfused one, and tensor
// parallelism sharding a fused model.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "zipage/engine/engine.hpp"
#include "zipage/gguf/gguf.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/models/llama_tp.hpp"
#include "zipage/parallel/communicator.hpp"
#include "zipage/parallel/sharding.hpp"
#include "zipage/policy/policies.hpp"
#include "greedy.hpp"
#include "random_llama.hpp"
#include "stories_model.hpp"

using namespace zipage;
using zipage::parallel::tp_group;
using zipage::parallel::tp_layout;
using zipage::testing::greedy_ignoring_eos;
using zipage::testing::random_llama;
using zipage::testing::stories;

namespace {

model_config heads(int q, int kv, int vocab = 64, int ffn = 48) {
  model_config c;
  c.vocab_size = vocab;
  c.hidden_size = 32;
  c.num_layers = 1;
  c.num_q_heads = q;
  c.num_kv_heads = kv;
  c.head_dim = 8;
  c.ffn_size = ffn;
  return c;
}

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

std::string message_of(const model_config& c, int n) {
  try {
    (void)tp_layout::make(c, n);
  } catch (const error& e) {
    return e.what();
  }
  return {};
}

}  // namespace

TEST_CASE("sharding: each rank's heads, MLP columns and vocabulary rows") {
  // stories260K's shape: 8 q heads, 4 KV heads.
  const auto c = heads(8, 4, 10, 50);
  for (int n : {1, 2, 4}) {
    const auto l = tp_layout::make(c, n);
    CHECK(l.q_heads_per_rank == 8 / n);
    CHECK(l.kv_heads_per_rank == 4 / n);
    CHECK_FALSE(l.replicated());
    for (int r = 0; r < n; ++r) {
      CHECK(l.q_head_begin(r) == r * 8 / n);
      CHECK(l.kv_head_begin(r) == r * 4 / n);
      // GQA: the rank's first q head uses the rank's first KV head.
      CHECK(l.q_head_begin(r) / c.gqa_group() == l.kv_head_begin(r));
    }
    int ffn = 0, vocab = 0;
    for (int r = 0; r < n; ++r) {
      CHECK(l.ffn_begin(r) == ffn);
      ffn += l.ffn_count(r);
      CHECK(l.vocab_begin(r) == vocab);
      vocab += l.vocab_count(r);
      CHECK(l.vocab_count(r) <= l.vocab_per_rank);
    }
    CHECK(ffn == 50);
    CHECK(vocab == 10);
  }
  // ffn 50 over 4 ranks: 12, 13, 12, 13; vocab 10 over 4: 3, 3, 3, 1 (+ 2 zero rows).
  const auto l4 = tp_layout::make(c, 4);
  CHECK(l4.vocab_per_rank == 3);
  CHECK(l4.vocab_count(3) == 1);
  CHECK(l4.ffn_count(0) + l4.ffn_count(1) == 25);
  // 8 ranks: one q head each, each KV head replicated on the two ranks of its GQA group.
  const auto l8 = tp_layout::make(c, 8);
  CHECK(l8.replicated());
  CHECK(l8.kv_replicas == 2);
  CHECK(l8.kv_heads_per_rank == 1);
  for (int r = 0; r < 8; ++r) {
    CHECK(l8.kv_head_begin(r) == r / 2);
    CHECK(l8.q_head_begin(r) / c.gqa_group() == l8.kv_head_begin(r));
    CHECK(l8.kv_group_first_rank(r) == r - r % 2);
  }
  CHECK(l8.kv_owner(3) == 6);
  CHECK(l4.kv_owner(3) == 3);
  CHECK(l4.block_fraction() == doctest::Approx(0.25));
  CHECK(l8.block_fraction() == doctest::Approx(0.25));
  CHECK(l8.query_fraction() == doctest::Approx(0.125));
}

TEST_CASE("sharding: row and column slices round-trip, with padding") {
  const int rows = 7, cols = 10;
  const auto m = random_values(rows * cols, 3);
  for (int n : {1, 2, 4}) {
    std::vector<std::vector<float>> by_rows, by_cols;
    for (int r = 0; r < n; ++r) {
      const int rb = rows * r / n, re = rows * (r + 1) / n, cb = cols * r / n, ce = cols * (r + 1) / n;
      by_rows.push_back(parallel::slice_rows(m, rows, cols, rb, re - rb));
      by_cols.push_back(parallel::slice_cols(m, rows, cols, cb, ce - cb));
      // A slice is exactly the rank's block of the matrix.
      for (int i = rb; i < re; ++i)
        for (int j = 0; j < cols; ++j) CHECK(by_rows.back()[static_cast<std::size_t>((i - rb) * cols + j)] == m[static_cast<std::size_t>(i * cols + j)]);
      for (int i = 0; i < rows; ++i)
        for (int j = cb; j < ce; ++j)
          CHECK(by_cols.back()[static_cast<std::size_t>(i * (ce - cb) + j - cb)] == m[static_cast<std::size_t>(i * cols + j)]);
    }
    CHECK(parallel::concat_rows(by_rows) == m);
    CHECK(parallel::concat_cols(by_cols, rows) == m);
  }
  const auto padded = parallel::slice_rows(m, rows, cols, 6, 1, 3);
  CHECK(padded.size() == 30u);
  CHECK(padded[0] == m[60]);
  CHECK(padded[29] == 0.0f);
  CHECK_THROWS_AS(parallel::slice_rows(m, rows, cols, 5, 3), error);
  CHECK_THROWS_AS(parallel::slice_cols(m, rows, cols, 8, 3), error);

  // The vocabulary all-gather's layout: [N][rows][V'] -> [rows][vocab], padding columns dropped.
  const auto l = tp_layout::make(heads(4, 4, 10), 4);  // V' = 3
  const int logit_rows = 2;
  std::vector<float> gathered(static_cast<std::size_t>(4 * logit_rows * 3), -1.0f);
  for (int s = 0; s < 4; ++s)
    for (int i = 0; i < logit_rows; ++i)
      for (int j = 0; j < l.vocab_count(s); ++j)
        gathered[static_cast<std::size_t>((s * logit_rows + i) * 3 + j)] = float(100 * i + l.vocab_begin(s) + j);
  std::vector<float> out(static_cast<std::size_t>(logit_rows * 10));
  parallel::assemble_vocab_columns(l, gathered, logit_rows, out.data());
  for (int i = 0; i < logit_rows; ++i)
    for (int v = 0; v < 10; ++v) CHECK(out[static_cast<std::size_t>(i * 10 + v)] == float(100 * i + v));
}

TEST_CASE("sharding: heads that do not divide by N are an error naming the fields") {
  const std::string q = message_of(heads(8, 4), 3);
  CHECK(q.find("num_q_heads (num_attention_heads") != std::string::npos);
  CHECK(q.find("= 8 is not divisible by the tensor-parallel size 3") != std::string::npos);
  const std::string kv = message_of(heads(12, 6), 4);
  CHECK(kv.find("num_kv_heads (num_key_value_heads") != std::string::npos);
  CHECK(kv.find("= 6 is not divisible by the tensor-parallel size 4") != std::string::npos);
  const std::string rep = message_of(heads(12, 4), 6);
  CHECK(rep.find("tensor-parallel size 6 is not a multiple of num_kv_heads") != std::string::npos);
  CHECK(message_of(heads(8, 4), 8).empty());
  CHECK(message_of(heads(8, 4), 0).find("must be >= 1") != std::string::npos);
  // The same error before anything is built, from the model itself.
  const auto full = load_llama_gguf<cpu_backend>(stories().file);
  try {
    (void)make_tensor_parallel_llama(full, 3);
    FAIL("no error");
  } catch (const error& e) {
    CHECK(std::string(e.what()).find("num_q_heads (num_attention_heads / llama.attention.head_count) = 8 is not divisible "
                                     "by the tensor-parallel size 3") != std::string::npos);
  }
}

TEST_CASE("in-process communicator: all-reduce, all-gather and barrier over N threads") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    auto group = tp_group::in_process(n);
    CHECK(group->size() == n);
    // Counts below, at and above N (chunks of 0 floats included), repeated so barriers are reused.
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1000}}) {
      std::vector<std::vector<float>> data(static_cast<std::size_t>(n)), gathered(static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) data[static_cast<std::size_t>(r)] = random_values(count, 10u + static_cast<unsigned>(r));
      const auto inputs = data;
      for (int round = 0; round < 3; ++round) {
        data = inputs;
        group->run([&](int r) {
          auto& comm = group->comm(r);
          CHECK(comm.rank() == r);
          CHECK(comm.size() == n);
          auto& mine = data[static_cast<std::size_t>(r)];
          comm.all_reduce_sum(mine.data(), count);
          comm.barrier();
          gathered[static_cast<std::size_t>(r)].assign(count * static_cast<std::size_t>(n), 0.0f);
          comm.all_gather(inputs[static_cast<std::size_t>(r)].data(), gathered[static_cast<std::size_t>(r)].data(), count);
        });
        for (std::size_t i = 0; i < count; ++i) {
          // Rank order, whatever thread arrived first: bit-identical to a sequential sum, on every rank.
          float expected = inputs[0][i];
          for (int s = 1; s < n; ++s) expected += inputs[static_cast<std::size_t>(s)][i];
          for (int r = 0; r < n; ++r) CHECK(data[static_cast<std::size_t>(r)][i] == expected);
        }
        for (int r = 0; r < n; ++r)
          for (int s = 0; s < n; ++s)
            for (std::size_t i = 0; i < count; ++i)
              CHECK(gathered[static_cast<std::size_t>(r)][static_cast<std::size_t>(s) * count + i] == inputs[static_cast<std::size_t>(s)][i]);
      }
    }
  }
}

TEST_CASE("in-process communicator: a failing rank fails the run without hanging, and the group recovers") {
  auto group = tp_group::in_process(4);
  std::vector<float> buf(8, 1.0f);
  CHECK_THROWS_WITH_AS(group->run([&](int r) {
    if (r == 2) throw error("rank 2 failed");
    std::vector<float> mine(8, 1.0f);
    group->comm(r).all_reduce_sum(mine.data(), mine.size());
  }),
                       "rank 2 failed", error);
  // Mismatched counts are refused by every rank.
  CHECK_THROWS_AS(group->run([&](int r) {
    std::vector<float> mine(static_cast<std::size_t>(r + 1), 1.0f);
    group->comm(r).all_reduce_sum(mine.data(), mine.size());
  }),
                  error);
  std::atomic<int> ok{0};
  group->run([&](int r) {
    std::vector<float> mine(8, float(r));
    group->comm(r).all_reduce_sum(mine.data(), mine.size());
    if (mine[7] == 6.0f) ++ok;
  });
  CHECK(ok == 4);
}

namespace {

// The engine over N ranks and over the plain model, same config, same prompts: the same greedy tokens.
template <class Policy>
void check_tp_matches(const llama_model<cpu_backend>& full, const llama_model<cpu_backend>& plain_copy,
                      const std::vector<std::vector<token_id>>& prompts, int max_tokens, const engine_config& cfg,
                      std::initializer_list<int> sizes, bool expect_compressions) {
  engine<llama_model<cpu_backend>, Policy> plain(plain_copy, cfg);
  const auto expected = plain.generate(prompts, greedy_ignoring_eos(max_tokens));
  CHECK((plain.stats().compressions > 0) == expect_compressions);
  for (int n : sizes) {
    CAPTURE(n);
    auto model = make_tensor_parallel_llama(full, n);
    const auto backend = model.backend();
    engine<tensor_parallel_llama<cpu_backend>, Policy> eng(std::move(model), cfg, Policy{}, backend);
    const auto out = eng.generate(prompts, greedy_ignoring_eos(max_tokens));
    CHECK(eng.stats().compressions == plain.stats().compressions);
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      CAPTURE(i);
      CHECK(out[i].output == expected[i].output);
      CHECK(out[i].num_compressions == expected[i].num_compressions);
    }
    CHECK(eng.pool().num_used() == 0);
  }
}

std::vector<std::vector<token_id>> story_prompts() {
  return zipage::testing::encode_stories(
      {"Once upon a time", "Once upon a time, a little girl went to the park.", "Tom had a ball."});
}

// A small random Qwen3: per-head q/k RMSNorm, half-split RoPE with theta 1e6, untied LM head, GQA 4:2,
// an MLP width (100) and a vocabulary (203) that do not divide by 4.
// With `qwen2`: q/k/v biases instead of the q/k norms (Qwen2's shape).
llama_model<cpu_backend> random_qwen3(unsigned seed, bool qwen2 = false, bool fuse = false) {
  model_config c;
  c.architecture = qwen2 ? "qwen2" : "qwen3";
  c.vocab_size = 203;
  c.hidden_size = 64;
  c.num_layers = 2;
  c.num_q_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.ffn_size = 100;
  c.rope = rope_style::half;
  c.rope_theta = 1e6f;
  c.rms_eps = 1e-6f;
  c.qk_norm = !qwen2;
  c.qkv_bias = qwen2;
  c.tied_embeddings = false;
  c.bos = 0;
  c.eos = 202;
  return random_llama(cpu_backend{}, c, seed, fuse);
}

std::vector<std::vector<token_id>> random_prompts(int n, int vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(1, vocab - 2), len(3, 20);
  std::vector<std::vector<token_id>> prompts(static_cast<std::size_t>(n));
  for (auto& p : prompts) {
    p.push_back(0);
    for (int i = len(rng); i > 0; --i) p.push_back(tok(rng));
  }
  return prompts;
}

// A zipage policy scored by its own score() (not a recipe_scored policy): the engine's generic host path,
// through tensor_parallel_backend's whole-model gathers and its per-rank split of the plan.
struct own_score_policy : zipage_policy {
  void score(const score_context& ctx, std::span<float> keep_score, std::span<float> cache_out) const {
    scoring::run_recipe(recipe(), ctx, keep_score, cache_out);
  }
};
static_assert(!recipe_scored<own_score_policy>);

}  // namespace

TEST_CASE("tensor parallel stories260K: greedy tokens with N = 1, 2, 4 equal the plain engine's (full KV)") {
  const auto full = load_llama_gguf<cpu_backend>(stories().file);
  check_tp_matches<full_kv>(full, full, story_prompts(), 48, {.block_size = 8, .num_blocks = 64}, {1, 2, 4}, false);
}

TEST_CASE("tensor parallel stories260K: with zipage compression, each rank compressing its own heads") {
  const auto full = load_llama_gguf<cpu_backend>(stories().file);
  const engine_config cfg{.block_size = 8, .num_blocks = 96, .budget_tokens = 32, .window = 4};
  // N = 8: one q head per rank, each KV head replicated on two ranks, scored with its group's queries.
  check_tp_matches<zipage_policy>(full, full, story_prompts(), 64, cfg, {1, 2, 4, 8}, true);
}

TEST_CASE("tensor parallel random Qwen3: full KV and zipage compression, N = 1, 2, 4") {
  const auto full = random_qwen3(5);
  const auto prompts = random_prompts(4, full.config().vocab_size, 11);
  check_tp_matches<full_kv>(full, full, prompts, 40, {.block_size = 8, .num_blocks = 64}, {1, 2, 4}, false);
  const engine_config cfg{.block_size = 8, .num_blocks = 96, .budget_tokens = 24, .window = 4};
  // N = 4 over 2 KV heads: replicated heads.
  check_tp_matches<zipage_policy>(full, full, prompts, 48, cfg, {1, 2, 4}, true);
  // A policy with its own score(): the host path over the assembled cache, split back by rank.
  check_tp_matches<own_score_policy>(full, full, prompts, 48, cfg, {2, 4}, true);
}

TEST_CASE("tensor parallel random Qwen2 (q/k/v biases sharded with their rows): N = 2, 4") {
  const auto full = random_qwen3(6, true);
  const auto prompts = random_prompts(3, full.config().vocab_size, 13);
  check_tp_matches<full_kv>(full, full, prompts, 32, {.block_size = 8, .num_blocks = 64}, {2, 4}, false);
}

TEST_CASE("tensor parallel: the engine's memory plan per rank") {
  const auto full = load_llama_gguf<cpu_backend>(stories().file);
  auto model = make_tensor_parallel_llama(full, 4);
  const auto backend = model.backend();
  engine<tensor_parallel_llama<cpu_backend>, zipage_policy> eng(std::move(model), {.block_size = 8, .num_blocks = 64, .budget_tokens = 32, .window = 4},
                                                                 zipage_policy{}, backend);
  const auto line = describe_rank_memory(eng.memory(), backend.layout());
  CHECK(line.find("per rank (4 ranks): 64 blocks") != std::string::npos);
  // Each rank stores one of the four KV heads and two of the eight q heads.
  const auto& kv = eng.kv_cache();
  REQUIRE(kv.ranks.size() == 4u);
  CHECK(kv.ranks[0].shape.num_kv_heads == 1);
  CHECK(kv.ranks[0].shape.num_q_heads == 2);
  CHECK(kv.ranks[3].shape.num_blocks == 64);
}

TEST_CASE("tensor parallel under memory pressure: swaps, recomputation and shared prefixes move every rank's blocks") {
  const auto full = random_qwen3(9);
  // Eight requests sharing a 17-token prefix (two full blocks of 8: prefix-cache hits, copy-on-write at the
  // first compression), in a pool too small for all of them at once: preemption by recomputation for
  // uncompressed requests and swaps to host memory for compressed ones.
  auto prompts = random_prompts(8, full.config().vocab_size, 21);
  const auto prefix = random_prompts(1, full.config().vocab_size, 22)[0];
  for (auto& p : prompts) {
    std::vector<token_id> q(prefix.begin(), prefix.end());
    while (q.size() < 17) q.push_back(static_cast<token_id>(q.size() + 5));
    q.insert(q.end(), p.begin() + 1, p.end());
    p = q;
  }
  // Compression on the engine's thread, so the schedule (and its counts) is the same in every run.
  // Every request gets a query slot, so all of them compress and a compressed one must swap to make room.
  const engine_config cfg{.block_size = 8, .num_blocks = 18, .max_num_seqs = 8, .budget_tokens = 24, .window = 4,
                          .num_query_slots = 8, .async_compression = false};
  engine<llama_model<cpu_backend>, zipage_policy> plain(full, cfg);
  const auto expected = plain.generate(prompts, greedy_ignoring_eos(72));
  const auto ps = plain.stats();
  MESSAGE("plain: ", ps.swaps, " swaps, ", ps.preemptions, " preemptions, ", ps.compressions, " compressions, ",
          ps.prefix_hit_tokens, " prefix-hit tokens");
  CHECK(ps.swaps > 0);
  CHECK(ps.preemptions > 0);
  CHECK(ps.prefix_hit_tokens > 0);
  for (int n : {2, 4}) {
    CAPTURE(n);
    auto model = make_tensor_parallel_llama(full, n);
    const auto backend = model.backend();
    engine<tensor_parallel_llama<cpu_backend>, zipage_policy> eng(std::move(model), cfg, zipage_policy{}, backend);
    const auto out = eng.generate(prompts, greedy_ignoring_eos(72));
    const auto st = eng.stats();
    CHECK(st.swaps == ps.swaps);
    CHECK(st.preemptions == ps.preemptions);
    CHECK(st.compressions == ps.compressions);
    for (std::size_t i = 0; i < prompts.size(); ++i) CHECK(out[i].output == expected[i].output);
    CHECK(eng.pool().num_used() == 0);
  }
}

// ---- fused projections

TEST_CASE("fused projections: stack_rows, split_columns and swiglu on the CPU backend") {
  const cpu_backend b;
  const auto wq = b.from_host(random_values(6 * 4, 1), 6, 4), wk = b.from_host(random_values(2 * 4, 2), 2, 4),
             wv = b.from_host(random_values(3 * 4, 3), 3, 4);
  const cpu::matrix* parts[] = {&wq, &wk, &wv};
  const auto stacked = b.stack_rows(parts);
  REQUIRE(stacked);
  CHECK(stacked->rows() == 11);
  CHECK(stacked->cols() == 4);
  CHECK(stacked->middleRows(6, 2) == wk);
  CHECK(stacked->bottomRows(3) == wv);

  // One fused GEMM cut in three = three GEMMs.
  const auto x = b.from_host(random_values(5 * 4, 4), 5, 4);
  cpu::matrix fused, q, k, v, q1, k1, v1;
  b.linear(x, *stacked, fused);
  const int widths[] = {6, 2, 3};
  cpu::matrix* outs[] = {&q, &k, &v};
  b.split_columns(fused, widths, outs);
  b.linear(x, wq, q1);
  b.linear(x, wk, k1);
  b.linear(x, wv, v1);
  CHECK(q == q1);
  CHECK(k == k1);
  CHECK(v == v1);

  // swiglu of [gate | up] is silu_mul(gate, up), bit for bit.
  const auto gate = b.from_host(random_values(3 * 7, 5), 3, 7), up = b.from_host(random_values(3 * 7, 6), 3, 7);
  cpu::matrix gate_up(3, 14), act, expected;
  gate_up << gate, up;
  b.swiglu(gate_up, act);
  b.silu_mul(gate, up, expected);
  CHECK(act == expected);

  // Misuse names what is wrong.
  const int short_widths[] = {6, 2, 2};
  CHECK_THROWS_WITH_AS(b.split_columns(fused, short_widths, outs), doctest::Contains("add up to 10, not the row of 11"),
                       error);
  const auto other = b.from_host(random_values(2 * 5, 7), 2, 5);
  const cpu::matrix* mixed[] = {&wq, &other};
  CHECK_THROWS_WITH_AS((void)b.stack_rows(mixed), doctest::Contains("parts of 4 and 5 columns"), error);
  cpu::matrix odd(2, 5);
  CHECK_THROWS_WITH_AS(b.swiglu(odd, act), doctest::Contains("not two halves"), error);
}

TEST_CASE("fused projections: a fused model gives the unfused model's greedy tokens (Qwen3, Qwen2 biases, stories260K)") {
  for (const bool qwen2 : {false, true}) {
    CAPTURE(qwen2);
    const auto fused = random_qwen3(7, qwen2, true);
    const auto unfused = random_qwen3(7, qwen2, false);
    REQUIRE(fused.weights().layers[0].wqkv.has_value());
    REQUIRE(fused.weights().layers[1].w_gate_up.has_value());
    CHECK(fused.weights().layers[0].wq.size() == 0);  // the parts are released
    CHECK(fused.weights().layers[0].w_up.size() == 0);
    CHECK_FALSE(unfused.weights().layers[0].wqkv.has_value());
    const auto prompts = random_prompts(4, unfused.config().vocab_size, 17);
    const engine_config cfg{.block_size = 8, .num_blocks = 96, .budget_tokens = 24, .window = 4};
    engine<llama_model<cpu_backend>, zipage_policy> a(fused, cfg), ref(unfused, cfg);
    const auto got = a.generate(prompts, greedy_ignoring_eos(48));
    const auto want = ref.generate(prompts, greedy_ignoring_eos(48));
    CHECK(a.stats().compressions > 0);
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      CAPTURE(i);
      CHECK(got[i].output == want[i].output);
    }
  }
  // The GGUF loader fuses (stories260K: q 64 rows, k/v 32, ffn 172).
  const auto stories_model = load_llama_gguf<cpu_backend>(stories().file);
  CHECK(stories_model.weights().layers[0].wqkv.has_value());
  CHECK(stories_model.weights().layers[0].w_gate_up.has_value());
}

TEST_CASE("fused projections: tensor parallelism shards a fused model like the unfused one (Qwen3, Qwen2), N = 2, 4") {
  for (const bool qwen2 : {false, true}) {
    CAPTURE(qwen2);
    const auto fused = random_qwen3(8, qwen2, true);
    const auto unfused = random_qwen3(8, qwen2, false);
    const auto prompts = random_prompts(3, unfused.config().vocab_size, 19);
    // Ranks slice q, k, v (gate, up) out of the fused weights; the plain engine runs the unfused model.
    check_tp_matches<full_kv>(fused, unfused, prompts, 32, {.block_size = 8, .num_blocks = 64}, {2, 4}, false);
  }
}
