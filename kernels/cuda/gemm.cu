// Products on the GPU: cuBLAS / cuBLASLt GEMMs, linear layers (bias and GELU epilogues, the bias gradient
// summed while dy is rounded to 16 bits). Part of the CUDA backend (backend_cuda.h).
#include "backend_cuda.h"

namespace zerorun::kernels {
namespace {

__global__ void k_bias_add(float* y, const float* b, int64_t n, int64_t out) { GRID_STRIDE(i, n) y[i] += b[i % out]; }
struct ColOf16 {  // sums a 16-bit dy (bias gradients from 16-bit gradients)
  const uint16_t* dy;
  bool bf;
  __device__ float2 operator()(int64_t r, int64_t c, int64_t C) const { return {from16(bf, dy[r * C + c]), 0.f}; }
};
// The end of a one-kernel column sum over a grid of (column blocks, row chunks): called by every thread of a block
// after its partials part[blockIdx.y * C + c] are written; the last block of each column block to finish (`done`:
// one zeroed counter per column block, re-zeroed by that block) adds every chunk's partial in chunk order into
// out[c] (acc: added to), for the columns its threads `own` — the same sums whichever block comes last.
__device__ inline void finish_columns(const float* part, unsigned* done, float* out, bool acc, int64_t C, int64_t c,
                                      bool own) {
  __shared__ bool last;
  __threadfence();  // this block's partials are visible before it counts itself done
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    last = atomicAdd(done + blockIdx.x, 1u) == gridDim.y - 1;
    if (last) done[blockIdx.x] = 0;  // for the next launch (kernels on the stream run one after another)
  }
  __syncthreads();
  if (!last || !own) return;
  __threadfence();
  // Four independent sums (chunk k into sum k % 4) keep four L2 reads in flight; the order is fixed.
  float v[4] = {0.f, 0.f, 0.f, 0.f};
  const int64_t nk = gridDim.y;
  int64_t k = 0;
  for (; k + 4 <= nk; k += 4)
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] += __ldcg(part + (k + u) * C + c);  // L2: other blocks wrote them
  for (; k < nk; ++k) v[k % 4] += __ldcg(part + k * C + c);
  out[c] = (acc ? out[c] : 0.f) + ((v[0] + v[1]) + (v[2] + v[3]));
}
// out[c] (+)= the column sums of a 16-bit N x C matrix (C % 8 == 0, 16-byte aligned rows) in one kernel: eight
// columns per thread from one 16-byte load, a block covering 256 columns x a chunk of rows writes its partial
// (part: chunks x C), finish_columns adds them.
__global__ void k_col16_sum(const uint16_t* dy, bool bf, int64_t N, int64_t C, int64_t rows_per, float* part,
                            unsigned* done, float* out, bool acc) {
  const int64_t c0 = blockIdx.x * 256 + threadIdx.x * 8;
  const int64_t r0 = blockIdx.y * rows_per, r1 = min(N, r0 + rows_per);
  float a[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (c0 < C)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColRows) {
      const uint4 u = *reinterpret_cast<const uint4*>(dy + r * C + c0);
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a[2 * i] += from16(bf, static_cast<uint16_t>(w[i] & 0xffffu));
        a[2 * i + 1] += from16(bf, static_cast<uint16_t>(w[i] >> 16));
      }
    }
  __shared__ float sh[kColRows][256 + 8];
