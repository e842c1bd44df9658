// Optimizer updates over flat f32 ranges (DeepSpeed FusedAdam / torch SGD
// formulas). Elementwise, so any sharding of the range gives the same bits.
#include <cmath>

#include "cpu_kernels.h"

namespace zerorun::kernels::cpu {

void adam_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2, float eps,
               float wd, bool adamw, bool bias_correction, int64_t step) {
  float bc1 = 1.f, bc2 = 1.f;
  if (bias_correction) {
    bc1 = 1.f - static_cast<float>(std::pow(static_cast<double>(beta1), static_cast<double>(step)));
    bc2 = 1.f - static_cast<float>(std::pow(static_cast<double>(beta2), static_cast<double>(step)));
  }
  const float bc2_sqrt = std::sqrt(bc2);
  const float step_size = lr / bc1;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i];
    if (!adamw && wd != 0.f) gi += wd * p[i];
    float mi = beta1 * m[i] + (1.f - beta1) * gi;
    float vi = beta2 * v[i] + (1.f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float denom = std::sqrt(vi) / bc2_sqrt + eps;
    float pi = p[i];
    if (adamw && wd != 0.f) pi -= lr * wd * pi;
    p[i] = pi - step_size * mi / denom;
  }
}

void sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float dampening, float wd,
              bool nesterov, bool first_step) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float d = g[i];
    if (wd != 0.f) d += wd * p[i];
    if (momentum != 0.f) {
      float b = first_step ? d : momentum * buf[i] + (1.f - dampening) * d;
      buf[i] = b;
      d = nesterov ? d + momentum * b : b;
    }
    p[i] -= lr * d;
  }
}

}  // namespace zerorun::kernels::cpu
