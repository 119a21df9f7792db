// zipage::cuda_backend (backend/cuda/cuda_backend.hpp): device context, tensors, ops, the paged
// attention step, compression and swap hooks.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <array>
#include <bit>
#include <map>
#include <type_traits>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "zipage/backend/cuda/common.cuh"
#include "zipage/backend/cuda/compression.hpp"
#include "zipage/backend/cuda/cuda_backend.hpp"
#include "zipage/backend/cuda/engine_kernels.hpp"
#include "zipage/backend/cuda/kernels.hpp"
#include "zipage/backend/cuda/sampling.hpp"
#include "zipage/core/fp8.hpp"
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
double seconds_since(clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); }

// Pinned (page-locked, mapped) host memory, grow-only.
struct pinned_buffer {
  void* p = nullptr;
  std::size_t cap = 0;
  pinned_buffer() = default;
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  ~pinned_buffer() {
    if (p) cudaFreeHost(p);
  }
  void reserve(std::size_t bytes) {
    if (bytes <= cap) return;
    if (p) ZIPAGE_CUDA_CHECK(cudaFreeHost(p));
    p = nullptr;
    cap = 0;
    const std::size_t want = std::max<std::size_t>(bytes, 4096);
    ZIPAGE_CUDA_CHECK(cudaHostAlloc(&p, want, cudaHostAllocPortable | cudaHostAllocMapped));
    cap = want;
  }
  template <class T = char>
  T* as() const { return static_cast<T*>(p); }
};

// Device scratch, grow-only, freed in stream order.
struct device_scratch {
  void* p = nullptr;
  std::size_t cap = 0;
  cudaStream_t stream = nullptr;
  device_scratch() = default;
  device_scratch(const device_scratch&) = delete;
  device_scratch& operator=(const device_scratch&) = delete;
  ~device_scratch() {
    if (p) cudaFreeAsync(p, stream);
  }
  void* reserve(std::size_t bytes, cudaStream_t s) {
    if (bytes > cap || s != stream) {
      if (p) ZIPAGE_CUDA_CHECK(cudaFreeAsync(p, stream));
      p = nullptr;
      cap = 0;
      stream = s;
      const std::size_t want = std::max<std::size_t>(bytes + bytes / 4, 256);
      ZIPAGE_CUDA_CHECK(cudaMallocAsync(&p, want, s));
      cap = want;
    }
    return p;
  }
};

struct section {
  const void* data;
  std::size_t bytes;
};

// Host -> device copies of small per-step arrays through one pinned buffer: the sections are laid out
// back to back (16-byte aligned) and copied with one cudaMemcpyAsync. An upload equal to the previous
// one (compared byte for byte with the pinned copy, which still holds it) is skipped, so every layer
// of a step reuses what the first one copied. The pinned buffer is only overwritten once the previous
// copy out of it has completed (an event).
class uploader {
 public:
  uploader() = default;
  uploader(const uploader&) = delete;
  uploader& operator=(const uploader&) = delete;
  ~uploader() {
    if (done_) cudaEventDestroy(done_);
    if (dev_) cudaFreeAsync(dev_, stream_);
  }

  // Whether the first `count` sections equal the last upload's first `count` sections.
  [[nodiscard]] bool same(std::span<const section> secs) const {
    if (!valid_ || sizes_.size() < secs.size()) return false;
    for (std::size_t i = 0; i < secs.size(); ++i) {
      if (sizes_[i] != secs[i].bytes) return false;
      if (secs[i].bytes && std::memcmp(host_.as() + offsets_[i], secs[i].data, secs[i].bytes) != 0) return false;
    }
    return true;
  }

  void put(std::span<const section> secs, cudaStream_t s) {
    if (done_ == nullptr) ZIPAGE_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    offsets_.resize(secs.size());
    sizes_.resize(secs.size());
    std::size_t total = 0;
    for (std::size_t i = 0; i < secs.size(); ++i) {
      offsets_[i] = total;
      sizes_[i] = secs[i].bytes;
      total += (secs[i].bytes + 15) / 16 * 16;
    }
    ZIPAGE_CUDA_CHECK(cudaEventSynchronize(done_));  // the last copy out of host_ has finished
    valid_ = false;
    host_.reserve(total);
    for (std::size_t i = 0; i < secs.size(); ++i)
      if (secs[i].bytes) std::memcpy(host_.as() + offsets_[i], secs[i].data, secs[i].bytes);
    if (total > dev_cap_ || s != stream_) {
      if (dev_) ZIPAGE_CUDA_CHECK(cudaFreeAsync(dev_, stream_));
      dev_ = nullptr;
      dev_cap_ = 0;
      stream_ = s;
      const std::size_t want = std::max<std::size_t>(total * 2, 4096);
      ZIPAGE_CUDA_CHECK(cudaMallocAsync(&dev_, want, s));
      dev_cap_ = want;
    }
    if (total) ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(dev_, host_.p, total, cudaMemcpyHostToDevice, s));
    ZIPAGE_CUDA_CHECK(cudaEventRecord(done_, s));
    valid_ = true;
  }

  // Uploads unless equal to the last upload; returns whether it copied.
  bool upload(std::span<const section> secs, cudaStream_t s) {
    if (same(secs) && sizes_.size() == secs.size()) return false;
    put(secs, s);
    return true;
  }

  template <class T>
  [[nodiscard]] const T* device(std::size_t i) const {
    return sizes_[i] ? reinterpret_cast<const T*>(static_cast<const char*>(dev_) + offsets_[i]) : nullptr;
  }

  // Forget the last upload, so the next one copies even if equal (its users were pointed elsewhere).
  void invalidate() { valid_ = false; }

 private:
  pinned_buffer host_;
  void* dev_ = nullptr;
  std::size_t dev_cap_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  std::vector<std::size_t> offsets_, sizes_;
  bool valid_ = false;
};

template <class T>
section span_section(std::span<const T> s) {
  return {s.data(), s.size_bytes()};
}

struct gemm_key {
  int m, n, k;
  cuda_dtype t;
  int align;
  bool operator==(const gemm_key&) const = default;
};
struct gemm_key_hash {
  std::size_t operator()(const gemm_key& g) const {
    std::size_t h = static_cast<std::size_t>(g.m);
    h = h * 1000003u ^ static_cast<std::size_t>(g.n);
    h = h * 1000003u ^ static_cast<std::size_t>(g.k);
    h = h * 31u ^ static_cast<std::size_t>(g.t);
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

// ---- CUDA graphs for decode steps (see cuda_backend.hpp)

enum class graph_phase { off, record, capture };
// Who stages inputs, for de-duplication within a step (every layer passes the same positions and metadata).
enum uploader_id : int { up_ids, up_pos, up_rows, up_meta, num_uploaders };

// Device pointers of the sections of one upload (nullptr for an empty section).
struct staged {
  std::array<const void*, 8> p{};
  template <class T>
  [[nodiscard]] const T* at(std::size_t i) const {
    return static_cast<const T*>(p[i]);
  }
};

struct graph_entry {
  cudaGraphExec_t exec = nullptr;
  std::uint64_t signature = 0;
};

// The record/capture machinery: the pinned input arena, the signature of the pass, the cached graphs.
struct graph_state {
  graph_phase phase = graph_phase::off;
  std::uint64_t signature = 0;
  int kv_bucket = 0;         // max_kv_len of this pass rounded up (sizes the split-KV plan)
  bool arena_moved = false;  // the device arena was reallocated during this record pass
  pinned_buffer host;        // inputs staged by this pass, back to back at fixed-size-class offsets
  std::size_t used = 0;
  void* dev = nullptr;       // their device copy
  std::size_t dev_cap = 0;
  cudaStream_t dev_stream = nullptr;
  cudaEvent_t copied = nullptr;  // the last arena copy out of `host` has finished
  struct placed {
    std::size_t offset, bytes;
  };
  std::vector<placed> record_layout;  // every staged section of the record pass, in order
  std::size_t capture_index = 0;      // the capture pass walks record_layout
  struct last_upload {
    std::size_t first = 0, count = 0;  // its sections in `layout`
    bool valid = false;
  };
  std::array<last_upload, num_uploaders> last{};
  std::vector<placed> layout;  // this pass's sections
  std::map<std::pair<int, int>, graph_entry> graphs;  // (padded batch, kv bucket)

  graph_state() = default;
  graph_state(const graph_state&) = delete;
  graph_state& operator=(const graph_state&) = delete;
  ~graph_state() {
    clear();
    if (copied) cudaEventDestroy(copied);
    if (dev) cudaFreeAsync(dev, dev_stream);
  }
  void clear() {
    for (auto& [key, g] : graphs)
      if (g.exec) cudaGraphExecDestroy(g.exec);
    graphs.clear();
  }

  static std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h ^= h >> 31;
    return h * 0xbf58476d1ce4e5b9ull;
  }
  template <class T>
  static std::uint64_t bits(const T& v) {
    if constexpr (std::is_pointer_v<T>) {
      return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(v));
    } else if constexpr (std::is_enum_v<T>) {
      return static_cast<std::uint64_t>(v);
    } else if constexpr (std::is_floating_point_v<T>) {
      double d = v;
      std::uint64_t u;
      std::memcpy(&u, &d, sizeof u);
      return u;
    } else {
      static_assert(std::is_integral_v<T>, "graph signature: pointers, enums, numbers only");
      return static_cast<std::uint64_t>(v);
    }
  }
  template <class... A>
  void note(int op, const A&... a) {
    signature = mix(signature, static_cast<std::uint64_t>(op));
    ((signature = mix(signature, bits(a))), ...);
  }

  void begin(graph_phase p, cudaStream_t s) {
    phase = p;
    signature = 0x5a17a6e0ull;
    used = 0;
    layout.clear();
    capture_index = 0;
    last.fill({});
    arena_moved = false;
    if (p == graph_phase::record) {
      if (copied == nullptr) ZIPAGE_CUDA_CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
      ZIPAGE_CUDA_CHECK(cudaEventSynchronize(copied));  // `host` is free to overwrite
      if (dev_stream != s && dev) {
        ZIPAGE_CUDA_CHECK(cudaFreeAsync(dev, dev_stream));
        dev = nullptr;
        dev_cap = 0;
      }
      dev_stream = s;
    }
  }

