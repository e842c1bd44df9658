// Shared by the device probes (gemm_probe.cc, attn_probe.cc): raw device buffers and CUDA-event timing.
#pragma once
#include <cuda_runtime.h>

#include <functional>

#include "zerorun/error.h"

namespace zerorun::probe {
// A zeroed device buffer (freed by the caller with cudaFree).
inline void* dev_alloc(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) ZR_FAIL("cudaMalloc of ", bytes, " bytes failed");
  cudaMemset(p, 0, bytes);
  return p;
}
// Milliseconds per call of f: three warm-up calls, then `reps` timed between two CUDA events.
inline double event_ms(const std::function<void()>& f, int reps = 20) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  for (int i = 0; i < reps; ++i) f();
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / reps;
}
}  // namespace zerorun::probe
