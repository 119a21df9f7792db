#pragma once
// zipage::cuda_backend: the engine's backend on one CUDA device, so that
// `engine<llama_model<cuda_backend>, Policy>` runs on the GPU. It mirrors cpu_backend op for op.
//
//  * Tensors are device matrices [rows][cols] (row-major) in bf16 (default: weights, activations and
//    KV) or fp32 (`cuda_backend_options::dtype`, so the fp32 engine can be compared token for token with
//    the CPU reference). A tensor owns its memory through a grow-only buffer taken from the device's
//    stream-ordered memory pool: the model's activation tensors are members, so steady-state steps
//    allocate nothing from the driver.
//  * linear: cuBLASLt (bf16 in, fp32 accumulate; fp32 mode: fp32 GEMM, no TF32), or a fixed-order GEMM
//    whose rows do not depend on the batch (`batch_invariant`, fp32 parity tests). FP8 weights
//    (`weight_dtype`, docs/fp8.md "FP8 weights"): E4M3 codes + 128x128 block scales made at load by
//    prepare_linear_weight; linear() quantises the bf16 activations per token and 128-column group into a
//    workspace and runs cuBLASLt's block-scaled FP8 GEMM (bf16 out).
//  * attention: the step's host attention_metadata is packed, compared with the last step's, and copied
//    to the device once per step (one pinned staging buffer, one cudaMemcpyAsync); every layer reuses
//    it. K/V are appended by slot, window queries recorded, then the tuned bf16 prefill kernel (a step
//    with a sequence of several new tokens) or split-KV decode kernel runs (head_dim 64/128), otherwise
//    a generic kernel (any head_dim, fp32).
//  * Sampling: sample() draws the step's tokens on the device (cuda::sample_tokens, bit-identical to the
//    CPU sampler on the same logits): per-row parameters, seeds and steps (and the repetition-penalty
//    context as CSR, only when some row has a penalty != 1) go up in one pinned copy, the tokens come back
//    in one small copy; the logits never leave the device (log-probabilities are computed beside the draw).
//    vLLM's logits processors (logit_bias, allowed_token_ids, bad_words, min_tokens) go up as each row's
//    zipage::logit_edits (CSR). The engine uses it whenever no row of the step has forced tokens.
//  * FP8 KV cache (cuda_backend_options::kv_dtype = fp8_e4m3, docs/fp8.md): E4M3 codes + per (token, KV head)
//    bf16 scales (core/kv_scale.hpp), written by append_kv_fp8, read by the same decode / prefill /
//    generic kernels (tiles dequantised in registers), by gather_keys and by device compression; compaction,
//    copy and swap move the scales with the codes; the engine's memory plan counts them (kv_scale_bytes()).
//  * Compression: for a recipe-scored policy (every built-in, and a user's recipe_policy) on a bf16 cache
//    (bf16 compute; K/V bf16 or FP8),
//    compress_on_device() runs the whole step for a batch of requests on the device (cuda::compress:
//    the recipe's window attention + history into the score cache, pooling, redundancy, top-keep
//    selection, in-place compaction), so nothing crosses to the host. Otherwise (fp32, a policy with its
//    own score(), head_dim other than 64/128, `device_compression = false`) the engine's generic path
//    runs: gather_keys / gather_scores / gather_window_queries copy to host vectors in the CPU layout,
//    the compressor scores on the host, apply_compaction is one kernel per plan.
//  * CUDA graphs for decode steps: run_decode_graph() runs the model's forward for a decode batch padded
//    to a bucketed size (decode_graph_batch()) from a CUDA graph captured for that (batch, context bucket),
//    replaying it once the step's inputs are in place. The forward's host code runs first in a "record"
//    pass that launches nothing: every op checks its arguments, sizes its output, stages its small
//    host inputs (ids, positions, page tables) into one pinned arena at offsets fixed by the call order,
//    and folds every kernel argument (pointers, sizes, the split-KV plan for the context bucket) into a
//    64-bit signature. One copy moves the arena to the device; the graph cached under the key replays when
//    its signature matches, otherwise the forward runs again under stream capture (a new graph, or an
//    in-place update of the old one). So a graph is never replayed with arguments the eager forward would
//    not use: a grown activation tensor, a new page-table size class or another plan re-captures.
//  * copy_block, swap_out and swap_in are one batched-copy kernel each (swap blobs in pinned host memory,
//    read and written by the kernel directly).
//
// Threads: the engine's compression worker calls the gather/compaction/compress hooks from its own thread; they
// run on a second stream under a mutex and finish (synchronise) before returning. Everything else runs
// on the backend's main stream from the engine's thread. A backend is a cheap handle: copies share the
// device context (stream, cuBLASLt handle, staging buffers).
//
// No CUDA header is included here; the implementation is src/cuda/cuda_backend.cu.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zipage/backend/cuda/dtype.hpp"
#include "zipage/backend/cuda/kernel_variant.hpp"
#include "zipage/compression/compaction_plan.hpp"
#include "zipage/compression/compression_job.hpp"
#include "zipage/core/error.hpp"
#include "zipage/core/kv_cache_dtype.hpp"
#include "zipage/core/types.hpp"
#include "zipage/core/weight_dtype.hpp"
#include "zipage/kv/paged_kv.hpp"
#include "zipage/model/concepts.hpp"
#include "zipage/model/model_config.hpp"
#include "zipage/model/qkv_epilogue.hpp"
#include "zipage/policy/score_context.hpp"
#include "zipage/policy/score_recipe.hpp"
#include "zipage/request/sequence.hpp"

