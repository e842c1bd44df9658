// Implementation of the ZERORUN_PROFILE op-time table (see profile.h).
#include "zerorun/profile.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "zerorun/device_memory.h"
#include "zerorun/knobs.h"

namespace zerorun::profile {
namespace {
struct Entry {
  double seconds = 0;
  int64_t calls = 0;
};
std::mutex mu;
std::map<std::string, Entry>& table() {
  static std::map<std::string, Entry> t;
  return t;
}
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
// ZERORUN_PROFILE, read once: 0 off, 1 synchronised, 2 host only.
int mode() {
  static const int m = knobs().profile;
  return m;
}

void sync() {
  if (!host_only() && cuda::available()) cuda::synchronize();
}
}  // namespace

bool enabled() { return mode() != 0; }

bool host_only() { return mode() == 2; }

void add(const std::string& phase, double seconds) {
  std::lock_guard<std::mutex> l(mu);
  Entry& e = table()[phase];
  e.seconds += seconds;
  ++e.calls;
}

std::string report() {
  std::lock_guard<std::mutex> l(mu);
  std::vector<std::pair<std::string, Entry>> rows(table().begin(), table().end());
  if (rows.empty()) return {};
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.seconds > b.second.seconds; });
  // Phases named ".. x" run inside another phase: shown, but not added to the total again.
  double total = 0;
  for (auto& r : rows)
    if (r.first.rfind("..", 0) != 0) total += r.second.seconds;
  std::string out =
      host_only() ? "profile (host time only, no synchronisation: op rows = time to queue the op, \"wait\" rows = "
                    "the host blocked on the device; \"..\" rows are parts of another row):\n"
                  : "profile (device synchronised per op; \"..\" rows are parts of an op row, not added to the "
                    "total):\n";
  char line[200];
  for (auto& [k, e] : rows) {
    std::snprintf(line, sizeof line, "  %-28s %10.2f ms %6.1f%% %8lld calls %9.3f ms/call\n", k.c_str(),
                  1e3 * e.seconds, 100.0 * e.seconds / total, static_cast<long long>(e.calls),
                  1e3 * e.seconds / static_cast<double>(e.calls));
    out += line;
  }
  return out;
}

Scope::Scope(const char* phase, const std::string& detail) {
  if (!enabled()) return;
  phase_ = detail.empty() ? std::string(phase) : std::string(phase) + " " + detail;
  sync();
  t0_ = now();
}

Scope::~Scope() {
  if (t0_ < 0) return;
  sync();
  add(phase_, now() - t0_);
}

}  // namespace zerorun::profile
