// Checks batched GPU sampling (backend/cuda/sampling.hpp) against the CPU reference zipage::sampler on
// random batches: vocabularies 512 / 32000 / 151936, batches of 1..256 requests, fp32 and bf16 logits,
// contiguous and padded (unaligned) rows, and per-request parameters drawn from every combination of
// greedy, temperature, top-k, top-p, min-p, repetition penalty and frequency / presence penalties (with a
// context whose last `step` tokens are the generated ones; also sent trimmed to those). Logit rows are
// Gaussian with several spreads, bf16-rounded or small-integer (many exact ties), peaked (a few tokens far
// above the rest, as from a trained model), or with NaN / +-inf entries; a few are all -inf.
//
// Asserts: greedy tokens identical; sampled tokens identical for >= 99.9% of sampled requests; every GPU
// token inside the CPU's kept set (top-k / top-p / min-p set, from an independent full-sort reference);
// results independent of the batch's order (rows reversed) and repeatable. Each sampled mismatch is
// reported with its distance from the nearest CDF boundary (relative to the kept mass), which should be
// at float-rounding level. Batches with vLLM's logits processors (allowed_token_ids, bad_words, logit_bias,
// min_tokens; zipage::logit_edits as CSR) are checked the same way, the reference kept set computed on the
// edited row. Exits 1 on any failure, 77 (skipped) where there is no CUDA device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda_buffers.hpp"
#include "zipage/backend/cuda/sampling.hpp"
#include "zipage/cuda/device.hpp"
#include "zipage/sampling/logits_processors.hpp"
#include "zipage/sampling/logprobs.hpp"
#include "zipage/sampling/sampler.hpp"
#include "zipage/sampling/sampling_params.hpp"

namespace {

using zipage::testing::from_bf16;
using zipage::testing::kBf16NaN;
using zipage::testing::to_bf16;

namespace zc = zipage::cuda;
using zipage::sampling_params;
using zipage::token_id;

int g_failures = 0;
int g_checks = 0;

#define CUDA_OK(expr) ZIPAGE_TEST_CUDA_OK(expr)

void check(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) ++g_failures;
  std::printf("[%s] %s\n", ok ? "PASS" : "FAIL", what.c_str());
}

constexpr float inf_f = std::numeric_limits<float>::infinity();

// ---- bf16 on the host (round to nearest even; NaN stays NaN)

template <class T>
using dbuf = zipage::testing::device_buffer<T>;

// Runs fn(i) for i in [0, n) on all hardware threads.
template <class F>
void parallel_for(std::size_t n, F fn) {
  const std::size_t workers = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (std::size_t w = 0; w < workers; ++w)
    pool.emplace_back([&, w] {
      for (std::size_t i = w; i < n; i += workers) fn(i);
    });
  for (auto& t : pool) t.join();
}

// ---- a batch
struct request {
  sampling_params p;
  std::uint64_t step = 0;
  std::vector<token_id> context;
  zipage::token_rules rules;  // bad words and EOS ids (logits processors)
};

struct batch_case {
  std::string name;
  int vocab = 0;
  int batch = 0;
  bool bf16 = false;
  std::int64_t row_stride = 0;  // elements on the GPU (>= vocab)
  std::vector<float> logits;    // [batch][vocab], the values the CPU sees (bf16-rounded when bf16)
  std::vector<request> reqs;
};

std::mt19937_64 g_rng(20250917);