  [[nodiscard]] bool same(int who, std::span<const section> secs) const {
    const auto& l = last[static_cast<std::size_t>(who)];
    if (!l.valid || l.count < secs.size()) return false;
    for (std::size_t i = 0; i < secs.size(); ++i) {
      const placed& pl = layout[l.first + i];
      if (pl.bytes != secs[i].bytes) return false;
      if (pl.bytes && std::memcmp(host.as() + pl.offset, secs[i].data, pl.bytes) != 0) return false;
    }
    return true;
  }

  // Places the sections in the arena (record: copies them into `host`; capture: the record pass's places).
  staged stage(int who, std::span<const section> secs) {
    check(secs.size() <= staged{}.p.size(), "cuda graphs: too many sections in one upload");
    staged out;
    auto& l = last[static_cast<std::size_t>(who)];
    if (same(who, secs) && l.count == secs.size()) {
      for (std::size_t i = 0; i < secs.size(); ++i)
        out.p[i] = layout[l.first + i].bytes ? static_cast<const char*>(dev) + layout[l.first + i].offset : nullptr;
      return out;
    }
    l = {layout.size(), secs.size(), true};
    for (std::size_t i = 0; i < secs.size(); ++i) {
      const std::size_t bytes = secs[i].bytes;
      // Size classes (powers of two) keep later offsets put while a page table grows a little.
      const std::size_t cap = bytes == 0 ? 0 : std::max<std::size_t>(64, std::bit_ceil(bytes));
      placed pl{used, bytes};
      if (phase == graph_phase::record) {
        grow(used + cap);
        if (bytes) std::memcpy(host.as() + used, secs[i].data, bytes);
      } else {
        check(capture_index < record_layout.size() && record_layout[capture_index].offset == pl.offset &&
                  record_layout[capture_index].bytes == bytes,
              "cuda graphs: the capture pass staged other inputs than the record pass");
        ++capture_index;
      }
      layout.push_back(pl);
      used += cap;
      out.p[i] = bytes ? static_cast<const char*>(dev) + pl.offset : nullptr;
    }
    return out;
  }

  void grow(std::size_t need) {
    if (need > host.cap) {
      pinned_buffer bigger;
      bigger.reserve(std::max(need * 2, std::size_t{1} << 20));
      if (used) std::memcpy(bigger.p, host.p, used);
      std::swap(bigger.p, host.p);
      std::swap(bigger.cap, host.cap);
    }
    if (need > dev_cap) {
      if (dev) ZIPAGE_CUDA_CHECK(cudaFreeAsync(dev, dev_stream));
      dev = nullptr;
      dev_cap = 0;
      const std::size_t want = std::max(need * 2, std::size_t{1} << 20);
      ZIPAGE_CUDA_CHECK(cudaMallocAsync(&dev, want, dev_stream));
      dev_cap = want;
      arena_moved = true;
    }
  }
};

// The two streams, created first and destroyed last (after every member that frees in stream order).
struct stream_pair {
  cudaStream_t main = nullptr;
  cudaStream_t side = nullptr;
  explicit stream_pair(int device) {
    ZIPAGE_CUDA_CHECK(cudaSetDevice(device));
    ZIPAGE_CUDA_CHECK(cudaStreamCreateWithFlags(&main, cudaStreamNonBlocking));
    ZIPAGE_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  }
  stream_pair(const stream_pair&) = delete;
  stream_pair& operator=(const stream_pair&) = delete;
  ~stream_pair() {
    cudaStreamSynchronize(main);
    cudaStreamSynchronize(side);
    cudaStreamDestroy(main);
    cudaStreamDestroy(side);
  }
};

struct context {
  cuda_backend_options opts;
  stream_pair streams;
  cudaStream_t stream = streams.main;  // every op of the engine's thread
  cudaStream_t side = streams.side;    // compression hooks (worker thread)
  cublasLtHandle_t lt = nullptr;
  void* lt_workspace = nullptr;
  std::unordered_map<gemm_key, std::unique_ptr<gemm_plan>, gemm_key_hash> gemms;

  uploader ids_up, pos_up, rows_up, meta_up, misc_up;
  std::vector<std::int32_t> q_indptr_host;
  step_state step;
  device_scratch decode_ws, to_host_dev;
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
  sampler host_sampler;  // device_sampling = false

  mutable std::mutex counters_mu;
  cuda_backend_counters counters;
  std::array<cudaEvent_t, 32> chunk_events{};  // to_host's pipelined copy

  graph_state graph;  // run_decode_graph (engine thread, main stream)

  explicit context(const cuda_backend_options& o) : opts(o), streams(o.device) {
    activate();
    cudaMemPool_t pool = nullptr;
    ZIPAGE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, opts.device));
    std::uint64_t keep = UINT64_MAX;  // freed pool memory stays cached: steady-state steps never call the driver
    ZIPAGE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    ZIPAGE_LT_CHECK(cublasLtCreate(&lt));
    for (auto& e : chunk_events) ZIPAGE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    if (opts.gemm_workspace_bytes) ZIPAGE_CUDA_CHECK(cudaMalloc(&lt_workspace, opts.gemm_workspace_bytes));
  }
  context(const context&) = delete;
  context& operator=(const context&) = delete;
  ~context() {
    cudaSetDevice(opts.device);
    cudaStreamSynchronize(stream);
    cudaStreamSynchronize(side);
    gemms.clear();
    for (auto& [key, p] : rope_tables) cudaFree(p);
    if (lt_workspace) cudaFree(lt_workspace);
    if (lt) cublasLtDestroy(lt);
    for (auto& e : chunk_events)
      if (e) cudaEventDestroy(e);
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
    if (graph.phase == graph_phase::off) return false;
    graph.note(op, args...);
    return graph.phase == graph_phase::record;
  }
  [[nodiscard]] bool capturing() const { return graph.phase == graph_phase::capture; }

  // A small host-input upload: through the uploader (skipped when equal to its last upload) outside a
  // graph pass, into the graph arena inside one.
  staged upload(uploader& u, int who, std::span<const section> secs) {
    if (graph.phase != graph_phase::off) return graph.stage(who, secs);
    u.upload(secs, stream);
    staged out;
    for (std::size_t i = 0; i < secs.size(); ++i) out.p[i] = u.device<char>(i);
    return out;
  }

  template <class F>
  void count(F&& f) {
    std::lock_guard lock(counters_mu);
    f(counters);
  }
};

struct access {
  static cuda_buffer& buf(cuda_tensor& t) { return t.buf_; }
  static const cuda_buffer& buf(const cuda_tensor& t) { return t.buf_; }

  static void reserve(const std::shared_ptr<context>& ctx, cuda_buffer& b, std::size_t bytes, bool pooled = true) {
    if (b.ptr_ != nullptr && b.capacity_ >= bytes && b.ctx_ == ctx) return;
    // The record pass sized every tensor the capture pass touches.
    check(!ctx->capturing(), "cuda graphs: a tensor grew during stream capture");
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
  // Gives `t` the shape [rows][cols] of dtype dt, growing its buffer when needed (contents undefined).
  static void shape(const std::shared_ptr<context>& ctx, cuda_tensor& t, int rows, int cols, cuda_dtype dt) {
    check(rows >= 0 && cols >= 0, "cuda_backend: negative tensor shape ", rows, "x", cols);
    reserve(ctx, t.buf_, static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols) * dtype_bytes(dt));
    t.rows_ = rows;
    t.cols_ = cols;
    t.dtype_ = dt;
  }
  static std::shared_ptr<context> owner(const cuda_tensor& t) { return t.buf_.ctx_; }
};

}  // namespace cuda_detail

using cuda_detail::access;
using cuda_detail::context;
using cuda_detail::section;

// ---------------------------------------------------------------------------------------------------
// buffer / tensor

cuda_buffer::~cuda_buffer() { access::release(*this); }

cuda_tensor::cuda_tensor(const cuda_tensor& o) : rows_(0), cols_(0), dtype_(o.dtype_) { *this = o; }

cuda_tensor& cuda_tensor::operator=(const cuda_tensor& o) {
  if (this == &o) return *this;
  const auto ctx = access::owner(o);
  if (!ctx || o.empty()) {
    rows_ = o.rows_;
    cols_ = o.cols_;
    dtype_ = o.dtype_;
    return *this;
  }
  access::shape(ctx, *this, o.rows_, o.cols_, o.dtype_);
  ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(data(), o.data(), o.bytes(), cudaMemcpyDeviceToDevice, ctx->stream));
  return *this;
}

// ---------------------------------------------------------------------------------------------------
// backend

namespace {

cuda::cuda_stream as_stream(cudaStream_t s) { return reinterpret_cast<cuda::cuda_stream>(s); }

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

int alignment_of(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  int a = 1;
  while (a < 256 && (v & static_cast<std::uintptr_t>(a)) == 0) a <<= 1;
  return a;
}

std::uint16_t to_bf16_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

context& use(const std::shared_ptr<context>& p) {
  p->activate();
  return *p;
}

bool power_of_two(int x) { return x > 0 && (x & (x - 1)) == 0; }

const cuda_detail::gemm_plan& gemm_plan_for(context& c, int m, int n, int k, cuda_dtype t, int align) {
  const cuda_detail::gemm_key key{m, n, k, t, align};
  auto it = c.gemms.find(key);
  if (it != c.gemms.end()) return *it->second;
  auto plan = std::make_unique<cuda_detail::gemm_plan>();
  const cudaDataType_t dt = t == cuda_dtype::bf16 ? CUDA_R_16BF : CUDA_R_32F;
  ZIPAGE_LT_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  ZIPAGE_LT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  ZIPAGE_LT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  // Column-major view: out^T [n x m] = W [k x n]^T * x^T [k x m].
  ZIPAGE_LT_CHECK(cublasLtMatrixLayoutCreate(&plan->a, dt, static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(n), k));
  ZIPAGE_LT_CHECK(cublasLtMatrixLayoutCreate(&plan->b, dt, static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(m), k));
  ZIPAGE_LT_CHECK(cublasLtMatrixLayoutCreate(&plan->c, dt, static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(m), n));
  cublasLtMatmulPreference_t pref = nullptr;
  ZIPAGE_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::uint64_t ws = c.opts.gemm_workspace_bytes;
  const std::uint32_t al = static_cast<std::uint32_t>(align);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al);
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(c.lt, plan->desc, plan->a, plan->b, plan->c, plan->c, pref, 1, &result, &returned);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    plan->algo = result.algo;
    plan->ok = true;
  }
  auto& ref = *plan;
  c.gemms.emplace(key, std::move(plan));
  return ref;
}

}  // namespace

