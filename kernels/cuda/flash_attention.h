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

// Tensor-core variant for 16-bit runs (flash_attention_tc.cu): bf16 (or fp16)
// operands, fp32 accumulation; head size 64 only. qkv [B, T, 3C] in 16 bits;
// the output in f32 (out) or 16 bits (out16, out null).
bool tc_supported(int64_t head_size);
// cfg: the forward's tiling (bench/attn_probe.cc sweeps 0 .. tc_forward_configs() - 1; training uses 0).
void tc_forward(bool bf16, const uint16_t* qkv, float* out, uint16_t* out16, float* lse, int64_t B, int64_t T,
                int64_t C, int64_t H, int cfg = 0);
int tc_forward_configs();
const char* tc_forward_config_name(int cfg);
// dout [B, T, C] in 16 bits; the forward's output in out or out16. The qkv gradient is added into
// (acc) or written over dqkv, or (dqkv16 non-null, dqkv null) written in 16 bits. `delta`: B*H*T floats of scratch.
// dq_acc non-null (B*T*C floats of scratch): one kernel of five products, dQ summed with atomics (faster, not
// bitwise reproducible); null: a dK/dV kernel and a dQ kernel, seven products, no atomics, same bits every run.
// cfg: the one-kernel path's variant (the probe sweeps 0 .. tc_backward_configs() - 1; training uses 0).
void tc_backward(bool bf16, const uint16_t* qkv, const float* out, const uint16_t* out16, const float* lse,
                 const uint16_t* dout, float* dqkv, uint16_t* dqkv16, bool acc, float* delta, float* dq_acc, int64_t B,
                 int64_t T, int64_t C, int64_t H, int cfg = 0);
int tc_backward_configs();
}  // namespace zerorun::kernels::flash
