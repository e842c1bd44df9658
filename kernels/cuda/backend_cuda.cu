// The CUDA backend: every op's forward and backward, optimizer updates and
// reductions on the GPU (cuBLAS for products, hand-written kernels for the
// rest), on the default stream. Checked against the CPU backend op by op
// (tests/unit/test_cuda_ops.cc, run on the device machine).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cuda_check.h"
#include "flash_attention.h"
#include "kernels/backend.h"
#include "zerorun/cuda_rt.h"

namespace zerorun::kernels {
namespace {

constexpr int kTpb = 256;
inline unsigned grid_for(int64_t n) {
  int64_t b = (n + kTpb - 1) / kTpb;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(b, 1 << 20)));
}
#define GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)
#define LAUNCH(kernel, n, ...)                    \
  do {                                            \
    if ((n) > 0) {                                \
      kernel<<<grid_for(n), kTpb>>>(__VA_ARGS__); \
      ZR_CUDA(cudaGetLastError());                \
    }                                             \
  } while (0)

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide reductions for blocks of kTpb threads.
__device__ inline float block_sum(float v) {
  __shared__ float sh[32];
  v = warp_sum(v);
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? sh[lane] : 0.f;
  if (w == 0) v = warp_sum(v);
  if (threadIdx.x == 0) sh[0] = v;
  __syncthreads();
  float r = sh[0];
  __syncthreads();
  return r;
}
__device__ inline float block_max(float v) {
  __shared__ float sh[32];
  v = warp_max(v);
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? sh[lane] : -INFINITY;
  if (w == 0) v = warp_max(v);
  if (threadIdx.x == 0) sh[0] = v;
  __syncthreads();
  float r = sh[0];
  __syncthreads();
  return r;
}

// ---- elementwise --------------------------------------------------------------
__global__ void k_bias_add(float* y, const float* b, int64_t n, int64_t out) { GRID_STRIDE(i, n) y[i] += b[i % out]; }
__global__ void k_colsum_acc(const float* dy, float* db, int64_t rows, int64_t cols) {
  GRID_STRIDE(c, cols) {
    float s = 0.f;
    for (int64_t r = 0; r < rows; ++r) s += dy[r * cols + c];
    db[c] += s;
  }
}
__global__ void k_add(const float* a, const float* b, float* y, int64_t n, int64_t nb) {
  GRID_STRIDE(i, n) y[i] = a[i] + b[i % nb];
}
__global__ void k_acc(float* acc, const float* x, int64_t n) { GRID_STRIDE(i, n) acc[i] += x[i]; }
__global__ void k_mul(const float* a, const float* b, float* y, int64_t n) { GRID_STRIDE(i, n) y[i] = a[i] * b[i]; }
__global__ void k_mul_bwd(const float* a, const float* b, const float* dy, float* da, float* db, int64_t n) {
  GRID_STRIDE(i, n) {
    if (da) da[i] += dy[i] * b[i];
    if (db) db[i] += dy[i] * a[i];
  }
}
constexpr float kGeluC = 0.7978845608028654f;
__global__ void k_act_fwd(int act, const float* x, float* y, int64_t n) {
  GRID_STRIDE(i, n) {
    float v = x[i];
    if (act == 0)
      y[i] = 0.5f * v * (1.f + tanhf(kGeluC * (v + 0.044715f * v * v * v)));
    else if (act == 1)
      y[i] = v > 0.f ? v : 0.f;
    else
      y[i] = v / (1.f + expf(-v));
  }
}
__global__ void k_act_bwd(int act, const float* x, const float* dy, float* dx, int64_t n) {
  GRID_STRIDE(i, n) {
    float v = x[i], d;
    if (act == 0) {
      float t = tanhf(kGeluC * (v + 0.044715f * v * v * v));
      d = 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * kGeluC * (1.f + 3.f * 0.044715f * v * v);
    } else if (act == 1) {
      d = v > 0.f ? 1.f : 0.f;
    } else {
      float s = 1.f / (1.f + expf(-v));
      d = s * (1.f + v * (1.f - s));
    }
    dx[i] += dy[i] * d;
  }
}

