// Fatal-signal reporter for the zerorun binary (see crash_handler.cc).
#pragma once
namespace zerorun {
void install_crash_handler();
}
