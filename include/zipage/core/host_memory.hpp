#pragma once
// The machine's memory, for the checks that keep a host-memory KV pool (the CPU backend's) within it: the
// engine's plan (engine/memory_profile.hpp) and the tools' --kv-cache-mib (examples/common).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

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

// Bytes a new host allocation can take now (available_in_meminfo of /proc/meminfo), or the physical memory
// where the system does not say (0 when it says neither).
[[nodiscard]] inline std::size_t host_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::ostringstream text;
  text << f.rdbuf();
  const std::size_t available = f ? available_in_meminfo(text.str()) : 0;
  return available > 0 ? available : host_memory_bytes();
}

}  // namespace zipage
