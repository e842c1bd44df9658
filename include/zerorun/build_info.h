// What this build contains and what it can see (for `zerorun report`).
#pragma once
#include <string>

namespace zerorun {

struct GpuInfo {
  int count = 0;
  std::string summary;  // one line per device, or why none were found
  std::string runtime_version;
};

bool built_with_cuda();
GpuInfo query_gpus();  // implemented by kernels/cuda or kernels/stub
std::string build_report();

}  // namespace zerorun