// ---- norms: one warp per row ----------------------------------------------------
__global__ void k_ln_fwd(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, int64_t N,
                         int64_t C, float eps) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x & 31;
  if (row >= N) return;
  const float* xr = x + row * C;
  float s = 0.f;
  for (int64_t c = lane; c < C; c += 32) s += xr[c];
  float m = warp_sum(s) / C;
  float v = 0.f;
  for (int64_t c = lane; c < C; c += 32) v += (xr[c] - m) * (xr[c] - m);
  float rs = rsqrtf(warp_sum(v) / C + eps);
  for (int64_t c = lane; c < C; c += 32) y[row * C + c] = (xr[c] - m) * rs * w[c] + (b ? b[c] : 0.f);
  if (lane == 0) mean[row] = m, rstd[row] = rs;
}
__global__ void k_ln_bwd_dx(const float* x, const float* w, const float* mean, const float* rstd, const float* dy,
                            float* dx, int64_t N, int64_t C) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x & 31;
  if (row >= N) return;
  const float *xr = x + row * C, *dr = dy + row * C;
  float mu = mean[row], rs = rstd[row], s1 = 0.f, s2 = 0.f;
  for (int64_t c = lane; c < C; c += 32) {
    float g = dr[c] * w[c];
    s1 += g;
    s2 += g * (xr[c] - mu) * rs;
  }
  s1 = warp_sum(s1) / C;
  s2 = warp_sum(s2) / C;
  for (int64_t c = lane; c < C; c += 32) dx[row * C + c] += (dr[c] * w[c] - s1 - (xr[c] - mu) * rs * s2) * rs;
}
__global__ void k_ln_bwd_wb(const float* x, const float* mean, const float* rstd, const float* dy, float* dw, float* db,
                            int64_t N, int64_t C) {
  GRID_STRIDE(c, C) {
    float sw = 0.f, sb = 0.f;
    for (int64_t n = 0; n < N; ++n) {
      float d = dy[n * C + c];
      sw += d * (x[n * C + c] - (mean ? mean[n] : 0.f)) * rstd[n];
      sb += d;
    }
    if (dw) dw[c] += sw;
    if (db) db[c] += sb;
  }
}
__global__ void k_rms_fwd(const float* x, const float* w, float* y, float* rstd, int64_t N, int64_t C, float eps) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x & 31;
  if (row >= N) return;
  const float* xr = x + row * C;
  float s = 0.f;
  for (int64_t c = lane; c < C; c += 32) s += xr[c] * xr[c];
  float rs = rsqrtf(warp_sum(s) / C + eps);
  for (int64_t c = lane; c < C; c += 32) y[row * C + c] = xr[c] * rs * w[c];
  if (lane == 0) rstd[row] = rs;
}
__global__ void k_rms_bwd_dx(const float* x, const float* w, const float* rstd, const float* dy, float* dx, int64_t N,
                             int64_t C) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x & 31;
  if (row >= N) return;
  const float *xr = x + row * C, *dr = dy + row * C;
  float rs = rstd[row], s = 0.f;
  for (int64_t c = lane; c < C; c += 32) s += dr[c] * w[c] * xr[c] * rs;
  s = warp_sum(s) / C;
  for (int64_t c = lane; c < C; c += 32) dx[row * C + c] += (dr[c] * w[c] - xr[c] * rs * s) * rs;
}
unsigned rows_grid(int64_t N) { return static_cast<unsigned>((N + 7) / 8); }  // 8 warps per 256-thread block

