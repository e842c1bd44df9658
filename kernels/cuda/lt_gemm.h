// cuBLASLt products for the linear layer in 16-bit runs: row-major
// C (+)= op(A) op(B) with 16-bit operands, fp32 accumulation, C in fp32 or
// the operands' 16-bit type, optionally with an epilogue fused into the product: the bias added, the bias
// gradient summed from op(A), GELU (+ bias) keeping its input, or GELU's gradient (+ its bias gradient) from
// that kept input. Plans (descriptors + the heuristic's first algorithm) are cached per shape. Timing the
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

// What cuBLASLt does to the product on its way out (row-major terms; C is [M, N]).
struct Epilogue {
  enum Kind {
    None,
    Bias,          // C = AB + bias[N] (bias read, `vec`)
    BiasGradA,     // C = AB (+ beta C); vec[M] = sum over K of op(A) (written; the bias gradient of a weight product)
    GeluAux,       // aux = AB; C = gelu_tanh(aux)  (beta = 0)
    GeluAuxBias,   // aux = AB + bias[N]; C = gelu_tanh(aux)  (beta = 0)
    DGelu,         // C = AB * gelu_tanh'(aux)  (beta = 0)
    DGeluBiasGrad  // C = AB * gelu_tanh'(aux); vec[N] = column sums of C  (beta = 0)
  };
  Kind kind = None;
  void* vec = nullptr;  // the bias (read) or bias gradient (written)
  DType vdt = DType::F32;
  void* aux = nullptr;  // [M, N] in C's 16-bit type, row stride ldaux
  int64_t ldaux = 0;
  const void* addend = nullptr;  // beta != 0: the C added is read from here (C's layout) rather than from C itself
};

class LtGemm {
 public:
  LtGemm();
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;
  // Row-major C[M, N] = op(A) op(B) + beta C, then the epilogue. A, B hold `dt` (BF16 or F16) bits; op(A) is
  // [M, K] (A stored [K, M] when ta), op(B) [K, N]; lda/ldb/ldc are row strides. C holds `cdt` (F32 or dt).
  void run(DType dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B,
           int64_t ldb, float beta, void* C, DType cdt, int64_t ldc, const Epilogue& e);
  // The bias epilogue (bias null: none); the bias holds `bdt` (F32 or dt).
  void run(DType dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B,
           int64_t ldb, float beta, void* C, DType cdt, int64_t ldc, const void* bias, DType bdt = DType::F32) {
    Epilogue e;
    if (bias) e.kind = Epilogue::Bias, e.vec = const_cast<void*>(bias), e.vdt = bdt;
    run(dt, ta, tb, M, N, K, A, lda, B, ldb, beta, C, cdt, ldc, e);
  }
  void run(DType dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B,
           int64_t ldb, float beta, float* C, int64_t ldc, const float* bias) {
    run(dt, ta, tb, M, N, K, A, lda, B, ldb, beta, C, DType::F32, ldc, bias, DType::F32);
  }

 private:
  struct Plan;
  Plan& plan(DType dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, float beta,
             DType cdt, int64_t ldc, const Epilogue& e);
  cublasLtHandle_t h_{};
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  int dev_ = 0;
  std::map<std::array<int64_t, 14>, std::unique_ptr<Plan>> plans_;
};

}  // namespace zerorun::kernels
