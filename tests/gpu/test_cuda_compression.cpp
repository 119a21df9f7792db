// Checks the CUDA compression step (backend/cuda/compression.hpp) against the CPU reference on random
// inputs, for the recipe of every built-in policy (streaming_llm, h2o, snapkv, rkv, gkv, zipage):
// scoring::run_recipe (window attention or recency, decayed-max or accumulated history, pooling,
// block-local or full-sequence redundancy normalised over the whole sequence, combine, sinks) + the
// compressor's forced window keep + select_top_k + cpu::apply_compaction.
//
// Grid (zipage, and each policy on a sub-grid): head_dim 64/128, GQA 1/2/4/8 (plus 7, 16, 32 and a
// Qwen3-8B-shaped 32/8 case), block size 16/256,
// budgets 2..8 blocks, batches of requests of different lengths (first compressions with long prompts,
// later compressions, a ragged length, one request with nothing to evict) over 2 layers, shuffled page
// tables and query slots. Unused cache slots, and the score cache of first-compression requests, are
// NaN, so any read of them shows. Per case:
//  * S (score cache after the score stage) against the reference's cache_out: max |dS| / max |S| per
//    (layer, request, head) segment <= 2e-5;
//  * F (final scores) against the reference's keep_score (window +inf included): +inf exactly where
//    the reference has it, elsewhere |dF| <= tol_F = 2e-5 * max |F| of the segment;
//  * kept sets: the GPU's indices must be ascending and unique; each token kept by one side only must
//    have a reference score within 2 * tol_F of the reference's boundary score (the keep-th largest).
//    Why: the GPU's F differs from the CPU's by at most tol_F (fp32 instead of double arithmetic), so
//    two tokens can trade places across the cut only when their exact scores are within 2 * tol_F of
//    each other - i.e. of the boundary. Any other disagreement fails. Such swaps are counted;
//  * compaction: exact (bitwise) against cpu::apply_compaction fed the GPU's own kept indices and S, on
//    the whole K, V and score pools; compress() in one call must reproduce the staged run bit for bit.
// FP8 cases (E4M3 K/V codes with per-(token, head) scales, as the append kernel writes them): the keys are
// quantised with cpu::fp8::quantize_head and the reference runs on their dequantised bf16(float(code) *
// scale) values, which is what the kernels score, so the same checks hold; compaction must move codes and
// scales together (every element dequantises to the compacted reference).
// Exits 1 on any failure, 77 (skipped) where there is no CUDA device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuda_buffers.hpp"
#include "zipage/backend/cpu/compaction.hpp"
#include "zipage/backend/cpu/fp8_kv.hpp"
#include "zipage/backend/cpu/kv_storage.hpp"
#include "zipage/backend/cuda/compression.hpp"
#include "zipage/compression/compressor.hpp"
#include "zipage/core/fp8.hpp"
#include "zipage/core/kv_scale.hpp"
#include "zipage/cuda/device.hpp"
#include "zipage/policy/policies.hpp"

namespace {

using zipage::testing::from_bf16;
using zipage::testing::kBf16NaN;
using zipage::testing::to_bf16;

namespace zc = zipage::cuda;

int g_failures = 0;
int g_checks = 0;
int g_swaps = 0;

#define CUDA_OK(expr) ZIPAGE_TEST_CUDA_OK(expr)

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

std::mt19937_64 g_rng(20260301);
float uni(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(g_rng); }
int rand_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g_rng); }

template <class T>
using dbuf = zipage::testing::device_buffer<T>;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

void check(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) ++g_failures;
  std::printf("[%s] %s\n", ok ? "PASS" : "FAIL", what.c_str());
}

struct req_spec {
  int len;
  bool first;
};

struct case_spec {
  int d, qh, kvh, bs, budget;
  std::vector<req_spec> reqs;
  int window = 16;
  int layers = 2;
  int sinks = 0;
  int pool = 5;
  std::string policy = "zipage";
  bool fp8 = false;  // E4M3 K/V with per-(token, head) scales instead of bf16
};

// The recipe of the named built-in policy, with the case's sinks and pool kernel where the policy has them.
zipage::score_recipe recipe_of(const case_spec& c) {
  zipage::score_recipe r;
  bool found = false;
  zipage::for_each_builtin_policy([&](auto p) {
    if constexpr (zipage::recipe_scored<decltype(p)>) {
      if (p.name() != c.policy) return;
      r = p.recipe();
      found = true;
    }
  });
  if (!found) throw std::runtime_error("no recipe policy " + c.policy);
  if (r.pooling != zipage::score_recipe::pool_when::never) r.pool_kernel = c.pool;
  if (c.policy == "zipage") r.sinks = c.sinks;
  return r;
}

