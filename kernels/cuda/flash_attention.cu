// Causal attention without the T x T matrix (flash-attention style, fp32):
// forward keeps a running max / sum per query row (online softmax) over key
// tiles staged in shared memory and saves only the log-sum-exp per row;
// backward recomputes the probabilities tile by tile: one pass per key row
// for dK/dV, one per query row for dQ (no atomics). Memory is O(B*H*T).
// Each thread owns one row and scores a whole 32-row tile at once (32
// independent FMA chains, float4 shared-memory reads) so the loops are
// throughput-bound rather than latency-bound.
#include <cfloat>

#include "cuda_check.h"
#include "flash_attention.h"

namespace zerorun::kernels::flash {
namespace {

constexpr int kTile = 32;  // rows per shared-memory tile = threads per block
constexpr int kPad = 4;    // row padding: a thread reading its own row hits its own banks
constexpr int kSub = 8;    // backward: rows scored together (bounded by registers)

template <int HS>
using Tile = float[kTile][HS + kPad];

// tile[r][i] = mul * src[(s0 + r) * ld + col + i] for i < hs and s0 + r < T, else 0.
template <int HS>
__device__ void load_tile(Tile<HS>& tile, const float* src, int64_t ld, int col, int s0, int T, int hs, float mul) {
  for (int idx = threadIdx.x; idx < kTile * HS; idx += blockDim.x) {
    int r = idx / HS, i = idx % HS, s = s0 + r;
    tile[r][i] = (s < T && i < hs) ? src[(size_t)s * ld + col + i] * mul : 0.f;
  }
}

__device__ inline float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ inline float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

// Backward scores of kSub tile rows from rc: sc[r] = x . A[rc + r] and
// dp[r] = y . B[rc + r], where x and y are this thread's own rows.
template <int HS>
__device__ __forceinline__ void score_pairs(const float* x, const float* y, const Tile<HS>& A, const Tile<HS>& B,
                                            int rc, float (&sc)[kSub], float (&dp)[kSub]) {
#pragma unroll
  for (int r = 0; r < kSub; ++r) sc[r] = dp[r] = 0.f;
#pragma unroll 2
  for (int i = 0; i < HS; i += 4) {
    const float4 xx = ld4(x + i), yy = ld4(y + i);
#pragma unroll
    for (int r = 0; r < kSub; ++r) {
      sc[r] += dot4(xx, ld4(&A[rc + r][i]));
      dp[r] += dot4(yy, ld4(&B[rc + r][i]));
    }
  }
}

// Forward: block (q-tile, h, b), one thread per query row.
template <int HS>
__global__ void __launch_bounds__(kTile)
    k_fwd(const float* qkv, float* out, float* lse, int T, int C, int H, int hs, float scale) {
  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kTile, t = q0 + threadIdx.x;
  const int C3 = 3 * C;
  __shared__ __align__(16) Tile<HS> Ks, Vs;
  const float* base = qkv + (size_t)b * T * C3;
  const bool active = t < T;
  float q[HS], o[HS];
#pragma unroll
  for (int i = 0; i < HS; ++i) {
    q[i] = (active && i < hs) ? base[(size_t)t * C3 + h * hs + i] * scale : 0.f;
    o[i] = 0.f;
  }
  float m = -FLT_MAX, l = 0.f;
  const int last = min(T - 1, q0 + kTile - 1);  // causal: keys up to the tile's last query
  for (int s0 = 0; s0 <= last; s0 += kTile) {
    __syncthreads();
    load_tile<HS>(Ks, base, C3, C + h * hs, s0, T, hs, 1.f);
    load_tile<HS>(Vs, base, C3, 2 * C + h * hs, s0, T, hs, 1.f);
    __syncthreads();
    float sc[kTile];
#pragma unroll
    for (int r = 0; r < kTile; ++r) sc[r] = 0.f;
#pragma unroll
    for (int i = 0; i < HS; i += 4) {
      float4 q4 = make_float4(q[i], q[i + 1], q[i + 2], q[i + 3]);
#pragma unroll
      for (int r = 0; r < kTile; ++r) sc[r] += dot4(q4, ld4(&Ks[r][i]));
    }
    float mx = m;
#pragma unroll
    for (int r = 0; r < kTile; ++r)
      if (s0 + r <= t) mx = fmaxf(mx, sc[r]);
    const float corr = __expf(m - mx);
    float ps = 0.f;
#pragma unroll
    for (int r = 0; r < kTile; ++r) {
      sc[r] = s0 + r <= t ? __expf(sc[r] - mx) : 0.f;
      ps += sc[r];
    }
    l = l * corr + ps;
#pragma unroll
    for (int i = 0; i < HS; ++i) o[i] *= corr;
#pragma unroll
    for (int r = 0; r < kTile; ++r) {
      const float p = sc[r];
#pragma unroll
      for (int i = 0; i < HS; i += 4) {
        float4 v4 = ld4(&Vs[r][i]);
        o[i] += p * v4.x, o[i + 1] += p * v4.y, o[i + 2] += p * v4.z, o[i + 3] += p * v4.w;
      }
    }
    m = mx;
  }
  if (!active) return;
  const float inv = 1.f / l;
  float* orow = out + ((size_t)b * T + t) * C + h * hs;
#pragma unroll
  for (int i = 0; i < HS; ++i)
    if (i < hs) orow[i] = o[i] * inv;
  lse[((size_t)b * H + h) * T + t] = m + logf(l);
}

// D[t] = sum_i dO[t,i] * O[t,i] per (b, h, t).
__global__ void k_delta(const float* out, const float* dout, float* delta, int B, int T, int C, int H, int hs) {
  int64_t n = (int64_t)B * H * T;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n; idx += (int64_t)gridDim.x * blockDim.x) {
    int t = idx % T, h = (idx / T) % H, b = idx / ((int64_t)T * H);
    const float* o = out + ((size_t)b * T + t) * C + h * hs;
    const float* d = dout + ((size_t)b * T + t) * C + h * hs;
    float s = 0.f;
    for (int i = 0; i < hs; ++i) s += o[i] * d[i];
    delta[idx] = s;
  }
}

// dK, dV: block (k-tile, h, b), one thread per key row s; loop over query tiles t >= s.
template <int HS>
__global__ void __launch_bounds__(kTile)
    k_bwd_kv(const float* qkv, const float* dout, const float* lse, const float* delta, float* dqkv, int T, int C,
             int H, int hs, float scale) {
  const int b = blockIdx.z, h = blockIdx.y, k0 = blockIdx.x * kTile, s = k0 + threadIdx.x, tid = threadIdx.x;
  const int C3 = 3 * C;
  __shared__ __align__(16) Tile<HS> Kown, Vown, Qs, dOs;
  __shared__ float Ls[kTile], Ds[kTile];
  const float* base = qkv + (size_t)b * T * C3;
  const float* dob = dout + (size_t)b * T * C;
  load_tile<HS>(Kown, base, C3, C + h * hs, k0, T, hs, 1.f);
  load_tile<HS>(Vown, base, C3, 2 * C + h * hs, k0, T, hs, 1.f);
  float dk[HS], dv[HS];
#pragma unroll
  for (int i = 0; i < HS; ++i) dk[i] = dv[i] = 0.f;
  const float* L = lse + ((size_t)b * H + h) * T;
  const float* Dl = delta + ((size_t)b * H + h) * T;
  for (int t0 = k0; t0 < T; t0 += kTile) {
    __syncthreads();
    load_tile<HS>(Qs, base, C3, h * hs, t0, T, hs, scale);
    load_tile<HS>(dOs, dob, C, h * hs, t0, T, hs, 1.f);
    Ls[tid] = t0 + tid < T ? L[t0 + tid] : 0.f;
    Ds[tid] = t0 + tid < T ? Dl[t0 + tid] : 0.f;
    __syncthreads();
#pragma unroll 1
    for (int rc = 0; rc < kTile; rc += kSub) {
      float sc[kSub], dp[kSub];
      score_pairs<HS>(Kown[tid], Vown[tid], Qs, dOs, rc, sc, dp);
#pragma unroll
      for (int r = 0; r < kSub; ++r) {
        const int t = t0 + rc + r;
        const float p = (t >= s && t < T) ? __expf(sc[r] - Ls[rc + r]) : 0.f;
        sc[r] = p;
        dp[r] = p * (dp[r] - Ds[rc + r]);
      }
#pragma unroll
      for (int r = 0; r < kSub; ++r) {
        const float p = sc[r], ds = dp[r];
#pragma unroll
        for (int i = 0; i < HS; i += 4) {
          const float4 d4 = ld4(&dOs[rc + r][i]), q4 = ld4(&Qs[rc + r][i]);  // Qs already carries the scale
          dv[i] += p * d4.x, dv[i + 1] += p * d4.y, dv[i + 2] += p * d4.z, dv[i + 3] += p * d4.w;
          dk[i] += ds * q4.x, dk[i + 1] += ds * q4.y, dk[i + 2] += ds * q4.z, dk[i + 3] += ds * q4.w;
        }
      }
    }
  }
  if (s >= T) return;
  float* drow = dqkv + ((size_t)b * T + s) * C3;
#pragma unroll
  for (int i = 0; i < HS; ++i)
    if (i < hs) {
      drow[C + h * hs + i] += dk[i];
      drow[2 * C + h * hs + i] += dv[i];
    }
}

// dQ: block (q-tile, h, b), one thread per query row t; loop over key tiles s <= t.
template <int HS>
__global__ void __launch_bounds__(kTile)
    k_bwd_q(const float* qkv, const float* dout, const float* lse, const float* delta, float* dqkv, int T, int C, int H,
            int hs, float scale) {
  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kTile, t = q0 + threadIdx.x, tid = threadIdx.x;
  const int C3 = 3 * C;
  __shared__ __align__(16) Tile<HS> Qown, dOown, Ks, Vs;
  const float* base = qkv + (size_t)b * T * C3;
  load_tile<HS>(Qown, base, C3, h * hs, q0, T, hs, scale);
  load_tile<HS>(dOown, dout + (size_t)b * T * C, C, h * hs, q0, T, hs, 1.f);
  float dq[HS];
#pragma unroll
  for (int i = 0; i < HS; ++i) dq[i] = 0.f;
  const bool active = t < T;
  const float Lt = active ? lse[((size_t)b * H + h) * T + t] : 0.f;
  const float Dt = active ? delta[((size_t)b * H + h) * T + t] : 0.f;
  const int last = min(T - 1, q0 + kTile - 1);
  for (int s0 = 0; s0 <= last; s0 += kTile) {
    __syncthreads();
    load_tile<HS>(Ks, base, C3, C + h * hs, s0, T, hs, 1.f);
    load_tile<HS>(Vs, base, C3, 2 * C + h * hs, s0, T, hs, 1.f);
    __syncthreads();
#pragma unroll 1
    for (int rc = 0; rc < kTile; rc += kSub) {
      float sc[kSub], dp[kSub];
      score_pairs<HS>(Qown[tid], dOown[tid], Ks, Vs, rc, sc, dp);
#pragma unroll
      for (int r = 0; r < kSub; ++r) sc[r] = (active && s0 + rc + r <= t) ? __expf(sc[r] - Lt) * (dp[r] - Dt) : 0.f;
#pragma unroll
      for (int r = 0; r < kSub; ++r) {
        const float ds = sc[r];
#pragma unroll
        for (int i = 0; i < HS; i += 4) {
          const float4 k4 = ld4(&Ks[rc + r][i]);
          dq[i] += ds * k4.x, dq[i + 1] += ds * k4.y, dq[i + 2] += ds * k4.z, dq[i + 3] += ds * k4.w;
        }
      }
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
  k_fwd<HS><<<grid, kTile>>>(qkv, out, lse, T, C, H, hs, 1.f / sqrtf((float)hs));
  ZR_CUDA(cudaGetLastError());
}
template <int HS>
void bwd_t(const float* qkv, const float* out, const float* lse, const float* dout, float* dqkv, float* delta, int B,
           int T, int C, int H) {
  int hs = C / H;
  float scale = 1.f / sqrtf((float)hs);
  row_delta(out, dout, delta, B, T, C, H);
  dim3 grid((T + kTile - 1) / kTile, H, B);
  k_bwd_kv<HS><<<grid, kTile>>>(qkv, dout, lse, delta, dqkv, T, C, H, hs, scale);
  k_bwd_q<HS><<<grid, kTile>>>(qkv, dout, lse, delta, dqkv, T, C, H, hs, scale);
  ZR_CUDA(cudaGetLastError());
}

}  // namespace

// Head sizes up to 64 (GPT-2's); larger heads would spill the per-thread
// accumulators, so they take the materialised path.
void row_delta(const float* out, const float* dout, float* delta, int64_t B, int64_t T, int64_t C, int64_t H) {
  const int64_t n = B * H * T;
  if (n == 0) return;
  k_delta<<<(unsigned)std::min<int64_t>((n + 255) / 256, 1 << 16), 256>>>(out, dout, delta, (int)B, (int)T, (int)C,
                                                                          (int)H, (int)(C / H));
  ZR_CUDA(cudaGetLastError());
}

bool supported(int64_t head_size) { return head_size <= 64; }

void forward(const float* qkv, float* out, float* lse, int64_t B, int64_t T, int64_t C, int64_t H) {
  int64_t hs = C / H;
  ZR_CHECK(supported(hs), "flash attention supports head sizes up to 64, got ", hs);
  if (hs <= 32)
    fwd_t<32>(qkv, out, lse, (int)B, (int)T, (int)C, (int)H);
  else
    fwd_t<64>(qkv, out, lse, (int)B, (int)T, (int)C, (int)H);
}

void backward(const float* qkv, const float* out, const float* lse, const float* dout, float* dqkv, float* delta,
              int64_t B, int64_t T, int64_t C, int64_t H) {
  int64_t hs = C / H;
  ZR_CHECK(supported(hs), "flash attention supports head sizes up to 64, got ", hs);
  if (hs <= 32)
    bwd_t<32>(qkv, out, lse, dout, dqkv, delta, (int)B, (int)T, (int)C, (int)H);
  else
    bwd_t<64>(qkv, out, lse, dout, dqkv, delta, (int)B, (int)T, (int)C, (int)H);
}

}  // namespace zerorun::kernels::flash
