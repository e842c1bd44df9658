// Optimizer updates over flat f32 ranges (DeepSpeed FusedAdam / torch SGD
// formulas). Elementwise, so any sharding of the range gives the same bits.
//
// The Adam loops are the CPU optimizer of offloaded and CPU-rank runs, so they run at memory bandwidth: each thread
// takes one contiguous, cache-line aligned piece of the range, and the loop over a piece is compiled for AVX-512,
// AVX2 and the baseline ISA, the best one picked at run time (GCC/Clang function multiversioning; other toolchains
// build the portable loop alone). Floating-point contraction is off in the clones, so every ISA and every thread
// count gives the bits of the scalar adam_elem (sqrt and division are exact IEEE operations in every width).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "cpu_kernels.h"
#include "kernels/optim_math.h"

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define ZR_VEC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#elif defined(__x86_64__) && defined(__linux__) && defined(__clang__)
#define ZR_VEC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ZR_VEC_CLONES
#endif
#if defined(__GNUC__)
#define ZR_INLINE inline __attribute__((always_inline))  // into each clone, compiled for its ISA
#else
#define ZR_INLINE inline
#endif
// OpenMP 4's simd (MSVC's /openmp is OpenMP 2.0, which has none) and a prefetch hint (rw 1: for writing).
#if defined(__GNUC__)
#define ZR_OMP_SIMD _Pragma("omp simd")
#define ZR_PREFETCH(addr, rw) __builtin_prefetch(addr, rw)
#elif defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
#include <xmmintrin.h>
#define ZR_OMP_SIMD
#define ZR_PREFETCH(addr, rw) _mm_prefetch(reinterpret_cast<const char*>(addr), _MM_HINT_T0)
#else
#define ZR_OMP_SIMD
#define ZR_PREFETCH(addr, rw) static_cast<void>(addr)
#endif

namespace zerorun::kernels::cpu {
namespace {

// f32_to_bf16 (round to nearest even, NaN kept) without a branch, so the loops vectorise; the same bits.
ZR_INLINE uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  const uint32_t is_nan = 0u - static_cast<uint32_t>((u & 0x7fffffffu) > 0x7f800000u);  // all ones for NaN
  return static_cast<uint16_t>((nan & is_nan) | (r & ~is_nan));
}
ZR_INLINE float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
ZR_INLINE float bf16_round(float f) { return from_bf16(to_bf16(f)); }

// The loops, one per weight-decay mode (no branch inside), over f32 moments (kBf16 false) or bf16 bits; kBf16 also
// means bf16 master weights and gradients (g rounded to bf16 first, p rounded to bf16 after). kPg: bf16 master
// weights and gradients with f32 moments.
template <bool kL2, bool kDecay, bool kPg, class S>
ZR_INLINE void adam_loop(float* __restrict p, const float* __restrict g, S* __restrict m, S* __restrict v, int64_t n,
                         const AdamCoeffs& c) {
  constexpr bool kBf16 = std::is_same_v<S, uint16_t>;
  ZR_OMP_SIMD
  for (int64_t i = 0; i < n; ++i) {
    float pi = p[i], mi, vi;
    if constexpr (kBf16)
      mi = from_bf16(m[i]), vi = from_bf16(v[i]);
    else
      mi = m[i], vi = v[i];
    adam_elem_t<kL2, kDecay>(pi, kBf16 || kPg ? bf16_round(g[i]) : g[i], mi, vi, c);
    p[i] = kBf16 || kPg ? bf16_round(pi) : pi;
    if constexpr (kBf16)
      m[i] = to_bf16(mi), v[i] = to_bf16(vi);
    else
      m[i] = mi, v[i] = vi;
  }
}

// Blocks of kBlock elements, each after prefetching the lines of the block kAhead blocks on: the bf16 loops carry
// more instructions an element than the out-of-order window hides memory latency behind.
template <bool kL2, bool kDecay, bool kPg, class S>
ZR_INLINE void adam_blocks(float* p, const float* g, S* m, S* v, int64_t n, const AdamCoeffs& c) {
  constexpr int64_t kBlock = 1024, kAhead = 16;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t pf = b + kAhead * kBlock;
    if (pf < n) {
      const int64_t end = std::min(n, pf + kBlock);
      for (int64_t i = pf; i < end; i += 16) ZR_PREFETCH(p + i, 1), ZR_PREFETCH(g + i, 0);
      constexpr int64_t kLine = 64 / sizeof(S);  // elements a cache line of the moments
      for (int64_t i = pf; i < end; i += kLine) ZR_PREFETCH(m + i, 1), ZR_PREFETCH(v + i, 1);
    }
    adam_loop<kL2, kDecay, kPg>(p + b, g + b, m + b, v + b, std::min(kBlock, n - b), c);
  }
}

