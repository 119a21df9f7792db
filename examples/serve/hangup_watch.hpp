#pragma once
// Notices clients that hang up while their request waits, for every connection at once: one thread polls
// all watched sockets for POLLRDHUP and tells the request's handler. Before, each handler woke every 50 ms
// to peek at its own socket; with 1,000 queued streams that was ~20,000 wake-ups a second, which took a
// core from the engine and from the clients on a 2-core machine (the load test's client then sent its
// requests too late, and the server closed the connections that had waited 60 s for their first request).
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace zipage_serve {

class hangup_watch {
 public:
  using on_hangup = std::function<void()>;

  // Unwatches its socket when destroyed (before the handler returns and httplib closes the socket).
  class ticket {
   public:
    ticket() = default;
    ticket(hangup_watch* w, int fd, std::uint64_t id) : w_(w), fd_(fd), id_(id) {}
    ticket(ticket&& o) noexcept : w_(std::exchange(o.w_, nullptr)), fd_(o.fd_), id_(o.id_) {}
    ticket& operator=(ticket&& o) noexcept {
      if (this != &o) {
        release();
        w_ = std::exchange(o.w_, nullptr);
        fd_ = o.fd_;
        id_ = o.id_;
      }
      return *this;
    }
    ticket(const ticket&) = delete;
    ticket& operator=(const ticket&) = delete;
    ~ticket() { release(); }

   private:
    void release() {
      if (w_ != nullptr) std::exchange(w_, nullptr)->unwatch(fd_, id_);
    }
    hangup_watch* w_ = nullptr;
    int fd_ = -1;
    std::uint64_t id_ = 0;
  };

  hangup_watch() : wake_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)), thread_([this] { loop(); }) {}
  ~hangup_watch() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    poke();
    thread_.join();
    if (wake_ >= 0) close(wake_);
  }
  hangup_watch(const hangup_watch&) = delete;
  hangup_watch& operator=(const hangup_watch&) = delete;

  // Calls `f` (once, on the watch thread) when the peer of `fd` closes or resets the connection. A
  // negative fd (the socket was not found) is never reported.
  [[nodiscard]] ticket watch(int fd, on_hangup f) {
    if (fd < 0 || wake_ < 0) return {};
    std::uint64_t id;
    {
      std::lock_guard lock(m_);
      id = ++next_id_;
      watched_[fd] = {id, std::move(f)};
    }
    poke();
    return {this, fd, id};
  }

 private:
  struct entry {
    std::uint64_t id = 0;
    on_hangup f;
  };

  void unwatch(int fd, std::uint64_t id) {
    {
      std::lock_guard lock(m_);
      auto it = watched_.find(fd);
      if (it == watched_.end() || it->second.id != id) return;  // reported already
      watched_.erase(it);
    }
    // The socket closes after this: poll() would keep watching the closed file, and a new connection
    // may reuse the number, so the watch thread rebuilds its set now.
    poke();
  }

  void poke() {
    const std::uint64_t one = 1;
    if (wake_ >= 0) (void)!write(wake_, &one, sizeof one);
  }

  void loop() {
    std::vector<pollfd> fds;
    std::vector<std::uint64_t> ids;
    for (;;) {
      fds.assign(1, pollfd{wake_, POLLIN, 0});
      ids.assign(1, 0);
      {
        std::lock_guard lock(m_);
        if (stop_) return;
        for (const auto& [fd, e] : watched_) {
          fds.push_back({fd, POLLRDHUP, 0});
          ids.push_back(e.id);
        }
      }
      if (poll(fds.data(), fds.size(), -1) < 0) continue;  // EINTR
      if (fds[0].revents & POLLIN) {
        std::uint64_t n;
        (void)!read(wake_, &n, sizeof n);
      }
      std::vector<on_hangup> gone;
      {
        std::lock_guard lock(m_);
        for (std::size_t i = 1; i < fds.size(); ++i) {
          if ((fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0) continue;
          auto it = watched_.find(fds[i].fd);
          if (it == watched_.end() || it->second.id != ids[i]) continue;  // unwatched meanwhile
          gone.push_back(std::move(it->second.f));
          watched_.erase(it);
        }
      }
      for (auto& f : gone) f();
    }
  }

  std::mutex m_;
  std::unordered_map<int, entry> watched_;
  std::uint64_t next_id_ = 0;
  bool stop_ = false;
  int wake_;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace zipage_serve
