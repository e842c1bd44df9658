// Launchers of the flash-style causal attention kernels (flash_attention.cu).
#pragma once
#include <cstdint>

namespace zerorun::kernels::flash {
bool supported(int64_t head_size);
// qkv [B, T, 3C] -> out [B, T, C], lse [B, H, T].
void forward(const float* qkv, float* out, float* lse, int64_t B, int64_t T, int64_t C, int64_t H);
// Accumulates into dqkv; `delta` is scratch of B*H*T floats.
void backward(const float* qkv, const float* out, const float* lse, const float* dout, float* dqkv, float* delta,
              int64_t B, int64_t T, int64_t C, int64_t H);
}  // namespace zerorun::kernels::flash
