// A fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE) must not end a rank
// silently: print which signal hit which rank and a backtrace to stderr, then
// die with the signal's default action so the launcher sees the failure.
#include "crash_handler.h"

#include <execinfo.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "zerorun/trainer.h"

namespace zerorun {
namespace {
void on_fatal(int sig) {
  char head[160];
  int n = std::snprintf(head, sizeof head, "[zerorun] fatal signal %d (%s) in pid %d, rank %d; backtrace:\n", sig,
                        strsignal(sig), static_cast<int>(getpid()), launcher_rank());
  if (n > 0) (void)!write(STDERR_FILENO, head, static_cast<size_t>(n));
  void* frames[64];
  int k = backtrace(frames, 64);
  backtrace_symbols_fd(frames, k, STDERR_FILENO);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}
}  // namespace

void install_crash_handler() {
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
  for (int s : {SIGSEGV, SIGBUS, SIGILL, SIGFPE}) std::signal(s, on_fatal);
}
}  // namespace zerorun
