// add: a + b, where b's shape equals a's or is a suffix of it (broadcast).
#include "op_util.h"

namespace zerorun::ops {
namespace {
class Add : public Op {
 public:
  std::vector<ValueInfo> infer(const Node&, const std::vector<ValueInfo>& in,
                               const std::map<std::string, Shape>&) const override {
    expect_inputs(in, 2);
    expect_f32(in[0], "a");
    expect_f32(in[1], "b");
    const Shape &a = in[0].shape, &b = in[1].shape;
    ZR_CHECK(b.size() <= a.size() && std::equal(b.rbegin(), b.rend(), a.rbegin()), "cannot add ", shape_str(b), " to ",
             shape_str(a), " (b must equal a or a suffix of a's shape)");
    return {{a, DType::F32}};
  }
  void forward(NodeCtx& c) const override {
    Tensor y = new_out(c.in[0].shape(), device_of(c));
    be(c).add_fwd(c.in[0].f32(), c.in[1].f32(), y.f32(), y.numel(), c.in[1].numel());
    c.out = {y};
  }
  bool writes_grad(size_t) const override { return true; }
  bool grad_is_dout(size_t) const override { return true; }  // where b is not broadcast
  bool residual_add() const override { return true; }
  bool writes_grad16(const NodeCtx& c, size_t) const override {
    return be(c).activations16() && c.in[0].numel() == c.in[1].numel();
  }
  void backward(NodeCtx& c) const override {
    be(c).add_bwd(c.dout[0].f32(), grad_of(c, 0), grad_of(c, 1), c.in[0].numel(), c.in[1].numel());
  }
};
}  // namespace
std::unique_ptr<Op> make_add() { return std::make_unique<Add>(); }
}  // namespace zerorun::ops
