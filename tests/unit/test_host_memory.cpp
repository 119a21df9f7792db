// What a CPU KV pool may take (zipage::host_available_memory): the host's MemAvailable + SwapFree, and in a
// container the tighter cgroup limit (v2 memory.max, v1 memory.limit_in_bytes, of this process's cgroup or a
// parent), read from a made-up proc/ and sys/fs/cgroup/ under a temporary root.
#include <doctest/doctest.h>

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <string>

#include "test_support.hpp"
#include "zipage/core/host_memory.hpp"
#include "zipage/engine/memory_profile.hpp"

namespace fs = std::filesystem;
using zipage::testing::contains;
using zipage::testing::error_of;

namespace {

constexpr std::size_t MiB = 1u << 20;

// A fresh root whose proc/meminfo says 8 GiB available (MemAvailable 7 GiB + SwapFree 1 GiB).
struct fake_root {
  fs::path dir;
  explicit fake_root(const std::string& name) : dir(fs::temp_directory_path() / ("zipage_test_host_memory_" + name)) {
    fs::remove_all(dir);
    write("proc/meminfo", "MemTotal:       16777216 kB\nMemAvailable:    7340032 kB\nSwapFree:        1048576 kB\n");
  }
  ~fake_root() { fs::remove_all(dir); }
  fake_root(const fake_root&) = delete;
  fake_root& operator=(const fake_root&) = delete;
  void write(const std::string& file, const std::string& text) const {
    fs::create_directories((dir / file).parent_path());
    std::ofstream(dir / file) << text;
  }
  [[nodiscard]] zipage::available_memory read() const { return zipage::host_available_memory(dir); }
};

constexpr std::size_t host_bytes = 8192 * MiB;

}  // namespace

TEST_CASE("host memory: without cgroup files the figure is the host's MemAvailable + SwapFree, never an error") {
  const fake_root root("missing");
  auto m = root.read();
  CHECK(m.bytes == host_bytes);
  CHECK(m.source == "MemAvailable + SwapFree");
  // A cgroup line whose files are missing, a malformed line, a v1 line for other controllers: still the host's.
  root.write("proc/self/cgroup", "0::/app.slice/run.scope\ngarbage\n4:cpu,cpuacct:/x\n");
  m = root.read();
  CHECK(m.bytes == host_bytes);
  CHECK(m.source == "MemAvailable + SwapFree");
  // memory.max that is not a number is no limit either.
  root.write("sys/fs/cgroup/app.slice/run.scope/memory.max", "lots\n");
  CHECK(root.read().bytes == host_bytes);
}

TEST_CASE("host memory: cgroup v2 memory.max minus memory.current when it is tighter than the host's") {
  const fake_root root("v2");
  root.write("proc/self/cgroup", "0::/app.slice/run.scope\n");
  const std::string cg = "sys/fs/cgroup/app.slice/run.scope/";
  root.write(cg + "memory.max", std::to_string(2048 * MiB) + "\n");
  root.write(cg + "memory.current", std::to_string(512 * MiB) + "\n");
  auto m = root.read();
  CHECK(m.bytes == 1536 * MiB);
  CHECK(m.source == "cgroup memory.max of /sys/fs/cgroup/app.slice/run.scope minus its memory.current");
  // The page cache the kernel reclaims before it kills (memory.stat's inactive_file) is not counted as used.
  root.write(cg + "memory.stat", "anon 1\nfile 3\ninactive_file " + std::to_string(256 * MiB) + "\nactive_file 5\n");
  CHECK(root.read().bytes == 1792 * MiB);
  // At or above the limit: nothing is available (the check refuses any pool), not an unknown figure.
  root.write(cg + "memory.stat", "");
  root.write(cg + "memory.current", std::to_string(4096 * MiB));
  m = root.read();
  CHECK(m.known());
  CHECK(m.bytes == 0);
  // A limit above the host's available memory: the host's is the tighter one.
  root.write(cg + "memory.max", std::to_string(64 * 1024 * MiB));
  root.write(cg + "memory.current", "0");
  m = root.read();
  CHECK(m.bytes == host_bytes);
  CHECK(m.source == "MemAvailable + SwapFree");
}

TEST_CASE("host memory: cgroup v2 memory.max 'max' is no limit") {
  const fake_root root("v2max");
  root.write("proc/self/cgroup", "0::/user.slice\n");
  root.write("sys/fs/cgroup/user.slice/memory.max", "max\n");
  root.write("sys/fs/cgroup/user.slice/memory.current", std::to_string(512 * MiB) + "\n");
  const auto m = root.read();
  CHECK(m.bytes == host_bytes);
  CHECK(m.source == "MemAvailable + SwapFree");
}

