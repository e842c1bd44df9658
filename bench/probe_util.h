// Shared by the device probes (gemm_probe.cc, attn_probe.cc): raw device buffers, random bf16 fills and CUDA-event
// timing.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "zerorun/error.h"

namespace zerorun::probe {
// A zeroed device buffer (freed by the caller with cudaFree).
inline void* dev_alloc(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) ZR_FAIL("cudaMalloc of ", bytes, " bytes failed");
  cudaMemset(p, 0, bytes);
  return p;
}
// bf16 bits <-> float.
inline float bf16_value(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}
inline uint16_t bf16_bits(float v) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
// Random bf16 values in [-amp, amp) (as bits) into device memory; returns them as floats.
inline std::vector<float> fill_bf16(void* d, size_t n, unsigned seed, float amp = 2.f) {
  std::vector<uint16_t> h(n);
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    h[i] = bf16_bits(((seed >> 8) / 16777216.f) * 2.f * amp - amp);
    f[i] = bf16_value(h[i]);
  }
  cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice);
  return f;
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
