#pragma once
// Private to src/cuda/backend/ (not installed): the device context shared by every copy of a
// zipage::cuda_backend (streams, cuBLASLt, staging buffers, the step's attention state, sampling and
// compression scratch, counters, CUDA-graph state), the friend `access` that shapes tensors and buffers,
// and the small helpers the backend's source files share. The backend's members are defined by
// responsibility in src/cuda/backend/*.cu (listed in src/CMakeLists.txt).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "../launch_checks.hpp"
#include "graph_state.cuh"
#include "staging.cuh"
#include "zipage/backend/cuda/common.cuh"
#include "zipage/backend/cuda/cuda_backend.hpp"
#include "zipage/backend/cuda/attention.hpp"  // decode_plan
#include "zipage/backend/cuda/fp8_gemm.hpp"    // gemm_sm90_max_split_tiles
#include "zipage/sampling/logits_processors.hpp"
#include "zipage/sampling/sampler.hpp"

#define ZIPAGE_LT_CHECK(expr)                                                                          \
  do {                                                                                                 \
    const cublasStatus_t zipage_lt_status_ = (expr);                                                   \
    if (zipage_lt_status_ != CUBLAS_STATUS_SUCCESS)                                                    \
      ::zipage::fail("cuBLASLt error ", static_cast<int>(zipage_lt_status_), " in ", #expr, " at ", __FILE__, ":", \
                     __LINE__);                                                                        \
  } while (0)

namespace zipage {

namespace cuda_detail {

using clock = std::chrono::steady_clock;
inline double seconds_since(clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); }

struct gemm_key {
  int m, n, k;
  cuda_dtype t;
  int align;
  int sms = 0;  // cuBLASLt's SM count target (0: all SMs)
  bool operator==(const gemm_key&) const = default;
};
struct gemm_key_hash {
  std::size_t operator()(const gemm_key& g) const {
    std::size_t h = static_cast<std::size_t>(g.m);
    h = h * 1000003u ^ static_cast<std::size_t>(g.n);
    h = h * 1000003u ^ static_cast<std::size_t>(g.k);
    h = h * 31u ^ static_cast<std::size_t>(g.t);
    h = h * 31u ^ static_cast<std::size_t>(g.sms);
    return h * 31u ^ static_cast<std::size_t>(g.align);
  }
};

struct gemm_plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
  gemm_plan() = default;
  gemm_plan(const gemm_plan&) = delete;
  gemm_plan& operator=(const gemm_plan&) = delete;
  ~gemm_plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

struct context;
// Asks cuBLASLt's heuristic for an algorithm for `plan` (descriptor and layouts set by the caller; key.sms > 0
// restricts it to that many SMs) within the backend's GEMM workspace and, when min_alignment > 0, for operands aligned to that many bytes; stores the plan
// under `key` in c.gemms (ok = false when there is none, so the caller decides what a refused shape means).
const gemm_plan& cache_gemm_plan(context& c, const gemm_key& key, std::unique_ptr<gemm_plan> plan,
                                 std::uint32_t min_alignment);

// What the step's attention metadata became on the device (shared by every layer of the step).
struct step_state {
  bool decode = false;  // every sequence has exactly one new token
  int num_tokens = 0;
  int num_seqs = 0;
  int max_kv_len = 0;
  std::int64_t kv_read = 0;  // sum over sequences of the KV length attended
  bool has_window = false;
  const std::int64_t* slots = nullptr;
  const std::int32_t* token_seq = nullptr;
  const std::int32_t* token_kv_len = nullptr;
  const std::int32_t* page_indptr = nullptr;
  const std::int32_t* page_indices = nullptr;
  const std::int32_t* window_rows = nullptr;
  const std::int32_t* q_indptr = nullptr;
  // decode plan for (num_seqs, max_kv_len, heads, head_dim, block_size)
  cuda::decode_plan plan{};
  std::array<int, 6> plan_key{-1, -1, -1, -1, -1, -1};
};

// The streams, created first and destroyed last (after every member that frees in stream order).
struct stream_set {
  cudaStream_t main = nullptr;
  cudaStream_t side = nullptr;
  cudaStream_t attention = nullptr;
  explicit stream_set(int device) {
    ZIPAGE_CUDA_CHECK(cudaSetDevice(device));
    ZIPAGE_CUDA_CHECK(cudaStreamCreateWithFlags(&main, cudaStreamNonBlocking));
    ZIPAGE_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    ZIPAGE_CUDA_CHECK(cudaStreamCreateWithFlags(&attention, cudaStreamNonBlocking));
  }
  stream_set(const stream_set&) = delete;
  stream_set& operator=(const stream_set&) = delete;
  ~stream_set() {
    for (cudaStream_t s : {main, side, attention}) cudaStreamSynchronize(s);
    for (cudaStream_t s : {main, side, attention}) cudaStreamDestroy(s);
  }
};

struct context {
  cuda_backend_options opts;
  stream_set streams;
  cudaStream_t stream = streams.main;  // every op of the engine's thread
  cudaStream_t side = streams.side;    // compression hooks (worker thread)
  // Nano-batches' attention (attention_async, engine thread): joined to the main stream by events, per nano-batch
  // `launched` (the main stream's work before the attention) and `finished` (the attention).
  cudaStream_t attention_stream = streams.attention;
  std::array<cudaEvent_t, 2> attention_launched{}, attention_finished{};
  // Nano-batches whose attention was launched and not yet waited for: GEMMs issued meanwhile run beside it and
  // target opts.overlap_gemm_sms SMs.
  std::array<bool, 2> attention_pending{};
  [[nodiscard]] int gemm_sms() const {
    return attention_pending[0] || attention_pending[1] ? std::max(0, opts.overlap_gemm_sms) : 0;
  }
  cublasLtHandle_t lt = nullptr;
  void* lt_workspace = nullptr;
  // fp8::gemm_sm90's split-K: its partials in lt_workspace (the main stream orders it against cuBLASLt's use), its
  // per-tile counters here (zeroed once; every launch leaves them zero).
  int* sm90_counters = nullptr;
  std::unordered_map<gemm_key, std::unique_ptr<gemm_plan>, gemm_key_hash> gemms;

