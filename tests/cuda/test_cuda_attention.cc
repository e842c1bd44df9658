// The attention op on CUDA against the CPU op (forward output and qkv gradient, accumulated and overwritten) at
// every head size the kernels serve, with grouped-query heads read in place, odd sequence lengths, sliding windows
// (shorter than, equal to and longer than a tile, and past T), Gemma 2's soft-capping and other scales: the fp32
// flash kernels (head sizes up to 256), the materialised path (larger), and the tensor-core kernels in bf16 and
// fp16 (64, 80, 96, 128, 256: both backward paths, 16-bit storage on every side); per-document masking of packed
// sequences (AttnDims::pos) in every kernel family against the CPU kernels. Part of zerorun_cuda_tests
// (test_cuda_ops.cc holds its main).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/flash_attention.h"
#include "op_compare.h"
#include "zerorun/cuda_rt.h"
#include "zerorun/graph.h"
#include "zerorun/rng.h"

using namespace zerorun;

using namespace zerorun::cuda_test;

namespace {

json attn(int64_t H, int64_t K, int64_t window = 0, double softcap = 0, double scale = 0) {
  json a = {{"n_head", H}, {"n_kv_head", K}};
  if (window) a["window"] = window;
  if (softcap > 0) a["softcap"] = softcap;
  if (scale > 0) a["scale"] = scale;
  return a;
}
struct Case {
  int64_t B, T, H, K, window;
  double softcap, scale, amp;
};
// Deterministic mode for a scope (the tensor-core backward's two atomic-free kernels).
struct Deterministic {
  explicit Deterministic(bool on) { kernels::backend(kGpu).set_deterministic(on); }
  ~Deterministic() { kernels::backend(kGpu).set_deterministic(false); }
  Deterministic(const Deterministic&) = delete;
  Deterministic& operator=(const Deterministic&) = delete;
};

// Positions [B, T] of documents packed into rows: docs[b] lists row b's document lengths (the last one runs to T);
// a first entry -n says the row's first document continues one from before (its positions start at n).
std::vector<int32_t> doc_positions(int64_t T, const std::vector<std::vector<int64_t>>& docs) {
  std::vector<int32_t> pos;
  for (const auto& row : docs) {
    const bool cont = !row.empty() && row[0] < 0;
    int64_t t = 0;
    for (size_t i = cont ? 1 : 0; t < T; ++i) {
      const int64_t len = i < row.size() ? row[i] : T, p0 = cont && i == 1 ? -row[0] : 0;
      for (int64_t k = 0; k < len && t < T; ++k, ++t) pos.push_back(static_cast<int32_t>(p0 + k));
    }
  }
  return pos;
}
Tensor pos_tensor(const std::vector<int32_t>& pos) {
  Tensor t = Tensor::empty({static_cast<int64_t>(pos.size())}, DType::I32, MemCategory::Buffers);
  std::copy(pos.begin(), pos.end(), t.i32());
  return t.to(kGpu);
}

// Attention with documents (d.pos set here) on the GPU backend, through the flash kernels where it has them (the
// tensor-core ones in 16-bit mode) or the materialised path, against the CPU kernels on the same (rounded) inputs:
// the output and the qkv gradient (written over a NaN-filled one). Returns the worst relative difference.
double compare_docs(kernels::AttnDims d, const std::vector<int32_t>& pos, Rng& r, double amp, double tol, DType dt) {
  const int64_t W = d.width(), O = d.out_width();
  const Tensor x = rounded(rnd({d.B, d.T, W}, r, amp), dt), dout = rounded(rnd({d.B, d.T, O}, r), dt);
  Tensor out_c = Tensor::zeros({d.B, d.T, O}, DType::F32, MemCategory::Buffers);
  Tensor dx_c = Tensor::zeros({d.B, d.T, W}, DType::F32, MemCategory::Buffers);
  std::vector<float> probs(static_cast<size_t>(d.B * d.H * d.T * d.T));
  d.pos = pos.data();
  kernels::cpu::attention_fwd(x.f32(), out_c.f32(), probs.data(), d);
  kernels::cpu::attention_bwd(x.f32(), probs.data(), dout.f32(), dx_c.f32(), d);

  const Tensor pg = pos_tensor(pos), xg = x.to(kGpu), dg = dout.to(kGpu);
  d.pos = pg.i32();
  kernels::Backend& be = kernels::backend(kGpu);
  Tensor out_g = Tensor::zeros({d.B, d.T, O}, DType::F32, MemCategory::Buffers, kGpu);
  Tensor dx_g = nan_filled({d.B, d.T, W}, kGpu);
  if (be.has_flash_attention(d)) {
    Tensor lse = Tensor::uninit({d.B, d.H, d.T}, DType::F32, MemCategory::Buffers, kGpu);
    be.flash_attention_fwd({xg.f32(), nullptr}, {out_g.f32(), nullptr}, lse.f32(), d);
    be.flash_attention_bwd({xg.f32(), nullptr}, {out_g.f32(), nullptr}, lse.f32(), {dg.f32(), nullptr},
                           kernels::Grad(dx_g.f32(), false), d);
  } else {
    Tensor pr = Tensor::uninit({d.B, d.H, d.T, d.T}, DType::F32, MemCategory::Buffers, kGpu);
    be.attention_fwd(xg.f32(), out_g.f32(), pr.f32(), d);
    be.attention_bwd(xg.f32(), pr.f32(), dg.f32(), kernels::Grad(dx_g.f32(), false), d);
  }
  close(out_c, out_g, tol, "output");
  close(dx_c, dx_g, tol, "qkv gradient");
  double worst = 0, mx = 1e-6;
  const Tensor o = out_g.to(Device::cpu());
  for (int64_t i = 0; i < o.numel(); ++i) mx = std::max(mx, (double)std::fabs(out_c.f32()[i]));
  for (int64_t i = 0; i < o.numel(); ++i) worst = std::max(worst, std::fabs(o.f32()[i] - out_c.f32()[i]) / mx);
  return worst;
}

// Rows of odd T packed with documents of several lengths: one token, shorter and longer than a 64-row tile, ending
// inside and at a tile's edge, a row continuing a document from before (positions from 5), a row of one document.
const int64_t kDocT = 333;
const std::vector<std::vector<int64_t>> kDocs = {{1, 70, 130, 5, 63, 64}, {-5, 200}, {}};
}  // namespace

