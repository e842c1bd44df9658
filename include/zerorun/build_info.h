// What this build contains and what it can see (`zerorun report`, device checks, estimates). Core declares it: the
// GPU queries are defined by the kernels layer (kernels/cuda/device.cu, or kernels/stub without CUDA), the rest by
// src/core/build_info.cc; the report's text is the CLI's (src/cli/report.cc).
#pragma once
#include <string>

namespace zerorun {

struct GpuInfo {
  int count = 0;
  std::string summary;  // one line per device, or why none were found
  std::string runtime_version;
  std::string cublas_version;  // empty without CUDA
  std::string archs;           // CMAKE_CUDA_ARCHITECTURES of the kernels ("90", "80;90-real"), empty without CUDA
};

bool built_with_cuda();
GpuInfo query_gpus();  // implemented by kernels/cuda or kernels/stub
// Whether kernels built for `archs` (CMake's CUDA_ARCHITECTURES list: "90" = sm_90 code + compute_90 PTX,
// "90-real" = code only, "90-virtual" = PTX only) run on a GPU of compute capability `sm` (e.g. 90): code for
// exactly that capability, or PTX of one at or below it, which the driver compiles. True when the list cannot tell
// ("native", "all", "all-major", OFF, empty: nvcc picked the targets).
bool cuda_archs_run_on(const std::string& archs, int sm);
// Empty when this build's kernels run on CUDA device `device`, else why not and how to rebuild.
std::string gpu_arch_problem(int device);

}  // namespace zerorun
