#pragma once
// Private to src/cuda/backend/ (not installed): host <-> device staging for zipage::cuda_backend —
// grow-only pinned host memory and device scratch, and the uploader that moves a step's small host
// arrays to the device in one copy (skipped when equal to the last one).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include "zipage/backend/cuda/common.cuh"

namespace zipage::cuda_detail {

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
  [[nodiscard]] std::size_t num_sections() const { return sizes_.size(); }

 private:
  pinned_buffer host_;
  void* dev_ = nullptr;
  std::size_t dev_cap_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  std::vector<std::size_t> offsets_, sizes_;
  bool valid_ = false;
};

// Two uploaders used in turn, so that each nano-batch of an overlapped step (their ops alternate layer by layer)
// keeps its own last upload: an upload equal to either one's is skipped, otherwise it replaces the older one.
// (A device copy the other nano-batch's kernels still read is never overwritten within a step.)
class upload_cache {
 public:
  // The entry whose last upload starts with `secs` (every section when `exact`), or -1.
  [[nodiscard]] int find(std::span<const section> secs, bool exact) const {
    for (int i : {recent_, 1 - recent_})
      if (u_[i].same(secs) && (!exact || u_[i].num_sections() == secs.size())) return i;
    return -1;
  }
  // Copies `secs` into the older entry; returns it.
  int put(std::span<const section> secs, cudaStream_t s) {
    recent_ = 1 - recent_;
    u_[recent_].put(secs, s);
    return recent_;
  }
  // The entry holding `secs` (copying them when neither holds them).
  int upload(std::span<const section> secs, cudaStream_t s) {
    const int i = find(secs, true);
    if (i < 0) return put(secs, s);
    recent_ = i;
    return i;
  }
  // find(secs, false), and the entry found becomes the most recent (so the next put replaces the other one).
  int reuse(std::span<const section> secs) {
    const int i = find(secs, false);
    if (i >= 0) recent_ = i;
    return i;
  }
  [[nodiscard]] const uploader& entry(int i) const { return u_[i]; }
  void invalidate() {
    u_[0].invalidate();
    u_[1].invalidate();
  }

 private:
  uploader u_[2];
  int recent_ = 0;
};

template <class T>
section span_section(std::span<const T> s) {
  return {s.data(), s.size_bytes()};
}

}  // namespace zipage::cuda_detail
