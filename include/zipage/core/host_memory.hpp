#pragma once
// The machine's memory, for the checks that keep a host-memory KV pool (the CPU backend's) within it: the
// engine's plan (engine/memory_profile.hpp) and the tools' --kv-cache-mib (examples/common).
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace zipage {

// Bytes of physical memory (0 when the system does not say).
[[nodiscard]] inline std::size_t host_memory_bytes() {
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGE_SIZE)
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page);
#endif
  return 0;
}

// What a new allocation can take, from the text of /proc/meminfo: MemAvailable (free memory and what the kernel
// can reclaim without swapping) + SwapFree, in bytes; 0 when the text has no MemAvailable (Linux before 3.14).
// Why not the total: the CPU pool is zero-filled when the engine is built, so all of it is resident at once; a
// pool above this (other processes' memory and the loaded weights taken) would be killed by the OOM killer.
[[nodiscard]] inline std::size_t available_in_meminfo(std::string_view meminfo) {
  std::istringstream in{std::string(meminfo)};
  std::string key, unit;
  std::uint64_t kib = 0, available = 0, swap_free = 0;
  bool has_available = false;
  while (in >> key >> kib) {
    std::getline(in, unit);  // " kB"
    if (key == "MemAvailable:") available = kib, has_available = true;
    if (key == "SwapFree:") swap_free = kib;
  }
  return has_available ? static_cast<std::size_t>((available + swap_free) * 1024) : 0;
}

// How much a new host allocation can take, and what set that figure (for the errors that refuse a pool).
struct available_memory {
  std::size_t bytes = 0;
  std::string source;  // "MemAvailable + SwapFree", "physical memory", "cgroup memory.max of ..."; empty: unknown
  [[nodiscard]] bool known() const noexcept { return !source.empty(); }
};

namespace detail {

// The text of a small kernel file (procfs, cgroupfs), or nullopt when it cannot be read.
[[nodiscard]] inline std::optional<std::string> read_small_file(const std::filesystem::path& path) {
  std::ifstream f(path);
  if (!f) return std::nullopt;
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) return std::nullopt;
  return text;
}

// A cgroup file holding one number (memory.max, memory.current, ...): nullopt when it is missing, "max" (no
// limit) or anything else that is not a number.
[[nodiscard]] inline std::optional<std::uint64_t> cgroup_number(const std::filesystem::path& path) {
  const auto text = read_small_file(path);
  if (!text) return std::nullopt;
  std::string_view s = *text;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// `key`'s value in a cgroup's memory.stat ("key value" lines), 0 when the file or the key is missing.
[[nodiscard]] inline std::uint64_t cgroup_stat(const std::filesystem::path& path, std::string_view key) {
  const auto text = read_small_file(path);
  if (!text) return 0;
  std::istringstream in(*text);
  std::string k;
  std::uint64_t v = 0;
  while (in >> k >> v)
    if (k == key) return v;
  return 0;
}

// One memory controller's files: cgroup v2's or v1's.
struct cgroup_files {
  const char* limit;     // memory.max / memory.limit_in_bytes
  const char* usage;     // memory.current / memory.usage_in_bytes
  const char* inactive;  // memory.stat's page cache the kernel reclaims first, of the cgroup and its children
};

// Lowers `best` to the tightest limit of the cgroup `path` (as /proc/self/cgroup names it) and of each parent up
// to the hierarchy's top `top` (a parent's limit binds its children): at each level with a limit, the limit minus
// what the cgroup uses (its usage less its inactive file cache, which the kernel reclaims before it kills, as
// MemAvailable counts reclaimable cache). `shown` is `top` as this process sees it, for the source's text. A level
// without the files adds nothing; a path that climbs out of the hierarchy ("..") is read at the top only.
inline void tighten_by_cgroup(available_memory& best, const std::filesystem::path& top, const std::string& shown,
                              std::string_view path, const cgroup_files& files) {
  std::vector<std::string> parts;
  for (const auto& part : std::filesystem::path(path).lexically_normal()) {
    const std::string p = part.string();
    if (p == "..") {
      parts.clear();
      break;
    }
    if (!p.empty() && p != "/" && p != ".") parts.push_back(p);
  }
  std::filesystem::path dir = top;
  std::string dir_shown = shown;
  for (std::size_t level = 0; level <= parts.size(); ++level) {
    if (level > 0) dir /= parts[level - 1], dir_shown += "/" + parts[level - 1];
    const auto limit = cgroup_number(dir / files.limit);
    if (!limit) continue;
    std::uint64_t used = cgroup_number(dir / files.usage).value_or(0);
    used -= std::min(used, cgroup_stat(dir / "memory.stat", files.inactive));
    const std::uint64_t room = *limit > used ? *limit - used : 0;
    if (best.known() && room >= best.bytes) continue;
    best.bytes = static_cast<std::size_t>(room);
    best.source = std::string("cgroup ") + files.limit + " of " + dir_shown + " minus its " + files.usage;
  }
}

}  // namespace detail

