// Dense matrix products on CPU through OpenBLAS, and the linear layer built on them.
#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "cpu_kernels.h"

namespace zerorun::kernels::cpu {

// One thread pool: OpenBLAS runs single-threaded and large products are
// split by rows of C across OpenMP threads (OpenBLAS's own pool spinning
// against OpenMP's made small runs 2-3x slower). Each row of C is computed
// by one sgemm call, and the split depends only on the thread count.
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, const float* B, float beta,
          float* C) {
  if (M == 0 || N == 0) return;
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
  const int64_t lda = ta ? M : K, ldb = tb ? K : N;
  const auto opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  int threads = omp_get_max_threads();
  if (threads <= 1 || M * N * K < (1 << 18) || M < 2 * threads) {
    cblas_sgemm(CblasRowMajor, opa, opb, M, N, K, alpha, A, lda, B, ldb, beta, C, N);
    return;
  }
  const int64_t chunk = (M + threads - 1) / threads;
#pragma omp parallel for schedule(static, 1)
  for (int t = 0; t < threads; ++t) {
    int64_t m0 = t * chunk, m1 = std::min(M, m0 + chunk);
    if (m0 >= m1) continue;
    const float* Ap = ta ? A + m0 : A + m0 * K;
    cblas_sgemm(CblasRowMajor, opa, opb, m1 - m0, N, K, alpha, Ap, lda, B, ldb, beta, C + m0 * N, N);
  }
}

void linear_fwd(const float* x, const float* w, const float* b, float* y, int64_t N, int64_t in, int64_t out) {
  gemm(false, true, N, out, in, 1.f, x, w, 0.f, y);
  if (b) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < out; ++o) y[n * out + o] += b[o];
  }
}

void linear_bwd(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t N, int64_t in,
                int64_t out, bool dx_acc, bool dw_acc, bool db_acc) {
  if (dx) gemm(false, false, N, in, out, 1.f, dy, w, dx_acc ? 1.f : 0.f, dx);
  if (dw) gemm(true, false, out, in, N, 1.f, dy, x, dw_acc ? 1.f : 0.f, dw);
  if (db) {
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < out; ++o) {
      float s = 0.f;
      for (int64_t n = 0; n < N; ++n) s += dy[n * out + o];
      db[o] = (db_acc ? db[o] : 0.f) + s;
    }
  }
}

}  // namespace zerorun::kernels::cpu