#pragma unroll
  for (int i = 0; i < 8; ++i) sh[threadIdx.y][threadIdx.x * 8 + i] = a[i];
  __syncthreads();
  const int t = threadIdx.y * 32 + threadIdx.x;  // one column per thread
  const int64_t c = blockIdx.x * 256 + t;
  if (c < C) {
    float v = 0.f;
    for (int k = 0; k < kColRows; ++k) v += sh[k][t];
    part[blockIdx.y * C + c] = v;
  }
  finish_columns(part, done, out, acc, C, c, c < C);
}
// The linear backward's dy rounded to 16 bits (d) in the same pass that sums its
// columns for the bias gradient (partials as k_col_partial's, .y unused).
__global__ void k_to16_colsum(bool bf, const float* dy, uint16_t* d, int64_t N, int64_t C, int64_t rows_per,
                              float* part) {
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows_per, r1 = min(N, r0 + rows_per);
  float s0 = 0.f;
  if (c < C)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColRows) {
      const float v = dy[r * C + c];
      d[r * C + c] = to16_bits(bf, v);
      s0 += v;
    }
  __shared__ float sh[kColRows][33];
  sh[threadIdx.y][threadIdx.x] = s0;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float a = 0.f;
    for (int k = 0; k < kColRows; ++k) a += sh[k][threadIdx.x];
    part[(2 * blockIdx.y) * C + c] = a;
    part[(2 * blockIdx.y + 1) * C + c] = 0.f;
  }
}
// k_to16_colsum with four columns a thread (C % 4 == 0, 16-byte aligned rows): a block covers 128 columns, and the
// column sums are finished in the same kernel (finish_columns; part: chunks x C) instead of by col_final.
__global__ void k_to16_colsum4(bool bf, const float* dy, uint16_t* d, int64_t N, int64_t C, int64_t rows_per,
                               float* part, unsigned* done, float* out, bool acc) {
  const int64_t c0 = blockIdx.x * 128 + threadIdx.x * 4;
  const int64_t r0 = blockIdx.y * rows_per, r1 = min(N, r0 + rows_per);
  float a[4] = {0.f, 0.f, 0.f, 0.f};
  if (c0 < C)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColRows) {
      const float4 v = *reinterpret_cast<const float4*>(dy + r * C + c0);
      *reinterpret_cast<uint2*>(d + r * C + c0) = pack4_16(bf, v.x, v.y, v.z, v.w);
      a[0] += v.x, a[1] += v.y, a[2] += v.z, a[3] += v.w;
    }
  __shared__ float sh[kColRows][128 + 4];
#pragma unroll
  for (int i = 0; i < 4; ++i) sh[threadIdx.y][threadIdx.x * 4 + i] = a[i];
  __syncthreads();
  const int t = threadIdx.y * 32 + threadIdx.x;
  const int64_t c = blockIdx.x * 128 + t;
  if (t < 128 && c < C) {
    float v = 0.f;
    for (int k = 0; k < kColRows; ++k) v += sh[k][t];
    part[blockIdx.y * C + c] = v;
  }
  finish_columns(part, done, out, acc, C, c, t < 128 && c < C);
}

}  // namespace

void CudaBackend::gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, const float* B,
                       float beta, float* C) {
  gemm_strided(ta, tb, M, N, K, alpha, A, ta ? M : K, 0, B, tb ? K : N, 0, beta, C, N, 0, 1);
}

void CudaBackend::gemm_strided(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                               int64_t lda, int64_t sA, const float* B, int64_t ldb, int64_t sB, float beta, float* C,
                               int64_t ldc, int64_t sC, int64_t batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  if (mm_ == DType::F32) {
    // Row-major C = op(A) op(B)  <=>  column-major C^T = op(B)^T op(A)^T.
    ZR_CUBLAS(cublasSgemmStridedBatched(h_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                        static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, B,
                                        static_cast<int>(ldb), sB, A, static_cast<int>(lda), sA, &beta, C,
                                        static_cast<int>(ldc), sC, static_cast<int>(batch)));
    return;
  }
  // Round the stored extent of each operand once, then a tensor-core product.
  auto extent = [&](bool t, int64_t rows, int64_t cols, int64_t ld, int64_t st) {
    int64_t r = t ? cols : rows, c = t ? rows : cols;
    return (st ? (batch - 1) * st : 0) + (r - 1) * ld + c;
  };
  Half a = to16(A, extent(ta, M, K, lda, sA)), b = to16(B, extent(tb, K, N, ldb, sB));
  gemm16(ta, tb, M, N, K, alpha, a.p, lda, sA, b.p, ldb, sB, beta, C, ldc, sC, batch);
}

