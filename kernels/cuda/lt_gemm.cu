// See lt_gemm.h. Row-major C [M, N] is column-major C^T [N, M] = op(B)^T op(A)^T,
// so cuBLASLt's A is our B and its B our A; the bias epilogue adds bias[row]
// of the column-major result, i.e. bias[column] of ours.
#include <cstdlib>
#include <cstring>
#include <vector>

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
bool tuning_enabled() {
  const char* e = std::getenv("ZERORUN_LT_TUNE");
  return !(e && std::strcmp(e, "0") == 0);
}

struct Events {  // RAII pair for timing candidates
  cudaEvent_t a{}, b{};
  Events() {
    ZR_CUDA(cudaEventCreate(&a));
    ZR_CUDA(cudaEventCreate(&b));
  }
  ~Events() {
    cudaEventDestroy(b);
    cudaEventDestroy(a);
  }
};
}  // namespace

LtGemm::Plan& LtGemm::plan(DType dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda,
                           const void* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias) {
  const std::array<int64_t, 11> key = {static_cast<int64_t>(dt), ta, tb, M, N, K, lda, ldb, ldc, beta != 0.f,
                                       bias != nullptr};
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  auto p = std::make_unique<Plan>();
  const cudaDataType_t t = dt == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  ZR_CUBLAS(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  if (bias) {
    const cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
    ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    const cudaDataType_t bt = CUDA_R_32F;
    ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  }
  auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  // Column-major views: our B [K, N] (or [N, K] when tb) is cuBLASLt's A, our A its B.
  ZR_CUBLAS(cublasLtMatrixLayoutCreate(&p->a, t, u(tb ? K : N), u(tb ? N : K), ldb));
  ZR_CUBLAS(cublasLtMatrixLayoutCreate(&p->b, t, u(ta ? M : K), u(ta ? K : M), lda));
  ZR_CUBLAS(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, u(N), u(M), ldc));
  cublasLtMatmulPreference_t pref{};
  ZR_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, decltype(&cublasLtMatmulPreferenceDestroy)>
      pref_guard(pref, &cublasLtMatmulPreferenceDestroy);
  ZR_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                                 sizeof workspace_bytes_));
  const bool tune = tuning_enabled();
  std::vector<cublasLtMatmulHeuristicResult_t> heur(tune ? 8 : 1);
  int found = 0;
  ZR_CUBLAS(cublasLtMatmulAlgoGetHeuristic(h_, p->op, p->a, p->b, p->c, p->c, pref, static_cast<int>(heur.size()),
                                           heur.data(), &found));
  ZR_CHECK(found > 0, "cuBLASLt has no algorithm for a ", M, "x", K, " by ", K, "x", N, " product");
  p->algo = heur[0].algo;
  if (found > 1) {
    // Candidates run on the real operands; a product that accumulates (beta != 0) writes into scratch instead
    // of C, so tuning never changes results.
    const size_t cbytes = sizeof(float) * static_cast<size_t>((M - 1) * ldc + N);
    float* out = C;
    void* scratch = nullptr;
    if (beta != 0.f) out = static_cast<float*>(scratch = cuda::device_alloc(cbytes, dev_));
    Events ev;
    const float alpha = 1.f;
    float best = 0.f;
    for (int i = 0; i < found; ++i) {
      if (heur[i].state != CUBLAS_STATUS_SUCCESS) continue;
      auto go = [&] {
        return cublasLtMatmul(h_, p->op, &alpha, B, p->a, A, p->b, &beta, out, p->c, out, p->c, &heur[i].algo,
                              workspace_, workspace_bytes_, 0);
      };
      if (go() != CUBLAS_STATUS_SUCCESS) continue;
      ZR_CUDA(cudaEventRecord(ev.a));
      bool ok = true;
      for (int r = 0; r < 3 && ok; ++r) ok = go() == CUBLAS_STATUS_SUCCESS;
      ZR_CUDA(cudaEventRecord(ev.b));
      ZR_CUDA(cudaEventSynchronize(ev.b));
      float ms = 0.f;
      ZR_CUDA(cudaEventElapsedTime(&ms, ev.a, ev.b));
      if (ok && (best == 0.f || ms < best)) best = ms, p->algo = heur[i].algo;
    }
    if (scratch) cuda::device_free(scratch, cbytes, dev_);
  }
  return *plans_.emplace(key, std::move(p)).first->second;
}

void LtGemm::run(DType dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B,
                 int64_t ldb, float beta, float* C, int64_t ldc, const float* bias) {
  ZR_CHECK(dt == DType::BF16 || dt == DType::F16, "LtGemm takes bf16 or f16 operands");
  ZR_CHECK(!bias || beta == 0.f, "LtGemm: the bias epilogue needs beta = 0");
  if (M == 0 || N == 0) return;
  Plan& p = plan(dt, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, bias);
  if (bias) ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  const float alpha = 1.f;
  ZR_CUBLAS(cublasLtMatmul(h_, p.op, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.c, &p.algo, workspace_,
                           workspace_bytes_, 0));
}

}  // namespace zerorun::kernels
