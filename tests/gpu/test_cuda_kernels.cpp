// Checks every CUDA kernel of zipage::cuda (backend/cuda/attention.hpp, ops.hpp) against its CPU reference
// (zipage::cpu::*) run on fp32 copies of the same bf16-rounded inputs, on fresh random inputs over a
// grid of shapes: head_dim 64/128, GQA ratios 1..8 (and 6, 7, 32), block sizes 16/256, ragged lengths
// from 0 to several thousand, shuffled page tables. Outputs are poisoned (bf16 NaN) before each run, so
// an element the kernel did not write fails. Prints max abs error and relative error ||out-ref||/||ref||
// per case; exits 1 on any failure, 77 (skipped) where there is no CUDA device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda_buffers.hpp"
#include "zipage/backend/cpu/cpu_backend.hpp"
#include "zipage/backend/cpu/fp8_kv.hpp"
#include "zipage/backend/cuda/attention.hpp"
#include "zipage/backend/cuda/fp8_gemm.hpp"
#include "zipage/backend/cuda/ops.hpp"
#include "zipage/core/fp8.hpp"
#include "zipage/core/kv_scale.hpp"
#include "zipage/cuda/device.hpp"

namespace {

using zipage::testing::from_bf16;
using zipage::testing::kBf16NaN;
using zipage::testing::to_bf16;

namespace zc = zipage::cuda;
using zipage::cpu::matrix;

int g_failures = 0;
int g_checks = 0;

#define CUDA_OK(expr) ZIPAGE_TEST_CUDA_OK(expr)


std::mt19937_64 g_rng(20251117);

// Random bf16 values in [lo, hi) and their fp32 copies.
void random_bf16(std::size_t n, float lo, float hi, std::vector<std::uint16_t>& bits, std::vector<float>& vals) {
  std::uniform_real_distribution<float> d(lo, hi);
  bits.resize(n);
  vals.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    bits[i] = to_bf16(d(g_rng));
    vals[i] = from_bf16(bits[i]);
  }
}

template <class T>
using dbuf = zipage::testing::device_buffer<T>;

// ---- comparison
struct error_stats {
  double max_abs = 0.0;
  double rel = 0.0;
  std::size_t bad = 0;  // NaN/Inf in the output
};

error_stats compare(const std::vector<std::uint16_t>& out, const std::vector<float>& ref) {
  error_stats s;
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double o = from_bf16(out[i]);
    if (!std::isfinite(o)) {
      ++s.bad;
      continue;
    }
    const double d = o - ref[i];
    s.max_abs = std::max(s.max_abs, std::abs(d));
    num += d * d;
    den += double(ref[i]) * ref[i];
  }
  s.rel = den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
  return s;
}

void report(const std::string& name, const error_stats& s, double tol) {
  ++g_checks;
  const bool ok = s.bad == 0 && s.rel <= tol;
  if (!ok) ++g_failures;
  std::printf("[%s] %-72s max_abs=%.3e rel=%.3e (tol %.0e)%s\n", ok ? "PASS" : "FAIL", name.c_str(), s.max_abs, s.rel,
              tol, s.bad ? (" non-finite=" + std::to_string(s.bad)).c_str() : "");
}

void report_exact(const std::string& name, std::size_t mismatches) {
  ++g_checks;
  if (mismatches) ++g_failures;
  std::printf("[%s] %-72s mismatches=%zu (exact)\n", mismatches ? "FAIL" : "PASS", name.c_str(), mismatches);
}

void expect(const std::string& name, bool ok) {
  ++g_checks;
  if (!ok) ++g_failures;
  std::printf("[%s] %s\n", ok ? "PASS" : "FAIL", name.c_str());
}

void expect_throw(const std::string& name, auto&& f) {
  ++g_checks;
  bool threw = false;
  try {
    f();
  } catch (const zipage::error&) {
    threw = true;
  }
  if (!threw) ++g_failures;
  std::printf("[%s] %-72s %s\n", threw ? "PASS" : "FAIL", name.c_str(), threw ? "rejected" : "NOT rejected");
}

matrix as_matrix(const std::vector<float>& v, Eigen::Index rows, Eigen::Index cols) {
  return Eigen::Map<const matrix>(v.data(), rows, cols);
}
std::vector<float> as_vector(const matrix& m) { return {m.data(), m.data() + m.size()}; }

// ---- paged KV cache fixture
struct paged_cache {
  int head_dim, kv_heads, block_size, num_blocks;
  std::vector<int> kv_len;
  std::vector<std::int32_t> page_indptr, page_indices;
  std::vector<std::uint16_t> k, v;  // bf16 [blocks][block_size][kv_heads][head_dim]; NaN where no token lives
  std::vector<float> kf, vf;
};

// Each sequence gets ceil(len / block_size) blocks drawn from a shuffled pool with spare blocks.
paged_cache make_cache(int head_dim, int kv_heads, int block_size, const std::vector<int>& kv_len) {
  paged_cache c{head_dim, kv_heads, block_size, 0, kv_len, {}, {}, {}, {}, {}, {}};
  int pages = 0;
  c.page_indptr.push_back(0);
  for (int len : kv_len) {
    pages += (len + block_size - 1) / block_size;
    c.page_indptr.push_back(pages);
  }
  c.num_blocks = pages + 5;
  std::vector<std::int32_t> pool(static_cast<std::size_t>(c.num_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), g_rng);
  c.page_indices.assign(pool.begin(), pool.begin() + pages);
  const std::size_t row = std::size_t(kv_heads) * head_dim;
  const std::size_t total = std::size_t(c.num_blocks) * block_size * row;
  c.k.assign(total, kBf16NaN);
  c.v.assign(total, kBf16NaN);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (std::size_t s = 0; s < kv_len.size(); ++s)
    for (int t = 0; t < kv_len[s]; ++t) {
      const std::int64_t slot =
          std::int64_t{c.page_indices[std::size_t(c.page_indptr[s] + t / block_size)]} * block_size + t % block_size;
      for (std::size_t i = 0; i < row; ++i) {
        c.k[std::size_t(slot) * row + i] = to_bf16(d(g_rng));
        c.v[std::size_t(slot) * row + i] = to_bf16(d(g_rng));
      }
    }
  c.kf.resize(total);
  c.vf.resize(total);
  for (std::size_t i = 0; i < total; ++i) {
    c.kf[i] = from_bf16(c.k[i]);
    c.vf[i] = from_bf16(c.v[i]);
  }
  return c;
}

// CPU reference attention for tokens (token_seq, token_kv_len), threaded over tokens.
std::vector<float> reference_attention(const paged_cache& c, const std::vector<std::int32_t>& token_seq,
                                       const std::vector<std::int32_t>& token_kv_len, const std::vector<float>& q,
                                       int q_heads, float scale) {
  const int tokens = static_cast<int>(token_seq.size());
  const int width = q_heads * c.head_dim;
  std::vector<float> out(std::size_t(tokens) * width);
  zipage::paged_kv_layer<const float> kv;
  kv.k = c.kf.data();
  kv.v = c.vf.data();
  kv.block_size = c.block_size;
  kv.num_kv_heads = c.kv_heads;
  kv.head_dim = c.head_dim;
  const std::vector<std::int64_t> slots(std::size_t(tokens), 0);  // num_tokens() counts slot_mapping
  const int threads = std::max(1, std::min<int>(tokens, static_cast<int>(std::thread::hardware_concurrency())));
  std::vector<std::thread> pool;
  for (int w = 0; w < threads; ++w)
    pool.emplace_back([&, w] {
      const int t0 = tokens * w / threads, t1 = tokens * (w + 1) / threads;
      if (t1 <= t0) return;
      const std::size_t n = std::size_t(t1 - t0);
      zipage::attention_metadata meta;
      meta.slot_mapping = std::span<const std::int64_t>(slots.data() + t0, n);
      meta.token_seq = std::span<const std::int32_t>(token_seq.data() + t0, n);
      meta.token_kv_len = std::span<const std::int32_t>(token_kv_len.data() + t0, n);
      meta.page_indptr = c.page_indptr;
      meta.page_indices = c.page_indices;
      const matrix qm = Eigen::Map<const matrix>(q.data() + std::size_t(t0) * width, Eigen::Index(n), width);
      matrix om;
      zipage::cpu::paged_attention(kv, meta, qm, q_heads, scale, om);
      std::copy_n(om.data(), om.size(), out.data() + std::size_t(t0) * width);
    });
  for (auto& th : pool) th.join();
  return out;
}

std::string shape_name(const char* what, int d, int qh, int kvh, int bs) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "%s D=%d q=%d kv=%d bs=%d", what, d, qh, kvh, bs);
  return buf;
}

// ---- decode
// Bytes of two device buffers that differ.
template <class T>
std::size_t byte_mismatches(const dbuf<T>& a, const dbuf<T>& b) {
  const std::vector<T> x = a.get(), y = b.get();
  std::size_t bad = x.size() != y.size();
  for (std::size_t i = 0; i < std::min(x.size(), y.size()); ++i) bad += std::memcmp(&x[i], &y[i], sizeof(T)) != 0;
  return bad;
}

// The decode kernel's FP8 copy of its output (decode_params::out_fp8, head_dim 128, one split): the output is the
// same as without it, and the codes and scales are byte for byte what fp8::quantize_activations makes of that
// output, padding rows zero (the copy's buffers start poisoned). p: a decode of any KV cache (bf16 or FP8).
// kernel: which decode kernel (the split-KV one, or the swapped-operand one).
enum class decode_under_test { split_kv, swapped };
void check_decode_fp8_copy(zc::decode_params p, const std::string& name,
                           decode_under_test kernel = decode_under_test::split_kv) {
  const zc::decode_plan plan = zc::plan_decode(p, 1);
  auto run = [&] {
    switch (kernel) {
      case decode_under_test::swapped: return zc::paged_decode_attention_swapped(p, nullptr);
      case decode_under_test::split_kv: return zc::paged_decode_attention(p, plan, nullptr, 0, nullptr);
    }
  };
  const int cols = p.num_q_heads * p.kv.head_dim;
  const int padded = zc::fp8::padded_rows(p.num_seqs);
  const std::size_t out_n = std::size_t(p.num_seqs) * cols;
  const std::size_t codes_n = std::size_t(padded) * cols, scales_n = std::size_t(cols / 128) * padded;
  dbuf<std::uint16_t> plain(out_n), fused(out_n);
  dbuf<std::uint8_t> codes(codes_n), want_codes(codes_n);
  dbuf<float> scales(scales_n), want_scales(scales_n);
  codes.poison();
  scales.poison();
  p.out = plain.p;
  run();
  p.out = fused.p;
  p.out_fp8 = {codes.p, scales.p, padded};
  run();
  zc::fp8::quantize_activations(zipage::cuda_dtype::bf16, fused.p, p.num_seqs, padded, cols, want_codes.p, want_scales.p,
                                nullptr);
  report_exact(name + " + fp8 copy: output unchanged", byte_mismatches(plain, fused));
  report_exact(name + " + fp8 copy: codes, scales", byte_mismatches(codes, want_codes) + byte_mismatches(scales, want_scales));
}

