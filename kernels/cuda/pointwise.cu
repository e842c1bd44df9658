// One-parameter pointwise maps on the GPU (cpu::unary_*): an embedding scale,
// Gemma 2's logit soft-capping and the (1 + w) shift of Gemma's norm weights,
// with the CPU's formulas (cpu::unary_value / unary_grad); dropout with the
// CPU's counter-based mask; and zero_rows, the padding token's rows of an
// embedding gradient.
#include <algorithm>

#include "cuda_check.h"
#include "qk_norm.h"

namespace zerorun::kernels::qk {
namespace {
constexpr int kTpb = 256;
unsigned grid(int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + kTpb - 1) / kTpb, 1 << 20)));
}
__global__ void k_fwd(cpu::Unary op, float a, const float* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = cpu::unary_value(op, a, x[i]);
}
__global__ void k_bwd(cpu::Unary op, float a, const float* x, const float* dy, float* dx, bool acc, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dx[i] = (acc ? dx[i] : 0.f) + dy[i] * cpu::unary_grad(op, a, x[i]);
}
__global__ void k_dropout(rng::Dropout d, const float* x, float* y, bool acc, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float v = rng::dropout_keep(d.key, d.counter0 + static_cast<uint64_t>(i), d.threshold) ? x[i] * d.scale : 0.f;
    y[i] = acc ? y[i] + v : v;
  }
}
__global__ void k_zero_rows(const int32_t* ids, int32_t value, float* x, int64_t N, int64_t C) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N * C; i += (int64_t)gridDim.x * blockDim.x)
    if (ids[i / C] == value) x[i] = 0.f;
}
}  // namespace

void zero_rows(const int32_t* ids, int32_t value, float* x, int64_t N, int64_t C, cudaStream_t s) {
  if (N * C <= 0) return;
  k_zero_rows<<<grid(N * C), kTpb, 0, s>>>(ids, value, x, N, C);
  ZR_CUDA(cudaGetLastError());
}
void dropout(const rng::Dropout& d, const float* x, float* y, bool acc, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  k_dropout<<<grid(n), kTpb, 0, s>>>(d, x, y, acc, n);
  ZR_CUDA(cudaGetLastError());
}
void unary_fwd(cpu::Unary op, float a, const float* x, float* y, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  k_fwd<<<grid(n), kTpb, 0, s>>>(op, a, x, y, n);
  ZR_CUDA(cudaGetLastError());
}
void unary_bwd(cpu::Unary op, float a, const float* x, const float* dy, float* dx, bool acc, int64_t n,
               cudaStream_t s) {
  if (n <= 0) return;
  k_bwd<<<grid(n), kTpb, 0, s>>>(op, a, x, dy, dx, acc, n);
  ZR_CUDA(cudaGetLastError());
}
}  // namespace zerorun::kernels::qk