// Everything the CPU reference produces for one (layer, request).
struct ref_out {
  std::vector<float> s;                // cache_out [kv_heads][len]
  std::vector<float> f;                // keep_score with the window forced [kv_heads][len]
  std::vector<std::int32_t> kept;      // [kv_heads][keep_r]
};

std::string case_name(const case_spec& c) {
  std::string lens;
  for (const auto& r : c.reqs) lens += std::to_string(r.len) + (r.first ? "f" : "") + ",";
  if (!lens.empty()) lens.pop_back();
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s%s D=%d q=%d kv=%d bs=%d B=%d W=%d L=%d sinks=%d pool=%d reqs=[%s]", c.policy.c_str(),
                c.fp8 ? " fp8" : "", c.d, c.qh, c.kvh, c.bs, c.budget, c.window, c.layers, c.sinks, c.pool, lens.c_str());
  return buf;
}

void run_case(const case_spec& c) {
  const std::string name = case_name(c);
  const int nreq = static_cast<int>(c.reqs.size());
  const int keep = c.budget * c.bs;
  const int num_slots = nreq + 2;
  const zipage::score_recipe recipe = recipe_of(c);
  const bool cache = recipe.uses_score_cache();

  // Page tables drawn from a shuffled pool with spare blocks; slots shuffled.
  std::vector<std::int32_t> indptr{0}, indices, lens, slots(static_cast<std::size_t>(num_slots));
  std::vector<std::uint8_t> first;
  int pages = 0, max_len = 0;
  for (const auto& r : c.reqs) {
    pages += (r.len + c.bs - 1) / c.bs;
    indptr.push_back(pages);
    lens.push_back(r.len);
    first.push_back(r.first ? 1 : 0);
    max_len = std::max(max_len, r.len);
  }
  const int num_blocks = pages + 3;
  std::vector<std::int32_t> pool(static_cast<std::size_t>(num_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), g_rng);
  indices.assign(pool.begin(), pool.begin() + pages);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), g_rng);
  slots.resize(static_cast<std::size_t>(nreq));

  zipage::kv_cache_shape shape;
  shape.num_layers = c.layers;
  shape.num_blocks = num_blocks;
  shape.block_size = c.bs;
  shape.num_kv_heads = c.kvh;
  shape.head_dim = c.d;
  shape.num_q_heads = c.qh;
  shape.window = c.window;
  shape.num_query_slots = num_slots;
  shape.score_cache = cache;

  // Host data: bf16 bits and exact float copies. Slots holding no token are NaN.
  const std::size_t kv_elems = static_cast<std::size_t>(shape.elements_per_side());
  const std::size_t sc_elems = static_cast<std::size_t>(shape.score_elements());
  const std::size_t q_elems = static_cast<std::size_t>(shape.query_layer_stride() * c.layers);
  std::vector<std::uint16_t> kb(kv_elems, kBf16NaN), vb(kv_elems, kBf16NaN), qb(q_elems);
  std::vector<float> sc(sc_elems, kNaN);
  auto slot_of = [&](int r, int j) {
    return std::int64_t{indices[static_cast<std::size_t>(indptr[static_cast<std::size_t>(r)] + j / c.bs)]} * c.bs + j % c.bs;
  };
  auto kv_at = [&](int l, std::int64_t slot, int h) {
    return static_cast<std::size_t>(((std::int64_t{l} * num_blocks * c.bs + slot) * c.kvh + h) * c.d);
  };
  auto sc_at = [&](int l, std::int64_t slot, int h) {
    return static_cast<std::size_t>((std::int64_t{l} * num_blocks * c.bs + slot) * c.kvh + h);
  };
  for (int l = 0; l < c.layers; ++l)
    for (int r = 0; r < nreq; ++r) {
      const int len = lens[static_cast<std::size_t>(r)];
      for (int j = 0; j < len; ++j)
        for (int h = 0; h < c.kvh; ++h) {
          const std::size_t at = kv_at(l, slot_of(r, j), h);
          const int in_block = j % c.bs;
          const float u = uni(0.0f, 1.0f);
          if (in_block > 0 && u < 0.12f) {
            // A near-duplicate (or, 1 in 4, an exact copy) of an earlier key of the same block.
            const int src = j - rand_int(1, in_block);
            const std::size_t from = kv_at(l, slot_of(r, src), h);
            const float noise = u < 0.03f ? 0.0f : 0.08f;
            for (int i = 0; i < c.d; ++i) kb[at + i] = to_bf16(from_bf16(kb[from + i]) + noise * uni(-1.0f, 1.0f));
          } else {
            for (int i = 0; i < c.d; ++i) kb[at + i] = to_bf16(uni(-1.0f, 1.0f));
          }
          for (int i = 0; i < c.d; ++i) vb[at + i] = to_bf16(uni(-1.0f, 1.0f));
          if (cache && !c.reqs[static_cast<std::size_t>(r)].first) sc[sc_at(l, slot_of(r, j), h)] = uni(0.0f, 3.0f / len);
        }
    }
  for (auto& x : qb) x = to_bf16(uni(-3.0f, 3.0f));

  // FP8 cache: every written (slot, head) quantised as the append kernel does (cpu::fp8::quantize_head), and
  // its bf16 copy replaced by the dequantised bf16(float(code) * scale), which is what the kernels score: the
  // bf16 reference below then holds for the FP8 run as is. Empty slots: E4M3 NaN codes, NaN scales.
  std::vector<std::uint8_t> k8, v8;
  std::vector<std::uint16_t> ks, vs;  // bf16 scales
  if (c.fp8) {
    k8.assign(kv_elems, 0x7f);
    v8.assign(kv_elems, 0x7f);
    ks.assign(kv_elems / static_cast<std::size_t>(c.d), zipage::kv_scale_nan);  // per (layer, slot, head), as the
    vs.assign(kv_elems / static_cast<std::size_t>(c.d), zipage::kv_scale_nan);  // score cache (which some recipes lack)
    std::vector<float> x(static_cast<std::size_t>(c.d));
    auto quantise = [&](std::vector<std::uint16_t>& bf, std::vector<std::uint8_t>& codes,
                        std::vector<std::uint16_t>& scales, std::size_t at, std::size_t scale_at) {
      for (int i = 0; i < c.d; ++i) x[static_cast<std::size_t>(i)] = from_bf16(bf[at + i]);
      const std::uint16_t b = zipage::cpu::fp8::quantize_head(x.data(), c.d, codes.data() + at);
      scales[scale_at] = b;
      const float scale = zipage::kv_scale_to_f32(b);
      for (int i = 0; i < c.d; ++i) bf[at + i] = to_bf16(zipage::fp8_e4m3_to_f32(codes[at + i]) * scale);
    };
    for (int l = 0; l < c.layers; ++l)
      for (int r = 0; r < nreq; ++r)
        for (int j = 0; j < lens[static_cast<std::size_t>(r)]; ++j)
          for (int h = 0; h < c.kvh; ++h) {
            quantise(kb, k8, ks, kv_at(l, slot_of(r, j), h), sc_at(l, slot_of(r, j), h));
            quantise(vb, v8, vs, kv_at(l, slot_of(r, j), h), sc_at(l, slot_of(r, j), h));
          }
  }

  // ---- CPU reference, threaded over (layer, request).
  zipage::cpu_kv_storage host(shape);  // scores sized by shape.score_cache
  for (std::size_t i = 0; i < kv_elems; ++i) {
    host.k[i] = from_bf16(kb[i]);
    host.v[i] = from_bf16(vb[i]);
  }
  if (cache) host.scores = sc;
  for (std::size_t i = 0; i < q_elems; ++i) host.queries[i] = from_bf16(qb[i]);

  std::vector<ref_out> ref(static_cast<std::size_t>(c.layers * nreq));
  {
    std::vector<std::thread> threads;
    const int tasks = c.layers * nreq;
    const int nt = std::max(1, std::min<int>(tasks, static_cast<int>(std::thread::hardware_concurrency())));
    for (int w = 0; w < nt; ++w)
      threads.emplace_back([&, w] {
        std::vector<float> keys, prev;
        std::vector<std::int32_t> order;
        for (int t = w; t < tasks; t += nt) {
          const int l = t / nreq, r = t % nreq;
          const int len = lens[static_cast<std::size_t>(r)];
          const std::span<const zipage::block_id> pg(
              reinterpret_cast<const zipage::block_id*>(indices.data()) + indptr[static_cast<std::size_t>(r)],
              static_cast<std::size_t>(indptr[static_cast<std::size_t>(r) + 1] - indptr[static_cast<std::size_t>(r)]));
          zipage::cpu::gather_keys(host, l, pg, len, keys);
          zipage::cpu::gather_scores(host, l, pg, len, prev);
          const auto queries = zipage::cpu::window_queries(host, l, slots[static_cast<std::size_t>(r)]);
          const zipage::score_context ctx{len, c.kvh, c.qh, c.d, c.bs, c.window,
                                          c.reqs[static_cast<std::size_t>(r)].first, keys, queries, prev};
          ref_out& o = ref[static_cast<std::size_t>(t)];
          o.s.assign(static_cast<std::size_t>(c.kvh) * len, 0.0f);
          o.f.assign(static_cast<std::size_t>(c.kvh) * len, 0.0f);
          zipage::scoring::run_recipe(recipe, ctx, o.f, o.s);
          const int kr = std::min(keep, len);
          o.kept.resize(static_cast<std::size_t>(c.kvh) * kr);
          for (int h = 0; h < c.kvh; ++h) {
            const std::span<float> row(o.f.data() + static_cast<std::size_t>(h) * len, static_cast<std::size_t>(len));
            std::fill(row.end() - c.window, row.end(), kInf);
            zipage::select_top_k(row, kr, order,
                                 std::span<std::int32_t>(o.kept.data() + static_cast<std::size_t>(h) * kr,
                                                         static_cast<std::size_t>(kr)));
          }
        }
      });
    for (auto& th : threads) th.join();
  }
  static_assert(sizeof(zipage::block_id) == sizeof(std::int32_t));

  // ---- GPU.
  dbuf<std::uint16_t> dk(kb), dv(vb), dq(qb);
  dbuf<std::uint8_t> dk8(k8), dv8(v8);
  dbuf<float> dsc(sc);
  dbuf<std::uint16_t> dks(ks), dvs(vs);
  dbuf<std::int32_t> dindptr(indptr), dindices(indices), dlen(lens), dslot(slots);
  dbuf<std::uint8_t> dfirst(first);
  zc::compress_params p;
  p.kv.k_cache = dk.p;
  p.kv.v_cache = dv.p;
  if (c.fp8) {
    p.kv.k_cache = dk8.p;
    p.kv.v_cache = dv8.p;
    p.kv.k_scale = dks.p;
    p.kv.v_scale = dvs.p;
  }
  p.score_cache = cache ? dsc.p : nullptr;
  p.query_cache = dq.p;
  p.num_layers = c.layers;
  p.kv.num_blocks = num_blocks;
  p.num_slots = num_slots;
  p.kv.page_indptr = dindptr.p;
  p.kv.page_indices = dindices.p;
  p.kv.kv_len = dlen.p;
  p.slot = dslot.p;
  p.first_compression = dfirst.p;
  p.num_reqs = nreq;
  p.max_kv_len = max_len;
  p.num_q_heads = c.qh;
  p.kv.num_kv_heads = c.kvh;
  p.kv.head_dim = c.d;
  p.kv.block_size = c.bs;
  p.window = c.window;
  p.keep = keep;
  p.recipe = recipe;
  const std::size_t ws_bytes = zc::compress_workspace_bytes(p);
  dbuf<unsigned char> ws(ws_bytes);
  CUDA_OK(cudaMemset(ws.p, 0xff, ws_bytes));  // poison: NaN scores, -1 indices
  const zc::compress_workspace_view view = zc::compress_workspace(p, ws.p);

  zc::compress_score(p, ws.p, ws_bytes, nullptr);
  const std::vector<float> s_gpu = dsc.get();
  zc::compress_select(p, ws.p, ws_bytes, nullptr);
  std::vector<float> f_gpu(static_cast<std::size_t>(c.layers) * nreq * c.kvh * max_len);
  std::vector<std::int32_t> kept_gpu(static_cast<std::size_t>(c.layers) * nreq * c.kvh * keep);
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(f_gpu.data(), view.final_scores, f_gpu.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(kept_gpu.data(), view.kept, kept_gpu.size() * 4, cudaMemcpyDeviceToHost));
  zc::compress_compact(p, ws.p, ws_bytes, nullptr);
  const std::vector<std::uint16_t> k_after = dk.get(), v_after = dv.get();
  const std::vector<float> s_after = dsc.get();

  // ---- Compare scores, final scores, kept sets.
  double worst_s = 0.0, worst_f = 0.0;
  std::size_t bad_s = 0, bad_f = 0, bad_inf = 0, bad_order = 0, bad_sets = 0, swaps = 0, untouched_bad = 0;
  for (int l = 0; l < c.layers; ++l)
    for (int r = 0; r < nreq; ++r) {
      const int len = lens[static_cast<std::size_t>(r)];
      const int kr = std::min(keep, len);
      const ref_out& o = ref[static_cast<std::size_t>(l * nreq + r)];
      for (int h = 0; h < c.kvh; ++h) {
        const std::size_t seg = static_cast<std::size_t>((l * nreq + r) * c.kvh + h);
        const float* sr = o.s.data() + static_cast<std::size_t>(h) * len;
        const float* fr = o.f.data() + static_cast<std::size_t>(h) * len;
        const float* fg = f_gpu.data() + seg * max_len;
        // S (the score cache, for recipes that keep one)
        double smax = 0.0, sdiff = 0.0;
        for (int j = 0; j < (cache ? len : 0); ++j) {
          const float g = s_gpu[sc_at(l, slot_of(r, j), h)];
          smax = std::max(smax, std::abs(double(sr[j])));
          if (!std::isfinite(g)) {
            ++bad_s;
            continue;
          }
          sdiff = std::max(sdiff, std::abs(double(g) - sr[j]));
        }
        const double s_rel = smax > 0 ? sdiff / smax : sdiff;
        worst_s = std::max(worst_s, s_rel);
        if (s_rel > 2e-5) ++bad_s;
        // Slots of the request past its length must be untouched (NaN poison for K, V; scores as given).
        for (int j = len; cache && j < (len + c.bs - 1) / c.bs * c.bs; ++j)
          if (!same_bits(s_gpu[sc_at(l, slot_of(r, j), h)], sc[sc_at(l, slot_of(r, j), h)])) ++untouched_bad;
        // F
        double fmax = 0.0;
        for (int j = 0; j < len; ++j)
          if (std::isfinite(fr[j])) fmax = std::max(fmax, std::abs(double(fr[j])));
        const double tol_f = 2e-5 * fmax;
        double fdiff = 0.0;
        for (int j = 0; j < len; ++j) {
          if (std::isinf(fr[j]) || std::isinf(fg[j])) {
            if (fr[j] != fg[j]) ++bad_inf;
            continue;
          }
          if (!std::isfinite(fg[j])) {
            ++bad_f;
            continue;
          }
          fdiff = std::max(fdiff, std::abs(double(fg[j]) - fr[j]));
        }
        worst_f = std::max(worst_f, fmax > 0 ? fdiff / fmax : fdiff);
        if (fdiff > tol_f) ++bad_f;
        // Kept sets
        const std::int32_t* kg = kept_gpu.data() + seg * keep;
        const std::int32_t* kc = o.kept.data() + static_cast<std::size_t>(h) * kr;
        bool ordered = true;
        for (int i = 0; i < kr; ++i)
          if (kg[i] < 0 || kg[i] >= len || (i > 0 && kg[i] <= kg[i - 1])) ordered = false;
        if (!ordered) {
          ++bad_order;
          continue;
        }
        std::vector<std::int32_t> only_gpu, only_cpu;
        std::set_difference(kg, kg + kr, kc, kc + kr, std::back_inserter(only_gpu));
        std::set_difference(kc, kc + kr, kg, kg + kr, std::back_inserter(only_cpu));
        if (!only_gpu.empty()) {
          // The reference's boundary: the kr-th largest reference score.
          std::vector<float> sorted(fr, fr + len);
          for (auto& x : sorted)
            if (std::isnan(x)) x = -kInf;
          std::nth_element(sorted.begin(), sorted.begin() + (kr - 1), sorted.end(), std::greater<>());
          const double boundary = sorted[static_cast<std::size_t>(kr - 1)];
          bool ok = only_gpu.size() == only_cpu.size();
          for (auto j : only_gpu) ok = ok && std::abs(double(fr[j]) - boundary) <= 2 * tol_f;
          for (auto j : only_cpu) ok = ok && std::abs(double(fr[j]) - boundary) <= 2 * tol_f;
          if (!ok) {
            ++bad_sets;
            if (bad_sets <= 3)
              std::printf("  kept-set mismatch l=%d r=%d h=%d: %zu tokens differ, e.g. gpu-only %d (F=%.9g) cpu-only %d (F=%.9g), boundary %.9g\n",
                          l, r, h, only_gpu.size(), only_gpu[0], double(fr[only_gpu[0]]), only_cpu[0],
                          double(fr[only_cpu[0]]), boundary);
          } else {
            swaps += only_gpu.size();
          }
        }
      }
    }
  g_swaps += static_cast<int>(swaps);
  char line[512];
  std::snprintf(line, sizeof line, "%s: S max|dS|/max|S|=%.2e F max|dF|/max|F|=%.2e boundary swaps=%zu", name.c_str(),
                worst_s, worst_f, swaps);
  check(bad_s == 0 && bad_f == 0 && bad_inf == 0 && bad_order == 0 && bad_sets == 0 && untouched_bad == 0,
        std::string(line) + (bad_s + bad_f + bad_inf + bad_order + bad_sets + untouched_bad
                                 ? " [bad S " + std::to_string(bad_s) + ", F " + std::to_string(bad_f) + ", inf " +
                                       std::to_string(bad_inf) + ", order " + std::to_string(bad_order) + ", sets " +
                                       std::to_string(bad_sets) + ", past-end " + std::to_string(untouched_bad) + "]"
                                 : ""));

  // ---- Compaction: exact against cpu::apply_compaction given the GPU's kept indices and S.
  if (cache) host.scores = s_gpu;
  for (int r = 0; r < nreq; ++r) {
    const int len = lens[static_cast<std::size_t>(r)];
    const int kr = std::min(keep, len);
    zipage::compaction_plan plan;
    plan.old_len = len;
    plan.new_len = kr;
    plan.num_layers = c.layers;
    plan.num_kv_heads = c.kvh;
    plan.pages.assign(indices.begin() + indptr[static_cast<std::size_t>(r)],
                      indices.begin() + indptr[static_cast<std::size_t>(r) + 1]);
    plan.keep.resize(static_cast<std::size_t>(c.layers) * c.kvh * kr);
    if (cache) plan.kept_scores.resize(plan.keep.size());
    for (int l = 0; l < c.layers; ++l)
      for (int h = 0; h < c.kvh; ++h) {
        const std::size_t seg = static_cast<std::size_t>((l * nreq + r) * c.kvh + h);
        for (int i = 0; i < kr; ++i) {
          const std::int32_t j = std::clamp(kept_gpu[seg * keep + i], 0, len - 1);
          plan.keep[plan.offset(l, h) + i] = j;
          if (cache) plan.kept_scores[plan.offset(l, h) + i] = s_gpu[sc_at(l, slot_of(r, j), h)];
        }
      }
    zipage::cpu::apply_compaction(host, plan);
  }
  std::size_t diff_k = 0, diff_v = 0, diff_s = 0;
  const std::vector<std::uint8_t> k8_after = dk8.get(), v8_after = dv8.get();
  const std::vector<std::uint16_t> ks_after = dks.get(), vs_after = dvs.get();
  for (std::size_t i = 0; i < kv_elems; ++i) {
    if (c.fp8) {
      // Codes and scales moved together: each element dequantises to the compacted reference (NaN in both
      // for slots never written).
      auto deq = [&](const std::vector<std::uint8_t>& codes, const std::vector<std::uint16_t>& scales) {
        const std::uint16_t b = scales[i / static_cast<std::size_t>(c.d)];
        return to_bf16(zipage::fp8_e4m3_to_f32(codes[i]) * zipage::kv_scale_to_f32(b));
      };
      if (deq(k8_after, ks_after) != to_bf16(host.k[i])) ++diff_k;
      if (deq(v8_after, vs_after) != to_bf16(host.v[i])) ++diff_v;
      continue;
    }
    if (!same_bits(from_bf16(k_after[i]), host.k[i])) ++diff_k;
    if (!same_bits(from_bf16(v_after[i]), host.v[i])) ++diff_v;
  }
  for (std::size_t i = 0; i < sc_elems; ++i)
    if (!same_bits(s_after[i], host.scores[i])) ++diff_s;
  check(diff_k + diff_v + diff_s == 0, name + ": compaction exact (K " + std::to_string(diff_k) + ", V " +
                                           std::to_string(diff_v) + ", scores " + std::to_string(diff_s) +
                                           " elements differ)");

  // ---- compress() in one call on fresh copies of the inputs: bit-identical to the staged run.
  dk.put(kb);
  dv.put(vb);
  dk8.put(k8);
  dv8.put(v8);
  dks.put(ks);
  dvs.put(vs);
  dsc.put(sc);
  CUDA_OK(cudaMemset(ws.p, 0xff, ws_bytes));
  zc::compress(p, ws.p, ws_bytes, nullptr);
  const bool same = dk.get() == k_after && dv.get() == v_after && dk8.get() == k8_after && dv8.get() == v8_after &&
                    dks.get() == ks_after && dvs.get() == vs_after;
  const std::vector<float> s_again = dsc.get();
  const bool same_s = std::memcmp(s_again.data(), s_after.data(), sc_elems * 4) == 0;
  check(same && same_s, name + ": compress() = staged run, bitwise");
}