// The device side of a decode over `c` (one query token per sequence, queries qb): q, out, page tables and lengths,
// and the params naming them. The K/V pointers are the caller's (a bf16 or an FP8 cache).
struct decode_setup {
  dbuf<std::uint16_t> q, out;
  dbuf<std::int32_t> indptr, indices, len;
  zc::decode_params p;
  decode_setup(const paged_cache& c, const std::vector<std::uint16_t>& qb, int qh, float scale)
      : q(qb), out(qb.size()), indptr(c.page_indptr), indices(c.page_indices),
        len(std::vector<std::int32_t>(c.kv_len.begin(), c.kv_len.end())) {
    p.q = q.p;
    p.out = out.p;
    p.kv.page_indptr = indptr.p;
    p.kv.page_indices = indices.p;
    p.kv.kv_len = len.p;
    p.num_seqs = static_cast<int>(c.kv_len.size());
    p.num_q_heads = qh;
    p.kv.num_kv_heads = c.kv_heads;
    p.kv.head_dim = c.head_dim;
    p.kv.block_size = c.block_size;
    p.max_kv_len = c.kv_len.empty() ? 0 : *std::max_element(c.kv_len.begin(), c.kv_len.end());
    p.scale = scale;
  }
  // One decode under `plan` into a poisoned output, with a fresh workspace; the output back on the host.
  std::vector<std::uint16_t> run(const zc::decode_plan& plan) {
    const std::size_t ws_bytes = zc::decode_workspace_bytes(p, plan);
    dbuf<unsigned char> ws(ws_bytes);
    out.poison();
    zc::paged_decode_attention(p, plan, ws.p, ws_bytes, nullptr);
    return out.get();
  }
};

// runs: (forced split count or 0 = automatic plan, pipeline stages or 0 = default).
void test_decode(int d, int qh, int kvh, int bs, std::vector<int> lens, std::vector<std::pair<int, int>> runs) {
  const int seqs = static_cast<int>(lens.size());
  const paged_cache c = make_cache(d, kvh, bs, lens);
  std::vector<std::uint16_t> qb;
  std::vector<float> qf;
  random_bf16(std::size_t(seqs) * qh * d, -2.0f, 2.0f, qb, qf);
  const float scale = 1.0f / std::sqrt(float(d));
  std::vector<std::int32_t> token_seq(static_cast<std::size_t>(seqs)), token_len(lens.begin(), lens.end());
  std::iota(token_seq.begin(), token_seq.end(), 0);
  const std::vector<float> ref = reference_attention(c, token_seq, token_len, qf, qh, scale);

  dbuf<std::uint16_t> dk(c.k), dv(c.v);
  decode_setup setup(c, qb, qh, scale);
  zc::decode_params& p = setup.p;
  p.kv.k_cache = dk.p;
  p.kv.v_cache = dv.p;
  int max_len = p.max_kv_len;
  for (auto [fs, stages] : runs) {
    const zc::decode_plan plan = zc::plan_decode(p, fs, stages);
    const std::vector<std::uint16_t> out = setup.run(plan);
    char name[160];
    std::snprintf(name, sizeof name, "%s seqs=%d max_len=%d splits=%d%s(chunk %d) stages=%d",
                  shape_name("decode", d, qh, kvh, bs).c_str(), seqs, max_len, plan.num_splits, fs ? "" : "[auto]",
                  plan.chunk_tokens, plan.stages);
    report(name, compare(out, ref), 1e-2);
    // Same inputs again: the result must be bit-identical (no races, no atomics).
    if (setup.run(plan) != out) report_exact(std::string(name) + " rerun", 1);
  }
  if (d == 128) check_decode_fp8_copy(p, shape_name("decode", d, qh, kvh, bs));
}

// Every Hopper wgmma prefill kernel (run where wgmma_prefill_available()).
std::vector<zc::prefill_kernel> wgmma_kernels() {
  std::vector<zc::prefill_kernel> ks;
  for (const auto k : zc::all_prefill_kernels)
    if (zc::is_wgmma(k)) ks.push_back(k);
  return ks;
}

// ---- prefill: sequences with `cached` tokens already in the cache and `fresh` new tokens appended; each kernel of
// `kernels` against one reference (its cost, not the GPU's, dominates this test). Q is uniform in [-q_range, q_range]:
// the default gives scores of about 1 (log2 units) per token; q_range 24 about 12, so a row's max moves by more than
// 2^8 many times along the sequence (the wgmma kernel's lazy rescale moves it only then).
void test_prefill(int d, int qh, int kvh, int bs, const std::vector<std::pair<int, int>>& seqs_cached_new,
                  const std::vector<zc::prefill_kernel>& kernels = {zc::prefill_kernel::mma_sync},
                  float q_range = 2.0f) {
  std::vector<int> lens;
  std::vector<std::int32_t> q_indptr{0}, token_seq, token_len;
  for (std::size_t s = 0; s < seqs_cached_new.size(); ++s) {
    const auto [cached, fresh] = seqs_cached_new[s];
    lens.push_back(cached + fresh);
    for (int i = 0; i < fresh; ++i) {
      token_seq.push_back(static_cast<std::int32_t>(s));
      token_len.push_back(cached + i + 1);
    }
    q_indptr.push_back(q_indptr.back() + fresh);
  }
  const int tokens = q_indptr.back();
  const paged_cache c = make_cache(d, kvh, bs, lens);
  std::vector<std::uint16_t> qb;
  std::vector<float> qf;
  random_bf16(std::size_t(tokens) * qh * d, -q_range, q_range, qb, qf);
  const float scale = 1.0f / std::sqrt(float(d));
  const std::vector<float> ref = reference_attention(c, token_seq, token_len, qf, qh, scale);

  dbuf<std::uint16_t> dk(c.k), dv(c.v), dq(qb), dout(qb.size());
  dbuf<std::int32_t> dindptr(c.page_indptr), dindices(c.page_indices), dqptr(q_indptr), dtlen(token_len);
  zc::prefill_params p;
  p.q = dq.p;
  p.out = dout.p;
  p.kv.k_cache = dk.p;
  p.kv.v_cache = dv.p;
  p.q_indptr = dqptr.p;
  p.token_kv_len = dtlen.p;
  p.kv.page_indptr = dindptr.p;
  p.kv.page_indices = dindices.p;
  p.num_tokens = tokens;
  p.num_seqs = static_cast<int>(seqs_cached_new.size());
  p.num_q_heads = qh;
  p.kv.num_kv_heads = kvh;
  p.kv.head_dim = d;
  p.kv.block_size = bs;
  p.scale = scale;
  for (const zc::prefill_kernel kernel : kernels) {
    p.kernel = kernel;
    dout.poison();
    zc::paged_prefill_attention(p, nullptr);
    const std::vector<std::uint16_t> out = dout.get();
    char name[160];
    std::snprintf(name, sizeof name, "%s%s seqs=%zu tokens=%d max_len=%d%s", shape_name("prefill", d, qh, kvh, bs).c_str(),
                  kernel == zc::prefill_kernel::mma_sync ? "" : (std::string(" ") + zc::to_string(kernel)).c_str(),
                  seqs_cached_new.size(), tokens, *std::max_element(lens.begin(), lens.end()),
                  q_range == 2.0f ? "" : " sharp");
    report(name, compare(out, ref), 1e-2);
  }
}

int rand_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g_rng); }

// ---- elementwise: every op through its one launcher, with both kernel variants on the same inputs.
// Each result is checked against the CPU reference; where the op's rule (ops.hpp) cannot take the
// inputs with its tuned kernel (widths not a multiple of 8, misaligned pointers, a frequency table), the
// tuned request must give the reference kernel's bits exactly, which shows that the launcher fell back.
constexpr zc::kernel_variant kTuned = zc::kernel_variant::tuned;
constexpr zc::kernel_variant kReference = zc::kernel_variant::reference;
constexpr zc::kernel_variant kVariants[] = {kTuned, kReference};
using zipage::cuda_dtype;

std::string variant_tag(zc::kernel_variant v) { return std::string(" [") + zc::to_string(v) + "]"; }

std::size_t mismatches(const std::vector<std::uint16_t>& a, const std::vector<std::uint16_t>& b) {
  std::size_t n = a.size() == b.size() ? 0 : std::max(a.size(), b.size());
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) n += a[i] != b[i];
  return n;
}

// The tuned request fell back to the reference kernel (bit-identical outputs), or, where the tuned
// kernel applies, how far apart the two kernels are (informational: both were checked against the CPU).
void report_choice(const std::string& name, bool expect_reference, const std::vector<std::uint16_t>& tuned,
                   const std::vector<std::uint16_t>& reference) {
  const std::size_t diff = mismatches(tuned, reference);
  if (expect_reference)
    report_exact(name + " tuned request runs the reference kernel", diff);
  else
    std::printf("[INFO] %-72s tuned and reference kernels differ in %zu of %zu elements\n", name.c_str(), diff,
                tuned.size());
}