namespace zipage {

struct cuda_backend_options {
  cuda_dtype dtype = cuda_dtype::bf16;  // weights, activations, KV cache and query-window cache
  // The K/V storage (vLLM's --kv-cache-dtype): auto = `dtype`; fp8_e4m3 = E4M3 codes with one bf16 scale
  // per (token, KV head) and side, written by the append kernel and dequantised by attention and key
  // gathering (docs/fp8.md; the CPU reference is cpu_fp8kv_backend). The query-window cache stays in `dtype`,
  // the score cache fp32. FP8 needs head_dim % 4 == 0 and block_size x kv_heads even (checked by allocate_kv).
  kv_cache_dtype kv_dtype = kv_cache_dtype::auto_;
  // The transformer blocks' linear weights (vLLM's --quantization; docs/fp8.md "FP8 weights"): auto_ = the
  // compute dtype except for an FP8 checkpoint, compute = always `dtype`, fp8_e4m3 = E4M3 codes + 128x128
  // block scales, quantised at load by prepare_linear_weight / linear_weight_from_host, multiplied by
  // cuBLASLt's block-scaled FP8 GEMM with activations quantised per token and 128-column group on the fly.
  // FP8 needs bf16 compute; a weight whose shape cuBLASLt cannot take stays in `dtype` (counted).
  zipage::weight_dtype weight_dtype = zipage::weight_dtype::auto_;
  int device = 0;
  // fp32 only: a fixed-order GEMM instead of cuBLASLt, so each row's result is the same whatever the
  // batch (cuBLASLt may pick another kernel, and another summation order, for another batch size).
  bool batch_invariant = false;
  // Ask every op for its tuned bf16 kernel (kernel_variant::tuned; ops.hpp, attention.hpp), used where shapes allow.
  bool fast_kernels = true;
  // Draw tokens on the device (sample()); false: sample() copies the logits to the host and runs the CPU
  // sampler there (same tokens, for comparisons).
  bool device_sampling = true;
  // Compress requests of recipe-scored policies on the device (compress_on_device(); bf16 compute dtype, bf16 or
  // FP8 cache); false: decline, so the engine's host path (gather, score on the host, apply_compaction) runs.
  bool device_compression = true;
  std::size_t gemm_workspace_bytes = std::size_t{32} << 20;
  // Decode steps through CUDA graphs (run_decode_graph), for batches up to max_graph_batch sequences.
  bool cuda_graphs = true;
  int max_graph_batch = 1024;
  // Captured graphs kept (one per (padded batch, context bucket)); beyond it the cache starts afresh.
  int max_graphs = 256;
  // Decode steps of at least this many sequences run as two nano-batches whose attention overlaps the other's
  // GEMMs (attention_async on a stream of its own; model/forward_context.hpp); 0: never. Off by default: on the
  // H200 at the Qwen3-8B shape with compression the split is 0.88-1.00x the whole batch's speed, because decode
  // attention needs nearly every SM to reach HBM bandwidth (docs/architecture.md "Overlap inside a decode step").
  int overlap_min_batch = 0;
  // GEMMs issued while a nano-batch's attention runs ask cuBLASLt for this many SMs (its SM count target), leaving
  // the others to the attention; 0: all SMs.
  int overlap_gemm_sms = 0;
  // Per-op GPU time, for finding where a step's time goes (take_op_times; zipage-bench --op-timing): every op launched
  // outside a CUDA graph pass records an event pair around its kernels on the main stream. Off by default: two event
  // records per op, and a graph's ops are not timed one by one.
  bool op_timing = false;
  // With FP8 linear weights: add_rms_norm, swiglu and silu_mul also write their output's FP8 codes and scales (one
  // kernel), and a linear() reading that output next uses them instead of launching its own quantisation; a linear()
  // on the same input as the one before it (unfused q, k, v) reuses that one's. The same bytes either way; false: for
  // an A/B (zipage-bench --no-fused-quantize).
  bool fuse_fp8_quantize = true;
  // With an FP8 KV cache, where a decode step's attention runs a swapped kernel: that kernel writes each sequence's
  // new K/V into the cache itself (cuda::decode_append) instead of an append_kv launch before it. The same bytes
  // either way (zipage-bench --fused-append). Off: on the H100 (2026-12-06 evening) its tests pass and the engine's
  // steady state did not move (+0.15% tok/s, the same mJ per token in two interleaved pairs: a power-capped step
  // does not gain from one launch fewer per layer); docs/architecture.md, "The swapped kernels append ...".
  bool fuse_decode_append = false;
  // With an FP8 KV cache: which decode attention kernel (cuda::fp8_decode_kernel; zipage-bench --fp8-decode-kernel).
  // automatic: the swapped-operand kernel (half the MMAs, 5-6% more tokens per second and per joule at the
  // compressed steady state, where steps are power-capped) where it fits and the batch fills the GPU without
  // splitting (cuda::resolve_fp8_decode_kernel), else the split-KV kernel (docs/architecture.md, "Decode attention
  // and the power cap"). swapped needs kv_dtype fp8_e4m3 (checked by validate()), head_dim 128 and at most 8 query
  // heads per KV head (checked by allocate_kv: a model it does not fit is refused, not run on split-KV).
  cuda::fp8_decode_kernel fp8_decode_kernel = cuda::fp8_decode_kernel::automatic;
  // The prefill attention kernel (cuda::prefill_kernel; zipage-bench --prefill-kernel). The wgmma ones need bf16 K/V
  // (dtype bf16, kv_dtype auto_), head_dim 128 (checked by allocate_kv) and a device that runs them
  // (cuda::wgmma_prefill_available(), checked by the constructor).
  cuda::prefill_kernel prefill_kernel = cuda::prefill_kernel::automatic;
  // With FP8 linear weights: which GEMM runs them (cuda::fp8_gemm_kernel; zipage-bench --fp8-gemm-kernel). sm90 needs
  // a device that runs it (cuda::fp8::gemm_sm90_available(), checked by the constructor); a weight whose shape it
  // does not take (n or k not a multiple of 128) runs cuBLASLt's.
  cuda::fp8_gemm_kernel fp8_gemm_kernel = cuda::fp8_gemm_kernel::automatic;

