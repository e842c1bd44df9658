// The CPU optimizer at memory bandwidth (issue 34, item 2): measures the host's bandwidth with a STREAM triad over
// buffers far larger than the caches, then Adam's effective bandwidth (bytes read + written a parameter x
// parameters / time) with fp32 moments, bf16 master weights and gradients, and bf16 moments, and prints each
// ratio. Also checks the vectorised, threaded updates (fp32 states; bf16 master + moments) against their scalar
// one-thread loops, bit for bit.
// Usage: zerorun_cpu_adam_bench [--n ELEMENTS (default 2^25)] [--reps R (default 5)]; threads: OMP_NUM_THREADS.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "zerorun/dtype.h"

using namespace zerorun;
using Clock = std::chrono::steady_clock;

namespace {

// 64-byte aligned, first-touched by the threads that later use each piece (static schedule).
struct Buf {
  void* p = nullptr;
  Buf(size_t bytes, float fill) {
    p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) std::fprintf(stderr, "out of memory\n"), std::exit(1);
    float* f = static_cast<float*>(p);
    const int64_t n = static_cast<int64_t>(bytes / 4);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) f[i] = fill + 1e-7f * static_cast<float>(i % 1000);
  }
  ~Buf() { std::free(p); }
  float* f() const { return static_cast<float*>(p); }
  uint16_t* h() const { return static_cast<uint16_t*>(p); }
};

