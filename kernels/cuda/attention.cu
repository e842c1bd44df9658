// Attention on the GPU: the dispatch between the materialised path (cuBLAS products and the softmax kernels
// here) and the flash kernels (flash_attention.cu, flash_attention_tc.cu), and the cached decode path. Part of the CUDA
// backend (backend_cuda.h).
#include "backend_cuda.h"

namespace zerorun::kernels {
namespace {

// ---- attention helpers: warp per row of [rows, T] ---------------------------------
// Row t's scores s0(t) .. t (the sliding window's first key, or 0; pos [B, T] non-null: no key before t's document,
// t - pos[b, t]; rows are [B, H, T]) soft-capped where asked, then the softmax; zeros elsewhere.
__global__ void k_causal_softmax(float* P, int64_t rows, int64_t T, int64_t window, float softcap, const int32_t* pos,
                                 int64_t H) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  int64_t t = row % T, s0 = window > 0 && t >= window ? t - window + 1 : 0;
  if (pos) s0 = max(s0, t - (int64_t)pos[row / (H * T) * T + t]);
  float* p = P + row * T;
  float mx = -INFINITY;
  for (int64_t s = s0 + lane; s <= t; s += 32) {
    if (softcap > 0.f) p[s] = softcap * tanhf(p[s] / softcap);
    mx = fmaxf(mx, p[s]);
  }
  mx = warp_max(mx);
  float sum = 0.f;
  for (int64_t s = s0 + lane; s <= t; s += 32) {
    float e = expf(p[s] - mx);
    p[s] = e;
    sum += e;
  }
  float inv = 1.f / warp_sum(sum);
  for (int64_t s = lane; s < T; s += 32) p[s] = s >= s0 && s <= t ? p[s] * inv : 0.f;
}
// dS = P * (dP - rowsum(P * dP)) * scale (times the soft-cap's derivative 1 - tanh^2(S / softcap), S the scaled
// scores, where softcap > 0), in place over dP.
__global__ void k_softmax_bwd(const float* P, float* dP, const float* S, int64_t rows, int64_t T, float scale,
                              float softcap) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* p = P + row * T;
  float* d = dP + row * T;
  float dot = 0.f;
  for (int64_t s = lane; s < T; s += 32) dot += p[s] * d[s];
  dot = warp_sum(dot);
  if (softcap > 0.f) {
    const float* x = S + row * T;
    for (int64_t s = lane; s < T; s += 32) {
      const float th = tanhf(x[s] / softcap);
      d[s] = p[s] * (d[s] - dot) * (1.f - th * th) * scale;
    }
    return;
  }
  for (int64_t s = lane; s < T; s += 32) d[s] = p[s] * (d[s] - dot) * scale;
}

}  // namespace

// Grouped-query heads in place: query heads g * rep + r (r fixed, g = 0 .. K-1) over key/value heads g are one
// strided batch of K products per r (K = H: one batch of H, as multi-head attention).
void CudaBackend::attention_fwd(const float* qkv, float* out, float* probs, const AttnDims& d) {
  const int64_t T = d.T, D = d.D, W = d.width(), O = d.out_width(), TT = T * T, H = d.H, K = d.K, rep = d.rep();
  for (int64_t b = 0; b < d.B; ++b) {
    const float* x = qkv + b * T * W;
    float* P = probs + b * H * TT;
    for (int64_t r = 0; r < rep; ++r)
      gemm_strided(false, true, T, T, D, d.scale, x + r * D, W, rep * D, x + H * D, W, D, 0.f, P + r * TT, T, rep * TT,
                   K);
  }
  k_causal_softmax<<<rows_grid(d.B * H * T), kTpb, 0, cuda::stream()>>>(probs, d.B * H * T, T, d.window, d.softcap,
                                                                        d.pos, H);
  ZR_CUDA(cudaGetLastError());
  DevBuf<float> Pd = d.drop.threshold ? DevBuf<float>(static_cast<size_t>(H * TT)) : DevBuf<float>();
  for (int64_t b = 0; b < d.B; ++b) {
    const float* x = qkv + b * T * W;
    const float* P = dropped(probs + b * H * TT, Pd.p, b, d);
    for (int64_t r = 0; r < rep; ++r)
      gemm_strided(false, false, T, D, T, 1.f, P + r * TT, T, rep * TT, x + (H + K) * D, W, D, 0.f,
                   out + b * T * O + r * D, O, rep * D, K);
  }
}

// Row b's probabilities [H, T, T] after the dropout of d.drop (written to scratch), or P itself without one. Their
// linear index is the mask's counter (cpu::AttnDims::drop); with dP for P, the gradient through the dropout.
const float* CudaBackend::dropped(const float* P, float* scratch, int64_t b, const AttnDims& d) {
  if (d.drop.threshold == 0) return P;
  rng::Dropout m = d.drop;
  m.counter0 += static_cast<uint64_t>(b * d.H * d.T * d.T);
  qk::dropout(m, P, scratch, false, d.H * d.T * d.T, cuda::stream());
  return scratch;
}

