#pragma once
// Errors: every bad input (file, flag, request) becomes a zipage::error with a message that names
// what is wrong, so callers can report it and keep going.
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace zipage {

class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Args>
[[nodiscard]] std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

template <class... Args>
[[noreturn]] void fail(Args&&... args) {
  throw error(detail::concat(std::forward<Args>(args)...));
}

template <class... Args>
void check(bool condition, Args&&... args) {
  if (!condition) fail(std::forward<Args>(args)...);
}

}  // namespace zipage
