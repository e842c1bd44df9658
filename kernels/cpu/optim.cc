// Optimizer updates over flat f32 ranges (DeepSpeed FusedAdam / torch SGD
// formulas). Elementwise, so any sharding of the range gives the same bits.
//
// The Adam loops are the CPU optimizer of offloaded and CPU-rank runs, so they run at memory bandwidth: each thread
// takes one contiguous, cache-line aligned piece of the range, and the loop over a piece is compiled for AVX-512,
// AVX2 and the baseline ISA, the best one picked at run time (GCC/Clang function multiversioning; other toolchains
// build the portable loop alone). Floating-point contraction is off in the clones, so every ISA and every thread
// count gives the bits of the scalar adam_elem (sqrt and division are exact IEEE operations in every width).
//
// bf16 master weights with bf16 moments (DeepSpeed's bf16_optimizer_states; CPU only: no CUDA kernel shares this
// update) has its own element formula, adam_elem_bf16s: sqrt(v) times the reciprocal of sqrt(bias correction 2), as
// DeepSpeed's cpu_adam does, where adam_elem divides by it (one division an element fewer; the denominator within an
// ulp of adam_elem's). Its loop is written with AVX-512F intrinsics where the host has them (16 elements a vector,
// the bf16 rounding in integer lanes), the compiler-vectorised clones elsewhere; both give the bits of the scalar
// adam_step_bf16_master_reference.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "cpu_kernels.h"
#include "kernels/optim_math.h"

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__)
// GCC 12 warns of the _mm512_undefined_* values its own intrinsics start from (GCC bug 105593) where they inline.
#if defined(__clang__)
#include <immintrin.h>
#else
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif
#define ZR_AVX512_LOOP 1
#define ZR_AVX512 __attribute__((target("avx512f")))
#else
#define ZR_AVX512_LOOP 0
#endif

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

// The coefficients of the bf16-moment update, computed once a step: adam_coeffs' values, the products the element
// formula takes (1 - beta1, 1 - beta2, lr wd: the values adam_elem_t's expressions give) and 1 / sqrt(bc2).
struct Bf16Coeffs {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, wd, lr_wd, step_size, inv_bc2_sqrt, eps;
};
Bf16Coeffs bf16_coeffs(const AdamCoeffs& c) {
  return {c.beta1, 1.f - c.beta1, c.beta2, 1.f - c.beta2, c.wd, c.lr * c.wd, c.step_size, 1.f / c.bc2_sqrt, c.eps};
}
// adam_elem_t with sqrt(v) * (1 / sqrt(bc2)) in place of sqrt(v) / sqrt(bc2); every other operation in its order.
template <bool kL2, bool kDecay>
ZR_INLINE void adam_elem_bf16s(float& p, float g, float& m, float& v, const Bf16Coeffs& c) {
  if constexpr (kL2) g += c.wd * p;
  const float mi = c.beta1 * m + c.one_minus_beta1 * g;
  const float vi = c.beta2 * v + c.one_minus_beta2 * g * g;
  m = mi;
  v = vi;
  float pi = p;
  if constexpr (kDecay) pi -= c.lr_wd * pi;
  p = pi - c.step_size * mi / (sqrtf(vi) * c.inv_bc2_sqrt + c.eps);
}
// One element of the bf16-state update: g rounded to bf16, m and v widened, the update, p, m, v rounded to bf16.
template <bool kL2, bool kDecay>
ZR_INLINE void bf16s_elem(float& p, float g, uint16_t& m, uint16_t& v, const Bf16Coeffs& c) {
  float pi = p, mi = from_bf16(m), vi = from_bf16(v);
  adam_elem_bf16s<kL2, kDecay>(pi, bf16_round(g), mi, vi, c);
  p = bf16_round(pi);
  m = to_bf16(mi), v = to_bf16(vi);
}

// The loops, one per weight-decay mode (no branch inside), over f32 moments (C AdamCoeffs, S float) or bf16 bits (C
// Bf16Coeffs, S uint16_t), which also means bf16 master weights and gradients (g rounded to bf16 first, p rounded to
// bf16 after). kPg: bf16 master weights and gradients with f32 moments.
template <bool kL2, bool kDecay, bool kPg, class S, class C>
ZR_INLINE void adam_loop(float* __restrict p, const float* __restrict g, S* __restrict m, S* __restrict v, int64_t n,
                         const C& c) {
  if constexpr (std::is_same_v<S, uint16_t>) {
    ZR_OMP_SIMD
    for (int64_t i = 0; i < n; ++i) bf16s_elem<kL2, kDecay>(p[i], g[i], m[i], v[i], c);
  } else {
    ZR_OMP_SIMD
    for (int64_t i = 0; i < n; ++i) {
      float pi = p[i], mi = m[i], vi = v[i];
      adam_elem_t<kL2, kDecay>(pi, kPg ? bf16_round(g[i]) : g[i], mi, vi, c);
      p[i] = kPg ? bf16_round(pi) : pi;
      m[i] = mi, v[i] = vi;
    }
  }
}

