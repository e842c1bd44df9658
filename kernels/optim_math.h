// The per-element Adam/AdamW and SGD updates, shared by the CPU loops and the
// CUDA kernels so both backends apply literally the same arithmetic.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define ZR_HD __host__ __device__
#else
#define ZR_HD
#endif

namespace zerorun::kernels {

struct AdamCoeffs {
  float lr, beta1, beta2, eps, wd, step_size, bc2_sqrt;
  bool adamw;
};

// Bias corrections for optimizer step `step` (1-based), computed once per update.
inline AdamCoeffs adam_coeffs(float lr, float beta1, float beta2, float eps, float wd, bool adamw, bool bias_correction,
                              int64_t step) {
  float bc1 = 1.f, bc2 = 1.f;
  if (bias_correction) {
    bc1 = 1.f - static_cast<float>(std::pow(static_cast<double>(beta1), static_cast<double>(step)));
    bc2 = 1.f - static_cast<float>(std::pow(static_cast<double>(beta2), static_cast<double>(step)));
  }
  return {lr, beta1, beta2, eps, wd, lr / bc1, std::sqrt(bc2), adamw};
}

// AdamW decays the weight directly; Adam with weight_decay adds the L2 term to the gradient. kL2 / kDecay: which of
// the two applies (adam_mode(c)), fixed at compile time so that vector loops carry no branch.
template <bool kL2, bool kDecay>
ZR_HD inline void adam_elem_t(float& p, float g, float& m, float& v, const AdamCoeffs& c) {
  if constexpr (kL2) g += c.wd * p;
  const float mi = c.beta1 * m + (1.f - c.beta1) * g;
  const float vi = c.beta2 * v + (1.f - c.beta2) * g * g;
  m = mi;
  v = vi;
  float pi = p;
  if constexpr (kDecay) pi -= c.lr * c.wd * pi;
  p = pi - c.step_size * mi / (sqrtf(vi) / c.bc2_sqrt + c.eps);
}
// 0: no weight decay, 1: L2 (Adam), 2: decoupled (AdamW).
ZR_HD inline int adam_mode(const AdamCoeffs& c) { return c.wd == 0.f ? 0 : c.adamw ? 2 : 1; }
ZR_HD inline void adam_elem(float& p, float g, float& m, float& v, const AdamCoeffs& c) {
  const int mode = adam_mode(c);
  if (mode == 0)
    adam_elem_t<false, false>(p, g, m, v, c);
  else if (mode == 1)
    adam_elem_t<true, false>(p, g, m, v, c);
  else
    adam_elem_t<false, true>(p, g, m, v, c);
}

// torch.optim.SGD semantics (momentum buffer starts as the first gradient).
ZR_HD inline void sgd_elem(float& p, float g, float& buf, float lr, float momentum, float dampening, float wd,
                           bool nesterov, bool first_step) {
  float d = g;
  if (wd != 0.f) d += wd * p;
  if (momentum != 0.f) {
    const float b = first_step ? d : momentum * buf + (1.f - dampening) * d;
    buf = b;
    d = nesterov ? d + momentum * b : b;
  }
  p -= lr * d;
}

// Where the rounded f32 copy of element i of a flat range goes. slots null: dst32[i]. Otherwise element i is element
// base + i of the flat parameter layout, and chunk k = (base + i) / 256 of that layout has its f32 copy at
// dst32[256 slots[k] + (base + i) % 256] (dst32 the start of a compact buffer of only the chunks some op reads in
// f32), or none where slots[k] < 0. Four elements from a multiple of 4 share a chunk.
ZR_HD inline float* f32_copy_at(float* dst32, const int32_t* slots, int64_t base, int64_t i) {
  if (!dst32 || !slots) return dst32 ? dst32 + i : nullptr;
  const int64_t e = base + i;
  const int32_t k = slots[e >> 8];
  return k < 0 ? nullptr : dst32 + 256 * static_cast<int64_t>(k) + (e & 255);
}

}  // namespace zerorun::kernels