void test_append_kv(int kvh, int d, int bs, int tokens, std::int64_t k_stride_pad) {
  const int width = kvh * d;
  const int blocks = (tokens + bs - 1) / bs + 3;
  const std::size_t cache_n = std::size_t(blocks) * bs * width;
  std::vector<std::uint16_t> kc, vc, k, v;
  std::vector<float> kcf, vcf, kf, vf;
  random_bf16(cache_n, -1, 1, kc, kcf);
  random_bf16(cache_n, -1, 1, vc, vcf);
  const std::int64_t ks = width + k_stride_pad;
  random_bf16(std::size_t(tokens) * ks, -1, 1, k, kf);
  random_bf16(std::size_t(tokens) * width, -1, 1, v, vf);
  std::vector<std::int64_t> all(std::size_t(blocks) * bs);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), g_rng);
  std::vector<std::int64_t> slots(all.begin(), all.begin() + tokens);
  for (int t = 3; t < tokens; t += 7) slots[std::size_t(t)] = -1;  // padding tokens: skipped

  // Reference: cpu::append_kv over the tokens with a slot.
  std::vector<std::int64_t> used;
  std::vector<int> rows;
  for (int t = 0; t < tokens; ++t)
    if (slots[std::size_t(t)] >= 0) rows.push_back(t);
  matrix km(Eigen::Index(rows.size()), width), vm(Eigen::Index(rows.size()), width);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    used.push_back(slots[std::size_t(rows[i])]);
    for (int c = 0; c < width; ++c) {
      km(Eigen::Index(i), c) = kf[std::size_t(rows[i]) * ks + c];
      vm(Eigen::Index(i), c) = vf[std::size_t(rows[i]) * width + c];
    }
  }
  zipage::paged_kv_layer<float> layer;
  layer.k = kcf.data();
  layer.v = vcf.data();
  layer.block_size = bs;
  layer.num_kv_heads = kvh;
  layer.head_dim = d;
  zipage::cpu::append_kv(layer, used, km, vm);

  for (const zc::kernel_variant variant : kVariants) {
    dbuf<std::uint16_t> dkc(kc), dvc(vc), dk(k), dv(v);
    dbuf<std::int64_t> dslots(slots);
    zc::append_kv_params p;
    p.kv.k_cache = dkc.p;
    p.kv.v_cache = dvc.p;
    p.kv.num_kv_heads = kvh;
    p.kv.head_dim = d;
    p.k = dk.p;
    p.v = dv.p;
    p.slots = dslots.p;
    p.num_tokens = tokens;
    p.k_row_stride = ks;
    zc::append_kv(cuda_dtype::bf16, p, variant, nullptr);
    const auto ko = dkc.get(), vo = dvc.get();
    std::size_t mism = 0;
    for (std::size_t i = 0; i < cache_n; ++i) mism += (ko[i] != to_bf16(kcf[i])) + (vo[i] != to_bf16(vcf[i]));
    char name[128];
    std::snprintf(name, sizeof name, "append_kv kv=%d D=%d bs=%d tokens=%d k_stride=%lld", kvh, d, bs, tokens,
                  static_cast<long long>(ks));
    report_exact(name + variant_tag(variant), mism);
  }
}

// The cache of `c` quantised into an FP8 cache on the device by append_kv (the live tokens' slots only: the others
// keep poisoned codes and scales, as the bf16 cache keeps NaN there), with the tuned and the reference kernel:
// their codes and scales must agree byte for byte. On return `c` holds the dequantised values (float(code) * scale)
// the FP8 kernels compute with.
struct fp8_cache {
  dbuf<std::uint8_t> k, v;
  dbuf<std::uint16_t> k_scale, v_scale;  // bf16 scales (core/kv_scale.hpp)
  // Bytes that differ from another cache's, codes and scales.
  [[nodiscard]] std::size_t mismatches(const fp8_cache& o) const {
    return byte_mismatches(k, o.k) + byte_mismatches(v, o.v) + byte_mismatches(k_scale, o.k_scale) +
           byte_mismatches(v_scale, o.v_scale);
  }
};

// A poisoned FP8 cache of `slots` slots, then append_kv of `tokens` K/V rows (bf16 on the device) into it.
fp8_cache append_fp8(std::size_t slots, int kvh, int d, const void* k, const void* v, std::int64_t k_stride,
                     const std::int64_t* slot_of, int tokens, zc::kernel_variant variant) {
  const std::size_t width = std::size_t(kvh) * d;
  fp8_cache f{dbuf<std::uint8_t>(slots * width), dbuf<std::uint8_t>(slots * width), dbuf<std::uint16_t>(slots * kvh),
              dbuf<std::uint16_t>(slots * kvh)};
  f.k.poison(), f.v.poison(), f.k_scale.poison(), f.v_scale.poison();
  zc::append_kv_params p;
  p.kv.k_cache = f.k.p;
  p.kv.v_cache = f.v.p;
  p.kv.k_scale = f.k_scale.p;
  p.kv.v_scale = f.v_scale.p;
  p.kv.num_kv_heads = kvh;
  p.kv.head_dim = d;
  p.k = k;
  p.v = v;
  p.slots = slot_of;
  p.num_tokens = tokens;
  p.k_row_stride = k_stride;
  zc::append_kv(zipage::cuda_dtype::bf16, p, variant, nullptr);
  return f;
}
fp8_cache quantise_cache(paged_cache& c, const std::string& name) {
  const std::size_t row = std::size_t(c.kv_heads) * c.head_dim;
  const std::size_t slots_n = std::size_t(c.num_blocks) * c.block_size;
  std::vector<std::int64_t> slots;
  std::vector<std::uint16_t> k, v;
  for (std::size_t s = 0; s < c.kv_len.size(); ++s)
    for (int t = 0; t < c.kv_len[s]; ++t) {
      const std::int64_t slot =
          std::int64_t{c.page_indices[std::size_t(c.page_indptr[s] + t / c.block_size)]} * c.block_size + t % c.block_size;
      slots.push_back(slot);
      k.insert(k.end(), c.k.begin() + slot * std::int64_t(row), c.k.begin() + (slot + 1) * std::int64_t(row));
      v.insert(v.end(), c.v.begin() + slot * std::int64_t(row), c.v.begin() + (slot + 1) * std::int64_t(row));
    }
  dbuf<std::uint16_t> dk(k), dv(v);
  dbuf<std::int64_t> dslots(slots);
  const int tokens = static_cast<int>(slots.size());
  fp8_cache out[2] = {append_fp8(slots_n, c.kv_heads, c.head_dim, dk.p, dv.p, 0, dslots.p, tokens, kTuned),
                      append_fp8(slots_n, c.kv_heads, c.head_dim, dk.p, dv.p, 0, dslots.p, tokens, kReference)};
  report_exact(name + " append_kv fp8 tuned == reference", out[0].mismatches(out[1]));
  const std::vector<std::uint8_t> kc = out[0].k.get(), vc = out[0].v.get();
  const std::vector<std::uint16_t> ks = out[0].k_scale.get(), vs = out[0].v_scale.get();
  for (const std::int64_t slot : slots)
    for (std::size_t i = 0; i < row; ++i) {
      const std::size_t e = std::size_t(slot) * row + i, h = std::size_t(slot) * c.kv_heads + i / c.head_dim;
      c.kf[e] = zipage::fp8_e4m3_to_f32(kc[e]) * zipage::kv_scale_to_f32(ks[h]);
      c.vf[e] = zipage::fp8_e4m3_to_f32(vc[e]) * zipage::kv_scale_to_f32(vs[h]);
    }
  return std::move(out[0]);
}

// decode_params::append: a swapped kernel writes each sequence's new (last) token itself before reading the cache.
// From a copy of f (made by append_kv) with those tokens' codes and scales poisoned, it must restore append_kv's
// bytes exactly and give the output of the same kernel over f; sequences without tokens get slot -1 (no write).
void check_swapped_append(const paged_cache& c, const fp8_cache& f, decode_setup& setup, const std::string& shape) {
  const std::size_t row = std::size_t(c.kv_heads) * c.head_dim;
  const std::size_t seqs = c.kv_len.size();
  std::vector<std::int64_t> slots(seqs, -1);
  std::vector<std::uint16_t> k(seqs * row), v(seqs * row);
  std::vector<std::uint8_t> kc = f.k.get(), vc = f.v.get();
  std::vector<std::uint16_t> ks = f.k_scale.get(), vs = f.v_scale.get();
  for (std::size_t s = 0; s < seqs; ++s) {
    if (c.kv_len[s] == 0) continue;
    const int t = c.kv_len[s] - 1;
    const std::int64_t page = c.page_indices[std::size_t(c.page_indptr[s] + t / c.block_size)];
    const std::int64_t slot = page * c.block_size + t % c.block_size;
    slots[s] = slot;
    std::copy_n(c.k.begin() + slot * std::int64_t(row), row, k.begin() + std::int64_t(s * row));
    std::copy_n(c.v.begin() + slot * std::int64_t(row), row, v.begin() + std::int64_t(s * row));
    std::fill_n(kc.begin() + slot * std::int64_t(row), row, std::uint8_t{0xa5});
    std::fill_n(vc.begin() + slot * std::int64_t(row), row, std::uint8_t{0x5a});
    std::fill_n(ks.begin() + slot * c.kv_heads, c.kv_heads, zipage::kv_scale_nan);
    std::fill_n(vs.begin() + slot * c.kv_heads, c.kv_heads, std::uint16_t{0xbf80});  // -1
  }
  const dbuf<std::uint16_t> dk(k), dv(v);
  const dbuf<std::int64_t> dslots(slots);
  std::vector<zc::fp8_decode_kernel> kernels{zc::fp8_decode_kernel::swapped};
  if (zc::current_device_runs_sm90a()) kernels.push_back(zc::fp8_decode_kernel::swapped_e4m3_qk);
  zc::decode_params& p = setup.p;
  auto read_from = [&p](const fp8_cache& cache) {
    p.kv.k_cache = cache.k.p, p.kv.v_cache = cache.v.p, p.kv.k_scale = cache.k_scale.p, p.kv.v_scale = cache.v_scale.p;
  };
  for (const zc::fp8_decode_kernel kernel : kernels) {
    const std::string name = shape + " " + zc::to_string(kernel) + " appending the new tokens itself";
    read_from(f);
    p.append = {};
    setup.out.poison();
    zc::paged_decode_attention_swapped(p, nullptr, 0, kernel);
    const std::vector<std::uint16_t> want = setup.out.get();
    fp8_cache g{dbuf<std::uint8_t>(kc), dbuf<std::uint8_t>(vc), dbuf<std::uint16_t>(ks), dbuf<std::uint16_t>(vs)};
    read_from(g);
    p.append = {dk.p, dv.p, dslots.p, std::int64_t(row), std::int64_t(row)};
    setup.out.poison();
    zc::paged_decode_attention_swapped(p, nullptr, 0, kernel);
    const std::vector<std::uint16_t> got = setup.out.get();
    p.append = {};
    std::size_t differ = got.size() != want.size();
    for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) differ += got[i] != want[i];
    report_exact(name + ": cache == append_kv's", g.mismatches(f));
    report_exact(name + ": output == after append_kv", differ);
  }
  read_from(f);
}

