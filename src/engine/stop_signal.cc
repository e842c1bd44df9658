// Records the graceful-stop event (SIGUSR1 / SIGTERM; Ctrl+Break and console close on Windows) for the trainer
// (see stop_signal.h); the platform layer installs the handler.
#include "zerorun/stop_signal.h"

#include <atomic>

#include "zerorun/platform.h"

namespace zerorun {
namespace {
std::atomic<int> g_stop{0};
void on_stop(int code) { g_stop.store(code); }
}  // namespace

void install_stop_handler() { platform::install_stop_events(on_stop); }

int stop_signal() { return g_stop.load(); }

}  // namespace zerorun
