#pragma once
// Private to src/cuda/backend/ (not installed): the record/capture state of zipage::cuda_backend's CUDA
// graphs for decode steps (see cuda_backend.hpp and decode_graph.cu): the pinned input arena, the
// signature of a pass, the cached graphs.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "staging.cuh"
#include "zipage/core/error.hpp"

namespace zipage::cuda_detail {

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
  // Per uploader its last two stagings (one per nano-batch of an overlapped step), and which is the newer.
  std::array<std::array<last_upload, 2>, num_uploaders> last{};
  std::array<int, num_uploaders> recent{};
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
    recent.fill(0);
    kv_bucket = 0;
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

  // The entry of `who`'s last two stagings that starts with `secs` (all of it when `exact`), or -1.
  [[nodiscard]] int find(int who, std::span<const section> secs, bool exact = false) const {
    const auto w = static_cast<std::size_t>(who);
    for (int e : {recent[w], 1 - recent[w]}) {
      const auto& l = last[w][static_cast<std::size_t>(e)];
      if (!l.valid || l.count < secs.size() || (exact && l.count != secs.size())) continue;
      bool equal = true;
      for (std::size_t i = 0; i < secs.size() && equal; ++i) {
        const placed& pl = layout[l.first + i];
        equal = pl.bytes == secs[i].bytes &&
                (pl.bytes == 0 || std::memcmp(host.as() + pl.offset, secs[i].data, pl.bytes) == 0);
      }
      if (equal) return e;
    }
    return -1;
  }

  // find(who, secs), and the entry found becomes `who`'s most recent (so the next staging replaces the other one).
  int reuse(int who, std::span<const section> secs) {
    const int e = find(who, secs);
    if (e >= 0) recent[static_cast<std::size_t>(who)] = e;
    return e;
  }

  // Places the sections in the arena (record: copies them into `host`; capture: the record pass's places),
  // unless one of `who`'s last two stagings holds them; `entry` (optional) gets which of the two it is.
  staged stage(int who, std::span<const section> secs, int* entry = nullptr) {
    check(secs.size() <= staged{}.p.size(), "cuda graphs: too many sections in one upload");
    staged out;
    const auto w = static_cast<std::size_t>(who);
    int e = find(who, secs, true);
    if (e < 0) {
      e = 1 - recent[w];
      last[w][static_cast<std::size_t>(e)] = {layout.size(), secs.size(), true};
      place(secs);
    }
    recent[w] = e;
    if (entry) *entry = e;
    const auto& l = last[w][static_cast<std::size_t>(e)];
    for (std::size_t i = 0; i < secs.size(); ++i)
      out.p[i] = layout[l.first + i].bytes ? static_cast<const char*>(dev) + layout[l.first + i].offset : nullptr;
    return out;
  }

  void place(std::span<const section> secs) {
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
    }
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

}  // namespace zipage::cuda_detail