// Decode over an FP8 cache (the kernel's FP8 path: scales applied to scores and probabilities) against the CPU
// reference on the dequantised cache; then its FP8 copy of the output (the strided epilogue) where head_dim is 128.
void test_decode_fp8_kv(int d, int qh, int kvh, int bs, std::vector<int> lens, std::vector<int> forced_splits) {
  const int seqs = static_cast<int>(lens.size());
  paged_cache c = make_cache(d, kvh, bs, lens);
  const std::string shape = shape_name("decode fp8 kv", d, qh, kvh, bs);
  const fp8_cache f = quantise_cache(c, shape);
  std::vector<std::uint16_t> qb;
  std::vector<float> qf;
  random_bf16(std::size_t(seqs) * qh * d, -2.0f, 2.0f, qb, qf);
  const float scale = 1.0f / std::sqrt(float(d));
  std::vector<std::int32_t> token_seq(static_cast<std::size_t>(seqs)), token_len(lens.begin(), lens.end());
  std::iota(token_seq.begin(), token_seq.end(), 0);
  const std::vector<float> ref = reference_attention(c, token_seq, token_len, qf, qh, scale);

  decode_setup setup(c, qb, qh, scale);
  zc::decode_params& p = setup.p;
  p.kv.k_cache = f.k.p;
  p.kv.v_cache = f.v.p;
  p.kv.k_scale = f.k_scale.p;
  p.kv.v_scale = f.v_scale.p;
  for (const int fs : forced_splits) {
    const zc::decode_plan plan = zc::plan_decode(p, fs);
    char name[160];
    std::snprintf(name, sizeof name, "%s seqs=%d max_len=%d splits=%d%s", shape.c_str(), seqs, p.max_kv_len,
                  plan.num_splits, fs ? "" : "[auto]");
    report(name, compare(setup.run(plan), ref), 1e-2);
  }
  if (zc::decode_swapped_supported(p)) {  // the swapped-operand kernel, same reference
    for (const int stages : {4, 3}) {
      setup.out.poison();
      zc::paged_decode_attention_swapped(p, nullptr, stages);
      char name[160];
      std::snprintf(name, sizeof name, "%s seqs=%d max_len=%d swapped-operand kernel, %d stages", shape.c_str(),
                    seqs, p.max_kv_len, stages);
      report(name, compare(setup.out.get(), ref), 1e-2);
    }
    // swapped_e4m3_qk (wgmma QK over Q rounded to E4M3, 3 mantissa bits, one scale per head): its scores carry Q's
    // rounding, ~2^-4 of each element, so its bound is looser than the fp16-Q kernel's.
    if (zc::current_device_runs_sm90a()) {
      setup.out.poison();
      zc::paged_decode_attention_swapped(p, nullptr, 0, zc::fp8_decode_kernel::swapped_e4m3_qk);
      char name[160];
      std::snprintf(name, sizeof name, "%s seqs=%d max_len=%d swapped_e4m3_qk (wgmma)", shape.c_str(), seqs,
                    p.max_kv_len);
      report(name, compare(setup.out.get(), ref), 5e-2);
    }
    check_decode_fp8_copy(p, shape + " swapped-operand kernel", decode_under_test::swapped);
    check_swapped_append(c, f, setup, shape);
  }
  if (d == 128) check_decode_fp8_copy(p, shape);
}

// append_kv into an FP8 cache: the tuned kernel (bf16, head_dim 128) writes the reference kernel's bytes, including
// heads that are all zero, hold a NaN or an infinity, have huge values, or are subnormal in e4m3; padding tokens
// skipped, and heads whose bf16 scale rounds below amax / 448 (the largest value's quotient, above 448, saturates to
// 448). Both write cpu::fp8::quantize_head's codes and bf16 scales (the CPU reference) bit for bit.
void test_append_kv_fp8(int kvh, int tokens, std::int64_t k_stride_pad) {
  constexpr int d = 128;
  const int width = kvh * d, bs = 16;
  const int blocks = (tokens + bs - 1) / bs + 3;
  const std::size_t slots_n = std::size_t(blocks) * bs;
  const std::int64_t ks = width + k_stride_pad;
  std::vector<std::uint16_t> k, v;
  std::vector<float> unused;
  random_bf16(std::size_t(tokens) * ks, -3, 3, k, unused);
  random_bf16(std::size_t(tokens) * width, -3, 3, v, unused);
  auto head = [&](std::vector<std::uint16_t>& x, std::int64_t stride, int t, int h) { return &x[std::size_t(t * stride + h * d)]; };
  for (int t = 0; t < tokens; t += 5) {  // a special head per five tokens, K and V in turn
    const int h = t % kvh;
    std::uint16_t* x = (t / 5) % 2 ? head(v, width, t, h) : head(k, ks, t, h);
    switch ((t / 10) % 6) {
      case 0: std::fill_n(x, d, std::uint16_t{0}); break;                          // all zero: scale 0, codes 0
      case 1: x[(t * 7) % d] = kBf16NaN; break;                                       // NaN: NaN scale and codes
      case 2: x[(t * 3) % d] = to_bf16(INFINITY); break;                              // inf: inf scale, codes 0 / NaN
      case 3: for (int i = 0; i < d; ++i) x[i] = to_bf16((i % 2 ? -1e30f : 1e30f) * (1 + i)); break;  // huge
      case 4: for (int i = 0; i < d; ++i) x[i] = to_bf16(1e-38f * float(i % 9)); break;  // tiny (subnormal scale)
      case 5:  // amax 1: scale bf16(1 / 448) = 0x3b12 < 1 / 448, so 1 / scale = 448.9 saturates to 448
        for (int i = 0; i < d; ++i) x[i] = to_bf16(float(i % 7) / 8.0f - 0.375f);
        x[(t * 5) % d] = to_bf16(-1.0f);
        break;
    }
  }
  std::vector<std::int64_t> all(slots_n);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), g_rng);
  std::vector<std::int64_t> slots(all.begin(), all.begin() + tokens);
  for (int t = 2; t < tokens; t += 9) slots[std::size_t(t)] = -1;
  dbuf<std::uint16_t> dk(k), dv(v);
  dbuf<std::int64_t> dslots(slots);
  const fp8_cache tuned = append_fp8(slots_n, kvh, d, dk.p, dv.p, ks, dslots.p, tokens, kTuned);
  const fp8_cache reference = append_fp8(slots_n, kvh, d, dk.p, dv.p, ks, dslots.p, tokens, kReference);
  char name[128];
  std::snprintf(name, sizeof name, "append_kv fp8 kv=%d D=%d tokens=%d k_stride=%lld: tuned == reference", kvh, d,
                tokens, static_cast<long long>(ks));
  report_exact(name, tuned.mismatches(reference));
  // The CPU reference on the same (bf16) values: codes and scales.
  const std::vector<std::uint8_t> kc = tuned.k.get(), vc = tuned.v.get();
  const std::vector<std::uint16_t> kb = tuned.k_scale.get(), vb = tuned.v_scale.get();
  std::size_t cpu_mismatches = 0;
  std::vector<float> x(d);
  std::vector<std::uint8_t> codes(d);
  for (int t = 0; t < tokens; ++t) {
    const std::int64_t slot = slots[std::size_t(t)];
    if (slot < 0) continue;
    for (int h = 0; h < kvh; ++h)
      for (int side = 0; side < 2; ++side) {
        const std::uint16_t* src = side == 0 ? head(k, ks, t, h) : head(v, width, t, h);
        for (int i = 0; i < d; ++i) x[std::size_t(i)] = from_bf16(src[i]);
        const std::uint16_t b = zipage::cpu::fp8::quantize_head(x.data(), d, codes.data());
        const std::size_t at = std::size_t(slot) * kvh + std::size_t(h);
        cpu_mismatches += (side == 0 ? kb : vb)[at] != b;
        const auto& cache = side == 0 ? kc : vc;
        cpu_mismatches += !std::equal(codes.begin(), codes.end(), cache.begin() + std::ptrdiff_t(at * d));
      }
  }
  std::snprintf(name, sizeof name, "append_kv fp8 kv=%d D=%d tokens=%d: == cpu::fp8::quantize_head", kvh, d, tokens);
  report_exact(name, cpu_mismatches);
}

// x and out start `offset` elements into their buffers, the weight `w_offset` elements into its own:
// an offset that is not a multiple of 8 (bf16) / 4 (fp32 weight) breaks the 16-byte alignment.
void test_rms_norm(int rows, int cols, int width, cuda_dtype wt, bool in_place, int offset = 0, int w_offset = 0) {
  std::vector<std::uint16_t> xb, wb;
  std::vector<float> xf, wf;
  random_bf16(std::size_t(offset) + std::size_t(rows) * cols, -3, 3, xb, xf);
  random_bf16(std::size_t(w_offset) + std::size_t(width), 0.5f, 1.5f, wb, wf);  // bf16-representable for both dtypes
  const float eps = 1e-5f;
  matrix ref;
  zipage::cpu::rms_norm(as_matrix(std::vector<float>(xf.begin() + offset, xf.end()), rows, cols),
                        as_matrix(std::vector<float>(wf.begin() + w_offset, wf.end()), 1, width), eps, ref);
  dbuf<std::uint16_t> dwb(wb);
  dbuf<float> dwf(wf);
  const void* w = wt == cuda_dtype::bf16 ? static_cast<const void*>(dwb.p + w_offset)
                                         : static_cast<const void*>(dwf.p + w_offset);
  char name[160];
  std::snprintf(name, sizeof name, "rms_norm rows=%d cols=%d width=%d weight=%s%s offset=%d/%d", rows, cols, width,
                zipage::to_string(wt), in_place ? " in-place" : "", offset, w_offset);
  std::vector<std::uint16_t> got[2];
  for (const zc::kernel_variant variant : kVariants) {
    dbuf<std::uint16_t> dx(xb), dout(xb.size());
    if (!in_place) dout.poison();
    zc::rms_norm(cuda_dtype::bf16, dx.p + offset, wt, w, in_place ? dx.p + offset : dout.p + offset, rows, cols, width,
                 eps, variant, nullptr);
    std::vector<std::uint16_t> out = in_place ? dx.get() : dout.get();
    out.erase(out.begin(), out.begin() + offset);
    report(name + variant_tag(variant), compare(out, as_vector(ref)), 1e-2);
    got[variant == kTuned ? 0 : 1] = std::move(out);
  }
  const std::size_t w_align = wt == cuda_dtype::bf16 ? 8 : 4;  // elements per 16 bytes
  const bool tuned_applies = width % 8 == 0 && offset % 8 == 0 && w_offset % int(w_align) == 0;
  report_choice(name, !tuned_applies, got[0], got[1]);
}

