// The attention op on CUDA against the CPU op (forward output and qkv gradient, accumulated and overwritten) at
// every head size the kernels serve, with grouped-query heads read in place, odd sequence lengths, sliding windows
// (shorter than, equal to and longer than a tile, and past T), Gemma 2's soft-capping and other scales: the fp32
// flash kernels (head sizes up to 256), the materialised path (larger), and the tensor-core kernels in bf16 and
// fp16 (64, 80, 96, 128, 256: both backward paths, 16-bit storage on every side). Part of zerorun_cuda_tests
// (test_cuda_ops.cc holds its main).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/flash_attention.h"
#include "zerorun/cuda_rt.h"
#include "zerorun/graph.h"
#include "zerorun/rng.h"

using namespace zerorun;

namespace {
const Device kGpu = Device::cuda(0);

Tensor rnd(const Shape& s, Rng& r, double scale = 1.0) {
  Tensor t = Tensor::empty(s, DType::F32, MemCategory::Buffers);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = static_cast<float>((2 * r.uniform() - 1) * scale);
  return t;
}
void close(const Tensor& cpu, const Tensor& gpu, double tol, const std::string& what) {
  Tensor g = gpu.to(Device::cpu());
  REQUIRE(g.numel() == cpu.numel());
  double mx = 1e-6;
  for (int64_t i = 0; i < cpu.numel(); ++i) mx = std::max(mx, std::fabs(static_cast<double>(cpu.f32()[i])));
  double worst = 0;
  int64_t at = 0;
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    double d = std::fabs(static_cast<double>(cpu.f32()[i]) - g.f32()[i]) / mx;
    if (!std::isfinite(d)) d = INFINITY;  // a NaN left in an output fails, not compares false
    if (d > worst) worst = d, at = i;
  }
  INFO(what << ": worst relative difference " << worst << " at " << at << " (cpu " << cpu.f32()[at] << ", cuda "
            << g.f32()[at] << ")");
  REQUIRE(worst <= tol);
}

// A fresh f32 gradient filled with NaN on dev: an op that overwrites it must write every entry.
Tensor nan_filled(const Shape& shape, Device dev) {
  Tensor g = Tensor::empty(shape, DType::F32, MemCategory::Buffers);
  for (int64_t i = 0; i < g.numel(); ++i) g.f32()[i] = std::nanf("");
  return g.to(dev);
}

struct Run {
  std::vector<Tensor> out, din;
  std::map<std::string, Tensor> dparams;
};
// overwrite: inputs the op writes (Op::writes_grad) get NaN-filled fresh gradients with din_acc false.
Run run_op(const Node& n, const std::vector<Tensor>& in, const std::map<std::string, Tensor>& params,
           const Tensor& dout_cpu, Device dev, bool overwrite = false) {
  const Op& op = op_lookup(n.op);
  NodeCtx c;
  c.node = &n;
  std::vector<Tensor> saved;
  c.saved = &saved;
  for (auto& t : in) c.in.push_back(t.to(dev));
  for (auto& [k, t] : params) c.params[k] = t.to(dev);
  op.forward(c);
  c.dout = {dout_cpu.to(dev)};
  for (size_t k = 0; k < c.in.size(); ++k) {
    const Tensor& t = c.in[k];
    const bool w = overwrite && t.dtype() == DType::F32 && op.writes_grad(k);
    Tensor g;
    if (w) {
      g = nan_filled(t.shape(), dev);
    } else if (t.dtype() == DType::F32) {
      g = Tensor::zeros(t.shape(), DType::F32, MemCategory::Buffers, dev);
    }
    c.din.push_back(g);
    c.din_acc.push_back(!w);
  }
  for (auto& [k, t] : c.params) c.dparams[k] = Tensor::zeros(t.shape(), DType::F32, MemCategory::Buffers, dev);
  op.backward(c);
  return {c.out, c.din, c.dparams};
}