// ---- attention helpers: warp per row of [rows, T] ---------------------------------
__global__ void k_causal_softmax(float* P, int64_t rows, int64_t T) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  int64_t t = row % T;
  float* p = P + row * T;
  float mx = -INFINITY;
  for (int64_t s = lane; s <= t; s += 32) mx = fmaxf(mx, p[s]);
  mx = warp_max(mx);
  float sum = 0.f;
  for (int64_t s = lane; s <= t; s += 32) {
    float e = expf(p[s] - mx);
    p[s] = e;
    sum += e;
  }
  float inv = 1.f / warp_sum(sum);
  for (int64_t s = lane; s < T; s += 32) p[s] = s <= t ? p[s] * inv : 0.f;
}
// dS = P * (dP - rowsum(P * dP)) * scale, in place over dP.
__global__ void k_softmax_bwd(const float* P, float* dP, int64_t rows, int64_t T, float scale) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* p = P + row * T;
  float* d = dP + row * T;
  float dot = 0.f;
  for (int64_t s = lane; s < T; s += 32) dot += p[s] * d[s];
  dot = warp_sum(dot);
  for (int64_t s = lane; s < T; s += 32) d[s] = p[s] * (d[s] - dot) * scale;
}

// ---- embeddings ------------------------------------------------------------------
__global__ void k_ids_check(const int32_t* ids, int64_t n, int64_t V, int* bad) {
  GRID_STRIDE(i, n) if (ids[i] < 0 || ids[i] >= V) atomicExch(bad, 1);
}
__global__ void k_emb_fwd(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C) {
  GRID_STRIDE(i, N * C) out[i] = table[(int64_t)ids[i / C] * C + i % C];
}
__global__ void k_emb_bwd(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t C) {
  GRID_STRIDE(i, N * C) atomicAdd(&dtable[(int64_t)ids[i / C] * C + i % C], dout[i]);
}
__global__ void k_pos_fwd(const float* table, float* out, int64_t B, int64_t T, int64_t C) {
  GRID_STRIDE(i, B * T * C) out[i] = table[i % (T * C)];
}
__global__ void k_pos_bwd(const float* dout, float* dtable, int64_t B, int64_t T, int64_t C) {
  GRID_STRIDE(i, T * C) {
    float s = 0.f;
    for (int64_t b = 0; b < B; ++b) s += dout[b * T * C + i];
    dtable[i] += s;
  }
}

// ---- losses: one block per row ------------------------------------------------------
__global__ void k_ce_fwd(const float* logits, const int32_t* targets, float* row_loss, int64_t V) {
  const float* l = logits + blockIdx.x * V;
  float mx = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, l[v]);
  mx = block_max(mx);
  float s = 0.f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) s += expf(l[v] - mx);
  s = block_sum(s);
  if (threadIdx.x == 0) row_loss[blockIdx.x] = logf(s) + mx - l[targets[blockIdx.x]];
}
__global__ void k_ce_bwd(const float* logits, const int32_t* targets, const float* dloss, float* dlogits, int64_t N,
                         int64_t V) {
  const float* l = logits + blockIdx.x * V;
  float* d = dlogits + blockIdx.x * V;
  float mx = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, l[v]);
  mx = block_max(mx);
  float s = 0.f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) s += expf(l[v] - mx);
  float inv = 1.f / block_sum(s);
  float scale = *dloss / static_cast<float>(N);
  int32_t t = targets[blockIdx.x];
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) d[v] += scale * (expf(l[v] - mx) * inv - (v == t ? 1.f : 0.f));
}
__global__ void k_sq_diff_sum(const float* a, const float* b, int64_t n, double* out) {
  float s = 0.f;
  GRID_STRIDE(i, n) {
    float d = b ? a[i] - b[i] : a[i];
    s += d * d;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) atomicAdd(out, static_cast<double>(s));
}
__global__ void k_mse_bwd(const float* p, const float* t, const float* dloss, float* dp, int64_t n) {
  float scale = 2.f * *dloss / static_cast<float>(n);
  GRID_STRIDE(i, n) dp[i] += scale * (p[i] - t[i]);
}