void CudaBackend::attention_bwd(const float* qkv, const float* probs, const float* dout, Grad dqkv_g,
                                const AttnDims& d) {
  const int64_t T = d.T, D = d.D, W = d.width(), O = d.out_width(), TT = T * T, H = d.H, K = d.K, rep = d.rep();
  float* dqkv = zeroed_unless_acc(dqkv_g, d.B * T * W);  // the products below accumulate
  DevBuf<float> dP(static_cast<size_t>(H * TT));
  DevBuf<float> S = d.softcap > 0.f ? DevBuf<float>(static_cast<size_t>(H * TT)) : DevBuf<float>();
  DevBuf<float> Pd = d.drop.threshold ? DevBuf<float>(static_cast<size_t>(H * TT)) : DevBuf<float>();
  for (int64_t b = 0; b < d.B; ++b) {
    const float* x = qkv + b * T * W;
    const float* P = probs + b * H * TT;
    const float* Pv = dropped(P, Pd.p, b, d);  // the probabilities that weighed V
    const float* dO = dout + b * T * O;
    float* dx = dqkv + b * T * W;
    for (int64_t r = 0; r < rep; ++r) {
      gemm_strided(false, true, T, T, D, 1.f, dO + r * D, O, rep * D, x + (H + K) * D, W, D, 0.f, dP.p + r * TT, T,
                   rep * TT, K);  // dP = dO V^T
      gemm_strided(true, false, T, D, T, 1.f, Pv + r * TT, T, rep * TT, dO + r * D, O, rep * D, 1.f, dx + (H + K) * D,
                   W, D, K);  // dV += P^T dO
      if (S.p)                // the scaled scores again, for the soft-cap's derivative
        gemm_strided(false, true, T, T, D, d.scale, x + r * D, W, rep * D, x + H * D, W, D, 0.f, S.p + r * TT, T,
                     rep * TT, K);
    }
    if (d.drop.threshold) dropped(dP.p, dP.p, b, d);  // in place: the gradient of the undropped probabilities
    k_softmax_bwd<<<rows_grid(H * T), kTpb, 0, cuda::stream()>>>(P, dP.p, S.p, H * T, T, d.scale, d.softcap);
    ZR_CUDA(cudaGetLastError());
    for (int64_t r = 0; r < rep; ++r) {
      gemm_strided(false, false, T, D, T, 1.f, dP.p + r * TT, T, rep * TT, x + H * D, W, D, 1.f, dx + r * D, W, rep * D,
                   K);  // dQ += dS K
      gemm_strided(true, false, T, D, T, 1.f, dP.p + r * TT, T, rep * TT, x + r * D, W, rep * D, 1.f, dx + H * D, W, D,
                   K);  // dK += dS^T Q
    }
  }
}

void CudaBackend::attention_cached(const float* qkv, float* kc, float* vc, float* out, const AttnDims& d, int64_t len,
                                   int64_t cap) {
  cached::forward(qkv, kc, vc, out, d, len, cap, cuda::stream());
}

// Dropout of the probabilities runs on the materialised path below.
bool CudaBackend::has_flash_attention(const AttnDims& d) const { return d.drop.threshold == 0 && flash::supported(d); }

void CudaBackend::flash_attention_fwd(Src qkv, Dst out, float* lse, const AttnDims& d) {
  const int64_t n3 = d.B * d.T * d.width(), n = d.B * d.T * d.out_width();
  if (tensor_core_attention(d)) {  // 16-bit operands: an f32 qkv is rounded first
    Half q16 = qkv.h ? Half() : to16(qkv.p, n3);
    flash::tc_forward(mm_ == DType::BF16, qkv.h ? qkv.h : q16.p, out.p, out.h, lse, d);
    return;
  }
  DevBuf<float> qf = widened(qkv, n3), of = out.h ? DevBuf<float>(static_cast<size_t>(n), false) : DevBuf<float>();
  flash::forward(qkv.h ? qf.p : qkv.p, out.h ? of.p : out.p, lse, d);
  if (out.h) round16(of.p, out.h, n);
}

void CudaBackend::flash_attention_bwd(Src qkv, Src out, const float* lse, Src dout, Grad dqkv, const AttnDims& d) {
  const int64_t n3 = d.B * d.T * d.width(), n = d.B * d.T * d.out_width();
  DevBuf<float> delta(static_cast<size_t>(d.B * d.H * d.T), false);
  if (tensor_core_attention(d)) {
    Half q16 = qkv.h ? Half() : to16(qkv.p, n3), d16 = dout.h ? Half() : to16(dout.p, n);
    const bool atomics = attn_atomics_ && !deterministic_;
    // dQ's accumulator (then dK's and dV's where grouped-query heads are split: B*T*(H + 2K)*D floats).
    const bool split = atomics && attn_gqa_split_ && d.K < d.H;
    DevBuf<float> dq_acc = atomics ? DevBuf<float>(static_cast<size_t>(split ? n3 : n), false) : DevBuf<float>();
    flash::tc_backward(mm_ == DType::BF16, qkv.h ? qkv.h : q16.p, out.p, out.h, lse, dout.h ? dout.h : d16.p, dqkv.p,
                       dqkv.h, dqkv.acc, delta.p, dq_acc.p, d, 0, split);
    return;
  }
  DevBuf<float> qf = widened(qkv, n3), of = widened(out, n), df = widened(dout, n);
  float* dp = dqkv.h ? nullptr : zeroed_unless_acc(dqkv, n3);
  DevBuf<float> d32 = dqkv.h ? DevBuf<float>(static_cast<size_t>(n3)) : DevBuf<float>();
  flash::backward(qkv.h ? qf.p : qkv.p, out.h ? of.p : out.p, lse, dout.h ? df.p : dout.p, dqkv.h ? d32.p : dp, delta.p,
                  d);
  if (dqkv.h) round16(d32.p, dqkv.h, n3);
}

}  // namespace zerorun::kernels
