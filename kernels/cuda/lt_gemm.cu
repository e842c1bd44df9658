// See lt_gemm.h. Row-major C [M, N] is column-major C^T [N, M] = op(B)^T op(A)^T,
// so cuBLASLt's A is our B and its B our A; the bias epilogue adds bias[row]
// of the column-major result, i.e. bias[column] of ours, and its BGRADB sums our op(A) over K.
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
  workspace_ = cuda::device_alloc(workspace_bytes_, dev_, "the cuBLASLt workspace");
}

LtGemm::~LtGemm() {
  plans_.clear();
  if (h_) cublasLtDestroy(h_);
  if (workspace_) cuda::device_free(workspace_, workspace_bytes_, dev_);
}

namespace {
cudaDataType_t cuda_type(DType d) { return d == DType::BF16 ? CUDA_R_16BF : d == DType::F16 ? CUDA_R_16F : CUDA_R_32F; }

// Per Epilogue::Kind (in its order): cuBLASLt's epilogue — its matrix D is our C transposed, so our columns are its
// rows, our op(A) its B —, the name in errors, and whether it takes the bias (gradient) vector / the kept GELU input.
struct KindInfo {
  cublasLtEpilogue_t lt;
  const char* name;
  bool vec, aux;
};
constexpr KindInfo kKinds[] = {
    {CUBLASLT_EPILOGUE_DEFAULT, "", false, false},
    {CUBLASLT_EPILOGUE_BIAS, " with a bias epilogue", true, false},
    {CUBLASLT_EPILOGUE_BGRADB, " with a bias-gradient epilogue", true, false},
    {CUBLASLT_EPILOGUE_GELU_AUX, " with a GELU epilogue", false, true},
    {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, " with a GELU + bias epilogue", true, true},
    {CUBLASLT_EPILOGUE_DGELU, " with a GELU-gradient epilogue", false, true},
    {CUBLASLT_EPILOGUE_DGELU_BGRAD, " with a GELU-gradient + bias-gradient epilogue", true, true},
};
static_assert(sizeof kKinds / sizeof kKinds[0] == Epilogue::DGeluBiasGrad + 1, "one row per Epilogue::Kind");
const KindInfo& info(Epilogue::Kind k) { return kKinds[k]; }
}  // namespace

LtGemm::Plan& LtGemm::plan(DType dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                           float beta, DType cdt, int64_t ldc, const Epilogue& e) {
  const std::array<int64_t, 14> key = {static_cast<int64_t>(dt),
                                       ta,
                                       tb,
                                       M,
                                       N,
                                       K,
                                       lda,
                                       ldb,
                                       ldc,
                                       beta != 0.f,
                                       static_cast<int64_t>(e.kind),
                                       static_cast<int64_t>(cdt),
                                       static_cast<int64_t>(e.vdt),
                                       e.ldaux};
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  auto p = std::make_unique<Plan>();
  const cudaDataType_t t = cuda_type(dt);
  ZR_CUBLAS(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  if (e.kind != Epilogue::None) {  // the pointers themselves are set per run
    const cublasLtEpilogue_t ep = info(e.kind).lt;
    ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
    if (info(e.kind).vec) {
      const cudaDataType_t bt = cuda_type(e.vdt);
      ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    if (info(e.kind).aux) {
      const int32_t at = cuda_type(cdt);
      ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &at, sizeof at));
      ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &e.ldaux, sizeof e.ldaux));
    }
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
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h_, p->op, p->a, p->b, p->c, p->c, pref, 1, &heur, &found);
  ZR_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0, "cuBLASLt has no algorithm for a ", M, "x", K, " by ", K, "x", N,
           " product into ", dtype_name(cdt), info(e.kind).name, " (", dtype_name(e.vdt), " vector)");
  p->algo = heur.algo;
  return *plans_.emplace(key, std::move(p)).first->second;
}

void LtGemm::run(DType dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B,
                 int64_t ldb, float beta, void* C, DType cdt, int64_t ldc, const Epilogue& e) {
  ZR_CHECK(dt == DType::BF16 || dt == DType::F16, "LtGemm takes bf16 or f16 operands");
  ZR_CHECK(cdt == DType::F32 || cdt == dt, "LtGemm writes f32 or the operands' type");
  ZR_CHECK(e.vdt == DType::F32 || e.vdt == dt, "LtGemm's bias vector is f32 or the operands' type");
  ZR_CHECK(!info(e.kind).vec || e.vec, "LtGemm: the epilogue needs its vector");
  ZR_CHECK(e.kind == Epilogue::None || e.kind == Epilogue::Bias || e.kind == Epilogue::BiasGradA || beta == 0.f,
           "LtGemm: this epilogue needs beta = 0");
  const bool gelu = info(e.kind).aux;
  ZR_CHECK(!gelu || (e.aux && cdt == dt && e.ldaux >= N && e.ldaux % 8 == 0),
           "LtGemm: the GELU epilogues need a 16-bit output and a kept input with a row stride >= N, divisible by 8");
  if (M == 0 || N == 0) return;
  Plan& p = plan(dt, ta, tb, M, N, K, lda, ldb, beta, cdt, ldc, e);
  if (info(e.kind).vec)
    ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e.vec, sizeof e.vec));
  if (gelu)
    ZR_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &e.aux, sizeof e.aux));
  const float alpha = 1.f;
  const void* cin = beta != 0.f && e.addend ? e.addend : C;
  ZR_CUBLAS(cublasLtMatmul(h_, p.op, &alpha, B, p.a, A, p.b, &beta, cin, p.c, C, p.c, &p.algo, workspace_,
                           workspace_bytes_, cuda::stream()));
}

}  // namespace zerorun::kernels
