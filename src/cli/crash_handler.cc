// A fatal fault (SIGSEGV, SIGBUS, SIGILL, SIGFPE; an unhandled exception on Windows) must not end a rank silently:
// the platform layer prints which fault hit which rank and a backtrace to stderr, then dies with the fault's default
// action so the launcher sees the failure.
#include "crash_handler.h"

#include "zerorun/platform.h"
#include "zerorun/trainer.h"

namespace zerorun {
void install_crash_handler() { platform::install_crash_backtrace(launcher_rank); }
}  // namespace zerorun