void fill_row(float* row, int vocab, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 99);
  const int kind = pick(rng);
  const float sigmas[] = {0.3f, 1.0f, 2.0f, 4.0f, 8.0f};
  const float sigma = sigmas[pick(rng) % 5];
  const float shift = static_cast<float>(pick(rng) - 50);  // softmax is shift-invariant; the penalty is not
  if (kind < 40) {  // Gaussian
    for (int i = 0; i < vocab; ++i) row[i] = shift + sigma * normal(rng);
  } else if (kind < 55) {  // bf16-rounded Gaussian: exact ties
    for (int i = 0; i < vocab; ++i) row[i] = from_bf16(to_bf16(shift * 0.1f + sigma * normal(rng)));
  } else if (kind < 63) {  // small integers: huge tie groups
    std::uniform_int_distribution<int> small(-4, 2);
    for (int i = 0; i < vocab; ++i) row[i] = static_cast<float>(small(rng));
  } else if (kind < 85) {  // peaked, like a trained model: a handful of tokens well above a broad bulk
    for (int i = 0; i < vocab; ++i) row[i] = shift + 2.0f * normal(rng);
    const int hot = 1 + pick(rng) % 8;
    for (int h = 0; h < hot; ++h) row[std::uniform_int_distribution<int>(0, vocab - 1)(rng)] = shift + 8.0f + 4.0f * normal(rng);
  } else if (kind < 97) {  // non-finite entries
    for (int i = 0; i < vocab; ++i) {
      const int r = pick(rng);
      row[i] = r < 3 ? -inf_f : r < 4 ? std::numeric_limits<float>::quiet_NaN() : shift + sigma * normal(rng);
    }
    if (pick(rng) < 30) {
      row[std::uniform_int_distribution<int>(0, vocab - 1)(rng)] = inf_f;
      row[std::uniform_int_distribution<int>(0, vocab - 1)(rng)] = inf_f;
    }
    if (pick(rng) < 20) row[std::uniform_int_distribution<int>(0, vocab - 1)(rng)] = std::numeric_limits<float>::max();
  } else if (kind < 98) {
    std::fill(row, row + vocab, 0.0f);  // all equal
  } else if (kind < 99) {
    std::fill(row, row + vocab, -inf_f);  // nothing finite: token 0
  } else {
    for (int i = 0; i < vocab; ++i) row[i] = pick(rng) < 50 ? std::numeric_limits<float>::quiet_NaN() : -inf_f;
  }
}

request random_request(int vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> pick(0, 99);
  request r;
  sampling_params& p = r.p;
  const float temps[] = {0.25f, 0.6f, 1.0f, 1.0f, 1.5f};
  p.temperature = pick(rng) < 15 ? 0.0f : temps[pick(rng) % 5];
  if (pick(rng) < 40) {
    const int ks[] = {1, 2, 5, 40, 1000, vocab, vocab + 7};
    p.top_k = ks[pick(rng) % 7];
  }
  if (pick(rng) < 50) {
    const float ps[] = {0.05f, 0.5f, 0.8f, 0.9f, 0.95f, 0.999f};
    p.top_p = ps[pick(rng) % 6];
  }
  if (pick(rng) < 30) {
    const float ms[] = {0.001f, 0.02f, 0.1f, 0.5f, 1.0f};
    p.min_p = ms[pick(rng) % 5];
  }
  if (pick(rng) < 30) {
    const float pens[] = {1.2f, 1.5f, 0.8f, 2.0f};
    p.repetition_penalty = pens[pick(rng) % 4];
  }
  if (pick(rng) < 25) {  // OpenAI's penalties, sometimes only one of them, sometimes negative
    const float fs[] = {0.0f, 0.5f, -0.5f, 2.0f, 1.0f, 0.1f};
    const float ps[] = {0.0f, 1.5f, -2.0f, 0.3f};
    p.frequency_penalty = fs[pick(rng) % 6];
    p.presence_penalty = ps[pick(rng) % 4];
  }
  if (p.repetition_penalty != 1.0f || p.output_penalties()) {
    const int n = pick(rng) * 3;
    std::uniform_int_distribution<int> tok(0, vocab - 1);
    for (int i = 0; i < n; ++i) r.context.push_back(tok(rng));
    // Repeats, as a generation has.
    for (int i = 0; i < n / 4; ++i) r.context.push_back(r.context[std::size_t(i)]);
  }
  p.seed = rng();
  // The generated tokens are the context's last `step`: sometimes all of it, or more than it has.
  const auto ctx = static_cast<std::uint64_t>(r.context.size());
  r.step = pick(rng) < 50 ? std::uniform_int_distribution<std::uint64_t>(0, ctx + 3)(rng)
                          : std::uniform_int_distribution<std::uint64_t>(0, 5000)(rng);
  return r;
}

batch_case make_case(int vocab, int batch, bool bf16, std::int64_t row_pad) {
  batch_case c;
  c.vocab = vocab;
  c.batch = batch;
  c.bf16 = bf16;
  c.row_stride = vocab + row_pad;
  c.name = "vocab " + std::to_string(vocab) + " batch " + std::to_string(batch) + (bf16 ? " bf16" : " fp32") +
           (row_pad ? " row_stride " + std::to_string(c.row_stride) : "");
  c.logits.resize(std::size_t(batch) * vocab);
  std::vector<std::uint64_t> seeds(static_cast<std::size_t>(batch));
  for (auto& s : seeds) s = g_rng();
  parallel_for(static_cast<std::size_t>(batch), [&](std::size_t r) {
    std::mt19937_64 rng(seeds[r]);
    float* row = c.logits.data() + r * std::size_t(vocab);
    fill_row(row, vocab, rng);
    if (bf16)
      for (int i = 0; i < vocab; ++i) row[i] = from_bf16(to_bf16(row[i]));
  });
  for (int r = 0; r < batch; ++r) c.reqs.push_back(random_request(vocab, g_rng));
  return c;
}

