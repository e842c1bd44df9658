// Attention over a key/value cache on the GPU (zerorun sample's incremental decoding, src/infer): the new tokens'
// keys and values are copied into the cache, then one block per (query, head) scores the cached keys (scale,
// soft-capping, sliding window: cpu::attention_cached's arithmetic in f32), takes the softmax with block reductions
// and sums the values, a thread per feature. The scores live in scratch of the caching allocator, so any cache
// length works. Decoding is one token at a time, so this is about correctness, not speed.
#include <algorithm>

#include "attention_cached.h"
#include "cuda_check.h"
#include "device_util.h"

namespace zerorun::kernels::cached {
namespace {
constexpr int kThreads = 128;

__global__ void k_append(const float* qkv, float* kc, float* vc, int64_t n, int H, int K, int D, int64_t len,
                         int64_t cap) {
  const int64_t W = int64_t{H + 2 * K} * D, total = n * K * D;
  for (int64_t x = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; x < total; x += (int64_t)gridDim.x * blockDim.x) {
    const int64_t j = x % D, g = (x / D) % K, i = x / (int64_t{K} * D);
    kc[(g * cap + len + i) * D + j] = qkv[i * W + (H + g) * D + j];
    vc[(g * cap + len + i) * D + j] = qkv[i * W + (H + K + g) * D + j];
  }
}

// v reduced over the block (max or sum); every thread gets the result.
__device__ float block_reduce(float v, bool is_max, float* red) {
  for (int o = 16; o > 0; o /= 2) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();  // red may still be read from the previous reduction
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = red[0];
  for (int w = 1; w < warps; ++w) v = is_max ? fmaxf(v, red[w]) : v + red[w];
  return v;
}

__global__ void k_attend(const float* qkv, const float* kc, const float* vc, float* out, float* scratch, int H, int K,
                         int D, int64_t len, int64_t cap, int64_t stride, float scale, float softcap, int64_t window) {
  __shared__ float q[256];
  __shared__ float red[32];
  const int h = blockIdx.x, g = h / (H / K);
  const int64_t i = blockIdx.y, t = len + i, s0 = window > 0 && t >= window ? t - window + 1 : 0;
  const int64_t W = int64_t{H + 2 * K} * D;
  for (int j = threadIdx.x; j < D; j += blockDim.x) q[j] = qkv[i * W + int64_t{h} * D + j];
  __syncthreads();
  float* p = scratch + (i * H + h) * stride;
  float mx = -INFINITY;
  for (int64_t s = s0 + threadIdx.x; s <= t; s += blockDim.x) {
    const float* k = kc + (g * cap + s) * D;
    float sc = 0.f;
    for (int j = 0; j < D; ++j) sc += q[j] * k[j];
    sc *= scale;
    if (softcap > 0.f) sc = softcap * tanhf(sc / softcap);
    p[s - s0] = sc;
    mx = fmaxf(mx, sc);
  }
  mx = block_reduce(mx, true, red);
  float sum = 0.f;
  for (int64_t s = s0 + threadIdx.x; s <= t; s += blockDim.x) {
    const float e = expf(p[s - s0] - mx);
    p[s - s0] = e;
    sum += e;
  }
  sum = block_reduce(sum, false, red);  // its __syncthreads also orders the p writes before the reads below
  const float inv = 1.f / sum;
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    float acc = 0.f;
    for (int64_t s = s0; s <= t; ++s) acc += p[s - s0] * inv * vc[(g * cap + s) * D + j];
    out[i * int64_t{H} * D + int64_t{h} * D + j] = acc;
  }
}
}  // namespace

void forward(const float* qkv, float* kc, float* vc, float* out, const cpu::AttnDims& d, int64_t len, int64_t cap,
             cudaStream_t stream) {
  const int64_t n = d.T;
  if (n == 0) return;
  ZR_CHECK(d.D <= 256 && d.H <= 65535 && n <= 65535 && len + n <= cap, "cached attention: head size ", d.D,
           " (at most 256), ", d.H, " heads, ", n, " new tokens after ", len, " in a cache of ", cap,
           " are beyond the CUDA kernel");
  const int H = static_cast<int>(d.H), K = static_cast<int>(d.K), D = static_cast<int>(d.D);
  const int64_t total = n * d.K * d.D;
  k_append<<<static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 4096)), 256, 0, stream>>>(qkv, kc, vc, n, H,
                                                                                                    K, D, len, cap);
  ZR_CUDA(cudaGetLastError());
  const int64_t stride = len + n;  // the most keys a query sees
  DevBuf<float> scratch(static_cast<size_t>(n * d.H * stride), false);
  k_attend<<<dim3(static_cast<unsigned>(H), static_cast<unsigned>(n)), kThreads, 0, stream>>>(
      qkv, kc, vc, out, scratch.p, H, K, D, len, cap, stride, d.scale, d.softcap, d.window);
  ZR_CUDA(cudaGetLastError());
}
}  // namespace zerorun::kernels::cached