void expect_throw(const std::string& what, auto&& f) {
  bool threw = false;
  try {
    f();
  } catch (const zipage::error&) {
    threw = true;
  }
  check(threw, what + (threw ? " rejected" : " NOT rejected"));
}

void test_validation() {
  zc::compress_params p;
  p.num_q_heads = 8;
  p.kv.num_kv_heads = 2;
  p.kv.head_dim = 128;
  p.kv.block_size = 256;
  p.keep = 512;
  p.kv.num_blocks = 10;
  p.num_slots = 1;
  p.num_reqs = 1;
  p.max_kv_len = 1000;
  (void)zc::compress_workspace_bytes(p);
  auto bad = p;
  bad.kv.head_dim = 96;
  expect_throw("head_dim 96", [&] { (void)zc::compress_workspace_bytes(bad); });
  bad = p;
  bad.kv.block_size = 100;
  expect_throw("block_size 100", [&] { (void)zc::compress_workspace_bytes(bad); });
  bad = p;
  bad.keep = 8;
  expect_throw("keep < window", [&] { (void)zc::compress_workspace_bytes(bad); });
  bad = p;
  bad.num_q_heads = 7;
  expect_throw("q_heads not a multiple of kv_heads", [&] { (void)zc::compress_workspace_bytes(bad); });
  bad = p;
  bad.recipe.pool_kernel = 4;
  expect_throw("even pool kernel", [&] { (void)zc::compress_workspace_bytes(bad); });
  bad = p;
  bad.recipe.history = zipage::score_recipe::history_kind::accumulate;  // and score_cache is null
  expect_throw("a history recipe without a score cache", [&] { zc::compress(bad, nullptr, 0, nullptr); });
  {
    auto with_cache = p;
    float never_read = 0.0f;  // argument checks only: the call throws before any launch
    with_cache.score_cache = &never_read;
    expect_throw("small workspace", [&] { zc::compress(with_cache, nullptr, 0, nullptr); });
  }
}

