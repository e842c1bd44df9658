// Per-op time profile for performance work: with ZERORUN_PROFILE=1 the
// executor synchronises the device around every op and adds the wall time to
// "<op> fwd" / "<op> bwd" / other named phases; the trainer prints the table.
// ZERORUN_PROFILE=host times the same scopes without synchronising: the host's
// time to queue each op, and the waits where the host blocks on the device
// ("wait ..." rows), which shows whether a GPU step is bound by the host.
#pragma once
#include <string>

namespace zerorun::profile {

bool enabled();    // ZERORUN_PROFILE set to a non-zero value
bool host_only();  // ZERORUN_PROFILE=host: no device synchronisation
// Adds seconds to a named phase (a name starting ".." marks a part of an
// enclosing phase, left out of the report's total).
void add(const std::string& phase, double seconds);
// Table of phases by total time (empty when nothing was recorded).
std::string report();

// Times a scope into a phase when profiling is on (device synchronised at
// both ends so asynchronous kernels are charged to the right phase).
class Scope {
 public:
  Scope(const char* phase, const std::string& detail = {});
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  std::string phase_;
  double t0_ = -1;
};

}  // namespace zerorun::profile
