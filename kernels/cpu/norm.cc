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

namespace zerorun::kernels::cpu {

namespace {
// Group g of a packed qkv row under qk_norm: its first feature, size and weight.
struct QkGroup {
  int64_t off, size;
  const float* w;
};
inline QkGroup qk_group(int64_t g, int64_t H, int64_t K, int64_t D, bool full, const float* wq, const float* wk) {
  if (full) return g == 0 ? QkGroup{0, H * D, wq} : QkGroup{H * D, K * D, wk};
  return {g * D, D, g < H ? wq : wk};
}
}  // namespace

void qk_norm_fwd(const float* x, const float* wq, const float* wk, float* y, float* rstd, int64_t N, int64_t H,
                 int64_t K, int64_t D, bool full, float eps) {
  const int64_t W = (H + 2 * K) * D, G = full ? 2 : H + K;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * W;
    float* yr = y + n * W;
    for (int64_t g = 0; g < G; ++g) {
      const QkGroup q = qk_group(g, H, K, D, full, wq, wk);
      double ss = 0.0;
      for (int64_t c = 0; c < q.size; ++c) ss += static_cast<double>(xr[q.off + c]) * xr[q.off + c];
      const float rs = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(q.size) + eps));
      for (int64_t c = 0; c < q.size; ++c) yr[q.off + c] = xr[q.off + c] * rs * q.w[c];
      rstd[n * G + g] = rs;
    }
    for (int64_t c = (H + K) * D; c < W; ++c) yr[c] = xr[c];  // v
  }
}

void qk_norm_bwd(const float* x, const float* wq, const float* wk, const float* rstd, const float* dy, float* dx,
                 float* dwq, float* dwk, int64_t N, int64_t H, int64_t K, int64_t D, bool full) {
  const int64_t W = (H + 2 * K) * D, G = full ? 2 : H + K;
  if (dx) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float *xr = x + n * W, *dr = dy + n * W;
      float* o = dx + n * W;
      for (int64_t g = 0; g < G; ++g) {
        const QkGroup q = qk_group(g, H, K, D, full, wq, wk);
        const float rs = rstd[n * G + g];
        double s = 0.0;  // mean(dy * w * xhat)
        for (int64_t c = 0; c < q.size; ++c) s += dr[q.off + c] * q.w[c] * xr[q.off + c] * rs;
        const float m = static_cast<float>(s / static_cast<double>(q.size));
        for (int64_t c = 0; c < q.size; ++c) o[q.off + c] += (dr[q.off + c] * q.w[c] - xr[q.off + c] * rs * m) * rs;
      }
      for (int64_t c = (H + K) * D; c < W; ++c) o[c] += dr[c];
    }
  }
  // Each weight feature sums over rows and the groups it scales (in row, then group order): parallel over features.
  for (int side = 0; side < 2; ++side) {
    float* dw = side == 0 ? dwq : dwk;
    if (!dw) continue;
    const int64_t size = full ? (side == 0 ? H : K) * D : D;
    const int64_t g0 = full ? side : (side == 0 ? 0 : H), g1 = full ? side + 1 : (side == 0 ? H : H + K);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < size; ++c) {
      float s = 0.f;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t g = g0; g < g1; ++g) {
          const int64_t i = n * W + qk_group(g, H, K, D, full, wq, wk).off + c;
          s += dy[i] * x[i] * rstd[n * G + g];
        }
      dw[c] += s;
    }
  }
}

}  // namespace zerorun::kernels::cpu
