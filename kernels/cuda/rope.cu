// Rotary position embeddings on the GPU: a [T, D/2] cos/sin table per call
// (double-precision cos/sin of cpu::rope_angle, so the CPU op's bits), then
// one thread per feature pair of the output (forward) or of the input (backward:
// a key/value head sums its H / K copies in head order, no atomics); each side
// f32 or 16-bit storage (bf16/fp16 runs), computed in f32.
#include <algorithm>

#include "cuda_check.h"
#include "device_util.h"
#include "kernels/cpu/cpu_kernels.h"
#include "rope.h"

namespace zerorun::kernels::rope {
namespace {
constexpr int kTpb = 256;
unsigned blocks(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + kTpb - 1) / kTpb, 65535 * 8)); }

__global__ void k_table(float2* cs, int64_t T, int64_t D, float theta) {
  const int64_t half = D / 2;
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < T * half; k += (int64_t)gridDim.x * blockDim.x) {
    double s, c;
    sincos(cpu::rope_angle(k / half, k % half, D, theta), &s, &c);
    cs[k] = make_float2(static_cast<float>(c), static_cast<float>(s));
  }
}

__device__ inline float ld(In a, bool bf, int64_t i) { return a.f ? a.f[i] : from16(bf, a.h[i]); }
__device__ inline void st(Out a, bool bf, int64_t i, float v, bool acc) {
  if (a.f)
    a.f[i] = (acc ? a.f[i] : 0.f) + v;
  else
    a.h[i] = to16_bits(bf, v);
}

__global__ void k_forward(In qkv, Out out, bool bf, const float2* cs, int64_t rows, int64_t T, int64_t H, int64_t K,
                          int64_t D) {
  const int64_t half = D / 2, rep = H / K, n = rows * 3 * H * half;
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = k % half, j = (k / half) % (3 * H), r = k / (half * 3 * H);
    const int64_t x = r * (H + 2 * K) * D, y = r * 3 * H * D + j * D;
    if (j >= 2 * H) {  // v: copied
      const int64_t src = x + (H + K + (j - 2 * H) / rep) * D;
      st(out, bf, y + i, ld(qkv, bf, src + i), false);
      st(out, bf, y + i + half, ld(qkv, bf, src + i + half), false);
      continue;
    }
    const int64_t src = j < H ? x + j * D : x + (H + (j - H) / rep) * D;
    const float2 t = cs[(r % T) * half + i];
    const float a = ld(qkv, bf, src + i), b = ld(qkv, bf, src + i + half);
    st(out, bf, y + i, a * t.x - b * t.y, false);
    st(out, bf, y + i + half, b * t.x + a * t.y, false);
  }
}

__global__ void k_backward(In dout, Out dqkv, bool acc, bool bf, const float2* cs, int64_t rows, int64_t T, int64_t H,
                           int64_t K, int64_t D) {
  const int64_t half = D / 2, rep = H / K, W = H + 2 * K, n = rows * W * half;
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = k % half, j = (k / half) % W, r = k / (half * W);
    const int64_t g = r * 3 * H * D, dst = r * W * D + j * D;
    float da = 0.f, db = 0.f;
    if (j >= H + K) {  // v head: the sum of its copies
      for (int64_t c = (j - H - K) * rep; c < (j - H - K + 1) * rep; ++c) {
        da += ld(dout, bf, g + (2 * H + c) * D + i);
        db += ld(dout, bf, g + (2 * H + c) * D + i + half);
      }
    } else {
      const float2 t = cs[(r % T) * half + i];
      const int64_t first = j < H ? j : H + (j - H) * rep, cnt = j < H ? 1 : rep;
      for (int64_t c = first; c < first + cnt; ++c) {
        const float ga = ld(dout, bf, g + c * D + i), gb = ld(dout, bf, g + c * D + i + half);
        da += ga * t.x + gb * t.y;
        db += gb * t.x - ga * t.y;
      }
    }
    st(dqkv, bf, dst + i, da, acc);
    st(dqkv, bf, dst + i + half, db, acc);
  }
}

// The [T, D/2] cos/sin table in scratch, freed when the call's work is queued (stream-ordered).
DevBuf<float2> table(int64_t T, int64_t D, float theta, cudaStream_t s) {
  DevBuf<float2> t(static_cast<size_t>(T * (D / 2)), false);
  k_table<<<blocks(T * (D / 2)), kTpb, 0, s>>>(t.p, T, D, theta);
  ZR_CUDA(cudaGetLastError());
  return t;
}
}  // namespace

void forward(In qkv, Out out, bool bf, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D, float theta,
             cudaStream_t stream) {
  if (B * T == 0) return;
  const DevBuf<float2> t = table(T, D, theta, stream);
  k_forward<<<blocks(B * T * 3 * H * (D / 2)), kTpb, 0, stream>>>(qkv, out, bf, t.p, B * T, T, H, K, D);
  ZR_CUDA(cudaGetLastError());
}

void backward(In dout, Out dqkv, bool acc, bool bf, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D, float theta,
              cudaStream_t stream) {
  if (B * T == 0) return;
  const DevBuf<float2> t = table(T, D, theta, stream);
  k_backward<<<blocks(B * T * (H + 2 * K) * (D / 2)), kTpb, 0, stream>>>(dout, dqkv, acc && dqkv.f, bf, t.p, B * T, T,
                                                                         H, K, D);
  ZR_CUDA(cudaGetLastError());
}
}  // namespace zerorun::kernels::rope