void CudaBackend::linear_fwd(const float* x, const float* w, const float* b, float* y, int64_t N, int64_t in,
                             int64_t out, uint16_t* x16, uint16_t* w16, uint16_t* y16, const uint16_t* b16,
                             uint16_t* gelu16, const float* residual) {
  if (N == 0 || out == 0) return;
  ZR_CHECK(!residual || (mm_ != DType::F32 && y), "linear_fwd: the fused residual needs 16-bit products, f32 y");
  if (mm_ != DType::F32) {  // cuBLASLt, bias fused as the epilogue; x rounded into x16 when the caller keeps it
    Half xh = x16 ? Half() : to16(x, N * in), wh = w16 ? Half() : to16(w, out * in);
    if (x16 && x) round16(x, x16, N * in);    // x null: x16 already holds the 16-bit input
    if (w16 && w) round16(w, w16, out * in);  // w null: so does w16 the weight
    profile::Scope ps(".. cublasLt linear fwd");
    const void *xp = x16 ? x16 : xh.p, *wp = w16 ? w16 : wh.p;
    if (y16) {  // 16-bit output: cuBLASLt's bias epilogue then takes a 16-bit bias
      Half bh = b && !b16 ? to16(b, out) : Half();
      const void* bp = b16 ? b16 : bh.p;
      if (gelu16) {  // y16 keeps GELU's input, gelu16 gets its output
        Epilogue e{bp ? Epilogue::GeluAuxBias : Epilogue::GeluAux, const_cast<void*>(bp), mm_, y16, out};
        lt().run(mm_, false, true, N, out, in, xp, in, wp, in, 0.f, gelu16, mm_, out, e);
      } else {
        lt().run(mm_, false, true, N, out, in, xp, in, wp, in, 0.f, y16, mm_, out, bp, mm_);
      }
    } else {
      ZR_CHECK(!gelu16, "linear_fwd: the fused GELU needs a 16-bit output");
      Epilogue e;  // y = x w^T (+ residual as C with beta 1) (+ b)
      if (b) e.kind = Epilogue::Bias, e.vec = const_cast<float*>(b), e.vdt = DType::F32;
      e.addend = residual;
      lt().run(mm_, false, true, N, out, in, xp, in, wp, in, residual ? 1.f : 0.f, y, DType::F32, out, e);
    }
    return;
  }
  ZR_CHECK(x && w && y && !y16 && !gelu16, "16-bit linear storage needs a 16-bit matmul dtype");
  gemm(false, true, N, out, in, 1.f, x, w, 0.f, y);
  if (b) LAUNCH(k_bias_add, N * out, y, b, N * out, out);
}

void CudaBackend::linear_bwd(const float* x, const float* w, const float* dy, Grad dx, Grad dwg, Grad dbg, int64_t N,
                             int64_t in, int64_t out, const uint16_t* x16, const uint16_t* w16, const uint16_t* dy16,
                             const uint16_t* dgelu16) {
  const float dx_beta = dx.acc ? 1.f : 0.f, dw_beta = dwg.acc ? 1.f : 0.f;
  float *dw = dwg.p, *db = dbg.p;
  const bool db_acc = dbg.acc;
  ZR_CHECK(!dx.h || mm_ != DType::F32, "16-bit input gradients need a 16-bit matmul dtype");
  ZR_CHECK(!dgelu16 || (dx.h && mm_ != DType::F32), "linear_bwd: the fused GELU gradient needs a 16-bit dx");
  if (mm_ == DType::F32) {
    if (dx) gemm(false, false, N, in, out, 1.f, dy, w, dx_beta, dx.p);
    if (dw) gemm(true, false, out, in, N, 1.f, dy, x, dw_beta, dw);
  } else {  // dy is rounded once for both products (summing its columns for db in the same pass)
    Half dyh = dy ? Half(static_cast<size_t>(N * out), false) : Half();
    if (!dy) {  // 16-bit gradient: used as it is, nothing to round
      if (db) bias_grad16(dy16, N, out, db, db_acc);
      db = nullptr;
    } else {
      if (db && N > 0) {
        round16_colsum(dy, dyh.p, N, out, db, db_acc);
        db = nullptr;
      } else {
        round16(dy, dyh.p, N * out);
      }
      dy16 = dyh.p;
    }
    if (dx) {
      Half wh = w16 ? Half() : to16(w, out * in);
      profile::Scope ps(".. cublasLt linear dx");
      if (dgelu16)  // the gradient of GELU's input: (dy w) * gelu'(dgelu16) in the epilogue
        lt().run(mm_, false, false, N, in, out, dy16, out, w16 ? w16 : wh.p, in, 0.f, dx.h, mm_, in,
                 Epilogue{Epilogue::DGelu, nullptr, mm_, const_cast<uint16_t*>(dgelu16), in});
      else if (dx.h)  // 16-bit gradient: written, never accumulated
        lt().run(mm_, false, false, N, in, out, dy16, out, w16 ? w16 : wh.p, in, 0.f, dx.h, mm_, in, nullptr);
      else
        lt().run(mm_, false, false, N, in, out, dy16, out, w16 ? w16 : wh.p, in, dx_beta, dx.p, in, nullptr);
    }
    if (dw) {
      Half xh = x16 ? Half() : to16(x, N * in);
      profile::Scope ps(".. cublasLt linear dw");
      lt().run(mm_, true, false, out, in, N, dy16, out, x16 ? x16 : xh.p, in, dw_beta, dw, in, nullptr);
    }
  }
  if (db) {
    profile::Scope ps(".. bias grad");
    column_sums(ColOf{dy}, N, out, db, nullptr, db_acc);
  }
}

