// Error checks for CUDA and cuBLAS calls (a failure becomes a zerorun::Error
// naming the call, file and line) and the one stream all GPU work is queued on.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "zerorun/error.h"

#define ZR_CUDA(call)                                                                                          \
  do {                                                                                                         \
    cudaError_t zr_e_ = (call);                                                                                \
    if (zr_e_ != cudaSuccess)                                                                                  \
      ZR_FAIL("CUDA error ", cudaGetErrorName(zr_e_), " (", cudaGetErrorString(zr_e_), ") in ", #call, " at ", \
              __FILE__, ":", __LINE__);                                                                        \
  } while (0)
#define ZR_CUBLAS(call)                                                                                  \
  do {                                                                                                   \
    cublasStatus_t zr_s_ = (call);                                                                       \
    if (zr_s_ != CUBLAS_STATUS_SUCCESS)                                                                  \
      ZR_FAIL("cuBLAS error ", static_cast<int>(zr_s_), " in ", #call, " at ", __FILE__, ":", __LINE__); \
  } while (0)

namespace zerorun::cuda {
// The stream every kernel, copy, memset and library call is queued on (not the legacy default stream, which
// cannot be captured into a CUDA graph). Blocking: work still queued on the legacy stream orders against it.
// While a SideStream::Scope is alive (on this thread): that side stream. The main stream (and NCCL's) runs at the
// top priority, a SideStream at the bottom, so side work fills what the main stream leaves idle.
cudaStream_t stream();
int stream_priority(bool top);  // the device's top or bottom stream priority
// Device to host on the stream, waiting for it (and everything queued before it).
void fetch(void* host, const void* dev, size_t bytes);
}  // namespace zerorun::cuda
