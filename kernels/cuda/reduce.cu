// Reductions on the GPU: sums of squares with the finite check (per-block partials added in order), scaling. Part of
// the CUDA backend (backend_cuda.h).
#include "backend_cuda.h"

namespace zerorun::kernels {
namespace {

__global__ void k_scale(float* x, float s, int64_t n) { GRID_STRIDE(i, n) x[i] *= s; }
// Sum of squares in f64 (a huge finite value cannot overflow it) and a flag for any inf/nan, one read; per-block
// partials (part[blockIdx.x]) that the host adds in block order, so the norm has the same bits every run.
__global__ void k_finite_sumsq(const float* x, int64_t n, double* part, int* bad) {
  double s = 0.0;
  bool ok = true;
  if (aligned16(x)) {
    auto add = [&](const float4& v) {
      ok = ok && isfinite(v.x) && isfinite(v.y) && isfinite(v.z) && isfinite(v.w);
      s += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
    };
    const int64_t n4 = n / 4, stride = (int64_t)gridDim.x * blockDim.x;
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (; i + stride < n4; i += 2 * stride) {  // two loads in flight a thread
      const float4 a = ld4(x, i), b = ld4(x, i + stride);
      add(a);
      add(b);
    }
    if (i < n4) add(ld4(x, i));
    for (int64_t i = n / 4 * 4 + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
      ok = ok && isfinite(x[i]);
      s += (double)x[i] * x[i];
    }
  } else {
    GRID_STRIDE(i, n) {
      ok = ok && isfinite(x[i]);
      s += (double)x[i] * x[i];
    }
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (!__all_sync(0xffffffffu, ok) && (threadIdx.x & 31) == 0) atomicExch(bad, 1);
  __shared__ double sh[32];
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t += sh[w];
    part[blockIdx.x] = t;
  }
}
__global__ void k_finite(const float* x, int64_t n, int* bad) {
  GRID_STRIDE(i, n) if (!isfinite(x[i])) atomicExch(bad, 1);
}

}  // namespace

void CudaBackend::scale_inplace(float* x, float s, int64_t n) { LAUNCH(k_scale, n, x, s, n); }

double CudaBackend::sum_squares(const float* x, int64_t n) { return sum_sq(x, nullptr, n); }

double CudaBackend::finite_sum_squares(const float* x, int64_t n, bool* finite) {
  *finite = true;
  if (n <= 0) return 0.0;
  const unsigned g = std::min<unsigned>(grid_for((n + 3) / 4), 1024);
  DevBuf<double> acc(g + 1);  // the blocks' partials, then the inf/nan flag (an int): one zero-fill, one copy back
  int* bad = reinterpret_cast<int*>(acc.p + g);
  k_finite_sumsq<<<g, kTpb, 0, cuda::stream()>>>(x, n, acc.p, bad);
  ZR_CUDA(cudaGetLastError());
  std::vector<double> h(g + 1);
  cuda::fetch(h.data(), acc.p, h.size() * sizeof(double));
  int b = 0;
  std::memcpy(&b, &h[g], sizeof b);
  *finite = b == 0;
  double sum = 0.0;
  for (unsigned i = 0; i < g; ++i) sum += h[i];
  return *finite ? sum : 0.0;
}

bool CudaBackend::all_finite(const float* x, int64_t n) {
  DevBuf<int> bad(1);
  LAUNCH(k_finite, n, x, n, bad.p);
  int h = 0;
  cuda::fetch(&h, bad.p, sizeof h);
  return h == 0;
}

double CudaBackend::sum_sq(const float* a, const float* b, int64_t n) {
  if (!n) return 0.0;
  const unsigned g = std::min<unsigned>(grid_for(n), 1024);
  DevBuf<double> acc(g, false);  // every block writes its partial
  k_sq_diff_sum<<<g, kTpb, 0, cuda::stream()>>>(a, b, n, acc.p);
  ZR_CUDA(cudaGetLastError());
  std::vector<double> h(g);
  cuda::fetch(h.data(), acc.p, h.size() * sizeof(double));
  double sum = 0.0;
  for (double v : h) sum += v;
  return sum;
}

}  // namespace zerorun::kernels
