// The CPU GEMM (kernels/cpu/gemm.cc) gives bitwise the same C with 1 and 2 OpenMP threads at sizes where it splits
// rows across threads, so each thread's BLAS call runs concurrently with the other's: a BLAS that is not thread-safe
// (an OpenBLAS built without USE_LOCKING / USE_OPENMP used from OpenMP threads) races there and fails this test, while
// tests that never call it concurrently pass. Runs on Linux (OpenBLAS) and under wine (the builtin GEMM).
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace {
std::vector<float> run(int threads, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const std::vector<float>& A,
                       const std::vector<float>& B, const std::vector<float>& C0, float beta) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  std::vector<float> C = C0;
  for (int rep = 0; rep < 3; ++rep) {  // several calls: a race shows up in some of them
    C = C0;
    zerorun::kernels::cpu::gemm(ta, tb, M, N, K, 1.25f, A.data(), B.data(), beta, C.data());
  }
  omp_set_num_threads(saved);
  return C;
}
}  // namespace

TEST_CASE("GEMM: 2 threads give bitwise the result of 1 thread above the split threshold", "[gemm][threads]") {
  // M*N*K well above gemm.cc's 2^18 split threshold and OpenBLAS's own multithreading threshold; M not a multiple of
  // the thread count, so the row chunks differ in size.
  const int64_t M = 301, N = 257, K = 190;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      std::vector<float> A(static_cast<size_t>(M * K)), B(static_cast<size_t>(K * N)), C0(static_cast<size_t>(M * N));
      for (auto& x : A) x = u(rng);
      for (auto& x : B) x = u(rng);
      for (auto& x : C0) x = u(rng);
      const float beta = tb ? 0.5f : 0.f;
      const std::vector<float> c1 = run(1, ta, tb, M, N, K, A, B, C0, beta);
      const std::vector<float> c2 = run(2, ta, tb, M, N, K, A, B, C0, beta);
      CAPTURE(ta, tb);
      CHECK(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)) == 0);
      // And it is the product (a double-precision reference), so equal-but-wrong cannot pass.
      double worst = 0;
      for (int64_t i = 0; i < M; i += 7)
        for (int64_t j = 0; j < N; j += 5) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k)
            s += static_cast<double>(ta ? A[static_cast<size_t>(k * M + i)] : A[static_cast<size_t>(i * K + k)]) *
                 (tb ? B[static_cast<size_t>(j * K + k)] : B[static_cast<size_t>(k * N + j)]);
          const double ref = 1.25 * s + beta * C0[static_cast<size_t>(i * N + j)];
          worst = std::max(worst, std::fabs(ref - c2[static_cast<size_t>(i * N + j)]));
        }
      CHECK(worst < 1e-3);
    }
}
