// zipage::cuda_backend (backend/cuda/cuda_backend.hpp): the sampling hook sample() (engine thread, main stream) —
// per-row parameters in one pinned upload, cuda::sample_tokens, tokens (and log-probabilities) back in one copy; or
// the CPU sampler on copied logits.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "context.cuh"
#include "zipage/backend/cuda/ops.hpp"
#include "zipage/backend/cuda/sampling.hpp"
#include "zipage/sampling/sampler.hpp"

namespace zipage {

namespace {
// A row's token-form rules, or none, by reference: `r.rules ? *r.rules : token_rules{}` would copy the request's
// bad words every step (the conditional's result is a prvalue).
const token_rules& rules_of(const sample_row& r) {
  static const token_rules none{};
  return r.rules != nullptr ? *r.rules : none;
}
}  // namespace

// ---------------------------------------------------------------------------------------------------
// sampling (engine thread, main stream)

std::vector<token_id> cuda_backend::sample(const cuda_tensor& logits, std::span<const sample_row> rows) const {
  context& c = use(ctx_);
  const auto t0 = cuda_detail::clock::now();
  const int n = static_cast<int>(rows.size());
  const int vocab = logits.cols();
  std::vector<token_id> out(static_cast<std::size_t>(n));
  for (const sample_row& r : rows) {
    check(r.params != nullptr, "sample: a row without sampling parameters");
    check(r.logits_row >= 0 && r.logits_row < logits.rows(), "sample: logits row ", r.logits_row, " outside ",
          logits.rows());
  }
  if (n == 0) {
    ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.stream));
    return out;
  }
  check(vocab >= 1 && vocab <= cuda::max_sampling_vocab, "sample: vocabulary of ", vocab, " outside [1, ",
        cuda::max_sampling_vocab, "]");

  if (!c.opts.device_sampling) {
    const std::vector<float> host = to_host(logits);
    const auto v = static_cast<std::size_t>(vocab);
    for (int i = 0; i < n; ++i) {
      const sample_row& r = rows[static_cast<std::size_t>(i)];
      const std::span<const float> row{host.data() + static_cast<std::size_t>(r.logits_row) * v, v};
      const token_id tok = c.host_sampler.sample(row, *r.params, r.context, r.step, rules_of(r));
      out[static_cast<std::size_t>(i)] = tok;
      if (r.logprobs) r.logprobs->push_back(token_logprob_of(row, tok));
      if (r.top_logprobs) r.top_logprobs->push_back(top_logprobs(row, r.params->top_logprobs));
    }
    const double dt = cuda_detail::seconds_since(t0);
    c.count([&](cuda_backend_counters& k) {
      ++k.sample_calls;
      k.sampled_rows += n;
      k.sample_seconds += dt;
    });
    return out;
  }

  // Per-row parameters. All greedy: no temperature array (no workspace, the greedy kernel).
  bool all_greedy = true, penalty = false, output_penalty = false, identity = true, logprobs = false, tops = false;
  // Logits processors: each row's edit into the CSR (an empty range for the rows without them), built from the
  // first row that has them (with empty rows before it); none built when no row has them.
  bool edits = false;
  c.s_edits.clear();
  for (int i = 0; i < n; ++i) {
    const sample_row& r = rows[static_cast<std::size_t>(i)];
    if (r.params->processes_logits(r.step)) {
      if (!edits) {
        for (int j = 0; j < i; ++j) c.s_edits.append_none();  // the rows before the first edited one
        edits = true;
      }
      make_logit_edits(c.s_edit, *r.params, r.context, r.step, rules_of(r), vocab);
      c.s_edits.append(c.s_edit);
    } else if (edits) {
      c.s_edits.append_none();
    }
    logprobs = logprobs || r.logprobs != nullptr || r.top_logprobs != nullptr;
    tops = tops || (r.top_logprobs != nullptr && r.params->top_logprobs > 0);
    all_greedy = all_greedy && r.params->greedy();
    penalty = penalty || r.params->repetition_penalty != 1.0f;
    output_penalty = output_penalty || (r.params->output_penalties() && r.step > 0);
    identity = identity && r.logits_row == i;
  }
  const auto un = static_cast<std::size_t>(n);
  c.s_temp.resize(un);
  c.s_top_k.resize(un);
  c.s_top_p.resize(un);
  c.s_min_p.resize(un);
  c.s_seed.resize(un);
  c.s_step.resize(un);
  c.s_penalty.clear();
  c.s_frequency.clear();
  c.s_presence.clear();
  c.s_indptr.clear();
  c.s_ids.clear();
  c.s_rows.clear();
  for (std::size_t i = 0; i < un; ++i) {
    const sampling_params& p = *rows[i].params;
    c.s_temp[i] = p.temperature;
    c.s_top_k[i] = p.top_k;
    c.s_top_p[i] = p.top_p;
    c.s_min_p[i] = p.min_p;
    c.s_seed[i] = p.seed;
    c.s_step[i] = rows[i].step;
  }
  if (penalty || output_penalty) {
    // Context as CSR; rows without a penalty get an empty range (the kernel skips them anyway). A row with
    // only the frequency / presence penalties sends its generated tokens (the context's last `step`),
    // which the kernel then takes whole as the generated ones.
    if (penalty) c.s_penalty.resize(un);
    if (output_penalty) {
      c.s_frequency.resize(un);
      c.s_presence.resize(un);
    }
    c.s_indptr.assign(1, 0);
    for (std::size_t i = 0; i < un; ++i) {
      const sampling_params& p = *rows[i].params;
      const std::span<const token_id> ctx = rows[i].context;
      if (penalty) c.s_penalty[i] = p.repetition_penalty;
      if (output_penalty) {
        c.s_frequency[i] = p.frequency_penalty;
        c.s_presence[i] = p.presence_penalty;
      }
      if (p.repetition_penalty != 1.0f)
        c.s_ids.insert(c.s_ids.end(), ctx.begin(), ctx.end());
      else if (p.output_penalties()) {
        const auto generated = ctx.last(static_cast<std::size_t>(std::min<std::uint64_t>(rows[i].step, ctx.size())));
        c.s_ids.insert(c.s_ids.end(), generated.begin(), generated.end());
      }
      check(c.s_ids.size() < 0x7fffffffu, "sample: penalty context too large");
      c.s_indptr.push_back(static_cast<std::int32_t>(c.s_ids.size()));
    }
    if (c.s_ids.empty()) c.s_indptr.clear();  // nothing to penalise
  }
  if (!identity)
    for (const sample_row& r : rows) c.s_rows.push_back(r.logits_row);
  c.s_top.clear();
  if (tops)
    for (const sample_row& r : rows)
      c.s_top.push_back(r.top_logprobs ? std::clamp(r.params->top_logprobs, 0, sampling_params::max_top_logprobs) : 0);
  using cuda_detail::span_section;
  auto sec_if = [](bool on, auto&& vec) {
    using T = typename std::decay_t<decltype(vec)>::value_type;
    return on ? span_section(std::span<const T>(vec)) : section{nullptr, 0};
  };
  const bool sampling = !all_greedy;
  const section secs[] = {sec_if(sampling, c.s_temp),     sec_if(sampling, c.s_top_k),
                          sec_if(sampling, c.s_top_p),    sec_if(sampling, c.s_min_p),
                          sec_if(sampling, c.s_seed),     sec_if(sampling || output_penalty, c.s_step),
                          sec_if(penalty, c.s_penalty),   sec_if(true, c.s_indptr),
                          sec_if(true, c.s_ids),          sec_if(true, c.s_rows),
                          sec_if(output_penalty, c.s_frequency), sec_if(output_penalty, c.s_presence),
                          sec_if(tops, c.s_top),
                          sec_if(edits, c.s_edits.indptr), sec_if(edits, c.s_edits.ids),
                          sec_if(edits, c.s_edits.adds),   sec_if(edits, c.s_edits.others_banned)};
  c.sample_up.put(secs, c.stream);

  const void* src = logits.data();
  if (!identity) {  // the rows to sample, packed (the engine passes them in order, so this is rare)
    auto* packed = c.sample_rows.reserve(un * static_cast<std::size_t>(vocab) * dtype_bytes(logits.dtype()), c.stream);
    cuda::gather_rows(logits.dtype(), logits.data(), logits.rows(), vocab, c.sample_up.device<std::int32_t>(9), n,
                      packed, cuda::kernel_variant::reference, as_stream(c.stream));
    src = packed;
  }
  cuda::sampling_batch b;
  b.logits = src;
  b.dtype = logits.dtype() == cuda_dtype::f32 ? cuda::logits_dtype::f32 : cuda::logits_dtype::bf16;
  b.row_stride = vocab;
  b.batch = n;
  b.vocab = vocab;
  b.temperature = c.sample_up.device<float>(0);
  b.top_k = c.sample_up.device<std::int32_t>(1);
  b.top_p = c.sample_up.device<float>(2);
  b.min_p = c.sample_up.device<float>(3);
  b.seed = c.sample_up.device<std::uint64_t>(4);
  b.step = c.sample_up.device<std::uint64_t>(5);
  b.repetition_penalty = c.sample_up.device<float>(6);
  b.frequency_penalty = c.sample_up.device<float>(10);
  b.presence_penalty = c.sample_up.device<float>(11);
  b.context_indptr = c.s_indptr.empty() ? nullptr : c.sample_up.device<std::int32_t>(7);
  b.context_ids = c.s_indptr.empty() ? nullptr : c.sample_up.device<std::int32_t>(8);
  if (edits) {
    b.edit_indptr = c.sample_up.device<std::int32_t>(13);
    b.edit_ids = c.sample_up.device<std::int32_t>(14);
    b.edit_adds = c.sample_up.device<float>(15);
    b.edit_others_banned = c.sample_up.device<std::int32_t>(16);
  }
  // Outputs, back to back: tokens [n], then with log-probabilities their values [n], top ids [n][20] and
  // top values [n][20] (4-byte entries), one copy to the host.
  constexpr std::size_t kTop = sampling_params::max_top_logprobs;
  const std::size_t out_words = un * (logprobs ? 2 + 2 * kTop : 1);
  auto* d_out = static_cast<std::int32_t*>(c.sample_out.reserve(out_words * sizeof(std::int32_t), c.stream));
  b.out_tokens = d_out;
  if (logprobs) {
    b.out_logprobs = reinterpret_cast<float*>(d_out + un);
    if (tops) {
      b.top_logprobs = c.sample_up.device<std::int32_t>(12);
      b.max_top_logprobs = static_cast<int>(kTop);
      b.out_top_ids = d_out + 2 * un;
      b.out_top_logprobs = reinterpret_cast<float*>(d_out + 2 * un + un * kTop);
    }
  }
  const std::size_t ws_bytes = cuda::sampling_workspace_bytes(n, vocab, !sampling, output_penalty && !c.s_indptr.empty());
  void* ws = ws_bytes ? c.sample_ws.reserve(ws_bytes, c.stream) : nullptr;
  cuda::sample_tokens(b, ws, ws_bytes, as_stream(c.stream));
  c.sample_host.reserve(out_words * sizeof(std::int32_t));
  ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(c.sample_host.p, d_out, out_words * sizeof(std::int32_t), cudaMemcpyDeviceToHost, c.stream));
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  std::memcpy(out.data(), c.sample_host.p, un * sizeof(std::int32_t));
  if (logprobs) {
    const auto* words = static_cast<const std::int32_t*>(static_cast<const void*>(c.sample_host.p));
    auto as_float = [](std::int32_t w) {
      float f;
      std::memcpy(&f, &w, sizeof f);
      return f;
    };
    for (std::size_t i = 0; i < un; ++i) {
      const sample_row& r = rows[i];
      if (r.logprobs) r.logprobs->push_back(as_float(words[un + i]));
      if (!r.top_logprobs) continue;
      std::vector<token_logprob> top;
      const int k = tops ? c.s_top[i] : 0;
      for (int j = 0; j < std::min(k, vocab); ++j)
        top.push_back({words[2 * un + i * kTop + static_cast<std::size_t>(j)],
                       as_float(words[2 * un + un * kTop + i * kTop + static_cast<std::size_t>(j)])});
      r.top_logprobs->push_back(std::move(top));
    }
  }
  const double dt = cuda_detail::seconds_since(t0);
  c.count([&](cuda_backend_counters& k) {
    ++k.sample_calls;
    k.sampled_rows += n;
    k.device_sampled_rows += n;
    k.sample_seconds += dt;
  });
  return out;
}

}  // namespace zipage
