// zipage::cuda_backend (backend/cuda/cuda_backend.hpp): the paged attention step — the step's metadata uploaded once
// for every layer, K/V appended (bf16 or FP8), window queries recorded, then paged attention (backend/cuda/attention.hpp
// picks the tuned decode, tuned prefill or reference kernel).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>

#include "context.cuh"
#include "fp8_linear.cuh"  // fp8_copy_for
#include "zipage/backend/cuda/attention.hpp"
#include "zipage/backend/cuda/ops.hpp"

namespace zipage {

namespace {

// Context lengths rounded up to four buckets per octave (at most 25% above), at least 64.
int context_bucket(int len) {
  const int b = std::max(len, 64);
  const int step = std::max(64, static_cast<int>(std::bit_floor(static_cast<unsigned>(b))) / 4);
  return (b + step - 1) / step * step;
}

// Copies the step's attention metadata to the device unless one of the last two calls already did (every
// layer after the first; two: the nano-batches of an overlapped step alternate), and derives what the kernels
// need besides (prefill q_indptr, decode or not).
cuda_detail::step_state& prepare_step(context& c, const attention_metadata& meta) {
  const section raw[] = {cuda_detail::span_section(meta.slot_mapping), cuda_detail::span_section(meta.token_seq),
                         cuda_detail::span_section(meta.token_kv_len), cuda_detail::span_section(meta.page_indptr),
                         cuda_detail::span_section(meta.page_indices), cuda_detail::span_section(meta.token_window_row)};
  const bool graphed = c.graph.phase != cuda_detail::graph_phase::off;
  if (const int e = graphed ? c.graph.reuse(cuda_detail::up_meta, raw) : c.meta_up.reuse(raw); e >= 0)
    return c.steps[static_cast<std::size_t>(e)];

  cuda_detail::step_state st;
  st.num_tokens = meta.num_tokens();
  st.num_seqs = meta.num_seqs();
  check(meta.token_seq.size() == meta.slot_mapping.size() && meta.token_kv_len.size() == meta.slot_mapping.size(),
        "attention: metadata arrays of different lengths");
  check(meta.token_window_row.empty() || meta.token_window_row.size() == meta.slot_mapping.size(),
        "attention: token_window_row must be empty or one per token");
  check(st.num_seqs >= 0, "attention: empty page_indptr");
  // q_indptr from token_seq (tokens of a sequence are contiguous, sequences in order).
  auto& qi = c.q_indptr_host;
  qi.assign(static_cast<std::size_t>(st.num_seqs) + 1, 0);
  for (const std::int32_t s : meta.token_seq) {
    check(s >= 0 && s < st.num_seqs, "attention: token of sequence ", s, " outside the batch of ", st.num_seqs);
    ++qi[static_cast<std::size_t>(s) + 1];
  }
  for (int s = 0; s < st.num_seqs; ++s) qi[static_cast<std::size_t>(s) + 1] += qi[static_cast<std::size_t>(s)];
  st.max_kv_len = 0;
  st.kv_read = 0;
  bool decode = st.num_seqs > 0;
  for (int s = 0; s < st.num_seqs; ++s) {
    const int first = qi[static_cast<std::size_t>(s)], last = qi[static_cast<std::size_t>(s) + 1];
    if (last - first != 1) decode = false;
    if (last > first) st.kv_read += meta.token_kv_len[static_cast<std::size_t>(last - 1)];
  }
  for (const std::int32_t len : meta.token_kv_len) st.max_kv_len = std::max(st.max_kv_len, len);
  st.decode = decode;
  st.has_window = false;
  for (const std::int32_t r : meta.token_window_row) st.has_window |= r >= 0;

  if (graphed) {
    // A graph bakes the split-KV plan in, so it is made for a bucket of context lengths, not the exact one.
    st.max_kv_len = context_bucket(st.max_kv_len);
    c.graph.kv_bucket = std::max(c.graph.kv_bucket, st.max_kv_len);
  }

  const section all[] = {raw[0], raw[1], raw[2], raw[3], raw[4], raw[5],
                         section{qi.data(), qi.size() * sizeof(std::int32_t)}};
  cuda_detail::staged d;
  int entry = 0;
  if (graphed) {
    d = c.graph.stage(cuda_detail::up_meta, all, &entry);
  } else {
    entry = c.meta_up.put(all, c.stream);
    for (std::size_t i = 0; i < std::size(all); ++i) d.p[i] = c.meta_up.entry(entry).device<char>(i);
  }
  st.slots = d.at<std::int64_t>(0);
  st.token_seq = d.at<std::int32_t>(1);
  st.token_kv_len = d.at<std::int32_t>(2);
  st.page_indptr = d.at<std::int32_t>(3);
  st.page_indices = d.at<std::int32_t>(4);
  st.window_rows = d.at<std::int32_t>(5);
  st.q_indptr = d.at<std::int32_t>(6);
  st.plan_key.fill(-1);
  if (!c.capturing()) c.count([&](cuda_backend_counters& k) { ++k.metadata_uploads; });
  return c.steps[static_cast<std::size_t>(entry)] = st;
}

// The decode kernel's split plan for this step's shape (planned once per shape, every layer after the first
// reuses it) and its workspace (one per nano-batch: `nano`, 0 for the whole batch).
cuda::attention_workspace decode_workspace(context& c, cuda_detail::step_state& st, const cuda::attention_params& ap,
                                          int nano) {
  const cuda::decode_params dp = cuda::as_decode_params(ap);
  const std::array<int, 6> key{ap.num_seqs, ap.max_kv_len, ap.num_q_heads, ap.kv.num_kv_heads, ap.kv.head_dim,
                               ap.kv.block_size};
  if (st.plan_key != key) {
    st.plan = cuda::plan_decode(dp);
    st.plan_key = key;
  }
  cuda::attention_workspace ws;
  ws.plan = st.plan;
  ws.bytes = cuda::decode_workspace_bytes(dp, st.plan);
  ws.data = ws.bytes ? c.decode_ws[static_cast<std::size_t>(nano)].reserve(ws.bytes, c.stream) : nullptr;
  return ws;
}

}  // namespace

int cuda_backend::nano_batch_split(int num_seqs) const { return zipage::nano_batch_split(num_seqs, ctx_->opts.overlap_min_batch); }

void cuda_backend::attention(cuda_kv_storage& kv, int layer, const attention_metadata& meta, const cuda_tensor& q,
                             const cuda_tensor& k, const cuda_tensor& v, int num_q_heads, cuda_tensor& out) const {
  attend(kv, layer, meta, q, k, v, num_q_heads, out, -1);
}

void cuda_backend::attention_async(cuda_kv_storage& kv, int layer, const attention_metadata& meta, const cuda_tensor& q,
                                   const cuda_tensor& k, const cuda_tensor& v, int num_q_heads, cuda_tensor& out,
                                   int nano) const {
  check(nano == 0 || nano == 1, "attention_async: nano-batch ", nano, " (0 or 1)");
  attend(kv, layer, meta, q, k, v, num_q_heads, out, nano);
  use(ctx_).attention_pending[static_cast<std::size_t>(nano)] = true;
}

void cuda_backend::wait_attention(int nano) const {
  context& c = use(ctx_);
  check(nano == 0 || nano == 1, "wait_attention: nano-batch ", nano, " (0 or 1)");
  c.attention_pending[static_cast<std::size_t>(nano)] = false;
  if (c.skip_launch(14, nano)) return;
  ZIPAGE_CUDA_CHECK(cudaStreamWaitEvent(c.stream, c.attention_finished[static_cast<std::size_t>(nano)], 0));
}

// nano: -1 for the whole batch on the main stream, else the nano-batch whose attention runs on the attention
// stream after the main stream's work so far (its end recorded for wait_attention).
void cuda_backend::attend(cuda_kv_storage& kv, int layer, const attention_metadata& meta, const cuda_tensor& q,
                          const cuda_tensor& k, const cuda_tensor& v, int num_q_heads, cuda_tensor& out, int nano) const {
  context& c = use(ctx_);
  const auto& s = kv.shape;
  const int d = s.head_dim;
  const int tokens = meta.num_tokens();
  check(q.dtype() == kv.dtype && k.dtype() == kv.dtype && v.dtype() == kv.dtype, "cuda_backend: the KV cache is ",
        to_string(kv.dtype), " but q/k/v are ", to_string(q.dtype()), " (build the model and the engine with the same "
        "cuda_backend: engine(model, config, policy, backend))");
  check(layer >= 0 && layer < s.num_layers, "attention: layer ", layer, " is outside the KV cache's ", s.num_layers,
        " layers (forward_context::attention's first argument; the model's config().num_layers)");
  check(num_q_heads > 0 && num_q_heads % s.num_kv_heads == 0, "attention: ", num_q_heads,
        " query heads are not a multiple of the cache's ", s.num_kv_heads, " KV heads");
  check(q.rows() == tokens && k.rows() == tokens && v.rows() == tokens, "attention (layer ", layer, "): the step has ",
        tokens, " tokens but q/k/v have ", q.rows(), "/", k.rows(), "/", v.rows(), " rows");
  const auto check_width = [&](const char* name, const cuda_tensor& x, int heads) {
    check(x.cols() == heads * d, "attention (layer ", layer, "): ", name, " has ", x.cols(), " columns, not ", heads,
          " heads x head_dim ", d, " = ", heads * d);
  };
  check_width("q", q, num_q_heads);
  check_width("k", k, s.num_kv_heads);
  check_width("v", v, s.num_kv_heads);
  access::shape(ctx_, out, tokens, q.cols(), q.dtype());
  if (tokens == 0) return;

  auto& st = prepare_step(c, meta);
  if (layer == 0 && !c.capturing())
    c.count([&](cuda_backend_counters& kc) {
      kc.attention_tokens += tokens;
      kc.kv_tokens_read += st.kv_read;
      if (nano > 0) return;  // a step's second nano-batch: the same forward pass
      ++kc.forward_steps;
      st.decode ? ++kc.decode_steps : ++kc.prefill_steps;
    });
  const std::size_t eb = kv.element_bytes();
  const std::size_t layer_off = static_cast<std::size_t>(s.layer_stride()) * static_cast<std::size_t>(layer) * eb;
  void* kc = static_cast<char*>(kv.k.data()) + layer_off;
  void* vc = static_cast<char*>(kv.v.data()) + layer_off;
  // FP8: this layer's per-(slot, KV head) scales.
  const bool fp8 = kv.fp8();
  const std::int64_t scale_off = kv.scale_layer_elements() * layer;
  std::uint16_t* ksc = fp8 ? static_cast<std::uint16_t*>(kv.k_scale.data()) + scale_off : nullptr;
  std::uint16_t* vsc = fp8 ? static_cast<std::uint16_t*>(kv.v_scale.data()) + scale_off : nullptr;
  const cudaStream_t launch_stream = nano < 0 ? c.stream : c.attention_stream;
  const cuda::cuda_stream stream = as_stream(launch_stream);
  const cuda::kernel_variant variant = c.opts.fast_kernels ? cuda::kernel_variant::tuned : cuda::kernel_variant::reference;

  // What to launch, decided before launching anything (a graph record pass launches nothing).
  void* window_rows = nullptr;
  if (st.has_window && kv.queries.data() != nullptr) {
    check(s.num_q_heads == num_q_heads, "attention: the query-window cache has ", s.num_q_heads, " heads, q has ",
          num_q_heads);
    window_rows = static_cast<char*>(kv.queries.data()) + static_cast<std::size_t>(s.query_layer_stride()) *
                                                                static_cast<std::size_t>(layer) * kv.query_element_bytes();
  }
  // This layer's paged cache as every kernel sees it (append and attention).
  cuda::paged_kv_view view;
  view.k_cache = kc;
  view.v_cache = vc;
  view.k_scale = ksc;
  view.v_scale = vsc;
  view.page_indptr = st.page_indptr;
  view.page_indices = st.page_indices;
  view.num_blocks = s.num_blocks;
  view.block_size = s.block_size;
  view.num_kv_heads = s.num_kv_heads;
  view.head_dim = d;
  cuda::attention_params ap;
  ap.q = q.data();
  ap.out = out.data();
  ap.kv = view;
  ap.token_seq = st.token_seq;
  ap.token_kv_len = st.token_kv_len;
  ap.q_indptr = st.q_indptr;
  ap.num_tokens = tokens;
  ap.num_seqs = st.num_seqs;
  ap.num_q_heads = num_q_heads;
  ap.max_kv_len = st.max_kv_len;
  ap.one_token_per_seq = st.decode;
  ap.scale = 1.0f / std::sqrt(float(d));
  ap.prefill = c.opts.prefill_kernel;
  // The kernel paged_attention() will run; the decode kernel needs its split plan and workspace first.
  const cuda::attention_kernel kind = cuda::select_attention_kernel(kv.dtype, ap, variant);
  const bool tuned_decode = kind == cuda::attention_kernel::tuned_decode;
  const cuda::attention_workspace ws =
      tuned_decode ? decode_workspace(c, st, ap, std::max(nano, 0)) : cuda::attention_workspace{};
  const cuda::decode_params dp = tuned_decode ? cuda::as_decode_params(ap) : cuda::decode_params{};
  const cuda::fp8_decode_kernel decode_kernel =
      tuned_decode ? cuda::decode_kernel_for(dp, c.opts.fp8_decode_kernel, ws.plan) : cuda::fp8_decode_kernel::split_kv;
  // Concrete, so that paged_attention() finds the same kernel without resolving automatic again (on a split plan
  // that asks the device's occupancy, once per layer).
  ap.fp8_decode = decode_kernel;
  const bool swapped = cuda::is_swapped(decode_kernel);
  cuda::append_kv_params append;
  append.kv = view;
  append.k = k.data();
  append.v = v.data();
  append.slots = st.slots;
  append.num_tokens = tokens;
  // A swapped decode writes the new K/V itself where the tuned FP8 append would run (the same bytes): one launch
  // fewer per layer. (Token i is sequence i in a decode step.)
  const bool fuse_append =
      swapped && c.opts.fuse_decode_append && cuda::append_kv_runs_tuned_fp8(kv.dtype, append, variant);
  if (fuse_append) ap.append = {append.k, append.v, append.slots, append.k_stride(), append.v_stride()};
  // The FP8 o projection's input, written by the decode kernel's epilogue instead of a quantisation launch. Not for
  // a nano-batch: the two nano-batches' outputs would take turns in the one activation workspace.
  if (nano < 0 && tuned_decode) {
    const cuda::fp8_copy copy = cuda_detail::fp8_copy_for(c, out, variant, 0, {out.data()});
    // The swapped kernel finishes every output row in one CTA whatever the plan says.
    if (copy.wanted() && (swapped || cuda::decode_writes_fp8_copy(dp, ws.plan))) ap.out_fp8 = copy;
  }
  const bool skip = c.skip_launch(10, layer, kc, vc, q.data(), k.data(), v.data(), out.data(), tokens, st.num_seqs, st.max_kv_len,
                    st.slots, st.token_seq, st.token_kv_len, st.page_indptr, st.page_indices, st.q_indptr,
                    st.window_rows, window_rows, variant, kind, st.plan.num_splits, st.plan.chunk_tokens,
                    st.plan.stages, ws.data, ws.bytes, num_q_heads, s.num_kv_heads, d, s.block_size, kv.dtype, ksc,
                    vsc, nano, ap.out_fp8.codes, swapped);
  cuda_detail::fp8_copy_written(c, out, ap.out_fp8);
  if (swapped) c.count([](cuda_backend_counters& t) { ++t.swapped_decodes; });
  if (skip) return;
  if (nano >= 0) {
    const auto i = static_cast<std::size_t>(nano);
    ZIPAGE_CUDA_CHECK(cudaEventRecord(c.attention_launched[i], c.stream));
    ZIPAGE_CUDA_CHECK(cudaStreamWaitEvent(c.attention_stream, c.attention_launched[i], 0));
  }

  // Timed (op_timing) on the main stream only: a nano-batch's attention runs on a stream of its own.
  auto timed_on_main = [&](const char* name) {
    return nano < 0 ? time_op(c, name) : cuda_detail::op_scope{};
  };
  if (!fuse_append) {
    const auto timed = timed_on_main("append_kv");
    cuda::append_kv(kv.dtype, append, variant, stream);  // FP8 (scales set): the quantising kernel
  }
  if (window_rows) {
    const auto timed = timed_on_main("record_queries");
    cuda::record_queries(kv.dtype, window_rows, st.window_rows, q.data(), tokens, q.cols(), stream);
  }
  const char* op_name = !st.decode ? "attention prefill" : swapped ? "attention decode (swapped)" : "attention decode";
  const auto timed = timed_on_main(!ap.out_fp8.wanted() ? op_name
                                   : swapped            ? "attention decode (swapped) + fp8 quantize"
                                                        : "attention decode + fp8 quantize");
  cuda::paged_attention(kv.dtype, ap, variant, ws, stream);
  if (nano >= 0)
    ZIPAGE_CUDA_CHECK(cudaEventRecord(c.attention_finished[static_cast<std::size_t>(nano)], c.attention_stream));
}

}  // namespace zipage
