// See lt_gemm.h. Row-major C [M, N] is column-major C^T [N, M] = op(B)^T op(A)^T,
// so cuBLASLt's A is our B and its B our A; the bias epilogue adds bias[row]
// of the column-major result, i.e. bias[column] of ours.
#include "cuda_check.h"
#include "lt_gemm.h"
#include "zerorun/cuda_rt.h"

namespace zerorun::kernels {

struct LtGemm::Plan {
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

LtGemm::LtGemm() {
  ZR_CUBLAS(cublasLtCreate(&h_));
  workspace_bytes_ = 32u << 20;
  ZR_CUDA(cudaGetDevice(&dev_));
  workspace_ = cuda::device_alloc(workspace_bytes_, dev_);
}

LtGemm::~LtGemm() {
  plans_.clear();
  if (h_) cublasLtDestroy(h_);
  if (workspace_) cuda::device_free(workspace_, workspace_bytes_, dev_);
}

namespace {
cudaDataType_t cuda_type(DType d) { return d == DType::BF16 ? CUDA_R_16BF : d == DType::F16 ? CUDA_R_16F : CUDA_R_32F; }
}  // namespace

LtGemm::Plan& LtGemm::plan(DType dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                           float beta, DType cdt, int64_t ldc, bool bias, DType bdt) {
  const std::array<int64_t, 13> key = {
      static_cast<int64_t>(dt), ta, tb, M, N, K, lda, ldb, ldc, beta != 0.f, bias, static_cast<int64_t>(cdt),
      static_cast<int64_t>(bdt)};
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  auto p = std::make_unique<Plan>();
  const cudaDataType_t t = cuda_type(dt);
  ZR_CUBLAS(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  if (bias) {
    const cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
    ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    const cudaDataType_t bt = cuda_type(bdt);  // the pointer itself is set per run
    ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
  }
  auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  // Column-major views: our B [K, N] (or [N, K] when tb) is cuBLASLt's A, our A its B.
  ZR_CUBLAS(cublasLtMatrixLayoutCreate(&p->a, t, u(tb ? K : N), u(tb ? N : K), ldb));
  ZR_CUBLAS(cublasLtMatrixLayoutCreate(&p->b, t, u(ta ? M : K), u(ta ? K : M), lda));
  ZR_CUBLAS(cublasLtMatrixLayoutCreate(&p->c, cuda_type(cdt), u(N), u(M), ldc));
  cublasLtMatmulPreference_t pref{};
  ZR_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, decltype(&cublasLtMatmulPreferenceDestroy)>
      pref_guard(pref, &cublasLtMatmulPreferenceDestroy);
  ZR_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                                 sizeof workspace_bytes_));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  ZR_CUBLAS(cublasLtMatmulAlgoGetHeuristic(h_, p->op, p->a, p->b, p->c, p->c, pref, 1, &heur, &found));
  ZR_CHECK(found > 0, "cuBLASLt has no algorithm for a ", M, "x", K, " by ", K, "x", N, " product into ",
           dtype_name(cdt), bias ? " with a bias epilogue" : "");
  p->algo = heur.algo;
  return *plans_.emplace(key, std::move(p)).first->second;
}

void LtGemm::run(DType dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B,
                 int64_t ldb, float beta, void* C, DType cdt, int64_t ldc, const void* bias, DType bdt) {
  ZR_CHECK(dt == DType::BF16 || dt == DType::F16, "LtGemm takes bf16 or f16 operands");
  ZR_CHECK(cdt == DType::F32 || cdt == dt, "LtGemm writes f32 or the operands' type");
  ZR_CHECK(bdt == DType::F32 || bdt == dt, "LtGemm's bias is f32 or the operands' type");
  ZR_CHECK(!bias || beta == 0.f, "LtGemm: the bias epilogue needs beta = 0");
  if (M == 0 || N == 0) return;
  Plan& p = plan(dt, ta, tb, M, N, K, lda, ldb, beta, cdt, ldc, bias != nullptr, bdt);
  if (bias) ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  const float alpha = 1.f;
  ZR_CUBLAS(cublasLtMatmul(h_, p.op, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.c, &p.algo, workspace_,
                           workspace_bytes_, 0));
}

}  // namespace zerorun::kernels
