// `zerorun report`'s text (src/cli/report.cc).
#pragma once
#include <string>

namespace zerorun {

std::string build_report();

}  // namespace zerorun
