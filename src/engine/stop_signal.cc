// Records the graceful-stop event (SIGUSR1 / SIGTERM; Ctrl+Break and console close on Windows) for the trainer
// (see stop_signal.h); the platform layer installs the handler.
#include "zerorun/stop_signal.h"

#include <atomic>

#include "zerorun/platform.h"
#include "zerorun/rank_status.h"

namespace zerorun {
namespace {
std::atomic<int> g_stop{0};
void on_stop(int code) {
  g_stop.store(code);
  rank_status::report_signal(code);  // async-signal-safe: the launcher's report says what this rank was doing
}
}  // namespace

void install_stop_handler() { platform::install_stop_events(on_stop); }

int stop_signal() { return g_stop.load(); }

}  // namespace zerorun
