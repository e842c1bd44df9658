// swiglu: y = silu(gate) * up, Llama's gated MLP activation as one op (silu + mul
// as two ops would write and read the silu output once more each way, and keep it).
#include "op_util.h"

namespace zerorun::ops {
namespace {
class SwiGlu : public Op {
 public:
  std::vector<ValueInfo> infer(const Node&, const std::vector<ValueInfo>& in,
                               const std::map<std::string, Shape>&) const override {
    expect_inputs(in, 2);
    expect_f32(in[0], "gate");
    expect_f32(in[1], "up");
    ZR_CHECK(in[0].shape == in[1].shape, "swiglu needs equal shapes for gate and up, got ", shape_str(in[0].shape),
             " and ", shape_str(in[1].shape));
    return {in[0]};
  }
  void forward(NodeCtx& c) const override {
    const Tensor &g = c.in[0], &u = c.in[1];
    Tensor y = want16(c, 0) ? new_out16(c, g.shape()) : new_out(g.shape(), device_of(c));
    be(c).swiglu_fwd(src_of(g), src_of(u), dst_of(y), y.numel());
    c.out = {y};
  }
  bool writes_grad(size_t) const override { return true; }
  bool emits16(size_t) const override { return true; }
  bool takes16(size_t) const override { return true; }
  bool writes_grad16(const NodeCtx& c, size_t) const override { return be(c).activations16(); }
  bool takes_dout16(size_t) const override { return true; }
  void backward(NodeCtx& c) const override {
    const Tensor &g = c.in[0], &u = c.in[1];
    be(c).swiglu_bwd(src_of(g), src_of(u), src_of(c.dout[0]), grad_of(c, 0), grad_of(c, 1), g.numel());
  }
};
}  // namespace
std::unique_ptr<Op> make_swiglu() { return std::make_unique<SwiGlu>(); }
}  // namespace zerorun::ops
