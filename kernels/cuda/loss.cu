// Losses on the GPU: cross-entropy (f32 or 16-bit logits, the fused forward + backward) and MSE. Part of the CUDA
// backend (backend_cuda.h).
#include "backend_cuda.h"

namespace zerorun::kernels {
namespace {

// ---- losses: one block per row ------------------------------------------------------
// One pass per row: running (max, sum of exp) per thread, merged across the block.
__device__ inline void online_add(float& m, float& s, float x) {
  if (x > m) {
    s = s * expf(m - x) + 1.f;
    m = x;
  } else {
    s += expf(x - m);
  }
}
__device__ inline void online_merge(float& m, float& s, float m2, float s2) {
  float mn = fmaxf(m, m2);
  s = (m == -INFINITY ? 0.f : s * expf(m - mn)) + (m2 == -INFINITY ? 0.f : s2 * expf(m2 - mn));
  m = mn;
}
__device__ inline void warp_online_merge(float& m, float& s) {
  for (int o = 16; o > 0; o >>= 1)
    online_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
}
// The log-sum-exp of a row of V logits, one pass (running max and sum per thread, merged across the block),
// returned to every thread of the block.
template <class L>
__device__ inline float block_row_lse(const L* l, int64_t V, bool bf) {
  float m = -INFINITY, s = 0.f;
  if (V % 4 == 0) {  // four at a time: one rescale per four (not a branch per element), exp2 on log2e-scaled
    constexpr float L2E = 1.4426950408889634f;
    for (int64_t v = threadIdx.x; v < V / 4; v += blockDim.x) {
      const float4 x = ldv4(l, v, bf);
      const float mx = fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w));
      if (mx > m) {
        s *= exp2f((m - mx) * L2E);  // m = -inf on the first: s is 0 then
        m = mx;
      }
      s += exp2f((x.x - m) * L2E) + exp2f((x.y - m) * L2E) + exp2f((x.z - m) * L2E) + exp2f((x.w - m) * L2E);
    }
  } else {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) online_add(m, s, ld1(l, v, bf));
  }
  warp_online_merge(m, s);
  __shared__ float sm[32], ss[32], zs;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) sm[w] = m, ss[w] = s;
  __syncthreads();
  if (w == 0) {
    m = lane < blockDim.x / 32 ? sm[lane] : -INFINITY;
    s = lane < blockDim.x / 32 ? ss[lane] : 0.f;
    warp_online_merge(m, s);
    if (lane == 0) zs = logf(s) + m;
  }
  __syncthreads();
  return zs;
}
template <class L>  // logits in f32 or 16 bits
__global__ void k_ce_fwd(const L* logits, const int32_t* targets, float* row_loss, float* lse, int64_t V, bool bf) {
  const L* l = logits + blockIdx.x * V;
  const float z = block_row_lse(l, V, bf);
  if (threadIdx.x == 0) {
    lse[blockIdx.x] = z;
    const int32_t t = targets[blockIdx.x];  // outside [0, V): reported by the deferred id check
    row_loss[blockIdx.x] = t >= 0 && t < V ? z - ld1(l, t, bf) : 0.f;
  }
}
// Cross-entropy forward and backward in one read of each row (the backward's d(loss) is known before the
// forward): row_loss = lse - logit[target], then the row is overwritten in place with
// dloss * (softmax - onehot) / N. 16-bit logits, V % 4 == 0; 1024 threads so the rows in flight (two blocks an SM)
// stay in L2 for the second pass.
__global__ void __launch_bounds__(1024) k_ce_fused(uint16_t* logits, const int32_t* targets, float* row_loss,
                                                   const float* dloss, int64_t N, int64_t V, bool bf) {  // N: denom
  uint16_t* l = logits + blockIdx.x * V;
  constexpr float L2E = 1.4426950408889634f;
  const float z = block_row_lse(l, V, bf);
  const int32_t t = targets[blockIdx.x];  // outside [0, V): reported by the deferred id check
  if (threadIdx.x == 0) row_loss[blockIdx.x] = t >= 0 && t < V ? z - ld1(l, t, bf) : 0.f;
  __syncthreads();  // the target's logit is read before the row is overwritten
  // A row whose target is -100 (ignore_index) adds no loss and gets no gradient.
  const float zl = z * L2E, scale = t == -100 ? 0.f : *dloss / static_cast<float>(N);
  for (int64_t v = threadIdx.x; v < V / 4; v += blockDim.x) {
    const float4 x = ldv4(l, v, bf);
    const int64_t b = 4 * v;
    float4 d;
    d.x = scale * (exp2f(x.x * L2E - zl) - (b == t ? 1.f : 0.f));
    d.y = scale * (exp2f(x.y * L2E - zl) - (b + 1 == t ? 1.f : 0.f));
    d.z = scale * (exp2f(x.z * L2E - zl) - (b + 2 == t ? 1.f : 0.f));
    d.w = scale * (exp2f(x.w * L2E - zl) - (b + 3 == t ? 1.f : 0.f));
    stv4(l, v, d, false, bf);
  }
}
// dlogits (+)= dloss * (softmax - onehot) / N: D = float (accumulated when acc) or uint16_t (16-bit, written).
template <class L, class D>
__global__ void k_ce_bwd(const L* logits, const int32_t* targets, const float* lse, const float* dloss, D* dlogits,
                         bool acc, bool bf, int64_t N, int64_t V) {
  const L* l = logits + blockIdx.x * V;
  D* d = dlogits + blockIdx.x * V;
  const int32_t t = targets[blockIdx.x];
  const float z = lse[blockIdx.x], scale = t == -100 ? 0.f : *dloss / static_cast<float>(N);  // -100: ignored
  if (V % 4 == 0) {
    for (int64_t v = threadIdx.x; v < V / 4; v += blockDim.x) {
      const float4 x = ldv4(l, v, bf);
      st1(d, 4 * v, scale * (expf(x.x - z) - (4 * v == t ? 1.f : 0.f)), acc, bf);
      st1(d, 4 * v + 1, scale * (expf(x.y - z) - (4 * v + 1 == t ? 1.f : 0.f)), acc, bf);
      st1(d, 4 * v + 2, scale * (expf(x.z - z) - (4 * v + 2 == t ? 1.f : 0.f)), acc, bf);
      st1(d, 4 * v + 3, scale * (expf(x.w - z) - (4 * v + 3 == t ? 1.f : 0.f)), acc, bf);
    }
  } else {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
      st1(d, v, scale * (expf(ld1(l, v, bf) - z) - (v == t ? 1.f : 0.f)), acc, bf);
  }
}
// out = sum of x[n] / denom, summed in f64 by one block (deterministic).
__global__ void k_mean(const float* x, int64_t n, float* out, int64_t denom) {
  __shared__ double sh[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    s = threadIdx.x < blockDim.x / 32 ? sh[threadIdx.x] : 0.0;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x == 0) *out = static_cast<float>(s / static_cast<double>(denom));
  }
}
__global__ void k_mean_of_partials(const double* part, unsigned g, int64_t n, float* out) {
  double s = 0.0;
  for (unsigned i = 0; i < g; ++i) s += part[i];
  *out = static_cast<float>(s / static_cast<double>(n));  // n = 0: NaN, as on the CPU
}
__global__ void k_mse_bwd(const float* p, const float* t, const float* dloss, Grad dp, int64_t n) {
  float scale = 2.f * *dloss / static_cast<float>(n);
  GRID_STRIDE(i, n) dp.p[i] = (dp.acc ? dp.p[i] : 0.f) + scale * (p[i] - t[i]);
}

}  // namespace

