// The collective watchdog thread.
#include "zerorun/watchdog.h"

#include <cstdio>

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
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    if (!armed_) {
      cv_.wait(lk);
      continue;
    }
    auto deadline = since_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 std::chrono::duration<double>(timeout_));
    int64_t seq = seq_;
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && armed_ && seq_ == seq && !stop_) {
      std::fprintf(stderr,
                   "zerorun: watchdog: rank %d: %s #%lld (%lld x %s) has not completed after %.0f s; a peer rank is "
                   "stuck or dead (ZERORUN_COMM_TIMEOUT sets the limit). Aborting the job.\n",
                   rank_, op_.c_str(), static_cast<long long>(seq_), static_cast<long long>(count_), dtype_name(dt_),
                   timeout_);
      std::fflush(stderr);
      lk.unlock();
      on_timeout_();
      return;
    }
  }
}

}  // namespace zerorun
