// LayerNorm and RMSNorm on CPU, forward and backward.
#include <cmath>

#include "cpu_kernels.h"

namespace zerorun::kernels::cpu {

void layernorm_fwd(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, int64_t N,
                   int64_t C, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    double m = 0.0;
    for (int64_t c = 0; c < C; ++c) m += xr[c];
    m /= C;
    double v = 0.0;
    for (int64_t c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m);
    v /= C;
    float rs = static_cast<float>(1.0 / std::sqrt(v + eps));
    float mf = static_cast<float>(m);
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = (xr[c] - mf) * rs * w[c] + (b ? b[c] : 0.f);
    mean[n] = mf;
    rstd[n] = rs;
  }
}

void layernorm_bwd(const float* x, const float* w, const float* mean, const float* rstd, const float* dy, float* dx,
                   float* dw, float* db, int64_t N, int64_t C) {
  if (dx) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = x + n * C;
      const float* dr = dy + n * C;
      float mu = mean[n], rs = rstd[n];
      double s1 = 0.0, s2 = 0.0;  // mean(dyw), mean(dyw * xhat)
      for (int64_t c = 0; c < C; ++c) {
        float xh = (xr[c] - mu) * rs;
        float g = dr[c] * w[c];
        s1 += g;
        s2 += g * xh;
      }
      float m1 = static_cast<float>(s1 / C), m2 = static_cast<float>(s2 / C);
      for (int64_t c = 0; c < C; ++c) {
        float xh = (xr[c] - mu) * rs;
        dx[n * C + c] += (dr[c] * w[c] - m1 - xh * m2) * rs;
      }
    }
  }
  if (dw || db) {
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < C; ++c) {
      float sw = 0.f, sb = 0.f;
      for (int64_t n = 0; n < N; ++n) {
        float d = dy[n * C + c];
        sw += d * (x[n * C + c] - mean[n]) * rstd[n];
        sb += d;
      }
      if (dw) dw[c] += sw;
      if (db) db[c] += sb;
    }
  }
}

void rmsnorm_fwd(const float* x, const float* w, float* y, float* rstd, int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    double ss = 0.0;
    for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(xr[c]) * xr[c];
    float rs = static_cast<float>(1.0 / std::sqrt(ss / C + eps));
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = xr[c] * rs * w[c];
    rstd[n] = rs;
  }
}

void rmsnorm_bwd(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw, int64_t N,
                 int64_t C) {
  if (dx) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = x + n * C;
      const float* dr = dy + n * C;
      float rs = rstd[n];
      double s = 0.0;  // mean(dy * w * xhat)
      for (int64_t c = 0; c < C; ++c) s += dr[c] * w[c] * xr[c] * rs;
      float m = static_cast<float>(s / C);
      for (int64_t c = 0; c < C; ++c) dx[n * C + c] += (dr[c] * w[c] - xr[c] * rs * m) * rs;
    }
  }
  if (dw) {
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < C; ++c) {
      float s = 0.f;
      for (int64_t n = 0; n < N; ++n) s += dy[n * C + c] * x[n * C + c] * rstd[n];
      dw[c] += s;
    }
  }
}

}  // namespace zerorun::kernels::cpu