cuda_backend::cuda_backend() : cuda_backend(cuda_backend_options{}) {}

cuda_backend::cuda_backend(const cuda_backend_options& options) : ctx_(std::make_shared<context>(options)) {}

const cuda_backend_options& cuda_backend::options() const { return ctx_->opts; }

cuda_tensor cuda_backend::from_host(std::span<const float> values, int rows, int cols) const {
  check(values.size() == static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols), "cuda_backend: ",
        values.size(), " values do not fill a ", rows, "x", cols, " tensor");
  ctx_->activate();
  cuda_tensor t;
  access::shape(ctx_, t, rows, cols, ctx_->opts.dtype);
  if (t.empty()) return t;
  if (ctx_->opts.dtype == cuda_dtype::f32) {
    ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(t.data(), values.data(), t.bytes(), cudaMemcpyHostToDevice, ctx_->stream));
  } else {
    std::vector<std::uint16_t> bits(values.size());
    std::transform(values.begin(), values.end(), bits.begin(), to_bf16_bits);
    ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(t.data(), bits.data(), t.bytes(), cudaMemcpyHostToDevice, ctx_->stream));
  }
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));  // the host values may go away
  return t;
}

std::vector<float> cuda_backend::to_host(const cuda_tensor& t) const {
  const auto t0 = cuda_detail::clock::now();
  context& c = use(ctx_);
  c.activate();
  const auto n = static_cast<std::size_t>(t.size());
  std::vector<float> out;
  if (n == 0) {
    ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.stream));
    return out;
  }
  c.to_host_pinned.reserve(n * sizeof(float));
  const void* src = t.data();
  if (t.dtype() != cuda_dtype::f32) {
    void* f = c.to_host_dev.reserve(n * sizeof(float), c.stream);
    cuda::engine::to_f32(t.dtype(), t.data(), static_cast<float*>(f), static_cast<std::int64_t>(n), as_stream(c.stream));
    src = f;
  }
  // In chunks, each with an event, so that copying chunk i into the vector overlaps the device-to-host
  // transfer of the chunks after it (the logits of a big batch are ~100 MB).
  const std::size_t bytes = n * sizeof(float);
  constexpr std::size_t kChunkBytes = std::size_t{8} << 20;
  const std::size_t chunks = std::clamp<std::size_t>((bytes + kChunkBytes - 1) / kChunkBytes, 1, c.chunk_events.size());
  const std::size_t per = (n + chunks - 1) / chunks;
  float* h = c.to_host_pinned.as<float>();
  const auto* s = static_cast<const float*>(src);
  for (std::size_t i = 0; i < chunks; ++i) {
    const std::size_t off = i * per, len = std::min(per, n - std::min(n, off));
    if (len) ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(h + off, s + off, len * sizeof(float), cudaMemcpyDeviceToHost, c.stream));
    ZIPAGE_CUDA_CHECK(cudaEventRecord(c.chunk_events[i], c.stream));
  }
  out.reserve(n);
  for (std::size_t i = 0; i < chunks; ++i) {
    const std::size_t off = i * per, len = std::min(per, n - std::min(n, off));
    ZIPAGE_CUDA_CHECK(cudaEventSynchronize(c.chunk_events[i]));
    out.insert(out.end(), h + off, h + off + len);
  }
  const double dt = cuda_detail::seconds_since(t0);
  c.count([&](cuda_backend_counters& k) {
    k.to_host_seconds += dt;
    k.to_host_bytes += static_cast<std::int64_t>(n * sizeof(float));
  });
  return out;
}

cuda_kv_storage cuda_backend::allocate_kv(const kv_cache_shape& shape) const {
  check(shape.num_layers > 0 && shape.num_blocks > 0 && shape.block_size > 0 && shape.num_kv_heads > 0 &&
            shape.head_dim > 0,
        "cuda_backend: bad KV cache shape");
  cuda_kv_storage kv;
  kv.shape = shape;
  kv.dtype = ctx_->opts.dtype;
  kv.kv_dtype = ctx_->opts.kv_dtype;
  check(!kv.fp8() || shape.head_dim % 4 == 0, "cuda_backend: an FP8 KV cache needs head_dim % 4 == 0 (got ",
        shape.head_dim, ")");
  const std::size_t eb = kv.element_bytes();
  const auto side = static_cast<std::size_t>(shape.elements_per_side()) * eb;
  access::reserve(ctx_, kv.k, side, false);
  access::reserve(ctx_, kv.v, side, false);
  if (shape.score_cache) access::reserve(ctx_, kv.scores, static_cast<std::size_t>(shape.score_elements()) * 4, false);
  if (kv.fp8()) {
    const auto sbytes = static_cast<std::size_t>(kv.scale_layer_elements() * shape.num_layers) * sizeof(float);
    access::reserve(ctx_, kv.k_scale, sbytes, false);
    access::reserve(ctx_, kv.v_scale, sbytes, false);
    ZIPAGE_CUDA_CHECK(cudaMemsetAsync(kv.k_scale.data(), 0, sbytes, ctx_->stream));
    ZIPAGE_CUDA_CHECK(cudaMemsetAsync(kv.v_scale.data(), 0, sbytes, ctx_->stream));
  }
  const auto qbytes = static_cast<std::size_t>(shape.query_layer_stride() * shape.num_layers) * kv.query_element_bytes();
  if (qbytes) access::reserve(ctx_, kv.queries, qbytes, false);
  // Zeroed like the CPU storage (the compressor may read score-cache entries never written).
  ZIPAGE_CUDA_CHECK(cudaMemsetAsync(kv.k.data(), 0, side, ctx_->stream));
  ZIPAGE_CUDA_CHECK(cudaMemsetAsync(kv.v.data(), 0, side, ctx_->stream));
  if (kv.scores.data())
    ZIPAGE_CUDA_CHECK(cudaMemsetAsync(kv.scores.data(), 0, static_cast<std::size_t>(shape.score_elements()) * 4, ctx_->stream));
  if (kv.queries.data()) ZIPAGE_CUDA_CHECK(cudaMemsetAsync(kv.queries.data(), 0, qbytes, ctx_->stream));
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));
  return kv;
}

void cuda_backend::embedding(const cuda_tensor& table, std::span<const token_id> ids, cuda_tensor& out) const {
  context& c = use(ctx_);
  for (const token_id id : ids)
    check(id >= 0 && id < table.rows(), "embedding: token id ", id, " outside the vocabulary of ", table.rows());
  const section s{ids.data(), ids.size_bytes()};
  const auto* d_ids = c.upload(c.ids_up, cuda_detail::up_ids, {&s, 1}).at<std::int32_t>(0);
  access::shape(ctx_, out, static_cast<int>(ids.size()), table.cols(), table.dtype());
  if (ids.empty()) return;
  const bool fast = table.dtype() == cuda_dtype::bf16 && c.opts.fast_kernels;
  if (c.skip_launch(1, table.data(), table.rows(), table.cols(), table.dtype(), d_ids, ids.size(), out.data(), fast)) return;
  if (fast)
    cuda::gather_rows(table.data(), table.rows(), table.cols(), d_ids, static_cast<int>(ids.size()), out.data(),
                      as_stream(c.stream));
  else
    cuda::engine::gather_rows(table.dtype(), table.data(), table.cols(), d_ids, static_cast<int>(ids.size()),
                              out.data(), as_stream(c.stream));
}

void cuda_backend::rms_norm(const cuda_tensor& x, const cuda_tensor& w, float eps, cuda_tensor& out) const {
  context& c = use(ctx_);
  const int width = w.cols();
  check(width > 0 && x.cols() % width == 0, "rms_norm: row of ", x.cols(), " is not a multiple of the weight width ",
        width);
  access::shape(ctx_, out, x.rows(), x.cols(), x.dtype());
  if (x.empty()) return;
  const bool fast = x.dtype() == cuda_dtype::bf16 && c.opts.fast_kernels && width % 8 == 0 && aligned16(x.data()) &&
                    aligned16(w.data()) && aligned16(out.data());
  if (c.skip_launch(2, x.data(), w.data(), w.dtype(), out.data(), x.rows(), x.cols(), width, eps, fast)) return;
  if (fast)
    cuda::rms_norm(x.data(), w.data(), w.dtype() == cuda_dtype::bf16 ? cuda::weight_dtype::bf16 : cuda::weight_dtype::f32,
                   out.data(), x.rows(), x.cols(), width, eps, as_stream(c.stream));
  else
    cuda::engine::rms_norm(x.dtype(), x.data(), w.dtype(), w.data(), out.data(), x.rows(), x.cols(), width, eps,
                           as_stream(c.stream));
}

void cuda_backend::linear(const cuda_tensor& x, const cuda_tensor& w, cuda_tensor& out) const {
  context& c = use(ctx_);
  check(x.cols() == w.cols(), "linear: input width ", x.cols(), " does not match weight input width ", w.cols());
  check(x.dtype() == w.dtype(), "linear: input is ", to_string(x.dtype()), " but the weight is ", to_string(w.dtype()));
  check(&x != &out && &w != &out, "linear: the output may not alias an input");
  access::shape(ctx_, out, x.rows(), w.rows(), x.dtype());
  const int m = x.rows(), n = w.rows(), k = x.cols();
  if (m == 0 || n == 0) return;
  if (!(x.dtype() == cuda_dtype::f32 && c.opts.batch_invariant) && c.opts.gemm_workspace_bytes > 0) {
    const int align = std::min({alignment_of(x.data()), alignment_of(w.data()), alignment_of(out.data())});
    const auto& plan = gemm_plan_for(c, m, n, k, x.dtype(), align);
    if (plan.ok) {
      if (c.skip_launch(3, x.data(), w.data(), out.data(), m, n, k, x.dtype(), &plan, c.lt_workspace)) return;
      const float alpha = 1.0f, beta = 0.0f;
      ZIPAGE_LT_CHECK(cublasLtMatmul(c.lt, plan.desc, &alpha, w.data(), plan.a, x.data(), plan.b, &beta, out.data(),
                                     plan.c, out.data(), plan.c, &plan.algo, c.lt_workspace, c.opts.gemm_workspace_bytes,
                                     c.stream));
      return;
    }
  }
  if (c.skip_launch(4, x.data(), w.data(), out.data(), m, n, k, x.dtype())) return;
  cuda::engine::gemm_fixed_order(x.dtype(), x.data(), w.data(), out.data(), m, n, k, as_stream(c.stream));
}