// denom (0: N) divides the rows' loss sum and the gradient instead of N (a chunk of a larger batch).
void CudaBackend::cross_entropy_fwd(const float* logits, const int32_t* targets, float* lse, int64_t N, int64_t V,
                                    float* loss, int64_t denom) {
  ce_fwd(logits, targets, lse, N, V, loss, denom);
}

void CudaBackend::cross_entropy_fwd16(const uint16_t* logits, const int32_t* targets, float* lse, int64_t N, int64_t V,
                                      float* loss, int64_t denom) {
  ce_fwd(logits, targets, lse, N, V, loss, denom);
}

void CudaBackend::cross_entropy_bwd16(const uint16_t* logits, const int32_t* targets, const float* lse,
                                      const float* dloss, Grad dlogits, int64_t N, int64_t V, int64_t denom) {
  ce_bwd(logits, targets, lse, dloss, dlogits, N, V, denom);
}

void CudaBackend::cross_entropy_fused16(uint16_t* logits, const int32_t* targets, int64_t N, int64_t V,
                                        const float* dloss, float* loss, int64_t denom) {
  const int64_t D = denom > 0 ? denom : N;
  ZR_CHECK(fuses_cross_entropy(V) && reinterpret_cast<uintptr_t>(logits) % 8 == 0,
           "fused cross-entropy needs 16-bit logits, 8-byte aligned, V % 4 == 0");
  if (!N) return set_scalar(loss, 0.f);
  DevBuf<float> rows(static_cast<size_t>(N), false);
  k_ce_fused<<<static_cast<unsigned>(N), 1024, 0, cuda::stream()>>>(logits, targets, rows.p, dloss, D, V,
                                                                    mm_ == DType::BF16);
  ZR_CUDA(cudaGetLastError());
  k_mean<<<1, 1024, 0, cuda::stream()>>>(rows.p, N, loss, D);
  ZR_CUDA(cudaGetLastError());
}

