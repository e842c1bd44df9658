// Launchers of the flash-style causal attention kernels (flash_attention.cu, flash_attention_tc.cu). Sizes and
// options as cpu::AttnDims: qkv [B, T, (H + 2K) D] (query heads, key heads, value heads), out [B, T, H D], lse
// [B, H, T]; grouped-query key/value heads read in place, a scale, a sliding window, soft-capping.
#pragma once
#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"

namespace zerorun::kernels::flash {
using cpu::AttnDims;

// fp32 kernels: head sizes up to 256.
bool supported(const AttnDims& d);
void forward(const float* qkv, float* out, float* lse, const AttnDims& d);
// Accumulates into dqkv; `delta` is scratch of B*H*T floats.
void backward(const float* qkv, const float* out, const float* lse, const float* dout, float* dqkv, float* delta,
              const AttnDims& d);

// Tensor-core variant for 16-bit runs (flash_attention_tc.cu): bf16 (or fp16) operands, fp32 accumulation; head
// sizes tc_head_sizes() lists. qkv in 16 bits; the output in f32 (out) or 16 bits (out16, out null).
bool tc_supported(const AttnDims& d);
const char* tc_head_sizes();  // "64, 80, 96, 128, 256"
// cfg: the forward's tiling (bench/attn_probe.cc sweeps 0 .. tc_forward_configs(D) - 1; training uses 0).
void tc_forward(bool bf16, const uint16_t* qkv, float* out, uint16_t* out16, float* lse, const AttnDims& d,
                int cfg = 0);
int tc_forward_configs(int64_t head_size);
const char* tc_forward_config_name(int64_t head_size, int cfg);
// dout [B, T, H D] in 16 bits; the forward's output in out or out16. The qkv gradient is added into (acc) or
// written over dqkv, or (dqkv16 non-null, dqkv null) written in 16 bits. `delta`: B*H*T floats of scratch.
// dq_acc non-null (B*T*H*D floats of scratch; B*T*(H + 2K)*D with gqa_split): one kernel of five products, dQ
// summed with atomics (faster, not bitwise reproducible); null: a dK/dV kernel and a dQ kernel, seven products, no
// atomics, same bits every run. gqa_split (with dq_acc, K < H): the key-block work split over the query heads of
// each key/value head, dK and dV summed with atomics (a grid of H heads instead of K: 0.67 -> 0.47 ms at B 4, H 16,
// K 4, T 2048, head size 64 on an H100; the backend's default, ZERORUN_ATTN_GQA_SPLIT=0 turns it off).
// cfg: the one-kernel path's variant (the probe sweeps 0 .. tc_backward_configs(D) - 1; training uses 0).
void tc_backward(bool bf16, const uint16_t* qkv, const float* out, const uint16_t* out16, const float* lse,
                 const uint16_t* dout, float* dqkv, uint16_t* dqkv16, bool acc, float* delta, float* dq_acc,
                 const AttnDims& d, int cfg = 0, bool gqa_split = false);
int tc_backward_configs(int64_t head_size);
}  // namespace zerorun::kernels::flash
