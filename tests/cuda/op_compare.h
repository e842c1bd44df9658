// The CUDA-vs-CPU op harness shared by the zerorun_cuda_tests files: random tensors, closeness checks, and
// compare_op / compare_op16, which run one graph op on the CPU and the GPU (forward, input and parameter gradients,
// accumulated and overwritten, and 16-bit storage where asked) and check them against each other.
#pragma once
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "zerorun/cuda_rt.h"
#include "zerorun/graph.h"
#include "zerorun/rng.h"

namespace zerorun::cuda_test {
const Device kGpu = Device::cuda(0);

inline Tensor rnd(const Shape& s, Rng& r, double scale = 1.0) {
  Tensor t = Tensor::empty(s, DType::F32, MemCategory::Buffers);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = static_cast<float>((2 * r.uniform() - 1) * scale);
  return t;
}
inline Tensor ids(const Shape& s, int64_t V, Rng& r) {
  Tensor t = Tensor::empty(s, DType::I32, MemCategory::Buffers);
  for (int64_t i = 0; i < t.numel(); ++i) t.i32()[i] = static_cast<int32_t>(r.next() % V);
  return t;
}
inline void close(const Tensor& cpu, const Tensor& gpu, double tol, const std::string& what) {
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
inline Tensor nan_filled(const Shape& shape, Device dev) {
  Tensor g = Tensor::empty(shape, DType::F32, MemCategory::Buffers);
  for (int64_t i = 0; i < g.numel(); ++i) g.f32()[i] = std::nanf("");
  return g.to(dev);
}

struct Run {
  std::vector<Tensor> out, din;
  std::map<std::string, Tensor> dparams;
};
// overwrite: inputs the op writes (Op::writes_grad) get NaN-filled fresh gradients with din_acc false. drop: the
// dropout context of a training micro-batch (null: off).
inline Run run_op(const Node& n, const std::vector<Tensor>& in, const std::map<std::string, Tensor>& params,
                  const Tensor& dout_cpu, Device dev, bool overwrite = false, const DropoutCtx* drop = nullptr) {
  const Op& op = op_lookup(n.op);
  NodeCtx c;
  c.node = &n;
  c.dropout = drop;
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

inline Tensor rounded(const Tensor& t, DType dt) {
  if (dt == DType::F32 || t.dtype() != DType::F32) return t;
  Tensor r = t.clone();
  kernels::cpu_backend().round_to(dt, t.f32(), r.f32(), t.numel());
  return r;
}

// A one-node graph's node for `opname`, and an upstream gradient for its output (a scalar output gets 0.75).
inline Node op_node(const std::string& opname, json attrs) {
  Node n;
  n.op = opname;
  n.block = "b";
  n.out = {"y"};
  n.attrs = attrs.is_null() ? json::object() : std::move(attrs);
  return n;
}
inline Tensor upstream_grad(const Node& n, const std::vector<Tensor>& in, const std::map<std::string, Tensor>& params,
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
inline double compare_op(const std::string& opname, json attrs, std::vector<Tensor> in,
                         std::map<std::string, Tensor> params, double tol = 2e-5, DType pre_round = DType::F32,
                         const DropoutCtx* drop = nullptr) {
  INFO("op " << opname);
  const Node n = op_node(opname, std::move(attrs));
  Tensor dout = upstream_grad(n, in, params, 5);
  // Pre-rounded operands make 16-bit products exact in fp32 on both sides.
  for (auto& t : in) t = rounded(t, pre_round);
  for (auto& [k, t] : params) t = rounded(t, pre_round);
  dout = rounded(dout, pre_round);
  Run a = run_op(n, in, params, dout, Device::cpu(), false, drop);
  Run b = run_op(n, in, params, dout, kGpu, false, drop);
  Run bw = run_op(n, in, params, dout, kGpu, true, drop);
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
inline Tensor to16(const Tensor& t, DType dt) {
  Tensor h = Tensor::empty(t.shape(), dt, MemCategory::Buffers);
  auto* b = h.data<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) b[i] = dt == DType::BF16 ? f32_to_bf16(t.f32()[i]) : f32_to_f16(t.f32()[i]);
  return h;
}
inline Tensor as_f32(const Tensor& t) {
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
inline void compare_op16(const std::string& opname, json attrs, std::vector<Tensor> in,
                         std::map<std::string, Tensor> params, const Storage16& st, DType dt, double tol = 3e-2) {
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
}  // namespace zerorun::cuda_test
