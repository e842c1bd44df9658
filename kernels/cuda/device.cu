// CUDA build: asks the runtime which GPUs this process can use.
#include <cublasLt.h>
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
  const size_t bv = cublasLtGetVersion();  // major * 10000 + minor * 100 + patch
  g.cublas_version = std::to_string(bv / 10000) + "." + std::to_string(bv / 100 % 100) + "." + std::to_string(bv % 100);
  g.archs = ZERORUN_CUDA_ARCHS;
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
    const std::string problem = gpu_arch_problem(i);
    g.summary += "cuda:" + std::to_string(i) + " " + p.name + ", sm_" + std::to_string(p.major * 10 + p.minor) + ", " +
                 std::to_string(p.totalGlobalMem >> 20) + " MiB" +
                 (problem.empty() ? "" : "  <- NOT USABLE: " + problem) + "\n";
  }
  return g;
}

std::string gpu_arch_problem(int device) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return "";  // the caller's next CUDA call says why
  const int sm = p.major * 10 + p.minor;
  if (cuda_archs_run_on(ZERORUN_CUDA_ARCHS, sm)) return "";
  return "GPU " + std::to_string(device) + " (" + p.name + ") is sm_" + std::to_string(sm) +
         ", but this zerorun's kernels are built for CUDA_ARCHITECTURES " + ZERORUN_CUDA_ARCHS +
         ": rebuild with -DCMAKE_CUDA_ARCHITECTURES=" + std::to_string(sm) + " (or a list such as \"" +
         std::to_string(sm) + ";90\")";
}
}  // namespace zerorun
