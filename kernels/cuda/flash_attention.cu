// Causal attention without the T x T matrix (flash-attention style, fp32):
// forward keeps a running max / sum per query row (online softmax) over key
// tiles staged in shared memory and saves only the log-sum-exp per row;
// backward recomputes the probabilities tile by tile: one pass per key row
// for dK/dV (over every query head of its key/value head), one per query row
// for dQ (no atomics). Memory is O(B*H*T). Grouped-query key/value heads are
// read in place; the scale, sliding window, soft-capping and per-document
// masking (pos) follow cpu::AttnDims, and tiles wholly outside every row's
// window or document are skipped.
#include <cfloat>
#include <climits>

#include "cuda_check.h"
#include "flash_attention.h"

namespace zerorun::kernels::flash {
namespace {

// The sizes as the kernels take them.
struct Dims {
  int T, H, K, D, W, O, rep;  // W: a qkv row, O: an output row
  float scale, softcap;
  int window;
  const int32_t* pos;  // [B, T] positions in the documents, or null
};
Dims dims(const AttnDims& d) {
  return {(int)d.T,     (int)d.H, (int)d.K,  (int)d.D,      (int)d.width(), (int)d.out_width(),
          (int)d.rep(), d.scale,  d.softcap, (int)d.window, d.pos};
}
// The first key query t of batch row b sees (window and document).
__device__ inline int first_key(const Dims& p, int b, int t) {
  int f = p.window > 0 ? max(0, t - p.window + 1) : 0;
  if (p.pos) f = max(f, t - p.pos[(size_t)b * p.T + t]);
  return f;
}
// The first key any of the block's query rows q0 + threadIdx.x (< T) sees: the block's minimum of `f` (INT_MAX for
// a thread without a row).
__device__ inline int block_min(int f) {
  __shared__ int m;
  if (threadIdx.x == 0) m = INT_MAX;
  __syncthreads();
  atomicMin(&m, f);
  __syncthreads();
  const int r = m;
  __syncthreads();  // (m is reused by the next call)
  return r;
}
// The score from the scaled q.k: soft-capped where asked; *dcap = its derivative.
__device__ inline float capped(const Dims& p, float x, float* dcap) {
  if (p.softcap <= 0.f) {
    *dcap = 1.f;
    return x;
  }
  const float th = tanhf(x / p.softcap);
  *dcap = 1.f - th * th;
  return p.softcap * th;
}

// Tile rows: 32 (16 at head size 256, to stay within 48 KB of static shared memory) = threads per block.
template <int HS>
constexpr int kTileOf = HS > 128 ? 16 : 32;

// Stages keys/values s0 .. s0+TILE-1 of key/value head g into shared memory (zeros past T
// and in columns D..HS-1, which the unrolled loops read).
template <int HS>
__device__ void load_kv_tile(float (*Ks)[HS], float (*Vs)[HS], const float* base, int s0, const Dims& p, int g) {
  constexpr int TILE = kTileOf<HS>;
  __syncthreads();
  for (int idx = threadIdx.x; idx < TILE * HS; idx += blockDim.x) {
    int r = idx / HS, i = idx % HS, s = s0 + r;
    bool in = s < p.T && i < p.D;
    Ks[r][i] = in ? base[(size_t)s * p.W + (p.H + g) * p.D + i] : 0.f;
    Vs[r][i] = in ? base[(size_t)s * p.W + (p.H + p.K + g) * p.D + i] : 0.f;
  }
  __syncthreads();
}

// Forward: block (q-tile, h, b), one thread per query row.
template <int HS>
__global__ void k_fwd(const float* qkv, float* out, float* lse, Dims p) {
  constexpr int TILE = kTileOf<HS>;
  const int b = blockIdx.z, h = blockIdx.y, g = h / p.rep, q0 = blockIdx.x * TILE, t = q0 + threadIdx.x;
  __shared__ float Ks[TILE][HS], Vs[TILE][HS];
  float q[HS], o[HS];
  const bool active = t < p.T;
  const float* base = qkv + (size_t)b * p.T * p.W;
#pragma unroll
  for (int i = 0; i < HS; ++i) {
    q[i] = (active && i < p.D) ? base[(size_t)t * p.W + h * p.D + i] * p.scale : 0.f;
    o[i] = 0.f;
  }
  float m = -FLT_MAX, l = 0.f;
  const int last = min(p.T - 1, q0 + TILE - 1);  // causal: keys up to the tile's last query
  const int f = active ? first_key(p, b, t) : INT_MAX;
  for (int s0 = block_min(f); s0 <= last; s0 += TILE) {
    load_kv_tile<HS>(Ks, Vs, base, s0, p, g);
    if (!active) continue;
    const int smax = min(TILE, t - s0 + 1);
    for (int r = max(0, f - s0); r < smax; ++r) {
      float sc = 0.f, dc;
#pragma unroll
      for (int i = 0; i < HS; ++i) sc += q[i] * Ks[r][i];
      sc = capped(p, sc, &dc);
      float mn = fmaxf(m, sc), corr = __expf(m - mn), pr = __expf(sc - mn);
      l = l * corr + pr;
#pragma unroll
      for (int i = 0; i < HS; ++i) o[i] = o[i] * corr + pr * Vs[r][i];
      m = mn;
    }
  }
  if (!active) return;
  const float inv = 1.f / l;
  float* orow = out + ((size_t)b * p.T + t) * p.O + h * p.D;
#pragma unroll
  for (int i = 0; i < HS; ++i)
    if (i < p.D) orow[i] = o[i] * inv;
  lse[((size_t)b * p.H + h) * p.T + t] = m + logf(l);
}

// D[t] = sum_i dO[t,i] * O[t,i] per (b, h, t): one warp per (b, t, h), heads fastest, so
// consecutive warps read consecutive memory and each warp's loads are coalesced.
__global__ void k_delta(const float* out, const float* dout, float* delta, int B, int T, int H, int D) {
  const int64_t n = (int64_t)B * H * T, warps = (int64_t)gridDim.x * blockDim.x / 32;
  const int lane = threadIdx.x & 31;
  for (int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; w < n; w += warps) {
    const int h = w % H;
    const int64_t bt = w / H;  // b * T + t
    const float* o = out + bt * H * D + h * D;
    const float* d = dout + bt * H * D + h * D;
    float s = 0.f;
    for (int i = lane; i < D; i += 32) s += o[i] * d[i];
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) delta[(bt / T * H + h) * T + bt % T] = s;
  }
}

// dK, dV: block (k-tile, g, b), one thread per key row s; loop over the query heads of key/value head g and their
// queries t >= s (within the window).
template <int HS>
__global__ void k_bwd_kv(const float* qkv, const float* dout, const float* lse, const float* delta, float* dqkv,
                         Dims p) {
  constexpr int TILE = kTileOf<HS>;
  const int b = blockIdx.z, g = blockIdx.y, k0 = blockIdx.x * TILE, s = k0 + threadIdx.x;
  __shared__ float Qs[TILE][HS], dOs[TILE][HS], Ls[TILE], Ds[TILE];
  __shared__ int Fs[TILE];  // the first key each query of the tile sees
  float k[HS], v[HS], dk[HS], dv[HS];
  const bool active = s < p.T;
  const float* base = qkv + (size_t)b * p.T * p.W;
#pragma unroll
  for (int i = 0; i < HS; ++i) {
    k[i] = (active && i < p.D) ? base[(size_t)s * p.W + (p.H + g) * p.D + i] : 0.f;
    v[i] = (active && i < p.D) ? base[(size_t)s * p.W + (p.H + p.K + g) * p.D + i] : 0.f;
    dk[i] = dv[i] = 0.f;
  }
  // Queries past the tile's last key + window - 1 see none of its keys.
  const int tend = p.window > 0 ? min(p.T, k0 + TILE - 1 + p.window) : p.T;
  for (int h = g * p.rep; h < (g + 1) * p.rep; ++h) {
    const float* L = lse + ((size_t)b * p.H + h) * p.T;
    const float* Dl = delta + ((size_t)b * p.H + h) * p.T;
    for (int t0 = k0; t0 < tend; t0 += TILE) {
      __syncthreads();
      for (int idx = threadIdx.x; idx < TILE * HS; idx += blockDim.x) {
        int r = idx / HS, i = idx % HS, t = t0 + r;
        bool in = t < p.T && i < p.D;
        Qs[r][i] = in ? base[(size_t)t * p.W + h * p.D + i] * p.scale : 0.f;
        dOs[r][i] = in ? dout[((size_t)b * p.T + t) * p.O + h * p.D + i] : 0.f;
      }
      if (threadIdx.x < TILE) {
        int t = t0 + threadIdx.x;
        Ls[threadIdx.x] = t < p.T ? L[t] : 0.f;
        Ds[threadIdx.x] = t < p.T ? Dl[t] : 0.f;
        Fs[threadIdx.x] = t < p.T ? first_key(p, b, t) : INT_MAX;
      }
      __syncthreads();
      if (!active) continue;
      for (int r = 0; r < TILE; ++r) {
        int t = t0 + r;
        if (t >= p.T || s > t || s < Fs[r]) continue;
        float sc = 0.f, dp = 0.f, dc;
#pragma unroll
        for (int i = 0; i < HS; ++i) {
          sc += Qs[r][i] * k[i];
          dp += dOs[r][i] * v[i];
        }
        sc = capped(p, sc, &dc);
        float pr = __expf(sc - Ls[r]);
        float ds = pr * (dp - Ds[r]) * dc;
#pragma unroll
        for (int i = 0; i < HS; ++i) {
          dv[i] += pr * dOs[r][i];
          dk[i] += ds * Qs[r][i];  // Qs already carries the scale
        }
      }
    }
  }
  if (!active) return;
  float* drow = dqkv + ((size_t)b * p.T + s) * p.W;
#pragma unroll
  for (int i = 0; i < HS; ++i)
    if (i < p.D) {
      drow[(p.H + g) * p.D + i] += dk[i];
      drow[(p.H + p.K + g) * p.D + i] += dv[i];
    }
}

// dQ: block (q-tile, h, b), one thread per query row t; loop over the keys it sees.
template <int HS>
__global__ void k_bwd_q(const float* qkv, const float* dout, const float* lse, const float* delta, float* dqkv,
                        Dims p) {
  constexpr int TILE = kTileOf<HS>;
  const int b = blockIdx.z, h = blockIdx.y, g = h / p.rep, q0 = blockIdx.x * TILE, t = q0 + threadIdx.x;
  __shared__ float Ks[TILE][HS], Vs[TILE][HS];
  float q[HS], d[HS], dq[HS];
  const bool active = t < p.T;
  const float* base = qkv + (size_t)b * p.T * p.W;
#pragma unroll
  for (int i = 0; i < HS; ++i) {
    q[i] = (active && i < p.D) ? base[(size_t)t * p.W + h * p.D + i] * p.scale : 0.f;
    d[i] = (active && i < p.D) ? dout[((size_t)b * p.T + t) * p.O + h * p.D + i] : 0.f;
    dq[i] = 0.f;
  }
  const float Lt = active ? lse[((size_t)b * p.H + h) * p.T + t] : 0.f;
  const float Dt = active ? delta[((size_t)b * p.H + h) * p.T + t] : 0.f;
  const int last = min(p.T - 1, q0 + TILE - 1);
  const int f = active ? first_key(p, b, t) : INT_MAX;
  for (int s0 = block_min(f); s0 <= last; s0 += TILE) {
    load_kv_tile<HS>(Ks, Vs, base, s0, p, g);
    if (!active) continue;
    const int smax = min(TILE, t - s0 + 1);
    for (int r = max(0, f - s0); r < smax; ++r) {
      float sc = 0.f, dp = 0.f, dc;
#pragma unroll
      for (int i = 0; i < HS; ++i) {
        sc += q[i] * Ks[r][i];
        dp += d[i] * Vs[r][i];
      }
      sc = capped(p, sc, &dc);
      float ds = __expf(sc - Lt) * (dp - Dt) * dc;
#pragma unroll
      for (int i = 0; i < HS; ++i) dq[i] += ds * Ks[r][i];
    }
  }
  if (!active) return;
  float* drow = dqkv + ((size_t)b * p.T + t) * p.W + h * p.D;
#pragma unroll
  for (int i = 0; i < HS; ++i)
    if (i < p.D) drow[i] += dq[i] * p.scale;
}

template <int HS>
void fwd_t(const float* qkv, float* out, float* lse, int B, const Dims& p) {
  constexpr int TILE = kTileOf<HS>;
  dim3 grid((p.T + TILE - 1) / TILE, p.H, B);
  k_fwd<HS><<<grid, TILE, 0, cuda::stream()>>>(qkv, out, lse, p);
  ZR_CUDA(cudaGetLastError());
}
// delta[b, h, t] = sum_i dout[b, t, h*D + i] * out[b, t, h*D + i] (the backward's row term).
void row_delta(const float* out, const float* dout, float* delta, int B, const Dims& p) {
  const int64_t n = (int64_t)B * p.H * p.T;
  if (n == 0) return;
  k_delta<<<(unsigned)std::min<int64_t>((n + 7) / 8, 1 << 16), 256, 0, cuda::stream()>>>(out, dout, delta, B, p.T, p.H,
                                                                                         p.D);
  ZR_CUDA(cudaGetLastError());
}

template <int HS>
void bwd_t(const float* qkv, const float* out, const float* lse, const float* dout, float* dqkv, float* delta, int B,
           const Dims& p) {
  constexpr int TILE = kTileOf<HS>;
  row_delta(out, dout, delta, B, p);
  k_bwd_kv<HS><<<dim3((p.T + TILE - 1) / TILE, p.K, B), TILE, 0, cuda::stream()>>>(qkv, dout, lse, delta, dqkv, p);
  k_bwd_q<HS><<<dim3((p.T + TILE - 1) / TILE, p.H, B), TILE, 0, cuda::stream()>>>(qkv, dout, lse, delta, dqkv, p);
  ZR_CUDA(cudaGetLastError());
}

}  // namespace