  [[nodiscard]] bool wgmma_prefill() const { return cuda::is_wgmma(prefill_kernel); }

  // Every field, before the backend touches a device (the constructor calls it): the first wrong one is
  // named, instead of a CUDA error later or an option silently ignored.
  void validate() const {
    check(dtype == cuda_dtype::f32 || dtype == cuda_dtype::bf16, "cuda_backend_options::dtype must be f32 or bf16 (the ",
          "compute dtype), got ", to_string(dtype), "; FP8 storage is kv_dtype / weight_dtype");
    check(kv_dtype == kv_cache_dtype::auto_ || kv_dtype == kv_cache_dtype::fp8_e4m3,
          "cuda_backend_options::kv_dtype: not a kv_cache_dtype (", static_cast<int>(kv_dtype), ")");
    check(weight_dtype == zipage::weight_dtype::auto_ || weight_dtype == zipage::weight_dtype::compute ||
              weight_dtype == zipage::weight_dtype::fp8_e4m3,
          "cuda_backend_options::weight_dtype: not a weight_dtype (", static_cast<int>(weight_dtype), ")");
    check(weight_dtype != zipage::weight_dtype::fp8_e4m3 || dtype == cuda_dtype::bf16,
          "cuda_backend_options::weight_dtype fp8_e4m3 needs dtype bf16 (the FP8 GEMM writes bf16), got dtype ",
          to_string(dtype));
    check(device >= 0, "cuda_backend_options::device must be a device index (>= 0), got ", device);
    check(!batch_invariant || dtype == cuda_dtype::f32,
          "cuda_backend_options::batch_invariant needs dtype f32 (the fixed-order GEMM is fp32 only), got dtype ",
          to_string(dtype));
    check(max_graph_batch >= 1, "cuda_backend_options::max_graph_batch must be >= 1, got ", max_graph_batch,
          " (cuda_graphs = false turns graphs off)");
    check(max_graphs >= 1, "cuda_backend_options::max_graphs must be >= 1, got ", max_graphs);
    check(overlap_min_batch >= 0, "cuda_backend_options::overlap_min_batch must be >= 0 (0: no nano-batches), got ",
          overlap_min_batch);
    check(overlap_gemm_sms >= 0, "cuda_backend_options::overlap_gemm_sms must be >= 0 (0: every SM), got ",
          overlap_gemm_sms);
    check(cuda::is_fp8_decode_kernel(fp8_decode_kernel), "cuda_backend_options::fp8_decode_kernel: not a ",
          "cuda::fp8_decode_kernel (", static_cast<int>(fp8_decode_kernel), ")");
    check(!cuda::is_swapped(fp8_decode_kernel) || kv_dtype == kv_cache_dtype::fp8_e4m3,
          "cuda_backend_options::fp8_decode_kernel ", cuda::to_string(fp8_decode_kernel), " is a decode kernel for an ",
          "FP8 KV cache: it needs kv_dtype fp8_e4m3");
    check(cuda::is_fp8_gemm_kernel(fp8_gemm_kernel), "cuda_backend_options::fp8_gemm_kernel: not a ",
          "cuda::fp8_gemm_kernel (", static_cast<int>(fp8_gemm_kernel), ")");
    check(cuda::is_prefill_kernel(prefill_kernel),
          "cuda_backend_options::prefill_kernel: not a cuda::prefill_kernel (", static_cast<int>(prefill_kernel), ")");
    check(!wgmma_prefill() || (dtype == cuda_dtype::bf16 && kv_dtype == kv_cache_dtype::auto_),
          "cuda_backend_options::prefill_kernel ", cuda::to_string(prefill_kernel),
          " reads bf16 K/V: it needs dtype bf16 and kv_dtype auto_ (got ", to_string(dtype), ", ",
          kv_dtype == kv_cache_dtype::fp8_e4m3 ? "fp8_e4m3" : "auto_", ")");
  }
};

namespace cuda_detail {
struct context;
struct access;
}  // namespace cuda_detail

// Device memory from the backend's pool (or a plain cudaMalloc for big one-off allocations), freed in
// stream order. Grow-only: reserve() keeps the allocation when it is large enough.
class cuda_buffer {
 public:
  cuda_buffer() = default;
  ~cuda_buffer();
  cuda_buffer(const cuda_buffer&) = delete;
  cuda_buffer& operator=(const cuda_buffer&) = delete;
  cuda_buffer(cuda_buffer&& o) noexcept { swap(o); }
  cuda_buffer& operator=(cuda_buffer&& o) noexcept {
    cuda_buffer(std::move(o)).swap(*this);
    return *this;
  }
  void swap(cuda_buffer& o) noexcept {
    std::swap(ctx_, o.ctx_);
    std::swap(ptr_, o.ptr_);
    std::swap(capacity_, o.capacity_);
    std::swap(pooled_, o.pooled_);
  }
  [[nodiscard]] void* data() const { return ptr_; }
  [[nodiscard]] std::size_t capacity() const { return capacity_; }

