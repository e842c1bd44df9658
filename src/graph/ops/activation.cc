// Pointwise activations gelu (tanh approximation), relu and silu.
#include "op_util.h"

namespace zerorun::ops {
namespace {
class Activation : public Op16 {
 public:
  explicit Activation(kernels::Act a) : act_(a) {}
  const char* recompute_class() const override { return "mlp_act"; }
  Epilogue epilogue() const override { return act_ == kernels::Act::Gelu ? Epilogue::GeluTanh : Epilogue::None; }
  std::vector<ValueInfo> infer(const Node&, const std::vector<ValueInfo>& in,
                               const std::map<std::string, Shape>&) const override {
    expect_inputs(in, 1);
    expect_f32(in[0], "input");
    return {in[0]};
  }
  void forward(NodeCtx& c) const override {
    const Tensor& x = c.in[0];
    const bool in16 = x.dtype() != DType::F32;
    const bool out16 = want16(c, 0);
    if (out16 || in16) {  // 16-bit storage on either side
      Tensor y = out16 ? new_out16(c, x.shape()) : new_out(x.shape(), device_of(c));
      be(c).act_fwd16(act_, src_of(x), dst_of(y), y.numel());
      c.out = {y};
      return;
    }
    Tensor y = new_out(x.shape(), device_of(c));
    be(c).act_fwd(act_, x.f32(), y.f32(), y.numel());
    c.out = {y};
  }
  bool writes_grad(size_t) const override { return true; }
  void backward(NodeCtx& c) const override {
    if (!c.din[0].defined()) return;
    const Tensor &x = c.in[0], &dy = c.dout[0];
    if (is16(x) || is16(dy))
      be(c).act_bwd16(act_, src_of(x), src_of(dy), grad_of(c, 0), x.numel());
    else
      be(c).act_bwd(act_, x.f32(), dy.f32(), grad_of(c, 0), x.numel());
  }

 private:
  kernels::Act act_;
};
}  // namespace
std::unique_ptr<Op> make_gelu() { return std::make_unique<Activation>(kernels::Act::Gelu); }
std::unique_ptr<Op> make_relu() { return std::make_unique<Activation>(kernels::Act::Relu); }
std::unique_ptr<Op> make_silu() { return std::make_unique<Activation>(kernels::Act::Silu); }
}  // namespace zerorun::ops