void cuda_backend::add_bias(cuda_tensor& x, const cuda_tensor& bias) const {
  check(bias.cols() == x.cols() && bias.rows() >= 1, "add_bias: bias of ", bias.cols(), " for rows of ", x.cols());
  if (ctx_->skip_launch(5, x.data(), x.dtype(), bias.data(), bias.dtype(), x.rows(), x.cols())) return;
  cuda::engine::add_bias(x.dtype(), x.data(), bias.dtype(), bias.data(), x.rows(), x.cols(), as_stream(ctx_->stream));
}

void cuda_backend::rope(cuda_tensor& x, std::span<const std::int32_t> pos, int head_dim, float theta,
                        rope_style style) const {
  rope(x, pos, head_dim, theta, style, rope_scaling_config{});
}

void cuda_backend::rope(cuda_tensor& x, std::span<const std::int32_t> pos, int head_dim, float theta, rope_style style,
                        const rope_scaling_config& scaling) const {
  context& c = use(ctx_);
  check(static_cast<std::size_t>(x.rows()) == pos.size(), "rope: ", x.rows(), " rows but ", pos.size(), " positions");
  check(head_dim > 0 && x.cols() % head_dim == 0, "rope: row of ", x.cols(), " is not a multiple of head_dim ", head_dim);
  if (x.empty()) return;
  // The (scaled) inverse frequencies, in double as cpu::rope computes them, once per configuration.
  char key[160];
  std::snprintf(key, sizeof key, "%d/%.9g/%d/%.9g/%.9g/%.9g/%d", head_dim, double(theta), int(scaling.type),
                double(scaling.factor), double(scaling.low_freq_factor), double(scaling.high_freq_factor),
                scaling.original_max_position);
  double*& table = c.rope_tables[key];
  if (table == nullptr) {
    std::vector<double> inv(static_cast<std::size_t>(head_dim / 2));
    for (int i = 0; i < head_dim / 2; ++i)
      inv[static_cast<std::size_t>(i)] = scaling.apply(std::pow(double(theta), -2.0 * i / head_dim));
    ZIPAGE_CUDA_CHECK(cudaMalloc(&table, inv.size() * sizeof(double)));
    ZIPAGE_CUDA_CHECK(cudaMemcpy(table, inv.data(), inv.size() * sizeof(double), cudaMemcpyHostToDevice));
  }
  const section s{pos.data(), pos.size_bytes()};
  const auto* d_pos = c.upload(c.pos_up, cuda_detail::up_pos, {&s, 1}).at<std::int32_t>(0);
  if (c.skip_launch(6, x.data(), x.dtype(), d_pos, x.rows(), x.cols(), head_dim, table, style)) return;
  cuda::engine::rope(x.dtype(), x.data(), d_pos, x.rows(), x.cols() / head_dim, head_dim, table,
                     style == rope_style::interleaved, as_stream(c.stream));
}

void cuda_backend::silu_mul(const cuda_tensor& gate, const cuda_tensor& up, cuda_tensor& out) const {
  context& c = use(ctx_);
  check(gate.rows() == up.rows() && gate.cols() == up.cols() && gate.dtype() == up.dtype(),
        "silu_mul: gate and up differ in shape or type");
  access::shape(ctx_, out, gate.rows(), gate.cols(), gate.dtype());
  if (gate.empty()) return;
  const bool fast = gate.dtype() == cuda_dtype::bf16 && c.opts.fast_kernels;
  if (c.skip_launch(7, gate.data(), up.data(), out.data(), gate.rows(), gate.cols(), gate.dtype(), fast)) return;
  if (fast)
    cuda::silu_mul(gate.data(), up.data(), out.data(), gate.rows(), gate.cols(), 0, as_stream(c.stream));
  else
    cuda::engine::silu_mul(gate.dtype(), gate.data(), up.data(), out.data(), gate.size(), as_stream(c.stream));
}

void cuda_backend::add(cuda_tensor& x, const cuda_tensor& y) const {
  context& c = use(ctx_);
  check(x.rows() == y.rows() && x.cols() == y.cols() && x.dtype() == y.dtype(), "add: shapes or types differ (",
        x.rows(), "x", x.cols(), " and ", y.rows(), "x", y.cols(), ")");
  if (x.empty()) return;
  const bool fast = x.dtype() == cuda_dtype::bf16 && c.opts.fast_kernels;
  if (c.skip_launch(8, x.data(), y.data(), x.size(), x.dtype(), fast)) return;
  if (fast)
    cuda::add(x.data(), y.data(), x.data(), x.size(), as_stream(c.stream));
  else
    cuda::engine::add(x.dtype(), x.data(), y.data(), x.size(), as_stream(c.stream));
}

void cuda_backend::gather_rows(const cuda_tensor& x, std::span<const std::int32_t> rows, cuda_tensor& out) const {
  context& c = use(ctx_);
  check(&x != &out, "gather_rows: the output may not alias the input");
  for (const std::int32_t r : rows) check(r >= 0 && r < x.rows(), "gather_rows: row ", r, " outside ", x.rows());
  const section s{rows.data(), rows.size_bytes()};
  const auto* d_rows = c.upload(c.rows_up, cuda_detail::up_rows, {&s, 1}).at<std::int32_t>(0);
  access::shape(ctx_, out, static_cast<int>(rows.size()), x.cols(), x.dtype());
  if (rows.empty() || x.cols() == 0) return;
  const bool fast = x.dtype() == cuda_dtype::bf16 && c.opts.fast_kernels;
  if (c.skip_launch(9, x.data(), x.rows(), x.cols(), x.dtype(), d_rows, rows.size(), out.data(), fast)) return;
  if (fast)
    cuda::gather_rows(x.data(), x.rows(), x.cols(), d_rows, static_cast<int>(rows.size()), out.data(), as_stream(c.stream));
  else
    cuda::engine::gather_rows(x.dtype(), x.data(), x.cols(), d_rows, static_cast<int>(rows.size()), out.data(),
                              as_stream(c.stream));
}

namespace {

// Context lengths rounded up to four buckets per octave (at most 25% above), at least 64.
int context_bucket(int len) {
  const int b = std::max(len, 64);
  const int step = std::max(64, static_cast<int>(std::bit_floor(static_cast<unsigned>(b))) / 4);
  return (b + step - 1) / step * step;
}

// Copies the step's attention metadata to the device unless the last call already did (every layer
// after the first), and derives what the kernels need besides (prefill q_indptr, decode or not).
const cuda_detail::step_state& prepare_step(context& c, const attention_metadata& meta) {
  const section raw[] = {cuda_detail::span_section(meta.slot_mapping), cuda_detail::span_section(meta.token_seq),
                         cuda_detail::span_section(meta.token_kv_len), cuda_detail::span_section(meta.page_indptr),
                         cuda_detail::span_section(meta.page_indices), cuda_detail::span_section(meta.token_window_row)};
  const bool graphed = c.graph.phase != cuda_detail::graph_phase::off;
  if (graphed ? c.graph.same(cuda_detail::up_meta, raw) : c.meta_up.same(raw)) return c.step;

  auto& st = c.step;
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
    c.graph.kv_bucket = st.max_kv_len;
  }

  const section all[] = {raw[0], raw[1], raw[2], raw[3], raw[4], raw[5],
                         section{qi.data(), qi.size() * sizeof(std::int32_t)}};
  cuda_detail::staged d;
  if (graphed) {
    d = c.graph.stage(cuda_detail::up_meta, all);
  } else {
    c.meta_up.put(all, c.stream);
    for (std::size_t i = 0; i < std::size(all); ++i) d.p[i] = c.meta_up.device<char>(i);
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
  return st;
}

}  // namespace