TEST_CASE("CUDA attention (fp32 kernels) equals the CPU: head sizes, grouped-query heads, windows, soft-capping",
          "[cuda][attention]") {
  Rng r(41);
  // {B, T, H, K, window, softcap, scale, input amplitude}
  const Case cases[] = {{2, 37, 4, 2, 0, 0, 0, 1.0},
                        {1, 97, 3, 1, 5, 0, 0, 1.0},
                        {2, 70, 2, 2, 33, 3.0, 0, 2.0},
                        {1, 45, 4, 1, 64, 0, 0.3, 1.0},
                        {1, 33, 2, 1, 100, 2.0, 0.2, 2.0}};
  for (int64_t D : {16, 64, 80, 100, 128, 160, 256, 288}) {  // 288: the materialised (T x T) path
    for (const Case& c : cases) {
      INFO("D " << D << " B " << c.B << " T " << c.T << " H " << c.H << " K " << c.K << " window " << c.window
                << " softcap " << c.softcap << " scale " << c.scale);
      compare_op("attention", attn(c.H, c.K, c.window, c.softcap, c.scale),
                 {rnd({c.B, c.T, (c.H + 2 * c.K) * D}, r, c.amp)}, {}, 5e-5);
    }
  }
}

TEST_CASE("tensor-core attention equals the CPU at head sizes 64, 80, 96, 128, 256 (bf16, fp16; both backward paths)",
          "[cuda][attention]") {
  const Case cases[] = {{2, 97, 4, 2, 0, 0, 0, 1.0},       // grouped-query, odd T
                        {1, 257, 3, 1, 40, 0, 0, 2.0},     // window inside a tile, 5 tiles (a partial one)
                        {2, 130, 2, 2, 64, 5.0, 0, 3.0},   // window of a tile, soft-capping that bends the scores
                        {1, 200, 6, 2, 150, 0, 0.2, 2.0},  // window longer than a tile, another scale
                        {1, 65, 2, 1, 0, 2.0, 0, 2.0}};    // soft-capping alone
  for (DType dt : {DType::BF16, DType::F16}) {
    MatmulDtype mode(dt);
    for (bool det : {false, true}) {
      Deterministic dm(det);
      Rng r(42);
      for (int64_t D : {64, 80, 96, 128, 256}) {
        for (const Case& c : cases) {
          INFO(dtype_name(dt) << (det ? " deterministic" : " atomics") << " D " << D << " B " << c.B << " T " << c.T
                              << " H " << c.H << " K " << c.K << " window " << c.window << " softcap " << c.softcap
                              << " scale " << c.scale);
          kernels::AttnDims d;
          d.B = c.B, d.T = c.T, d.H = c.H, d.K = c.K, d.D = D, d.window = c.window, d.softcap = (float)c.softcap;
          d.scale = c.scale > 0 ? (float)c.scale : 1.f / std::sqrt((float)D);
          REQUIRE(kernels::backend(kGpu).attention16(d));  // the tensor-core kernels serve it
          // 16-bit operands: the CPU computes in f32 from the same values; the GPU rounds P and dS to 16 bits.
          const double worst = compare_op("attention", attn(c.H, c.K, c.window, c.softcap, c.scale),
                                          {rnd({c.B, c.T, (c.H + 2 * c.K) * D}, r, c.amp)}, {}, 3e-2, dt);
          REQUIRE(worst > 1e-6);  // visibly 16-bit products: the tensor-core path ran
        }
      }
    }
  }
}

