// Tensor-core causal flash attention for 16-bit runs (bf16 or fp16 operands,
// fp32 accumulation and softmax), head size 64, through WMMA 16x16x16 tiles.
// Same contract as the fp32 kernels in flash_attention.cu (f32 qkv / out /
// lse, gradients accumulated into dqkv), so either serves the attention op:
// a block is 4 warps x 16 rows; scores go through shared memory for the
// masked online softmax; the backward is one pass per key block (dK, dV kept
// in accumulator fragments) and one per query block (dQ), no atomics.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cfloat>

#include "cuda_check.h"
#include "flash_attention.h"

namespace zerorun::kernels::flash {
namespace {
using namespace nvcuda;

constexpr int HS = 64;           // head size
constexpr int kWarps = 4;        // warps per block, 16 rows each
constexpr int BR = 16 * kWarps;  // rows (queries or keys) a block owns
constexpr int BT = 32;           // rows of the streamed tile
constexpr int LE = HS + 8;       // leading dims (elements) of the 16-bit tiles
constexpr int LS = BT + 4;       // of the f32 score tiles
constexpr int LP = BT + 8;       // of the 16-bit probability tiles
constexpr int LO = HS + 4;       // of the f32 output staging tiles

__device__ inline void store_e(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ inline void store_e(__half* p, float v) { *p = __float2half_rn(v); }

template <typename E>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major>;
template <typename E>
using FragBc = wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::col_major>;
template <typename E>
using FragBr = wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::row_major>;
using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// dst[r][i] (leading dim LE) = mul * src[(r0 + r) * ld + i] for rows < T, else 0; `rows` rows, HS columns.
template <typename E>
__device__ void load_rows(E* dst, const float* src, int64_t ld, int r0, int rows, int T, float mul) {
  for (int idx = threadIdx.x; idx < rows * HS; idx += blockDim.x) {
    int r = idx / HS, i = idx % HS, t = r0 + r;
    store_e(dst + r * LE + i, t < T ? src[(size_t)t * ld + i] * mul : 0.f);
  }
}

// 16 x BT scores of this warp: acc = A (16 x HS, 4 fragments) times B^T where B is BT x HS row-major (ld LE).
template <typename E>
__device__ void scores(const FragA<E> (&a)[HS / 16], const E* b, float* out) {
#pragma unroll
  for (int n = 0; n < BT / 16; ++n) {
    Acc c;
    wmma::fill_fragment(c, 0.f);
#pragma unroll
    for (int k = 0; k < HS / 16; ++k) {
      FragBc<E> f;
      wmma::load_matrix_sync(f, b + n * 16 * LE + k * 16, LE);
      wmma::mma_sync(c, a[k], f, c);
    }
    wmma::store_matrix_sync(out + n * 16, c, LS, wmma::mem_row_major);
  }
}

// acc[n] += P (16 x BT, ld LP) times M (BT x HS row-major, ld LE).
template <typename E>
__device__ void times_tile(Acc (&acc)[HS / 16], const E* p, const E* m) {
#pragma unroll
  for (int k = 0; k < BT / 16; ++k) {
    FragA<E> a;
    wmma::load_matrix_sync(a, p + k * 16, LP);
#pragma unroll
    for (int n = 0; n < HS / 16; ++n) {
      FragBr<E> f;
      wmma::load_matrix_sync(f, m + k * 16 * LE + n * 16, LE);
      wmma::mma_sync(acc[n], a, f, acc[n]);
    }
  }
}

template <typename E>
__device__ void load_frags_a(FragA<E> (&f)[HS / 16], const E* rows16) {
#pragma unroll
  for (int k = 0; k < HS / 16; ++k) wmma::load_matrix_sync(f[k], rows16 + k * 16, LE);
}

// dst[row][0..HS) += mul * (the warp's 16 x HS accumulator), staged through O
// (16 x LO floats); each lane adds half a row. dst null: nothing to add.
__device__ void add_rows(Acc (&acc)[HS / 16], float* O, float* dst, int row, int half, float mul) {
  __syncwarp();
#pragma unroll
  for (int n = 0; n < HS / 16; ++n) wmma::store_matrix_sync(O + n * 16, acc[n], LO, wmma::mem_row_major);
  __syncwarp();
  if (dst)
    for (int j = 0; j < HS / 2; ++j) dst[half * (HS / 2) + j] += mul * O[row * LO + half * (HS / 2) + j];
}

// ---- forward ------------------------------------------------------------------
constexpr size_t kFwdSmem =
    sizeof(float) * (kWarps * 16 * LS + kWarps * 16 * LO) + 2 * (size_t)(BR * LE + 2 * BT * LE + kWarps * 16 * LP);

template <typename E>
__global__ void __launch_bounds__(32 * kWarps)
    k_fwd(const float* qkv, float* out, float* lse, int T, int C, int H, float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  float* Ss = reinterpret_cast<float*>(smem);           // [kWarps][16][LS]
  float* Os = Ss + kWarps * 16 * LS;                    // [kWarps][16][LO]
  E* Qs = reinterpret_cast<E*>(Os + kWarps * 16 * LO);  // [BR][LE]
  E* Ks = Qs + BR * LE;                                 // [BT][LE]
  E* Vs = Ks + BT * LE;
  E* Ps = Vs + BT * LE;  // [kWarps][16][LP]
  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * BR, C3 = 3 * C;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, row = lane / 2, half = lane % 2;
  const float* base = qkv + (size_t)b * T * C3;
  float* S = Ss + warp * 16 * LS;
  float* O = Os + warp * 16 * LO;
  E* P = Ps + warp * 16 * LP;
  const int tq = q0 + warp * 16 + row;  // this lane's query row
  load_rows<E>(Qs, base + h * HS, C3, q0, BR, T, scale);
  for (int j = 0; j < HS / 2; ++j) O[row * LO + half * (HS / 2) + j] = 0.f;
  __syncthreads();
  FragA<E> qf[HS / 16];
  load_frags_a<E>(qf, Qs + warp * 16 * LE);
  float m = -FLT_MAX, l = 0.f;
  const int last = min(T - 1, q0 + BR - 1);
  for (int s0 = 0; s0 <= last; s0 += BT) {
    __syncthreads();
    load_rows<E>(Ks, base + C + h * HS, C3, s0, BT, T, 1.f);
    load_rows<E>(Vs, base + 2 * C + h * HS, C3, s0, BT, T, 1.f);
    __syncthreads();
    if (s0 > q0 + warp * 16 + 15) continue;  // every key of the tile is after every query of the warp
    scores<E>(qf, Ks, S);
    __syncwarp();
    float sv[BT / 2], mx = -FLT_MAX;
#pragma unroll
    for (int j = 0; j < BT / 2; ++j) {
      const int c = half * (BT / 2) + j;
      sv[j] = S[row * LS + c];
      if (s0 + c <= tq) mx = fmaxf(mx, sv[j]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float mn = fmaxf(m, mx), corr = __expf(m - mn);
    float ps = 0.f;
#pragma unroll
    for (int j = 0; j < BT / 2; ++j) {
      const int c = half * (BT / 2) + j;
      const float p = s0 + c <= tq ? __expf(sv[j] - mn) : 0.f;
      ps += p;
      store_e(P + row * LP + c, p);
    }
    ps += __shfl_xor_sync(0xffffffffu, ps, 1);
    l = l * corr + ps;
    m = mn;
    for (int j = 0; j < HS / 2; ++j) O[row * LO + half * (HS / 2) + j] *= corr;
    __syncwarp();
    Acc o[HS / 16];
#pragma unroll
    for (int n = 0; n < HS / 16; ++n) wmma::load_matrix_sync(o[n], O + n * 16, LO, wmma::mem_row_major);
    times_tile<E>(o, P, Vs);
#pragma unroll
    for (int n = 0; n < HS / 16; ++n) wmma::store_matrix_sync(O + n * 16, o[n], LO, wmma::mem_row_major);
    __syncwarp();
  }
  if (tq >= T) return;
  const float inv = 1.f / l;
  float* orow = out + ((size_t)b * T + tq) * C + h * HS;
  for (int j = 0; j < HS / 2; ++j) orow[half * (HS / 2) + j] = O[row * LO + half * (HS / 2) + j] * inv;
  if (half == 0) lse[((size_t)b * H + h) * T + tq] = m + logf(l);
}

// ---- backward: dK, dV per key block ------------------------------------------------
constexpr size_t kKvSmem = sizeof(float) * (2 * kWarps * 16 * LS + kWarps * 16 * LO + 2 * BT) +
                           2 * (size_t)(2 * BR * LE + 2 * BT * LE + 2 * kWarps * 16 * LP);

template <typename E>
__global__ void __launch_bounds__(32 * kWarps)
    k_bwd_kv(const float* qkv, const float* dout, const float* lse, const float* delta, float* dqkv, int T, int C,
             int H, float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  float* St = reinterpret_cast<float*>(smem);  // [kWarps][16][LS]: S^T (keys x queries)
  float* dPt = St + kWarps * 16 * LS;
  float* Ost = dPt + kWarps * 16 * LS;  // [kWarps][16][LO]: output staging
  float* Lq = Ost + kWarps * 16 * LO;   // [BT]
  float* Dq = Lq + BT;
  E* Kw = reinterpret_cast<E*>(Dq + BT);  // [BR][LE]
  E* Vw = Kw + BR * LE;
  E* Qt = Vw + BR * LE;  // [BT][LE], scaled
  E* dOt = Qt + BT * LE;
  E* Pt = dOt + BT * LE;  // [kWarps][16][LP]
  E* dSt = Pt + kWarps * 16 * LP;
  const int b = blockIdx.z, h = blockIdx.y, k0 = blockIdx.x * BR, C3 = 3 * C;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, row = lane / 2, half = lane % 2;
  const float* base = qkv + (size_t)b * T * C3;
  const float* dob = dout + (size_t)b * T * C + h * HS;
  const float* L = lse + ((size_t)b * H + h) * T;
  const float* Dl = delta + ((size_t)b * H + h) * T;
  load_rows<E>(Kw, base + C + h * HS, C3, k0, BR, T, 1.f);
  load_rows<E>(Vw, base + 2 * C + h * HS, C3, k0, BR, T, 1.f);
  __syncthreads();
  FragA<E> kf[HS / 16], vf[HS / 16];
  load_frags_a<E>(kf, Kw + warp * 16 * LE);
  load_frags_a<E>(vf, Vw + warp * 16 * LE);
  Acc dk[HS / 16], dv[HS / 16];
#pragma unroll
  for (int n = 0; n < HS / 16; ++n) wmma::fill_fragment(dk[n], 0.f), wmma::fill_fragment(dv[n], 0.f);
  float* S = St + warp * 16 * LS;
  float* dP = dPt + warp * 16 * LS;
  E* P = Pt + warp * 16 * LP;
  E* dS = dSt + warp * 16 * LP;
  const int sk = k0 + warp * 16 + row;  // this lane's key row
  for (int t0 = k0; t0 < T; t0 += BT) {
    __syncthreads();
    load_rows<E>(Qt, base + h * HS, C3, t0, BT, T, scale);
    load_rows<E>(dOt, dob, C, t0, BT, T, 1.f);
    if (threadIdx.x < BT) {
      const int t = t0 + threadIdx.x;
      Lq[threadIdx.x] = t < T ? L[t] : 0.f;
      Dq[threadIdx.x] = t < T ? Dl[t] : 0.f;
    }
    __syncthreads();
    if (t0 + BT - 1 < k0 + warp * 16) continue;  // every query of the tile is before every key of the warp
    scores<E>(kf, Qt, S);                        // S^T = K (scale Q)^T
    scores<E>(vf, dOt, dP);                      // dP^T = V dO^T
    __syncwarp();
#pragma unroll
    for (int j = 0; j < BT / 2; ++j) {
      const int c = half * (BT / 2) + j, t = t0 + c;
      const bool ok = t >= sk && t < T;
      const float p = ok ? __expf(S[row * LS + c] - Lq[c]) : 0.f;
      store_e(P + row * LP + c, p);
      store_e(dS + row * LP + c, p * (dP[row * LS + c] - Dq[c]));
    }
    __syncwarp();
    times_tile<E>(dv, P, dOt);  // dV += P^T dO
    times_tile<E>(dk, dS, Qt);  // dK += dS^T (scale Q)
  }
  float* O = Ost + warp * 16 * LO;
  float* drow = sk < T ? dqkv + ((size_t)b * T + sk) * C3 + h * HS : nullptr;
  add_rows(dk, O, drow ? drow + C : nullptr, row, half, 1.f);
  add_rows(dv, O, drow ? drow + 2 * C : nullptr, row, half, 1.f);
}

// ---- backward: dQ per query block ------------------------------------------------
constexpr size_t kQSmem = sizeof(float) * (2 * kWarps * 16 * LS + kWarps * 16 * LO) +
                          2 * (size_t)(2 * BR * LE + 2 * BT * LE + kWarps * 16 * LP);

template <typename E>
__global__ void __launch_bounds__(32 * kWarps)
    k_bwd_q(const float* qkv, const float* dout, const float* lse, const float* delta, float* dqkv, int T, int C, int H,
            float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  float* Ss = reinterpret_cast<float*>(smem);  // [kWarps][16][LS]
  float* dPs = Ss + kWarps * 16 * LS;
  float* Os = dPs + kWarps * 16 * LS;                   // [kWarps][16][LO]
  E* Qw = reinterpret_cast<E*>(Os + kWarps * 16 * LO);  // [BR][LE], scaled
  E* dOw = Qw + BR * LE;
  E* Kt = dOw + BR * LE;  // [BT][LE]
  E* Vt = Kt + BT * LE;
  E* dSs = Vt + BT * LE;  // [kWarps][16][LP]
  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * BR, C3 = 3 * C;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, row = lane / 2, half = lane % 2;
  const float* base = qkv + (size_t)b * T * C3;
  load_rows<E>(Qw, base + h * HS, C3, q0, BR, T, scale);
  load_rows<E>(dOw, dout + (size_t)b * T * C + h * HS, C, q0, BR, T, 1.f);
  __syncthreads();
  FragA<E> qf[HS / 16], df[HS / 16];
  load_frags_a<E>(qf, Qw + warp * 16 * LE);
  load_frags_a<E>(df, dOw + warp * 16 * LE);
  Acc dq[HS / 16];
#pragma unroll
  for (int n = 0; n < HS / 16; ++n) wmma::fill_fragment(dq[n], 0.f);
  const int tq = q0 + warp * 16 + row;
  const bool active = tq < T;
  const float Lt = active ? lse[((size_t)b * H + h) * T + tq] : 0.f;
  const float Dt = active ? delta[((size_t)b * H + h) * T + tq] : 0.f;
  float* S = Ss + warp * 16 * LS;
  float* dP = dPs + warp * 16 * LS;
  E* dS = dSs + warp * 16 * LP;
  const int last = min(T - 1, q0 + BR - 1);
  for (int s0 = 0; s0 <= last; s0 += BT) {
    __syncthreads();
    load_rows<E>(Kt, base + C + h * HS, C3, s0, BT, T, 1.f);
    load_rows<E>(Vt, base + 2 * C + h * HS, C3, s0, BT, T, 1.f);
    __syncthreads();
    if (s0 > q0 + warp * 16 + 15) continue;
    scores<E>(qf, Kt, S);   // S = (scale Q) K^T
    scores<E>(df, Vt, dP);  // dP = dO V^T
    __syncwarp();
#pragma unroll
    for (int j = 0; j < BT / 2; ++j) {
      const int c = half * (BT / 2) + j;
      const bool ok = active && s0 + c <= tq;
      store_e(dS + row * LP + c, ok ? __expf(S[row * LS + c] - Lt) * (dP[row * LS + c] - Dt) : 0.f);
    }
    __syncwarp();
    times_tile<E>(dq, dS, Kt);  // dQ += dS K (times scale below)
  }
  add_rows(dq, Os + warp * 16 * LO, active ? dqkv + ((size_t)b * T + tq) * C3 + h * HS : nullptr, row, half, scale);
}

template <typename K>
void opt_in_smem(K kernel, size_t bytes) {
  ZR_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <typename E>
void fwd_e(const float* qkv, float* out, float* lse, int B, int T, int C, int H) {
  static bool once = (opt_in_smem(k_fwd<E>, kFwdSmem), true);
  (void)once;
  dim3 grid((T + BR - 1) / BR, H, B);
  k_fwd<E><<<grid, 32 * kWarps, kFwdSmem>>>(qkv, out, lse, T, C, H, 1.f / sqrtf((float)HS));
  ZR_CUDA(cudaGetLastError());
}

template <typename E>
void bwd_e(const float* qkv, const float* out, const float* lse, const float* dout, float* dqkv, float* delta, int B,
           int T, int C, int H) {
  static bool once = (opt_in_smem(k_bwd_kv<E>, kKvSmem), opt_in_smem(k_bwd_q<E>, kQSmem), true);
  (void)once;
  row_delta(out, dout, delta, B, T, C, H);
  const float scale = 1.f / sqrtf((float)HS);
  dim3 grid((T + BR - 1) / BR, H, B);
  k_bwd_kv<E><<<grid, 32 * kWarps, kKvSmem>>>(qkv, dout, lse, delta, dqkv, T, C, H, scale);
  ZR_CUDA(cudaGetLastError());
  k_bwd_q<E><<<grid, 32 * kWarps, kQSmem>>>(qkv, dout, lse, delta, dqkv, T, C, H, scale);
  ZR_CUDA(cudaGetLastError());
}
}  // namespace

bool tc_supported(int64_t head_size) { return head_size == HS; }

void tc_forward(bool bf16, const float* qkv, float* out, float* lse, int64_t B, int64_t T, int64_t C, int64_t H) {
  ZR_CHECK(tc_supported(C / H), "tensor-core attention needs head size ", HS, ", got ", C / H);
  if (bf16)
    fwd_e<__nv_bfloat16>(qkv, out, lse, (int)B, (int)T, (int)C, (int)H);
  else
    fwd_e<__half>(qkv, out, lse, (int)B, (int)T, (int)C, (int)H);
}

void tc_backward(bool bf16, const float* qkv, const float* out, const float* lse, const float* dout, float* dqkv,
                 float* delta, int64_t B, int64_t T, int64_t C, int64_t H) {
  ZR_CHECK(tc_supported(C / H), "tensor-core attention needs head size ", HS, ", got ", C / H);
  if (bf16)
    bwd_e<__nv_bfloat16>(qkv, out, lse, dout, dqkv, delta, (int)B, (int)T, (int)C, (int)H);
  else
    bwd_e<__half>(qkv, out, lse, dout, dqkv, delta, (int)B, (int)T, (int)C, (int)H);
}

}  // namespace zerorun::kernels::flash
