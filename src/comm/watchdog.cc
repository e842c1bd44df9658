// The collective watchdog thread, and the check that the rank's launcher process is still there.
#include "zerorun/watchdog.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "zerorun/platform.h"
#include "zerorun/rank_status.h"

namespace zerorun {

Watchdog::Watchdog(double timeout_s, int rank, std::function<void()> on_timeout)
    : timeout_(timeout_s), rank_(rank), on_timeout_(std::move(on_timeout)), thread_([this] { run(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Watchdog::arm(const char* op, int64_t seq, int64_t count, DType dt) {
  std::lock_guard<std::mutex> lk(mu_);
  armed_ = true;
  op_ = op;
  seq_ = seq;
  count_ = count;
  dt_ = dt;
  since_ = std::chrono::steady_clock::now();
  cv_.notify_all();
}

void Watchdog::disarm() {
  std::lock_guard<std::mutex> lk(mu_);
  armed_ = false;
}

void Watchdog::run() {
  const int parent = platform::parent_process_id();  // 0: not known; 1: started by init, nothing to watch
  std::unique_lock<std::mutex> lk(mu_);
  const auto limit =
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_));
  while (!stop_) {
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    if (armed_) until = std::min(until, since_ + limit);
    cv_.wait_until(lk, until);
    if (stop_) return;
    if (armed_ && std::chrono::steady_clock::now() >= since_ + limit) {
      char msg[512];
      std::snprintf(msg, sizeof msg,
                    "zerorun: watchdog: rank %d: %s #%lld (%lld x %s) has not completed after %.0f s; a peer rank is "
                    "stuck or dead (ZERORUN_COMM_TIMEOUT sets the limit). Aborting the job.",
                    rank_, op_.c_str(), static_cast<long long>(seq_), static_cast<long long>(count_), dtype_name(dt_),
                    timeout_);
      std::fprintf(stderr, "%s\n", msg);
      std::fflush(stderr);
      rank_status::report("watchdog", msg, 1);
      lk.unlock();
      on_timeout_();
      return;
    }
    if (parent > 1 && platform::parent_process_id() != parent) {
      // The launcher's process on this host is gone (killed, or its host's link to the launching host dropped and
      // the supervisor ended it): nothing will deliver the job's end to this rank, and a collective may never end.
      char msg[256];
      std::snprintf(msg, sizeof msg,
                    "zerorun: rank %d: the process that started it (pid %d) is gone; ending this rank%s%s", rank_,
                    parent, armed_ ? " in " : "", armed_ ? op_.c_str() : "");
      std::fprintf(stderr, "%s\n", msg);
      std::fflush(stderr);
      rank_status::report("launcher_gone", msg, 1);
      std::_Exit(1);
    }
  }
}

}  // namespace zerorun
