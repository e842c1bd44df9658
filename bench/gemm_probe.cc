// GEMM probe: the linear layer's three cuBLASLt products at GPT-2 shapes
// (M = 8192 tokens), timed with CUDA events, writing fp32 vs 16-bit outputs
// and with the bias epilogue in fp32 or bf16 — what the fp32 activations cost
// the products. Prints one JSON line per shape (TFLOP/s per variant), then the fused epilogues the MLP can use
// (bias gradient in the weight product, GELU + bias in fc's forward, GELU's gradient + fc's bias gradient in
// fc_proj's input gradient): time against the plain product and the largest error against a host reference.
// Usage (device machine): zerorun_gemm_probe [M]
#include <cuda_runtime.h>

#include <cmath>
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
using zerorun::kernels::Epilogue;
using zerorun::probe::bf16_value;
using zerorun::probe::fill_bf16;
float gelu(float v) { return 0.5f * v * (1.f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v))); }
float dgelu(float v) {
  const float t = std::tanh(0.7978845608f * (v + 0.044715f * v * v * v));
  return 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * 0.7978845608f * (1.f + 3.f * 0.044715f * v * v);
}
std::vector<uint16_t> down16(const void* d, size_t n) {
  std::vector<uint16_t> h(n);
  cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost);
  return h;
}
std::vector<float> down32(const void* d, size_t n) {
  std::vector<float> h(n);
  cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost);
  return h;
}
double rel(double got, double want, double scale) { return std::fabs(got - want) / std::max(std::fabs(want), scale); }