// What a new host allocation can take now, read under `root` ("/": tests pass a folder holding a made-up proc/
// and sys/fs/cgroup/): MemAvailable + SwapFree (available_in_meminfo of proc/meminfo), or the physical memory
// where the kernel does not say; then, in a container, the tighter of that and its cgroup's room. The cgroup is
// this process's, from proc/self/cgroup: cgroup v2 (the "0::<path>" line) sys/fs/cgroup/<path>/memory.max minus
// memory.current ("max": no limit), and cgroup v1 (the line naming the memory controller)
// sys/fs/cgroup/memory/<path>/memory.limit_in_bytes minus memory.usage_in_bytes, each checked at every parent
// up to the hierarchy's top, where a limit may be set instead. A file that is missing or unreadable adds
// nothing: the figure falls back to the host's, never an error. Unknown (bytes 0, no source) only where neither
// says.
[[nodiscard]] inline available_memory host_available_memory(const std::filesystem::path& root = "/") {
  available_memory best;
  if (const auto meminfo = detail::read_small_file(root / "proc/meminfo"))
    if (const std::size_t available = available_in_meminfo(*meminfo); available > 0)
      best = {available, "MemAvailable + SwapFree"};
  if (!best.known())
    if (const std::size_t total = host_memory_bytes(); total > 0) best = {total, "physical memory"};
  const auto cgroups = detail::read_small_file(root / "proc/self/cgroup");
  if (!cgroups) return best;
  std::istringstream lines(*cgroups);
  for (std::string text; std::getline(lines, text);) {
    // hierarchy-id:controllers:path; the path may itself hold ':'.
    const std::string_view line = text;
    const std::size_t a = line.find(':'), b = a == line.npos ? a : line.find(':', a + 1);
    if (b == line.npos) continue;
    const std::string_view id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
    const std::string_view path = line.substr(b + 1);
    bool memory = false;  // v1: the memory controller among the comma-separated ones
    for (std::size_t from = 0; from <= controllers.size();) {
      const std::size_t end = std::min(controllers.find(',', from), controllers.size());
      memory = memory || controllers.substr(from, end - from) == "memory";
      from = end + 1;
    }
    if (id == "0" && controllers.empty())
      detail::tighten_by_cgroup(best, root / "sys/fs/cgroup", "/sys/fs/cgroup", path,
                                {"memory.max", "memory.current", "inactive_file"});
    else if (memory)
      detail::tighten_by_cgroup(best, root / "sys/fs/cgroup/memory", "/sys/fs/cgroup/memory", path,
                                {"memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"});
  }
  return best;
}

// Bytes a new host allocation can take now (host_available_memory().bytes; 0 when the system does not say).
[[nodiscard]] inline std::size_t host_available_bytes() { return host_available_memory().bytes; }

}  // namespace zipage
