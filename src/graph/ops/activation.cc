// Pointwise activations gelu (tanh approximation), relu and silu.
#include "op_util.h"

namespace zerorun::ops {
namespace {
class Activation : public Op {
 public:
  explicit Activation(kernels::Act a) : act_(a) {}
  std::vector<ValueInfo> infer(const Node&, const std::vector<ValueInfo>& in,
                               const std::map<std::string, Shape>&) const override {
    expect_inputs(in, 1);
    expect_f32(in[0], "input");
    return {in[0]};
  }
  void forward(NodeCtx& c) const override {
    if (want16(c, 0)) {
      Tensor y = new_out16(c, c.in[0].shape());
      be(c).act_fwd16(act_, c.in[0].f32(), static_cast<uint16_t*>(y.raw()), y.numel());
      c.out = {y};
      return;
    }
    Tensor y = new_out(c.in[0].shape(), device_of(c));
    be(c).act_fwd(act_, c.in[0].f32(), y.f32(), y.numel());
    c.out = {y};
  }
  bool writes_grad(size_t) const override { return true; }
  bool emits16(size_t) const override { return true; }
  bool writes_grad16(const NodeCtx& c, size_t) const override { return be(c).activations16(); }
  void backward(NodeCtx& c) const override {
    if (c.din[0].defined()) be(c).act_bwd(act_, c.in[0].f32(), c.dout[0].f32(), grad_of(c, 0), c.in[0].numel());
  }

 private:
  kernels::Act act_;
};
}  // namespace
std::unique_ptr<Op> make_gelu() { return std::make_unique<Activation>(kernels::Act::Gelu); }
std::unique_ptr<Op> make_relu() { return std::make_unique<Activation>(kernels::Act::Relu); }
std::unique_ptr<Op> make_silu() { return std::make_unique<Activation>(kernels::Act::Silu); }
}  // namespace zerorun::ops