// rope on x starting `offset` elements into its buffer; with `scaling`, the launcher gets the host's
// (Llama 3-scaled) frequency table, which only the reference kernel reads.
void test_rope(int rows, int heads, int extra_heads, int d, float theta, zipage::rope_style style, int offset = 0,
               bool scaling = false) {
  const int stride = (heads + extra_heads) * d;
  std::vector<std::uint16_t> xb;
  std::vector<float> xf;
  random_bf16(std::size_t(offset) + std::size_t(rows) * stride, -2, 2, xb, xf);
  std::vector<std::int32_t> pos(static_cast<std::size_t>(rows));
  for (auto& p : pos) p = rand_int(0, 40000);
  pos[0] = 0;
  zipage::rope_scaling_config sc;
  if (scaling) {
    sc.type = zipage::rope_scaling_type::llama3;
    sc.factor = 8.0f;
  }
  std::vector<double> inv(static_cast<std::size_t>(d / 2));
  for (int i = 0; i < d / 2; ++i) inv[std::size_t(i)] = sc.apply(std::pow(double(theta), -2.0 * i / d));
  // Reference: the first `heads` heads of each row rotate, the rest stay.
  matrix sub(rows, heads * d);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < heads * d; ++c) sub(r, c) = xf[std::size_t(offset) + std::size_t(r) * stride + c];
  zipage::cpu::rope(sub, pos, d, theta, style, sc);
  std::vector<float> ref(xf.begin() + offset, xf.end());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < heads * d; ++c) ref[std::size_t(r) * stride + c] = sub(r, c);
  dbuf<std::int32_t> dpos(pos);
  dbuf<double> dinv(inv);
  char name[160];
  std::snprintf(name, sizeof name, "rope %s rows=%d heads=%d(+%d untouched) D=%d theta=%g offset=%d%s",
                style == zipage::rope_style::interleaved ? "interleaved" : "half", rows, heads, extra_heads, d, theta,
                offset, scaling ? " llama3-scaled table" : "");
  std::vector<std::uint16_t> got[2];
  for (const zc::kernel_variant variant : kVariants) {
    dbuf<std::uint16_t> dx(xb);
    zc::rope_params p;
    p.x = dx.p + offset;
    p.positions = dpos.p;
    p.rows = rows;
    p.num_heads = heads;
    p.head_dim = d;
    p.row_stride = extra_heads ? stride : 0;
    p.style = style;
    p.theta = theta;
    p.inv_freq = scaling ? dinv.p : nullptr;
    zc::rope(cuda_dtype::bf16, p, variant, nullptr);
    std::vector<std::uint16_t> out = dx.get();
    out.erase(out.begin(), out.begin() + offset);
    report(name + variant_tag(variant), compare(out, ref), 1e-2);
    got[variant == kTuned ? 0 : 1] = std::move(out);
  }
  const bool pairs_aligned = style == zipage::rope_style::half || offset % 2 == 0;
  report_choice(name, scaling || !pairs_aligned, got[0], got[1]);
}

void test_silu_mul(int rows, int cols, bool fused) {
  const int in_stride = fused ? 2 * cols : cols;
  std::vector<std::uint16_t> gb, ub;
  std::vector<float> gf, uf;
  random_bf16(std::size_t(rows) * in_stride, -6, 6, gb, gf);
  random_bf16(std::size_t(rows) * in_stride, -2, 2, ub, uf);
  matrix g(rows, cols), u(rows, cols), ref;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      g(r, c) = gf[std::size_t(r) * in_stride + c];
      u(r, c) = fused ? gf[std::size_t(r) * in_stride + cols + c] : uf[std::size_t(r) * in_stride + c];
    }
  zipage::cpu::silu_mul(g, u, ref);
  dbuf<std::uint16_t> dg(gb), du(ub);
  char name[128];
  std::snprintf(name, sizeof name, "silu_mul rows=%d cols=%d%s", rows, cols, fused ? " fused gate|up" : "");
  for (const zc::kernel_variant variant : kVariants) {
    dbuf<std::uint16_t> dout(std::size_t(rows) * cols);
    dout.poison();
    zc::silu_mul(cuda_dtype::bf16, dg.p, fused ? dg.p + cols : du.p, dout.p, rows, cols, fused ? in_stride : 0, variant,
                 nullptr);
    report(name + variant_tag(variant), compare(dout.get(), as_vector(ref)), 1e-2);
  }
}

// An id outside the table (with bad_ids: the first is -1, the last is vocab) gives a row of zeros.
void test_gather(int vocab, int cols, int n, bool bad_ids = false) {
  std::vector<std::uint16_t> tb;
  std::vector<float> tf;
  random_bf16(std::size_t(vocab) * cols, -1, 1, tb, tf);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  for (auto& id : ids) id = rand_int(0, vocab - 1);
  if (bad_ids) {
    ids.front() = -1;
    ids.back() = vocab;
  }
  std::vector<std::uint16_t> expect(std::size_t(n) * cols, 0);
  for (int t = 0; t < n; ++t)
    if (ids[std::size_t(t)] >= 0 && ids[std::size_t(t)] < vocab)
      std::copy_n(tb.begin() + std::ptrdiff_t(ids[std::size_t(t)]) * cols, cols, expect.begin() + std::ptrdiff_t(t) * cols);
  dbuf<std::uint16_t> dt(tb);
  dbuf<std::int32_t> dids(ids);
  char name[128];
  std::snprintf(name, sizeof name, "gather_rows vocab=%d cols=%d ids=%d%s", vocab, cols, n,
                bad_ids ? " (two ids outside: zero rows)" : "");
  for (const zc::kernel_variant variant : kVariants) {
    dbuf<std::uint16_t> dout(std::size_t(n) * cols);
    dout.poison();
    zc::gather_rows(cuda_dtype::bf16, dt.p, vocab, cols, dids.p, n, dout.p, variant, nullptr);
    report_exact(name + variant_tag(variant), mismatches(dout.get(), expect));
  }
}

void test_add(std::int64_t n, int offset, bool in_place) {
  std::vector<std::uint16_t> ab, bb;
  std::vector<float> af, bf;
  random_bf16(std::size_t(n + offset), -4, 4, ab, af);
  random_bf16(std::size_t(n + offset), -4, 4, bb, bf);
  std::vector<float> ref(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) ref[std::size_t(i)] = af[std::size_t(i + offset)] + bf[std::size_t(i + offset)];
  char name[128];
  std::snprintf(name, sizeof name, "add n=%lld offset=%d%s", static_cast<long long>(n), offset, in_place ? " in-place" : "");
  std::vector<std::uint16_t> got[2];
  for (const zc::kernel_variant variant : kVariants) {
    dbuf<std::uint16_t> da(ab), db(bb), dout(std::size_t(n + offset));
    dout.poison();
    std::uint16_t* out = in_place ? da.p + offset : dout.p + offset;
    zc::add(cuda_dtype::bf16, da.p + offset, db.p + offset, out, n, variant, nullptr);
    std::vector<std::uint16_t> sum = in_place ? da.get() : dout.get();
    sum.erase(sum.begin(), sum.begin() + offset);
    report(name + variant_tag(variant), compare(sum, ref), 1e-2);
    got[variant == kTuned ? 0 : 1] = std::move(sum);
  }
  report_exact(std::string(name) + " tuned and reference equal", mismatches(got[0], got[1]));  // one fp32 add
}

// fp32 data: a tuned request runs the reference kernel (the tuned ones are bf16 only), which matches the
// CPU reference to fp32 rounding.
void test_f32_ops() {
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  auto random_f32 = [&](std::size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = dist(g_rng);
    return v;
  };
  auto report_f32 = [](const std::string& name, const std::vector<float>& out, const std::vector<float>& ref) {
    double num = 0.0, den = 0.0;
    std::size_t bad = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      if (!std::isfinite(out[i])) ++bad;
      num += (double(out[i]) - ref[i]) * (double(out[i]) - ref[i]);
      den += double(ref[i]) * ref[i];
    }
    error_stats s;
    s.rel = std::sqrt(num / std::max(den, 1e-30));
    s.bad = bad;
    report(name, s, 1e-5);
  };
  const int rows = 7, cols = 96, width = 48;
  const std::vector<float> x = random_f32(std::size_t(rows) * cols), w = random_f32(std::size_t(width));
  matrix ref;
  zipage::cpu::rms_norm(as_matrix(x, rows, cols), as_matrix(w, 1, width), 1e-6f, ref);
  dbuf<float> dx(x), dw(w), dout(x.size());
  dout.poison();
  zc::rms_norm(cuda_dtype::f32, dx.p, cuda_dtype::f32, dw.p, dout.p, rows, cols, width, 1e-6f, kTuned, nullptr);
  report_f32("rms_norm fp32 rows=7 cols=96 width=48 [tuned request]", dout.get(), as_vector(ref));

  const std::vector<float> gu = random_f32(std::size_t(rows) * 2 * cols);  // fused gate|up rows
  matrix g(rows, cols), u(rows, cols), sref;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      g(r, c) = gu[std::size_t(r) * 2 * cols + c];
      u(r, c) = gu[std::size_t(r) * 2 * cols + cols + c];
    }
  zipage::cpu::silu_mul(g, u, sref);
  dbuf<float> dgu(gu), dsilu(std::size_t(rows) * cols);
  dsilu.poison();
  zc::silu_mul(cuda_dtype::f32, dgu.p, dgu.p + cols, dsilu.p, rows, cols, 2 * cols, kTuned, nullptr);
  report_f32("silu_mul fp32 rows=7 cols=96 fused gate|up [tuned request]", dsilu.get(), as_vector(sref));

  const std::vector<float> a = random_f32(1001), b = random_f32(1001);
  std::vector<float> sum(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) sum[i] = a[i] + b[i];
  dbuf<float> da(a), db(b);
  zc::add(cuda_dtype::f32, da.p, db.p, da.p, std::int64_t(a.size()), kTuned, nullptr);
  report_f32("add fp32 n=1001 in-place [tuned request]", da.get(), sum);
}

// ---- the attention entry point: paged_attention() with both variants on the same inputs, the kernel
// select_attention_kernel() names for the tuned request checked against `expect`, both outputs against
// the CPU reference, and, when the rule falls back, the tuned request's output bit-identical to the
// reference kernel's. q and out start `offset` elements into their buffers (1: not 16-byte aligned).
const char* kernel_name(zc::attention_kernel k) {
  return k == zc::attention_kernel::tuned_decode    ? "tuned_decode"
         : k == zc::attention_kernel::tuned_prefill ? "tuned_prefill"
                                                    : "reference";
}

