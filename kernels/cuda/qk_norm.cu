// RMSNorm of the q and k parts of packed qkv rows on the GPU (cpu::qk_norm_*):
// a warp per (row, group) for the values and the input gradient; the weight
// gradients in two passes (per-chunk partial sums over rows, then the chunks
// added in order), so they are the same bits every run.
#include <algorithm>

#include "cuda_check.h"
#include "device_util.h"
#include "qk_norm.h"

namespace zerorun::kernels::qk {
namespace {
constexpr int kTpb = 256, kRowsPerChunk = 64;

__device__ inline float warp_add(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
struct Group {
  int64_t off, size;
  const float* w;
};
__device__ inline Group group(int64_t g, int64_t H, int64_t K, int64_t D, bool full, const float* wq, const float* wk) {
  if (full) return g == 0 ? Group{0, H * D, wq} : Group{H * D, K * D, wk};
  return {g * D, D, g < H ? wq : wk};
}

__global__ void k_fwd(const float* x, const float* wq, const float* wk, float* y, float* rstd, int64_t N, int64_t H,
                      int64_t K, int64_t D, bool full, float eps) {
  const int64_t W = (H + 2 * K) * D, G = full ? 2 : H + K;
  const int lane = threadIdx.x & 31;
  for (int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; w < N * (G + 1);
       w += (int64_t)gridDim.x * blockDim.x / 32) {
    const int64_t n = w / (G + 1), g = w % (G + 1);
    const float* xr = x + n * W;
    float* yr = y + n * W;
    if (g == G) {  // the v part: copied
      for (int64_t c = (H + K) * D + lane; c < W; c += 32) yr[c] = xr[c];
      continue;
    }
    const Group q = group(g, H, K, D, full, wq, wk);
    float ss = 0.f;
    for (int64_t c = lane; c < q.size; c += 32) ss += xr[q.off + c] * xr[q.off + c];
    ss = warp_add(ss);
    const float rs = rsqrtf(ss / static_cast<float>(q.size) + eps);
    for (int64_t c = lane; c < q.size; c += 32) yr[q.off + c] = xr[q.off + c] * rs * q.w[c];
    if (lane == 0) rstd[n * G + g] = rs;
  }
}

__global__ void k_bwd_dx(const float* x, const float* wq, const float* wk, const float* rstd, const float* dy,
                         float* dx, bool acc, int64_t N, int64_t H, int64_t K, int64_t D, bool full) {
  const int64_t W = (H + 2 * K) * D, G = full ? 2 : H + K;
  const int lane = threadIdx.x & 31;
  for (int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; w < N * (G + 1);
       w += (int64_t)gridDim.x * blockDim.x / 32) {
    const int64_t n = w / (G + 1), g = w % (G + 1);
    const float *xr = x + n * W, *dr = dy + n * W;
    float* o = dx + n * W;
    if (g == G) {
      for (int64_t c = (H + K) * D + lane; c < W; c += 32) o[c] = (acc ? o[c] : 0.f) + dr[c];
      continue;
    }
    const Group q = group(g, H, K, D, full, wq, wk);
    const float rs = rstd[n * G + g];
    float s = 0.f;
    for (int64_t c = lane; c < q.size; c += 32) s += dr[q.off + c] * q.w[c] * xr[q.off + c] * rs;
    const float m = warp_add(s) / static_cast<float>(q.size);
    for (int64_t c = lane; c < q.size; c += 32) {
      const float v = (dr[q.off + c] * q.w[c] - xr[q.off + c] * rs * m) * rs;
      o[q.off + c] = (acc ? o[q.off + c] : 0.f) + v;
    }
  }
}

// part[chunk, c] = the sum over the chunk's rows and groups [g0, g1) of dy x rstd at feature c of the group.
__global__ void k_bwd_dw(const float* x, const float* rstd, const float* dy, float* part, int64_t N, int64_t H,
                         int64_t K, int64_t D, bool full, int64_t g0, int64_t g1, int64_t size) {
  const int64_t W = (H + 2 * K) * D, G = full ? 2 : H + K, r0 = blockIdx.y * (int64_t)kRowsPerChunk;
  const int64_t r1 = min(N, r0 + kRowsPerChunk);
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < size; c += (int64_t)gridDim.x * blockDim.x) {
    float s = 0.f;
    for (int64_t n = r0; n < r1; ++n)
      for (int64_t g = g0; g < g1; ++g) {
        const int64_t i = n * W + group(g, H, K, D, full, nullptr, nullptr).off + c;
        s += dy[i] * x[i] * rstd[n * G + g];
      }
    part[blockIdx.y * size + c] = s;
  }
}
__global__ void k_sum_chunks(const float* part, float* dw, int64_t chunks, int64_t size) {
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < size; c += (int64_t)gridDim.x * blockDim.x) {
    float s = 0.f;
    for (int64_t k = 0; k < chunks; ++k) s += part[k * size + c];
    dw[c] += s;
  }
}
unsigned warps_grid(int64_t warps) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((warps * 32 + kTpb - 1) / kTpb, 1 << 20)));
}
unsigned grid(int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + kTpb - 1) / kTpb, 1 << 16)));
}
}  // namespace

void norm_fwd(const float* x, const float* wq, const float* wk, float* y, float* rstd, int64_t N, int64_t H, int64_t K,
              int64_t D, bool full, float eps, cudaStream_t s) {
  if (N == 0) return;
  const int64_t G = full ? 2 : H + K;
  k_fwd<<<warps_grid(N * (G + 1)), kTpb, 0, s>>>(x, wq, wk, y, rstd, N, H, K, D, full, eps);
  ZR_CUDA(cudaGetLastError());
}

void norm_bwd(const float* x, const float* wq, const float* wk, const float* rstd, const float* dy, float* dx, bool acc,
              float* dwq, float* dwk, int64_t N, int64_t H, int64_t K, int64_t D, bool full, cudaStream_t s) {
  if (N == 0) return;
  const int64_t G = full ? 2 : H + K;
  if (dx) {
    k_bwd_dx<<<warps_grid(N * (G + 1)), kTpb, 0, s>>>(x, wq, wk, rstd, dy, dx, acc, N, H, K, D, full);
    ZR_CUDA(cudaGetLastError());
  }
  const int64_t chunks = (N + kRowsPerChunk - 1) / kRowsPerChunk;
  ZR_CHECK(chunks < 65536, "qk_norm: ", N, " rows are beyond the CUDA weight-gradient kernel's grid");
  for (int side = 0; side < 2; ++side) {
    float* dw = side == 0 ? dwq : dwk;
    if (!dw) continue;
    const int64_t size = full ? (side == 0 ? H : K) * D : D;
    const int64_t g0 = full ? side : (side == 0 ? 0 : H), g1 = full ? side + 1 : (side == 0 ? H : H + K);
    DevBuf<float> part(static_cast<size_t>(chunks * size), false);
    k_bwd_dw<<<dim3(grid(size), static_cast<unsigned>(chunks)), kTpb, 0, s>>>(x, rstd, dy, part.p, N, H, K, D, full, g0,
                                                                              g1, size);
    ZR_CUDA(cudaGetLastError());
    k_sum_chunks<<<grid(size), kTpb, 0, s>>>(part.p, dw, chunks, size);
    ZR_CUDA(cudaGetLastError());
  }
}
}  // namespace zerorun::kernels::qk
