// Launchers of the rotary-embedding kernels (rope.cu): the CUDA side of
// kernels/cpu/rope.cc, same layouts and the same angles (cpu::rope_angle).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"

namespace zerorun::kernels::rope {
// A tensor in f32 (f) or, f null, 16-bit bits (h) of bfloat16 (bf) or fp16.
struct In {
  const float* f;
  const uint16_t* h;
};
struct Out {
  float* f;
  uint16_t* h;
};
// qkv [B, T, (H + 2K) D] -> out [B, T, 3 H D] (key/value heads repeated H / K times) or, !repeat, the same layout:
// q and k rotated. pos [B, T] in device memory (null: row r is at position r % T): each row's position, clamped to
// [0, n_pos).
void forward(In qkv, Out out, bool bf, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D, const cpu::RopeFreqs& f,
             bool repeat, const int32_t* pos, int64_t n_pos, cudaStream_t stream);
// dqkv = (acc ? dqkv : 0) + the gradient of dout through forward (a 16-bit dqkv is always overwritten).
void backward(In dout, Out dqkv, bool acc, bool bf, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D,
              const cpu::RopeFreqs& f, bool repeat, const int32_t* pos, int64_t n_pos, cudaStream_t stream);
}  // namespace zerorun::kernels::rope
