// Dense matrix products on CPU through OpenBLAS, and the linear layer built on them.
#include <cblas.h>

#include "cpu_kernels.h"

namespace zerorun::kernels::cpu {

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, const float* B, float beta,
          float* C) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
              ta ? M : K, B, tb ? K : N, beta, C, N);
}

void linear_fwd(const float* x, const float* w, const float* b, float* y, int64_t N, int64_t in, int64_t out) {
  gemm(false, true, N, out, in, 1.f, x, w, 0.f, y);
  if (b) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < out; ++o) y[n * out + o] += b[o];
  }
}

void linear_bwd(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t N,
                int64_t in, int64_t out) {
  if (dx) gemm(false, false, N, in, out, 1.f, dy, w, 1.f, dx);
  if (dw) gemm(true, false, out, in, N, 1.f, dy, x, 1.f, dw);
  if (db) {
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < out; ++o) {
      float s = 0.f;
      for (int64_t n = 0; n < N; ++n) s += dy[n * out + o];
      db[o] += s;
    }
  }
}

}  // namespace zerorun::kernels::cpu