  // Two entries each, one per nano-batch (upload_cache); steps[i] is what meta_up's entry i became.
  upload_cache ids_up, pos_up, rows_up, meta_up;
  uploader misc_up;
  std::vector<std::int32_t> q_indptr_host;
  std::array<step_state, 2> steps;
  std::array<device_scratch, 2> decode_ws;  // split-KV workspace per nano-batch (the whole batch: 0)
  device_scratch to_host_dev;
  pinned_buffer to_host_pinned;
  std::unordered_map<std::string, double*> rope_tables;

  std::mutex side_mu;
  uploader side_up;
  device_scratch side_dev;
  pinned_buffer side_host;
  device_scratch compress_ws;  // compress_on_device (side stream, under side_mu)
  struct {
    std::vector<std::int32_t> indptr, indices, lens, slots;
    std::vector<std::uint8_t> first;
  } compress_staging;  // compress_on_device's batch tables, before their upload (under side_mu)

  // sample() (engine thread, main stream): per-row arrays staged on the host, one pinned upload, scratch.
  uploader sample_up;
  device_scratch sample_ws, sample_out, sample_rows;
  pinned_buffer sample_host;
  std::vector<float> s_temp, s_top_p, s_min_p, s_penalty, s_frequency, s_presence;
  std::vector<std::int32_t> s_top_k, s_indptr, s_ids, s_rows, s_top;
  std::vector<std::uint64_t> s_seed, s_step;
  logit_edit_csr s_edits;  // logits processors, as the kernel's CSR
  logit_edits s_edit;      // one row's, reused
  sampler host_sampler;  // device_sampling = false

