// The CUDA backend's class and what its op-family files share (launch helpers, block reductions, 16-bit loads and
// stores, the column sums): internal to kernels/cuda. The class's methods live with their family's kernels
// (elementwise.cu, norm.cu, embedding.cu, loss.cu, attention.cu, optim.cu, reduce.cu, gemm.cu; rope.cu and
// qk_norm.cu hold those families' kernels), mirroring kernels/cpu; backend_cuda.cu makes the backend.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cub/device/device_radix_sort.cuh>
#include <map>
#include <memory>
#include <type_traits>
#include <vector>

#include "attention_cached.h"
#include "cuda_check.h"
#include "device_util.h"
#include "flash_attention.h"
#include "kernels/backend.h"
#include "kernels/optim_math.h"
#include "lt_gemm.h"
#include "qk_norm.h"
#include "rope.h"
#include "zerorun/cuda_rt.h"
#include "zerorun/profile.h"

namespace zerorun::kernels {
namespace {

constexpr int kTpb = 256;
inline unsigned grid_for(int64_t n) {
  int64_t b = (n + kTpb - 1) / kTpb;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(b, 1 << 20)));
}
#define GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)
#define LAUNCH(kernel, n, ...)                                       \
  do {                                                               \
    if ((n) > 0) {                                                   \
      kernel<<<grid_for(n), kTpb, 0, cuda::stream()>>>(__VA_ARGS__); \
      ZR_CUDA(cudaGetLastError());                                   \
    }                                                                \
  } while (0)

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide reductions for blocks of kTpb threads.
__device__ inline float block_sum(float v) {
  __shared__ float sh[32];
  v = warp_sum(v);
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? sh[lane] : 0.f;
  if (w == 0) v = warp_sum(v);
  if (threadIdx.x == 0) sh[0] = v;
  __syncthreads();
  float r = sh[0];
  __syncthreads();
  return r;
}
// ---- elementwise --------------------------------------------------------------
// Memory-bound maps run 4 elements per thread through float4 loads when every
// pointer is 16-byte aligned (views at odd offsets take the scalar kernel).
__host__ __device__ inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
__device__ inline float4 ld4(const float* p, int64_t i) { return reinterpret_cast<const float4*>(p)[i]; }
__device__ inline void st4(float* p, int64_t i, float4 v) { reinterpret_cast<float4*>(p)[i] = v; }
// Four values rounded to 16 bits, packed in order into one 8-byte word.
__device__ inline uint2 pack4_16(bool bf, float a, float b, float c, float d) {
  return make_uint2(static_cast<uint32_t>(to16_bits(bf, a)) | (static_cast<uint32_t>(to16_bits(bf, b)) << 16),
                    static_cast<uint32_t>(to16_bits(bf, c)) | (static_cast<uint32_t>(to16_bits(bf, d)) << 16));
}
// Loads and stores for f32 or 16-bit (bf: bfloat16, else fp16) storage; 16-bit stores never accumulate.
template <class T>
__device__ inline float ld1(const T* p, int64_t i, bool bf) {
  if constexpr (sizeof(T) == 2)
    return from16(bf, p[i]);
  else
    return p[i];
}
template <class T>
__device__ inline float4 ldv4(const T* p, int64_t i, bool bf) {
  if constexpr (sizeof(T) == 2) {
    const ushort4 u = reinterpret_cast<const ushort4*>(p)[i];
    return make_float4(from16(bf, u.x), from16(bf, u.y), from16(bf, u.z), from16(bf, u.w));
  } else {
    return reinterpret_cast<const float4*>(p)[i];
  }
}
template <class T>
__device__ inline void st1(T* p, int64_t i, float v, bool acc, bool bf) {
  if constexpr (sizeof(T) == 2)
    p[i] = to16_bits(bf, v);
  else
    p[i] = acc ? p[i] + v : v;
}
template <class T>
__device__ inline void stv4(T* p, int64_t i, float4 v, bool acc, bool bf) {
  if constexpr (sizeof(T) == 2) {
    reinterpret_cast<ushort4*>(p)[i] =
        make_ushort4(to16_bits(bf, v.x), to16_bits(bf, v.y), to16_bits(bf, v.z), to16_bits(bf, v.w));
  } else {
    if (acc) {
      const float4 o = reinterpret_cast<const float4*>(p)[i];
      v = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);
    }
    reinterpret_cast<float4*>(p)[i] = v;
  }
}
// Column sums of an N x C matrix, two at a time (layernorm's dw and db share a
// pass), without atomics so results are bitwise reproducible: blocks of 32
// columns x a chunk of rows write partial sums, a second kernel adds the
// chunks in order. F(row, col) returns the two values to sum.
struct ColOf {  // sums dy itself (bias gradients, broadcast add)
  const float* dy;
  __device__ float2 operator()(int64_t r, int64_t c, int64_t C) const { return {dy[r * C + c], 0.f}; }
};
constexpr int kColRows = 8;  // threadIdx.y extent
template <class F>
__global__ void k_col_partial(F f, int64_t N, int64_t C, int64_t rows_per, float* part) {
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows_per, r1 = min(N, r0 + rows_per);
  float s0 = 0.f, s1 = 0.f;
  if (c < C)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColRows) {
      float2 v = f(r, c, C);
      s0 += v.x;
      s1 += v.y;
    }
  __shared__ float sh[2][kColRows][33];
  sh[0][threadIdx.y][threadIdx.x] = s0;
  sh[1][threadIdx.y][threadIdx.x] = s1;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float a = 0.f, b = 0.f;
    for (int k = 0; k < kColRows; ++k) a += sh[0][k][threadIdx.x], b += sh[1][k][threadIdx.x];
    part[(2 * blockIdx.y) * C + c] = a;
    part[(2 * blockIdx.y + 1) * C + c] = b;
  }
}
// Adds the chunks' partial sums: block (32 columns, kFinalRows), each thread row sums every
// kFinalRows-th chunk, then the rows are added in a fixed order (reproducible, no atomics).
constexpr int kFinalRows = 32;
__global__ void k_col_final(const float* part, int64_t chunks, int64_t C, float* o0, float* o1, bool acc) {
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  float a = 0.f, b = 0.f;
  if (c < C)
    for (int64_t k = threadIdx.y; k < chunks; k += kFinalRows) a += part[2 * k * C + c], b += part[(2 * k + 1) * C + c];
  __shared__ float sh[2][kFinalRows][33];
  sh[0][threadIdx.y][threadIdx.x] = a;
  sh[1][threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    a = 0.f, b = 0.f;
    for (int k = 0; k < kFinalRows; ++k) a += sh[0][k][threadIdx.x], b += sh[1][k][threadIdx.x];
    if (o0) o0[c] = (acc ? o0[c] : 0.f) + a;
    if (o1) o1[c] = (acc ? o1[c] : 0.f) + b;
  }
}
void col_final(const float* part, int64_t chunks, int64_t C, float* o0, float* o1, bool acc) {
  if (C <= 0) return;
  k_col_final<<<static_cast<unsigned>((C + 31) / 32), dim3(32, kFinalRows), 0, cuda::stream()>>>(part, chunks, C, o0,
                                                                                                 o1, acc);
  ZR_CUDA(cudaGetLastError());
}
unsigned rows_grid(int64_t N) { return static_cast<unsigned>((N + 7) / 8); }  // 8 warps per 256-thread block
// Per-block partial sums (part[blockIdx.x]), added on the host in block order: the same sum every run.
__global__ void k_sq_diff_sum(const float* a, const float* b, int64_t n, double* part) {
  float s = 0.f;
  GRID_STRIDE(i, n) {
    float d = b ? a[i] - b[i] : a[i];
    s += d * d;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) part[blockIdx.x] = static_cast<double>(s);
}
// Row chunking of the column sums: at least 64 rows per block, at most ~128 chunks.
inline int64_t col_rows_per(int64_t N) { return std::max<int64_t>(64, (N + 127) / 128); }
// o0[c] (+)= sum_r F(r, c).x and o1[c] (+)= sum_r F(r, c).y (either may be null; acc: add, else overwrite).
template <class F>
void column_sums(F f, int64_t N, int64_t C, float* o0, float* o1, bool acc = true) {
  if (C <= 0) return;
  if (N <= 0) {
    if (!acc) {
      if (o0) ZR_CUDA(cudaMemsetAsync(o0, 0, static_cast<size_t>(C) * 4, cuda::stream()));
      if (o1) ZR_CUDA(cudaMemsetAsync(o1, 0, static_cast<size_t>(C) * 4, cuda::stream()));
    }
    return;
  }
  const int64_t rows_per = col_rows_per(N), chunks = (N + rows_per - 1) / rows_per;
  DevBuf<float> part(static_cast<size_t>(2 * chunks * C), false);  // every entry is written
  dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(chunks));
  k_col_partial<<<grid, dim3(32, kColRows), 0, cuda::stream()>>>(f, N, C, rows_per, part.p);
  ZR_CUDA(cudaGetLastError());
  col_final(part.p, chunks, C, o0, o1, acc);
}

}  // namespace