void cuda_backend::attention(cuda_kv_storage& kv, int layer, const attention_metadata& meta, const cuda_tensor& q,
                             const cuda_tensor& k, const cuda_tensor& v, int num_q_heads, cuda_tensor& out) const {
  context& c = use(ctx_);
  const auto& s = kv.shape;
  const int d = s.head_dim;
  const int tokens = meta.num_tokens();
  check(q.dtype() == kv.dtype && k.dtype() == kv.dtype && v.dtype() == kv.dtype, "cuda_backend: the KV cache is ",
        to_string(kv.dtype), " but q/k/v are ", to_string(q.dtype()), " (build the model and the engine with the same "
        "cuda_backend: engine(model, config, policy, backend))");
  check(layer >= 0 && layer < s.num_layers, "attention: layer ", layer, " of ", s.num_layers);
  check(q.rows() == tokens && k.rows() == tokens && v.rows() == tokens, "attention: ", tokens, " tokens but q/k/v have ",
        q.rows(), "/", k.rows(), "/", v.rows(), " rows");
  check(q.cols() == num_q_heads * d && k.cols() == s.num_kv_heads * d && v.cols() == s.num_kv_heads * d,
        "attention: q/k/v widths do not match the heads");
  check(num_q_heads % s.num_kv_heads == 0, "attention: ", num_q_heads, " query heads for ", s.num_kv_heads, " KV heads");
  access::shape(ctx_, out, tokens, q.cols(), q.dtype());
  if (tokens == 0) return;

  const auto& st = prepare_step(c, meta);
  if (layer == 0 && !c.capturing())
    c.count([&](cuda_backend_counters& kc) {
      ++kc.forward_steps;
      kc.attention_tokens += tokens;
      kc.kv_tokens_read += st.kv_read;
      st.decode ? ++kc.decode_steps : ++kc.prefill_steps;
    });
  const std::size_t eb = kv.element_bytes();
  const std::size_t layer_off = static_cast<std::size_t>(s.layer_stride()) * static_cast<std::size_t>(layer) * eb;
  void* kc = static_cast<char*>(kv.k.data()) + layer_off;
  void* vc = static_cast<char*>(kv.v.data()) + layer_off;
  // FP8: this layer's per-(slot, KV head) scales.
  const bool fp8 = kv.fp8();
  float* ksc = fp8 ? static_cast<float*>(kv.k_scale.data()) + kv.scale_layer_elements() * layer : nullptr;
  float* vsc = fp8 ? static_cast<float*>(kv.v_scale.data()) + kv.scale_layer_elements() * layer : nullptr;
  const cuda::cuda_stream stream = as_stream(c.stream);
  const int width = s.num_kv_heads * d;
  const bool bf16_fast = kv.dtype == cuda_dtype::bf16 && c.opts.fast_kernels;

  // What to launch, decided before launching anything (a graph record pass launches nothing).
  const bool fast_append = !fp8 && bf16_fast && width % 8 == 0 && aligned16(kc) && aligned16(vc) &&
                           aligned16(k.data()) && aligned16(v.data());
  void* window_rows = nullptr;
  if (st.has_window && kv.queries.data() != nullptr) {
    check(s.num_q_heads == num_q_heads, "attention: the query-window cache has ", s.num_q_heads, " heads, q has ",
          num_q_heads);
    window_rows = static_cast<char*>(kv.queries.data()) + static_cast<std::size_t>(s.query_layer_stride()) *
                                                                static_cast<std::size_t>(layer) * kv.query_element_bytes();
  }
  const float scale = 1.0f / std::sqrt(float(d));
  const int group = num_q_heads / s.num_kv_heads;
  const bool tuned = bf16_fast && (d == 64 || d == 128) && power_of_two(s.block_size) && s.block_size >= 2 &&
                     aligned16(q.data()) && aligned16(out.data());
  enum class path { decode, prefill, generic };
  const path kind = tuned && st.decode && st.num_seqs <= 65535 ? path::decode
                    : tuned && group <= 64                     ? path::prefill
                                                               : path::generic;
  // The fields every attention kernel's parameters share.
  auto common = [&](auto& p) {
    p.q = q.data();
    p.out = out.data();
    p.k_cache = kc;
    p.v_cache = vc;
    p.k_scale = ksc;
    p.v_scale = vsc;
    p.page_indptr = st.page_indptr;
    p.page_indices = st.page_indices;
    p.num_q_heads = num_q_heads;
    p.num_kv_heads = s.num_kv_heads;
    p.head_dim = d;
    p.block_size = s.block_size;
    p.scale = scale;
  };
  cuda::decode_params dp;
  void* wsp = nullptr;
  std::size_t ws = 0;
  if (kind == path::decode) {
    common(dp);
    dp.kv_len = st.token_kv_len;  // one token per sequence: token t is sequence t
    dp.num_seqs = st.num_seqs;
    dp.max_kv_len = st.max_kv_len;
    auto& mst = c.step;
    const std::array<int, 6> key{st.num_seqs, st.max_kv_len, num_q_heads, s.num_kv_heads, d, s.block_size};
    if (mst.plan_key != key) {
      mst.plan = cuda::plan_decode(dp);
      mst.plan_key = key;
    }
    ws = cuda::decode_workspace_bytes(dp, mst.plan);
    wsp = ws ? c.decode_ws.reserve(ws, c.stream) : nullptr;
  }
  if (c.skip_launch(10, layer, kc, vc, q.data(), k.data(), v.data(), out.data(), tokens, st.num_seqs, st.max_kv_len,
                    st.slots, st.token_seq, st.token_kv_len, st.page_indptr, st.page_indices, st.q_indptr,
                    st.window_rows, window_rows, fast_append, kind, c.step.plan.num_splits, c.step.plan.chunk_tokens,
                    c.step.plan.stages, wsp, ws, num_q_heads, s.num_kv_heads, d, s.block_size, kv.dtype, ksc, vsc))
    return;

  if (fp8)
    cuda::engine::append_kv_fp8(kv.dtype, static_cast<std::uint8_t*>(kc), static_cast<std::uint8_t*>(vc), ksc, vsc,
                                k.data(), v.data(), st.slots, tokens, s.num_kv_heads, d, stream);
  else if (fast_append)
    cuda::append_kv(kc, vc, k.data(), v.data(), st.slots, tokens, s.num_kv_heads, d, 0, 0, stream);
  else
    cuda::engine::append_kv(kv.dtype, kc, vc, k.data(), v.data(), st.slots, tokens, width, stream);
  if (window_rows) cuda::engine::record_queries(kv.dtype, window_rows, st.window_rows, q.data(), tokens, q.cols(), stream);

  if (kind == path::decode) {
    cuda::paged_decode_attention(dp, c.step.plan, wsp, ws, stream);
    return;
  }
  if (kind == path::prefill) {
    cuda::prefill_params p;
    common(p);
    p.q_indptr = st.q_indptr;
    p.token_kv_len = st.token_kv_len;
    p.num_tokens = tokens;
    p.num_seqs = st.num_seqs;
    cuda::paged_prefill_attention(p, stream);
    return;
  }
  cuda::engine::generic_attention_params p;
  common(p);
  p.token_seq = st.token_seq;
  p.token_kv_len = st.token_kv_len;
  p.num_tokens = tokens;
  cuda::engine::paged_attention(kv.dtype, p, stream);
}

// ---------------------------------------------------------------------------------------------------
// compression hooks (worker thread, side stream)

namespace {

// Runs `fill(device_out)` on the side stream into `count` fp32 values and copies them into `out`.
template <class Fill>
void side_gather(context& c, std::size_t count, std::vector<float>& out, Fill&& fill) {
  const std::size_t bytes = count * sizeof(float);
  out.resize(count);
  if (count == 0) return;
  auto* dev = static_cast<float*>(c.side_dev.reserve(bytes, c.side));
  c.side_host.reserve(bytes);
  fill(dev);
  ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(c.side_host.p, dev, bytes, cudaMemcpyDeviceToHost, c.side));
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.side));
  std::memcpy(out.data(), c.side_host.p, bytes);
}

void check_pages(const kv_cache_shape& s, std::span<const block_id> pages, int kv_len) {
  check(kv_len >= 0 && static_cast<std::int64_t>(pages.size()) * s.block_size >= kv_len, "compression: ", pages.size(),
        " pages cannot hold ", kv_len, " tokens");
  for (const block_id b : pages) check(b >= 0 && b < s.num_blocks, "compression: block ", b, " outside the pool");
}

}  // namespace

void cuda_backend::gather_keys(cuda_kv_storage& kv, int layer, std::span<const block_id> pages, int kv_len,
                               std::vector<float>& out) const {
  context& c = use(ctx_);
  const auto t0 = cuda_detail::clock::now();
  std::lock_guard lock(c.side_mu);
  c.activate();
  const auto& s = kv.shape;
  check_pages(s, pages, kv_len);
  const section sec{pages.data(), pages.size_bytes()};
  c.side_up.upload({&sec, 1}, c.side);
  const void* k_layer =
      static_cast<const char*>(kv.k.data()) + static_cast<std::size_t>(s.layer_stride() * layer) * kv.element_bytes();
  const std::size_t n = static_cast<std::size_t>(s.num_kv_heads) * static_cast<std::size_t>(kv_len) * s.head_dim;
  side_gather(c, n, out, [&](float* dev) {
    if (kv.fp8())
      cuda::engine::gather_keys_fp8(static_cast<const std::uint8_t*>(k_layer),
                                    static_cast<const float*>(kv.k_scale.data()) + kv.scale_layer_elements() * layer,
                                    c.side_up.device<std::int32_t>(0), s.block_size, s.num_kv_heads, s.head_dim, kv_len,
                                    dev, as_stream(c.side));
    else
      cuda::engine::gather_keys(kv.dtype, k_layer, c.side_up.device<std::int32_t>(0), s.block_size, s.num_kv_heads,
                                s.head_dim, kv_len, dev, as_stream(c.side));
  });
  const double dt = cuda_detail::seconds_since(t0);
  c.count([&](cuda_backend_counters& k) {
    ++k.gathers;
    k.gather_seconds += dt;
    k.gather_bytes += static_cast<std::int64_t>(n * sizeof(float));
  });
}

void cuda_backend::gather_scores(cuda_kv_storage& kv, int layer, std::span<const block_id> pages, int kv_len,
                                 std::vector<float>& out) const {
  context& c = use(ctx_);
  const auto& s = kv.shape;
  const std::size_t n = static_cast<std::size_t>(s.num_kv_heads) * static_cast<std::size_t>(kv_len);
  if (!s.score_cache) {
    out.assign(n, 0.0f);
    return;
  }
  const auto t0 = cuda_detail::clock::now();
  std::lock_guard lock(c.side_mu);
  c.activate();
  check_pages(s, pages, kv_len);
  const section sec{pages.data(), pages.size_bytes()};
  c.side_up.upload({&sec, 1}, c.side);
  const float* layer_scores = static_cast<const float*>(kv.scores.data()) +
                              static_cast<std::size_t>(s.num_blocks) * s.block_size * s.num_kv_heads * layer;
  side_gather(c, n, out, [&](float* dev) {
    cuda::engine::gather_scores(layer_scores, c.side_up.device<std::int32_t>(0), s.block_size, s.num_kv_heads, kv_len,
                                dev, as_stream(c.side));
  });
  const double dt = cuda_detail::seconds_since(t0);
  c.count([&](cuda_backend_counters& k) {
    ++k.gathers;
    k.gather_seconds += dt;
    k.gather_bytes += static_cast<std::int64_t>(n * sizeof(float));
  });
}