// ---- the GPU: uploads the batch in the order `order` (row j of the GPU batch is request order[j]) and
// returns the tokens per request (in request order).
// Log-probabilities asked of the GPU (per request, in request order): k[r] alternatives each.
struct logprob_result {
  std::vector<int> k;
  std::vector<float> lp;            // the sampled token's
  std::vector<std::int32_t> ids;    // [request][20]
  std::vector<float> top;           // [request][20]
};

// trim_context: rows without a repetition penalty send only their generated tokens (as cuda_backend does).
std::vector<std::int32_t> run_gpu(const batch_case& c, const std::vector<int>& order, bool null_temperature = false,
                                  bool trim_context = false, logprob_result* lpr = nullptr) {
  const int B = c.batch, V = c.vocab;
  const std::size_t stride = static_cast<std::size_t>(c.row_stride);
  std::vector<float> lf;
  std::vector<std::uint16_t> lb;
  if (c.bf16) lb.assign(std::size_t(B) * stride, to_bf16(-inf_f));
  else lf.assign(std::size_t(B) * stride, -inf_f);
  std::vector<float> temp, top_p, min_p, pen, freq, pres;
  std::vector<std::int32_t> top_k, indptr{0}, ids;
  std::vector<std::uint64_t> seed, step;
  for (int j = 0; j < B; ++j) {
    const int r = order[std::size_t(j)];
    const float* src = c.logits.data() + std::size_t(r) * V;
    for (int i = 0; i < V; ++i) {
      if (c.bf16) lb[std::size_t(j) * stride + i] = to_bf16(src[i]);
      else lf[std::size_t(j) * stride + i] = src[i];
    }
    const request& q = c.reqs[std::size_t(r)];
    temp.push_back(q.p.temperature);
    top_k.push_back(q.p.top_k);
    top_p.push_back(q.p.top_p);
    min_p.push_back(q.p.min_p);
    pen.push_back(q.p.repetition_penalty);
    freq.push_back(q.p.frequency_penalty);
    pres.push_back(q.p.presence_penalty);
    seed.push_back(q.p.seed);
    step.push_back(q.step);
    const std::size_t keep = trim_context && q.p.repetition_penalty == 1.0f
                                 ? static_cast<std::size_t>(std::min<std::uint64_t>(q.step, q.context.size()))
                                 : q.context.size();
    ids.insert(ids.end(), q.context.end() - static_cast<std::ptrdiff_t>(keep), q.context.end());
    indptr.push_back(static_cast<std::int32_t>(ids.size()));
  }
  // Logits processors, as cuda_backend sends them: each row's zipage::logit_edits.
  zipage::logit_edit_csr csr;
  bool edits = false;
  for (const request& q : c.reqs) edits = edits || q.p.processes_logits(q.step);
  if (edits) {
    zipage::logit_edits e;
    for (int j = 0; j < B; ++j) {
      const request& q = c.reqs[std::size_t(order[std::size_t(j)])];
      if (q.p.processes_logits(q.step)) {
        zipage::make_logit_edits(e, q.p, q.context, q.step, q.rules, V);
        csr.append(e);
      } else {
        csr.append_none();
      }
    }
  }
  dbuf<std::int32_t> d_e_indptr(csr.indptr), d_e_ids(csr.ids), d_e_banned(csr.others_banned);
  dbuf<float> d_e_adds(csr.adds);
  dbuf<float> d_lf(lf);
  dbuf<std::uint16_t> d_lb(lb);
  dbuf<float> d_temp(temp), d_top_p(top_p), d_min_p(min_p), d_pen(pen), d_freq(freq), d_pres(pres);
  dbuf<std::int32_t> d_top_k(top_k), d_indptr(indptr), d_ids(ids), d_out(static_cast<std::size_t>(B));
  dbuf<std::uint64_t> d_seed(seed), d_step(step);
  CUDA_OK(cudaMemset(d_out.p, 0xff, sizeof(std::int32_t) * std::size_t(B)));

  zc::sampling_batch p;
  p.logits = c.bf16 ? static_cast<const void*>(d_lb.p) : static_cast<const void*>(d_lf.p);
  p.dtype = c.bf16 ? zc::logits_dtype::bf16 : zc::logits_dtype::f32;
  p.row_stride = c.row_stride;
  p.batch = B;
  p.vocab = V;
  p.temperature = null_temperature ? nullptr : d_temp.p;
  p.top_k = d_top_k.p;
  p.top_p = d_top_p.p;
  p.min_p = d_min_p.p;
  p.repetition_penalty = d_pen.p;
  p.frequency_penalty = d_freq.p;
  p.presence_penalty = d_pres.p;
  p.seed = d_seed.p;
  p.step = d_step.p;
  p.context_indptr = d_indptr.p;
  p.context_ids = d_ids.p;
  p.out_tokens = d_out.p;
  if (edits) {
    p.edit_indptr = d_e_indptr.p;
    p.edit_ids = d_e_ids.p;
    p.edit_adds = d_e_adds.p;
    p.edit_others_banned = d_e_banned.p;
  }
  const std::size_t ws_bytes = zc::sampling_workspace_bytes(B, V, null_temperature, true);
  dbuf<std::uint8_t> ws(ws_bytes);
  std::vector<std::int32_t> ks;
  if (lpr)
    for (int j = 0; j < B; ++j) ks.push_back(lpr->k[std::size_t(order[std::size_t(j)])]);
  const std::size_t K = 20;
  dbuf<std::int32_t> d_k(ks), d_top_ids(lpr ? std::size_t(B) * K : std::size_t{0});
  dbuf<float> d_lp(lpr ? std::size_t(B) : std::size_t{0}), d_top(lpr ? std::size_t(B) * K : std::size_t{0});
  if (lpr) {
    p.out_logprobs = d_lp.p;
    p.top_logprobs = d_k.p;
    p.max_top_logprobs = static_cast<int>(K);
    p.out_top_ids = d_top_ids.p;
    p.out_top_logprobs = d_top.p;
  }
  zc::sample_tokens(p, ws.p, ws_bytes, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<std::int32_t> out(static_cast<std::size_t>(B));
  CUDA_OK(cudaMemcpy(out.data(), d_out.p, sizeof(std::int32_t) * std::size_t(B), cudaMemcpyDeviceToHost));
  std::vector<std::int32_t> by_request(static_cast<std::size_t>(B));
  for (int j = 0; j < B; ++j) by_request[std::size_t(order[std::size_t(j)])] = out[std::size_t(j)];
  if (lpr) {
    const std::vector<float> lp = d_lp.get(), top = d_top.get();
    const std::vector<std::int32_t> ids = d_top_ids.get();
    lpr->lp.assign(std::size_t(B), 0.0f);
    lpr->ids.assign(std::size_t(B) * K, -1);
    lpr->top.assign(std::size_t(B) * K, 0.0f);
    for (int j = 0; j < B; ++j) {
      const std::size_t r = std::size_t(order[std::size_t(j)]);
      lpr->lp[r] = lp[std::size_t(j)];
      for (std::size_t t = 0; t < K; ++t) {
        lpr->ids[r * K + t] = ids[std::size_t(j) * K + t];
        lpr->top[r * K + t] = top[std::size_t(j) * K + t];
      }
    }
  }
  return by_request;
}

// ---- independent CPU reference of the kept set: full sort, straight from the pipeline's definition.
struct kept_set {
  bool greedy = false;  // the answer is the argmax (greedy, nothing finite, or nothing kept)
  token_id best = 0;
  std::vector<token_id> ids;  // kept tokens in draw order
  std::vector<double> cum;    // running mass after each kept token
};

kept_set reference_kept(const float* logits, int vocab, const request& q) {
  const sampling_params& p = q.p;
  auto sanitize = [](float x) {
    if (std::isnan(x)) return -inf_f;
    if (x == inf_f) return std::numeric_limits<float>::max();
    return x;
  };
  std::vector<float> v(logits, logits + vocab);
  for (float& x : v) x = sanitize(x);
  if (p.repetition_penalty != 1.0f)
    for (token_id t : q.context) v[std::size_t(t)] = sanitize(zipage::apply_repetition_penalty(sanitize(logits[t]), p.repetition_penalty));
  if (p.output_penalties()) {
    std::map<token_id, int> counts;
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(q.step, q.context.size()));
    for (std::size_t i = q.context.size() - n; i < q.context.size(); ++i) ++counts[q.context[i]];
    for (const auto& [t, count] : counts)
      v[std::size_t(t)] = sanitize(zipage::apply_output_penalties(v[std::size_t(t)], count, p.frequency_penalty, p.presence_penalty));
  }
  kept_set k;
  k.best = static_cast<token_id>(std::max_element(v.begin(), v.end()) - v.begin());
  const float m = v[std::size_t(k.best)];
  if (p.temperature == 0.0f || m == -inf_f) {
    k.greedy = true;
    return k;
  }
  std::vector<std::pair<float, token_id>> c;
  for (int i = 0; i < vocab; ++i) {
    const float w = std::exp((v[std::size_t(i)] - m) / p.temperature);
    if (w > 0.0f) c.push_back({w, i});
  }
  std::sort(c.begin(), c.end(), [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  if (p.top_k > 0 && static_cast<std::size_t>(p.top_k) < c.size()) c.resize(static_cast<std::size_t>(p.top_k));
  if (p.top_p < 1.0f) {
    double mass = 0.0;
    for (auto& x : c) mass += x.first;
    const double target = static_cast<double>(p.top_p) * mass;
    double cum = 0.0;
    std::size_t n = 0;
    while (n < c.size()) {
      cum += c[n++].first;
      if (cum >= target) break;
    }
    c.resize(n);
  }
  if (p.min_p > 0.0f) std::erase_if(c, [&](auto& x) { return x.first < p.min_p; });
  if (c.empty()) {
    k.greedy = true;
    return k;
  }
  double cum = 0.0;
  for (auto& x : c) {
    k.ids.push_back(x.second);
    k.cum.push_back(cum += x.first);
  }
  return k;
}

// Tallies one batch's comparison.
struct tally {
  long greedy = 0, greedy_bad = 0;
  long sampled = 0, sampled_same = 0, outside_kept = 0, boundary = 0, ref_bad = 0;
};
tally g_total;

void compare(const batch_case& c, const std::vector<std::int32_t>& gpu) {
  std::vector<std::int32_t> cpu(static_cast<std::size_t>(c.batch));
  std::vector<kept_set> kept(static_cast<std::size_t>(c.batch));
  parallel_for(static_cast<std::size_t>(c.batch), [&](std::size_t r) {
    static thread_local zipage::sampler s;
    const float* row = c.logits.data() + r * std::size_t(c.vocab);
    const request& q = c.reqs[r];
    cpu[r] = s.sample(std::span<const float>(row, std::size_t(c.vocab)), q.p, q.context, q.step, q.rules);
    if (q.p.processes_logits(q.step)) {  // the reference on the edited row
      zipage::logit_edits e;
      zipage::make_logit_edits(e, q.p, q.context, q.step, q.rules, c.vocab);
      std::vector<float> edited(static_cast<std::size_t>(c.vocab));
      zipage::apply_logit_edits(std::span<const float>(row, std::size_t(c.vocab)), e, edited);
      kept[r] = reference_kept(edited.data(), c.vocab, q);
    } else {
      kept[r] = reference_kept(row, c.vocab, q);
    }
  });
  tally t;
  int printed = 0;
  for (int r = 0; r < c.batch; ++r) {
    const kept_set& k = kept[std::size_t(r)];
    const std::int32_t g = gpu[std::size_t(r)], h = cpu[std::size_t(r)];
    const request& q = c.reqs[std::size_t(r)];
    if (k.greedy) {
      ++t.greedy;
      if (g != h || h != k.best) {
        ++t.greedy_bad;
        if (printed++ < 10)
          std::printf("  greedy mismatch: %s row %d gpu %d cpu %d ref %d (T %g, top_k %d, top_p %g, min_p %g, pen %g)\n",
                      c.name.c_str(), r, g, h, k.best, q.p.temperature, q.p.top_k, q.p.top_p, q.p.min_p,
                      q.p.repetition_penalty);
      }
      continue;
    }
    ++t.sampled;
    const auto pos = [&](std::int32_t id) -> long {
      const auto it = std::find(k.ids.begin(), k.ids.end(), id);
      return it == k.ids.end() ? -1 : static_cast<long>(it - k.ids.begin());
    };
    const long pg = pos(g), pc = pos(h);
    if (pc < 0) ++t.ref_bad;
    if (pg < 0) ++t.outside_kept;
    if (g == h) {
      ++t.sampled_same;
      continue;
    }
    // Distance of the draw's target from the CDF boundaries between the two tokens.
    const double mass = k.cum.back();
    const double target = static_cast<double>(zipage::sampling_uniform(q.p.seed, q.step)) * mass;
    double dist = std::numeric_limits<double>::infinity();
    if (pg >= 0 && pc >= 0)
      for (long b = std::min(pg, pc); b < std::max(pg, pc); ++b) dist = std::min(dist, std::abs(k.cum[std::size_t(b)] - target) / mass);
    if (dist < 1e-6) ++t.boundary;
    if (printed++ < 10)
      std::printf("  sampled mismatch: %s row %d gpu %d (pos %ld) cpu %d (pos %ld) of %zu kept; boundary distance %.3e "
                  "(T %g, top_k %d, top_p %g, min_p %g, pen %g)\n",
                  c.name.c_str(), r, g, pg, h, pc, k.ids.size(), dist, q.p.temperature, q.p.top_k, q.p.top_p, q.p.min_p,
                  q.p.repetition_penalty);
  }
  std::printf("[INFO] %-44s greedy %ld (bad %ld), sampled %ld: same %ld, outside kept %ld, boundary %ld\n", c.name.c_str(),
              t.greedy, t.greedy_bad, t.sampled, t.sampled_same, t.outside_kept, t.boundary);
  g_total.greedy += t.greedy, g_total.greedy_bad += t.greedy_bad, g_total.sampled += t.sampled;
  g_total.sampled_same += t.sampled_same, g_total.outside_kept += t.outside_kept, g_total.boundary += t.boundary;
  g_total.ref_bad += t.ref_bad;
}

std::vector<int> identity(int n) {
  std::vector<int> o(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) o[std::size_t(i)] = i;
  return o;
}

void test_batch(int vocab, int batch, bool bf16, std::int64_t row_pad = 0, bool reorder = false) {
  const batch_case c = make_case(vocab, batch, bf16, row_pad);
  const std::vector<std::int32_t> gpu = run_gpu(c, identity(batch));
  compare(c, gpu);
  if (reorder) {  // rows reversed: every request must get the same token (batch independence, determinism)
    std::vector<int> rev = identity(batch);
    std::reverse(rev.begin(), rev.end());
    check(run_gpu(c, rev) == gpu, c.name + ": same tokens with the batch reversed, and repeatable");
    check(run_gpu(c, identity(batch), false, true) == gpu,
          c.name + ": same tokens with only the generated tokens sent for the frequency / presence penalties");
  }
}

// vLLM's logits processors on most rows of a random batch (the rest plain): allowed_token_ids (a few ids, or
// thousands), logit_bias (up to +-100, on allowed ids or not), bad words of one token or ending the generated
// tokens, min_tokens with EOS and stop ids; greedy and sampled, with and without penalties.
void add_random_processors(request& q, int vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> pick(0, 99);
  std::uniform_int_distribution<token_id> tok(0, vocab - 1);
  if (q.context.size() < 4)
    for (int i = 0; i < 6; ++i) q.context.push_back(tok(rng));
  q.step = std::uniform_int_distribution<std::uint64_t>(0, q.context.size())(rng);
  if (pick(rng) < 30) {
    std::vector<token_id> allowed;
    const int n = pick(rng) < 80 ? 1 + pick(rng) % 8 : std::min(vocab, 3000);
    for (int i = 0; i < n; ++i) allowed.push_back(tok(rng));
    q.p.allowed_token_ids = allowed;
  }
  if (pick(rng) < 50) {
    const float biases[] = {-100.0f, -5.0f, -0.5f, 0.25f, 3.0f, 100.0f};
    for (int i = 1 + pick(rng) % 4; i > 0; --i) {
      const token_id t = q.p.allowed_token_ids && pick(rng) < 50
                             ? (*q.p.allowed_token_ids)[std::size_t(pick(rng)) % q.p.allowed_token_ids->size()]
                             : tok(rng);
      q.p.logit_bias[t] = biases[pick(rng) % 6];
    }
  }
  if (pick(rng) < 40) {
    q.rules.bad_words.push_back({tok(rng)});
    // A two-token word whose first token ends the generated tokens, when there are any.
    if (q.step > 0) q.rules.bad_words.push_back({q.context.back(), tok(rng)});
  }
  if (pick(rng) < 40) {
    q.p.min_tokens = static_cast<int>(q.step) + pick(rng) % 3;
    q.rules.eos_ids = {tok(rng), tok(rng)};
    if (pick(rng) < 50) q.p.stop_token_ids = {tok(rng)};
  }
}

void test_logit_edits(int vocab, int batch, bool bf16) {
  batch_case c = make_case(vocab, batch, bf16, 0);
  c.name += " processors";
  std::mt19937_64 rng(static_cast<std::uint64_t>(vocab) * 7 + static_cast<std::uint64_t>(batch) + (bf16 ? 1 : 0));
  for (request& q : c.reqs)
    if (rng() % 5 != 0) add_random_processors(q, vocab, rng);
  const std::vector<std::int32_t> gpu = run_gpu(c, identity(batch));
  compare(c, gpu);
  std::vector<int> rev = identity(batch);
  std::reverse(rev.begin(), rev.end());
  check(run_gpu(c, rev) == gpu, c.name + ": same tokens with the batch reversed");
  // A token the processors rule out (-inf after the edit) is never drawn, unless the whole edited row is -inf
  // (then token 0); the kept-set check covers this too, said plainly here.
  long banned = 0;
  zipage::logit_edits e;
  std::vector<float> edited(static_cast<std::size_t>(vocab));
  for (int r = 0; r < batch; ++r) {
    const request& q = c.reqs[std::size_t(r)];
    if (!q.p.processes_logits(q.step)) continue;
    zipage::make_logit_edits(e, q.p, q.context, q.step, q.rules, vocab);
    zipage::apply_logit_edits({c.logits.data() + std::size_t(r) * std::size_t(vocab), std::size_t(vocab)}, e, edited);
    const auto live = [](float x) { return x == x && x != -inf_f; };
    if (std::any_of(edited.begin(), edited.end(), live) && !live(edited[std::size_t(gpu[std::size_t(r)])])) ++banned;
  }
  check(banned == 0, c.name + ": no token the processors rule out is drawn (" + std::to_string(banned) + " were)");
}

// All-greedy batch through the temperature == nullptr path (no workspace): the argmax of every row.
void test_null_temperature(int vocab, int batch) {
  batch_case c = make_case(vocab, batch, false, 0);
  const std::vector<std::int32_t> gpu = run_gpu(c, identity(batch), true);
  long bad = 0;
  for (int r = 0; r < batch; ++r) {
    request q = c.reqs[std::size_t(r)];
    q.p.temperature = 0.0f;
    const kept_set k = reference_kept(c.logits.data() + std::size_t(r) * vocab, vocab, q);
    bad += gpu[std::size_t(r)] != k.best;
  }
  check(bad == 0, c.name + ": temperature == nullptr -> argmax of every row (" + std::to_string(bad) + " wrong)");
}

// Log-probabilities on the device against zipage/sampling/logprobs.hpp on the host: the sampled token's
// and the k best (k random in 0..20 per request), ids identical, values within float rounding (the
// log-sum-exp is summed in another order); the tokens are the same as without log-probabilities.
void test_logprobs(int vocab, int batch, bool bf16) {
  const batch_case c = make_case(vocab, batch, bf16, 0);
  logprob_result lpr;
  std::mt19937_64 rng(static_cast<std::uint64_t>(vocab) * 31 + static_cast<std::uint64_t>(batch));
  for (int r = 0; r < batch; ++r) lpr.k.push_back(static_cast<int>(rng() % 21));
  const std::vector<std::int32_t> gpu = run_gpu(c, identity(batch), false, false, &lpr);
  check(gpu == run_gpu(c, identity(batch)), c.name + ": log-probabilities change no token");
  long bad_ids = 0, bad_values = 0, nan_rows = 0;
  double worst = 0.0;
  auto close = [&](float g, float h) {
    if (std::isnan(h) || std::isnan(g)) return std::isnan(h) && std::isnan(g);
    if (std::isinf(h) || std::isinf(g)) return g == h;
    const double d = std::abs(double(g) - double(h));
    worst = std::max(worst, d);
    return d <= 1e-5 * std::max(1.0, std::abs(double(h)));
  };
  for (int r = 0; r < batch; ++r) {
    const std::span<const float> row(c.logits.data() + std::size_t(r) * std::size_t(vocab), std::size_t(vocab));
    const float h = zipage::token_logprob_of(row, gpu[std::size_t(r)]);
    if (std::isnan(h)) ++nan_rows;
    if (!close(lpr.lp[std::size_t(r)], h)) ++bad_values;
    const auto top = zipage::top_logprobs(row, lpr.k[std::size_t(r)]);
    for (std::size_t t = 0; t < top.size(); ++t) {
      if (lpr.ids[std::size_t(r) * 20 + t] != top[t].id) ++bad_ids;
      else if (!close(lpr.top[std::size_t(r) * 20 + t], top[t].logprob)) ++bad_values;
    }
  }
  std::printf("[INFO] %-44s logprobs: worst |gpu - cpu| %.3g, %ld rows with nothing finite\n", c.name.c_str(), worst,
              nan_rows);
  check(bad_ids == 0 && bad_values == 0, c.name + ": device log-probabilities equal the host's (" +
                                             std::to_string(bad_ids) + " ids, " + std::to_string(bad_values) +
                                             " values differ)");
}

}  // namespace

int main() {
  if (zc::device_count() == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", zc::describe_device().c_str());
    return 77;
  }
  std::printf("device 0: %s\n", zc::describe_device(0).c_str());
  // ZIPAGE_CUDA_TEST_QUICK=1: a few small batches (for compute-sanitizer runs).
  const char* quick_env = std::getenv("ZIPAGE_CUDA_TEST_QUICK");
  const bool quick = quick_env != nullptr && quick_env[0] == '1';
  try {
    if (quick) {
      test_batch(512, 48, false, 0, true);
      test_batch(1999, 16, true, 1);
      test_batch(40000, 4, false);
      test_null_temperature(700, 5);
      test_logprobs(512, 32, false);
      test_logit_edits(512, 32, false);
      test_logit_edits(151936, 8, true);
    } else {
      for (bool bf16 : {false, true}) {
        for (int b : {1, 2, 7, 64, 256}) test_batch(512, b, bf16, 0, b == 64);
        for (int rep = 0; rep < 6; ++rep) test_batch(512, 256, bf16);
        for (int b : {1, 13, 128, 256}) test_batch(32000, b, bf16, 0, b == 128);
        test_batch(32000, 100, bf16, 3);  // unaligned rows: the scalar load path
        for (int b : {1, 37, 256}) test_batch(151936, b, bf16, 0, b == 37);
        test_batch(50257, 64, bf16);  // odd vocabulary: a partial last group
        test_batch(1, 8, bf16);
        test_batch(3, 32, bf16, 1);
      }
      for (bool bf16 : {false, true}) {
        for (int rep = 0; rep < 4; ++rep) test_logit_edits(512, 256, bf16);
        test_logit_edits(32000, 128, bf16);
        test_logit_edits(151936, 64, bf16);
      }
      test_null_temperature(32000, 50);
      test_null_temperature(151936, 9);
      for (bool bf16 : {false, true}) {
        test_logprobs(512, 64, bf16);
        test_logprobs(32000, 37, bf16);
        test_logprobs(151936, 256, bf16);
        test_logprobs(5, 16, bf16);  // k beyond the vocabulary
      }
    }

    // Argument checks.
    bool threw = false;
    try {
      zc::sampling_batch p;
      p.batch = 1;
      p.vocab = 0;
      zc::sample_tokens(p, nullptr, 0, nullptr);
    } catch (const zipage::error&) {
      threw = true;
    }
    check(threw, "vocab 0 is rejected");

    // A greedy batch with output penalties needs the workspace (its counts); without, none.
    check(zc::sampling_workspace_bytes(4, 1000, true) == 0 && zc::sampling_workspace_bytes(4, 1000, true, true) ==
                                                                  zc::sampling_workspace_bytes(4, 1000, false),
          "workspace: a greedy batch with frequency / presence penalties needs a sampling batch's");
  } catch (const std::exception& e) {
    std::printf("FAIL: exception: %s\n", e.what());
    return 1;
  }

  const double same = g_total.sampled ? double(g_total.sampled_same) / double(g_total.sampled) : 1.0;
  std::printf("[INFO] total: greedy %ld, sampled %ld, identical %.4f%% (%ld differ, %ld of them within 1e-6 of a CDF "
              "boundary), outside the CPU kept set %ld\n",
              g_total.greedy, g_total.sampled, 100.0 * same, g_total.sampled - g_total.sampled_same, g_total.boundary,
              g_total.outside_kept);
  check(g_total.ref_bad == 0, "reference self-check: every CPU sampler token lies in the reference kept set");
  check(g_total.greedy_bad == 0, "greedy tokens identical (" + std::to_string(g_total.greedy) + " requests)");
  check(same >= 0.999, "sampled tokens >= 99.9% identical");
  check(g_total.outside_kept == 0, "every GPU token lies in the CPU's kept set");
  std::printf("%d checks, %d failures\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