template <bool kPg, class S>
ZR_INLINE void adam_modes(float* p, const float* g, S* m, S* v, int64_t n, const AdamCoeffs& c) {
  switch (adam_mode(c)) {
    case 0:
      adam_blocks<false, false, kPg>(p, g, m, v, n, c);
      break;
    case 1:
      adam_blocks<true, false, kPg>(p, g, m, v, n, c);
      break;
    default:
      adam_blocks<false, true, kPg>(p, g, m, v, n, c);
  }
}

ZR_VEC_CLONES void adam_f32(float* p, const float* g, float* m, float* v, int64_t n, AdamCoeffs c) {
  adam_modes<false>(p, g, m, v, n, c);
}
ZR_VEC_CLONES void adam_bf16pg(float* p, const float* g, float* m, float* v, int64_t n, AdamCoeffs c) {
  adam_modes<true>(p, g, m, v, n, c);
}
ZR_VEC_CLONES void adam_bf16all(float* p, const float* g, uint16_t* m, uint16_t* v, int64_t n, AdamCoeffs c) {
  adam_modes<false>(p, g, m, v, n, c);
}

// Runs fn(begin, count) on one contiguous piece per thread, pieces starting at multiples of 16 elements (a 64-byte
// cache line of f32), so no two threads write one line.
template <class F>
void per_thread(int64_t n, F fn) {
  if (n <= 0) return;
  const int64_t most = std::max<int64_t>(1, (n + 65535) / 65536);  // no thread for less than 64k elements
#pragma omp parallel num_threads(static_cast <int>(std::min <int64_t>(most, omp_get_max_threads())))
  {
    const int64_t T = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t per = ((n + T - 1) / T + 15) / 16 * 16;
    const int64_t b = std::min(n, t * per), e = std::min(n, b + per);
    if (e > b) fn(b, e - b);
  }
}

}  // namespace

void adam_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2, float eps,
               float wd, bool adamw, bool bias_correction, int64_t step) {
  const AdamCoeffs c = adam_coeffs(lr, beta1, beta2, eps, wd, adamw, bias_correction, step);
  per_thread(n, [&](int64_t b, int64_t k) { adam_f32(p + b, g + b, m + b, v + b, k, c); });
}

void adam_step_bf16_master(float* p, const float* g, void* m, void* v, bool bf16_states, int64_t n, float lr,
                           float beta1, float beta2, float eps, float wd, bool adamw, bool bias_correction,
                           int64_t step) {
  const AdamCoeffs c = adam_coeffs(lr, beta1, beta2, eps, wd, adamw, bias_correction, step);
  if (bf16_states) {
    auto* m16 = static_cast<uint16_t*>(m);
    auto* v16 = static_cast<uint16_t*>(v);
    per_thread(n, [&](int64_t b, int64_t k) { adam_bf16all(p + b, g + b, m16 + b, v16 + b, k, c); });
  } else {
    auto* m32 = static_cast<float*>(m);
    auto* v32 = static_cast<float*>(v);
    per_thread(n, [&](int64_t b, int64_t k) { adam_bf16pg(p + b, g + b, m32 + b, v32 + b, k, c); });
  }
}

void adam_step_reference(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                         float eps, float wd, bool adamw, bool bias_correction, int64_t step) {
  const AdamCoeffs c = adam_coeffs(lr, beta1, beta2, eps, wd, adamw, bias_correction, step);
  for (int64_t i = 0; i < n; ++i) adam_elem(p[i], g[i], m[i], v[i], c);
}

void sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float dampening, float wd,
              bool nesterov, bool first_step) {
  if (momentum != 0.f) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) sgd_elem(p[i], g[i], buf[i], lr, momentum, dampening, wd, nesterov, first_step);
  } else {  // without momentum there is no buffer (buf may be null) and sgd_elem does not touch it
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      float unused = 0.f;
      sgd_elem(p[i], g[i], unused, lr, 0.f, dampening, wd, nesterov, first_step);
    }
  }
}

}  // namespace zerorun::kernels::cpu