void cuda_backend::gather_window_queries(cuda_kv_storage& kv, int layer, int slot, std::vector<float>& out) const {
  context& c = use(ctx_);
  const auto& s = kv.shape;
  check(slot >= 0 && slot < s.num_query_slots, "compression: query slot ", slot, " outside ", s.num_query_slots);
  const auto t0 = cuda_detail::clock::now();
  std::lock_guard lock(c.side_mu);
  c.activate();
  const std::size_t n = static_cast<std::size_t>(s.window * s.query_row_stride());
  const void* src = static_cast<const char*>(kv.queries.data()) +
                    (static_cast<std::size_t>(s.query_layer_stride()) * static_cast<std::size_t>(layer) +
                     n * static_cast<std::size_t>(slot)) *
                        kv.query_element_bytes();
  side_gather(c, n, out, [&](float* dev) {
    cuda::engine::to_f32(kv.dtype, src, dev, static_cast<std::int64_t>(n), as_stream(c.side));
  });
  const double dt = cuda_detail::seconds_since(t0);
  c.count([&](cuda_backend_counters& k) {
    ++k.gathers;
    k.gather_seconds += dt;
    k.gather_bytes += static_cast<std::int64_t>(n * sizeof(float));
  });
}

void cuda_backend::apply_compaction(cuda_kv_storage& kv, const compaction_plan& plan) const {
  context& c = use(ctx_);
  const auto t0 = cuda_detail::clock::now();
  std::lock_guard lock(c.side_mu);
  c.activate();
  const auto& s = kv.shape;
  check(plan.num_layers == s.num_layers && plan.num_kv_heads == s.num_kv_heads, "apply_compaction: plan for ",
        plan.num_layers, " layers x ", plan.num_kv_heads, " heads on a cache of ", s.num_layers, " x ", s.num_kv_heads);
  check(plan.keep.size() == static_cast<std::size_t>(plan.num_layers) * plan.num_kv_heads * plan.new_len,
        "apply_compaction: keep has ", plan.keep.size(), " entries");
  check_pages(s, plan.pages, plan.old_len);
  for (int l = 0; l < plan.num_layers; ++l)
    for (int h = 0; h < plan.num_kv_heads; ++h) {
      const auto kept = plan.kept(l, h);
      for (int i = 0; i < plan.new_len; ++i) {
        const int src = kept[static_cast<std::size_t>(i)];
        check(src >= i && src < plan.old_len && (i == 0 || src > kept[static_cast<std::size_t>(i) - 1]),
              "apply_compaction: kept indices must ascend within [0, old_len)");
      }
    }
  const bool scores = s.score_cache && !plan.kept_scores.empty();
  const section secs[] = {cuda_detail::span_section(std::span<const block_id>(plan.pages)),
                          cuda_detail::span_section(std::span<const std::int32_t>(plan.keep)),
                          scores ? cuda_detail::span_section(std::span<const float>(plan.kept_scores)) : section{nullptr, 0}};
  c.side_up.put(secs, c.side);
  cuda::engine::compaction_params p;
  p.k = kv.k.data();
  p.v = kv.v.data();
  p.scores = scores ? static_cast<float*>(kv.scores.data()) : nullptr;
  p.pages = c.side_up.device<std::int32_t>(0);
  p.keep = c.side_up.device<std::int32_t>(1);
  p.kept_scores = scores ? c.side_up.device<float>(2) : nullptr;
  p.layer_elements = s.layer_stride();
  p.score_layer_elements = std::int64_t{s.num_blocks} * s.block_size * s.num_kv_heads;
  p.num_layers = plan.num_layers;
  p.num_kv_heads = plan.num_kv_heads;
  p.head_dim = s.head_dim;
  p.block_size = s.block_size;
  p.new_len = plan.new_len;
  p.dtype = kv.dtype;
  if (kv.fp8()) {
    // Codes (1 byte each) with the scores, then the scales as rows of one fp32 (head_dim 1): a kept
    // token's codes and scale move together, bit for bit.
    p.element_bytes = 1;
    cuda::engine::apply_compaction(p, as_stream(c.side));
    cuda::engine::compaction_params ps = p;
    ps.k = kv.k_scale.data();
    ps.v = kv.v_scale.data();
    ps.scores = nullptr;
    ps.kept_scores = nullptr;
    ps.layer_elements = kv.scale_layer_elements();
    ps.head_dim = 1;
    ps.element_bytes = 4;
    cuda::engine::apply_compaction(ps, as_stream(c.side));
  } else {
    cuda::engine::apply_compaction(p, as_stream(c.side));
  }
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.side));  // done before the engine reuses the freed tail blocks
  const double dt = cuda_detail::seconds_since(t0);
  c.count([&](cuda_backend_counters& k) {
    ++k.compactions;
    k.compaction_seconds += dt;
  });
}

bool cuda_backend::compress_on_device(cuda_kv_storage& kv, std::span<const device_compression_job> jobs,
                                     const score_recipe& recipe, const compression_params& params, int keep) const {
  context& c = use(ctx_);
  const auto& sh = kv.shape;
  // Configurations the kernels do not cover go to the host path (which also reports bad arguments).
  // FP8 caches are covered too (keys dequantised to bf16 tiles, compaction moves codes and scales).
  if (!c.opts.device_compression || kv.dtype != cuda_dtype::bf16) return false;
  if (recipe.uses_score_cache() && (!sh.score_cache || kv.scores.data() == nullptr)) return false;
  if (recipe.needs_queries() && kv.queries.data() == nullptr) return false;
  if (sh.head_dim != 64 && sh.head_dim != 128) return false;
  if (!power_of_two(sh.block_size) || sh.block_size < 2 || sh.block_size > 512) return false;
  if (params.block_size != sh.block_size || params.window != sh.window || sh.window < 1 || sh.window > 256) return false;
  if (sh.num_kv_heads <= 0 || sh.num_q_heads % sh.num_kv_heads != 0 || sh.num_q_heads / sh.num_kv_heads > 128)
    return false;
  if (keep < sh.window) return false;  // the host path throws its message
  if (jobs.empty()) return true;
  int max_len = 0;
  std::int64_t total_pages = 0;
  for (const device_compression_job& j : jobs) {
    if (j.kv_len < sh.window || (recipe.needs_queries() && (j.slot < 0 || j.slot >= sh.num_query_slots))) return false;
    if (static_cast<std::int64_t>(j.pages.size()) * sh.block_size < j.kv_len) return false;
    for (const block_id b : j.pages)
      if (b < 0 || b >= sh.num_blocks) return false;
    max_len = std::max(max_len, j.kv_len);
    total_pages += static_cast<std::int64_t>(j.pages.size());
  }

  cuda::compress_params p;
  p.k_cache = kv.k.data();
  p.v_cache = kv.v.data();
  p.score_cache = sh.score_cache ? static_cast<float*>(kv.scores.data()) : nullptr;
  p.query_cache = kv.queries.data();
  p.num_blocks = sh.num_blocks;
  p.num_slots = std::max(1, sh.num_query_slots);
  p.num_reqs = static_cast<int>(jobs.size());
  p.max_kv_len = max_len;
  p.num_q_heads = sh.num_q_heads;
  p.num_kv_heads = sh.num_kv_heads;
  p.head_dim = sh.head_dim;
  p.block_size = sh.block_size;
  p.window = sh.window;
  p.keep = keep;
  p.recipe = recipe;
  // Layers per launch: as many as keep the workspace under its cap (the reference scores 8 layers per
  // launch for the same reason), at least one.
  p.num_layers = 1;
  std::size_t per_layer = 0;
  try {
    per_layer = cuda::compress_workspace_bytes(p);  // validates the shape (host-side only)
  } catch (const error&) {
    return false;
  }
  constexpr std::size_t workspace_cap = std::size_t{512} << 20;
  const int layers_per_launch =
      std::clamp(static_cast<int>(workspace_cap / std::max<std::size_t>(per_layer, 1)), 1, sh.num_layers);
  p.num_layers = layers_per_launch;
  const std::size_t ws_bytes = cuda::compress_workspace_bytes(p);

  const auto t0 = cuda_detail::clock::now();
  std::lock_guard lock(c.side_mu);
  c.activate();
  c.compress_staging.indptr.assign(1, 0);
  c.compress_staging.indices.clear();
  c.compress_staging.indices.reserve(static_cast<std::size_t>(total_pages));
  c.compress_staging.lens.clear();
  c.compress_staging.slots.clear();
  c.compress_staging.first.clear();
  for (const device_compression_job& j : jobs) {
    c.compress_staging.indices.insert(c.compress_staging.indices.end(), j.pages.begin(), j.pages.end());
    c.compress_staging.indptr.push_back(static_cast<std::int32_t>(c.compress_staging.indices.size()));
    c.compress_staging.lens.push_back(j.kv_len);
    c.compress_staging.slots.push_back(std::max(0, j.slot));
    c.compress_staging.first.push_back(j.first_compression ? 1 : 0);
  }
  const auto& st = c.compress_staging;
  const section secs[] = {cuda_detail::span_section(std::span<const std::int32_t>(st.indptr)),
                          cuda_detail::span_section(std::span<const std::int32_t>(st.indices)),
                          cuda_detail::span_section(std::span<const std::int32_t>(st.lens)),
                          cuda_detail::span_section(std::span<const std::int32_t>(st.slots)),
                          cuda_detail::span_section(std::span<const std::uint8_t>(st.first))};
  c.side_up.put(secs, c.side);
  p.page_indptr = c.side_up.device<std::int32_t>(0);
  p.page_indices = c.side_up.device<std::int32_t>(1);
  p.kv_len = c.side_up.device<std::int32_t>(2);
  p.slot = c.side_up.device<std::int32_t>(3);
  p.first_compression = c.side_up.device<std::uint8_t>(4);
  void* ws = c.compress_ws.reserve(std::max<std::size_t>(ws_bytes, 256), c.side);
  const std::size_t elem = kv.element_bytes();
  for (int l0 = 0; l0 < sh.num_layers; l0 += layers_per_launch) {
    cuda::compress_params q = p;
    q.num_layers = std::min(layers_per_launch, sh.num_layers - l0);
    q.k_cache = static_cast<char*>(kv.k.data()) + static_cast<std::size_t>(sh.layer_stride()) * l0 * elem;
    q.v_cache = static_cast<char*>(kv.v.data()) + static_cast<std::size_t>(sh.layer_stride()) * l0 * elem;
    if (p.score_cache != nullptr)
      q.score_cache = p.score_cache + static_cast<std::size_t>(sh.num_blocks) * sh.block_size * sh.num_kv_heads * l0;
    if (kv.fp8()) {
      q.k_scale = static_cast<float*>(kv.k_scale.data()) + kv.scale_layer_elements() * l0;
      q.v_scale = static_cast<float*>(kv.v_scale.data()) + kv.scale_layer_elements() * l0;
    }
    if (kv.queries.data() != nullptr)
      q.query_cache = static_cast<const char*>(kv.queries.data()) +
                      static_cast<std::size_t>(sh.query_layer_stride()) * l0 * kv.query_element_bytes();
    cuda::compress(q, ws, ws_bytes, as_stream(c.side));
  }
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.side));  // done before the engine reuses the freed tail blocks
  const double dt = cuda_detail::seconds_since(t0);
  const auto n = static_cast<std::int64_t>(jobs.size());
  c.count([&](cuda_backend_counters& k) {
    ++k.device_compression_batches;
    k.device_compressions += n;
    k.device_compression_seconds += dt;
    k.compactions += n;
    k.compaction_seconds += dt;
  });
  return true;
}

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
      const token_id tok = c.host_sampler.sample(row, *r.params, r.context, r.step);
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
  for (int i = 0; i < n; ++i) {
    const sample_row& r = rows[static_cast<std::size_t>(i)];
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
                          sec_if(tops, c.s_top)};
  c.sample_up.put(secs, c.stream);

  const void* src = logits.data();
  if (!identity) {  // the rows to sample, packed (the engine passes them in order, so this is rare)
    auto* packed = c.sample_rows.reserve(un * static_cast<std::size_t>(vocab) * dtype_bytes(logits.dtype()), c.stream);
    cuda::engine::gather_rows(logits.dtype(), logits.data(), vocab, c.sample_up.device<std::int32_t>(9), n, packed,
                              as_stream(c.stream));
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

// ---------------------------------------------------------------------------------------------------
// block copies and swapping (engine thread, main stream)

namespace {

struct kv_geometry {
  std::size_t block_bytes;  // K (or V) of one block, one layer
  std::size_t score_bytes;  // scores of one block, one layer (0 without a score cache)
  std::size_t slot_bytes;   // query-window rows of one slot, one layer
  std::size_t layer_bytes;
  std::size_t score_layer_bytes;
  std::size_t query_layer_bytes;
  std::size_t scale_bytes;        // FP8: one side's scales of one block (0 otherwise)
  std::size_t scale_layer_bytes;
};

kv_geometry geometry(const cuda_kv_storage& kv) {
  const auto& s = kv.shape;
  const std::size_t eb = kv.element_bytes();
  kv_geometry g{};
  g.block_bytes = static_cast<std::size_t>(s.block_size * s.token_stride()) * eb;
  g.score_bytes = s.score_cache ? static_cast<std::size_t>(s.block_size) * s.num_kv_heads * sizeof(float) : 0;
  g.slot_bytes = static_cast<std::size_t>(s.window * s.query_row_stride()) * kv.query_element_bytes();
  g.layer_bytes = static_cast<std::size_t>(s.layer_stride()) * eb;
  g.score_layer_bytes = static_cast<std::size_t>(s.num_blocks) * g.score_bytes;
  g.query_layer_bytes = static_cast<std::size_t>(s.query_layer_stride()) * kv.query_element_bytes();
  g.scale_bytes = kv.fp8() ? static_cast<std::size_t>(s.block_size) * s.num_kv_heads * sizeof(float) : 0;
  g.scale_layer_bytes = static_cast<std::size_t>(s.num_blocks) * g.scale_bytes;
  return g;
}

std::uint64_t addr(const void* p, std::size_t off) {
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p) + off);
}

