// One error type for the whole runtime: a message plus a chain of context
// ("while loading model.bin: tensor 'h.0.w': ..."), so every failure that
// reaches the user names the file, key or line it came from.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace zerorun {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
  // Returns a new error whose message is "context: <this message>".
  Error with_context(const std::string& context) const { return Error(context + ": " + what()); }
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

[[noreturn]] inline void fail(const std::string& msg) { throw Error(msg); }

}  // namespace zerorun

#define ZR_FAIL(...) throw ::zerorun::Error(::zerorun::detail::concat(__VA_ARGS__))
#define ZR_CHECK(cond, ...)                                                      \
  do {                                                                           \
    if (!(cond)) throw ::zerorun::Error(::zerorun::detail::concat(__VA_ARGS__)); \
  } while (0)
// Runs `stmt`; if it throws a zerorun::Error, rethrows it with `ctx` prefixed.
#define ZR_WITH_CONTEXT(ctx, stmt)                              \
  do {                                                          \
    try {                                                       \
      stmt;                                                     \
    } catch (const ::zerorun::Error& zr_e_) {                   \
      throw zr_e_.with_context(::zerorun::detail::concat(ctx)); \
    }                                                           \
  } while (0)
