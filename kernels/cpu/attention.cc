// Causal self-attention on CPU (softmax probabilities kept for backward; CPU runs are small): grouped-query
// key/value heads read in place, a scale, a sliding window, Gemma 2's soft-capping and per-document masking of
// packed sequences (AttnDims: query t sees keys d.first_key(b, t) .. t), and dropout of the probabilities in
// training (probs keeps them undropped; the mask is regenerated). The forward is
// parallel over (batch, query head), the backward over (batch, key/value head), each query head of the group in
// turn: every thread owns disjoint slices of the outputs and adds in a fixed order, so results do not depend on the
// thread count.
#include <cmath>
#include <vector>

#include "cpu_kernels.h"

namespace zerorun::kernels::cpu {

namespace {
// The score of q and k: scale q.k, soft-capped where asked.
inline float score(const float* q, const float* k, const AttnDims& d) {
  float s = 0.f;
  for (int64_t i = 0; i < d.D; ++i) s += q[i] * k[i];
  s *= d.scale;
  return d.softcap > 0.f ? d.softcap * std::tanh(s / d.softcap) : s;
}
}  // namespace

void attention_fwd(const float* qkv, float* out, float* probs, const AttnDims& d) {
  const int64_t B = d.B, T = d.T, H = d.H, K = d.K, D = d.D, W = d.width(), O = d.out_width(), rep = d.rep();
  // (b, h) as one loop (MSVC's OpenMP 2.0 has no collapse): the same iterations, the same order of adds.
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H;
    const int64_t g = h / rep;  // the key/value head
    float* P = probs + ((b * H + h) * T) * T;
    for (int64_t t = 0; t < T; ++t) {
      const float* q = qkv + (b * T + t) * W + h * D;
      const int64_t s0 = d.first_key(b, t);
      float mx = -INFINITY;
      for (int64_t s = 0; s < s0; ++s) P[t * T + s] = 0.f;
      for (int64_t s = s0; s <= t; ++s) {
        const float sc = score(q, qkv + (b * T + s) * W + (H + g) * D, d);
        P[t * T + s] = sc;
        if (sc > mx) mx = sc;
      }
      float sum = 0.f;
      for (int64_t s = s0; s <= t; ++s) {
        float e = std::exp(P[t * T + s] - mx);
        P[t * T + s] = e;
        sum += e;
      }
      float inv = 1.f / sum;
      for (int64_t s = s0; s <= t; ++s) P[t * T + s] *= inv;
      for (int64_t s = t + 1; s < T; ++s) P[t * T + s] = 0.f;
      float* o = out + (b * T + t) * O + h * D;
      for (int64_t i = 0; i < D; ++i) o[i] = 0.f;
      for (int64_t s = s0; s <= t; ++s) {
        const float* v = qkv + (b * T + s) * W + (H + K + g) * D;
        float p = P[t * T + s] * d.drop_factor(b, h, t, s);
        for (int64_t i = 0; i < D; ++i) o[i] += p * v[i];
      }
    }
  }
}

void attention_bwd(const float* qkv, const float* probs, const float* dout, float* dqkv, const AttnDims& d) {
  const int64_t B = d.B, T = d.T, H = d.H, K = d.K, D = d.D, W = d.width(), O = d.out_width(), rep = d.rep();
#pragma omp parallel for schedule(static)
  for (int64_t bg = 0; bg < B * K; ++bg) {  // (b, g) as one loop
    const int64_t b = bg / K, g = bg % K;
    std::vector<float> dp(T);
    for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
      const float* P = probs + ((b * H + h) * T) * T;
      for (int64_t t = 0; t < T; ++t) {
        const float* dO = dout + (b * T + t) * O + h * D;
        const float* q = qkv + (b * T + t) * W + h * D;
        float* dq = dqkv + (b * T + t) * W + h * D;
        const int64_t s0 = d.first_key(b, t);
        float dot = 0.f;
        for (int64_t s = s0; s <= t; ++s) {
          const float* v = qkv + (b * T + s) * W + (H + K + g) * D;
          float* dv = dqkv + (b * T + s) * W + (H + K + g) * D;
          const float f = d.drop_factor(b, h, t, s), p = P[t * T + s];
          float dd = 0.f;
          for (int64_t i = 0; i < D; ++i) {
            dd += dO[i] * v[i];
            dv[i] += p * f * dO[i];
          }
          dp[s] = dd * f;  // the gradient of the probability before its dropout
          dot += p * dp[s];
        }
        for (int64_t s = s0; s <= t; ++s) {
          const float* k = qkv + (b * T + s) * W + (H + g) * D;
          float* dk = dqkv + (b * T + s) * W + (H + g) * D;
          float ds = P[t * T + s] * (dp[s] - dot);
          if (d.softcap > 0.f) {  // d(c tanh(x / c)) / dx = 1 - tanh^2(x / c)
            const float th = score(q, k, d) / d.softcap;
            ds *= 1.f - th * th;
          }
          ds *= d.scale;
          for (int64_t i = 0; i < D; ++i) {
            dq[i] += ds * k[i];
            dk[i] += ds * q[i];
          }
        }
      }
    }
  }
}

}  // namespace zerorun::kernels::cpu