TEST_CASE("host memory: a parent cgroup's limit binds its children (v2), the tightest level wins") {
  const fake_root root("nested");
  root.write("proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
  root.write("sys/fs/cgroup/kubepods/pod1/ctr/memory.max", "max\n");
  root.write("sys/fs/cgroup/kubepods/pod1/ctr/memory.current", std::to_string(100 * MiB));
  root.write("sys/fs/cgroup/kubepods/pod1/memory.max", std::to_string(1024 * MiB));
  root.write("sys/fs/cgroup/kubepods/pod1/memory.current", std::to_string(300 * MiB));
  root.write("sys/fs/cgroup/kubepods/memory.max", std::to_string(4096 * MiB));
  root.write("sys/fs/cgroup/kubepods/memory.current", std::to_string(3500 * MiB));
  auto m = root.read();
  CHECK(m.bytes == 596 * MiB);  // kubepods: 4096 - 3500, tighter than pod1's 1024 - 300
  CHECK(m.source == "cgroup memory.max of /sys/fs/cgroup/kubepods minus its memory.current");
  root.write("sys/fs/cgroup/kubepods/memory.max", "max");
  m = root.read();
  CHECK(m.bytes == 724 * MiB);
  CHECK(m.source == "cgroup memory.max of /sys/fs/cgroup/kubepods/pod1 minus its memory.current");
  // In a container with its own cgroup namespace the path is "/" and the limit is at the top itself.
  const fake_root ns("namespace");
  ns.write("proc/self/cgroup", "0::/\n");
  ns.write("sys/fs/cgroup/memory.max", std::to_string(1000 * MiB));
  ns.write("sys/fs/cgroup/memory.current", std::to_string(400 * MiB));
  m = ns.read();
  CHECK(m.bytes == 600 * MiB);
  CHECK(m.source == "cgroup memory.max of /sys/fs/cgroup minus its memory.current");
  // A path that climbs out of the hierarchy is read at the top only.
  ns.write("proc/self/cgroup", "0::/../../elsewhere\n");
  CHECK(ns.read().bytes == 600 * MiB);
}

TEST_CASE("host memory: cgroup v1 memory.limit_in_bytes minus memory.usage_in_bytes") {
  const fake_root root("v1");
  // Hybrid layout: v1 controllers, and a v2 line with no memory controller under it.
  root.write("proc/self/cgroup", "12:pids:/docker/abc\n4:cpuacct,memory:/docker/abc\n0::/\n");
  const std::string cg = "sys/fs/cgroup/memory/docker/abc/";
  root.write(cg + "memory.limit_in_bytes", std::to_string(3072 * MiB) + "\n");
  root.write(cg + "memory.usage_in_bytes", std::to_string(1024 * MiB) + "\n");
  root.write(cg + "memory.stat", "cache 10\ninactive_file 1\ntotal_inactive_file " + std::to_string(512 * MiB) + "\n");
  auto m = root.read();
  CHECK(m.bytes == 2560 * MiB);
  CHECK(m.source == "cgroup memory.limit_in_bytes of /sys/fs/cgroup/memory/docker/abc minus its memory.usage_in_bytes");
  // v1's "no limit" is a number near 2^63: the host's figure stays.
  root.write(cg + "memory.limit_in_bytes", "9223372036854771712\n");
  m = root.read();
  CHECK(m.bytes == host_bytes);
  CHECK(m.source == "MemAvailable + SwapFree");
}

TEST_CASE("host memory: the CPU pool check names the limit it hit") {
  const fake_root root("refusal");
  root.write("proc/self/cgroup", "0::/box\n");
  root.write("sys/fs/cgroup/box/memory.max", std::to_string(1024 * MiB));
  root.write("sys/fs/cgroup/box/memory.current", std::to_string(24 * MiB));
  zipage::memory_plan plan;
  plan.block_bytes = MiB;
  plan.num_blocks = 2000;
  zipage::engine_config cfg;
  cfg.num_blocks = 2000;
  const std::string why = error_of([&] { zipage::check_host_plan(plan, cfg, root.read()); });
  CHECK(contains(why, "the KV cache plan takes 2097152000 bytes (2000 blocks + 0 query slots, from "
                      "engine_config::num_blocks), more than this machine's available memory (1048576000 bytes: "
                      "cgroup memory.max of /sys/fs/cgroup/box minus its memory.current)"));
  plan.num_blocks = 1000;
  zipage::check_host_plan(plan, cfg, root.read());  // fits
  // The host's figure names MemAvailable + SwapFree, as before.
  const fake_root host("refusal_host");
  plan.num_blocks = 9000;
  CHECK(contains(error_of([&] { zipage::check_host_plan(plan, cfg, host.read()); }),
                 "more than this machine's available memory (8589934592 bytes: MemAvailable + SwapFree)"));
  // Unknown (nothing said): nothing to check.
  zipage::check_host_plan(plan, cfg, zipage::available_memory{});
}
