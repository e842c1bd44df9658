// cuBLASLt products for the linear layer's forward in 16-bit runs: y = x w^T
// (+ bias fused as the GEMM epilogue), 16-bit operands, fp32 accumulation and
// output. Plans (descriptors + the heuristic's algorithm) are cached per shape.
#pragma once
#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "zerorun/dtype.h"

namespace zerorun::kernels {

class LtLinear {
 public:
  LtLinear();
  ~LtLinear();
  LtLinear(const LtLinear&) = delete;
  LtLinear& operator=(const LtLinear&) = delete;
  // x16 [N, in] and w16 [out, in] hold `dt` (BF16 or F16) bits; y [N, out] f32 = x w^T + bias (bias may be null).
  void forward(DType dt, const void* x16, const void* w16, const float* bias, float* y, int64_t N, int64_t in,
               int64_t out);

 private:
  struct Plan;
  cublasLtHandle_t h_{};
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<std::tuple<int, int64_t, int64_t, int64_t, bool>, std::unique_ptr<Plan>> plans_;
};

}  // namespace zerorun::kernels
