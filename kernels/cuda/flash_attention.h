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
// delta[b, h, t] = sum_i dout[b, t, h*hs + i] * out[b, t, h*hs + i] (backward's row term).
void row_delta(const float* out, const float* dout, float* delta, int64_t B, int64_t T, int64_t C, int64_t H);

// Tensor-core variant for 16-bit runs (flash_attention_tc.cu): bf16 (or fp16)
// operands, fp32 accumulation; head size 64 only. Same tensors as above, plus
// `scratch` of tc_scratch_elems() 16-bit elements for the packed operands.
bool tc_supported(int64_t head_size);
int64_t tc_scratch_elems(int64_t B, int64_t T, int64_t H);
void tc_forward(bool bf16, const float* qkv, float* out, float* lse, uint16_t* scratch, int64_t B, int64_t T, int64_t C,
                int64_t H);
// acc: add into dqkv (else overwrite it).
// dqkv16 non-null: dqkv is written there in 16 bits instead (dqkv unused).
void tc_backward(bool bf16, const float* qkv, const float* out, const float* lse, const float* dout, float* dqkv,
                 uint16_t* dqkv16, bool acc, float* delta, uint16_t* scratch, int64_t B, int64_t T, int64_t C,
                 int64_t H);
}  // namespace zerorun::kernels::flash
