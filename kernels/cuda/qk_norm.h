// Launchers of qk_norm.cu and pointwise.cu: the CUDA side of kernels/cpu's
// qk_norm_* (RMSNorm of the q and k parts of packed qkv) and unary_* (scale,
// soft-capping, shift), same layouts and formulas, on an explicit stream.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"

namespace zerorun::kernels::qk {
void norm_fwd(const float* x, const float* wq, const float* wk, float* y, float* rstd, int64_t N, int64_t H, int64_t K,
              int64_t D, bool full, float eps, cudaStream_t s);
// dx (added into where acc, else written; null: not wanted), dwq / dwk added into (null: not wanted).
void norm_bwd(const float* x, const float* wq, const float* wk, const float* rstd, const float* dy, float* dx, bool acc,
              float* dwq, float* dwk, int64_t N, int64_t H, int64_t K, int64_t D, bool full, cudaStream_t s);
void zero_rows(const int32_t* ids, int32_t value, float* x, int64_t N, int64_t C, cudaStream_t s);
void unary_fwd(cpu::Unary op, float a, const float* x, float* y, int64_t n, cudaStream_t s);
void unary_bwd(cpu::Unary op, float a, const float* x, const float* dy, float* dx, bool acc, int64_t n, cudaStream_t s);
// cpu::dropout on the GPU (the same counter-based mask).
void dropout(const rng::Dropout& d, const float* x, float* y, bool acc, int64_t n, cudaStream_t s);
}  // namespace zerorun::kernels::qk