class CudaBackend : public Backend {
 public:
  CudaBackend();
  void set_deterministic(bool on) override { deterministic_ = on; }
  bool deterministic() const override { return deterministic_; }
  const char* name() const override { return "cuda"; }
  void set_matmul_dtype(DType dt) override {
    ZR_CHECK(dt == DType::F32 || dt == DType::BF16 || dt == DType::F16, "matmul dtype must be f32, bf16 or f16");
    mm_ = dt;
  }
  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, const float* B, float beta,
            float* C) override;
  void gemm_strided(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                    int64_t sA, const float* B, int64_t ldb, int64_t sB, float beta, float* C, int64_t ldc, int64_t sC,
                    int64_t batch) override;
  void linear_fwd(const float* x, const float* w, const float* b, float* y, int64_t N, int64_t in, int64_t out,
                  uint16_t* x16, uint16_t* w16, uint16_t* y16, const uint16_t* b16, uint16_t* gelu16,
                  const float* residual) override;
  void linear_bwd(const float* x, const float* w, const float* dy, Grad dx, Grad dwg, Grad dbg, int64_t N, int64_t in,
                  int64_t out, const uint16_t* x16, const uint16_t* w16, const uint16_t* dy16,
                  const uint16_t* dgelu16) override;
  DType matmul_dtype() const override { return mm_; }
  bool activations16() const override { return mm_ != DType::F32; }
  bool fuses_gelu() const override { return mm_ != DType::F32; }
  bool fuses_residual() const override { return mm_ != DType::F32; }
  bool attention16(const AttnDims& d) const override { return tensor_core_attention(d); }
  void act_fwd16(Act act, Src x, Dst y, int64_t n) override;
  void widen16(const uint16_t* h, float* f, int64_t n) override;
  void act_bwd16(Act act, Src x, Src dy, Grad dx, int64_t n) override;
  void layernorm_fwd16(const float* x, const float* w, const float* b, uint16_t* y, float* mean, float* rstd, int64_t N,
                       int64_t C, float eps) override;
  void add_fwd(const float* a, const float* b, float* y, int64_t n, int64_t nb) override;
  void add_bwd(const float* dy, Grad da, Grad db, int64_t n, int64_t nb) override;
  void swiglu_fwd(Src g, Src u, Dst y, int64_t n) override;
  void swiglu_bwd(Src g, Src u, Src dy, Grad dg, Grad du, int64_t n) override;
  void geglu_fwd(Src g, Src u, Dst y, int64_t n) override;
  void geglu_bwd(Src g, Src u, Src dy, Grad dg, Grad du, int64_t n) override;
  void unary_fwd(cpu::Unary op, float a, const float* x, float* y, int64_t n) override;
  void dropout(const rng::Dropout& d, const float* x, Grad y, int64_t n) override;
  void unary_bwd(cpu::Unary op, float a, const float* x, const float* dy, Grad dx, int64_t n) override;
  void zero_rows(const int32_t* ids, int32_t value, float* x, int64_t N, int64_t C) override;
  void qk_norm_fwd(const float* x, const float* wq, const float* wk, float* y, float* rstd, int64_t N, int64_t H,
                   int64_t K, int64_t D, bool full, float eps) override;
  void qk_norm_bwd(const float* x, const float* wq, const float* wk, const float* rstd, const float* dy, Grad dx,
                   float* dwq, float* dwk, int64_t N, int64_t H, int64_t K, int64_t D, bool full) override;
  void mul_fwd(Src a, Src b, Dst y, int64_t n) override;
  void mul_bwd(Src a, Src b, Src dy, Grad da, Grad db, int64_t n) override;
  void act_fwd(Act act, const float* x, float* y, int64_t n) override;
  void act_bwd(Act act, const float* x, const float* dy, Grad dx, int64_t n) override;
  void layernorm_fwd(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, int64_t N,
                     int64_t C, float eps) override;
  void layernorm_bwd(const float* x, const float* w, const float* mean, const float* rstd, const float* dy, Grad dx,
                     float* dw, float* db, int64_t N, int64_t C) override;
  void layernorm_bwd16(const float* x, const float* w, const float* mean, const float* rstd, const uint16_t* dy,
                       Grad dx, float* dw, float* db, int64_t N, int64_t C) override;
  template <class D>
  void norm_bwd(const float* x, const float* w, const float* mean, const float* rstd, const D* dy, Grad dx, float* dw,
                float* db, int64_t N, int64_t C, bool bf);
  void rmsnorm_fwd(const float* x, const float* w, float* y, float* rstd, int64_t N, int64_t C, float eps) override;
  void rmsnorm_fwd16(const float* x, const float* w, uint16_t* y, float* rstd, int64_t N, int64_t C,
                     float eps) override;
  void rmsnorm_bwd(const float* x, const float* w, const float* rstd, const float* dy, Grad dx, float* dw, int64_t N,
                   int64_t C) override;
  void rmsnorm_bwd16(const float* x, const float* w, const float* rstd, const uint16_t* dy, Grad dx, float* dw,
                     int64_t N, int64_t C) override;
  void attention_fwd(const float* qkv, float* out, float* probs, const AttnDims& d) override;
  const float* dropped(const float* P, float* scratch, int64_t b, const AttnDims& d);
  void attention_bwd(const float* qkv, const float* probs, const float* dout, Grad dqkv_g, const AttnDims& d) override;
  void attention_cached(const float* qkv, float* kc, float* vc, float* out, const AttnDims& d, int64_t len,
                        int64_t cap) override;
  void rope_fwd(Src qkv, Dst out, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D, const cpu::RopeFreqs& f,
                bool repeat, const int32_t* pos, int64_t n_pos) override;
  void rope_bwd(Src dout, Grad dqkv, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D, const cpu::RopeFreqs& f,
                bool repeat, const int32_t* pos, int64_t n_pos) override;
  bool has_flash_attention(const AttnDims& d) const override;
  void flash_attention_fwd(Src qkv, Dst out, float* lse, const AttnDims& d) override;
  void flash_attention_bwd(Src qkv, Src out, const float* lse, Src dout, Grad dqkv, const AttnDims& d) override;
  bool ids_in_range(const int32_t* ids, int64_t n, int64_t V) override;
  void check_ids_deferred(const int32_t* ids, int64_t n, int64_t V, const std::string& message,
                          int32_t ignore) override;
  void embedding_fwd(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C, int64_t V) override;
  void embedding_bwd(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t C, int64_t V) override;
  void pos_embedding_fwd(const float* table, float* out, int64_t B, int64_t T, int64_t C) override;
  void pos_embedding_bwd(const float* dout, float* dtable, int64_t B, int64_t T, int64_t C) override;
  void cross_entropy_fwd(const float* logits, const int32_t* targets, float* lse, int64_t N, int64_t V, float* loss,
                         int64_t denom = 0) override;
  void cross_entropy_fwd16(const uint16_t* logits, const int32_t* targets, float* lse, int64_t N, int64_t V,
                           float* loss, int64_t denom = 0) override;
  void cross_entropy_bwd16(const uint16_t* logits, const int32_t* targets, const float* lse, const float* dloss,
                           Grad dlogits, int64_t N, int64_t V, int64_t denom = 0) override;
  bool fuses_cross_entropy(int64_t V) const override { return mm_ != DType::F32 && V % 4 == 0; }
  void cross_entropy_fused16(uint16_t* logits, const int32_t* targets, int64_t N, int64_t V, const float* dloss,
                             float* loss, int64_t denom = 0) override;
  template <class L>
  void ce_fwd(const L* logits, const int32_t* targets, float* lse, int64_t N, int64_t V, float* loss, int64_t denom);
  void cross_entropy_bwd(const float* logits, const int32_t* targets, const float* lse, const float* dloss,
                         Grad dlogits, int64_t N, int64_t V, int64_t denom = 0) override;
  template <class L>
  void ce_bwd(const L* logits, const int32_t* targets, const float* lse, const float* dloss, Grad dlogits, int64_t N,
              int64_t V, int64_t denom);
  void mse_fwd(const float* pred, const float* target, int64_t n, float* loss) override;
  void mse_bwd(const float* pred, const float* target, const float* dloss, Grad dpred, int64_t n) override;
  void adam_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2, float eps,
                 float wd, bool adamw, bool bias_correction, int64_t step) override;
  void adam_step_rounded(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                         float eps, float wd, bool adamw, bool bias_correction, int64_t step, DType dt, float* r32,
                         uint16_t* r16, const int32_t* slots, int64_t base) override;
  void sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float dampening, float wd,
                bool nesterov, bool first_step) override;
  void scale_inplace(float* x, float s, int64_t n) override;
  void accumulate(float* acc, const float* x, int64_t n) override;
  double sum_squares(const float* x, int64_t n) override;
  double finite_sum_squares(const float* x, int64_t n, bool* finite) override;
  bool all_finite(const float* x, int64_t n) override;
  void round_to(DType dt, const float* src, float* dst, int64_t n) override;
  void round_to16(DType dt, const float* src, uint16_t* dst, float* dst32, int64_t n, const int32_t* slots,
                  int64_t base) override;
  void set_scalar(float* p, float v) override;
  float get_scalar(const float* p) override;

 private:
  void pass_grad(const float* src, Grad dst, int64_t n);
  float* zeroed_unless_acc(Grad g, int64_t n);
  void round16_colsum(const float* dy, uint16_t* d, int64_t N, int64_t C, float* db, bool acc);
  template <class D>
  bool ln_bwd_fused(const float* x, const float* w, const float* mean, const float* rstd, const D* dy, Grad dx,
                    float* dw, float* db, int64_t N, int64_t C, bool bf);
  void bias_grad16(const uint16_t* dy, int64_t N, int64_t C, float* db, bool acc);
  unsigned* done_counters(int64_t n);
  DevBuf<float> widened(Src x, int64_t n);
  // 16-bit runs use the tensor-core kernels where the head size allows.
  bool tensor_core_attention(const AttnDims& d) const { return mm_ != DType::F32 && flash::tc_supported(d); }
  double sum_sq(const float* a, const float* b, int64_t n);
  using Half = DevBuf<uint16_t>;  // bf16 or f16 bits, per mm_
  Half to16(const float* x, int64_t n) const;
  void round16(const float* x, uint16_t* d, int64_t n) const;
  static void round_any(bool bf, const float* x, uint16_t* d16, float* d32, int64_t n, const int32_t* slots = nullptr,
                        int64_t base = 0);
  void widen16_slots(DType dt, const uint16_t* h, float* dst32, int64_t n, const int32_t* slots) override;
  LtGemm& lt();
  void gemm16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda, int64_t sA,
              const void* B, int64_t ldb, int64_t sB, float beta, float* C, int64_t ldc, int64_t sC, int64_t batch);
  void raise_deferred(bool fetch);
  static int dev_of_backend() {
    int d = 0;
    ZR_CUDA(cudaGetDevice(&d));
    return d;
  }
  // The blocks of 256 threads of `kernel` the GPU runs at once (SMs x blocks an SM; at least 1) with `smem` bytes
  // of dynamic shared memory (the most any launch of it takes, allowed here), worked out on its first launch and
  // kept.
  template <class K>
  int64_t wave_blocks(K kernel, size_t smem = 0) {
    auto [it, fresh] = waves_.try_emplace(reinterpret_cast<const void*>(kernel), 0);
    if (fresh) {
      int sms = 0, per = 0;
      ZR_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev_of_backend()));
      if (smem > 48 * 1024)
        ZR_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      ZR_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kernel, 256, smem));
      it->second = std::max<int64_t>(1, static_cast<int64_t>(sms) * per);
    }
    return it->second;
  }
  DType mm_ = DType::F32;
  DevBuf<unsigned> done_;  // zeroed completion counters of the one-kernel column sums (each re-zeroes its own)
  // Attention's backward sums dQ with atomics in one kernel (5 products); ZERORUN_ATTN_ATOMICS=0 picks the
  // two atomic-free kernels (7 products, dQ the same bits every run).
  bool attn_atomics_ = true;
  // Grouped-query heads split the atomics path's key-block backward over the query heads (flash::tc_backward's
  // gqa_split: 1.11-1.29x faster on an H100 at the probe's grouped-query shapes); ZERORUN_ATTN_GQA_SPLIT=0: not.
  bool attn_gqa_split_ = true;
  // ZERORUN_DETERMINISTIC=1 / set_deterministic: the embedding gradient through a sort instead of atomics, and
  // attention's backward atomic-free, so a run gives the same bits every time.
  bool deterministic_ = false;
  std::unique_ptr<LtGemm> lt_;
  cublasHandle_t h_{};
  int* ids_flag_ = nullptr;                // device: 0, or 1 + the index of the first failed deferred check
  int* ids_flag_host_ = nullptr;           // pinned copy read at get_scalar
  std::vector<std::string> ids_messages_;  // code - 1 -> message
  std::map<std::string, int> ids_codes_;
  int64_t ids_unread_ = 0;                // checks queued since the flag was last read
  std::map<const void*, int64_t> waves_;  // wave_blocks, per kernel
};

}  // namespace zerorun::kernels
