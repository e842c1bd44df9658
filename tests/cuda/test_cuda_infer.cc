// CUDA-vs-CPU checks of the kernels `zerorun sample` and packed training lean on that no graph-op comparison
// reaches: rope with per-row positions (packed documents restarting at 0, a decode step continuing at len) forward
// and backward, and attention over a key/value cache (prefill, then one token at a time) with grouped-query heads,
// a sliding window and soft-capping, on the same inputs as the CPU kernels. Part of zerorun_cuda_tests.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "op_compare.h"

using namespace zerorun;
using namespace zerorun::cuda_test;

namespace {
kernels::cpu::RopeFreqs freqs(int64_t D, double theta) {
  kernels::cpu::RopeFreqs f;
  for (int64_t i = 0; i < D / 2; ++i)
    f.inv[i] = static_cast<float>(1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(D)));
  return f;
}
Tensor i32_tensor(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::I32, MemCategory::Buffers);
  std::copy(v.begin(), v.end(), t.i32());
  return t;
}
}  // namespace

TEST_CASE("cuda rope with per-row positions matches cpu (packed documents, decode offsets), forward and backward",
          "[cuda][infer]") {
  Rng r(53);
  const int64_t B = 2, T = 37, H = 4, K = 2, D = 128, n_pos = 300;
  // Row 0: documents of 10, 1 and 26 tokens; row 1: a continuation starting at 250 (a decode step's offsets).
  std::vector<int32_t> pos;
  for (int64_t t = 0; t < T; ++t) pos.push_back(static_cast<int32_t>(t < 10 ? t : t < 11 ? 0 : t - 11));
  for (int64_t t = 0; t < T; ++t) pos.push_back(static_cast<int32_t>(250 + t));
  const kernels::cpu::RopeFreqs f = freqs(D, 500000.0);
  for (bool repeat : {true, false}) {
    INFO("repeat " << repeat);
    const int64_t W = (H + 2 * K) * D, O = repeat ? 3 * H * D : W;
    const Tensor x = rnd({B, T, W}, r), dout = rnd({B, T, O}, r);
    Tensor out_c = Tensor::zeros({B, T, O}, DType::F32, MemCategory::Buffers);
    Tensor dx_c = Tensor::zeros({B, T, W}, DType::F32, MemCategory::Buffers);
    kernels::cpu::rope_fwd(x.f32(), out_c.f32(), B, T, H, K, D, f, repeat, pos.data(), n_pos);
    kernels::cpu::rope_bwd(dout.f32(), dx_c.f32(), B, T, H, K, D, f, repeat, pos.data(), n_pos);

    kernels::Backend& be = kernels::backend(kGpu);
    const Tensor xg = x.to(kGpu), dg = dout.to(kGpu), pg = i32_tensor(pos).to(kGpu);
    Tensor out_g = nan_filled({B, T, O}, kGpu);
    Tensor dx_g = Tensor::zeros({B, T, W}, DType::F32, MemCategory::Buffers, kGpu);
    be.rope_fwd({xg.f32(), nullptr}, {out_g.f32(), nullptr}, B, T, H, K, D, f, repeat, pg.i32(), n_pos);
    be.rope_bwd({dg.f32(), nullptr}, kernels::Grad(dx_g.f32(), true), B, T, H, K, D, f, repeat, pg.i32(), n_pos);
    close(out_c, out_g, 1e-6, "rope output");
    close(dx_c, dx_g, 1e-6, "rope gradient");
  }
}

TEST_CASE("cuda attention over a key/value cache matches cpu: prefill then single tokens, GQA, window, softcap",
          "[cuda][infer]") {
  Rng r(59);
  struct Case {
    int64_t H, K, D, window;
    float softcap;
  };
  const Case cases[] = {
      {4, 4, 64, 0, 0.f}, {8, 2, 128, 0, 0.f}, {4, 1, 128, 7, 0.f}, {4, 2, 256, 0, 30.f}, {3, 1, 80, 5, 20.f}};
  for (const Case& c : cases) {
    INFO("H " << c.H << " K " << c.K << " D " << c.D << " window " << c.window << " softcap " << c.softcap);
    const int64_t cap = 40, prefill = 13, steps = 9;
    kernels::AttnDims d;
    d.B = 1, d.H = c.H, d.K = c.K, d.D = c.D, d.window = c.window, d.softcap = c.softcap;
    d.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.D)));
    const int64_t W = d.width(), O = d.out_width();
    Tensor kc_c = Tensor::zeros({c.K, cap, c.D}, DType::F32, MemCategory::Buffers);
    Tensor vc_c = Tensor::zeros({c.K, cap, c.D}, DType::F32, MemCategory::Buffers);
    Tensor kc_g = Tensor::zeros({c.K, cap, c.D}, DType::F32, MemCategory::Buffers, kGpu);
    Tensor vc_g = Tensor::zeros({c.K, cap, c.D}, DType::F32, MemCategory::Buffers, kGpu);
    kernels::Backend& be = kernels::backend(kGpu);
    int64_t len = 0;
    for (int64_t step = 0; step <= steps; ++step) {
      const int64_t n = step == 0 ? prefill : 1;
      INFO("step " << step << " (len " << len << ", new " << n << ")");
      d.T = n;
      const Tensor x = rnd({1, n, W}, r, 2.0);
      Tensor out_c = Tensor::zeros({1, n, O}, DType::F32, MemCategory::Buffers);
      kernels::cpu::attention_cached(x.f32(), kc_c.f32(), vc_c.f32(), out_c.f32(), d, len, cap);
      const Tensor xg = x.to(kGpu);
      Tensor out_g = nan_filled({1, n, O}, kGpu);
      be.attention_cached(xg.f32(), kc_g.f32(), vc_g.f32(), out_g.f32(), d, len, cap);
      close(out_c, out_g, 2e-5, "cached attention output");
      len += n;
    }
    // The caches hold the same keys and values (the rows written so far; the rest untouched zeros on both sides).
    close(kc_c, kc_g, 0.0, "key cache");
    close(vc_c, vc_g, 0.0, "value cache");
  }
}
