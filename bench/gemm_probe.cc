// GEMM probe: the linear layer's three cuBLASLt products at GPT-2 shapes
// (M = 8192 tokens), timed with CUDA events, writing fp32 vs 16-bit outputs
// and with the bias epilogue in fp32 or bf16 — what the fp32 activations cost
// the products. Prints one JSON line per shape (TFLOP/s per variant).
// Usage (device machine): zerorun_gemm_probe [M]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench/probe_util.h"
#include "kernels/cuda/lt_gemm.h"
#include "zerorun/error.h"

using zerorun::DType;

namespace {
using zerorun::probe::dev_alloc;
// Milliseconds per call, or -1 with the reason printed when the variant cannot run.
double time_ms(const std::string& what, const std::function<void()>& f) {
  try {
    return zerorun::probe::event_ms(f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", what.c_str(), e.what());
    return -1;
  }
}
}  // namespace

int main(int argc, char** argv) {
  const int64_t M = argc > 1 ? std::atoll(argv[1]) : 8192;
  struct Shape {
    const char* name;
    int64_t K, N;
  };
  const std::vector<Shape> shapes = {
      {"qkv", 768, 2304}, {"attn_proj", 768, 768}, {"fc", 768, 3072}, {"fc_proj", 3072, 768}, {"lm_head", 768, 50304}};
  zerorun::kernels::LtGemm lt;
  const DType bf = DType::BF16;
  for (auto& s : shapes) {
    void* x = dev_alloc(M * s.K * 2);
    void* w = dev_alloc(s.N * s.K * 2);
    void* dy = dev_alloc(M * s.N * 2);
    void* y32 = dev_alloc(M * std::max(s.N, s.K) * 4);
    void* y16 = dev_alloc(M * std::max(s.N, s.K) * 2);
    void* b32 = dev_alloc(s.N * 4);
    void* b16 = dev_alloc(s.N * 2);
    void* dw = dev_alloc(s.N * s.K * 4);
    const double fl = 2.0 * M * s.K * s.N;
    auto tf = [&](double ms) { return ms > 0 ? fl / ms / 1e9 : -1.0; };
    std::string n = s.name;
    double f32b = time_ms(n + " fwd f32 out", [&] {
      lt.run(bf, false, true, M, s.N, s.K, x, s.K, w, s.K, 0.f, y32, DType::F32, s.N, b32, DType::F32);
    });
    double f16b = time_ms(n + " fwd bf16 out f32 bias", [&] {
      lt.run(bf, false, true, M, s.N, s.K, x, s.K, w, s.K, 0.f, y16, bf, s.N, b32, DType::F32);
    });
    double f16bb = time_ms(n + " fwd bf16 out bf16 bias",
                           [&] { lt.run(bf, false, true, M, s.N, s.K, x, s.K, w, s.K, 0.f, y16, bf, s.N, b16, bf); });
    double f16 = time_ms(n + " fwd bf16 out",
                         [&] { lt.run(bf, false, true, M, s.N, s.K, x, s.K, w, s.K, 0.f, y16, bf, s.N, nullptr, bf); });
    double dx32 = time_ms(n + " dx f32", [&] {
      lt.run(bf, false, false, M, s.K, s.N, dy, s.N, w, s.K, 0.f, y32, DType::F32, s.K, nullptr);
    });
    double dx16 = time_ms(n + " dx bf16",
                          [&] { lt.run(bf, false, false, M, s.K, s.N, dy, s.N, w, s.K, 0.f, y16, bf, s.K, nullptr); });
    double dwt = time_ms(n + " dw f32 acc", [&] {
      lt.run(bf, true, false, s.N, s.K, M, dy, s.N, x, s.K, 1.f, dw, DType::F32, s.K, nullptr);
    });
    std::printf(
        "{\"shape\": \"%s\", \"M\": %lld, \"K\": %lld, \"N\": %lld, \"fwd_f32out_bias_tflops\": %.1f, "
        "\"fwd_bf16out_f32bias_tflops\": %.1f, \"fwd_bf16out_bf16bias_tflops\": %.1f, \"fwd_bf16out_tflops\": %.1f, "
        "\"dx_f32_tflops\": %.1f, \"dx_bf16_tflops\": %.1f, \"dw_f32acc_tflops\": %.1f}\n",
        s.name, (long long)M, (long long)s.K, (long long)s.N, tf(f32b), tf(f16b), tf(f16bb), tf(f16), tf(dx32),
        tf(dx16), tf(dwt));
    for (void* p : {x, w, dy, y32, y16, b32, b16, dw}) cudaFree(p);
  }
  return 0;
}