TEST_CASE("tensor-core attention with 16-bit storage on every side, grouped-query heads, a window and a cap",
          "[cuda][attention]") {
  for (DType dt : {DType::BF16, DType::F16}) {
    MatmulDtype mode(dt);
    Rng r(43);
    const Storage16 all{{true}, true, true, true, true};
    for (int64_t D : {64, 80, 96, 128, 256}) {
      INFO("D " << D);
      compare_op16("attention", attn(4, 2, 50, 4.0), {rnd({2, 131, 8 * D}, r, 2.0)}, {}, all, dt);
      compare_op16("attention", attn(3, 1), {rnd({1, 77, 5 * D}, r)}, {}, {{false}, false, true, true, false}, dt);
    }
  }
}

TEST_CASE(
    "tensor-core attention backward: every variant and the grouped-query split (dK, dV by atomics) equal the "
    "atomic-free kernels",
    "[cuda][attention]") {
  // Every backward variant of head sizes 80..256 (dQ by atomics, or the pair), and variant 0 with
  // flash::tc_backward's gqa_split (the backend's default), plain and windowed + capped (variant 0: 128-key blocks
  // at 96 and 128, with and without the split), each gradient
  // form (16-bit written, f32 written, f32 added into `start`), against the two atomic-free kernels: the sums of dQ
  // (and of dK, dV when split) run in another order.
  Rng r(44);
  for (int64_t D : {64, 80, 96, 128, 256})
    for (int opt = 0; opt < 2; ++opt) {
      kernels::AttnDims d;
      d.B = 2, d.T = 131, d.H = 6, d.K = 2, d.D = D, d.scale = 1.f / std::sqrt((float)D);
      if (opt) d.window = 50, d.softcap = 4.f;
      const int64_t n3 = d.B * d.T * d.width(), n = d.B * d.T * d.out_width(), nl = d.B * d.H * d.T;
      auto bits16 = [&](int64_t count, double scale) { return to16(rnd({count}, r, scale), DType::BF16).to(kGpu); };
      Tensor qkv = bits16(n3, 2.0), dout = bits16(n, 1.0), start = rnd({n3}, r).to(kGpu);
      Tensor out = Tensor::uninit({n}, DType::BF16, MemCategory::Buffers, kGpu);
      Tensor lse = Tensor::uninit({nl}, DType::F32, MemCategory::Buffers, kGpu);
      Tensor delta = Tensor::uninit({nl}, DType::F32, MemCategory::Buffers, kGpu);
      Tensor acc = Tensor::uninit({n3}, DType::F32, MemCategory::Buffers, kGpu);
      auto q16 = [](const Tensor& t) { return static_cast<uint16_t*>(t.raw()); };
      kernels::flash::tc_forward(true, q16(qkv), nullptr, q16(out), lse.f32(), d);
      // {variant, split}: the reference first (no dQ accumulator: the atomic-free kernels).
      std::vector<std::pair<int, bool>> runs = {{-1, false}, {0, false}, {0, true}};
      if (D != 64 && !opt)  // (64's variants: test_cuda_ops.cc; only variant 0 takes a window or a cap there)
        for (int v = 1; v < kernels::flash::tc_backward_configs(D); ++v) runs.push_back({v, false});
      for (int form = 0; form < 3; ++form) {
        Tensor ref;
        for (auto [variant, split] : runs) {
          INFO("D " << D << (opt ? " window 50, softcap 4" : "") << " form " << form << " variant " << variant
                    << (split ? " split" : ""));
          Tensor g = form == 0 ? Tensor::uninit({n3}, DType::BF16, MemCategory::Buffers, kGpu)
                               : (form == 2 ? start.clone(MemCategory::Buffers)
                                            : Tensor::uninit({n3}, DType::F32, MemCategory::Buffers, kGpu));
          kernels::flash::tc_backward(true, q16(qkv), nullptr, q16(out), lse.f32(), q16(dout), form ? g.f32() : nullptr,
                                      form ? nullptr : q16(g), form == 2, delta.f32(),
                                      variant < 0 ? nullptr : acc.f32(), d, std::max(variant, 0), split);
          if (variant < 0) {
            ref = as_f32(g);
            continue;
          }
          close(ref, as_f32(g), form ? 2e-5 : 8e-3, "backward variant " + std::to_string(variant));
        }
      }
    }
}