void run_copies(context& c, const std::vector<cuda::engine::copy_desc>& descs) {
  if (descs.empty()) return;
  std::uint64_t max_bytes = 0;
  for (const auto& d : descs) max_bytes = std::max(max_bytes, d.bytes);
  const section s{descs.data(), descs.size() * sizeof(cuda::engine::copy_desc)};
  c.misc_up.put({&s, 1}, c.stream);
  cuda::engine::batched_copy(c.misc_up.device<cuda::engine::copy_desc>(0), static_cast<int>(descs.size()), max_bytes,
                             as_stream(c.stream));
}

// Pieces of a request's state, in the blob's order: per layer and page K, V, scores; then per layer the
// slot's query rows. `to_host` picks the direction.
std::vector<cuda::engine::copy_desc> state_copies(const cuda_kv_storage& kv, std::span<const block_id> pages, int slot,
                                                  bool queries, void* host, bool to_host) {
  const auto g = geometry(kv);
  const auto& s = kv.shape;
  std::vector<cuda::engine::copy_desc> descs;
  std::size_t at = 0;
  auto add = [&](const void* dev, std::size_t off, std::size_t bytes) {
    if (bytes == 0) return;
    const std::uint64_t d = addr(dev, off), h = addr(host, at);
    descs.push_back(to_host ? cuda::engine::copy_desc{d, h, bytes} : cuda::engine::copy_desc{h, d, bytes});
    at += bytes;
  };
  for (int l = 0; l < s.num_layers; ++l)
    for (const block_id b : pages) {
      const std::size_t off = g.layer_bytes * static_cast<std::size_t>(l) + g.block_bytes * static_cast<std::size_t>(b);
      add(kv.k.data(), off, g.block_bytes);
      add(kv.v.data(), off, g.block_bytes);
      const std::size_t soff = g.scale_layer_bytes * static_cast<std::size_t>(l) + g.scale_bytes * static_cast<std::size_t>(b);
      add(kv.k_scale.data(), soff, g.scale_bytes);  // FP8 only (0 bytes otherwise)
      add(kv.v_scale.data(), soff, g.scale_bytes);
      add(kv.scores.data(), g.score_layer_bytes * static_cast<std::size_t>(l) + g.score_bytes * static_cast<std::size_t>(b),
          g.score_bytes);
    }
  if (queries)
    for (int l = 0; l < s.num_layers; ++l)
      add(kv.queries.data(), g.query_layer_bytes * static_cast<std::size_t>(l) + g.slot_bytes * static_cast<std::size_t>(slot),
          g.slot_bytes);
  return descs;
}

}  // namespace

void cuda_backend::copy_block(cuda_kv_storage& kv, block_id from, block_id to) const {
  context& c = use(ctx_);
  const auto& s = kv.shape;
  check(from >= 0 && from < s.num_blocks && to >= 0 && to < s.num_blocks, "copy_block: block outside the pool");
  const auto g = geometry(kv);
  std::vector<cuda::engine::copy_desc> descs;
  for (int l = 0; l < s.num_layers; ++l) {
    const std::size_t base = g.layer_bytes * static_cast<std::size_t>(l);
    const std::size_t f = base + g.block_bytes * static_cast<std::size_t>(from);
    const std::size_t t = base + g.block_bytes * static_cast<std::size_t>(to);
    descs.push_back({addr(kv.k.data(), f), addr(kv.k.data(), t), g.block_bytes});
    descs.push_back({addr(kv.v.data(), f), addr(kv.v.data(), t), g.block_bytes});
    if (g.scale_bytes) {
      const std::size_t sb = g.scale_layer_bytes * static_cast<std::size_t>(l);
      for (void* scales : {kv.k_scale.data(), kv.v_scale.data()})
        descs.push_back({addr(scales, sb + g.scale_bytes * static_cast<std::size_t>(from)),
                         addr(scales, sb + g.scale_bytes * static_cast<std::size_t>(to)), g.scale_bytes});
    }
    if (g.score_bytes) {
      const std::size_t sb = g.score_layer_bytes * static_cast<std::size_t>(l);
      descs.push_back({addr(kv.scores.data(), sb + g.score_bytes * static_cast<std::size_t>(from)),
                       addr(kv.scores.data(), sb + g.score_bytes * static_cast<std::size_t>(to)), g.score_bytes});
    }
  }
  run_copies(c, descs);
  // The compression worker reads these blocks from its own stream next.
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  c.count([&](cuda_backend_counters& k) { ++k.block_copies; });
}

cuda_swap_blob cuda_backend::swap_out(cuda_kv_storage& kv, std::span<const block_id> pages, int slot) const {
  context& c = use(ctx_);
  c.activate();
  const auto& s = kv.shape;
  check_pages(s, pages, 0);
  const auto g = geometry(kv);
  cuda_swap_blob blob;
  blob.num_pages = pages.size();
  blob.has_queries = slot >= 0 && g.slot_bytes > 0 && kv.queries.data() != nullptr;
  blob.bytes = pages.size() * static_cast<std::size_t>(s.num_layers) * (2 * g.block_bytes + 2 * g.scale_bytes + g.score_bytes) +
               (blob.has_queries ? g.slot_bytes * static_cast<std::size_t>(s.num_layers) : 0);
  if (blob.bytes == 0) return blob;
  void* host = nullptr;
  ZIPAGE_CUDA_CHECK(cudaHostAlloc(&host, blob.bytes, cudaHostAllocPortable | cudaHostAllocMapped));
  blob.host = std::shared_ptr<void>(host, [](void* p) { cudaFreeHost(p); });
  void* dev_view = nullptr;
  ZIPAGE_CUDA_CHECK(cudaHostGetDevicePointer(&dev_view, host, 0));
  run_copies(c, state_copies(kv, pages, slot, blob.has_queries, dev_view, true));
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  c.count([&](cuda_backend_counters& k) {
    ++k.swaps_out;
    k.swap_bytes += static_cast<std::int64_t>(blob.bytes);
  });
  return blob;
}

void cuda_backend::swap_in(cuda_kv_storage& kv, std::span<const block_id> pages, int slot, cuda_swap_blob& blob) const {
  context& c = use(ctx_);
  c.activate();
  check(pages.size() >= blob.num_pages, "swap-in: ", pages.size(), " pages for ", blob.num_pages, " saved");
  if (blob.bytes == 0) return;
  const auto restore = pages.first(blob.num_pages);
  check_pages(kv.shape, restore, 0);
  void* dev_view = nullptr;
  ZIPAGE_CUDA_CHECK(cudaHostGetDevicePointer(&dev_view, blob.host.get(), 0));
  const bool queries = blob.has_queries && slot >= 0;
  run_copies(c, state_copies(kv, restore, slot, queries, dev_view, false));
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.stream));  // the engine drops the blob right after
  c.count([&](cuda_backend_counters& k) {
    ++k.swaps_in;
    k.swap_bytes += static_cast<std::int64_t>(blob.bytes);
  });
}