// Requests of a batch for budget B and block bs: later compressions at (B+1)*bs, first compressions
// with prompts of (B+1..B+4) blocks, a ragged length, one with nothing to evict.
std::vector<req_spec> batch_for(int budget, int bs, bool ragged) {
  std::vector<req_spec> r = {{(budget + 1) * bs, false},
                             {(budget + 1) * bs, true},
                             {(budget + rand_int(2, 4)) * bs, true},
                             {(budget + 1) * bs, false},
                             {budget * bs - rand_int(0, bs / 2), false}};
  if (ragged) r.push_back({(budget + 1) * bs + rand_int(1, bs - 1), rand_int(0, 1) == 1});
  std::shuffle(r.begin(), r.end(), g_rng);
  return r;
}

}  // namespace

int main() {
  if (zc::device_count() == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", zc::describe_device().c_str());
    return 77;
  }
  std::printf("device 0: %s\n", zc::describe_device(0).c_str());
  const char* quick_env = std::getenv("ZIPAGE_CUDA_TEST_QUICK");
  const bool quick = quick_env != nullptr && quick_env[0] == '1';
  try {
    test_validation();
    if (quick) {
      run_case({64, 4, 2, 16, 2, {{48, false}, {80, true}, {30, false}}});
      run_case({128, 8, 1, 256, 2, {{768, true}, {700, false}}});
      run_case({64, 32, 1, 16, 2, {{48, true}, {40, false}}});
      { case_spec c{128, 8, 2, 256, 2, {{768, true}, {700, false}}}; c.fp8 = true; run_case(c); }
      for (const char* policy : {"streaming_llm", "h2o", "snapkv", "rkv", "gkv"}) {
        case_spec c{64, 8, 2, 16, 2, {{48, false}, {80, true}, {30, false}}};
        c.policy = policy;
        run_case(c);
      }
    } else {
      // Budgets cycle through 2, 3, 5, 8 blocks for each block size; every other batch has a ragged length.
      const int budgets[] = {2, 3, 5, 8};
      int i16 = 0, i256 = 0;
      for (int d : {64, 128})
        for (int g : {1, 2, 4, 8})
          for (int bs : {16, 256}) {
            int& i = bs == 16 ? i16 : i256;
            const int budget = budgets[(bs == 16 ? i : 7 - i) % 4];
            run_case({d, 2 * g, 2, bs, budget, batch_for(budget, bs, i % 2 == 1)});
            ++i;
          }
      // Qwen3-8B shape at the reference defaults; GQA 7 (padded group); sinks; no pooling; window 8.
      run_case({128, 32, 8, 256, 8, {{2304, false}, {2304, true}, {3072, true}, {2304, false}}});
      run_case({128, 28, 4, 256, 4, batch_for(4, 256, true)});
      run_case({64, 14, 2, 16, 6, batch_for(6, 16, true)});
      { case_spec c{128, 8, 2, 256, 2, batch_for(2, 256, false)}; c.sinks = 4; run_case(c); }
      { case_spec c{64, 16, 2, 16, 8, batch_for(8, 16, false)}; c.pool = 1; c.window = 8; run_case(c); }
      // Large groups: G = 16 (two passes of 128 window rows), G = 32 (a window query spans two MMA tiles).
      run_case({64, 32, 2, 16, 3, batch_for(3, 16, true)});
      run_case({128, 32, 1, 256, 2, {{768, false}, {1024, true}, {700, false}}});
      // MHA with a window of 24 (rows padded to a multiple of 16).
      { case_spec c{64, 3, 3, 256, 2, batch_for(2, 256, true)}; c.window = 24; run_case(c); }
      // Every other built-in policy's recipe over a sub-grid: head_dim 64/128, GQA 1/4/8, block 16/256,
      // first and later compressions in each batch (batch_for), a ragged length in every other batch.
      for (const char* policy : {"streaming_llm", "h2o", "snapkv", "rkv", "gkv"}) {
        int i = 0;
        for (int d : {64, 128})
          for (int g : {1, 4, 8})
            for (int bs : {16, 256}) {
              const int budget = budgets[i % 4];
              case_spec c{d, 2 * g, 2, bs, budget, batch_for(budget, bs, i % 2 == 1)};
              c.policy = policy;
              run_case(c);
              ++i;
            }
      }
      // Full-sequence redundancy at the Qwen3-8B shape (rkv, and zipage with full_redundancy's recipe).
      { case_spec c{128, 32, 8, 256, 8, {{2304, false}, {2304, true}}}; c.policy = "rkv"; run_case(c); }
      // FP8 K/V (E4M3 codes, per-(token, head) scales): the Qwen3-8B shape, two row tiles (G = 16), MHA with a
      // padded window, full-sequence redundancy, a history-free policy, head_dim 64 with blocks of 16.
      {
        case_spec fp8_cases[] = {{128, 32, 8, 256, 8, {{2304, false}, {2304, true}, {3072, true}, {2304, false}}},
                                 {64, 32, 2, 16, 3, batch_for(3, 16, true)},
                                 {64, 3, 3, 256, 2, batch_for(2, 256, true)},
                                 {128, 32, 8, 256, 8, {{2304, false}, {2304, true}}},
                                 {128, 8, 2, 256, 2, batch_for(2, 256, false)},
                                 {64, 8, 2, 16, 5, batch_for(5, 16, true)}};
        fp8_cases[2].window = 24;
        fp8_cases[3].policy = "rkv";
        fp8_cases[4].policy = "snapkv";
        for (auto& c : fp8_cases) {
          c.fp8 = true;
          run_case(c);
        }
      }
      // A first compression long after the budget (long prompt): 24 blocks down to 2.
      run_case({128, 16, 2, 256, 2, {{24 * 256, true}, {3 * 256, false}}});
      // Longer than the select kernel keeps in shared memory (24,576 tokens): keys in place in global memory.
      run_case({64, 1, 1, 256, 2, {{100 * 256, true}, {3 * 256, false}}});
    }
    CUDA_OK(cudaDeviceSynchronize());
  } catch (const std::exception& e) {
    std::printf("FAIL: exception: %s\n", e.what());
    return 1;
  }
  std::printf("%d/%d checks passed%s; %d kept-set boundary swaps (within tolerance)\n", g_checks - g_failures, g_checks,
              quick ? " (quick)" : "", g_swaps);
  return g_failures == 0 ? 0 : 1;
}
