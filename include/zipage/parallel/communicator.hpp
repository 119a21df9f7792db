#pragma once
// Collectives for tensor parallelism, and the ranks that run them.
//
// A `communicator` is one rank's end of a group of `size()` ranks: all-reduce (sum, in place), all-gather
// and barrier over float buffers. What a buffer pointer means is the implementation's: host memory for
// `in_process_communicator` (N threads of one process, the CPU reference), device memory on the rank's
// GPU for the NCCL communicator (parallel/nccl_communicator.hpp, in the CUDA build).
//
// A `tp_group` holds one communicator per rank and runs a function on every rank at once, one thread per
// rank (rank 0 on the calling thread): `group.run([&](int rank) { ... })`. That is the execution model of
// zipage's tensor parallelism on every backend: one process, one engine, one scheduler; each step, every
// rank runs the same forward over its shard (docs/tensor-parallel.md says why not one process per GPU).
//
// The in-process all-reduce is deterministic: element i is summed as ((x_0 + x_1) + x_2) + ... in rank
// order, whichever thread arrives first, and every rank receives the same bits, so fp32 results are
// reproducible run to run and identical on every rank (replicated state never drifts apart).
#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "zipage/core/error.hpp"

namespace zipage::parallel {

class communicator {
 public:
  virtual ~communicator() = default;
  [[nodiscard]] virtual int rank() const = 0;
  [[nodiscard]] virtual int size() const = 0;
  [[nodiscard]] virtual std::string_view kind() const = 0;  // "in-process", "nccl"
  // data[i] = the sum over ranks of their data[i], in place; every rank passes the same count.
  virtual void all_reduce_sum(float* data, std::size_t count) = 0;
  // recv[r * count + i] = rank r's send[i]; recv holds size() * count floats (it must not overlap send).
  virtual void all_gather(const float* send, float* recv, std::size_t count) = 0;
  virtual void barrier() = 0;
};

// The shared state of an in-process group: a reusable barrier (generation-counted) and the buffers each
// rank published for the collective in progress. A rank that fails calls abort(), so ranks blocked in a
// collective wake and throw instead of waiting forever; reset() makes the group usable again once every
// rank has returned.
class in_process_hub {
 public:
  explicit in_process_hub(int size) : size_(size) {
    check(size >= 1, "in-process communicator: the group size must be >= 1, got ", size);
    send_.resize(static_cast<std::size_t>(size));
    counts_.resize(static_cast<std::size_t>(size));
    partial_.resize(static_cast<std::size_t>(size));
  }

  [[nodiscard]] int size() const { return size_; }

  void arrive_and_wait() {
    std::unique_lock lock(mutex_);
    if (aborted_) throw error("in-process communicator: the group was aborted (another rank failed)");
    const std::uint64_t gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      wake_.notify_all();
      return;
    }
    wake_.wait(lock, [&] { return generation_ != gen || aborted_; });
    if (generation_ == gen) throw error("in-process communicator: the group was aborted (another rank failed)");
  }

  void abort() {
    std::lock_guard lock(mutex_);
    aborted_ = true;
    wake_.notify_all();
  }
  void reset() {
    std::lock_guard lock(mutex_);
    aborted_ = false;
    arrived_ = 0;
  }

  // Slots a rank writes before a barrier and the others read after it.
  std::vector<const float*> send_;
  std::vector<std::size_t> counts_;
  std::vector<std::vector<float>> partial_;  // rank r's reduced chunk of the all-reduce in progress

 private:
  int size_;
  std::mutex mutex_;
  std::condition_variable wake_;
  int arrived_ = 0;
  std::uint64_t generation_ = 0;
  bool aborted_ = false;
};