void test_attention_entry(int d, int qh, int kvh, int bs, const std::vector<std::pair<int, int>>& seqs_cached_new,
                          int offset, zc::attention_kernel expect) {
  std::vector<int> lens;
  std::vector<std::int32_t> q_indptr{0}, token_seq, token_len;
  bool one_token_per_seq = true;
  for (std::size_t s = 0; s < seqs_cached_new.size(); ++s) {
    const auto [cached, fresh] = seqs_cached_new[s];
    lens.push_back(cached + fresh);
    one_token_per_seq &= fresh == 1;
    for (int i = 0; i < fresh; ++i) {
      token_seq.push_back(static_cast<std::int32_t>(s));
      token_len.push_back(cached + i + 1);
    }
    q_indptr.push_back(q_indptr.back() + fresh);
  }
  const int tokens = q_indptr.back();
  const paged_cache c = make_cache(d, kvh, bs, lens);
  std::vector<std::uint16_t> qb;
  std::vector<float> qf;
  random_bf16(std::size_t(offset) + std::size_t(tokens) * qh * d, -2.0f, 2.0f, qb, qf);
  const float scale = 1.0f / std::sqrt(float(d));
  const std::vector<float> ref =
      reference_attention(c, token_seq, token_len, std::vector<float>(qf.begin() + offset, qf.end()), qh, scale);

  dbuf<std::uint16_t> dk(c.k), dv(c.v), dq(qb);
  dbuf<std::int32_t> dindptr(c.page_indptr), dindices(c.page_indices), dqptr(q_indptr), dseq(token_seq),
      dtlen(token_len);
  zc::attention_params p;
  p.q = dq.p + offset;
  p.kv.k_cache = dk.p;
  p.kv.v_cache = dv.p;
  p.kv.page_indptr = dindptr.p;
  p.kv.page_indices = dindices.p;
  p.kv.num_blocks = c.num_blocks;
  p.kv.block_size = bs;
  p.kv.num_kv_heads = kvh;
  p.kv.head_dim = d;
  p.token_seq = dseq.p;
  p.token_kv_len = dtlen.p;
  p.q_indptr = dqptr.p;
  p.num_tokens = tokens;
  p.num_seqs = static_cast<int>(seqs_cached_new.size());
  p.num_q_heads = qh;
  p.max_kv_len = *std::max_element(lens.begin(), lens.end());
  p.one_token_per_seq = one_token_per_seq;
  p.scale = scale;
  char name[160];
  std::snprintf(name, sizeof name, "%s seqs=%zu tokens=%d offset=%d",
                shape_name("paged_attention", d, qh, kvh, bs).c_str(), seqs_cached_new.size(), tokens, offset);
  std::vector<std::uint16_t> got[2];
  for (const zc::kernel_variant variant : kVariants) {
    dbuf<std::uint16_t> dout(std::size_t(offset) + std::size_t(tokens) * qh * d);
    p.out = dout.p + offset;
    const zc::attention_kernel kind = zc::select_attention_kernel(cuda_dtype::bf16, p, variant);
    const zc::attention_kernel want = variant == kTuned ? expect : zc::attention_kernel::reference;
    ++g_checks;
    if (kind != want) ++g_failures;
    std::printf("[%s] %-72s selects %s (expected %s)\n", kind == want ? "PASS" : "FAIL",
                (name + variant_tag(variant)).c_str(), kernel_name(kind), kernel_name(want));
    zc::attention_workspace ws;
    if (kind == zc::attention_kernel::tuned_decode) ws.plan = zc::plan_decode(zc::as_decode_params(p));
    ws.bytes = kind == zc::attention_kernel::tuned_decode ? zc::decode_workspace_bytes(zc::as_decode_params(p), ws.plan) : 0;
    dbuf<unsigned char> scratch(ws.bytes);
    ws.data = ws.bytes ? scratch.p : nullptr;
    dout.poison();
    zc::paged_attention(cuda_dtype::bf16, p, variant, ws, nullptr);
    std::vector<std::uint16_t> out = dout.get();
    out.erase(out.begin(), out.begin() + offset);
    report(name + variant_tag(variant), compare(out, ref), 1e-2);
    got[variant == kTuned ? 0 : 1] = std::move(out);
  }
  report_choice(name, expect == zc::attention_kernel::reference, got[0], got[1]);
}

}  // namespace

