// cuBLASLt products for 16-bit runs: row-major C (+)= op(A) op(B) with 16-bit
// operands, fp32 accumulation and fp32 C, optionally with the bias added as
// the epilogue. Why not plain cublasGemmEx: the linear layer's three products
// (forward with bias, dx, dw) are where a 16-bit step spends most of its time,
// and cuBLASLt's first heuristic pick measured up to 2x slower than others on
// the H200 — so each shape's plan is autotuned once (the heuristic's top
// candidates timed on the real operands, the fastest kept; ZERORUN_LT_TUNE=0
// keeps the heuristic's first choice).
#pragma once
#include <cublasLt.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>

#include "zerorun/dtype.h"

namespace zerorun::kernels {

class LtGemm {
 public:
  LtGemm();
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;
  // Row-major C[M, N] = op(A) op(B) + beta C (+ bias[N] on every row; only with beta = 0). A, B hold `dt`
  // (BF16 or F16) bits; op(A) is [M, K] (A stored [K, M] when ta), op(B) [K, N]; lda/ldb/ldc are row strides.
  void run(DType dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B,
           int64_t ldb, float beta, float* C, int64_t ldc, const float* bias);

 private:
  struct Plan;
  Plan& plan(DType dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B,
             int64_t ldb, float beta, float* C, int64_t ldc, const float* bias);
  cublasLtHandle_t h_{};
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  int dev_ = 0;
  std::map<std::array<int64_t, 11>, std::unique_ptr<Plan>> plans_;
};

}  // namespace zerorun::kernels