Tensor rounded(const Tensor& t, DType dt) {
  if (dt == DType::F32 || t.dtype() != DType::F32) return t;
  Tensor r = t.clone();
  kernels::cpu_backend().round_to(dt, t.f32(), r.f32(), t.numel());
  return r;
}

// A one-node graph's node for `opname`, and an upstream gradient for its output (a scalar output gets 0.75).
Node op_node(const std::string& opname, json attrs) {
  Node n;
  n.op = opname;
  n.block = "b";
  n.out = {"y"};
  n.attrs = attrs.is_null() ? json::object() : std::move(attrs);
  return n;
}
Tensor upstream_grad(const Node& n, const std::vector<Tensor>& in, const std::map<std::string, Tensor>& params,
                     uint64_t seed) {
  std::vector<ValueInfo> vin;
  for (auto& t : in) vin.push_back({t.shape(), t.dtype()});
  std::map<std::string, Shape> ps;
  for (auto& [k, t] : params) ps[k] = t.shape();
  Shape os = op_lookup(n.op).infer(n, vin, ps)[0].shape;
  Rng r(seed);
  Tensor dout = os.empty() ? Tensor::empty({}, DType::F32) : rnd(os, r);
  if (os.empty()) dout.f32()[0] = 0.75f;
  return dout;
}

// Worst relative difference of the op's forward output, CPU vs CUDA.
double compare_op(const std::string& opname, json attrs, std::vector<Tensor> in, std::map<std::string, Tensor> params,
                  double tol = 2e-5, DType pre_round = DType::F32) {
  INFO("op " << opname);
  const Node n = op_node(opname, std::move(attrs));
  Tensor dout = upstream_grad(n, in, params, 5);
  // Pre-rounded operands make 16-bit products exact in fp32 on both sides.
  for (auto& t : in) t = rounded(t, pre_round);
  for (auto& [k, t] : params) t = rounded(t, pre_round);
  dout = rounded(dout, pre_round);
  Run a = run_op(n, in, params, dout, Device::cpu());
  Run b = run_op(n, in, params, dout, kGpu);
  Run bw = run_op(n, in, params, dout, kGpu, true);
  close(a.out[0], b.out[0], tol, "output");
  for (size_t k = 0; k < in.size(); ++k)
    if (a.din[k].defined()) {
      close(a.din[k], b.din[k], tol, "input grad " + std::to_string(k));
      close(a.din[k], bw.din[k], tol, "input grad " + std::to_string(k) + " (overwriting a fresh gradient)");
    }
  for (auto& [k, t] : a.dparams) close(t, b.dparams[k], tol, "param grad " + k);
  Tensor g = b.out[0].to(Device::cpu());
  double mx = 1e-6, worst = 0;
  for (int64_t i = 0; i < g.numel(); ++i) mx = std::max(mx, std::fabs(static_cast<double>(a.out[0].f32()[i])));
  for (int64_t i = 0; i < g.numel(); ++i) worst = std::max(worst, std::fabs(a.out[0].f32()[i] - g.f32()[i]) / mx);
  return worst;
}
// ---- 16-bit activation storage --------------------------------------------------------------
// A 16-bit copy (bits of `dt`) of an f32 CPU tensor, and back to f32.
Tensor to16(const Tensor& t, DType dt) {
  Tensor h = Tensor::empty(t.shape(), dt, MemCategory::Buffers);
  auto* b = h.data<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) b[i] = dt == DType::BF16 ? f32_to_bf16(t.f32()[i]) : f32_to_f16(t.f32()[i]);
  return h;
}
Tensor as_f32(const Tensor& t) {
  Tensor c = t.to(Device::cpu());
  if (c.dtype() == DType::F32) return c;
  Tensor f = Tensor::empty(c.shape(), DType::F32, MemCategory::Buffers);
  const auto* b = c.data<uint16_t>();
  for (int64_t i = 0; i < c.numel(); ++i) f.f32()[i] = c.dtype() == DType::BF16 ? bf16_to_f32(b[i]) : f16_to_f32(b[i]);
  return f;
}

