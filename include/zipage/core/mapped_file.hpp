#pragma once
// The bytes of a model file (GGUF, safetensors): a read-only memory mapping where the host has mmap, an
// owned buffer otherwise or for in-memory files. Held behind a unique_ptr by its users so the address
// stays put when they move (tensor views point into it).
#include <cerrno>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#define ZIPAGE_USE_MMAP 1
#else
#include <fstream>
#define ZIPAGE_USE_MMAP 0
#endif

#include "zipage/core/error.hpp"

namespace zipage {

class file_bytes {
 public:
  file_bytes() = default;
  explicit file_bytes(std::vector<std::byte> owned)
      : owned_(std::move(owned)), data_(owned_.data()), size_(owned_.size()) {}
  file_bytes(const file_bytes&) = delete;
  file_bytes& operator=(const file_bytes&) = delete;
  ~file_bytes() {
#if ZIPAGE_USE_MMAP
    if (mapping_ != nullptr) ::munmap(mapping_, size_);
#endif
  }

#if ZIPAGE_USE_MMAP
  static std::unique_ptr<file_bytes> mapped(void* mapping, std::size_t size) {
    auto s = std::make_unique<file_bytes>();
    s->mapping_ = mapping;
    s->data_ = static_cast<const std::byte*>(mapping);
    s->size_ = size;
    return s;
  }
#endif

  [[nodiscard]] const std::byte* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  std::vector<std::byte> owned_;
  void* mapping_ = nullptr;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// Opens `path` read-only; `kind` names the format in errors ("GGUF file", "safetensors file"), which
// also name the path and the reason.
#if ZIPAGE_USE_MMAP
inline std::unique_ptr<file_bytes> map_file(const std::filesystem::path& path, std::string_view kind) {
  struct fd_guard {  // closes the descriptor on every path out
    int fd;
    ~fd_guard() { ::close(fd); }
  };
  const std::string shown = path.string();
  // Only regular files: opening a FIFO (or a character device) for reading blocks until a writer comes,
  // so the type is checked before the open, and O_NONBLOCK keeps a file swapped in between from blocking.
  struct stat before {};
  if (::stat(path.c_str(), &before) == 0) {
    if (S_ISDIR(before.st_mode)) fail("cannot open ", kind, " '", shown, "': it is a directory");
    if (!S_ISREG(before.st_mode)) fail("cannot open ", kind, " '", shown, "': not a regular file");
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail("cannot open ", kind, " '", shown, "': ", std::generic_category().message(errno));
  const fd_guard guard{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("cannot stat ", kind, " '", shown, "': ", std::generic_category().message(errno));
  if (S_ISDIR(st.st_mode)) fail("cannot open ", kind, " '", shown, "': it is a directory");
  if (!S_ISREG(st.st_mode)) fail("cannot open ", kind, " '", shown, "': not a regular file");
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size == 0) return std::make_unique<file_bytes>();  // mmap rejects empty mappings
  // If another process truncates the file while it is mapped, touching the lost pages raises SIGBUS;
  // model files are treated as immutable while loaded.
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) fail("cannot map ", kind, " '", shown, "': ", std::generic_category().message(errno));
  return file_bytes::mapped(p, size);
}
#else
inline std::unique_ptr<file_bytes> map_file(const std::filesystem::path& path, std::string_view kind) {
  const std::string shown = path.string();
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail("cannot open ", kind, " '", shown, "': it is a directory");
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    fail("cannot open ", kind, " '", shown, "': not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open ", kind, " '", shown, "'");
  in.seekg(0, std::ios::end);
  std::vector<std::byte> bytes(static_cast<std::size_t>(in.tellg()));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!in) fail("cannot read ", kind, " '", shown, "'");
  return std::make_unique<file_bytes>(std::move(bytes));
}
#endif

}  // namespace zipage