 private:
  friend struct cuda_detail::access;
  std::shared_ptr<cuda_detail::context> ctx_;
  void* ptr_ = nullptr;
  std::size_t capacity_ = 0;
  bool pooled_ = true;
};

// A device matrix [rows][cols], row-major, bf16 or fp32. Copying copies the data (device to device).
class cuda_tensor {
 public:
  cuda_tensor() = default;
  cuda_tensor(const cuda_tensor& o);
  cuda_tensor& operator=(const cuda_tensor& o);
  cuda_tensor(cuda_tensor&& o) noexcept
      : buf_(std::move(o.buf_)), scale_(std::move(o.scale_)), rows_(std::exchange(o.rows_, 0)),
        cols_(std::exchange(o.cols_, 0)), dtype_(o.dtype_) {}
  cuda_tensor& operator=(cuda_tensor&& o) noexcept {
    buf_ = std::move(o.buf_);
    scale_ = std::move(o.scale_);
    rows_ = std::exchange(o.rows_, 0);
    cols_ = std::exchange(o.cols_, 0);
    dtype_ = o.dtype_;
    return *this;
  }

  [[nodiscard]] int rows() const { return rows_; }
  [[nodiscard]] int cols() const { return cols_; }
  [[nodiscard]] std::int64_t size() const { return std::int64_t{rows_} * cols_; }
  [[nodiscard]] bool empty() const { return size() == 0; }
  [[nodiscard]] cuda_dtype dtype() const { return dtype_; }
  [[nodiscard]] std::size_t bytes() const { return static_cast<std::size_t>(size()) * dtype_bytes(dtype_); }
  [[nodiscard]] void* data() { return buf_.data(); }
  [[nodiscard]] const void* data() const { return buf_.data(); }
  // e4m3 (an FP8 linear weight) only: fp32 block scales [ceil(rows/128)][scale_ld()] (cuBLASLt's
  // BLK128x128_32F layout: the K blocks of an output block row contiguous, padded with zeros to a multiple of 4).
  [[nodiscard]] const float* scales() const { return static_cast<const float*>(scale_.data()); }
  [[nodiscard]] int scale_ld() const { return (((cols_ + 127) / 128) + 3) & ~3; }