struct Storage16 {
  std::vector<bool> in16;  // inputs handed over in 16 bits
  bool out16 = false;      // the executor asks for a 16-bit output
  bool dout16 = false;     // the output gradient arrives in 16 bits
  bool din16 = false;      // 16-bit input gradients where the op writes them (Op::writes_grad16)
  bool expect_out16 = false;
};
// The op on CUDA with 16-bit storage where `st` says, against the CPU op on the same (rounded) values.
void compare_op16(const std::string& opname, json attrs, std::vector<Tensor> in, std::map<std::string, Tensor> params,
                  const Storage16& st, DType dt, double tol = 3e-2) {
  INFO("op " << opname << " (16-bit storage, " << dtype_name(dt) << ")");
  const Node n = op_node(opname, std::move(attrs));
  const Op& op = op_lookup(opname);
  Tensor dout = upstream_grad(n, in, params, 9);
  for (size_t k = 0; k < in.size(); ++k)
    if (st.in16[k]) in[k] = rounded(in[k], dt);
  if (st.dout16) dout = rounded(dout, dt);
  Run ref = run_op(n, in, params, dout, Device::cpu());

  NodeCtx c;
  c.node = &n;
  std::vector<Tensor> saved;
  c.saved = &saved;
  for (size_t k = 0; k < in.size(); ++k) c.in.push_back((st.in16[k] ? to16(in[k], dt) : in[k]).to(kGpu));
  for (auto& [k, t] : params) c.params[k] = t.to(kGpu);
  c.out16 = {st.out16};
  op.forward(c);
  REQUIRE((c.out[0].dtype() != DType::F32) == st.expect_out16);
  c.dout = {(st.dout16 ? to16(dout, dt) : dout).to(kGpu)};
  std::vector<bool> g16;
  for (size_t k = 0; k < c.in.size(); ++k) {
    const Tensor& t = c.in[k];
    Tensor g;
    const bool h = st.din16 && op.writes_grad16(c, k);
    g16.push_back(h);
    if (h) {
      g = Tensor::uninit(t.shape(), dt, MemCategory::Buffers, kGpu);  // poisoned under ZERORUN_POISON_UNINIT
    } else if (t.dtype() != DType::I32) {
      g = nan_filled(t.shape(), kGpu);
    }
    c.din.push_back(g);
    c.din_acc.push_back(!(h || op.writes_grad(k)));
    if (!h && !op.writes_grad(k) && g.defined()) c.din.back().zero_();
  }
  for (auto& [k, t] : c.params) c.dparams[k] = Tensor::zeros(t.shape(), DType::F32, MemCategory::Buffers, kGpu);
  op.backward(c);
  close(ref.out[0], as_f32(c.out[0]), tol, "output");
  for (size_t k = 0; k < in.size(); ++k)
    if (ref.din[k].defined())
      close(ref.din[k], as_f32(c.din[k]), tol, "input grad " + std::to_string(k) + (g16[k] ? " (16-bit)" : ""));
  for (auto& [k, t] : ref.dparams) close(t, c.dparams[k], tol, "param grad " + k);
}
// Sets the GPU's matmul dtype for a scope; back to f32 however the scope ends (a failed check must not leave the
// next test case in 16 bits).
struct MatmulDtype {
  explicit MatmulDtype(DType dt) { kernels::backend(kGpu).set_matmul_dtype(dt); }
  ~MatmulDtype() { kernels::backend(kGpu).set_matmul_dtype(DType::F32); }
  MatmulDtype(const MatmulDtype&) = delete;
  MatmulDtype& operator=(const MatmulDtype&) = delete;
};

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
  // Every one-kernel variant of head sizes 80..256 (dQ by atomics; at 128 variant 0 is the two kernels), and variant
  // 0 with flash::tc_backward's gqa_split (ZERORUN_ATTN_GQA_SPLIT=1), plain and windowed + capped, each gradient
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