class in_process_communicator final : public communicator {
 public:
  in_process_communicator(std::shared_ptr<in_process_hub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {
    check(rank >= 0 && rank < hub_->size(), "in-process communicator: rank ", rank, " outside a group of ", hub_->size());
  }

  [[nodiscard]] int rank() const override { return rank_; }
  [[nodiscard]] int size() const override { return hub_->size(); }
  [[nodiscard]] std::string_view kind() const override { return "in-process"; }

  // Three phases: publish; reduce the rank's own chunk of every element range over all ranks in rank order
  // into a private buffer; copy every chunk back. The barriers keep a buffer from being overwritten while
  // another rank still reads it.
  void all_reduce_sum(float* data, std::size_t count) override {
    const auto r = static_cast<std::size_t>(rank_);
    const auto n = static_cast<std::size_t>(size());
    if (n == 1) return;
    hub_->send_[r] = data;
    hub_->counts_[r] = count;
    hub_->arrive_and_wait();
    check_counts(count, "all_reduce_sum");
    const std::size_t lo = chunk_begin(count, r), hi = chunk_begin(count, r + 1);
    auto& mine = hub_->partial_[r];
    mine.assign(hi - lo, 0.0f);
    for (std::size_t i = lo; i < hi; ++i) {
      float sum = hub_->send_[0][i];
      for (std::size_t s = 1; s < n; ++s) sum += hub_->send_[s][i];
      mine[i - lo] = sum;
    }
    hub_->arrive_and_wait();
    for (std::size_t s = 0; s < n; ++s)
      std::copy(hub_->partial_[s].begin(), hub_->partial_[s].end(), data + chunk_begin(count, s));
    hub_->arrive_and_wait();
  }

  void all_gather(const float* send, float* recv, std::size_t count) override {
    const auto r = static_cast<std::size_t>(rank_);
    const auto n = static_cast<std::size_t>(size());
    hub_->send_[r] = send;
    hub_->counts_[r] = count;
    hub_->arrive_and_wait();
    check_counts(count, "all_gather");
    for (std::size_t s = 0; s < n; ++s) std::copy_n(hub_->send_[s], count, recv + s * count);
    hub_->arrive_and_wait();
  }

  void barrier() override { hub_->arrive_and_wait(); }

 private:
  [[nodiscard]] std::size_t chunk_begin(std::size_t count, std::size_t s) const {
    return count * s / static_cast<std::size_t>(size());
  }
  void check_counts(std::size_t count, const char* what) const {
    for (std::size_t s = 0; s < hub_->counts_.size(); ++s)
      check(hub_->counts_[s] == count, "in-process communicator: ", what, ": rank ", rank_, " passed ", count,
            " floats, rank ", s, " passed ", hub_->counts_[s]);
  }

  std::shared_ptr<in_process_hub> hub_;
  int rank_;
};

// One communicator per rank and a thread per rank to run them. run(fn) calls fn(rank) on every rank at
// once and returns when all have returned; when one throws, `on_failure` (the in-process group aborts its
// hub) wakes the ranks blocked in a collective, and the first exception is rethrown. Not re-entrant: one
// run at a time (the engine's thread runs the forward; the compression worker never calls run()).
class tp_group {
 public:
  tp_group(std::vector<std::unique_ptr<communicator>> comms, std::function<void()> on_failure = {},
           std::function<void()> on_recover = {})
      : comms_(std::move(comms)), on_failure_(std::move(on_failure)), on_recover_(std::move(on_recover)) {
    check(!comms_.empty(), "tensor parallel: a group needs at least one rank");
    for (std::size_t r = 0; r < comms_.size(); ++r)
      check(comms_[r] && comms_[r]->rank() == static_cast<int>(r) && comms_[r]->size() == size(),
            "tensor parallel: communicator ", r, " is not rank ", r, " of ", size());
    for (int r = 1; r < size(); ++r) threads_.emplace_back([this, r] { serve(r); });
  }
  tp_group(const tp_group&) = delete;
  tp_group& operator=(const tp_group&) = delete;
  ~tp_group() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    start_.notify_all();
    for (auto& t : threads_) t.join();
  }

  // A group of `size` threads of this process over shared host buffers.
  [[nodiscard]] static std::shared_ptr<tp_group> in_process(int size) {
    auto hub = std::make_shared<in_process_hub>(size);
    std::vector<std::unique_ptr<communicator>> comms;
    for (int r = 0; r < size; ++r) comms.push_back(std::make_unique<in_process_communicator>(hub, r));
    return std::make_shared<tp_group>(std::move(comms), [hub] { hub->abort(); }, [hub] { hub->reset(); });
  }

  [[nodiscard]] int size() const { return static_cast<int>(comms_.size()); }
  [[nodiscard]] communicator& comm(int rank) const { return *comms_.at(static_cast<std::size_t>(rank)); }

  void run(const std::function<void(int rank)>& fn) {
    {
      std::lock_guard lock(mutex_);
      job_ = &fn;
      pending_ = size() - 1;
      error_ = nullptr;
      ++generation_;
    }
    start_.notify_all();
    execute(0);
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (error_) {
      auto e = std::exchange(error_, nullptr);
      lock.unlock();
      if (on_recover_) on_recover_();
      std::rethrow_exception(e);
    }
  }

 private:
  void execute(int rank) {
    try {
      (*job_)(rank);
    } catch (...) {
      {
        std::lock_guard lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
      if (on_failure_) on_failure_();
    }
  }

  void serve(int rank) {
    std::uint64_t seen = 0;
    while (true) {
      {
        std::unique_lock lock(mutex_);
        start_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
      }
      execute(rank);
      std::lock_guard lock(mutex_);
      if (--pending_ == 0) done_.notify_all();
    }
  }

  std::vector<std::unique_ptr<communicator>> comms_;
  std::function<void()> on_failure_, on_recover_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable start_, done_;
  const std::function<void(int)>* job_ = nullptr;
  std::uint64_t generation_ = 0;
  int pending_ = 0;
  std::exception_ptr error_;
  bool stopping_ = false;
};

}  // namespace zipage::parallel