int main() {
  if (zc::device_count() == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", zc::describe_device().c_str());
    return 77;
  }
  std::printf("device 0: %s\n", zc::describe_device(0).c_str());
  // ZIPAGE_CUDA_TEST_QUICK=1: a few small cases of every kernel (for compute-sanitizer runs).
  const char* quick_env = std::getenv("ZIPAGE_CUDA_TEST_QUICK");
  if (quick_env != nullptr && quick_env[0] == '1') {
    try {
      test_decode(128, 16, 4, 16, {1, 64, 65, 700, 0}, {{0, 0}, {3, 2}, {4, 4}});
      test_decode(64, 8, 8, 256, {300, 5}, {{0, 3}, {2, 0}});
      test_decode(128, 32, 1, 2, {100, 33}, {{0, 0}});
      test_decode(64, 8, 2, 16, {4096, 100}, {{64, 0}});
      test_prefill(128, 16, 4, 16, {{0, 70}, {100, 9}});
      test_prefill(64, 6, 1, 256, {{0, 40}, {300, 3}});
      if (zc::wgmma_prefill_available()) test_prefill(128, 16, 4, 16, {{0, 70}, {100, 9}}, wgmma_kernels());
      test_append_kv(2, 64, 16, 50, 8);
      test_append_kv_fp8(2, 60, 8);
      test_decode_fp8_kv(128, 16, 4, 16, {1, 64, 700, 0, 65}, {0, 3});
      test_rms_norm(3, 4096, 4096, cuda_dtype::bf16, false);
      test_rms_norm(3, 256, 64, cuda_dtype::f32, true);
      test_rope(5, 2, 1, 64, 1e4f, zipage::rope_style::interleaved);
      test_rope(5, 2, 0, 128, 1e4f, zipage::rope_style::half);
      test_silu_mul(3, 64, true);
      test_silu_mul(3, 10, false);
      test_gather(10, 16, 5);
      test_gather(10, 5, 5);
      test_add(100, 1, false);
      test_add(64, 0, true);
      test_rms_norm(3, 48, 12, cuda_dtype::bf16, false);         // width 12: reference
      test_rms_norm(3, 256, 64, cuda_dtype::bf16, false, 1, 0);  // x misaligned: reference
      test_rope(5, 2, 0, 64, 1e4f, zipage::rope_style::interleaved, 1);       // pairs misaligned: reference
      test_rope(5, 2, 0, 64, 5e5f, zipage::rope_style::half, 0, true);        // frequency table: reference
      test_gather(10, 16, 5, true);
      test_f32_ops();
      test_attention_entry(128, 16, 4, 16, {{0, 1}, {700, 1}}, 0, zc::attention_kernel::tuned_decode);
      test_attention_entry(64, 8, 2, 16, {{0, 40}, {100, 9}}, 0, zc::attention_kernel::tuned_prefill);
      test_attention_entry(96, 8, 2, 16, {{0, 40}, {100, 1}}, 0, zc::attention_kernel::reference);
      test_attention_entry(128, 8, 2, 16, {{0, 20}, {50, 3}}, 1, zc::attention_kernel::reference);
      CUDA_OK(cudaDeviceSynchronize());
    } catch (const std::exception& e) {
      std::printf("FAIL: exception: %s\n", e.what());
      return 1;
    }
    std::printf("%d/%d checks passed (quick)\n", g_checks - g_failures, g_checks);
    return g_failures == 0 ? 0 : 1;
  }
  try {
    // Decode: lengths from 0 to ~8k in one batch, auto plan and forced split counts.
    const std::pair<int, int> gqa[] = {{8, 8}, {16, 8}, {16, 4}, {32, 4}};
    for (int d : {64, 128})
      for (auto [qh, kvh] : gqa)
        for (int bs : {16, 256}) {
          std::vector<int> lens = {1, 2, 16, 63, 64, 65, 255, 257, rand_int(300, 1500), rand_int(1500, 4000),
                                   rand_int(4000, 8000)};
          std::shuffle(lens.begin(), lens.end(), g_rng);
          test_decode(d, qh, kvh, bs, lens, {{0, 0}, {1, 2}, {7, 4}});
        }
    test_decode(128, 28, 4, 16, {1, 500, 3000, 2304}, {{0, 0}, {5, 3}});  // group 7
    test_decode(128, 12, 2, 256, {2304, 17, 4097}, {{0, 0}, {64, 2}});  // group 6, many splits
    test_decode(128, 32, 1, 16, {100, 2000, 1}, {{0, 0}, {3, 4}});  // group 32: two head chunks
    test_decode(64, 4, 4, 2, {0, 5, 130, 1000}, {{0, 0}, {2, 2}});  // kv_len 0, block size 2
    test_decode(128, 8, 2, 16, {16384, 16000, 3}, {{256, 0}, {100, 0}});  // the most splits (256 x 64 tokens)
    test_decode(64, 16, 2, 256, {16384, 9000}, {{256, 3}, {0, 0}});
    {
      std::vector<int> lens(64);
      for (auto& l : lens) l = rand_int(1, 3000);
      test_decode(128, 32, 8, 16, lens, {{0, 0}});  // a wide batch
    }
    // Decode over an FP8 cache made by append_kv (both kernels), and its FP8 output copy.
    for (int d : {64, 128})
      for (auto [qh, kvh] : gqa) {
        std::vector<int> lens = {1, 63, 64, 65, 257, rand_int(300, 1500), rand_int(1500, 4000), 0};
        std::shuffle(lens.begin(), lens.end(), g_rng);
        test_decode_fp8_kv(d, qh, kvh, 16, lens, {0, 1, 5});
      }
    test_decode_fp8_kv(128, 28, 4, 256, {2304, 1, 2048, 3}, {0, 1});  // group 7, padding rows in the copy
    // Blocks of 64 and 128 tokens, partial last tiles over NaN codes, an empty sequence; group 1.
    test_decode_fp8_kv(128, 32, 8, 64, {1, 63, 64, 65, 257, rand_int(300, 1500), 2304, 0}, {0});
    test_decode_fp8_kv(128, 8, 2, 128, {129, 1, 2000, 127, 128}, {0});
    test_decode_fp8_kv(128, 1, 1, 64, {700, 64, 5}, {0});
    test_decode_fp8_kv(128, 32, 1, 16, {100, 2000, 1}, {0});          // group 32: two head chunks

    // Prefill: whole prompts and chunks appended to an existing cache.
    for (int d : {64, 128})
      for (auto [qh, kvh] : gqa)
        for (int bs : {16, 256})
          test_prefill(d, qh, kvh, bs, {{0, 1}, {0, 50}, {0, 200}, {64, 64}, {700, 129}, {1500, 77}, {3, 300}});
    test_prefill(128, 28, 4, 16, {{0, 333}, {1000, 100}});  // group 7
    test_prefill(128, 12, 2, 256, {{0, 257}, {40, 1}});     // group 6
    test_prefill(64, 64, 1, 16, {{0, 70}, {10, 3}});        // group 64: one token per tile
    test_prefill(128, 16, 8, 16, {{0, 1500}});              // one long prompt
    // automatic: whichever kernel the device runs (wgmma on an sm_90a build on Hopper, else mma_sync)
    test_prefill(128, 32, 8, 16, {{0, 300}, {500, 40}}, {zc::prefill_kernel::automatic});
    test_prefill(64, 32, 8, 16, {{0, 300}, {500, 40}}, {zc::prefill_kernel::automatic});

    // Prefill on Hopper's wgmma (bf16 K/V, head_dim 128): the same cases, and longer prompts whose tiles run
    // the whole K/V pipeline many times over.
    if (zc::wgmma_prefill_available()) {
      const auto wg = wgmma_kernels();  // each case's reference serves every kernel
      for (auto [qh, kvh] : gqa)
        for (int bs : {2, 16, 256})
          test_prefill(128, qh, kvh, bs, {{0, 1}, {0, 50}, {0, 200}, {64, 64}, {700, 129}, {1500, 77}, {3, 300}}, wg);
      test_prefill(128, 28, 4, 16, {{0, 333}, {1000, 100}}, wg);  // group 7: 18 tokens x 7 heads = 126 rows
      test_prefill(128, 12, 2, 256, {{0, 257}, {40, 1}}, wg);     // group 6
      test_prefill(128, 64, 1, 16, {{0, 70}, {10, 3}}, wg);       // group 64: a token per warpgroup
      test_prefill(128, 32, 8, 16, {{0, 2048}, {1000, 500}}, wg);
      test_prefill(128, 16, 8, 256, {{0, 1500}}, wg);
      // Sharp softmax rows: the lazy rescale's both branches, probabilities up to 2^8 in P (and mma.sync beside it).
      auto wg_and_mma = wg;
      wg_and_mma.push_back(zc::prefill_kernel::mma_sync);
      test_prefill(128, 32, 8, 16, {{0, 1200}, {700, 300}, {5, 64}}, wg_and_mma, 24.0f);
      test_prefill(128, 8, 8, 2, {{0, 700}}, wg, 64.0f);
    } else {
      std::printf("SKIPPED: prefill on wgmma (%s)\n",
                  "needs an sm_90a build (CMAKE_CUDA_ARCHITECTURES=90a) and a compute-capability-9.0 device");
    }

    // Elementwise.
    test_append_kv(8, 128, 16, 300, 0);
    test_append_kv(2, 64, 256, 1000, 3 * 64 + 8);  // K rows inside a wider (fused) buffer
    test_append_kv_fp8(8, 300, 0);
    test_append_kv_fp8(4, 777, 2 * 4 * 128 + 8);  // K rows inside a fused q|k|v buffer
    test_append_kv_fp8(1, 33, 0);
    test_rms_norm(37, 4096, 4096, cuda_dtype::bf16, false);
    test_rms_norm(64, 2048, 2048, cuda_dtype::f32, true);
    test_rms_norm(100, 32 * 128, 128, cuda_dtype::f32, false);
    test_rms_norm(33, 8 * 64, 64, cuda_dtype::bf16, false);
    test_rms_norm(9, 1024, 1024, cuda_dtype::bf16, false);
    test_rms_norm(5, 64, 8, cuda_dtype::f32, false);
    test_rope(57, 8, 0, 128, 1e6f, zipage::rope_style::half);
    test_rope(57, 8, 0, 128, 1e4f, zipage::rope_style::interleaved);
    test_rope(31, 16, 4, 64, 1e4f, zipage::rope_style::interleaved);
    test_rope(31, 4, 12, 64, 5e5f, zipage::rope_style::half);
    test_rope(3, 2, 0, 8, 1e4f, zipage::rope_style::interleaved);
    test_silu_mul(33, 11008, false);
    test_silu_mul(17, 4096, true);
    test_silu_mul(7, 100, false);
    test_gather(1000, 4096, 77);
    test_gather(300, 13, 41);
    test_add((1 << 20) + 3, 0, false);
    test_add(1000, 1, false);
    test_add(4096, 0, true);

    // Shapes and pointers the tuned kernels cannot take: the launcher runs the reference kernel.
    test_rms_norm(37, 4 * 12, 12, cuda_dtype::bf16, false);      // width not a multiple of 8
    test_rms_norm(9, 1000, 1000, cuda_dtype::f32, true);         // row not a multiple of 8
    test_rms_norm(33, 8 * 64, 64, cuda_dtype::bf16, false, 3, 0);  // x and out misaligned
    test_rms_norm(33, 8 * 64, 64, cuda_dtype::f32, false, 0, 1);   // fp32 weight misaligned
    test_rms_norm(17, 4096, 4096, cuda_dtype::bf16, true, 0, 4);   // bf16 weight misaligned
    test_rope(31, 8, 0, 128, 1e4f, zipage::rope_style::interleaved, 1);  // interleaved pairs not 4-byte aligned
    test_rope(31, 8, 0, 128, 1e4f, zipage::rope_style::half, 1);         // half style: tuned at any alignment
    test_rope(57, 8, 0, 128, 5e5f, zipage::rope_style::half, 0, true);   // the host's scaled frequency table
    test_rope(31, 4, 12, 64, 5e5f, zipage::rope_style::interleaved, 0, true);
    test_append_kv(3, 12, 16, 200, 0);   // row of 36: not a multiple of 8
    test_append_kv(2, 64, 16, 100, 3);   // K row stride not a multiple of 8
    test_gather(300, 64, 41, true);
    test_gather(300, 13, 41, true);
    test_f32_ops();

    // paged_attention(): the kernel the rule picks, and the reference kernel where the tuned ones cannot run.
    using zc::attention_kernel;
    test_attention_entry(128, 32, 8, 16, {{0, 1}, {3000, 1}, {64, 1}, {5, 1}}, 0, attention_kernel::tuned_decode);
    test_attention_entry(64, 8, 8, 256, {{300, 1}, {0, 1}}, 0, attention_kernel::tuned_decode);
    test_attention_entry(64, 96, 1, 16, {{100, 1}, {2000, 1}}, 0, attention_kernel::tuned_decode);  // any group
    test_attention_entry(128, 16, 4, 16, {{0, 200}, {700, 129}, {5, 1}}, 0, attention_kernel::tuned_prefill);
    test_attention_entry(64, 28, 4, 256, {{0, 1}, {0, 333}}, 0, attention_kernel::tuned_prefill);  // one row: prefill
    test_attention_entry(64, 96, 1, 16, {{0, 50}, {100, 3}}, 0, attention_kernel::reference);  // group 96 > 64
    test_attention_entry(96, 8, 2, 16, {{0, 70}, {500, 1}}, 0, attention_kernel::reference);   // head_dim 96
    test_attention_entry(96, 8, 2, 16, {{400, 1}, {9, 1}}, 0, attention_kernel::reference);    // ... also decoding
    test_attention_entry(32, 4, 4, 16, {{0, 33}, {64, 1}}, 0, attention_kernel::reference);    // head_dim 32
    test_attention_entry(128, 8, 2, 24, {{0, 70}, {100, 5}}, 0, attention_kernel::reference);  // block size 24
    test_attention_entry(128, 8, 2, 1, {{0, 9}, {30, 1}}, 0, attention_kernel::reference);     // block size 1
    test_attention_entry(128, 8, 2, 16, {{0, 70}, {100, 5}}, 1, attention_kernel::reference);  // q, out misaligned
    test_attention_entry(64, 8, 2, 16, {{300, 1}, {70, 1}}, 4, attention_kernel::reference);   // ... also decoding

    // Arguments the kernels do not support are rejected on the host.
    expect_throw("decode rejects head_dim 96", [] {
      zc::decode_params p;
      p.kv.head_dim = 96, p.num_q_heads = 8, p.kv.num_kv_heads = 8, p.kv.block_size = 16, p.num_seqs = 1;
      zc::paged_decode_attention(p, zc::plan_decode(p), nullptr, 0, nullptr);
    });
    expect_throw("decode rejects block_size 24", [] {
      zc::decode_params p;
      p.kv.head_dim = 128, p.num_q_heads = 8, p.kv.num_kv_heads = 8, p.kv.block_size = 24, p.num_seqs = 1;
      zc::paged_decode_attention(p, zc::plan_decode(p), nullptr, 0, nullptr);
    });
    expect_throw("decode rejects a workspace smaller than the plan", [] {
      zc::decode_params p;
      p.kv.head_dim = 128, p.num_q_heads = 8, p.kv.num_kv_heads = 8, p.kv.block_size = 16, p.num_seqs = 1;
      p.max_kv_len = 4096;
      zc::paged_decode_attention(p, zc::plan_decode(p, 4), nullptr, 0, nullptr);
    });
    expect_throw("decode rejects an FP8 copy of a split plan", [] {
      zc::decode_params p;
      p.kv.head_dim = 128, p.num_q_heads = 8, p.kv.num_kv_heads = 8, p.kv.block_size = 16, p.num_seqs = 1;
      p.max_kv_len = 4096;
      p.out_fp8 = {reinterpret_cast<std::uint8_t*>(16), reinterpret_cast<float*>(16), 4};
      zc::paged_decode_attention(p, zc::plan_decode(p, 4), reinterpret_cast<void*>(16), 1 << 30, nullptr);
    });
    expect_throw("decode rejects an FP8 copy at head_dim 64", [] {
      zc::decode_params p;
      p.kv.head_dim = 64, p.num_q_heads = 8, p.kv.num_kv_heads = 8, p.kv.block_size = 16, p.num_seqs = 1;
      p.out_fp8 = {reinterpret_cast<std::uint8_t*>(16), reinterpret_cast<float*>(16), 4};
      zc::paged_decode_attention(p, zc::plan_decode(p, 1), nullptr, 0, nullptr);
    });
    expect_throw("the swapped-operand decode rejects a bf16 cache", [] {
      zc::decode_params p;
      p.kv.head_dim = 128, p.num_q_heads = 32, p.kv.num_kv_heads = 8, p.kv.block_size = 16, p.num_seqs = 1;
      zc::paged_decode_attention_swapped(p, nullptr);
    });
    expect_throw("the swapped-operand decode rejects an append stride that is not whole 8-element vectors", [] {
      zc::decode_params p;
      p.kv.head_dim = 128, p.num_q_heads = 32, p.kv.num_kv_heads = 8, p.kv.block_size = 16, p.num_seqs = 1;
      p.kv.k_scale = p.kv.v_scale = reinterpret_cast<std::uint16_t*>(16);
      p.append = {reinterpret_cast<void*>(256), reinterpret_cast<void*>(256),
                  reinterpret_cast<std::int64_t*>(256), 1028, 1024};
      zc::paged_decode_attention_swapped(p, nullptr);
    });
    // 2-byte scales are gathered as the 4-byte words holding them (paged_kv_view::fp8_scale_words: block_size x
    // num_kv_heads even, 4-byte aligned arrays). Every power-of-two block size >= 2 gives an even product, so a
    // block of 2 tokens with 1 KV head is taken; a scale array 2 bytes off 4-byte alignment (as a bf16 array may be)
    // goes to the reference kernel, and the tuned kernels refuse it when called directly.
    {
      zc::decode_params p;
      p.kv.head_dim = 128, p.num_q_heads = 8, p.kv.num_kv_heads = 1, p.kv.block_size = 2, p.num_seqs = 1;
      p.kv.k_scale = p.kv.v_scale = reinterpret_cast<std::uint16_t*>(16);
      expect("FP8 scales of block 2 x 1 KV head are whole words", p.kv.fp8_scale_words());
      expect("... so the swapped decode takes them", zc::decode_swapped_supported(p));
      zc::attention_params ap;
      ap.kv = p.kv;
      ap.num_q_heads = 8, ap.num_seqs = 1, ap.num_tokens = 1, ap.one_token_per_seq = true;
      ap.q = ap.out = reinterpret_cast<void*>(256);
      expect("... and paged_attention runs the tuned decode",
             zc::select_attention_kernel(cuda_dtype::bf16, ap, kTuned) == zc::attention_kernel::tuned_decode);
      zc::paged_kv_view odd = p.kv;
      odd.block_size = 1;
      expect("block 1 x 1 KV head: not whole words", !odd.fp8_scale_words());
      p.kv.v_scale = reinterpret_cast<std::uint16_t*>(18);
      expect("a scale array 2 bytes off 4-byte alignment: not whole words", !p.kv.fp8_scale_words());
      expect("... so the swapped decode does not take it", !zc::decode_swapped_supported(p));
      ap.kv = p.kv;
      expect("... and paged_attention runs the reference kernel",
             zc::select_attention_kernel(cuda_dtype::bf16, ap, kTuned) == zc::attention_kernel::reference);
      expect_throw("decode rejects a scale array off 4-byte alignment", [p] {
        zc::paged_decode_attention(p, zc::plan_decode(p, 1), nullptr, 0, nullptr);
      });
      expect_throw("prefill rejects a scale array off 4-byte alignment", [&p] {
        zc::prefill_params q;
        q.kv = p.kv;
        q.num_q_heads = 8, q.num_seqs = 1, q.num_tokens = 1, q.scale = 0.125f;  // (reaching the scales' check)
        zc::paged_prefill_attention(q, nullptr);
      });
    }
    expect_throw("the swapped-operand decode rejects 2 stages", [] {
      zc::decode_params p;
      p.kv.head_dim = 128, p.num_q_heads = 32, p.kv.num_kv_heads = 8, p.kv.block_size = 16, p.num_seqs = 1;
      p.kv.k_scale = p.kv.v_scale = reinterpret_cast<std::uint16_t*>(16);
      zc::paged_decode_attention_swapped(p, nullptr, 2);
    });
    expect_throw("the swapped-operand decode rejects a group of 16 heads", [] {
      zc::decode_params p;
      p.kv.head_dim = 128, p.num_q_heads = 16, p.kv.num_kv_heads = 1, p.kv.block_size = 16, p.num_seqs = 1;
      p.kv.k_scale = p.kv.v_scale = reinterpret_cast<std::uint16_t*>(16);
      zc::paged_decode_attention_swapped(p, nullptr);
    });
    // The automatic FP8 decode kernel on this device's plan and occupancy: the compressed steady state of Qwen3-8B
    // (662 sequences of 2,304 tokens, 32/8 heads, 256-token blocks) fills the GPU without a split; 512 sequences of
    // 16,384 tokens are split but make more than 2 waves of the swapped grid; both run the swapped kernel. One
    // sequence of 8,192 tokens is split and keeps the split-KV kernel; a bf16 cache and a group of 16 never swap.
    {
      auto decode_view = [](int seqs, int len, int qh, int kvh, bool fp8) {
        zc::decode_params p;
        p.kv.head_dim = 128, p.num_q_heads = qh, p.kv.num_kv_heads = kvh, p.kv.block_size = 256, p.num_seqs = seqs;
        p.max_kv_len = len;
        if (fp8) p.kv.k_scale = p.kv.v_scale = reinterpret_cast<std::uint16_t*>(16);
        return p;
      };
      auto runs_swapped = [&](int seqs, int len, int qh, int kvh, bool fp8) {
        const zc::decode_params p = decode_view(seqs, len, qh, kvh, fp8);
        return zc::decode_kernel_for(p, zc::fp8_decode_kernel::automatic, zc::plan_decode(p)) ==
               zc::fp8_decode_kernel::swapped;
      };
      expect("automatic FP8 decode: swapped at 662 sequences x 2,304 tokens", runs_swapped(662, 2304, 32, 8, true));
      const zc::decode_params long_batch = decode_view(512, 16384, 32, 8, true);
      expect("512 sequences x 16,384 tokens: a split plan, over 2 waves of the swapped grid",
             zc::plan_decode(long_batch).num_splits > 1 &&
                 zc::decode_swapped_waves(long_batch) >= zc::kSwappedDecodeMinWaves);
      expect("automatic FP8 decode: swapped at 512 sequences x 16,384 tokens", runs_swapped(512, 16384, 32, 8, true));
      expect("automatic FP8 decode: split-KV for 1 sequence x 8,192 tokens", !runs_swapped(1, 8192, 32, 8, true));
      expect("automatic decode: split-KV on a bf16 cache", !runs_swapped(662, 2304, 32, 8, false));
      expect("automatic FP8 decode: split-KV at 16 query heads per KV head", !runs_swapped(662, 2304, 32, 2, true));
    }
    expect_throw("decode rejects an FP8 copy with too few padded rows", [] {
      zc::decode_params p;
      p.kv.head_dim = 128, p.num_q_heads = 8, p.kv.num_kv_heads = 8, p.kv.block_size = 16, p.num_seqs = 5;
      p.out_fp8 = {reinterpret_cast<std::uint8_t*>(16), reinterpret_cast<float*>(16), 4};
      zc::paged_decode_attention(p, zc::plan_decode(p, 1), nullptr, 0, nullptr);
    });
    expect_throw("prefill rejects 9 q heads over 2 kv heads", [] {
      zc::prefill_params p;
      p.kv.head_dim = 128, p.num_q_heads = 9, p.kv.num_kv_heads = 2, p.kv.block_size = 16, p.num_seqs = 1;
      p.num_tokens = 1;
      zc::paged_prefill_attention(p, nullptr);
    });
    for (float scale : {0.0f, -0.1f, std::numeric_limits<float>::infinity(), std::nanf("")})
      expect_throw("prefill rejects scale " + std::to_string(scale), [scale] {
        zc::prefill_params p;  // valid but for the scale
        p.kv.head_dim = 128, p.num_q_heads = 8, p.kv.num_kv_heads = 2, p.kv.block_size = 16, p.num_seqs = 1;
        p.num_tokens = 1;
        p.kernel = zc::prefill_kernel::mma_sync;
        p.scale = scale;
        zc::paged_prefill_attention(p, nullptr);
      });
    expect_throw("prefill on wgmma rejects head_dim 64", [] {
      zc::prefill_params p;
      p.kv.head_dim = 64, p.num_q_heads = 8, p.kv.num_kv_heads = 2, p.kv.block_size = 16, p.num_seqs = 1;
      p.num_tokens = 1;
      p.kernel = zc::prefill_kernel::wgmma;
      zc::paged_prefill_attention(p, nullptr);
    });
    expect_throw("prefill on wgmma rejects FP8 K/V", [] {
      zc::prefill_params p;
      p.kv.head_dim = 128, p.num_q_heads = 8, p.kv.num_kv_heads = 2, p.kv.block_size = 16, p.num_seqs = 1;
      p.num_tokens = 1;
      p.kv.k_scale = p.kv.v_scale = reinterpret_cast<std::uint16_t*>(16);
      p.kernel = zc::prefill_kernel::wgmma;
      zc::paged_prefill_attention(p, nullptr);
    });
    expect_throw("rms_norm rejects a width that does not divide the row", [] {
      zc::rms_norm(cuda_dtype::bf16, nullptr, cuda_dtype::f32, nullptr, nullptr, 1, 100, 64, 1e-5f, kTuned, nullptr);
    });
    expect_throw("rope rejects an odd head_dim", [] {
      zc::rope_params p;
      p.rows = 1, p.num_heads = 1, p.head_dim = 7;
      zc::rope(cuda_dtype::bf16, p, kReference, nullptr);
    });
    expect_throw("append_kv rejects an FP8 cache with one scale array", [] {
      zc::append_kv_params p;
      p.kv.num_kv_heads = 1, p.kv.head_dim = 64, p.kv.k_scale = reinterpret_cast<std::uint16_t*>(16);
      zc::append_kv(cuda_dtype::bf16, p, kTuned, nullptr);
    });
    CUDA_OK(cudaDeviceSynchronize());
  } catch (const std::exception& e) {
    std::printf("FAIL: exception: %s\n", e.what());
    return 1;
  }
  std::printf("%d/%d checks passed\n", g_checks - g_failures, g_checks);
  return g_failures == 0 ? 0 : 1;
}