  mutable std::mutex counters_mu;
  cuda_backend_counters counters;
  std::array<cudaEvent_t, 32> chunk_events{};  // to_host's pipelined copy

  graph_state graph;  // run_decode_graph (engine thread, main stream)

  // FP8 linear layers (fp8_linear.cu): the activations' codes and scales of the current linear() (engine thread,
  // main stream; grown outside stream capture only), and how many linear weights became FP8 or were kept.
  device_scratch fp8_ws;
  int fp8_weights = 0, fp8_weights_kept = 0;  // under counters_mu
  int fp8_self_test = -1;  // the FP8 GEMM's check against the CPU reference: -1 not run, 0 failed, 1 passed
  bool fp8_weights_in_use = false;  // a linear weight became e4m3 (prepare_linear_weight, stack_rows): FP8 copies pay
  // Ops run so far (skip_launch counts them; so do host writes into new tensors): what fp8_ws holds is known to be
  // the quantisation of `fp8_ws_holds` only while no op has run since.
  std::uint64_t launch_seq = 0;
  struct quantized_rows {
    const void* x = nullptr;  // the bf16 activations [rows][cols] whose codes and scales fp8_ws holds
    int rows = 0, cols = 0;
    const void* codes = nullptr;  // fp8_ws's codes when they were written (the workspace may move)
    std::uint64_t seq = 0;        // launch_seq just after the op that wrote them
    [[nodiscard]] bool holds(const void* x_, int rows_, int cols_, const void* codes_, std::uint64_t now) const {
      return x != nullptr && x == x_ && rows == rows_ && cols == cols_ && codes == codes_ && seq == now;
    }
  } fp8_ws_holds;

  // op_timing: the event pairs of timed ops not yet read by take_op_times (engine thread, main stream), and
  // events to reuse.
  struct timed_op {
    std::string name;
    cudaEvent_t start, stop;
  };
  std::vector<timed_op> timed_ops;
  std::vector<cudaEvent_t> spare_events;
  cudaEvent_t timing_event() {
    cudaEvent_t e = nullptr;
    if (spare_events.empty()) {
      ZIPAGE_CUDA_CHECK(cudaEventCreate(&e));
    } else {
      e = spare_events.back();
      spare_events.pop_back();
    }
    return e;
  }