#if ZR_AVX512_LOOP && defined(__GNUC__)
// The bf16-state loop in AVX-512F, 16 elements a vector: bf16s_elem's operations lane by lane (no contraction in
// intrinsics), the rounding to bf16 as to_bf16 does it (nearest even on the bits, NaN kept quiet), and the last
// n % 16 elements by bf16s_elem itself.
#define ZR_AVX512_INLINE ZR_AVX512 inline __attribute__((always_inline))
// The bits of x rounded to bf16 in the upper 16 bits (the lower 16: garbage): x + 0x7fff + the lsb kept, or for NaN
// x with the quiet bit set (to_bf16's (u >> 16) | 0x40).
ZR_AVX512_INLINE __m512i rne_bf16_hi(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __mmask16 odd = _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x10000));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  __m512i t = _mm512_add_epi32(u, _mm512_set1_epi32(0x7fff));
  t = _mm512_mask_add_epi32(t, odd, t, _mm512_set1_epi32(1));
  return _mm512_mask_or_epi32(t, nan, u, _mm512_set1_epi32(0x400000));
}
ZR_AVX512_INLINE __m512 round_bf16(__m512 x) {
  return _mm512_castsi512_ps(_mm512_and_si512(rne_bf16_hi(x), _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}
ZR_AVX512_INLINE __m512 load_bf16(const uint16_t* a) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
ZR_AVX512_INLINE void store_bf16(uint16_t* a, __m512 x) {
  const __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(rne_bf16_hi(x), 16));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(a), h);
}
template <bool kL2, bool kDecay>
ZR_AVX512 void bf16s_loop_avx512(float* __restrict p, const float* __restrict g, uint16_t* __restrict m,
                                 uint16_t* __restrict v, int64_t n, const Bf16Coeffs& c) {
  const __m512 beta1 = _mm512_set1_ps(c.beta1), omb1 = _mm512_set1_ps(c.one_minus_beta1);
  const __m512 beta2 = _mm512_set1_ps(c.beta2), omb2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 wd = _mm512_set1_ps(c.wd), lr_wd = _mm512_set1_ps(c.lr_wd), step = _mm512_set1_ps(c.step_size);
  const __m512 ibc2 = _mm512_set1_ps(c.inv_bc2_sqrt), eps = _mm512_set1_ps(c.eps);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 gi = round_bf16(_mm512_loadu_ps(g + i));
    __m512 pi = _mm512_loadu_ps(p + i);
    const __m512 m0 = load_bf16(m + i), v0 = load_bf16(v + i);
    if constexpr (kL2) gi = _mm512_add_ps(gi, _mm512_mul_ps(wd, pi));
    const __m512 mi = _mm512_add_ps(_mm512_mul_ps(beta1, m0), _mm512_mul_ps(omb1, gi));
    const __m512 vi = _mm512_add_ps(_mm512_mul_ps(beta2, v0), _mm512_mul_ps(_mm512_mul_ps(omb2, gi), gi));
    if constexpr (kDecay) pi = _mm512_sub_ps(pi, _mm512_mul_ps(lr_wd, pi));
    const __m512 den = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(vi), ibc2), eps);
    pi = _mm512_sub_ps(pi, _mm512_div_ps(_mm512_mul_ps(step, mi), den));
    _mm512_storeu_ps(p + i, round_bf16(pi));
    store_bf16(m + i, mi);
    store_bf16(v + i, vi);
  }
  for (; i < n; ++i) bf16s_elem<kL2, kDecay>(p[i], g[i], m[i], v[i], c);
}
bool avx512_allowed = true;  // adam_bf16_states_allow_avx512 (tests)
bool use_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has && avx512_allowed;
}
#endif