 private:
  friend struct cuda_detail::access;
  cuda_buffer buf_;
  cuda_buffer scale_;  // e4m3 only
  int rows_ = 0;
  int cols_ = 0;
  cuda_dtype dtype_ = cuda_dtype::bf16;
};

// The paged KV cache on the device: K and V [layers][blocks][block_size][kv_heads][head_dim] each; when
// compressing, the score cache [layers][blocks][block_size][kv_heads] (fp32) and the query-window cache
// [layers][slots][W][q_heads][head_dim] (in the compute dtype). With an FP8 cache K and V hold E4M3
// codes (1 byte each) and k_scale / v_scale the scales [layers][blocks][block_size][kv_heads], one bf16 each
// (core/kv_scale.hpp; allocate_kv requires block_size x kv_heads even, so a block's scales are whole 4-byte words,
// as the kernels gather and move them).
struct cuda_kv_storage {
  kv_cache_shape shape;
  cuda_dtype dtype = cuda_dtype::bf16;  // compute dtype: K/V when not FP8, and the query-window cache
  kv_cache_dtype kv_dtype = kv_cache_dtype::auto_;
  cuda_buffer k, v, scores, queries;
  cuda_buffer k_scale, v_scale;  // FP8 only

  [[nodiscard]] bool fp8() const { return kv_dtype == kv_cache_dtype::fp8_e4m3; }
  // Bytes of one K or V element (1 for FP8 codes).
  [[nodiscard]] std::size_t element_bytes() const { return fp8() ? 1 : dtype_bytes(dtype); }
  // Bytes of one query-window element.
  [[nodiscard]] std::size_t query_element_bytes() const { return dtype_bytes(dtype); }
  // Scale elements (bf16, 2 bytes each) per layer and side (FP8), = score elements per layer.
  [[nodiscard]] std::int64_t scale_layer_elements() const {
    return std::int64_t{shape.num_blocks} * shape.block_size * shape.num_kv_heads;
  }
  [[nodiscard]] std::size_t bytes() const {
    return static_cast<std::size_t>(2 * shape.elements_per_side()) * element_bytes() +
           static_cast<std::size_t>(shape.query_layer_stride() * shape.num_layers) * query_element_bytes() +
           static_cast<std::size_t>(shape.score_elements()) * sizeof(float) +
           (fp8() ? static_cast<std::size_t>(2 * scale_layer_elements() * shape.num_layers) * sizeof(std::uint16_t)
                  : 0);
  }
  // Bytes of K + V (+ their scales) per cached token, all layers.
  [[nodiscard]] std::size_t kv_bytes_per_token() const {
    return static_cast<std::size_t>(2 * shape.token_stride() * shape.num_layers) * element_bytes() +
           (fp8() ? static_cast<std::size_t>(2 * shape.num_kv_heads * shape.num_layers) * sizeof(std::uint16_t) : 0);
  }
};

// A request's state in pinned host memory while it is swapped out: per layer and page its K, V and
// scores, then its query-window rows.
struct cuda_swap_blob {
  std::size_t num_pages = 0;
  bool has_queries = false;
  std::size_t bytes = 0;
  std::shared_ptr<void> host;  // pinned, mapped
};

// What the backend did, for benchmarks (host-side clocks; all cumulative).
struct cuda_backend_counters {
  std::int64_t forward_steps = 0;        // attention calls on layer 0 (= forward passes)
  std::int64_t attention_tokens = 0;     // new tokens over those steps
  std::int64_t kv_tokens_read = 0;       // sum over steps and sequences of the KV length attended (one layer)
  std::int64_t metadata_uploads = 0;     // attention metadata copies (once per step when layers reuse it)
  std::int64_t decode_steps = 0, prefill_steps = 0;
  double to_host_seconds = 0.0;          // in to_host (wait for the step's GPU work + copy out)
  std::int64_t to_host_bytes = 0;
  std::int64_t compactions = 0;
  double compaction_seconds = 0.0;       // in apply_compaction (worker thread)
  std::int64_t gathers = 0;
  double gather_seconds = 0.0;           // in gather_keys / gather_scores / gather_window_queries
  std::int64_t gather_bytes = 0;
  std::int64_t swaps_out = 0, swaps_in = 0;
  std::int64_t swap_bytes = 0;
  std::int64_t block_copies = 0;
  std::int64_t sample_calls = 0;          // sample() calls (one per step that sampled on this backend)
  std::int64_t sampled_rows = 0;          // tokens drawn by sample()
  std::int64_t device_sampled_rows = 0;   // of which on the device (the rest: device_sampling = false)
  double sample_seconds = 0.0;            // in sample() (waits for the step's GPU work, then the tokens' copy)
  std::int64_t device_compression_batches = 0;  // compress_on_device() calls
  std::int64_t device_compressions = 0;   // requests compressed by them (each also counts as a compaction)
  double device_compression_seconds = 0.0;  // in compress_on_device() (worker thread; included in compaction_seconds)
  std::int64_t graph_replays = 0;         // decode steps replayed from a cached graph
  std::int64_t graph_captures = 0;        // decode steps captured into a new graph
  std::int64_t graph_updates = 0;         // captures that updated an existing graph in place (cudaGraphExecUpdate)
  double graph_capture_seconds = 0.0;     // capture + instantiate / update
  std::int64_t fp8_linears = 0;           // linear() calls with an FP8 weight (eager, and graph record passes)
  std::int64_t fp8_inputs_prequantized = 0;  // of which found their input's codes already written (fuse_fp8_quantize)
  std::int64_t swapped_decodes = 0;       // layers' decode attention run by a swapped kernel (fp8_decode_kernel)
  std::int64_t sm90_fp8_gemms = 0;         // FP8 linears run by fp8::gemm_sm90 (fp8_gemm_kernel; eager and record passes)
};

// One op's GPU time (cuda_backend_options::op_timing): `calls` launches of `op` took `ms` in all.
struct cuda_op_time {
  std::string op;  // e.g. "rms_norm", "linear bf16 6144x4096", "fp8 quantize 4096", "attention decode"
  std::int64_t calls = 0;
  double ms = 0.0;
};

class cuda_backend {
 public:
  using tensor = cuda_tensor;
  using kv_storage = cuda_kv_storage;
  using swap_blob = cuda_swap_blob;
  static constexpr const char* name = "cuda";

