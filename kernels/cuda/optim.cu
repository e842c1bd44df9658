// Optimizer updates on the GPU: Adam / AdamW (with the rounded 16-bit compute copies) and SGD. Part of the CUDA backend
// (backend_cuda.h).
#include "backend_cuda.h"

namespace zerorun::kernels {
namespace {

// ---- optimizer and helpers ----------------------------------------------------------
__global__ void k_adam(float* p, const float* g, float* m, float* v, int64_t n, AdamCoeffs c) {
  GRID_STRIDE(i, n) adam_elem(p[i], g[i], m[i], v[i], c);
}
// k_adam, and the updated weight rounded (bf: bfloat16, else fp16) into r16 bits / r32 values (either may be null),
// the f32 values placed by f32_copy_at(r32, slots, base, i).
__global__ void k_adam_round(float* p, const float* g, float* m, float* v, int64_t n, AdamCoeffs c, bool bf, float* r32,
                             uint16_t* r16, const int32_t* slots, int64_t base) {
  GRID_STRIDE(i, n) {
    adam_elem(p[i], g[i], m[i], v[i], c);
    const uint16_t h = to16_bits(bf, p[i]);
    if (r16) r16[i] = h;
    if (float* d = f32_copy_at(r32, slots, base, i)) *d = from16(bf, h);
  }
}
// k_adam_round four elements a thread: 16-byte loads and stores (p, g, m, v, r32 16-byte, r16 8-byte aligned,
// base % 4 == 0 so the four share a slot chunk), streamed past the caches (nothing here is read again in the
// update); the last n % 4 elements are left to k_adam_round.
__global__ void k_adam_round4(float* p, const float* g, float* m, float* v, int64_t n4, AdamCoeffs c, bool bf,
                              float* r32, uint16_t* r16, const int32_t* slots, int64_t base) {
  GRID_STRIDE(i, n4) {
    float4 pp = __ldcs(reinterpret_cast<const float4*>(p) + i), gg = __ldcs(reinterpret_cast<const float4*>(g) + i),
           mm = __ldcs(reinterpret_cast<const float4*>(m) + i), vv = __ldcs(reinterpret_cast<const float4*>(v) + i);
    adam_elem(pp.x, gg.x, mm.x, vv.x, c);
    adam_elem(pp.y, gg.y, mm.y, vv.y, c);
    adam_elem(pp.z, gg.z, mm.z, vv.z, c);
    adam_elem(pp.w, gg.w, mm.w, vv.w, c);
    __stcs(reinterpret_cast<float4*>(p) + i, pp);
    __stcs(reinterpret_cast<float4*>(m) + i, mm);
    __stcs(reinterpret_cast<float4*>(v) + i, vv);
    const ushort4 h = {to16_bits(bf, pp.x), to16_bits(bf, pp.y), to16_bits(bf, pp.z), to16_bits(bf, pp.w)};
    if (r16) reinterpret_cast<ushort4*>(r16)[i] = h;
    if (float* d = f32_copy_at(r32, slots, base, 4 * i))
      *reinterpret_cast<float4*>(d) = make_float4(from16(bf, h.x), from16(bf, h.y), from16(bf, h.z), from16(bf, h.w));
  }
}
__global__ void k_sgd(float* p, const float* g, float* buf, int64_t n, float lr, float mom, float damp, float wd,
                      bool nesterov, bool first) {
  GRID_STRIDE(i, n) {
    float unused = 0.f;
    sgd_elem(p[i], g[i], mom != 0.f ? buf[i] : unused, lr, mom, damp, wd, nesterov, first);
  }
}

}  // namespace

void CudaBackend::adam_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                            float eps, float wd, bool adamw, bool bias_correction, int64_t step) {
  LAUNCH(k_adam, n, p, g, m, v, n, adam_coeffs(lr, beta1, beta2, eps, wd, adamw, bias_correction, step));
}

void CudaBackend::adam_step_rounded(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                                    float beta2, float eps, float wd, bool adamw, bool bias_correction, int64_t step,
                                    DType dt, float* r32, uint16_t* r16, const int32_t* slots, int64_t base) {
  if (!r32 && !r16) return adam_step(p, g, m, v, n, lr, beta1, beta2, eps, wd, adamw, bias_correction, step);
  ZR_CHECK(dt == DType::BF16 || dt == DType::F16, "rounded AdamW copies need bf16 or f16");
  const AdamCoeffs c = adam_coeffs(lr, beta1, beta2, eps, wd, adamw, bias_correction, step);
  const bool bf = dt == DType::BF16;
  int64_t done = 0;
  if (aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v) && (!r32 || aligned16(r32)) &&
      reinterpret_cast<uintptr_t>(r16) % 8 == 0 && base % 4 == 0) {
    const int64_t n4 = n / 4;
    LAUNCH(k_adam_round4, n4, p, g, m, v, n4, c, bf, r32, r16, slots, base);
    done = n4 * 4;
  }
  if (n > done)  // with slots, r32 is the compact buffer's start and base moves instead
    LAUNCH(k_adam_round, n - done, p + done, g + done, m + done, v + done, n - done, c, bf,
           r32 && !slots ? r32 + done : r32, r16 ? r16 + done : nullptr, slots, base + done);
}

void CudaBackend::sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float dampening,
                           float wd, bool nesterov, bool first_step) {
  LAUNCH(k_sgd, n, p, g, buf, n, lr, momentum, dampening, wd, nesterov, first_step);
}

}  // namespace zerorun::kernels