// Blocks of kBlock elements, each after prefetching the lines of the block kAhead blocks on: the bf16 loops carry
// more instructions an element than the out-of-order window hides memory latency behind.
// kAvx: the AVX-512 bf16-state loop (bf16s_loop_avx512) for each block.
template <bool kL2, bool kDecay, bool kPg, bool kAvx = false, class S, class C>
ZR_INLINE void adam_blocks(float* p, const float* g, S* m, S* v, int64_t n, const C& c) {
  constexpr int64_t kBlock = 1024, kAhead = 16;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t pf = b + kAhead * kBlock;
    if (pf < n) {
      const int64_t end = std::min(n, pf + kBlock);
      for (int64_t i = pf; i < end; i += 16) ZR_PREFETCH(p + i, 1), ZR_PREFETCH(g + i, 0);
      constexpr int64_t kLine = 64 / sizeof(S);  // elements a cache line of the moments
      for (int64_t i = pf; i < end; i += kLine) ZR_PREFETCH(m + i, 1), ZR_PREFETCH(v + i, 1);
    }
#if ZR_AVX512_LOOP && defined(__GNUC__)
    if constexpr (kAvx) {
      bf16s_loop_avx512<kL2, kDecay>(p + b, g + b, m + b, v + b, std::min(kBlock, n - b), c);
      continue;
    }
#endif
    adam_loop<kL2, kDecay, kPg>(p + b, g + b, m + b, v + b, std::min(kBlock, n - b), c);
  }
}

template <bool kPg, bool kAvx = false, class S, class C>
ZR_INLINE void adam_modes(float* p, const float* g, S* m, S* v, int64_t n, int mode, const C& c) {
  switch (mode) {
    case 0:
      adam_blocks<false, false, kPg, kAvx>(p, g, m, v, n, c);
      break;
    case 1:
      adam_blocks<true, false, kPg, kAvx>(p, g, m, v, n, c);
      break;
    default:
      adam_blocks<false, true, kPg, kAvx>(p, g, m, v, n, c);
  }
}

ZR_VEC_CLONES void adam_f32(float* p, const float* g, float* m, float* v, int64_t n, AdamCoeffs c) {
  adam_modes<false>(p, g, m, v, n, adam_mode(c), c);
}
ZR_VEC_CLONES void adam_bf16pg(float* p, const float* g, float* m, float* v, int64_t n, AdamCoeffs c) {
  adam_modes<true>(p, g, m, v, n, adam_mode(c), c);
}
ZR_VEC_CLONES void adam_bf16all(float* p, const float* g, uint16_t* m, uint16_t* v, int64_t n, int mode, Bf16Coeffs c) {
  adam_modes<false>(p, g, m, v, n, mode, c);
}
#if ZR_AVX512_LOOP && defined(__GNUC__)
void adam_bf16all_avx512(float* p, const float* g, uint16_t* m, uint16_t* v, int64_t n, int mode, Bf16Coeffs c) {
  adam_modes<false, true>(p, g, m, v, n, mode, c);
}
#endif

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
    const Bf16Coeffs c16 = bf16_coeffs(c);
    const int mode = adam_mode(c);
#if ZR_AVX512_LOOP && defined(__GNUC__)
    if (use_avx512()) {
      per_thread(n, [&](int64_t b, int64_t k) { adam_bf16all_avx512(p + b, g + b, m16 + b, v16 + b, k, mode, c16); });
      return;
    }
#endif
    per_thread(n, [&](int64_t b, int64_t k) { adam_bf16all(p + b, g + b, m16 + b, v16 + b, k, mode, c16); });
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

void adam_step_bf16_master_reference(float* p, const float* g, void* m, void* v, bool bf16_states, int64_t n, float lr,
                                     float beta1, float beta2, float eps, float wd, bool adamw, bool bias_correction,
                                     int64_t step) {
  const AdamCoeffs c = adam_coeffs(lr, beta1, beta2, eps, wd, adamw, bias_correction, step);
  if (!bf16_states) {
    auto* m32 = static_cast<float*>(m);
    auto* v32 = static_cast<float*>(v);
    for (int64_t i = 0; i < n; ++i) {
      adam_elem(p[i], bf16_round(g[i]), m32[i], v32[i], c);
      p[i] = bf16_round(p[i]);
    }
    return;
  }
  auto* m16 = static_cast<uint16_t*>(m);
  auto* v16 = static_cast<uint16_t*>(v);
  const Bf16Coeffs c16 = bf16_coeffs(c);
  for (int64_t i = 0; i < n; ++i) {
    switch (adam_mode(c)) {
      case 0:
        bf16s_elem<false, false>(p[i], g[i], m16[i], v16[i], c16);
        break;
      case 1:
        bf16s_elem<true, false>(p[i], g[i], m16[i], v16[i], c16);
        break;
      default:
        bf16s_elem<false, true>(p[i], g[i], m16[i], v16[i], c16);
    }
  }
}

void adam_bf16_states_allow_avx512(bool allow) {
#if ZR_AVX512_LOOP && defined(__GNUC__)
  avx512_allowed = allow;
#else
  static_cast<void>(allow);
#endif
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
