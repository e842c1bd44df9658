// dropout: y = x * mask / (1 - p) in training, y = x otherwise (transformers' nn.Dropout: GPT-2's embedding and
// residual dropouts, Phi-3's residual dropouts). The mask comes from a counter-based generator
// (kernels/counter_rng.h), so backward regenerates it instead of saving it and the same sample gets the same mask on
// any number of ranks. Attributes: dropout (p), site (the node's stream). Input [B, ...], f32.
#include "op_util.h"

namespace zerorun::ops {
namespace {
class Dropout : public Op {
 public:
  std::vector<ValueInfo> infer(const Node& n, const std::vector<ValueInfo>& in,
                               const std::map<std::string, Shape>&) const override {
    expect_inputs(in, 1);
    expect_f32(in[0], "input");
    ZR_CHECK(in[0].shape.size() >= 2, "input must be [samples, ...], got ", shape_str(in[0].shape));
    ZR_CHECK(n.attrs.contains("dropout"), "attribute 'dropout' is required");
    dropout_p(n);
    return {in[0]};
  }
  void forward(NodeCtx& c) const override {
    const Tensor& x = c.in[0];
    Tensor y = new_out(x.shape(), device_of(c));
    kernels::rng::Dropout d;
    if (dropout_mask(c, dropout_p(*c.node), x.numel() / x.shape()[0], &d))
      be(c).dropout(d, x.f32(), kernels::Grad(y.f32(), false), x.numel());
    else
      y.copy_from(x);
    c.out = {y};
  }
  bool writes_grad(size_t) const override { return true; }
  void backward(NodeCtx& c) const override {
    kernels::Grad dx = grad_of(c, 0);
    if (!dx) return;
    const Tensor& dy = c.dout[0];
    kernels::rng::Dropout d;
    if (!dropout_mask(c, dropout_p(*c.node), dy.numel() / dy.shape()[0], &d))
      d.threshold = 0, d.scale = 1.f;  // every element kept, unscaled: dx = dy
    be(c).dropout(d, dy.f32(), dx, dy.numel());
  }
};
}  // namespace
std::unique_ptr<Op> make_dropout() { return std::make_unique<Dropout>(); }
}  // namespace zerorun::ops
