// mul: elementwise a * b of equal shapes (16-bit storage on either side on a GPU).
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
    const Shape& s = c.in[0].shape();
    Tensor y = want16(c, 0) ? new_out16(c, s) : new_out(s, device_of(c));
    be(c).mul_fwd(src_of(c.in[0]), src_of(c.in[1]), dst_of(y), y.numel());
    c.out = {y};
  }
  bool writes_grad(size_t) const override { return true; }
  bool emits16(size_t) const override { return true; }
  bool takes16(size_t) const override { return true; }
  bool writes_grad16(const NodeCtx& c, size_t) const override { return be(c).activations16(); }
  bool takes_dout16(size_t) const override { return true; }
  void backward(NodeCtx& c) const override {
    be(c).mul_bwd(src_of(c.in[0]), src_of(c.in[1]), src_of(c.dout[0]), grad_of(c, 0), grad_of(c, 1), c.in[0].numel());
  }
};
}  // namespace
std::unique_ptr<Op> make_mul() { return std::make_unique<Mul>(); }
}  // namespace zerorun::ops
