// linear: y = x W^T + b over the last dimension (W is [out, in], as in PyTorch).
#include "op_util.h"

namespace zerorun::ops {
namespace {
class Linear : public Op16 {
 public:
  std::vector<std::string> required_params() const override { return {"weight"}; }
  std::vector<std::string> optional_params() const override { return {"bias"}; }
  std::vector<ValueInfo> infer(const Node&, const std::vector<ValueInfo>& in,
                               const std::map<std::string, Shape>& p) const override {
    expect_inputs(in, 1);
    expect_f32(in[0], "input");
    const Shape& w = p.at("weight");
    ZR_CHECK(w.size() == 2, "weight must be 2-D [out, in], got ", shape_str(w));
    ZR_CHECK(!in[0].shape.empty() && in[0].shape.back() == w[1], "input last dim ",
             in[0].shape.empty() ? 0 : in[0].shape.back(), " does not match weight ", shape_str(w));
    if (p.count("bias")) ZR_CHECK(p.at("bias") == Shape{w[0]}, "bias must be [", w[0], "]");
    Shape o = in[0].shape;
    o.back() = w[0];
    return {{o, DType::F32}};
  }
  void forward(NodeCtx& c) const override {
    const Tensor& x = c.in[0];
    const Tensor& w = c.param("weight");
    Shape os = x.shape();
    os.back() = w.dim(0);
    const bool out16 = want16(c, 0);  // every consumer reads 16-bit storage
    ZR_CHECK(!c.fuse_gelu || out16, "linear: a fused GELU needs 16-bit storage");
    Tensor y = out16 ? new_out16(c, os) : new_out(os, device_of(c));
    c.residual_used = !out16 && c.residual.defined() && c.residual.shape() == os;
    Tensor g = c.fuse_gelu ? new_out16(c, os) : Tensor();
    const float* b = c.params.count("bias") ? c.param("bias").f32() : nullptr;
    // 16-bit products: input and weight are rounded once here, the rounded copies (half the bytes) kept
    // for dW and dX. A 16-bit stored input is used as it is (and read again in backward from the inputs), so is
    // the engine's 16-bit copy of the weight (and bias) where it keeps one.
    const DType mm = be(c).matmul_dtype();
    const bool in16 = x.dtype() != DType::F32;
    ZR_CHECK(!in16 || x.dtype() == mm, "linear: a 16-bit input must be in the matmul dtype");
    auto kept = [&](const char* role) {
      auto it = c.params16.find(role);
      return it != c.params16.end() && it->second.dtype() == mm ? it->second : Tensor();
    };
    Tensor x16, w16 = mm != DType::F32 ? kept("weight") : Tensor(), b16 = out16 && b ? kept("bias") : Tensor();
    const bool w_kept = w16.defined();
    // The engine may hand a weight only read in 16 bits as its 16-bit copy (no f32 values kept at all).
    ZR_CHECK(w_kept || w.dtype() == DType::F32, "linear: a 16-bit weight needs the matmul in its dtype");
    if (mm != DType::F32) {
      if (!in16) x16 = Tensor::uninit({x.numel()}, mm, MemCategory::Activations, device_of(c));
      if (!w_kept) w16 = Tensor::uninit({w.numel()}, mm, MemCategory::Activations, device_of(c));
    }
    auto bits = [](const Tensor& t) { return t.defined() ? static_cast<uint16_t*>(t.raw()) : nullptr; };
    be(c).linear_fwd(in16 ? nullptr : x.f32(), w_kept ? nullptr : w.f32(), b, out16 ? nullptr : y.f32(),
                     rows_of(x.shape()), w.dim(1), w.dim(0), in16 ? static_cast<uint16_t*>(x.raw()) : bits(x16),
                     bits(w16), out16 ? static_cast<uint16_t*>(y.raw()) : nullptr, bits(b16), bits(g),
                     c.residual_used ? c.residual.f32() : nullptr);
    c.out = {y};
    if (g.defined()) c.out.push_back(g);
    *c.saved = {x16, w16};
  }
  bool writes_grad(size_t) const override { return true; }
  bool fuses_gelu() const override { return true; }
  // The weight: forward and backward use the kept 16-bit copy where there is one (w.f32() is read only without).
  bool reads_param16_only(const std::string& role) const override { return role == "weight"; }
  bool fuses_residual() const override { return true; }
  bool rows_independent() const override { return true; }
  bool writes_param_grad(const std::string&) const override { return true; }
  void backward(NodeCtx& c) const override {
    const Tensor& x = c.in[0];
    const Tensor& w = c.param("weight");
    Tensor dw = c.dparam("weight"), db = c.dparam("bias");
    const bool in16 = x.dtype() != DType::F32, dy16 = c.dout[0].dtype() != DType::F32;
    const Tensor &x16 = in16 ? x : (*c.saved)[0], &w16 = (*c.saved)[1];
    auto bits = [](const Tensor& t) { return t.defined() ? static_cast<const uint16_t*>(t.raw()) : nullptr; };
    const int64_t rows = rows_of(x.shape());
    // A fresh parameter gradient is overwritten (no zero-fill first); with no rows there is nothing to write.
    auto pgrad = [&](Tensor& t, const char* role) {
      if (!t.defined()) return kernels::Grad();
      const bool fresh = c.dparams_fresh.count(role) > 0;
      if (fresh && rows == 0) t.zero_();
      return kernels::Grad(t.f32(), !fresh || rows == 0);
    };
    be(c).linear_bwd(in16 ? nullptr : x.f32(), w.dtype() == DType::F32 ? w.f32() : nullptr,
                     dy16 ? nullptr : c.dout[0].f32(), grad_of(c, 0), pgrad(dw, "weight"), pgrad(db, "bias"), rows,
                     w.dim(1), w.dim(0), bits(x16), bits(w16), dy16 ? bits16(c.dout[0]) : nullptr,
                     c.dgelu_input.defined() ? bits16(c.dgelu_input) : nullptr);
  }
};
}  // namespace
std::unique_ptr<Op> make_linear() { return std::make_unique<Linear>(); }
}  // namespace zerorun::ops
