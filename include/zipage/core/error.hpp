#pragma once
// Errors: every bad input (file, flag, request) becomes a zipage::error with a message that names
// what is wrong, so callers can report it and keep going.
#include <exception>
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

// What a caught exception says, for a request or job that fails with it (user code may throw anything).
[[nodiscard]] inline std::string what_of(std::exception_ptr ep) {
  try {
    std::rethrow_exception(ep);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace zipage