  // A new device context (stream, cuBLASLt handle) on options.device.
  cuda_backend();
  explicit cuda_backend(const cuda_backend_options& options);

  [[nodiscard]] const cuda_backend_options& options() const;
  [[nodiscard]] cuda_dtype dtype() const { return options().dtype; }
  [[nodiscard]] kv_cache_dtype kv_dtype() const { return options().kv_dtype; }
  // The engine's memory-plan hooks: bytes of one K or V element in the pool (1 with an FP8 cache), of
  // one per-(token, KV head, side) scale (2 with FP8, a bf16; else 0), and of one query-window element.
  [[nodiscard]] std::size_t kv_element_bytes() const {
    return kv_dtype() == kv_cache_dtype::fp8_e4m3 ? 1 : dtype_bytes(dtype());
  }
  [[nodiscard]] std::size_t kv_scale_bytes() const { return kv_dtype() == kv_cache_dtype::fp8_e4m3 ? 2 : 0; }
  [[nodiscard]] std::size_t query_element_bytes() const { return dtype_bytes(dtype()); }

  // ---- the zipage::backend concept (see cpu_backend)
  [[nodiscard]] tensor from_host(std::span<const float> values, int rows, int cols) const;
  [[nodiscard]] std::vector<float> to_host(const tensor& t) const;  // synchronises the stream
  [[nodiscard]] kv_storage allocate_kv(const kv_cache_shape& shape) const;

  void embedding(const tensor& table, std::span<const token_id> ids, tensor& out) const;
  void rms_norm(const tensor& x, const tensor& w, float eps, tensor& out) const;
  void linear(const tensor& x, const tensor& w, tensor& out) const;
  void add_bias(tensor& x, const tensor& bias) const;
  void rope(tensor& x, std::span<const std::int32_t> pos, int head_dim, float theta, rope_style style) const;
  void rope(tensor& x, std::span<const std::int32_t> pos, int head_dim, float theta, rope_style style,
            const rope_scaling_config& scaling) const;
  void silu_mul(const tensor& gate, const tensor& up, tensor& out) const;
  void add(tensor& x, const tensor& y) const;
  // ---- fused projections (models/llama.hpp fuses_projections)
  // stack_rows: linear weights [n_i][in] of one storage stacked into [sum n_i][in], at load (not in a graph); FP8
  // weights stack codes and block scales, which needs every part but the last to be a whole number of 128-row
  // blocks (nullopt otherwise, or when the parts' storage differs, or cuBLASLt refuses the stacked FP8 shape).
  // split_columns: one kernel. swiglu: silu_mul's kernel on the two halves of a gate|up row.
  [[nodiscard]] std::optional<tensor> stack_rows(std::span<const tensor* const> parts) const;
  void split_columns(const tensor& x, std::span<const int> widths, std::span<tensor* const> outs) const;
  void swiglu(const tensor& gate_up, tensor& out) const;
  // What follows a fused q|k|v projection (model/qkv_epilogue.hpp): one kernel in bf16 (cuda::qkv_epilogue; the
  // same bits as the separate ops), else split_columns, add_bias, rms_norm and rope one after another.
  void qkv_epilogue(const tensor& qkv, const zipage::qkv_epilogue<tensor>& e, tensor& q, tensor& k, tensor& v) const;
  // Residual add then RMSNorm (models/llama.hpp fuses_add_rms_norm): x += y; out = rms_norm(x, w) (out may be y, not
  // x). One kernel in bf16 with the bits of add then rms_norm.
  void add_rms_norm(tensor& x, const tensor& y, const tensor& w, float eps, tensor& out) const;
  void gather_rows(const tensor& x, std::span<const std::int32_t> rows, tensor& out) const;
  void attention(kv_storage& kv, int layer, const attention_metadata& meta, const tensor& q, const tensor& k,
                 const tensor& v, int num_q_heads, tensor& out) const;

