// Collective watchdog: a thread that watches the collective in progress and,
// if it has not completed within the timeout, prints which op, sequence
// number and size this rank is stuck in and ends the whole job (instead of a
// hang nobody can diagnose). It also checks every second that the process
// that started this rank (mpirun, orted, slurmstepd, hydra's proxy) is still
// its parent: when it is gone the rank ends at once instead of at the timeout.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "zerorun/dtype.h"
#include "zerorun/rank_status.h"

namespace zerorun {

class Watchdog {
 public:
  Watchdog(double timeout_s, int rank, std::function<void()> on_timeout);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  void arm(const char* op, int64_t seq, int64_t count, DType dt);
  void disarm();
  double timeout() const { return timeout_; }

 private:
  void run();
  double timeout_;
  int rank_;
  std::function<void()> on_timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, armed_ = false;
  std::string op_;
  int64_t seq_ = 0, count_ = 0;
  DType dt_ = DType::F32;
  std::chrono::steady_clock::time_point since_;
  std::thread thread_;
};

// Arms on construction, disarms on destruction (null watchdog: no-op).
class WatchGuard {
 public:
  WatchGuard(Watchdog* w, const char* op, int64_t seq, int64_t count, DType dt) : w_(w) {
    rank_status::collective_begin(op, seq);
    if (w_) w_->arm(op, seq, count, dt);
  }
  ~WatchGuard() {
    if (w_) w_->disarm();
    rank_status::collective_end();
  }
  WatchGuard(const WatchGuard&) = delete;
  WatchGuard& operator=(const WatchGuard&) = delete;

 private:
  Watchdog* w_;
};

}  // namespace zerorun
