// Why a rank ended, told to the supervising launcher: on a failure (an error, the collective watchdog, its launcher
// gone) or a stop signal, a rank started by the multi-rank launcher writes one machine-readable line to stderr,
//   ZERORUN_RANK_STATUS rank=1 world=2 host=h pid=42 event=watchdog code=1 step=7 op=all_gather seq=311 active=1
//   for_ms=10012 msg=<the human-readable line>
// which reaches the launching host through the MPI launcher's own stderr forwarding (the rank's files may be on
// another host). The launcher (src/launch/supervise.cc) holds these lines back and prints one root-cause report.
// The rank's state (step, collective in progress or last) is kept in atomics so a signal handler can write it.
#pragma once
#include <cstdint>
#include <string>

namespace zerorun::rank_status {

inline constexpr const char* kPrefix = "ZERORUN_RANK_STATUS ";

// Turned on by a multi-rank Communicator (world > 1) when ZERORUN_RANK_STATUS=1, which the launcher sets for the
// job; lines are written only then.
void set_identity(int rank, int world);
bool enabled();
// The optimizer step about to run (1-based). Testing: ZERORUN_FAULT_INJECT=fail_at_step:R:N makes rank R fail with
// an error at step N.
void set_step(int64_t step);
void collective_begin(const char* op, int64_t seq);  // the Communicator funnel (WatchGuard)
void collective_end();
// Writes the line (when enabled): event "error" | "watchdog" | "launcher_gone", the exit code the rank ends with,
// and its message (newlines become spaces).
void report(const char* event, const std::string& message, int exit_code);
// Async-signal-safe: the rank's state when a stop signal arrived (event "signal", code 128 + sig).
void report_signal(int sig);

// A parsed line.
struct Report {
  int rank = -1, world = -1, pid = -1, code = -1;
  std::string host, event, op, msg;
  int64_t step = -1, seq = -1, for_ms = -1;
  bool active = false;  // op is in progress (else: the last one completed)
};
// false when `line` is not a status line (or lacks rank/event).
bool parse(const std::string& line, Report* out);
// "step 7, in all_gather #311 for 10.0 s" / "step 7, last collective all_reduce #310" / "before step 1"
std::string describe_state(const Report& r);

}  // namespace zerorun::rank_status