  explicit context(const cuda_backend_options& o) : opts(o), streams(o.device) {
    activate();
    cudaMemPool_t pool = nullptr;
    ZIPAGE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, opts.device));
    std::uint64_t keep = UINT64_MAX;  // freed pool memory stays cached: steady-state steps never call the driver
    ZIPAGE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    ZIPAGE_LT_CHECK(cublasLtCreate(&lt));
    for (auto& e : chunk_events) ZIPAGE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (auto* events : {&attention_launched, &attention_finished})
      for (auto& e : *events) ZIPAGE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    if (opts.gemm_workspace_bytes) ZIPAGE_CUDA_CHECK(cudaMalloc(&lt_workspace, opts.gemm_workspace_bytes));
    const std::size_t counter_bytes = sizeof(int) * cuda::fp8::gemm_sm90_max_split_tiles;
    ZIPAGE_CUDA_CHECK(cudaMalloc(&sm90_counters, counter_bytes));
    // On the main stream, where every launch that reads them is ordered after it (the legacy stream is not).
    ZIPAGE_CUDA_CHECK(cudaMemsetAsync(sm90_counters, 0, counter_bytes, stream));
  }
  context(const context&) = delete;
  context& operator=(const context&) = delete;
  ~context() {
    cudaSetDevice(opts.device);
    cudaStreamSynchronize(stream);
    cudaStreamSynchronize(side);
    cudaStreamSynchronize(attention_stream);
    gemms.clear();
    for (auto& [key, p] : rope_tables) cudaFree(p);
    if (lt_workspace) cudaFree(lt_workspace);
    if (sm90_counters) cudaFree(sm90_counters);
    if (lt) cublasLtDestroy(lt);
    for (auto& e : chunk_events)
      if (e) cudaEventDestroy(e);
    for (auto* events : {&attention_launched, &attention_finished})
      for (auto& e : *events)
        if (e) cudaEventDestroy(e);
    for (const timed_op& t : timed_ops) {
      cudaEventDestroy(t.start);
      cudaEventDestroy(t.stop);
    }
    for (cudaEvent_t e : spare_events) cudaEventDestroy(e);
    // The scratch buffers and uploaders free in stream order as members; `streams` goes last.
  }

  void activate() const {
    thread_local int current = -1;
    if (current != opts.device) {
      ZIPAGE_CUDA_CHECK(cudaSetDevice(opts.device));
      current = opts.device;
    }
  }
  [[nodiscard]] bool fast_bf16() const { return opts.dtype == cuda_dtype::bf16 && opts.fast_kernels; }

  // Called by every op just before it launches: outside run_decode_graph it does nothing; in a record or
  // capture pass it folds the launch's arguments into the pass's signature, and in a record pass it
  // tells the op to skip the launch (the pass only stages inputs and sizes outputs).
  template <class... A>
  bool skip_launch(int op, const A&... args) {
    ++launch_seq;
    if (graph.phase == graph_phase::off) return false;
    graph.note(op, args...);
    return graph.phase == graph_phase::record;
  }
  [[nodiscard]] bool capturing() const { return graph.phase == graph_phase::capture; }

  // A small host-input upload: through the uploader (skipped when equal to its last upload) outside a
  // graph pass, into the graph arena inside one.
  staged upload(upload_cache& u, int who, std::span<const section> secs) {
    if (graph.phase != graph_phase::off) return graph.stage(who, secs);
    const uploader& e = u.entry(u.upload(secs, stream));
    staged out;
    for (std::size_t i = 0; i < secs.size(); ++i) out.p[i] = e.device<char>(i);
    return out;
  }

  template <class F>
  void count(F&& f) {
    std::lock_guard lock(counters_mu);
    f(counters);
  }
};

// An op's timing scope (cuda_backend_options::op_timing): records a start event on the main stream when made and
// a stop event when it ends. Inert when op timing is off or a graph pass runs. Make it with time_op just before
// the op's launches.
class op_scope {
 public:
  op_scope() = default;
  op_scope(context& c, std::string name) : c_(&c), name_(std::move(name)), start_(c.timing_event()) {
    ZIPAGE_CUDA_CHECK(cudaEventRecord(start_, c.stream));
  }
  op_scope(const op_scope&) = delete;
  op_scope& operator=(const op_scope&) = delete;
  ~op_scope() {
    if (c_ == nullptr) return;
    cudaEvent_t stop = c_->timing_event();
    cudaEventRecord(stop, c_->stream);
    c_->timed_ops.push_back({std::move(name_), start_, stop});
  }

 private:
  context* c_ = nullptr;
  std::string name_;
  cudaEvent_t start_ = nullptr;
};

// `name` is an op's fixed name, or a function making it, called only when the op is timed (it may format shapes).
template <class Name>
[[nodiscard]] op_scope time_op(context& c, Name&& name) {
  if (!c.opts.op_timing || c.graph.phase != graph_phase::off) return {};
  if constexpr (std::is_invocable_v<Name>)
    return op_scope(c, name());
  else
    return op_scope(c, std::string(name));
}

struct access {
  static cuda_buffer& buf(cuda_tensor& t) { return t.buf_; }
  static const cuda_buffer& buf(const cuda_tensor& t) { return t.buf_; }