bool supported(const AttnDims& d) { return d.D <= 256; }

void forward(const float* qkv, float* out, float* lse, const AttnDims& d) {
  ZR_CHECK(supported(d), "CUDA flash attention supports head sizes up to 256, got ", d.D);
  if (d.B * d.T == 0) return;
  const Dims p = dims(d);
  if (d.D <= 32)
    fwd_t<32>(qkv, out, lse, (int)d.B, p);
  else if (d.D <= 64)
    fwd_t<64>(qkv, out, lse, (int)d.B, p);
  else if (d.D <= 128)
    fwd_t<128>(qkv, out, lse, (int)d.B, p);
  else
    fwd_t<256>(qkv, out, lse, (int)d.B, p);
}

void backward(const float* qkv, const float* out, const float* lse, const float* dout, float* dqkv, float* delta,
              const AttnDims& d) {
  ZR_CHECK(supported(d), "CUDA flash attention supports head sizes up to 256, got ", d.D);
  if (d.B * d.T == 0) return;
  const Dims p = dims(d);
  if (d.D <= 32)
    bwd_t<32>(qkv, out, lse, dout, dqkv, delta, (int)d.B, p);
  else if (d.D <= 64)
    bwd_t<64>(qkv, out, lse, dout, dqkv, delta, (int)d.B, p);
  else if (d.D <= 128)
    bwd_t<128>(qkv, out, lse, dout, dqkv, delta, (int)d.B, p);
  else
    bwd_t<256>(qkv, out, lse, dout, dqkv, delta, (int)d.B, p);
}

}  // namespace zerorun::kernels::flash