TEST_CASE("CUDA attention with documents (pos) equals the CPU: fp32 flash, materialised and tensor-core kernels",
          "[cuda][attention]") {
  const std::vector<int32_t> pos = doc_positions(kDocT, kDocs);
  REQUIRE(pos.size() == 3 * kDocT);
  // {H, K, window, softcap}
  const std::tuple<int64_t, int64_t, int64_t, float> opts[] = {
      {4, 2, 0, 0.f}, {3, 1, 40, 0.f}, {2, 2, 150, 0.f}, {6, 2, 0, 5.f}, {2, 1, 64, 3.f}};
  Rng r(45);
  for (auto [H, K, window, cap] : opts) {
    kernels::AttnDims d;
    d.B = 3, d.T = kDocT, d.H = H, d.K = K, d.window = window, d.softcap = cap;
    for (int64_t D : {16, 64, 128, 256, 288}) {  // fp32 flash up to 256; 288: the materialised path
      INFO("f32 D " << D << " H " << H << " K " << K << " window " << window << " softcap " << cap);
      d.D = D, d.scale = 1.f / std::sqrt((float)D);
      REQUIRE(kernels::backend(kGpu).has_flash_attention(d) == (D <= 256));
      compare_docs(d, pos, r, 1.0, 5e-5, DType::F32);
    }
    for (DType dt : {DType::BF16, DType::F16}) {
      MatmulDtype mode(dt);
      for (bool det : {false, true}) {
        Deterministic dm(det);
        for (int64_t D : {64, 80, 96, 128, 256}) {
          INFO(dtype_name(dt) << (det ? " deterministic" : " atomics") << " D " << D << " H " << H << " K " << K
                              << " window " << window << " softcap " << cap);
          d.D = D, d.scale = 1.f / std::sqrt((float)D);
          REQUIRE(kernels::backend(kGpu).attention16(d));
          REQUIRE(compare_docs(d, pos, r, 2.0, 3e-2, dt) > 1e-6);  // visibly 16-bit: the tensor-core path ran
        }
      }
    }
  }
}

TEST_CASE(
    "tensor-core attention with documents: the one-kernel backward and the grouped-query split equal the "
    "atomic-free kernels",
    "[cuda][attention]") {
  Rng r(46);
  const std::vector<int32_t> pos = doc_positions(kDocT, kDocs);
  const Tensor pg = pos_tensor(pos);
  for (int64_t D : {64, 80, 96, 128, 256})
    for (int64_t window : {0, 100}) {
      kernels::AttnDims d;
      d.B = 3, d.T = kDocT, d.H = 6, d.K = 2, d.D = D, d.scale = 1.f / std::sqrt((float)D), d.window = window;
      d.pos = pg.i32();
      const int64_t n3 = d.B * d.T * d.width(), n = d.B * d.T * d.out_width(), nl = d.B * d.H * d.T;
      auto bits16 = [&](int64_t count, double scale) { return to16(rnd({count}, r, scale), DType::BF16).to(kGpu); };
      Tensor qkv = bits16(n3, 2.0), dout = bits16(n, 1.0);
      Tensor out = Tensor::uninit({n}, DType::BF16, MemCategory::Buffers, kGpu);
      Tensor lse = Tensor::uninit({nl}, DType::F32, MemCategory::Buffers, kGpu);
      Tensor delta = Tensor::uninit({nl}, DType::F32, MemCategory::Buffers, kGpu);
      Tensor acc = Tensor::uninit({n3}, DType::F32, MemCategory::Buffers, kGpu);
      auto q16 = [](const Tensor& t) { return static_cast<uint16_t*>(t.raw()); };
      kernels::flash::tc_forward(true, q16(qkv), nullptr, q16(out), lse.f32(), d);
      Tensor ref;
      for (int run = 0; run < 3; ++run) {  // atomic-free, one kernel, one kernel split
        INFO("D " << D << " window " << window << " run " << run);
        Tensor g = Tensor::uninit({n3}, DType::F32, MemCategory::Buffers, kGpu);
        kernels::flash::tc_backward(true, q16(qkv), nullptr, q16(out), lse.f32(), q16(dout), g.f32(), nullptr, false,
                                    delta.f32(), run ? acc.f32() : nullptr, d, 0, run == 2);
        if (run == 0)
          ref = as_f32(g);
        else
          close(ref, as_f32(g), 2e-5, "backward run " + std::to_string(run));
      }
    }
}
