#pragma once
// Runs compressions apart from the decode loop. Threaded, a worker scores and compacts while the
// engine keeps decoding every other request; only the requests being compressed wait (they are left
// out of every batch until their job lands). The worker touches nothing but the request's own blocks
// and query slot; every block-pool change stays on the engine's thread.
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "zipage/compression/compressor.hpp"

namespace zipage {

// Optional backend hook: scores, selects and compacts one request under `Policy` entirely on the device
// (same result as compressor::plan + apply_compaction), returning the new physical length, or nothing
// when it cannot for this configuration (the generic host path then runs).
template <class Backend, class Policy>
concept device_compressor = requires(const Backend& b, typename Backend::kv_storage& kv, const sequence& s,
                                     const Policy& policy, const compression_params& params) {
  { b.compress_on_device(kv, s, 0, policy, params) } -> std::same_as<std::optional<int>>;
};

struct finished_compression {
  sequence* seq = nullptr;
  int new_len = 0;
  std::string error;  // non-empty when the policy failed; the request is then finished with an error
};

template <class Policy, class Backend>
class compression_worker {
 public:
  compression_worker(Backend& backend, typename Backend::kv_storage& kv, const Policy& policy, compression_params params,
                     const model_config& model, bool threaded)
      : backend_(&backend), kv_(&kv), compressor_(policy, params, model) {
    if (threaded) thread_ = std::thread([this] { run(); });
  }
  compression_worker(const compression_worker&) = delete;
  compression_worker& operator=(const compression_worker&) = delete;
  ~compression_worker() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  [[nodiscard]] const compressor<Policy, Backend>& planner() const { return compressor_; }

  void submit(sequence* s) {
    if (!thread_.joinable()) {
      auto result = compress(s);
      std::lock_guard lock(mutex_);
      finished_.push_back(std::move(result));
      return;
    }
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(s);
      ++in_flight_;
    }
    wake_.notify_all();
  }

  [[nodiscard]] int in_flight() const {
    std::lock_guard lock(mutex_);
    return in_flight_;
  }

  // Jobs done since the last call.
  std::vector<finished_compression> take_finished() {
    std::lock_guard lock(mutex_);
    return std::exchange(finished_, {});
  }

  // Like take_finished, but first waits for at least one job if any is in flight.
  std::vector<finished_compression> wait_finished() {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return !finished_.empty() || in_flight_ == 0; });
    return std::exchange(finished_, {});
  }

  // Waits until `s` has no job queued or running (cancellation must not free blocks under the worker).
  void wait_idle(const sequence* s) {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] {
      for (const sequence* q : queue_)
        if (q == s) return false;
      return running_ != s;
    });
  }

 private:
  finished_compression compress(sequence* s) {
    try {
      // A backend that scores and compacts this policy on the device does it all there; otherwise the
      // generic path gathers to the host, plans there and applies the plan on the backend.
      if constexpr (device_compressor<Backend, Policy>) {
        const std::optional<int> new_len =
            backend_->compress_on_device(*kv_, *s, s->query_slot, compressor_.policy(), compressor_.params());
        if (new_len) return {s, *new_len, {}};
      }
      const compaction_plan plan = compressor_.plan(*backend_, *kv_, *s, s->query_slot);
      backend_->apply_compaction(*kv_, plan);
      return {s, plan.new_len, {}};
    } catch (const std::exception& e) {
      return {s, s->kv_len, e.what()};
    }
  }

  void run() {
    std::unique_lock lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      sequence* s = queue_.front();
      queue_.pop_front();
      running_ = s;
      lock.unlock();
      finished_compression result = compress(s);
      lock.lock();
      running_ = nullptr;
      finished_.push_back(std::move(result));
      --in_flight_;
      done_.notify_all();
    }
  }

  Backend* backend_;
  typename Backend::kv_storage* kv_;
  compressor<Policy, Backend> compressor_;
  std::thread thread_;
  mutable std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::deque<sequence*> queue_;
  std::vector<finished_compression> finished_;
  const sequence* running_ = nullptr;
  int in_flight_ = 0;
  bool stopping_ = false;
};

}  // namespace zipage
