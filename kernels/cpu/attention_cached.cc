// Attention over a key/value cache for incremental decoding (zerorun sample, src/infer): each generated token's
// query attends to the keys and values cached for the tokens before it instead of recomputing them. The same
// arithmetic as attention_fwd (scale, soft-capping, window; f32), parallel over (query, head).
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu_kernels.h"

namespace zerorun::kernels::cpu {

void attention_cached(const float* qkv, float* kc, float* vc, float* out, const AttnDims& d, int64_t len, int64_t cap) {
  const int64_t n = d.T, H = d.H, K = d.K, D = d.D, W = d.width(), O = d.out_width(), rep = d.rep();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t g = 0; g < K; ++g) {
      std::memcpy(kc + (g * cap + len + i) * D, qkv + i * W + (H + g) * D, sizeof(float) * static_cast<size_t>(D));
      std::memcpy(vc + (g * cap + len + i) * D, qkv + i * W + (H + K + g) * D, sizeof(float) * static_cast<size_t>(D));
    }
#pragma omp parallel for schedule(static)
  for (int64_t ih = 0; ih < n * H; ++ih) {  // (query, head) as one loop (MSVC's OpenMP 2.0 has no collapse)
    const int64_t i = ih / H, h = ih % H;
    const int64_t g = h / rep, t = len + i, s0 = d.window > 0 && t >= d.window ? t - d.window + 1 : 0;
    const float* q = qkv + i * W + h * D;
    std::vector<float> p(static_cast<size_t>(t - s0 + 1));
    float mx = -INFINITY;
    for (int64_t s = s0; s <= t; ++s) {
      const float* k = kc + (g * cap + s) * D;
      float sc = 0.f;
      for (int64_t j = 0; j < D; ++j) sc += q[j] * k[j];
      sc *= d.scale;
      if (d.softcap > 0.f) sc = d.softcap * std::tanh(sc / d.softcap);
      p[static_cast<size_t>(s - s0)] = sc;
      if (sc > mx) mx = sc;
    }
    float sum = 0.f;
    for (float& e : p) {
      e = std::exp(e - mx);
      sum += e;
    }
    const float inv = 1.f / sum;
    float* o = out + i * O + h * D;
    for (int64_t j = 0; j < D; ++j) o[j] = 0.f;
    for (int64_t s = s0; s <= t; ++s) {
      const float w = p[static_cast<size_t>(s - s0)] * inv;
      const float* v = vc + (g * cap + s) * D;
      for (int64_t j = 0; j < D; ++j) o[j] += w * v[j];
    }
  }
}

}  // namespace zerorun::kernels::cpu