// ---------------------------------------------------------------------------------------------------
// extras

cuda_tensor cuda_backend::random_tensor(int rows, int cols, float scale, std::uint64_t seed) const {
  cuda_tensor t;
  access::shape(ctx_, t, rows, cols, ctx_->opts.dtype);
  cuda::engine::fill_uniform(t.dtype(), t.data(), t.size(), scale, seed, as_stream(ctx_->stream));
  return t;
}

cuda_tensor cuda_backend::constant_tensor(int rows, int cols, float value) const {
  cuda_tensor t;
  access::shape(ctx_, t, rows, cols, ctx_->opts.dtype);
  cuda::engine::fill_constant(t.dtype(), t.data(), t.size(), value, as_stream(ctx_->stream));
  return t;
}

void cuda_backend::kv_fp8_to_host(const cuda_kv_storage& kv, bool values, std::vector<std::uint8_t>& codes,
                                  std::vector<float>& scales) const {
  context& c = use(ctx_);
  c.activate();
  check(kv.fp8(), "kv_fp8_to_host: the KV cache is not FP8");
  codes.resize(static_cast<std::size_t>(kv.shape.elements_per_side()));
  scales.resize(static_cast<std::size_t>(kv.scale_layer_elements() * kv.shape.num_layers));
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  ZIPAGE_CUDA_CHECK(cudaMemcpy(codes.data(), values ? kv.v.data() : kv.k.data(), codes.size(), cudaMemcpyDeviceToHost));
  ZIPAGE_CUDA_CHECK(cudaMemcpy(scales.data(), values ? kv.v_scale.data() : kv.k_scale.data(),
                               scales.size() * sizeof(float), cudaMemcpyDeviceToHost));
}

std::vector<float> cuda_backend::kv_to_host(const cuda_kv_storage& kv, bool values) const {
  if (kv.fp8()) {
    std::vector<std::uint8_t> codes;
    std::vector<float> scales;
    kv_fp8_to_host(kv, values, codes, scales);
    std::vector<float> out(codes.size());
    const std::size_t d = static_cast<std::size_t>(kv.shape.head_dim);
    for (std::size_t i = 0; i < codes.size(); ++i) out[i] = fp8_e4m3_to_f32(codes[i]) * scales[i / d];
    return out;
  }
  context& c = use(ctx_);
  c.activate();
  const auto n = static_cast<std::size_t>(kv.shape.elements_per_side());
  std::vector<float> out(n);
  void* f = c.to_host_dev.reserve(n * sizeof(float), c.stream);
  cuda::engine::to_f32(kv.dtype, values ? kv.v.data() : kv.k.data(), static_cast<float*>(f), static_cast<std::int64_t>(n),
                       as_stream(c.stream));
  ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(out.data(), f, n * sizeof(float), cudaMemcpyDeviceToHost, c.stream));
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  return out;
}

// ---------------------------------------------------------------------------------------------------
// CUDA graphs for decode steps

int cuda_backend::decode_graph_batch(int num_seqs) const {
  const auto& o = ctx_->opts;
  if (!o.cuda_graphs || num_seqs <= 0 || num_seqs > o.max_graph_batch) return 0;
  const int step = num_seqs <= 16 ? 0 : num_seqs <= 256 ? 16 : num_seqs <= 512 ? 32 : 64;
  const int padded = step == 0 ? static_cast<int>(std::bit_ceil(static_cast<unsigned>(num_seqs)))
                               : (num_seqs + step - 1) / step * step;
  return std::min(padded, std::max(o.max_graph_batch, num_seqs));
}

const cuda_tensor& cuda_backend::run_decode_graph(int batch, const std::function<const cuda_tensor&()>& forward) const {
  context& c = use(ctx_);
  auto& g = c.graph;
  using cuda_detail::graph_phase;
  check(g.phase == graph_phase::off, "run_decode_graph: called from inside a forward pass");
  // Eager steps compare their metadata with the uploader's last copy; the graph passes point the step
  // state elsewhere, so that copy may no longer be what the step state uses.
  c.meta_up.invalidate();
  struct reset_phase {
    cuda_detail::graph_state& g;
    ~reset_phase() { g.phase = graph_phase::off; }
  } reset{g};

  // Record: the forward's host side only (stage inputs, size outputs, sign the launches). A pass that had
  // to move the device arena signed stale pointers, so it runs again.
  const cuda_tensor* logits = nullptr;
  for (int pass = 0; pass < 2; ++pass) {
    g.begin(graph_phase::record, c.stream);
    logits = &forward();
    if (!g.arena_moved) break;
  }
  const std::uint64_t signature = g.signature;
  const std::pair<int, int> key{batch, g.kv_bucket};
  g.record_layout = g.layout;
  g.phase = graph_phase::off;
  if (g.used) ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(g.dev, g.host.p, g.used, cudaMemcpyHostToDevice, c.stream));
  ZIPAGE_CUDA_CHECK(cudaEventRecord(g.copied, c.stream));

  auto it = g.graphs.find(key);
  if (it != g.graphs.end() && it->second.signature == signature) {
    ZIPAGE_CUDA_CHECK(cudaGraphLaunch(it->second.exec, c.stream));
    c.count([&](cuda_backend_counters& k) { ++k.graph_replays; });
    return *logits;
  }

  // Capture the same forward (it launches this time) and instantiate it, or update the key's old graph.
  const auto t0 = cuda_detail::clock::now();
  g.begin(graph_phase::capture, c.stream);
  cudaGraph_t graph = nullptr;
  ZIPAGE_CUDA_CHECK(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeThreadLocal));
  try {
    forward();
  } catch (...) {
    cudaStreamEndCapture(c.stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  ZIPAGE_CUDA_CHECK(cudaStreamEndCapture(c.stream, &graph));
  g.phase = graph_phase::off;
  struct graph_guard {
    cudaGraph_t g;
    ~graph_guard() { cudaGraphDestroy(g); }
  } guard{graph};
  check(g.signature == signature, "cuda graphs: the capture pass launched other kernels than the record pass");
  bool updated = false;
  if (it != g.graphs.end()) {
    cudaGraphExecUpdateResultInfo info{};
    updated = cudaGraphExecUpdate(it->second.exec, graph, &info) == cudaSuccess;
    if (!updated) {
      cudaGetLastError();  // clear the failed update's error
      cudaGraphExecDestroy(it->second.exec);
      g.graphs.erase(it);
    }
  }
  if (!updated) {
    if (static_cast<int>(g.graphs.size()) >= std::max(1, c.opts.max_graphs)) g.clear();
    cudaGraphExec_t exec = nullptr;
    ZIPAGE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    it = g.graphs.emplace(key, cuda_detail::graph_entry{exec, signature}).first;
  }
  it->second.signature = signature;
  ZIPAGE_CUDA_CHECK(cudaGraphLaunch(it->second.exec, c.stream));
  const double secs = cuda_detail::seconds_since(t0);
  c.count([&](cuda_backend_counters& k) {
    ++k.graph_captures;
    k.graph_updates += updated ? 1 : 0;
    k.graph_capture_seconds += secs;
  });
  return *logits;
}

void cuda_backend::synchronize() const {
  ctx_->activate();
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));
}

cuda_backend_counters cuda_backend::counters() const {
  std::lock_guard lock(ctx_->counters_mu);
  return ctx_->counters;
}

void cuda_backend::reset_counters() const {
  std::lock_guard lock(ctx_->counters_mu);
  ctx_->counters = {};
}

std::pair<std::size_t, std::size_t> cuda_backend::memory_info() const {
  ctx_->activate();
  std::size_t free_b = 0, total_b = 0;
  ZIPAGE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return {free_b, total_b};
}

std::string cuda_backend::device_name() const {
  cudaDeviceProp p{};
  ZIPAGE_CUDA_CHECK(cudaGetDeviceProperties(&p, ctx_->opts.device));
  return p.name;
}

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}
}  // namespace

double cuda_backend::measure_copy_bandwidth(std::size_t bytes, int reps) const {
  context& c = use(ctx_);
  c.activate();
  void *a = nullptr, *b = nullptr;
  ZIPAGE_CUDA_CHECK(cudaMalloc(&a, bytes));
  ZIPAGE_CUDA_CHECK(cudaMalloc(&b, bytes));
  cuda::engine::fill_uniform(cuda_dtype::f32, a, static_cast<std::int64_t>(bytes / 4), 1.0f, 7, as_stream(c.stream));
  cudaEvent_t e0, e1;
  ZIPAGE_CUDA_CHECK(cudaEventCreate(&e0));
  ZIPAGE_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> times;
  for (int r = 0; r < reps + 2; ++r) {
    ZIPAGE_CUDA_CHECK(cudaEventRecord(e0, c.stream));
    ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, c.stream));
    ZIPAGE_CUDA_CHECK(cudaEventRecord(e1, c.stream));
    ZIPAGE_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    ZIPAGE_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (r >= 2) times.push_back(ms * 1e-3);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(bytes) / median(times) / 1e9;
}

double cuda_backend::measure_gemm_tflops(int n, int reps) const {
  context& c = use(ctx_);
  c.activate();
  cuda_backend_options o = c.opts;
  o.dtype = cuda_dtype::bf16;
  o.batch_invariant = false;
  const cuda_backend bf(o);
  const cuda_tensor x = bf.random_tensor(n, n, 1.0f, 1), w = bf.random_tensor(n, n, 1.0f, 2);
  cuda_tensor out;
  bf.linear(x, w, out);
  bf.synchronize();
  const auto& bc = *bf.ctx_;
  cudaEvent_t e0, e1;
  ZIPAGE_CUDA_CHECK(cudaEventCreate(&e0));
  ZIPAGE_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> times;
  for (int r = 0; r < reps + 1; ++r) {
    ZIPAGE_CUDA_CHECK(cudaEventRecord(e0, bc.stream));
    bf.linear(x, w, out);
    ZIPAGE_CUDA_CHECK(cudaEventRecord(e1, bc.stream));
    ZIPAGE_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    ZIPAGE_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (r >= 1) times.push_back(ms * 1e-3);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 2.0 * double(n) * n * n / median(times) / 1e12;
}

}  // namespace zipage