// The epilogues at fc's shapes (C = 768, 4C = 3072): ms per call for plain vs fused, and the largest relative error
// of the fused results against host sums (a few sampled rows for the products).
void epilogues(zerorun::kernels::LtGemm& lt, int64_t M) {
  const DType bf = DType::BF16;
  const int64_t C = 768, F = 3072;
  void* x = dev_alloc(M * C * 2);   // fc input [M, C]
  void* w = dev_alloc(F * C * 2);   // fc weight [F, C]; fc_proj's weight is [C, F]
  void* dy = dev_alloc(M * F * 2);  // a gradient [M, F] (fc's output) or [M, C] (fc_proj's)
  void* y = dev_alloc(M * F * 2);
  void* aux = dev_alloc(M * F * 2);
  void* dw = dev_alloc(F * C * 4);
  void* vec = dev_alloc(F * 4);
  void* b16 = dev_alloc(F * 2);
  const auto hx = fill_bf16(x, M * C, 11, 1.f), hw = fill_bf16(w, F * C, 12, 0.05f), hb = fill_bf16(b16, F, 13, 0.5f);
  auto hdy = fill_bf16(dy, M * F, 14, 1.f);
  const int64_t rows[] = {0, M / 2 + 3, M - 1};
  // 1. Weight product dW[F, C] += dY^T X with db[F] = column sums of dY.
  {
    const double plain = zerorun::probe::event_ms(
        [&] { lt.run(bf, true, false, F, C, M, dy, F, x, C, 1.f, dw, DType::F32, C, nullptr); });
    Epilogue e{Epilogue::BiasGradA, vec, DType::F32};
    const double fused = time_ms("dw with bias gradient",
                                 [&] { lt.run(bf, true, false, F, C, M, dy, F, x, C, 1.f, dw, DType::F32, C, e); });
    double err = -1;
    if (fused > 0) {
      const auto db = down32(vec, F);
      err = 0;
      for (int64_t j = 0; j < F; ++j) {
        double s = 0;
        for (int64_t m = 0; m < M; ++m) s += hdy[m * F + j];
        err = std::max(err, rel(db[j], s, 1.0));
      }
    }
    std::printf(
        "{\"epilogue\": \"dw + bias grad (fc)\", \"plain_ms\": %.4f, \"fused_ms\": %.4f, \"max_rel_err\": %.3g}\n",
        plain, fused, err);
  }
  // 2. fc forward: aux = X W^T + b, Y = gelu(aux), both bf16.
  {
    const double plain =
        zerorun::probe::event_ms([&] { lt.run(bf, false, true, M, F, C, x, C, w, C, 0.f, y, bf, F, b16, bf); });
    Epilogue e{Epilogue::GeluAuxBias, b16, bf, aux, F};
    const double fused =
        time_ms("fc forward with GELU", [&] { lt.run(bf, false, true, M, F, C, x, C, w, C, 0.f, y, bf, F, e); });
    double err = -1;
    if (fused > 0) {
      const auto hy = down16(y, M * F), ha = down16(aux, M * F);
      err = 0;
      for (int64_t r : rows)
        for (int64_t j = 0; j < F; ++j) {
          double s = hb[j];
          for (int64_t k = 0; k < C; ++k) s += hx[r * C + k] * hw[j * C + k];
          err = std::max(err, rel(bf16_value(ha[r * F + j]), s, 0.1));
          err = std::max(err, rel(bf16_value(hy[r * F + j]), gelu(static_cast<float>(s)), 0.1));
        }
    }
    std::printf("{\"epilogue\": \"fc fwd + gelu\", \"plain_ms\": %.4f, \"fused_ms\": %.4f, \"max_rel_err\": %.3g}\n",
                plain, fused, err);
  }
  // 3. fc_proj input gradient: dH[M, F] = (dY[M, C] W2[C, F]) * gelu'(aux), db1[F] = column sums of dH.
  {
    const double plain =
        zerorun::probe::event_ms([&] { lt.run(bf, false, false, M, F, C, dy, C, w, F, 0.f, y, bf, F, nullptr, bf); });
    hdy.resize(M * C);  // the first M*C values of dy serve as dY [M, C]; w viewed as W2 [C, F]
    struct V {
      Epilogue::Kind kind;
      DType vdt;
      const char* name;
    };
    for (const V& v :
         {V{Epilogue::DGelu, DType::F32, "dgelu"}, V{Epilogue::DGeluBiasGrad, DType::F32, "dgelu + f32 bias grad"},
          V{Epilogue::DGeluBiasGrad, bf, "dgelu + bf16 bias grad"}}) {
      Epilogue e{v.kind, vec, v.vdt, aux, F};
      const double fused = time_ms(std::string("fc_proj dx with ") + v.name,
                                   [&] { lt.run(bf, false, false, M, F, C, dy, C, w, F, 0.f, y, bf, F, e); });
      double err = -1, err_db = -1;
      if (fused > 0) {
        const auto hy = down16(y, M * F), ha = down16(aux, M * F);
        err = 0;
        for (int64_t r : rows)
          for (int64_t j = 0; j < F; ++j) {
            double s = 0;
            for (int64_t k = 0; k < C; ++k) s += hdy[r * C + k] * hw[k * F + j];
            err = std::max(err, rel(bf16_value(hy[r * F + j]), s * dgelu(bf16_value(ha[r * F + j])), 0.1));
          }
        if (v.kind == Epilogue::DGeluBiasGrad) {
          std::vector<float> db(F);
          if (v.vdt == DType::F32) {
            db = down32(vec, F);
          } else {
            const auto d16 = down16(vec, F);
            for (int64_t j = 0; j < F; ++j) db[j] = bf16_value(d16[j]);
          }
          err_db = 0;
          for (int64_t j = 0; j < F; ++j) {
            double s = 0;
            for (int64_t m = 0; m < M; ++m) s += bf16_value(hy[m * F + j]);
            err_db = std::max(err_db, rel(db[j], s, 1.0));
          }
        }
      }
      std::printf(
          "{\"epilogue\": \"fc_proj dx + %s\", \"plain_ms\": %.4f, \"fused_ms\": %.4f, \"max_rel_err\": %.3g, "
          "\"bias_grad_max_rel_err\": %.3g}\n",
          v.name, plain, fused, err, err_db);
    }
  }
  for (void* p : {x, w, dy, y, aux, dw, vec, b16}) cudaFree(p);
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
    void* res = dev_alloc(M * s.N * 4);
    Epilogue re{Epilogue::Bias, b32, DType::F32};
    re.addend = res;
    double f32res = time_ms(n + " fwd f32 out + residual", [&] {
      lt.run(bf, false, true, M, s.N, s.K, x, s.K, w, s.K, 1.f, y32, DType::F32, s.N, re);
    });
    cudaFree(res);
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
        "\"fwd_f32out_bias_residual_tflops\": %.1f, \"dx_f32_tflops\": %.1f, \"dx_bf16_tflops\": %.1f, "
        "\"dw_f32acc_tflops\": %.1f}\n",
        s.name, (long long)M, (long long)s.K, (long long)s.N, tf(f32b), tf(f16b), tf(f16bb), tf(f16), tf(f32res),
        tf(dx32), tf(dx16), tf(dwt));
    for (void* p : {x, w, dy, y32, y16, b32, b16, dw}) cudaFree(p);
  }
  epilogues(lt, M);
  return 0;
}
