#pragma once
// Runs compressions apart from the decode loop. Threaded, a worker scores and compacts while the
// engine keeps decoding every other request; only the requests being compressed wait (they are left
// out of every batch until their job lands). The worker touches nothing but the requests' own blocks
// and query slots, which it knows by value (compression_request): it never reads a request's state,
// and every block-pool change stays on the engine's thread.
//
// Jobs are batched: the worker takes every queued request (up to max_batch) at once, so a burst of
// requests crossing a block boundary together is scored by one set of kernel launches on a backend
// with device compression, as the reference does.
#include <condition_variable>
#include <algorithm>
#include <deque>
#include <exception>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "zipage/compression/compression_job.hpp"
#include "zipage/compression/compressor.hpp"

namespace zipage {

// Optional backend hook: scores a batch of requests by a score_recipe, keeps the top `keep` tokens per
// (layer, KV head) and compacts them, entirely on the device (the same result as compressor::plan +
// apply_compaction for a recipe-scored policy); each job's new length is min(keep, kv_len). Returns false,
// touching nothing, when it cannot run this configuration (the generic host path then runs).
template <class Backend>
concept device_compressor = requires(const Backend& b, typename Backend::kv_storage& kv,
                                     std::span<const device_compression_job> jobs, const score_recipe& recipe,
                                     const cache_geometry& params, int keep) {
  { b.compress_on_device(kv, jobs, recipe, params, keep) } -> std::same_as<bool>;
};

// The values a compression_request copies from a request when its compression is planned.
[[nodiscard]] inline compression_request compression_request_of(const sequence& s) {
  return {s.id, s.table.blocks(), s.kv_len, s.query_slot, s.num_compressions == 0};
}

template <class Policy, class Backend>
class compression_worker {
 public:
  static constexpr int default_max_batch = 64;

  compression_worker(Backend& backend, typename Backend::kv_storage& kv, const Policy& policy, cache_geometry params,
                     const model_config& model, bool threaded, int max_batch = default_max_batch)
      : backend_(&backend), kv_(&kv), compressor_(policy, params, model), max_batch_(max_batch) {
    check(max_batch >= 1, "compression: max_batch must be >= 1, got ", max_batch);
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

  // Queues the requests (one step's compressions); all of them can be taken as one batch.
  void submit(std::vector<compression_request> reqs) {
    if (reqs.empty()) return;
    if (!thread_.joinable()) {
      const std::span<const compression_request> all(reqs);
      for (std::size_t i = 0; i < all.size(); i += static_cast<std::size_t>(max_batch_)) {
        auto results = compress(all.subspan(i, std::min(all.size() - i, static_cast<std::size_t>(max_batch_))));
        std::lock_guard lock(mutex_);
        for (auto& r : results) finished_.push_back(std::move(r));
      }
      return;
    }
    {
      std::lock_guard lock(mutex_);
      in_flight_ += static_cast<int>(reqs.size());
      for (auto& r : reqs) queue_.push_back(std::move(r));
    }
    wake_.notify_all();
  }
  // Convenience for tests and tools: the requests' current values.
  void submit(std::span<sequence* const> seqs) {
    std::vector<compression_request> reqs;
    for (const sequence* s : seqs) reqs.push_back(compression_request_of(*s));
    submit(std::move(reqs));
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

  // Waits until request `id` has no job queued or running (cancellation must not free blocks under the
  // worker).
  void wait_idle(request_id id) {
    const auto is_it = [id](const compression_request& r) { return r.id == id; };
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] {
      return std::none_of(queue_.begin(), queue_.end(), is_it) && std::none_of(running_.begin(), running_.end(), is_it);
    });
  }

 private:
  // Why a compression failed, naming the policy (its score() or the plan around it).
  std::string failure_message(std::exception_ptr ep) const {
    return "policy " + std::string(compressor_.policy().name()) + ": " + what_of(ep);
  }

  std::vector<finished_compression> compress(std::span<const compression_request> batch) {
    // A backend that scores this policy's recipe on the device does the whole batch there; otherwise
    // the generic path gathers each request to the host, plans there and applies the plan on the backend.
    if constexpr (device_compressor<Backend> && recipe_scored<Policy>) {
      std::vector<finished_compression> out;
      try {
        const int keep = compressor_.keep_tokens();
        jobs_.clear();
        for (const auto& r : batch) jobs_.push_back(r.device_job());
        if (backend_->compress_on_device(*kv_, jobs_, compressor_.recipe(), compressor_.params(), keep)) {
          for (const auto& r : batch) out.push_back({r.id, std::min(keep, r.kv_len), {}});
          return out;
        }
      } catch (...) {
        const std::string why = failure_message(std::current_exception());
        for (const auto& r : batch) out.push_back({r.id, r.kv_len, why});
        return out;
      }
    }
    std::vector<finished_compression> out;
    for (const auto& r : batch) out.push_back(compress_on_host(r));
    return out;
  }

  finished_compression compress_on_host(const compression_request& r) {
    // A policy that never evicts is never submitted; not instantiating the host path lets a backend
    // without the compression members (evicting_backend) run it.
    if constexpr (!Policy::evicts) {
      return {r.id, r.kv_len, "the policy evicts nothing"};
    } else {
      try {
        const compaction_plan plan = compressor_.plan(*backend_, *kv_, r);
        backend_->apply_compaction(*kv_, plan);
        return {r.id, plan.new_len, {}};
      } catch (...) {  // a custom policy may throw anything; on the worker thread, escaping would terminate
        return {r.id, r.kv_len, failure_message(std::current_exception())};
      }
    }
  }

  void run() {
    std::unique_lock lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      const auto n = std::min(queue_.size(), static_cast<std::size_t>(max_batch_));
      running_.assign(std::make_move_iterator(queue_.begin()),
                      std::make_move_iterator(queue_.begin() + static_cast<std::ptrdiff_t>(n)));
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
      lock.unlock();
      std::vector<finished_compression> results = compress(running_);
      lock.lock();
      running_.clear();
      for (auto& r : results) finished_.push_back(std::move(r));
      in_flight_ -= static_cast<int>(n);
      done_.notify_all();
    }
  }

  Backend* backend_;
  typename Backend::kv_storage* kv_;
  compressor<Policy, Backend> compressor_;
  std::thread thread_;
  mutable std::mutex mutex_;
  std::condition_variable wake_, done_;
  int max_batch_;
  std::vector<device_compression_job> jobs_;  // worker thread only
  std::deque<compression_request> queue_;
  std::vector<finished_compression> finished_;
  std::vector<compression_request> running_;
  int in_flight_ = 0;
  bool stopping_ = false;
};

}  // namespace zipage
