// Launcher of the cached-attention kernels (attention_cached.cu): incremental decoding on the GPU, the CUDA side of
// kernels/cpu/attention_cached.cc.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"

namespace zerorun::kernels::cached {
// cpu::attention_cached on the device: qkv [d.T, (H + 2K) D], kc / vc [K, cap, D], out [d.T, H D].
void forward(const float* qkv, float* kc, float* vc, float* out, const cpu::AttnDims& d, int64_t len, int64_t cap,
             cudaStream_t stream);
}  // namespace zerorun::kernels::cached
