// Causal multi-head self-attention on CPU (softmax probabilities kept for
// backward; CPU runs are small). Parallel over (batch, head): each pair owns
// disjoint slices of the outputs, so results do not depend on thread count.
#include <cmath>
#include <vector>

#include "cpu_kernels.h"

namespace zerorun::kernels::cpu {

void attention_fwd(const float* qkv, float* out, float* probs, int64_t B, int64_t T, int64_t C, int64_t H) {
  const int64_t hs = C / H;
  const float scale = 1.f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      float* P = probs + ((b * H + h) * T) * T;
      for (int64_t t = 0; t < T; ++t) {
        const float* q = qkv + (b * T + t) * 3 * C + h * hs;
        float mx = -INFINITY;
        for (int64_t s = 0; s <= t; ++s) {
          const float* k = qkv + (b * T + s) * 3 * C + C + h * hs;
          float d = 0.f;
          for (int64_t i = 0; i < hs; ++i) d += q[i] * k[i];
          d *= scale;
          P[t * T + s] = d;
          if (d > mx) mx = d;
        }
        float sum = 0.f;
        for (int64_t s = 0; s <= t; ++s) {
          float e = std::exp(P[t * T + s] - mx);
          P[t * T + s] = e;
          sum += e;
        }
        float inv = 1.f / sum;
        for (int64_t s = 0; s <= t; ++s) P[t * T + s] *= inv;
        for (int64_t s = t + 1; s < T; ++s) P[t * T + s] = 0.f;
        float* o = out + (b * T + t) * C + h * hs;
        for (int64_t i = 0; i < hs; ++i) o[i] = 0.f;
        for (int64_t s = 0; s <= t; ++s) {
          const float* v = qkv + (b * T + s) * 3 * C + 2 * C + h * hs;
          float p = P[t * T + s];
          for (int64_t i = 0; i < hs; ++i) o[i] += p * v[i];
        }
      }
    }
}

void attention_bwd(const float* qkv, const float* probs, const float* dout, float* dqkv, int64_t B, int64_t T,
                   int64_t C, int64_t H) {
  const int64_t hs = C / H;
  const float scale = 1.f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const float* P = probs + ((b * H + h) * T) * T;
      std::vector<float> dp(T);
      for (int64_t t = 0; t < T; ++t) {
        const float* dO = dout + (b * T + t) * C + h * hs;
        const float* q = qkv + (b * T + t) * 3 * C + h * hs;
        float* dq = dqkv + (b * T + t) * 3 * C + h * hs;
        float dot = 0.f;
        for (int64_t s = 0; s <= t; ++s) {
          const float* v = qkv + (b * T + s) * 3 * C + 2 * C + h * hs;
          float* dv = dqkv + (b * T + s) * 3 * C + 2 * C + h * hs;
          float p = P[t * T + s];
          float d = 0.f;
          for (int64_t i = 0; i < hs; ++i) {
            d += dO[i] * v[i];
            dv[i] += p * dO[i];
          }
          dp[s] = d;
          dot += p * d;
        }
        for (int64_t s = 0; s <= t; ++s) {
          float ds = P[t * T + s] * (dp[s] - dot) * scale;
          const float* k = qkv + (b * T + s) * 3 * C + C + h * hs;
          float* dk = dqkv + (b * T + s) * 3 * C + C + h * hs;
          for (int64_t i = 0; i < hs; ++i) {
            dq[i] += ds * k[i];
            dk[i] += ds * q[i];
          }
        }
      }
    }
}

}  // namespace zerorun::kernels::cpu
