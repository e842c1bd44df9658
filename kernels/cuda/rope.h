// Launchers of the rotary-embedding kernels (rope.cu): the CUDA side of
// kernels/cpu/rope.cc, same layouts and the same angles (cpu::rope_angle).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace zerorun::kernels::rope {
// qkv [B, T, (H + 2K) D] -> out [B, T, 3 H D]: q and k rotated, key/value heads repeated H / K times.
void forward(const float* qkv, float* out, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D, float theta,
             cudaStream_t stream);
// dqkv = (acc ? dqkv : 0) + the gradient of dout through forward.
void backward(const float* dout, float* dqkv, bool acc, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D,
              float theta, cudaStream_t stream);
}  // namespace zerorun::kernels::rope
