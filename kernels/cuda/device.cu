// CUDA build: asks the runtime which GPUs this process can use.
#include <cuda_runtime.h>

#include <string>

#include "zerorun/build_info.h"

namespace zerorun {
bool built_with_cuda() { return true; }
GpuInfo query_gpus() {
  GpuInfo g;
  int rv = 0;
  cudaRuntimeGetVersion(&rv);
  g.runtime_version = std::to_string(rv / 1000) + "." + std::to_string((rv % 1000) / 10);
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    g.summary = std::string("no usable GPU: ") + cudaGetErrorString(e);
    return g;
  }
  g.count = n;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    cudaGetDeviceProperties(&p, i);
    g.summary += "cuda:" + std::to_string(i) + " " + p.name + ", sm_" + std::to_string(p.major) +
                 std::to_string(p.minor) + ", " + std::to_string(p.totalGlobalMem >> 20) + " MiB\n";
  }
  return g;
}
}  // namespace zerorun
