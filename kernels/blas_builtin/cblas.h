// The part of the CBLAS interface zerorun calls, for builds without OpenBLAS (ZERORUN_BUILTIN_GEMM: the Windows
// cross-build): kernels/cpu/blas_builtin.cc implements it. Same names and enum values as OpenBLAS's cblas.h.
#pragma once
#ifdef __cplusplus
extern "C" {
#endif
enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 };
typedef int blasint;
void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, blasint M, blasint N,
                 blasint K, float alpha, const float* A, blasint lda, const float* B, blasint ldb, float beta, float* C,
                 blasint ldc);
void openblas_set_num_threads(int n);
char* openblas_get_config(void);
#ifdef __cplusplus
}
#endif
