// Device-side pieces the CUDA kernel files share: 16-bit storage conversions
// (bfloat16 or fp16 bits, chosen at run time) and DevBuf, RAII scratch from
// the caching allocator, freed stream-ordered when it goes out of scope.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "cuda_check.h"
#include "zerorun/cuda_rt.h"

namespace zerorun::kernels {
// 16-bit storage: bf (bfloat16) or fp16 bits.
__device__ inline uint16_t to16_bits(bool bf, float v) {
  return bf ? __bfloat16_as_ushort(__float2bfloat16_rn(v)) : __half_as_ushort(__float2half_rn(v));
}
__device__ inline float from16(bool bf, uint16_t u) {
  return bf ? __bfloat162float(__ushort_as_bfloat16(u)) : __half2float(__ushort_as_half(u));
}

template <typename T>
struct DevBuf {  // scratch from the caching allocator
  T* p = nullptr;
  size_t bytes = 0;
  DevBuf() = default;  // empty
  explicit DevBuf(size_t n, bool zero = true) : bytes(n * sizeof(T)) {
    ZR_CUDA(cudaGetDevice(&dev));
    p = static_cast<T*>(cuda::device_alloc(bytes, dev));
    if (zero) ZR_CUDA(cudaMemsetAsync(p, 0, bytes, cuda::stream()));
  }
  int dev = 0;
  DevBuf(DevBuf&& o) noexcept : p(o.p), bytes(o.bytes), dev(o.dev) { o.p = nullptr; }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf& operator=(DevBuf&& o) noexcept {
    std::swap(p, o.p), std::swap(bytes, o.bytes), std::swap(dev, o.dev);
    return *this;
  }
  ~DevBuf() {
    if (p) cuda::device_free(p, bytes, dev);
  }
};
}  // namespace zerorun::kernels
