#pragma once
// The machine's physical memory, for the checks that keep a host-memory KV pool (the CPU backend's) within it:
// the engine's plan (engine/memory_profile.hpp) and the tools' --kv-cache-mib (examples/common).
#include <unistd.h>

#include <cstddef>

namespace zipage {

// Bytes of physical memory (0 when the system does not say).
[[nodiscard]] inline std::size_t host_memory_bytes() {
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGE_SIZE)
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page);
#endif
  return 0;
}

}  // namespace zipage
