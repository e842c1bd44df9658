// cuBLASLt products for the linear layer in 16-bit runs: row-major
// C (+)= op(A) op(B) with 16-bit operands, fp32 accumulation, C in fp32 or
// the operands' 16-bit type, optionally with the bias added as the epilogue. Plans (descriptors
// + the heuristic's first algorithm) are cached per shape. Timing the
// heuristic's top 8 candidates per shape was tried on the H200 and gained
// nothing at GPT-2 shapes (176k vs 178k tok/s), so the first choice is kept.
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
  // C holds `cdt` (F32 or dt); the bias holds `bdt` (F32 or dt).
  void run(DType dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B,
           int64_t ldb, float beta, void* C, DType cdt, int64_t ldc, const void* bias, DType bdt = DType::F32);
  void run(DType dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B,
           int64_t ldb, float beta, float* C, int64_t ldc, const float* bias) {
    run(dt, ta, tb, M, N, K, A, lda, B, ldb, beta, C, DType::F32, ldc, bias, DType::F32);
  }

 private:
  struct Plan;
  Plan& plan(DType dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, float beta,
             DType cdt, int64_t ldc, bool bias, DType bdt);
  cublasLtHandle_t h_{};
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  int dev_ = 0;
  std::map<std::array<int64_t, 13>, std::unique_ptr<Plan>> plans_;
};

}  // namespace zerorun::kernels
