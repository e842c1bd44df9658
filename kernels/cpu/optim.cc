// Optimizer updates over flat f32 ranges (DeepSpeed FusedAdam / torch SGD
// formulas). Elementwise, so any sharding of the range gives the same bits.
#include <cmath>

#include "cpu_kernels.h"
#include "kernels/optim_math.h"

namespace zerorun::kernels::cpu {

void adam_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2, float eps,
               float wd, bool adamw, bool bias_correction, int64_t step) {
  const AdamCoeffs c = adam_coeffs(lr, beta1, beta2, eps, wd, adamw, bias_correction, step);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) adam_elem(p[i], g[i], m[i], v[i], c);
}

void sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float dampening, float wd,
              bool nesterov, bool first_step) {
  // Without momentum there is no buffer (buf may be null).
  float unused = 0.f;
#pragma omp parallel for simd schedule(static) firstprivate(unused)
  for (int64_t i = 0; i < n; ++i)
    sgd_elem(p[i], g[i], momentum != 0.f ? buf[i] : unused, lr, momentum, dampening, wd, nesterov, first_step);
}

}  // namespace zerorun::kernels::cpu