// ---- optimizer and helpers ----------------------------------------------------------
__global__ void k_adam(float* p, const float* g, float* m, float* v, int64_t n, float lr, float b1, float b2, float eps,
                       float wd, bool adamw, float step_size, float bc2_sqrt) {
  GRID_STRIDE(i, n) {
    float gi = g[i];
    if (!adamw && wd != 0.f) gi += wd * p[i];
    float mi = b1 * m[i] + (1.f - b1) * gi;
    float vi = b2 * v[i] + (1.f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float pi = p[i];
    if (adamw && wd != 0.f) pi -= lr * wd * pi;
    p[i] = pi - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
  }
}
__global__ void k_sgd(float* p, const float* g, float* buf, int64_t n, float lr, float mom, float damp, float wd,
                      bool nesterov, bool first) {
  GRID_STRIDE(i, n) {
    float d = g[i];
    if (wd != 0.f) d += wd * p[i];
    if (mom != 0.f) {
      float b = first ? d : mom * buf[i] + (1.f - damp) * d;
      buf[i] = b;
      d = nesterov ? d + mom * b : b;
    }
    p[i] -= lr * d;
  }
}
__global__ void k_scale(float* x, float s, int64_t n) { GRID_STRIDE(i, n) x[i] *= s; }
__global__ void k_finite(const float* x, int64_t n, int* bad) {
  GRID_STRIDE(i, n) if (!isfinite(x[i])) atomicExch(bad, 1);
}
__global__ void k_round(int dt, const float* s, float* d, int64_t n) {
  GRID_STRIDE(i, n) d[i] = dt == 1 ? __bfloat162float(__float2bfloat16_rn(s[i])) : __half2float(__float2half_rn(s[i]));
}

template <typename T>
struct DevBuf {  // scratch from the caching allocator
  T* p = nullptr;
  size_t bytes;
  explicit DevBuf(size_t n) : bytes(n * sizeof(T)) {
    p = static_cast<T*>(cuda::device_alloc(bytes, 0));
    ZR_CUDA(cudaMemset(p, 0, bytes));
  }
  ~DevBuf() { cuda::device_free(p, bytes, 0); }
};

class CudaBackend : public Backend {
 public:
  CudaBackend() { ZR_CUBLAS(cublasCreate(&h_)); }
  const char* name() const override { return "cuda"; }
  void allow_tf32(bool on) override {
    ZR_CUBLAS(cublasSetMathMode(h_, on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  }

  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, const float* B, float beta,
            float* C) override {
    gemm_strided(ta, tb, M, N, K, alpha, A, ta ? M : K, 0, B, tb ? K : N, 0, beta, C, N, 0, 1);
  }
  void gemm_strided(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                    int64_t sA, const float* B, int64_t ldb, int64_t sB, float beta, float* C, int64_t ldc, int64_t sC,
                    int64_t batch) override {
    if (M == 0 || N == 0 || batch == 0) return;
    // Row-major C = op(A) op(B)  <=>  column-major C^T = op(B)^T op(A)^T.
    ZR_CUBLAS(cublasSgemmStridedBatched(h_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                        static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, B,
                                        static_cast<int>(ldb), sB, A, static_cast<int>(lda), sA, &beta, C,
                                        static_cast<int>(ldc), sC, static_cast<int>(batch)));
  }
  void linear_fwd(const float* x, const float* w, const float* b, float* y, int64_t N, int64_t in,
                  int64_t out) override {
    gemm(false, true, N, out, in, 1.f, x, w, 0.f, y);
    if (b) LAUNCH(k_bias_add, N * out, y, b, N * out, out);
  }
  void linear_bwd(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t N,
                  int64_t in, int64_t out) override {
    if (dx) gemm(false, false, N, in, out, 1.f, dy, w, 1.f, dx);
    if (dw) gemm(true, false, out, in, N, 1.f, dy, x, 1.f, dw);
    if (db) LAUNCH(k_colsum_acc, out, dy, db, N, out);
  }
  void add_fwd(const float* a, const float* b, float* y, int64_t n, int64_t nb) override {
    LAUNCH(k_add, n, a, b, y, n, nb);
  }
  void add_bwd(const float* dy, float* da, float* db, int64_t n, int64_t nb) override {
    if (da) LAUNCH(k_acc, n, da, dy, n);
    if (db) {
      if (nb == n)
        LAUNCH(k_acc, n, db, dy, n);
      else
        LAUNCH(k_colsum_acc, nb, dy, db, n / nb, nb);
    }
  }
  void mul_fwd(const float* a, const float* b, float* y, int64_t n) override { LAUNCH(k_mul, n, a, b, y, n); }
  void mul_bwd(const float* a, const float* b, const float* dy, float* da, float* db, int64_t n) override {
    LAUNCH(k_mul_bwd, n, a, b, dy, da, db, n);
  }
  void act_fwd(Act act, const float* x, float* y, int64_t n) override {
    LAUNCH(k_act_fwd, n, static_cast<int>(act), x, y, n);
  }
  void act_bwd(Act act, const float* x, const float* dy, float* dx, int64_t n) override {
    LAUNCH(k_act_bwd, n, static_cast<int>(act), x, dy, dx, n);
  }
  void layernorm_fwd(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, int64_t N,
                     int64_t C, float eps) override {
    if (!N) return;
    k_ln_fwd<<<rows_grid(N), kTpb>>>(x, w, b, y, mean, rstd, N, C, eps);
    ZR_CUDA(cudaGetLastError());
  }
  void layernorm_bwd(const float* x, const float* w, const float* mean, const float* rstd, const float* dy, float* dx,
                     float* dw, float* db, int64_t N, int64_t C) override {
    if (!N) return;
    if (dx) k_ln_bwd_dx<<<rows_grid(N), kTpb>>>(x, w, mean, rstd, dy, dx, N, C);
    if (dw || db) LAUNCH(k_ln_bwd_wb, C, x, mean, rstd, dy, dw, db, N, C);
    ZR_CUDA(cudaGetLastError());
  }
  void rmsnorm_fwd(const float* x, const float* w, float* y, float* rstd, int64_t N, int64_t C, float eps) override {
    if (!N) return;
    k_rms_fwd<<<rows_grid(N), kTpb>>>(x, w, y, rstd, N, C, eps);
    ZR_CUDA(cudaGetLastError());
  }
  void rmsnorm_bwd(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw, int64_t N,
                   int64_t C) override {
    if (!N) return;
    if (dx) k_rms_bwd_dx<<<rows_grid(N), kTpb>>>(x, w, rstd, dy, dx, N, C);
    if (dw) LAUNCH(k_ln_bwd_wb, C, x, nullptr, rstd, dy, dw, nullptr, N, C);
    ZR_CUDA(cudaGetLastError());
  }
  void attention_fwd(const float* qkv, float* out, float* probs, int64_t B, int64_t T, int64_t C, int64_t H) override {
    const int64_t hs = C / H, C3 = 3 * C, TT = T * T;
    const float scale = 1.f / std::sqrt(static_cast<float>(hs));
    for (int64_t b = 0; b < B; ++b) {
      const float* q = qkv + b * T * C3;
      float* P = probs + b * H * TT;
      gemm_strided(false, true, T, T, hs, scale, q, C3, hs, q + C, C3, hs, 0.f, P, T, TT, H);
    }
    k_causal_softmax<<<rows_grid(B * H * T), kTpb>>>(probs, B * H * T, T);
    ZR_CUDA(cudaGetLastError());
    for (int64_t b = 0; b < B; ++b) {
      const float* q = qkv + b * T * C3;
      gemm_strided(false, false, T, hs, T, 1.f, probs + b * H * TT, T, TT, q + 2 * C, C3, hs, 0.f, out + b * T * C, C,
                   hs, H);
    }
  }
  void attention_bwd(const float* qkv, const float* probs, const float* dout, float* dqkv, int64_t B, int64_t T,
                     int64_t C, int64_t H) override {
    const int64_t hs = C / H, C3 = 3 * C, TT = T * T;
    const float scale = 1.f / std::sqrt(static_cast<float>(hs));
    DevBuf<float> dP(static_cast<size_t>(H * TT));
    for (int64_t b = 0; b < B; ++b) {
      const float* q = qkv + b * T * C3;
      const float* P = probs + b * H * TT;
      const float* dO = dout + b * T * C;
      float* dq = dqkv + b * T * C3;
      gemm_strided(false, true, T, T, hs, 1.f, dO, C, hs, q + 2 * C, C3, hs, 0.f, dP.p, T, TT, H);  // dP = dO V^T
      gemm_strided(true, false, T, hs, T, 1.f, P, T, TT, dO, C, hs, 1.f, dq + 2 * C, C3, hs, H);    // dV += P^T dO
      k_softmax_bwd<<<rows_grid(H * T), kTpb>>>(P, dP.p, H * T, T, scale);
      ZR_CUDA(cudaGetLastError());
      gemm_strided(false, false, T, hs, T, 1.f, dP.p, T, TT, q + C, C3, hs, 1.f, dq, C3, hs, H);  // dQ += dS K
      gemm_strided(true, false, T, hs, T, 1.f, dP.p, T, TT, q, C3, hs, 1.f, dq + C, C3, hs, H);   // dK += dS^T Q
    }
  }
  bool has_flash_attention(int64_t head_size) const override { return flash::supported(head_size); }
  void flash_attention_fwd(const float* qkv, float* out, float* lse, int64_t B, int64_t T, int64_t C,
                           int64_t H) override {
    flash::forward(qkv, out, lse, B, T, C, H);
  }
  void flash_attention_bwd(const float* qkv, const float* out, const float* lse, const float* dout, float* dqkv,
                           int64_t B, int64_t T, int64_t C, int64_t H) override {
    DevBuf<float> delta(static_cast<size_t>(B * H * T));
    flash::backward(qkv, out, lse, dout, dqkv, delta.p, B, T, C, H);
  }
  bool ids_in_range(const int32_t* ids, int64_t n, int64_t V) override {
    DevBuf<int> bad(1);
    LAUNCH(k_ids_check, n, ids, n, V, bad.p);
    int h = 0;
    ZR_CUDA(cudaMemcpy(&h, bad.p, sizeof h, cudaMemcpyDeviceToHost));
    return h == 0;
  }
  void embedding_fwd(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C) override {
    LAUNCH(k_emb_fwd, N * C, ids, table, out, N, C);
  }
  void embedding_bwd(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t C, int64_t) override {
    LAUNCH(k_emb_bwd, N * C, ids, dout, dtable, N, C);
  }
  void pos_embedding_fwd(const float* table, float* out, int64_t B, int64_t T, int64_t C) override {
    LAUNCH(k_pos_fwd, B * T * C, table, out, B, T, C);
  }
  void pos_embedding_bwd(const float* dout, float* dtable, int64_t B, int64_t T, int64_t C) override {
    LAUNCH(k_pos_bwd, T * C, dout, dtable, B, T, C);
  }
  double cross_entropy_fwd(const float* logits, const int32_t* targets, int64_t N, int64_t V) override {
    if (!N) return 0.0;
    DevBuf<float> rows(static_cast<size_t>(N));
    k_ce_fwd<<<static_cast<unsigned>(N), kTpb>>>(logits, targets, rows.p, V);
    ZR_CUDA(cudaGetLastError());
    std::vector<float> h(static_cast<size_t>(N));
    ZR_CUDA(cudaMemcpy(h.data(), rows.p, h.size() * 4, cudaMemcpyDeviceToHost));
    double s = 0.0;
    for (float v : h) s += v;
    return s / static_cast<double>(N);
  }
  void cross_entropy_bwd(const float* logits, const int32_t* targets, const float* dloss, float* dlogits, int64_t N,
                         int64_t V) override {
    if (!N) return;
    k_ce_bwd<<<static_cast<unsigned>(N), kTpb>>>(logits, targets, dloss, dlogits, N, V);
    ZR_CUDA(cudaGetLastError());
  }
  double mse_fwd(const float* pred, const float* target, int64_t n) override {
    return sum_sq(pred, target, n) / static_cast<double>(n);
  }
  void mse_bwd(const float* pred, const float* target, const float* dloss, float* dpred, int64_t n) override {
    LAUNCH(k_mse_bwd, n, pred, target, dloss, dpred, n);
  }
  void adam_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2, float eps,
                 float wd, bool adamw, bool bias_correction, int64_t step) override {
    float bc1 = 1.f, bc2 = 1.f;
    if (bias_correction) {
      bc1 = 1.f - static_cast<float>(std::pow(static_cast<double>(beta1), static_cast<double>(step)));
      bc2 = 1.f - static_cast<float>(std::pow(static_cast<double>(beta2), static_cast<double>(step)));
    }
    LAUNCH(k_adam, n, p, g, m, v, n, lr, beta1, beta2, eps, wd, adamw, lr / bc1, std::sqrt(bc2));
  }
  void sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float dampening, float wd,
                bool nesterov, bool first_step) override {
    LAUNCH(k_sgd, n, p, g, buf, n, lr, momentum, dampening, wd, nesterov, first_step);
  }
  void scale_inplace(float* x, float s, int64_t n) override { LAUNCH(k_scale, n, x, s, n); }
  void accumulate(float* acc, const float* x, int64_t n) override { LAUNCH(k_acc, n, acc, x, n); }
  double sum_squares(const float* x, int64_t n) override { return sum_sq(x, nullptr, n); }
  bool all_finite(const float* x, int64_t n) override {
    DevBuf<int> bad(1);
    LAUNCH(k_finite, n, x, n, bad.p);
    int h = 0;
    ZR_CUDA(cudaMemcpy(&h, bad.p, sizeof h, cudaMemcpyDeviceToHost));
    return h == 0;
  }
  void round_to(DType dt, const float* src, float* dst, int64_t n) override {
    if (dt == DType::F32) {
      if (src != dst) ZR_CUDA(cudaMemcpy(dst, src, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToDevice));
      return;
    }
    LAUNCH(k_round, n, dt == DType::BF16 ? 1 : 2, src, dst, n);
  }
  void set_scalar(float* p, float v) override { ZR_CUDA(cudaMemcpy(p, &v, 4, cudaMemcpyHostToDevice)); }
  float get_scalar(const float* p) override {
    float v = 0.f;
    ZR_CUDA(cudaMemcpy(&v, p, 4, cudaMemcpyDeviceToHost));
    return v;
  }

 private:
  double sum_sq(const float* a, const float* b, int64_t n) {
    if (!n) return 0.0;
    DevBuf<double> acc(1);
    unsigned g = std::min<unsigned>(grid_for(n), 1024);
    k_sq_diff_sum<<<g, kTpb>>>(a, b, n, acc.p);
    ZR_CUDA(cudaGetLastError());
    double h = 0.0;
    ZR_CUDA(cudaMemcpy(&h, acc.p, sizeof h, cudaMemcpyDeviceToHost));
    return h;
  }
  cublasHandle_t h_{};
};

}  // namespace

Backend* cuda_backend() {
  static CudaBackend* b = cuda::available() ? new CudaBackend() : nullptr;
  return b;
}

}  // namespace zerorun::kernels