  // ---- nano-batches (model/forward_context.hpp overlapping_backend)
  // nano_batch_split: the first nano-batch's size for a decode step of num_seqs (overlap_min_batch; 0 = no split).
  // attention_async: attention() of nano-batch `nano` (0 or 1) on the attention stream, after the main stream's
  // work so far; wait_attention(nano): the main stream's later work waits for it. Both work inside a decode graph
  // (the capture forks and joins through events). concat_rows: out = [a; b] (same columns and dtype).
  [[nodiscard]] int nano_batch_split(int num_seqs) const;
  void attention_async(kv_storage& kv, int layer, const attention_metadata& meta, const tensor& q, const tensor& k,
                       const tensor& v, int num_q_heads, tensor& out, int nano) const;
  void wait_attention(int nano) const;
  void concat_rows(const tensor& a, const tensor& b, tensor& out) const;

  // ---- compression and swapping (engine hooks; see backend/cpu/compaction.hpp for the layouts)
  void gather_keys(kv_storage& kv, int layer, std::span<const block_id> pages, int kv_len, std::vector<float>& out) const;
  void gather_scores(kv_storage& kv, int layer, std::span<const block_id> pages, int kv_len,
                     std::vector<float>& out) const;
  void gather_window_queries(kv_storage& kv, int layer, int slot, std::vector<float>& out) const;
  void apply_compaction(kv_storage& kv, const compaction_plan& plan) const;
  void copy_block(kv_storage& kv, block_id from, block_id to) const;
  [[nodiscard]] swap_blob swap_out(kv_storage& kv, std::span<const block_id> pages, int slot) const;
  void swap_in(kv_storage& kv, std::span<const block_id> pages, int slot, swap_blob& blob) const;

  // ---- optional engine hooks (model/concepts.hpp device_sampler, compression_worker.hpp device_compressor)
  // One token per row from logits [rows][vocab] (fp32 or bf16), as zipage::sampler would draw it from the
  // same logits. Synchronises the main stream (the step's GPU work is done when it returns).
  [[nodiscard]] std::vector<token_id> sample(const tensor& logits, std::span<const sample_row> rows) const;
  // Compression of a batch of requests on the device, on the compression stream, finished before
  // returning (compression_worker.hpp device_compressor): the policy's score_recipe is run by the kernels of
  // cuda::compress (window attention + history into the score cache, pooling, redundancy, combine, top-keep
  // selection, in-place compaction of K/V/scores) for every request at once, layers grouped per launch so
  // the workspace stays under 512 MiB; each request's new physical length is min(keep, kv_len). Returns
  // false (nothing touched) where the kernels do not cover the configuration: fp32 compute, head_dim not
  // 64/128, block size not a power of two in [2, 512], window > 256, or `device_compression = false`; the
  // engine then runs its host path. The engine calls it only for recipe-scored policies (policies.hpp
  // recipe_scored): a policy with its own score() is always scored on the host.
  [[nodiscard]] bool compress_on_device(kv_storage& kv, std::span<const device_compression_job> jobs,
                                        const score_recipe& recipe, const compression_params& params, int keep) const;

  // ---- CUDA graphs for decode steps (model/concepts.hpp decode_graph_runner)
  // The batch size a decode step of `num_seqs` sequences is padded to for a graph: powers of two up to
  // 16, then multiples of 16 up to 256, of 32 up to 512 and of 64 beyond; 0 when graphs are off
  // (`cuda_graphs = false`) or num_seqs > max_graph_batch.
  [[nodiscard]] int decode_graph_batch(int num_seqs) const;
  // Runs `forward` (the model's forward over a decode batch of `batch` sequences, already padded: padding
  // rows have slot -1 and kv_len 0) from a CUDA graph, capturing or updating it when needed (see above),
  // and returns the logits `forward` returns; they are ready in stream order. `forward` may run twice
  // (record, capture) and must return a tensor that outlives the call (a model member).
  const tensor& run_decode_graph(int batch, const std::function<const tensor&()>& forward) const;

