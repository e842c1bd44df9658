// Records SIGUSR1 / SIGTERM for the trainer's graceful stop (see stop_signal.h).
#include "zerorun/stop_signal.h"

#include <signal.h>

#include <atomic>
#include <initializer_list>

namespace zerorun {
namespace {
std::atomic<int> g_stop{0};
void on_stop(int sig) {
  if (g_stop.exchange(sig) != 0) {  // a second signal: the stop is not waited for (a step that hangs, impatience)
    signal(sig, SIG_DFL);
    raise(sig);
  }
}
}  // namespace

void install_stop_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // system calls in flight (file writes, MPI) go on
  for (int s : {SIGUSR1, SIGTERM}) sigaction(s, &sa, nullptr);
}

int stop_signal() { return g_stop.load(); }

}  // namespace zerorun