template <class F>
double best_seconds(int reps, F fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = int64_t{1} << 25;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--n" && i + 1 < argc)
      n = std::atoll(argv[++i]);
    else if (a == "--reps" && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--n ELEMENTS] [--reps R]\n", argv[0]);
      return 2;
    }
  }
  if (n < 1024 || reps < 1) {
    std::fprintf(stderr, "--n must be >= 1024 and --reps >= 1\n");
    return 2;
  }
  const size_t fb = static_cast<size_t>(n) * 4;
  std::printf("cpu_adam_bench: %lld elements (%.0f MiB a f32 buffer), %d threads, best of %d\n",
              static_cast<long long>(n), fb / 1048576.0, omp_get_max_threads(), reps);

  // STREAM triad a = b + s c: 12 bytes an element (STREAM's count: write-allocate traffic not counted, as below).
  double triad_bw = 0;
  {
    Buf a(fb, 0.f), b(fb, 1.f), c(fb, 2.f);
    float *A = a.f(), *B = b.f(), *C = c.f();
    const float s = 3.f;
    const double t = best_seconds(reps, [&] {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) A[i] = B[i] + s * C[i];
    });
    // The store's cache line is read before it is written (write-allocate), so the memory moves 16 bytes an element
    // where STREAM counts 12; the update below reads every line it writes, so its count is its traffic. The host's
    // bandwidth is taken as the triad's real traffic: the stricter denominator.
    triad_bw = 16.0 * static_cast<double>(n) / t;
    std::printf(
        "STREAM triad: %.2f GB/s as STREAM counts (12 B an element), %.2f GB/s moved (16 B with "
        "write-allocate): host bandwidth %.2f GB/s\n",
        12.0 * static_cast<double>(n) / t / 1e9, triad_bw / 1e9, triad_bw / 1e9);
  }

  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f;
  Buf p(fb, 0.5f), g(fb, 0.01f), m(fb, 0.f), v(fb, 0.f);
  int64_t step = 0;
  auto report = [&](const char* what, double bytes_per, double t) {
    const double bw = bytes_per * static_cast<double>(n) / t;
    std::printf("%-34s %6.1f ms  %6.2f GB/s  = %5.1f%% of the triad  (%.0f B a parameter)\n", what, t * 1e3, bw / 1e9,
                100.0 * bw / triad_bw, bytes_per);
    return bw / triad_bw;
  };
  // fp32: read p g m v, write p m v.
  const double t32 = best_seconds(
      reps, [&] { kernels::cpu::adam_step(p.f(), g.f(), m.f(), v.f(), n, lr, b1, b2, eps, wd, true, true, ++step); });
  const double r32 = report("AdamW fp32 states", 28, t32);
  // bf16 master weights and gradients, fp32 moments: the same bytes.
  const double tpg = best_seconds(reps, [&] {
    kernels::cpu::adam_step_bf16_master(p.f(), g.f(), m.f(), v.f(), false, n, lr, b1, b2, eps, wd, true, true, ++step);
  });
  report("AdamW bf16 master, fp32 moments", 28, tpg);
  // bf16 moments: read p g (f32) m v (bf16), write p (f32) m v (bf16).
  Buf m16(static_cast<size_t>(n) * 2, 0.f), v16(static_cast<size_t>(n) * 2, 0.f);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) m16.h()[i] = f32_to_bf16(m.f()[i]), v16.h()[i] = f32_to_bf16(v.f()[i]);
  const double t16 = best_seconds(reps, [&] {
    kernels::cpu::adam_step_bf16_master(p.f(), g.f(), m16.h(), v16.h(), true, n, lr, b1, b2, eps, wd, true, true,
                                        ++step);
  });
  const double r16 = report("AdamW bf16 master + moments", 20, t16);
  // The scalar loop on one thread, for scale.
  const int64_t nr = std::min<int64_t>(n, int64_t{1} << 22);
  const double tref = best_seconds(std::min(reps, 2), [&] {
    kernels::cpu::adam_step_reference(p.f(), g.f(), m.f(), v.f(), nr, lr, b1, b2, eps, wd, true, true, ++step);
  });
  std::printf("%-34s %6.2f GB/s (scalar, one thread, %lld elements)\n", "AdamW reference loop",
              28.0 * static_cast<double>(nr) / tref / 1e9, static_cast<long long>(nr));

  // Bitwise: the vectorised threaded update vs the reference loop, on varied data (modes: AdamW, Adam + L2, none).
  int bad = 0;
  for (int mode = 0; mode < 3; ++mode) {
    const int64_t k = std::min<int64_t>(n, 1 << 20) + 7;
    std::vector<float> P(k), G(k), M(k), V(k);
    uint32_t s = 12345u + static_cast<uint32_t>(mode);
    for (int64_t i = 0; i < k; ++i) {
      auto r = [&] { return (s = s * 1664525u + 1013904223u) / 4294967296.f - 0.5f; };
      P[i] = r(), G[i] = r() * 1e-2f, M[i] = r() * 1e-3f, V[i] = std::abs(r()) * 1e-5f;
    }
    auto P2 = P, G2 = G, M2 = M, V2 = V;
    const float w = mode == 2 ? 0.f : 0.1f;
    for (int64_t st = 1; st <= 3; ++st) {
      kernels::cpu::adam_step(P.data(), G.data(), M.data(), V.data(), k, lr, b1, b2, eps, w, mode == 0, true, st);
      kernels::cpu::adam_step_reference(P2.data(), G2.data(), M2.data(), V2.data(), k, lr, b1, b2, eps, w, mode == 0,
                                        true, st);
    }
    bad += std::memcmp(P.data(), P2.data(), 4 * k) != 0 || std::memcmp(M.data(), M2.data(), 4 * k) != 0 ||
           std::memcmp(V.data(), V2.data(), 4 * k) != 0;
  }
  std::printf("fp32 update vs the scalar reference: %s\n", bad ? "DIFFERENT BITS" : "bitwise identical");
  // The same for bf16 master weights + bf16 moments (their own CPU-only formula, adam_step_bf16_master_reference).
  int bad16 = 0;
  for (int mode = 0; mode < 3; ++mode) {
    const int64_t k = std::min<int64_t>(n, 1 << 20) + 7;
    std::vector<float> P(k), G(k);
    std::vector<uint16_t> M(k), V(k);
    uint32_t s = 777u + static_cast<uint32_t>(mode);
    for (int64_t i = 0; i < k; ++i) {
      auto r = [&] { return (s = s * 1664525u + 1013904223u) / 4294967296.f - 0.5f; };
      P[i] = bf16_to_f32(f32_to_bf16(r())), G[i] = r() * 1e-2f;
      M[i] = f32_to_bf16(r() * 1e-3f), V[i] = f32_to_bf16(std::abs(r()) * 1e-5f);
    }
    auto P2 = P;
    auto M2 = M, V2 = V;
    const float w = mode == 2 ? 0.f : 0.1f;
    for (int64_t st = 1; st <= 3; ++st) {
      kernels::cpu::adam_step_bf16_master(P.data(), G.data(), M.data(), V.data(), true, k, lr, b1, b2, eps, w,
                                          mode == 0, true, st);
      kernels::cpu::adam_step_bf16_master_reference(P2.data(), G.data(), M2.data(), V2.data(), true, k, lr, b1, b2, eps,
                                                    w, mode == 0, true, st);
    }
    bad16 += std::memcmp(P.data(), P2.data(), 4 * k) != 0 || std::memcmp(M.data(), M2.data(), 2 * k) != 0 ||
             std::memcmp(V.data(), V2.data(), 2 * k) != 0;
  }
  std::printf("bf16 master + moments update vs its scalar reference: %s\n",
              bad16 ? "DIFFERENT BITS" : "bitwise identical");
  bad += bad16;
  std::printf("ratio to the triad: fp32 %.0f%%, bf16 states %.0f%% (target >= 70%%)\n", 100 * r32, 100 * r16);
  return bad ? 1 : 0;
}