  // ---- FP8 linear weights (optional model hooks; docs/fp8.md "FP8 weights")
  // Whether linear weights become FP8 for a model loaded from a checkpoint that is (`fp8_checkpoint`) or is not
  // FP8: options().weight_dtype resolved (zipage::fp8_weights), and the compute dtype is bf16.
  [[nodiscard]] bool fp8_linear_weights(bool fp8_checkpoint) const;
  // Quantises a [out][in] linear weight in place to E4M3 codes + 128x128 block scales (amax / 448; zero codes for
  // an all-zero block; bit-exact with fp8_linear::quantize_weight on the same values) when
  // fp8_linear_weights(fp8_checkpoint) holds and cuBLASLt can run the FP8 GEMM for its shape; otherwise leaves it
  // as it is (a shape cuBLASLt refuses is counted in counters().fp8_weights_kept). Returns whether it is FP8 now.
  bool prepare_linear_weight(tensor& w, bool fp8_checkpoint = false) const;
  // A linear weight from fp32 host values: from_host, then prepare_linear_weight on the fp32 values (so an FP8
  // checkpoint's dequantised weights are re-quantised from fp32, recovering its codes: docs/fp8.md).
  [[nodiscard]] tensor linear_weight_from_host(std::span<const float> values, int rows, int cols,
                                               bool fp8_checkpoint = false) const;
  // Tests: an e4m3 weight's codes [rows][cols] and scales [ceil(rows/128)][ceil(cols/128)] (row-major, unpadded).
  void fp8_weight_to_host(const tensor& w, std::vector<std::uint8_t>& codes, std::vector<float>& scales) const;
  // Tests: the activation quantisation linear() runs on x ([rows][cols], bf16 or fp32): codes [rows][cols] and
  // scales [rows][ceil(cols/128)] (row-major), from the same kernel and workspace.
  void quantize_activations_to_host(const tensor& x, std::vector<std::uint8_t>& codes, std::vector<float>& scales) const;
  // For the `weights:` line: how many linear weights prepare_linear_weight made FP8 over this backend's life, and
  // how many it kept in the compute dtype because cuBLASLt's FP8 GEMM refuses their shape.
  [[nodiscard]] std::string describe_weights() const;

  // ---- extras
  // A tensor filled on the device: uniform in [-scale, scale) from (seed, index), or a constant.
  [[nodiscard]] tensor random_tensor(int rows, int cols, float scale, std::uint64_t seed) const;
  [[nodiscard]] tensor constant_tensor(int rows, int cols, float value) const;
  // Whole KV cache contents as fp32 host vectors (tests): K, V of every layer in the cache layout.
  // With an FP8 cache: the dequantised values (float(code) * scale).
  [[nodiscard]] std::vector<float> kv_to_host(const kv_storage& kv, bool values) const;
  // FP8 cache (tests): the raw E4M3 codes [layers][blocks][block_size][kv_heads][head_dim] and scales
  // [layers][blocks][block_size][kv_heads] (bf16 bits, core/kv_scale.hpp) of K (values = false) or V.
  void kv_fp8_to_host(const kv_storage& kv, bool values, std::vector<std::uint8_t>& codes,
                      std::vector<std::uint16_t>& scales) const;
  void synchronize() const;
  [[nodiscard]] cuda_backend_counters counters() const;
  void reset_counters() const;
  // With cuda_backend_options::op_timing: the ops timed since the last call, summed by op in first-seen order
  // (waits for them). Empty when op timing is off.
  [[nodiscard]] std::vector<cuda_op_time> take_op_times() const;
  // Free and total device memory in bytes (cudaMemGetInfo).
  [[nodiscard]] std::pair<std::size_t, std::size_t> memory_info() const;
  [[nodiscard]] std::string device_name() const;
  // Measured on this device: a device-to-device cudaMemcpy of `bytes` (bytes read + written / time,
  // median of `reps`), and a bf16 cuBLASLt GEMM n x n x n (TFLOP/s, median).
  [[nodiscard]] double measure_copy_bandwidth(std::size_t bytes = std::size_t{2} << 30, int reps = 9) const;
  [[nodiscard]] double measure_gemm_tflops(int n = 8192, int reps = 5) const;
  // Reads t's bytes `passes` times with a read-only streaming kernel (it writes nothing) and waits: the memory-bound
  // load whose power and joules per byte zipage-bench's power-aware ceiling is built on. t's bytes: a multiple of 16.
  void read_stream(const tensor& t, int passes) const;

 private:
  // attention() (nano = -1, main stream) and attention_async() (the attention stream).
  void attend(kv_storage& kv, int layer, const attention_metadata& meta, const tensor& q, const tensor& k,
              const tensor& v, int num_q_heads, tensor& out, int nano) const;

  std::shared_ptr<cuda_detail::context> ctx_;
};

}  // namespace zipage