// the mean loss stays on the device: no wait for the forward
template <class L>
void CudaBackend::ce_fwd(const L* logits, const int32_t* targets, float* lse, int64_t N, int64_t V, float* loss,
                         int64_t denom) {
  if (!N) return set_scalar(loss, 0.f);
  DevBuf<float> rows(static_cast<size_t>(N), false);
  k_ce_fwd<<<static_cast<unsigned>(N), kTpb, 0, cuda::stream()>>>(logits, targets, rows.p, lse, V, mm_ == DType::BF16);
  ZR_CUDA(cudaGetLastError());
  k_mean<<<1, 1024, 0, cuda::stream()>>>(rows.p, N, loss, denom > 0 ? denom : N);
  ZR_CUDA(cudaGetLastError());
}

void CudaBackend::cross_entropy_bwd(const float* logits, const int32_t* targets, const float* lse, const float* dloss,
                                    Grad dlogits, int64_t N, int64_t V, int64_t denom) {
  ce_bwd(logits, targets, lse, dloss, dlogits, N, V, denom);
}

template <class L>
void CudaBackend::ce_bwd(const L* logits, const int32_t* targets, const float* lse, const float* dloss, Grad dlogits,
                         int64_t N, int64_t V, int64_t denom) {
  if (!N) return;
  const int64_t D = denom > 0 ? denom : N;
  const bool bf = mm_ == DType::BF16;
  if (dlogits.h)
    k_ce_bwd<<<static_cast<unsigned>(N), kTpb, 0, cuda::stream()>>>(logits, targets, lse, dloss, dlogits.h, false, bf,
                                                                    D, V);
  else
    k_ce_bwd<<<static_cast<unsigned>(N), kTpb, 0, cuda::stream()>>>(logits, targets, lse, dloss, dlogits.p, dlogits.acc,
                                                                    bf, D, V);
  ZR_CUDA(cudaGetLastError());
}

void CudaBackend::mse_fwd(const float* pred, const float* target, int64_t n, float* loss) {
  // On the device, so a CUDA graph can capture it: the blocks' partials, then one thread adds them in block
  // order (the same sum every run, as the host's sum of the partials would be).
  const unsigned g = n ? std::min<unsigned>(grid_for(n), 1024) : 1;
  DevBuf<double> acc(g, !n);
  if (n) k_sq_diff_sum<<<g, kTpb, 0, cuda::stream()>>>(pred, target, n, acc.p);
  k_mean_of_partials<<<1, 1, 0, cuda::stream()>>>(acc.p, g, n, loss);
  ZR_CUDA(cudaGetLastError());
}

void CudaBackend::mse_bwd(const float* pred, const float* target, const float* dloss, Grad dpred, int64_t n) {
  LAUNCH(k_mse_bwd, n, pred, target, dloss, dpred, n);
}

}  // namespace zerorun::kernels
