// Two-input elementwise ops of equal shapes: mul (a * b), geglu (gelu_tanh(gate) * up, Gemma's MLP) and swiglu
// (silu(gate) * up, Llama's gated MLP as one op:
// silu + mul as two ops would write and read the silu output once more each way, and keep it). 16-bit storage on
// any side on a GPU.
#include "op_util.h"

namespace zerorun::ops {
namespace {
class Pairwise : public Op16 {
 public:
  using Fwd = void (kernels::Backend::*)(kernels::Src, kernels::Src, kernels::Dst, int64_t);
  using Bwd = void (kernels::Backend::*)(kernels::Src, kernels::Src, kernels::Src, kernels::Grad, kernels::Grad,
                                         int64_t);
  Pairwise(const char* a, const char* b, Fwd f, Bwd g, const char* rc = "") : a_(a), b_(b), fwd_(f), bwd_(g), rc_(rc) {}
  const char* recompute_class() const override { return rc_; }  // the gated MLP activations: "mlp_act"
  std::vector<ValueInfo> infer(const Node& n, const std::vector<ValueInfo>& in,
                               const std::map<std::string, Shape>&) const override {
    expect_inputs(in, 2);
    expect_f32(in[0], a_);
    expect_f32(in[1], b_);
    ZR_CHECK(in[0].shape == in[1].shape, n.op, " needs equal shapes for ", a_, " and ", b_, ", got ",
             shape_str(in[0].shape), " and ", shape_str(in[1].shape));
    return {in[0]};
  }
  void forward(NodeCtx& c) const override {
    const Shape& s = c.in[0].shape();
    Tensor y = want16(c, 0) ? new_out16(c, s) : new_out(s, device_of(c));
    (be(c).*fwd_)(src_of(c.in[0]), src_of(c.in[1]), dst_of(y), y.numel());
    c.out = {y};
  }
  bool writes_grad(size_t) const override { return true; }
  void backward(NodeCtx& c) const override {
    (be(c).*bwd_)(src_of(c.in[0]), src_of(c.in[1]), src_of(c.dout[0]), grad_of(c, 0), grad_of(c, 1), c.in[0].numel());
  }

 private:
  const char *a_, *b_;
  Fwd fwd_;
  Bwd bwd_;
  const char* rc_;
};
}  // namespace
std::unique_ptr<Op> make_mul() {
  return std::make_unique<Pairwise>("a", "b", &kernels::Backend::mul_fwd, &kernels::Backend::mul_bwd);
}
std::unique_ptr<Op> make_geglu() {
  return std::make_unique<Pairwise>("gate", "up", &kernels::Backend::geglu_fwd, &kernels::Backend::geglu_bwd,
                                    "mlp_act");
}
std::unique_ptr<Op> make_swiglu() {
  return std::make_unique<Pairwise>("gate", "up", &kernels::Backend::swiglu_fwd, &kernels::Backend::swiglu_bwd,
                                    "mlp_act");
}
}  // namespace zerorun::ops
