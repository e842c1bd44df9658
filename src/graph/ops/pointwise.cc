// One-parameter pointwise ops: scale (y = factor x: Gemma's embeddings times
// sqrt(hidden)) and softcap (y = cap tanh(x / cap): Gemma 2's final logit
// soft-capping). f32 storage; the backward reads the input.
#include "op_util.h"

namespace zerorun::ops {
namespace {
class Unary : public Op {
 public:
  Unary(kernels::Unary op, const char* attr) : op_(op), attr_(attr) {}
  std::vector<ValueInfo> infer(const Node& n, const std::vector<ValueInfo>& in,
                               const std::map<std::string, Shape>&) const override {
    expect_inputs(in, 1);
    expect_f32(in[0], "input");
    param(n);
    return {in[0]};
  }
  void forward(NodeCtx& c) const override {
    const Tensor& x = c.in[0];
    Tensor y = new_out(x.shape(), device_of(c));
    be(c).unary_fwd(op_, param(*c.node), x.f32(), y.f32(), x.numel());
    c.out = {y};
  }
  bool writes_grad(size_t) const override { return true; }
  bool rows_independent() const override { return true; }
  void backward(NodeCtx& c) const override {
    if (!c.din[0].defined()) return;
    be(c).unary_bwd(op_, param(*c.node), c.in[0].f32(), c.dout[0].f32(), grad_of(c, 0), c.in[0].numel());
  }

 private:
  float param(const Node& n) const {
    ZR_CHECK(n.attrs.contains(attr_), "attribute '", attr_, "' is required");
    const float a = attr_float(n, attr_, 0.f);
    ZR_CHECK(op_ == kernels::Unary::Scale ? a != 0.f : a > 0.f, "attribute '", attr_, "' must be ",
             op_ == kernels::Unary::Scale ? "non-zero" : "positive", ", got ", a);
    return a;
  }
  kernels::Unary op_;
  const char* attr_;
};
}  // namespace
std::unique_ptr<Op> make_scale() { return std::make_unique<Unary>(kernels::Unary::Scale, "factor"); }
std::unique_ptr<Op> make_softcap() { return std::make_unique<Unary>(kernels::Unary::Softcap, "cap"); }
}  // namespace zerorun::ops
