// CPU kernels: raw pointers + sizes, no tensors, no allocation. Backward
// kernels ACCUMULATE into their gradient outputs (dx += ...), so a value used
// twice (a residual) sums its gradients and micro-batches accumulate.
// Loops that sum over rows are parallelised over columns so results do not
// depend on the thread count.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/kernel_types.h"

namespace zerorun::kernels::cpu {

// The option types both backends take (kernels/kernel_types.h), under their cpu:: names too.
using kernels::Act;
using kernels::AttnDims;
using kernels::rope_angle;
using kernels::RopeFreqs;
using kernels::Unary;
using kernels::unary_grad;
using kernels::unary_value;

// C[M,N] = alpha * op(A) * op(B) + beta * C, row-major (OpenBLAS sgemm).
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, const float* B,
          float beta, float* C);

// y = x W^T + b ; x [N, IN], W [OUT, IN], b [OUT] or null.
void linear_fwd(const float* x, const float* w, const float* b, float* y, int64_t N, int64_t in, int64_t out);
// dx += dy W ; dw += dy^T x ; db += sum_rows dy. Any of dx/dw/db may be null; one whose *_acc is false is
// overwritten instead (not read).
void linear_bwd(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t N, int64_t in,
                int64_t out, bool dx_acc = true, bool dw_acc = true, bool db_acc = true);

// y[i] = a[i] + b[i % nb]
void add_fwd(const float* a, const float* b, float* y, int64_t n, int64_t nb);
void add_bwd(const float* dy, float* da, float* db, int64_t n, int64_t nb);
void mul_fwd(const float* a, const float* b, float* y, int64_t n);
void mul_bwd(const float* a, const float* b, const float* dy, float* da, float* db, int64_t n);
void swiglu_fwd(const float* g, const float* u, float* y, int64_t n);
void swiglu_bwd(const float* g, const float* u, const float* dy, float* dg, float* du, int64_t n);

// GeGLU: y = gelu_tanh(g) * u (Gemma's MLP; transformers' gelu_pytorch_tanh).
void geglu_fwd(const float* g, const float* u, float* y, int64_t n);
void geglu_bwd(const float* g, const float* u, const float* dy, float* dg, float* du, int64_t n);

void unary_fwd(Unary op, float a, const float* x, float* y, int64_t n);
void unary_bwd(Unary op, float a, const float* x, const float* dy, float* dx, int64_t n);
// Dropout (kernels/counter_rng.h): y[i] = (acc ? y[i] : 0) + (kept(i) ? x[i] * scale : 0). Its own backward too
// (x = dy, y = dx): the mask is regenerated, never stored.
void dropout(const rng::Dropout& d, const float* x, float* y, bool acc, int64_t n);

void act_fwd(Act act, const float* x, float* y, int64_t n);
void act_bwd(Act act, const float* x, const float* dy, float* dx, int64_t n);

// LayerNorm over rows of x [N, C]; mean/rstd [N] saved for backward.
void layernorm_fwd(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, int64_t N,
                   int64_t C, float eps);
void layernorm_bwd(const float* x, const float* w, const float* mean, const float* rstd, const float* dy, float* dx,
                   float* dw, float* db, int64_t N, int64_t C);
void rmsnorm_fwd(const float* x, const float* w, float* y, float* rstd, int64_t N, int64_t C, float eps);
void rmsnorm_bwd(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw, int64_t N,
                 int64_t C);
// RMSNorm of the q and k parts of packed qkv rows [N, (H + 2K) D] (v copied): per head with weights wq, wk [D]
// (Qwen3, Gemma 3), or `full` over all q features (wq [H D]) and all k features (wk [K D]) (OLMo-2). rstd [N, G]
// with G = H + K groups a row per head, 2 full.
void qk_norm_fwd(const float* x, const float* wq, const float* wk, float* y, float* rstd, int64_t N, int64_t H,
                 int64_t K, int64_t D, bool full, float eps);
void qk_norm_bwd(const float* x, const float* wq, const float* wk, const float* rstd, const float* dy, float* dx,
                 float* dwq, float* dwk, int64_t N, int64_t H, int64_t K, int64_t D, bool full);

// Rotary embeddings (transformers' Llama: feature i of a head pairs with i + D/2; position t = row % T) on packed
// qkv [B, T, (H + 2K) D] (q heads, then K key heads, then K value heads): q and k rotated, v copied. With `repeat`
// the output is [B, T, 3 H D], each key/value head repeated H / K times (for attention kernels without grouped-query
// heads); without, the output keeps the input's layout. The angle of position t, pair i: t * inv[i] as an f32
// product, as transformers computes it; a double for cos/sin, each rounded to f32 and times `scale` (YaRN's
// attention factor, else 1), so the CPU and CUDA kernels get the same bits.
// pos [B, T] (null: row r is at position r % T): each row's position instead (packed documents restart at 0;
// incremental decoding continues a sequence), each in [0, n_pos).
void rope_fwd(const float* qkv, float* out, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D, const RopeFreqs& f,
              bool repeat, const int32_t* pos = nullptr, int64_t n_pos = 0);