  static void reserve(const std::shared_ptr<context>& ctx, cuda_buffer& b, std::size_t bytes, bool pooled = true) {
    if (b.ptr_ != nullptr && b.capacity_ >= bytes && b.ctx_ == ctx) return;
    // The record pass sized every tensor the capture pass touches.
    check(!ctx->capturing(), "cuda graphs: a tensor grew during stream capture");
    // A buffer that moves in a record pass (one tensor reused at two sizes in a step: llama_model's fused
    // projection output) leaves its old address in the launches signed before: the pass runs again.
    if (b.ptr_ != nullptr && ctx->graph.phase == graph_phase::record) ctx->graph.arena_moved = true;
    release(b);
    if (bytes == 0) return;
    ctx->activate();
    void* p = nullptr;
    if (pooled)
      ZIPAGE_CUDA_CHECK(cudaMallocAsync(&p, bytes, ctx->stream));
    else
      ZIPAGE_CUDA_CHECK(cudaMalloc(&p, bytes));
    b.ctx_ = ctx;
    b.ptr_ = p;
    b.capacity_ = bytes;
    b.pooled_ = pooled;
  }
  static void release(cuda_buffer& b) noexcept {
    if (b.ptr_ != nullptr) {
      if (b.pooled_)
        cudaFreeAsync(b.ptr_, b.ctx_->stream);
      else
        cudaFree(b.ptr_);
    }
    b.ptr_ = nullptr;
    b.capacity_ = 0;
    b.ctx_.reset();
  }
  static cuda_buffer& scale(cuda_tensor& t) { return t.scale_; }
  static const cuda_buffer& scale(const cuda_tensor& t) { return t.scale_; }
  // Makes `t` an FP8 linear weight [rows][cols]: E4M3 codes and their block scales (cuda_tensor::scales()).
  static void set_e4m3(cuda_tensor& t, cuda_buffer&& codes, cuda_buffer&& scales, int rows, int cols) {
    t.buf_ = std::move(codes);
    t.scale_ = std::move(scales);
    t.rows_ = rows;
    t.cols_ = cols;
    t.dtype_ = cuda_dtype::e4m3;
  }
  // Gives `t` the shape [rows][cols] of dtype dt, growing its buffer when needed (contents undefined).
  // Every op sizes its output with its input's dtype here, so this is where an op that cannot take an FP8
  // weight (anything but linear()'s weight operand) refuses it.
  static void shape(const std::shared_ptr<context>& ctx, cuda_tensor& t, int rows, int cols, cuda_dtype dt) {
    check(dt != cuda_dtype::e4m3, "cuda_backend: an e4m3 tensor (an FP8 linear weight) can only be the weight of "
          "linear(); this op takes bf16 or f32 tensors");
    check(rows >= 0 && cols >= 0, "cuda_backend: negative tensor shape ", rows, "x", cols);
    reserve(ctx, t.buf_, static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols) * dtype_bytes(dt));
    t.rows_ = rows;
    t.cols_ = cols;
    t.dtype_ = dt;
  }
  static std::shared_ptr<context> owner(const cuda_tensor& t) { return t.buf_.ctx_; }
};

inline cuda::cuda_stream as_stream(cudaStream_t s) { return reinterpret_cast<cuda::cuda_stream>(s); }

using cuda::detail::aligned16;
using cuda::detail::power_of_two;

inline context& use(const std::shared_ptr<context>& p) {
  p->activate();
  return *p;
}

// The pages of a request hold kv_len tokens and are all inside the pool (compression hooks, swapping).
inline void check_pages(const kv_cache_shape& s, std::span<const block_id> pages, int kv_len) {
  check(kv_len >= 0 && static_cast<std::int64_t>(pages.size()) * s.block_size >= kv_len, "compression: ", pages.size(),
        " pages cannot hold ", kv_len, " tokens");
  for (const block_id b : pages) check(b >= 0 && b < s.num_blocks, "compression: block ", b, " outside the pool");
}

}  // namespace cuda_detail

using cuda_detail::access;
using cuda_detail::as_stream;
using cuda_detail::aligned16;
using cuda_detail::check_pages;
using cuda_detail::context;
using cuda_detail::power_of_two;
using cuda_detail::section;
using cuda_detail::time_op;
using cuda_detail::use;

}  // namespace zipage
