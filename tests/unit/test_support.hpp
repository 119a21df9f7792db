#pragma once
// Small helpers shared by the unit suites.
#include <atomic>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <unistd.h>

#include "zipage/core/error.hpp"

namespace zipage::testing {

inline bool contains(const std::string& text, std::string_view part) { return text.find(part) != std::string::npos; }

// Runs f and returns the zipage::error message it throws. Returns a marker instead when f throws
// nothing or something else, so the CHECKs on the message fail and show why.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const zipage::error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not a zipage::error: ") + e.what() + ">";
  }
  return "<no error>";
}

// A directory removed with everything in it when the test ends.
struct temp_dir {
  std::filesystem::path path;
  explicit temp_dir(std::string_view tag = "zipage") {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           (std::string(tag) + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter.fetch_add(1)));
    std::filesystem::create_directories(path);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace zipage::testing