// d = 16-bit dy and db[c] (+)= sum_r dy[r, c], one read of dy (acc false: db overwritten).
void CudaBackend::round16_colsum(const float* dy, uint16_t* d, int64_t N, int64_t C, float* db, bool acc) {
  profile::Scope ps(".. to16 + bias grad");
  const int64_t rows_per = col_rows_per(N), chunks = (N + rows_per - 1) / rows_per;
  if (C % 4 == 0 && aligned16(dy) && reinterpret_cast<uintptr_t>(d) % 8 == 0) {  // one kernel, its own final sum
    const int64_t cblocks = (C + 127) / 128;
    DevBuf<float> part(static_cast<size_t>(chunks * C), false);
    dim3 grid(static_cast<unsigned>(cblocks), static_cast<unsigned>(chunks));
    k_to16_colsum4<<<grid, dim3(32, kColRows), 0, cuda::stream()>>>(mm_ == DType::BF16, dy, d, N, C, rows_per, part.p,
                                                                    done_counters(cblocks), db, acc);
    ZR_CUDA(cudaGetLastError());
    return;
  }
  DevBuf<float> part(static_cast<size_t>(2 * chunks * C), false);
  dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(chunks));
  k_to16_colsum<<<grid, dim3(32, kColRows), 0, cuda::stream()>>>(mm_ == DType::BF16, dy, d, N, C, rows_per, part.p);
  ZR_CUDA(cudaGetLastError());
  col_final(part.p, chunks, C, db, nullptr, acc);
}

// db (+)= the column sums of the 16-bit dy [N, C]: one kernel (its last blocks add the chunks' partials).
void CudaBackend::bias_grad16(const uint16_t* dy, int64_t N, int64_t C, float* db, bool acc) {
  const bool bf = mm_ == DType::BF16;
  if (C % 8 != 0 || reinterpret_cast<uintptr_t>(dy) % 16 != 0 || N <= 0)
    return column_sums(ColOf16{dy, bf}, N, C, db, nullptr, acc);
  const int64_t rows_per = col_rows_per(N), chunks = (N + rows_per - 1) / rows_per, cblocks = (C + 255) / 256;
  DevBuf<float> part(static_cast<size_t>(chunks * C), false);
  dim3 grid(static_cast<unsigned>(cblocks), static_cast<unsigned>(chunks));
  k_col16_sum<<<grid, dim3(32, kColRows), 0, cuda::stream()>>>(dy, bf, N, C, rows_per, part.p, done_counters(cblocks),
                                                               db, acc);
  ZR_CUDA(cudaGetLastError());
}

LtGemm& CudaBackend::lt() {
  if (!lt_) lt_ = std::make_unique<LtGemm>();
  return *lt_;
}

void CudaBackend::gemm16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda,
                         int64_t sA, const void* B, int64_t ldb, int64_t sB, float beta, float* C, int64_t ldc,
                         int64_t sC, int64_t batch) {
  const cudaDataType_t t = mm_ == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  ZR_CUBLAS(cublasGemmStridedBatchedEx(
      h_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M),
      static_cast<int>(K), &alpha, B, t, static_cast<int>(ldb), sB, A, t, static_cast<int>(lda), sA, &beta, C,
      CUDA_R_32F, static_cast<int>(ldc), sC, static_cast<int>(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace zerorun::kernels
