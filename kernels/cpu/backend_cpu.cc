// The CPU backend: kernels/cpu behind the Backend interface; also picks the
// backend for a device.
#include <cblas.h>

#include <cstring>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/optim_math.h"
#include "zerorun/error.h"

namespace zerorun::kernels {
namespace {

// The CPU kernels accumulate; a gradient to be overwritten is zeroed first.
float* acc_ptr(Grad g, int64_t n) {
  ZR_CHECK(!g.h, "16-bit gradients are CUDA-only");
  if (g.p && !g.acc) std::memset(g.p, 0, static_cast<size_t>(n) * sizeof(float));
  return g.p;
}

// The CPU kernels read and write f32 storage only.
const float* f32(Src s, const char* op) {
  ZR_CHECK(s.p, op, ": 16-bit activations are CUDA-only");
  return s.p;
}
float* f32(Dst d, const char* op) {
  ZR_CHECK(d.p, op, ": 16-bit activations are CUDA-only");
  return d.p;
}

class CpuBackend : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, const float* B, float beta,
            float* C) override {
    cpu::gemm(ta, tb, M, N, K, alpha, A, B, beta, C);
  }
  void gemm_strided(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                    int64_t sA, const float* B, int64_t ldb, int64_t sB, float beta, float* C, int64_t ldc, int64_t sC,
                    int64_t batch) override {
    for (int64_t i = 0; i < batch; ++i)
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha,
                  A + i * sA, lda, B + i * sB, ldb, beta, C + i * sC, ldc);
  }
  void linear_fwd(const float* x, const float* w, const float* b, float* y, int64_t N, int64_t in, int64_t out,
                  uint16_t* /*x16*/, uint16_t* /*w16: fp32 products*/, uint16_t* y16, const uint16_t*, uint16_t* gelu16,
                  const float* residual) override {
    ZR_CHECK(x && w && y && !y16 && !gelu16, "16-bit activations are CUDA-only");
    cpu::linear_fwd(x, w, b, y, N, in, out);
    if (residual) cpu::add_fwd(residual, y, y, N * out, N * out);  // residual + y, as the add op sums them
  }
  void linear_bwd(const float* x, const float* w, const float* dy, Grad dx, Grad dw, Grad db, int64_t N, int64_t in,
                  int64_t out, const uint16_t* /*x16*/, const uint16_t* /*w16: fp32 products*/, const uint16_t* dy16,
                  const uint16_t* dgelu16) override {
    ZR_CHECK(dy && !dy16 && !dgelu16, "16-bit activations are CUDA-only");
    ZR_CHECK(!dx.h, "16-bit gradients are CUDA-only");
    // Overwritten gradients (acc false): products with beta 0, nothing zero-filled first or read.
    cpu::linear_bwd(x, w, dy, dx.p, dw.p, db.p, N, in, out, dx.acc, dw.acc, db.acc);
  }
  bool fuses_residual() const override { return true; }
  void add_fwd(const float* a, const float* b, float* y, int64_t n, int64_t nb) override {
    cpu::add_fwd(a, b, y, n, nb);
  }
  void add_bwd(const float* dy, Grad da, Grad db, int64_t n, int64_t nb) override {
    cpu::add_bwd(dy, acc_ptr(da, n), acc_ptr(db, nb), n, nb);
  }
  void mul_fwd(Src a, Src b, Dst y, int64_t n) override {
    cpu::mul_fwd(f32(a, "mul"), f32(b, "mul"), f32(y, "mul"), n);
  }
  void mul_bwd(Src a, Src b, Src dy, Grad da, Grad db, int64_t n) override {
    cpu::mul_bwd(f32(a, "mul"), f32(b, "mul"), f32(dy, "mul"), acc_ptr(da, n), acc_ptr(db, n), n);
  }
  void swiglu_fwd(Src g, Src u, Dst y, int64_t n) override {
    cpu::swiglu_fwd(f32(g, "swiglu"), f32(u, "swiglu"), f32(y, "swiglu"), n);
  }
  void swiglu_bwd(Src g, Src u, Src dy, Grad dg, Grad du, int64_t n) override {
    cpu::swiglu_bwd(f32(g, "swiglu"), f32(u, "swiglu"), f32(dy, "swiglu"), acc_ptr(dg, n), acc_ptr(du, n), n);
  }
  void geglu_fwd(Src g, Src u, Dst y, int64_t n) override {
    cpu::geglu_fwd(f32(g, "geglu"), f32(u, "geglu"), f32(y, "geglu"), n);
  }
  void geglu_bwd(Src g, Src u, Src dy, Grad dg, Grad du, int64_t n) override {
    cpu::geglu_bwd(f32(g, "geglu"), f32(u, "geglu"), f32(dy, "geglu"), acc_ptr(dg, n), acc_ptr(du, n), n);
  }
  void unary_fwd(cpu::Unary op, float a, const float* x, float* y, int64_t n) override {
    cpu::unary_fwd(op, a, x, y, n);
  }
  void dropout(const rng::Dropout& d, const float* x, Grad y, int64_t n) override {
    ZR_CHECK(!y.h, "CPU tensors are f32");
    if (y.p) cpu::dropout(d, x, y.p, y.acc, n);
  }
  void unary_bwd(cpu::Unary op, float a, const float* x, const float* dy, Grad dx, int64_t n) override {
    cpu::unary_bwd(op, a, x, dy, acc_ptr(dx, n), n);
  }
  void zero_rows(const int32_t* ids, int32_t value, float* x, int64_t N, int64_t C) override {
    for (int64_t i = 0; i < N; ++i)
      if (ids[i] == value) std::fill(x + i * C, x + (i + 1) * C, 0.f);
  }
  void qk_norm_fwd(const float* x, const float* wq, const float* wk, float* y, float* rstd, int64_t N, int64_t H,
                   int64_t K, int64_t D, bool full, float eps) override {
    cpu::qk_norm_fwd(x, wq, wk, y, rstd, N, H, K, D, full, eps);
  }
  void qk_norm_bwd(const float* x, const float* wq, const float* wk, const float* rstd, const float* dy, Grad dx,
                   float* dwq, float* dwk, int64_t N, int64_t H, int64_t K, int64_t D, bool full) override {
    cpu::qk_norm_bwd(x, wq, wk, rstd, dy, acc_ptr(dx, N * (H + 2 * K) * D), dwq, dwk, N, H, K, D, full);
  }
  void act_fwd(Act act, const float* x, float* y, int64_t n) override { cpu::act_fwd(act, x, y, n); }
  void act_bwd(Act act, const float* x, const float* dy, Grad dx, int64_t n) override {
    cpu::act_bwd(act, x, dy, acc_ptr(dx, n), n);
  }
  void layernorm_fwd(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, int64_t N,
                     int64_t C, float eps) override {
    cpu::layernorm_fwd(x, w, b, y, mean, rstd, N, C, eps);
  }
  void layernorm_bwd(const float* x, const float* w, const float* mean, const float* rstd, const float* dy, Grad dx,
                     float* dw, float* db, int64_t N, int64_t C) override {
    cpu::layernorm_bwd(x, w, mean, rstd, dy, acc_ptr(dx, N * C), dw, db, N, C);
  }
  void rmsnorm_fwd(const float* x, const float* w, float* y, float* rstd, int64_t N, int64_t C, float eps) override {
    cpu::rmsnorm_fwd(x, w, y, rstd, N, C, eps);
  }
  void rmsnorm_bwd(const float* x, const float* w, const float* rstd, const float* dy, Grad dx, float* dw, int64_t N,
                   int64_t C) override {
    cpu::rmsnorm_bwd(x, w, rstd, dy, acc_ptr(dx, N * C), dw, N, C);
  }
  void attention_fwd(const float* qkv, float* out, float* probs, const AttnDims& d) override {
    cpu::attention_fwd(qkv, out, probs, d);
  }
  void rope_fwd(Src qkv, Dst out, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D, const cpu::RopeFreqs& f,
                bool repeat, const int32_t* pos, int64_t n_pos) override {
    cpu::rope_fwd(f32(qkv, "rope"), f32(out, "rope"), B, T, H, K, D, f, repeat, pos, n_pos);
  }
  void rope_bwd(Src dout, Grad dqkv, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D, const cpu::RopeFreqs& f,
                bool repeat, const int32_t* pos, int64_t n_pos) override {
    cpu::rope_bwd(f32(dout, "rope"), acc_ptr(dqkv, B * T * (H + 2 * K) * D), B, T, H, K, D, f, repeat, pos, n_pos);
  }
  void attention_cached(const float* qkv, float* kc, float* vc, float* out, const AttnDims& d, int64_t len,
                        int64_t cap) override {
    cpu::attention_cached(qkv, kc, vc, out, d, len, cap);
  }
  void attention_bwd(const float* qkv, const float* probs, const float* dout, Grad dqkv, const AttnDims& d) override {
    cpu::attention_bwd(qkv, probs, dout, acc_ptr(dqkv, d.B * d.T * d.width()), d);
  }
  bool ids_in_range(const int32_t* ids, int64_t n, int64_t V) override {
    for (int64_t i = 0; i < n; ++i)
      if (ids[i] < 0 || ids[i] >= V) return false;
    return true;
  }
  void embedding_fwd(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C, int64_t) override {
    cpu::embedding_fwd(ids, table, out, N, C);
  }
  void embedding_bwd(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t C, int64_t V) override {
    cpu::embedding_bwd(ids, dout, dtable, N, C, V);
  }
  void pos_embedding_fwd(const float* table, float* out, int64_t B, int64_t T, int64_t C) override {
    cpu::pos_embedding_fwd(table, out, B, T, C);
  }
  void pos_embedding_bwd(const float* dout, float* dtable, int64_t B, int64_t T, int64_t C) override {
    cpu::pos_embedding_bwd(dout, dtable, B, T, C);
  }
  void cross_entropy_fwd(const float* logits, const int32_t* targets, float* lse, int64_t N, int64_t V, float* loss,
                         int64_t denom = 0) override {
    *loss = static_cast<float>(cpu::cross_entropy_fwd(logits, targets, lse, N, V, denom));
  }
  void cross_entropy_bwd(const float* logits, const int32_t* targets, const float* lse, const float* dloss,
                         Grad dlogits, int64_t N, int64_t V, int64_t denom = 0) override {
    cpu::cross_entropy_bwd(logits, targets, lse, *dloss, acc_ptr(dlogits, N * V), N, V, denom);
  }
  void mse_fwd(const float* pred, const float* target, int64_t n, float* loss) override {
    *loss = static_cast<float>(cpu::mse_fwd(pred, target, n));
  }
  void mse_bwd(const float* pred, const float* target, const float* dloss, Grad dpred, int64_t n) override {
    cpu::mse_bwd(pred, target, *dloss, acc_ptr(dpred, n), n);
  }
  void adam_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2, float eps,
                 float wd, bool adamw, bool bias_correction, int64_t step) override {
    cpu::adam_step(p, g, m, v, n, lr, beta1, beta2, eps, wd, adamw, bias_correction, step);
  }
  void adam_step_bf16_master(float* p, const float* g, void* m, void* v, bool bf16_states, int64_t n, float lr,
                             float beta1, float beta2, float eps, float wd, bool adamw, bool bias_correction,
                             int64_t step) override {
    cpu::adam_step_bf16_master(p, g, m, v, bf16_states, n, lr, beta1, beta2, eps, wd, adamw, bias_correction, step);
  }
  void sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float dampening, float wd,
                bool nesterov, bool first_step) override {
    cpu::sgd_step(p, g, buf, n, lr, momentum, dampening, wd, nesterov, first_step);
  }
  void scale_inplace(float* x, float s, int64_t n) override { cpu::scale_inplace(x, s, n); }
  void accumulate(float* acc, const float* x, int64_t n) override {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
  }
  double sum_squares(const float* x, int64_t n) override { return cpu::sum_squares(x, n); }
  bool all_finite(const float* x, int64_t n) override { return cpu::all_finite(x, n); }
  void round_to(DType dt, const float* src, float* dst, int64_t n) override {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] = zerorun::round_to(dt, src[i]);
  }
  void round_to16(DType dt, const float* src, uint16_t* dst, float* dst32, int64_t n, const int32_t* slots,
                  int64_t base) override {
    ZR_CHECK(dt == DType::BF16 || dt == DType::F16, "round_to16 needs bf16 or f16");
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = dt == DType::BF16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
      dst[i] = h;
      if (float* d = f32_copy_at(dst32, slots, base, i)) *d = dt == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
  void widen16_slots(DType dt, const uint16_t* h, float* dst32, int64_t n, const int32_t* slots) override {
    ZR_CHECK(dt == DType::BF16 || dt == DType::F16, "widen16_slots needs bf16 or f16");
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i)
      if (float* d = f32_copy_at(dst32, slots, 0, i)) *d = dt == DType::BF16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
  }
  void set_scalar(float* p, float v) override { *p = v; }
  float get_scalar(const float* p) override { return *p; }
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend b;
  return b;
}

Backend& backend(Device d) {
  if (d.is_cpu()) return cpu_backend();
  Backend* c = cuda_backend();
  ZR_CHECK(c, "a CUDA tensor reached an op, but this zerorun was built without CUDA");
  return *c;
}

}  // namespace zerorun::kernels
