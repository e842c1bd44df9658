// See lt_linear.h. Row-major y [N, out] is column-major y^T [out, N] = w x^T,
// with w stored column-major as [in, out] (transposed by the op) and x as
// [in, N]; the bias epilogue adds bias[row] of the column-major result.
#include "cuda_check.h"
#include "lt_linear.h"
#include "zerorun/cuda_rt.h"

namespace zerorun::kernels {

struct LtLinear::Plan {
  cublasLtMatmulDesc_t op{};
  cublasLtMatrixLayout_t a{}, b{}, c{};
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

LtLinear::LtLinear() {
  ZR_CUBLAS(cublasLtCreate(&h_));
  workspace_bytes_ = 32u << 20;
  int dev = 0;
  ZR_CUDA(cudaGetDevice(&dev));
  workspace_ = cuda::device_alloc(workspace_bytes_, dev);
}

LtLinear::~LtLinear() {
  plans_.clear();
  if (h_) cublasLtDestroy(h_);
  // workspace_ stays with the caching allocator (process-lifetime backend)
}

void LtLinear::forward(DType dt, const void* x16, const void* w16, const float* bias, float* y, int64_t N, int64_t in,
                       int64_t out) {
  ZR_CHECK(dt == DType::BF16 || dt == DType::F16, "LtLinear takes bf16 or f16 operands");
  auto key = std::make_tuple(static_cast<int>(dt), N, in, out, bias != nullptr);
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    auto p = std::make_unique<Plan>();
    const cudaDataType_t t = dt == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
    ZR_CUBLAS(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (bias) {
      cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
      ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
      cudaDataType_t bt = CUDA_R_32F;
      ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    ZR_CUBLAS(cublasLtMatrixLayoutCreate(&p->a, t, static_cast<uint64_t>(in), static_cast<uint64_t>(out), in));
    ZR_CUBLAS(cublasLtMatrixLayoutCreate(&p->b, t, static_cast<uint64_t>(in), static_cast<uint64_t>(N), in));
    ZR_CUBLAS(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, static_cast<uint64_t>(out), static_cast<uint64_t>(N), out));
    cublasLtMatmulPreference_t pref{};
    ZR_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, decltype(&cublasLtMatmulPreferenceDestroy)>
        pref_guard(pref, &cublasLtMatmulPreferenceDestroy);
    ZR_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                                   sizeof workspace_bytes_));
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    ZR_CUBLAS(cublasLtMatmulAlgoGetHeuristic(h_, p->op, p->a, p->b, p->c, p->c, pref, 1, &heur, &found));
    ZR_CHECK(found > 0, "cuBLASLt has no algorithm for a ", N, "x", in, " by ", out, "x", in, " product");
    p->algo = heur.algo;
    it = plans_.emplace(key, std::move(p)).first;
  }
  Plan& p = *it->second;
  if (bias) ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  const float alpha = 1.f, beta = 0.f;
  ZR_CUBLAS(cublasLtMatmul(h_, p.op, &alpha, w16, p.a, x16, p.b, &beta, y, p.c, y, p.c, &p.algo, workspace_,
                           workspace_bytes_, 0));
}

}  // namespace zerorun::kernels
