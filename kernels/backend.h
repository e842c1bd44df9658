// Kernel backends behind one interface, so ops and the engine dispatch on a
// tensor's device without #ifdefs: the CPU backend wraps kernels/cpu, the CUDA
// backend (kernels/cuda) runs on the device's compute stream, and a CPU-only
// build's stub reports that CUDA is not built. Signatures follow
// kernels/cpu/cpu_kernels.h: raw pointers + sizes; backward accumulates.
#pragma once
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/kernel_types.h"
#include "zerorun/dtype.h"
#include "zerorun/error.h"
#include "zerorun/memory.h"

namespace zerorun::kernels {

// Where a backward puts an input's gradient: acc adds to what is there; !acc
// overwrites, for gradients the executor has just allocated (no zero-fill
// first, no read of zeros: one write instead of a write, a read and a write).
// A 16-bit gradient (h, in the backend's matmul dtype; CUDA only) is always overwritten.
struct Grad {
  float* p = nullptr;
  bool acc = true;
  uint16_t* h = nullptr;
  Grad() = default;
  Grad(float* ptr, bool accumulate) : p(ptr), acc(accumulate) {}
  static Grad half(uint16_t* bits) {
    Grad g;
    g.h = bits;
    g.acc = false;
    return g;
  }
  explicit operator bool() const { return p != nullptr || h != nullptr; }
};
// A tensor as a kernel reads or writes it: f32 at p, or (p null) 16 bits in the backend's matmul dtype at h
// (16-bit activation storage, CUDA only).
struct Src {
  const float* p = nullptr;
  const uint16_t* h = nullptr;
};
struct Dst {
  float* p = nullptr;
  uint16_t* h = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, const float* B,
                    float beta, float* C) = 0;
  // Batched: `batch` products with element strides between them; lda/ldb/ldc are row strides.
  virtual void gemm_strided(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                            int64_t sA, const float* B, int64_t ldb, int64_t sB, float beta, float* C, int64_t ldc,
                            int64_t sC, int64_t batch) = 0;
  // y [N, out] = x [N, in] w^T (+ b). x16 / w16: where a 16-bit run (matmul_dtype() != F32) leaves x and w
  // rounded to that dtype (N * in, out * in elements) for the backward, or null; the backward takes them back.
  // x null: the input is already 16-bit, in x16; w null: the weight is, in w16. y null: the output is written in
  // 16 bits to y16. b16: the bias already in 16 bits, or null. The backward's dy null: the gradient is 16-bit, in dy16.
  // GELU fused into the products where fuses_gelu(): gelu16 non-null: y16 gets the linear's output and gelu16 its
  // tanh-GELU (both 16-bit); dgelu16 non-null: the linear's input is gelu(dgelu16), and dx (16-bit) gets the
  // gradient of dgelu16 instead, (dy w) * gelu'(dgelu16).
  // residual non-null (where fuses_residual(), f32 y): y = x w^T + b + residual, the residual add folded in.
  virtual void linear_fwd(const float* x, const float* w, const float* b, float* y, int64_t N, int64_t in, int64_t out,
                          uint16_t* x16, uint16_t* w16, uint16_t* y16, const uint16_t* b16, uint16_t* gelu16,
                          const float* residual) = 0;
  // dw / db: the parameter gradients, accumulated or (acc false: the executor's first write of the step) overwritten.
  virtual void linear_bwd(const float* x, const float* w, const float* dy, Grad dx, Grad dw, Grad db, int64_t N,
                          int64_t in, int64_t out, const uint16_t* x16, const uint16_t* w16, const uint16_t* dy16,
                          const uint16_t* dgelu16) = 0;
  // Whether linear_fwd / linear_bwd take gelu16 / dgelu16 (CUDA 16-bit runs: cuBLASLt's GELU epilogues; implies
  // activations16()).
  virtual bool fuses_gelu() const { return false; }
  virtual bool fuses_residual() const { return false; }
  // 16-bit activation storage (CUDA in 16-bit runs): outputs written in the matmul dtype, and which
  // ops can write 16-bit gradients (linear dx, act_bwd16, add_bwd without broadcast, cross_entropy_bwd, and
  // flash_attention_bwd where attention16 says so) through Grad::half.
  virtual bool activations16() const { return false; }
  // Whether flash attention at these sizes reads and writes 16-bit storage (tensor-core kernels).
  virtual bool attention16(const AttnDims&) const { return false; }
  // Activation from x into y, each f32 or 16-bit.
  virtual void act_fwd16(Act, Src, Dst, int64_t) { ZR_FAIL("16-bit activations are CUDA-only"); }
  // f[i] = the 16-bit h[i] as f32.
  virtual void widen16(const uint16_t*, float*, int64_t) { ZR_FAIL("16-bit activations are CUDA-only"); }
  // Its backward with x and dy each f32 or 16-bit.
  virtual void act_bwd16(Act, Src, Src, Grad, int64_t) { ZR_FAIL("16-bit activations are CUDA-only"); }
  // Cross-entropy over 16-bit logits (same contract as cross_entropy_fwd / _bwd).
  virtual void cross_entropy_fwd16(const uint16_t*, const int32_t*, float*, int64_t, int64_t, float*,
                                   int64_t /*denom*/ = 0) {
    ZR_FAIL("16-bit activations are CUDA-only");
  }
  virtual void cross_entropy_bwd16(const uint16_t*, const int32_t*, const float*, const float*, Grad, int64_t, int64_t,
                                   int64_t /*denom*/ = 0) {
    ZR_FAIL("16-bit activations are CUDA-only");
  }
  // Forward and backward at once where fuses_cross_entropy(V) (CUDA 16-bit runs): *loss = the mean loss, and the
  // 16-bit logits [N, V] overwritten with their gradient for d(loss) = *dloss (a device scalar).
  virtual bool fuses_cross_entropy(int64_t /*V*/) const { return false; }
  virtual void cross_entropy_fused16(uint16_t*, const int32_t*, int64_t, int64_t, const float*, float*,
                                     int64_t /*denom*/ = 0) {
    ZR_FAIL("fused cross-entropy is CUDA-only");
  }
  virtual void layernorm_fwd16(const float*, const float*, const float*, uint16_t*, float*, float*, int64_t, int64_t,
                               float) {
    ZR_FAIL("16-bit activations are CUDA-only");
  }
  // layernorm_bwd from a 16-bit output gradient.
  virtual void layernorm_bwd16(const float*, const float*, const float*, const float*, const uint16_t*, Grad, float*,
                               float*, int64_t, int64_t) {
    ZR_FAIL("16-bit activations are CUDA-only");
  }
  // rmsnorm with its output stored in 16 bits (read only by 16-bit products) / with a 16-bit dy.
  virtual void rmsnorm_fwd16(const float*, const float*, uint16_t*, float*, int64_t, int64_t, float) {
    ZR_FAIL("16-bit activations are CUDA-only");
  }
  virtual void rmsnorm_bwd16(const float*, const float*, const float*, const uint16_t*, Grad, float*, int64_t,
                             int64_t) {
    ZR_FAIL("16-bit activations are CUDA-only");
  }
  virtual void add_fwd(const float* a, const float* b, float* y, int64_t n, int64_t nb) = 0;
  virtual void add_bwd(const float* dy, Grad da, Grad db, int64_t n, int64_t nb) = 0;
  // y = a * b elementwise and its backward; each side f32, or 16-bit where activations16().
  virtual void mul_fwd(Src a, Src b, Dst y, int64_t n) = 0;
  virtual void mul_bwd(Src a, Src b, Src dy, Grad da, Grad db, int64_t n) = 0;
  // y = silu(g) * u (Llama's gated MLP) and its backward; each side f32, or 16-bit where activations16().
  virtual void swiglu_fwd(Src g, Src u, Dst y, int64_t n) = 0;
  virtual void swiglu_bwd(Src g, Src u, Src dy, Grad dg, Grad du, int64_t n) = 0;
  virtual void geglu_fwd(Src g, Src u, Dst y, int64_t n) = 0;
  virtual void geglu_bwd(Src g, Src u, Src dy, Grad dg, Grad du, int64_t n) = 0;
  virtual void unary_fwd(Unary op, float a, const float* x, float* y, int64_t n) = 0;
  virtual void unary_bwd(Unary op, float a, const float* x, const float* dy, Grad dx, int64_t n) = 0;
  // Dropout with a counter-based mask (kernels/counter_rng.h), forward (y fresh) and backward (x = dy, y = dx).
  virtual void dropout(const rng::Dropout& d, const float* x, Grad y, int64_t n) = 0;
  // x[i, :] = 0 for the rows i < N (of C) whose ids[i] == value.
  virtual void zero_rows(const int32_t* ids, int32_t value, float* x, int64_t N, int64_t C) = 0;
  virtual void act_fwd(Act act, const float* x, float* y, int64_t n) = 0;
  virtual void act_bwd(Act act, const float* x, const float* dy, Grad dx, int64_t n) = 0;
  virtual void layernorm_fwd(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                             int64_t N, int64_t C, float eps) = 0;
  virtual void layernorm_bwd(const float* x, const float* w, const float* mean, const float* rstd, const float* dy,
                             Grad dx, float* dw, float* db, int64_t N, int64_t C) = 0;
  virtual void rmsnorm_fwd(const float* x, const float* w, float* y, float* rstd, int64_t N, int64_t C, float eps) = 0;
  virtual void rmsnorm_bwd(const float* x, const float* w, const float* rstd, const float* dy, Grad dx, float* dw,
                           int64_t N, int64_t C) = 0;
  // cpu::qk_norm_fwd's layouts; dwq / dwk accumulate.
  virtual void qk_norm_fwd(const float* x, const float* wq, const float* wk, float* y, float* rstd, int64_t N,
                           int64_t H, int64_t K, int64_t D, bool full, float eps) = 0;
  virtual void qk_norm_bwd(const float* x, const float* wq, const float* wk, const float* rstd, const float* dy,
                           Grad dx, float* dwq, float* dwk, int64_t N, int64_t H, int64_t K, int64_t D, bool full) = 0;
  // Causal attention (cpu::AttnDims: grouped-query heads, scale, sliding window, soft-capping) keeping the
  // probabilities [B, H, T, T] for the backward.
  virtual void attention_fwd(const float* qkv, float* out, float* probs, const AttnDims& d) = 0;
  virtual void attention_bwd(const float* qkv, const float* probs, const float* dout, Grad dqkv, const AttnDims& d) = 0;
  // cpu::attention_cached: new tokens' keys and values appended to a cache [K, cap, D] (this backend's memory) and
  // their attention over it (incremental decoding).
  virtual void attention_cached(const float* qkv, float* kc, float* vc, float* out, const AttnDims& d, int64_t len,
                                int64_t cap) = 0;
  // Rotary embeddings (cpu::rope_fwd's layouts): qkv [B, T, (H + 2K) D] -> out [B, T, 3 H D] with the key/value
  // heads repeated, or the same layout as qkv (!repeat); the backward writes or adds (Grad) dqkv. Each side f32,
  // or 16-bit where activations16(). pos [B, T] (the device's memory; null: row r is at position r % T): each
  // row's position, in [0, n_pos) (the CUDA kernels clamp one outside; the CPU's is an error).
  virtual void rope_fwd(Src qkv, Dst out, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D, const RopeFreqs& f,
                        bool repeat, const int32_t* pos, int64_t n_pos) = 0;
  virtual void rope_bwd(Src dout, Grad dqkv, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D, const RopeFreqs& f,
                        bool repeat, const int32_t* pos, int64_t n_pos) = 0;
  // Flash-style attention (no T x T matrix): saves the per-row log-sum-exp
  // [B, H, T] instead of the probabilities; backward also reads the output.
  virtual bool has_flash_attention(const AttnDims&) const { return false; }
  // qkv, out and dout may be 16-bit where attention16(d); the output is then written as `out` asks.
  virtual void flash_attention_fwd(Src /*qkv*/, Dst /*out*/, float* /*lse*/, const AttnDims&) {
    ZR_FAIL("flash attention is CUDA-only");
  }
  virtual void flash_attention_bwd(Src /*qkv*/, Src /*out*/, const float* /*lse*/, Src /*dout*/, Grad /*dqkv*/,
                                   const AttnDims&) {
    ZR_FAIL("flash attention is CUDA-only");
  }
  // Returns false if any id is outside [0, V) (nothing is written then).
  virtual bool ids_in_range(const int32_t* ids, int64_t n, int64_t V) = 0;
  // Throws `message` if any id is outside [0, V): here, or (CUDA, no wait for the device) at the next get_scalar.
  // Embedding and cross-entropy kernels read nothing outside their tables for such ids in the meantime.
  // `ignore`: an id that passes too (cross-entropy's ignore_index -100 among targets; INT32_MIN: none).
  virtual void check_ids_deferred(const int32_t* ids, int64_t n, int64_t V, const std::string& message,
                                  int32_t ignore = INT32_MIN) {
    if (ignore == INT32_MIN) {
      ZR_CHECK(ids_in_range(ids, n, V), message);
      return;
    }
    std::vector<int32_t> kept;
    for (int64_t i = 0; i < n; ++i)
      if (ids[i] != ignore) kept.push_back(ids[i]);
    ZR_CHECK(ids_in_range(kept.data(), static_cast<int64_t>(kept.size()), V), message);
  }
  virtual void embedding_fwd(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C, int64_t V) = 0;
  virtual void embedding_bwd(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t C, int64_t V) = 0;
  virtual void pos_embedding_fwd(const float* table, float* out, int64_t B, int64_t T, int64_t C) = 0;
  virtual void pos_embedding_bwd(const float* dout, float* dtable, int64_t B, int64_t T, int64_t C) = 0;
  // Mean cross-entropy into *loss (a scalar on the backend's device); each row's log-sum-exp to lse[N] for the
  // backward. denom (0: N) divides the rows' sum instead of N: the rows are one chunk of a larger batch (the
  // executor's chunked head and loss), whose chunks' losses add up to the batch's mean.
  virtual void cross_entropy_fwd(const float* logits, const int32_t* targets, float* lse, int64_t N, int64_t V,
                                 float* loss, int64_t denom = 0) = 0;
  // dlogits += dloss * (exp(logits - lse) - onehot(target)) / denom (0: N)
  virtual void cross_entropy_bwd(const float* logits, const int32_t* targets, const float* lse, const float* dloss,
                                 Grad dlogits, int64_t N, int64_t V, int64_t denom = 0) = 0;
  // *loss (a scalar in the backend's memory, written on its stream: nothing waits) = mean((pred - target)^2).
  virtual void mse_fwd(const float* pred, const float* target, int64_t n, float* loss) = 0;
  virtual void mse_bwd(const float* pred, const float* target, const float* dloss, Grad dpred, int64_t n) = 0;
  virtual void adam_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                         float eps, float wd, bool adamw, bool bias_correction, int64_t step) = 0;
  virtual void sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float dampening,
                        float wd, bool nesterov, bool first_step) = 0;
  virtual void scale_inplace(float* x, float s, int64_t n) = 0;
  virtual void accumulate(float* acc, const float* x, int64_t n) = 0;  // acc += x
  virtual double sum_squares(const float* x, int64_t n) = 0;
  virtual bool all_finite(const float* x, int64_t n) = 0;
  // Both in one pass where the backend can: *finite = all_finite(x); the sum of squares (0 if not finite).
  virtual double finite_sum_squares(const float* x, int64_t n, bool* finite) {
    *finite = all_finite(x, n);
    return *finite ? sum_squares(x, n) : 0.0;
  }
  virtual void round_to(DType dt, const float* src, float* dst, int64_t n) = 0;  // dst = round(src)
  // dst = src rounded to `dt` (BF16 or F16) as 16-bit bits, and (dst32 non-null) as f32 values, in one pass; the
  // f32 values go where f32_copy_at(dst32, slots, base, i) says (slots null: dst32[i]).
  virtual void round_to16(DType dt, const float* src, uint16_t* dst, float* dst32, int64_t n, const int32_t* slots,
                          int64_t base) = 0;
  void round_to16(DType dt, const float* src, uint16_t* dst, float* dst32, int64_t n) {
    round_to16(dt, src, dst, dst32, n, nullptr, 0);
  }
  // The f32 copies of the 16-bit bits h[0, n) (`dt`), placed by slot as f32_copy_at(dst32, slots, 0, i) says:
  // the compact f32 copy brought up to date with an all-gathered 16-bit copy (the values it holds are those bits).
  virtual void widen16_slots(DType dt, const uint16_t* h, float* dst32, int64_t n, const int32_t* slots) = 0;
  // src rounded to `dt` into r32 (f32 values, placed as round_to16 says) and / or r16 (16-bit bits); either may be
  // null. A slot map needs the 16-bit copy (it exists only next to one).
  void round_copies(DType dt, const float* src, float* r32, uint16_t* r16, int64_t n, const int32_t* slots = nullptr,
                    int64_t base = 0) {
    ZR_CHECK(r16 || !slots, "rounded f32 copies by slot need the 16-bit copy");
    if (r16)
      round_to16(dt, src, r16, r32, n, slots, base);
    else if (r32)
      round_to(dt, src, r32, n);
  }
  // adam_step, then round_copies of the updated p, in the same pass where the backend can (the engine's
  // compute copies of its fp32 master weights); slots / base (see f32_copy_at) place the f32 copies.
  virtual void adam_step_rounded(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                                 float beta2, float eps, float wd, bool adamw, bool bias_correction, int64_t step,
                                 DType dt, float* r32, uint16_t* r16, const int32_t* slots = nullptr,
                                 int64_t base = 0) {
    adam_step(p, g, m, v, n, lr, beta1, beta2, eps, wd, adamw, bias_correction, step);
    round_copies(dt, p, r32, r16, n, slots, base);
  }
  // Adam/AdamW with DeepSpeed's bf16.bf16_master_weights_and_grads: g rounded to bf16, p (bf16 values in f32 storage)
  // rounded to bf16 after the update; m, v f32, or bf16 bits (bf16_states: bf16.bf16_optimizer_states).
  virtual void adam_step_bf16_master(float*, const float*, void*, void*, bool, int64_t, float, float, float, float,
                                     float, bool, bool, int64_t) {
    ZR_FAIL("bf16 master weights / optimizer states are implemented by the CPU optimizer only (CPU ranks)");
  }
  // Writes one f32 scalar (e.g. a loss gradient) at p.
  virtual void set_scalar(float* p, float v) = 0;
  virtual float get_scalar(const float* p) = 0;
  // Matrix-product inputs: F32 = exact fp32; BF16 / F16 = operands rounded to
  // that type for tensor cores, fp32 accumulation and output (16-bit training
  // on CUDA, as autocast does). The CPU backend always multiplies in fp32.
  virtual void set_matmul_dtype(DType) {}
  virtual DType matmul_dtype() const { return DType::F32; }
  // Deterministic: the same bits every run (no kernel that adds with atomics in a varying order). The CPU backend
  // always is; the CUDA one starts from ZERORUN_DETERMINISTIC=1.
  virtual void set_deterministic(bool) {}
  virtual bool deterministic() const { return true; }
};

Backend& backend(Device d);
Backend& cpu_backend();
Backend* cuda_backend();  // nullptr when CUDA is not built

}  // namespace zerorun::kernels
