// Elementwise CPU kernels: residual add (with suffix broadcast), mul, activations, SwiGLU, dropout.
#include <cmath>

#include "cpu_kernels.h"

namespace zerorun::kernels::cpu {

void add_fwd(const float* a, const float* b, float* y, int64_t n, int64_t nb) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i % nb];
}

void add_bwd(const float* dy, float* da, float* db, int64_t n, int64_t nb) {
  if (da) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) da[i] += dy[i];
  }
  if (db) {
    if (nb == n) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) db[i] += dy[i];
    } else {
      int64_t rows = n / nb;
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < nb; ++j) {
        float s = 0.f;
        for (int64_t r = 0; r < rows; ++r) s += dy[r * nb + j];
        db[j] += s;
      }
    }
  }
}

void mul_fwd(const float* a, const float* b, float* y, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] * b[i];
}

void mul_bwd(const float* a, const float* b, const float* dy, float* da, float* db, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    if (da) da[i] += dy[i] * b[i];
    if (db) db[i] += dy[i] * a[i];
  }
}

namespace {
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
}

void act_fwd(Act act, const float* x, float* y, int64_t n) {
  switch (act) {
    case Act::Gelu:
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        float v = x[i];
        y[i] = 0.5f * v * (1.f + std::tanh(kGeluC * (v + 0.044715f * v * v * v)));
      }
      break;
    case Act::Relu:
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
      break;
    case Act::Silu:
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.f + std::exp(-x[i]));
      break;
  }
}

void act_bwd(Act act, const float* x, const float* dy, float* dx, int64_t n) {
  switch (act) {
    case Act::Gelu:
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        float v = x[i];
        float u = kGeluC * (v + 0.044715f * v * v * v);
        float t = std::tanh(u);
        float du = kGeluC * (1.f + 3.f * 0.044715f * v * v);
        dx[i] += dy[i] * (0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * du);
      }
      break;
    case Act::Relu:
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) dx[i] += x[i] > 0.f ? dy[i] : 0.f;
      break;
    case Act::Silu:
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        float s = 1.f / (1.f + std::exp(-x[i]));
        dx[i] += dy[i] * s * (1.f + x[i] * (1.f - s));
      }
      break;
  }
}

// SwiGLU: y = silu(g) * u = g sigmoid(g) u. Backward: dg += dy u sigmoid(g) (1 + g (1 - sigmoid(g))),
// du += dy silu(g).
void swiglu_fwd(const float* g, const float* u, float* y, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}

void swiglu_bwd(const float* g, const float* u, const float* dy, float* dg, float* du, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.f / (1.f + std::exp(-g[i]));
    if (dg) dg[i] += dy[i] * u[i] * s * (1.f + g[i] * (1.f - s));
    if (du) du[i] += dy[i] * g[i] * s;
  }
}

void scale_inplace(float* x, float s, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

double sum_squares(const float* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

bool all_finite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}

}  // namespace zerorun::kernels::cpu

namespace zerorun::kernels::cpu {

// GeGLU (Gemma's MLP): y = gelu_tanh(g) * u. Backward: dg += dy u gelu'(g), du += dy gelu(g).
void geglu_fwd(const float* g, const float* u, float* y, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float v = g[i];
    y[i] = 0.5f * v * (1.f + std::tanh(kGeluC * (v + 0.044715f * v * v * v))) * u[i];
  }
}

void geglu_bwd(const float* g, const float* u, const float* dy, float* dg, float* du, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float v = g[i], t = std::tanh(kGeluC * (v + 0.044715f * v * v * v));
    if (dg)
      dg[i] += dy[i] * u[i] * (0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * kGeluC * (1.f + 3.f * 0.044715f * v * v));
    if (du) du[i] += dy[i] * 0.5f * v * (1.f + t);
  }
}

// One-parameter pointwise maps: y = a x (Scale), a tanh(x / a) (Softcap), x + a (Shift).
void unary_fwd(Unary op, float a, const float* x, float* y, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = unary_value(op, a, x[i]);
}

void unary_bwd(Unary op, float a, const float* x, const float* dy, float* dx, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dx[i] += dy[i] * unary_grad(op, a, x[i]);
}

void dropout(const rng::Dropout& d, const float* x, float* y, bool acc, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float v = rng::dropout_keep(d.key, d.counter0 + static_cast<uint64_t>(i), d.threshold) ? x[i] * d.scale : 0.f;
    y[i] = acc ? y[i] + v : v;
  }
}

}  // namespace zerorun::kernels::cpu
