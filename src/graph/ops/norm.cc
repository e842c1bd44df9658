// layernorm (weight, optional bias) and rmsnorm (weight; attribute `offset`:
// the scale is offset + w, Gemma's 1 + w) over the last dimension; both save
// the per-row statistics for backward.
#include "op_util.h"

namespace zerorun::ops {
namespace {
class NormBase : public Op {
 public:
  const char* recompute_class() const override { return "norms"; }
  std::vector<ValueInfo> infer(const Node& n, const std::vector<ValueInfo>& in,
                               const std::map<std::string, Shape>& p) const override {
    expect_inputs(in, 1);
    expect_f32(in[0], "input");
    ZR_CHECK(!in[0].shape.empty(), "input must have at least one dimension");
    int64_t C = in[0].shape.back();
    for (auto& [role, s] : p) ZR_CHECK(s == Shape{C}, role, " must be [", C, "], got ", shape_str(s));
    ZR_CHECK(attr_float(n, "eps", 1e-5f) > 0.f, "attribute 'eps' must be positive");
    return {in[0]};
  }
  bool writes_grad(size_t) const override { return true; }
};

class LayerNorm : public NormBase {
 public:
  bool emits16(size_t) const override { return true; }
  bool takes_dout16(size_t) const override { return true; }
  std::vector<std::string> required_params() const override { return {"weight"}; }
  std::vector<std::string> optional_params() const override { return {"bias"}; }
  void forward(NodeCtx& c) const override {
    const Tensor& x = c.in[0];
    int64_t C = x.dim(-1), N = x.numel() / C;
    Tensor mean = new_out({N}, device_of(c)), rstd = new_out({N}, device_of(c));
    const float* b = c.params.count("bias") ? c.param("bias").f32() : nullptr;
    const float eps = attr_float(*c.node, "eps", 1e-5f);
    Tensor y;
    if (want16(c, 0)) {  // consumed only by 16-bit products: stored rounded
      y = new_out16(c, x.shape());
      be(c).layernorm_fwd16(x.f32(), c.param("weight").f32(), b, static_cast<uint16_t*>(y.raw()), mean.f32(),
                            rstd.f32(), N, C, eps);
    } else {
      y = new_out(x.shape(), device_of(c));
      be(c).layernorm_fwd(x.f32(), c.param("weight").f32(), b, y.f32(), mean.f32(), rstd.f32(), N, C, eps);
    }
    *c.saved = {mean, rstd};
    c.out = {y};
  }
  void backward(NodeCtx& c) const override {
    const Tensor& x = c.in[0];
    int64_t C = x.dim(-1), N = x.numel() / C;
    Tensor dw = c.dparam("weight"), db = c.dparam("bias");
    float *pdw = dw.defined() ? dw.f32() : nullptr, *pdb = db.defined() ? db.f32() : nullptr;
    const Tensor& dy = c.dout[0];
    if (is16(dy))  // the gradient of a 16-bit product's input
      be(c).layernorm_bwd16(x.f32(), c.param("weight").f32(), (*c.saved)[0].f32(), (*c.saved)[1].f32(), bits16(dy),
                            grad_of(c, 0), pdw, pdb, N, C);
    else
      be(c).layernorm_bwd(x.f32(), c.param("weight").f32(), (*c.saved)[0].f32(), (*c.saved)[1].f32(), dy.f32(),
                          grad_of(c, 0), pdw, pdb, N, C);
  }
};

class RmsNorm : public NormBase {
 public:
  bool emits16(size_t) const override { return true; }
  bool takes_dout16(size_t) const override { return true; }
  std::vector<std::string> required_params() const override { return {"weight"}; }
  void forward(NodeCtx& c) const override {
    const Tensor& x = c.in[0];
    int64_t C = x.dim(-1), N = x.numel() / C;
    Tensor rstd = new_out({N}, device_of(c)), y;
    const float eps = attr_float(*c.node, "eps", 1e-6f);
    const Tensor w = offset_weight(c, c.param("weight"), attr_float(*c.node, "offset", 0.f));
    if (want16(c, 0)) {  // consumed only by 16-bit products: stored rounded
      y = new_out16(c, x.shape());
      be(c).rmsnorm_fwd16(x.f32(), w.f32(), static_cast<uint16_t*>(y.raw()), rstd.f32(), N, C, eps);
    } else {
      y = new_out(x.shape(), device_of(c));
      be(c).rmsnorm_fwd(x.f32(), w.f32(), y.f32(), rstd.f32(), N, C, eps);
    }
    *c.saved = {rstd};
    c.out = {y};
  }
  void backward(NodeCtx& c) const override {
    const Tensor& x = c.in[0];
    int64_t C = x.dim(-1), N = x.numel() / C;
    Tensor dw = c.dparam("weight");
    float* pdw = dw.defined() ? dw.f32() : nullptr;
    const Tensor& dy = c.dout[0];
    // d(offset + w) = dw: the kernels' weight gradient is w's.
    const Tensor w = offset_weight(c, c.param("weight"), attr_float(*c.node, "offset", 0.f));
    if (is16(dy))  // the gradient of a 16-bit product's input
      be(c).rmsnorm_bwd16(x.f32(), w.f32(), (*c.saved)[0].f32(), bits16(dy), grad_of(c, 0), pdw, N, C);
    else
      be(c).rmsnorm_bwd(x.f32(), w.f32(), (*c.saved)[0].f32(), dy.f32(), grad_of(c, 0), pdw, N, C);
  }
};
}  // namespace
std::unique_ptr<Op> make_layernorm() { return std::make_unique<LayerNorm>(); }
std::unique_ptr<Op> make_rmsnorm() { return std::make_unique<RmsNorm>(); }
}  // namespace zerorun::ops
