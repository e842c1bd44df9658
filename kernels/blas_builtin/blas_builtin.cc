// A portable single-precision GEMM with OpenBLAS's CBLAS entry points, linked instead of OpenBLAS where none is
// built (ZERORUN_BUILTIN_GEMM: the MinGW cross-build, whose Debian has no Windows OpenBLAS). Single-threaded and
// re-entrant (kernels/cpu/gemm.cc splits rows of C across OpenMP threads), and deterministic: every element of C is
// one sum over k in increasing order, whatever the row split. Slower than OpenBLAS (no hand-written kernels).
#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {
// C[M,N] = alpha * A[M,K] * B[K,N] + beta * C, all row-major and dense (B packed by the caller).
void kernel(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t sa_m, int64_t sa_k, const float* B,
            float beta, float* C, int64_t ldc) {
  constexpr int64_t NB = 256;  // columns of C a pass keeps in cache
  std::vector<float> acc(static_cast<size_t>(std::min(N, NB)));
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j0 = 0; j0 < N; j0 += NB) {
      const int64_t nb = std::min(NB, N - j0);
      std::fill(acc.begin(), acc.begin() + nb, 0.f);
      float* a = acc.data();
      for (int64_t k = 0; k < K; ++k) {
        const float x = A[i * sa_m + k * sa_k];
        const float* b = B + k * N + j0;
        for (int64_t j = 0; j < nb; ++j) a[j] += x * b[j];
      }
      float* c = C + i * ldc + j0;
      if (beta == 0.f)
        for (int64_t j = 0; j < nb; ++j) c[j] = alpha * a[j];
      else
        for (int64_t j = 0; j < nb; ++j) c[j] = alpha * a[j] + beta * c[j];
    }
  }
}
}  // namespace

extern "C" void cblas_sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint M, blasint N, blasint K,
                            float alpha, const float* A, blasint lda, const float* B, blasint ldb, float beta, float* C,
                            blasint ldc) {
  if (M <= 0 || N <= 0) return;
  if (order == CblasColMajor) {  // C^T = B^T A^T in row-major terms
    cblas_sgemm(CblasRowMajor, tb, ta, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc);
    return;
  }
  // op(B) as a dense K x N row-major block.
  std::vector<float> b(static_cast<size_t>(K) * static_cast<size_t>(N));
  for (int64_t k = 0; k < K; ++k)
    for (int64_t j = 0; j < N; ++j)
      b[static_cast<size_t>(k * N + j)] = tb == CblasNoTrans ? B[k * ldb + j] : B[j * ldb + k];
  const bool at = ta != CblasNoTrans;
  kernel(M, N, K, alpha, A, at ? 1 : lda, at ? lda : 1, b.data(), beta, C, ldc);
}

extern "C" void openblas_set_num_threads(int) {}

extern "C" char* openblas_get_config(void) {
  static char cfg[] = "zerorun builtin GEMM (no OpenBLAS; single-threaded per call)";
  return cfg;
}
