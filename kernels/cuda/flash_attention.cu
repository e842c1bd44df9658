// Causal attention without the T x T matrix (flash-attention style, fp32):
// forward keeps a running max / sum per query row (online softmax) over key
// tiles staged in shared memory and saves only the log-sum-exp per row;
// backward recomputes the probabilities tile by tile: one pass per key row
// for dK/dV, one per query row for dQ (no atomics). Memory is O(B*H*T).
#include <cfloat>

#include "cuda_check.h"
#include "flash_attention.h"

namespace zerorun::kernels::flash {
namespace {

constexpr int kTile = 32;  // keys (or queries) per shared-memory tile = threads per block

// Stages keys/values s0 .. s0+kTile-1 of head h into shared memory (zeros past T
// and in columns hs..HS-1, which the unrolled loops read).
template <int HS>
__device__ void load_kv_tile(float (*Ks)[HS], float (*Vs)[HS], const float* base, int s0, int T, int C, int h, int hs) {
  const int C3 = 3 * C;
  __syncthreads();
  for (int idx = threadIdx.x; idx < kTile * HS; idx += blockDim.x) {
    int r = idx / HS, i = idx % HS, s = s0 + r;
    bool in = s < T && i < hs;
    Ks[r][i] = in ? base[(size_t)s * C3 + C + h * hs + i] : 0.f;
    Vs[r][i] = in ? base[(size_t)s * C3 + 2 * C + h * hs + i] : 0.f;
  }
  __syncthreads();
}

// Forward: block (q-tile, h, b), one thread per query row.
template <int HS>
__global__ void k_fwd(const float* qkv, float* out, float* lse, int T, int C, int H, int hs, float scale) {
  const int b = blockIdx.z, h = blockIdx.y, t = blockIdx.x * kTile + threadIdx.x;
  const int C3 = 3 * C;
  __shared__ float Ks[kTile][HS], Vs[kTile][HS];
  float q[HS], o[HS];
  const bool active = t < T;
  const float* base = qkv + (size_t)b * T * C3;
#pragma unroll
  for (int i = 0; i < HS; ++i) {
    q[i] = (active && i < hs) ? base[(size_t)t * C3 + h * hs + i] * scale : 0.f;
    o[i] = 0.f;
  }
  float m = -FLT_MAX, l = 0.f;
  const int last = min(T - 1, (int)(blockIdx.x * kTile + kTile - 1));  // causal: keys up to the tile's last query
  for (int s0 = 0; s0 <= last; s0 += kTile) {
    load_kv_tile<HS>(Ks, Vs, base, s0, T, C, h, hs);
    if (!active) continue;
    const int smax = min(kTile, t - s0 + 1);
    for (int r = 0; r < smax; ++r) {
      float sc = 0.f;
#pragma unroll
      for (int i = 0; i < HS; ++i) sc += q[i] * Ks[r][i];
      float mn = fmaxf(m, sc), corr = __expf(m - mn), p = __expf(sc - mn);
      l = l * corr + p;
#pragma unroll
      for (int i = 0; i < HS; ++i) o[i] = o[i] * corr + p * Vs[r][i];
      m = mn;
    }
  }
  if (!active) return;
  const float inv = 1.f / l;
  float* orow = out + ((size_t)b * T + t) * C + h * hs;
#pragma unroll
  for (int i = 0; i < HS; ++i)
    if (i < hs) orow[i] = o[i] * inv;
  lse[((size_t)b * H + h) * T + t] = m + logf(l);
}

// D[t] = sum_i dO[t,i] * O[t,i] per (b, h, t): one warp per (b, t, h), heads fastest, so
// consecutive warps read consecutive memory and each warp's loads are coalesced.
__global__ void k_delta(const float* out, const float* dout, float* delta, int B, int T, int C, int H, int hs) {
  const int64_t n = (int64_t)B * H * T, warps = (int64_t)gridDim.x * blockDim.x / 32;
  const int lane = threadIdx.x & 31;
  for (int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; w < n; w += warps) {
    const int h = w % H;
    const int64_t bt = w / H;  // b * T + t
    const float* o = out + bt * C + h * hs;
    const float* d = dout + bt * C + h * hs;
    float s = 0.f;
    for (int i = lane; i < hs; i += 32) s += o[i] * d[i];
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) delta[(bt / T * H + h) * T + bt % T] = s;
  }
}

// dK, dV: block (k-tile, h, b), one thread per key row s; loop over queries t >= s.
template <int HS>
__global__ void k_bwd_kv(const float* qkv, const float* dout, const float* lse, const float* delta, float* dqkv, int T,
                         int C, int H, int hs, float scale) {
  const int b = blockIdx.z, h = blockIdx.y, s = blockIdx.x * kTile + threadIdx.x;
  const int C3 = 3 * C;
  __shared__ float Qs[kTile][HS], dOs[kTile][HS], Ls[kTile], Ds[kTile];
  float k[HS], v[HS], dk[HS], dv[HS];
  const bool active = s < T;
  const float* base = qkv + (size_t)b * T * C3;
#pragma unroll
  for (int i = 0; i < HS; ++i) {
    k[i] = (active && i < hs) ? base[(size_t)s * C3 + C + h * hs + i] : 0.f;
    v[i] = (active && i < hs) ? base[(size_t)s * C3 + 2 * C + h * hs + i] : 0.f;
    dk[i] = dv[i] = 0.f;
  }
  const float* L = lse + ((size_t)b * H + h) * T;
  const float* Dl = delta + ((size_t)b * H + h) * T;
  for (int t0 = blockIdx.x * kTile; t0 < T; t0 += kTile) {
    __syncthreads();
    for (int idx = threadIdx.x; idx < kTile * HS; idx += blockDim.x) {
      int r = idx / HS, i = idx % HS, t = t0 + r;
      bool in = t < T && i < hs;
      Qs[r][i] = in ? base[(size_t)t * C3 + h * hs + i] * scale : 0.f;
      dOs[r][i] = in ? dout[((size_t)b * T + t) * C + h * hs + i] : 0.f;
    }
    if (threadIdx.x < kTile) {
      int t = t0 + threadIdx.x;
      Ls[threadIdx.x] = t < T ? L[t] : 0.f;
      Ds[threadIdx.x] = t < T ? Dl[t] : 0.f;
    }
    __syncthreads();
    if (!active) continue;
    for (int r = 0; r < kTile; ++r) {
      int t = t0 + r;
      if (t < s || t >= T) continue;
      float sc = 0.f, dp = 0.f;
#pragma unroll
      for (int i = 0; i < HS; ++i) {
        sc += Qs[r][i] * k[i];
        dp += dOs[r][i] * v[i];
      }
      float p = __expf(sc - Ls[r]);
      float ds = p * (dp - Ds[r]);
#pragma unroll
      for (int i = 0; i < HS; ++i) {
        dv[i] += p * dOs[r][i];
        dk[i] += ds * Qs[r][i];  // Qs already carries the scale
      }
    }
  }
  if (!active) return;
  float* drow = dqkv + ((size_t)b * T + s) * C3;
#pragma unroll
  for (int i = 0; i < HS; ++i)
    if (i < hs) {
      drow[C + h * hs + i] += dk[i];
      drow[2 * C + h * hs + i] += dv[i];
    }
}

// dQ: block (q-tile, h, b), one thread per query row t; loop over keys s <= t.
template <int HS>
__global__ void k_bwd_q(const float* qkv, const float* dout, const float* lse, const float* delta, float* dqkv, int T,
                        int C, int H, int hs, float scale) {
  const int b = blockIdx.z, h = blockIdx.y, t = blockIdx.x * kTile + threadIdx.x;
  const int C3 = 3 * C;
  __shared__ float Ks[kTile][HS], Vs[kTile][HS];
  float q[HS], d[HS], dq[HS];
  const bool active = t < T;
  const float* base = qkv + (size_t)b * T * C3;
#pragma unroll
  for (int i = 0; i < HS; ++i) {
    q[i] = (active && i < hs) ? base[(size_t)t * C3 + h * hs + i] * scale : 0.f;
    d[i] = (active && i < hs) ? dout[((size_t)b * T + t) * C + h * hs + i] : 0.f;
    dq[i] = 0.f;
  }
  const float Lt = active ? lse[((size_t)b * H + h) * T + t] : 0.f;
  const float Dt = active ? delta[((size_t)b * H + h) * T + t] : 0.f;
  const int last = min(T - 1, (int)(blockIdx.x * kTile + kTile - 1));
  for (int s0 = 0; s0 <= last; s0 += kTile) {
    load_kv_tile<HS>(Ks, Vs, base, s0, T, C, h, hs);
    if (!active) continue;
    const int smax = min(kTile, t - s0 + 1);
    for (int r = 0; r < smax; ++r) {
      float sc = 0.f, dp = 0.f;
#pragma unroll
      for (int i = 0; i < HS; ++i) {
        sc += q[i] * Ks[r][i];
        dp += d[i] * Vs[r][i];
      }
      float ds = __expf(sc - Lt) * (dp - Dt);
#pragma unroll
      for (int i = 0; i < HS; ++i) dq[i] += ds * Ks[r][i];
    }
  }
  if (!active) return;
  float* drow = dqkv + ((size_t)b * T + t) * C3 + h * hs;
#pragma unroll
  for (int i = 0; i < HS; ++i)
    if (i < hs) drow[i] += dq[i] * scale;
}

template <int HS>
void fwd_t(const float* qkv, float* out, float* lse, int B, int T, int C, int H) {
  int hs = C / H;
  dim3 grid((T + kTile - 1) / kTile, H, B);
  k_fwd<HS><<<grid, kTile, 0, cuda::stream()>>>(qkv, out, lse, T, C, H, hs, 1.f / sqrtf((float)hs));
  ZR_CUDA(cudaGetLastError());
}
// delta[b, h, t] = sum_i dout[b, t, h*hs + i] * out[b, t, h*hs + i] (the backward's row term).
void row_delta(const float* out, const float* dout, float* delta, int64_t B, int64_t T, int64_t C, int64_t H) {
  const int64_t n = B * H * T;
  if (n == 0) return;
  k_delta<<<(unsigned)std::min<int64_t>((n + 7) / 8, 1 << 16), 256, 0, cuda::stream()>>>(
      out, dout, delta, (int)B, (int)T, (int)C, (int)H, (int)(C / H));
  ZR_CUDA(cudaGetLastError());
}

template <int HS>
void bwd_t(const float* qkv, const float* out, const float* lse, const float* dout, float* dqkv, float* delta, int B,
           int T, int C, int H) {
  int hs = C / H;
  float scale = 1.f / sqrtf((float)hs);
  row_delta(out, dout, delta, B, T, C, H);
  dim3 grid((T + kTile - 1) / kTile, H, B);
  k_bwd_kv<HS><<<grid, kTile, 0, cuda::stream()>>>(qkv, dout, lse, delta, dqkv, T, C, H, hs, scale);
  k_bwd_q<HS><<<grid, kTile, 0, cuda::stream()>>>(qkv, dout, lse, delta, dqkv, T, C, H, hs, scale);
  ZR_CUDA(cudaGetLastError());
}

}  // namespace

