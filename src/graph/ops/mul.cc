// mul: elementwise a * b of equal shapes (e.g. the SwiGLU gate).
#include "op_util.h"

namespace zerorun::ops {
namespace {
class Mul : public Op {
 public:
  std::vector<ValueInfo> infer(const Node&, const std::vector<ValueInfo>& in,
                               const std::map<std::string, Shape>&) const override {
    expect_inputs(in, 2);
    expect_f32(in[0], "a");
    expect_f32(in[1], "b");
    ZR_CHECK(in[0].shape == in[1].shape, "mul needs equal shapes, got ", shape_str(in[0].shape), " and ",
             shape_str(in[1].shape));
    return {{in[0].shape, DType::F32}};
  }
  void forward(NodeCtx& c) const override {
    Tensor y = new_out(c.in[0].shape(), device_of(c));
    be(c).mul_fwd(c.in[0].f32(), c.in[1].f32(), y.f32(), y.numel());
    c.out = {y};
  }
  bool writes_grad(size_t) const override { return true; }
  void backward(NodeCtx& c) const override {
    be(c).mul_bwd(c.in[0].f32(), c.in[1].f32(), c.dout[0].f32(), grad_of(c, 0), grad_of(c, 1), c.in[0].numel());
  }
};
}  // namespace
std::unique_ptr<Op> make_mul() { return std::make_unique<Mul>(); }
}  // namespace zerorun::ops
