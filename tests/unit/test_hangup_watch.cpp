// zipage-serve's hang-up watch (examples/serve/hangup_watch.hpp) on real loopback TCP connections: a peer
// that closes is reported once, to the right watcher, also when socket numbers are reused; a peer that
// writes is not a hang-up; an unwatched socket is never reported. Built with the unit tests (and under
// ASan + UBSan in CI) because the watch is threaded code the Node tests only reach end to end.
#include <doctest/doctest.h>

#include "../../examples/serve/hangup_watch.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

using zipage_serve::hangup_watch;
using namespace std::chrono_literals;

namespace {

// A listener on 127.0.0.1 and connections to it: each pair is (the client's end, the server's end).
class loopback {
 public:
  loopback() {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (listener_ < 0 || bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(listener_, 512) != 0 ||
        getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error("cannot listen on 127.0.0.1");
    addr_ = a;
  }
  ~loopback() { close(listener_); }
  loopback(const loopback&) = delete;
  loopback& operator=(const loopback&) = delete;

  struct pair {
    int client = -1, server = -1;
  };
  // `client`: a socket made beforehand (so the accepted end can take the lowest free number), or -1.
  pair connect_one(int client = -1) {
    pair p;
    p.client = client >= 0 ? client : socket(AF_INET, SOCK_STREAM, 0);
    if (p.client < 0 || connect(p.client, reinterpret_cast<const sockaddr*>(&addr_), sizeof addr_) != 0)
      throw std::runtime_error("cannot connect");
    p.server = accept(listener_, nullptr, nullptr);
    if (p.server < 0) throw std::runtime_error("cannot accept");
    return p;
  }

 private:
  int listener_ = -1;
  sockaddr_in addr_{};
};

// Polls `done` for up to `limit`.
template <class F>
bool eventually(F done, std::chrono::milliseconds limit = 5000ms) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(2ms);
  }
  return done();
}

}  // namespace

TEST_CASE("hangup_watch: a closed peer is reported once; a writing peer and an unwatched socket are not") {
  loopback net;
  hangup_watch watch;
  std::atomic<int> closed{0}, written{0}, unwatched{0};

  auto a = net.connect_one();
  auto b = net.connect_one();
  auto c = net.connect_one();
  auto ta = watch.watch(a.server, [&] { ++closed; });
  auto tb = watch.watch(b.server, [&] { ++written; });
  {
    auto tc = watch.watch(c.server, [&] { ++unwatched; });
  }  // unwatched before its peer leaves

  REQUIRE(write(b.client, "GET / HTTP/1.1\r\n", 16) == 16);  // pipelined bytes are not a hang-up
  close(a.client);
  close(c.client);
  CHECK(eventually([&] { return closed.load() == 1; }));
  std::this_thread::sleep_for(100ms);
  CHECK(closed.load() == 1);
  CHECK(written.load() == 0);
  CHECK(unwatched.load() == 0);

  close(b.client);
  CHECK(eventually([&] { return written.load() == 1; }));
  for (int fd : {a.server, b.server, c.server}) close(fd);
}

TEST_CASE("hangup_watch: a reused socket number reports to its new watcher only") {
  loopback net;
  hangup_watch watch;
  std::atomic<int> first{0}, second{0};

  auto p = net.connect_one();
  const int number = p.server;
  {
    auto t = watch.watch(p.server, [&] { ++first; });
  }
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  close(p.server);  // as httplib does after the handler: the number is free again
  auto q = net.connect_one(client);
  REQUIRE(q.server == number);  // the lowest free descriptor
  auto t = watch.watch(q.server, [&] { ++second; });
  close(p.client);  // the old connection's peer leaves: nobody watches it any more
  std::this_thread::sleep_for(100ms);
  CHECK(second.load() == 0);
  close(q.client);
  CHECK(eventually([&] { return second.load() == 1; }));
  CHECK(first.load() == 0);
  close(q.server);
}

TEST_CASE("hangup_watch: hundreds of watched connections, half of the peers leave") {
  loopback net;
  hangup_watch watch;
  constexpr int n = 200;
  std::vector<loopback::pair> conns;
  std::vector<hangup_watch::ticket> tickets;
  auto gone = std::make_unique<std::atomic<int>[]>(n);
  for (int i = 0; i < n; ++i) {
    conns.push_back(net.connect_one());
    tickets.push_back(watch.watch(conns.back().server, [&gone, i] { ++gone[i]; }));
  }
  for (int i = 0; i < n; i += 2) close(conns[static_cast<std::size_t>(i)].client);
  CHECK(eventually([&] {
    int sum = 0;
    for (int i = 0; i < n; i += 2) sum += gone[i].load();
    return sum == n / 2;
  }));
  std::this_thread::sleep_for(100ms);
  for (int i = 0; i < n; ++i) {
    CAPTURE(i);
    CHECK(gone[i].load() == (i % 2 == 0 ? 1 : 0));
  }
  tickets.clear();  // unwatch before the sockets close, as the server does
  for (auto& c : conns) {
    if (c.client >= 0 && (&c - conns.data()) % 2 == 1) close(c.client);
    close(c.server);
  }
}

TEST_CASE("hangup_watch: a socket that was not found is never reported, and tickets move") {
  hangup_watch watch;
  auto none = watch.watch(-1, [] { FAIL("reported a socket that does not exist"); });
  hangup_watch::ticket moved = std::move(none);
  hangup_watch::ticket other;
  other = std::move(moved);
  std::this_thread::sleep_for(20ms);
}