bool supported(int64_t head_size) { return head_size <= 128; }

void forward(const float* qkv, float* out, float* lse, int64_t B, int64_t T, int64_t C, int64_t H) {
  int64_t hs = C / H;
  ZR_CHECK(supported(hs), "CUDA attention supports head sizes up to 128, got ", hs);
  if (hs <= 32)
    fwd_t<32>(qkv, out, lse, (int)B, (int)T, (int)C, (int)H);
  else if (hs <= 64)
    fwd_t<64>(qkv, out, lse, (int)B, (int)T, (int)C, (int)H);
  else
    fwd_t<128>(qkv, out, lse, (int)B, (int)T, (int)C, (int)H);
}

void backward(const float* qkv, const float* out, const float* lse, const float* dout, float* dqkv, float* delta,
              int64_t B, int64_t T, int64_t C, int64_t H) {
  int64_t hs = C / H;
  ZR_CHECK(supported(hs), "CUDA attention supports head sizes up to 128, got ", hs);
  if (hs <= 32)
    bwd_t<32>(qkv, out, lse, dout, dqkv, delta, (int)B, (int)T, (int)C, (int)H);
  else if (hs <= 64)
    bwd_t<64>(qkv, out, lse, dout, dqkv, delta, (int)B, (int)T, (int)C, (int)H);
  else
    bwd_t<128>(qkv, out, lse, dout, dqkv, delta, (int)B, (int)T, (int)C, (int)H);
}

}  // namespace zerorun::kernels::flash