// dqkv += the gradient through rope_fwd of dout (a repeated key/value head sums over its H / K copies).
void rope_bwd(const float* dout, float* dqkv, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D, const RopeFreqs& f,
              bool repeat, const int32_t* pos = nullptr, int64_t n_pos = 0);

// Causal self-attention (AttnDims) from qkv to out; probs [B, H, T, T] (the softmax, zero where masked) is saved
// for backward.
void attention_fwd(const float* qkv, float* out, float* probs, const AttnDims& d);
// dqkv += the gradient of qkv (softcap: the scores are recomputed from qkv).
void attention_bwd(const float* qkv, const float* probs, const float* dout, float* dqkv, const AttnDims& d);
// Incremental decoding (src/infer): the d.T new tokens of one sequence (d.B = 1; qkv [T, (H + 2K) D] after rope)
// attend over a key/value cache kc, vc [K, cap, D] holding the `len` tokens before them. Their keys and values are
// written to rows len .. len + T - 1 first; query i, at position len + i, then sees keys len + i - window + 1 (0
// without a window) .. len + i, as attention_fwd computes it (scale, softcap); out [T, H D]. d.pos is not read.
void attention_cached(const float* qkv, float* kc, float* vc, float* out, const AttnDims& d, int64_t len, int64_t cap);

// out[n, :] = table[ids[n], :]  (ids already range-checked).
void embedding_fwd(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C);
void embedding_bwd(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t C, int64_t V);
// Positional: out[b, t, :] = table[t, :]
void pos_embedding_fwd(const float* table, float* out, int64_t B, int64_t T, int64_t C);
void pos_embedding_bwd(const float* dout, float* dtable, int64_t B, int64_t T, int64_t C);

// Mean softmax cross-entropy over N rows of logits [N, V] (the rows' sum over denom where denom > 0: one chunk
// of a larger batch); returns the loss and writes each row's log-sum-exp to lse[N].
double cross_entropy_fwd(const float* logits, const int32_t* targets, float* lse, int64_t N, int64_t V,
                         int64_t denom = 0);
// dlogits += dloss * (exp(logits - lse) - onehot(target)) / (denom > 0 ? denom : N)
void cross_entropy_bwd(const float* logits, const int32_t* targets, const float* lse, float dloss, float* dlogits,
                       int64_t N, int64_t V, int64_t denom = 0);
double mse_fwd(const float* pred, const float* target, int64_t n);
void mse_bwd(const float* pred, const float* target, float dloss, float* dpred, int64_t n);

// One Adam/AdamW step over a flat range. adamw=true: decoupled decay
// (p -= lr*(m_hat/(sqrt(v_hat)+eps) + wd*p)); false: L2 (g += wd*p).
void adam_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2, float eps,
               float wd, bool adamw, bool bias_correction, int64_t step);
// adam_step one element at a time, without threads or vector clones: what the tests and the benchmark compare with.
void adam_step_reference(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                         float eps, float wd, bool adamw, bool bias_correction, int64_t step);
// DeepSpeed's bf16 master weights and gradients: g rounded to bf16, the update in f32, p (bf16 values in f32
// storage) rounded to bf16; m, v f32 or (bf16_states) bf16 bits widened and rounded around the update.
void adam_step_bf16_master(float* p, const float* g, void* m, void* v, bool bf16_states, int64_t n, float lr,
                           float beta1, float beta2, float eps, float wd, bool adamw, bool bias_correction,
                           int64_t step);
// adam_step_bf16_master one element at a time, without threads or vectors: what the tests and the benchmark compare
// with. fp32 moments: adam_elem's formula (adam_step's bits before the rounding); bf16 moments: the CPU-only formula
// of optim.cc (sqrt(v) times 1 / sqrt(bias correction 2), DeepSpeed cpu_adam's form; within an ulp of adam_elem's).
void adam_step_bf16_master_reference(float* p, const float* g, void* m, void* v, bool bf16_states, int64_t n, float lr,
                                     float beta1, float beta2, float eps, float wd, bool adamw, bool bias_correction,
                                     int64_t step);
// Tests: false makes adam_step_bf16_master's bf16-moment update take the compiler-vectorised loops where the AVX-512
// one would run (the same bits either way); true (the default) lets the host's best loop run.
void adam_bf16_states_allow_avx512(bool allow);
// SGD with torch.optim.SGD semantics; `buf` is the momentum buffer.
void sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float dampening, float wd,
              bool nesterov, bool first_step);

// Helpers over flat f32 arrays.
void scale_inplace(float* x, float s, int64_t n);
double sum_squares(const float* x, int64_t n);  // f64 accumulation, fixed order
bool all_finite(const float* x, int64_t n);

}  // namespace zerorun::kernels::cpu
