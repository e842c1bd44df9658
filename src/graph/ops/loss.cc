// Losses producing the scalar the graph minimises: cross_entropy (mean over
// rows of logits [..., V] against i32 targets; a row whose target is -100,
// transformers' ignore_index, adds 0 and gets no gradient, and the engine
// weighs each micro-batch by its counted targets) and mse (mean over elements).
#include "op_util.h"

namespace zerorun::ops {
namespace {
class CrossEntropy : public Op {
 public:
  bool is_loss() const override { return true; }
  bool rows_independent() const override { return true; }  // honours loss_denom: rows' losses add up
  std::vector<ValueInfo> infer(const Node&, const std::vector<ValueInfo>& in,
                               const std::map<std::string, Shape>&) const override {
    expect_inputs(in, 2);
    expect_f32(in[0], "logits");
    ZR_CHECK(in[1].dtype == DType::I32, "targets must be i32");
    Shape lead(in[0].shape.begin(), in[0].shape.end() - 1);
    ZR_CHECK(lead == in[1].shape, "targets shape ", shape_str(in[1].shape), " does not match logits ",
             shape_str(in[0].shape));
    return {{{}, DType::F32}};
  }
  void forward(NodeCtx& c) const override {
    int64_t V = c.in[0].dim(-1), N = c.in[1].numel();
    const int32_t* t = c.in[1].i32();
    check_ids(c, t, N, V, "target", 1, -100);
    const Tensor& lg = c.in[0];
    Tensor loss = new_out({}, device_of(c));  // written on the device: nothing waits for the forward here
    if (c.loss_grad.defined() && lg.dtype() != DType::F32 && be(c).fuses_cross_entropy(V)) {
      // d(loss) known: the logits become their gradient in the same pass (saved: no lse, the gradient)
      be(c).cross_entropy_fused16(static_cast<uint16_t*>(lg.raw()), t, N, V, c.loss_grad.f32(), loss.f32(),
                                  c.loss_denom);
      c.out = {loss};
      *c.saved = {Tensor(), lg};
      return;
    }
    Tensor lse = Tensor::uninit({N}, DType::F32, MemCategory::Activations, device_of(c));
    if (lg.dtype() != DType::F32)
      be(c).cross_entropy_fwd16(bits16(lg), t, lse.f32(), N, V, loss.f32(), c.loss_denom);
    else
      be(c).cross_entropy_fwd(lg.f32(), t, lse.f32(), N, V, loss.f32(), c.loss_denom);
    c.out = {loss};
    c.saved->push_back(lse);
  }
  bool writes_grad(size_t input) const override { return input == 0; }
  bool writes_grad16(const NodeCtx& c, size_t input) const override { return input == 0 && be(c).activations16(); }
  bool takes16(size_t input) const override { return input == 0; }
  void backward(NodeCtx& c) const override {
    if (!c.din[0].defined()) return;
    if (!(*c.saved)[0].defined()) {  // fused forward: the gradient is made, hand it over
      const Tensor& d = (*c.saved)[1];
      ZR_CHECK(!c.din_acc[0] && c.din[0].dtype() == d.dtype(),
               "cross_entropy: the fused gradient needs a fresh 16-bit logits gradient");
      c.din[0] = d;
      return;
    }
    int64_t V = c.in[0].dim(-1), N = c.in[1].numel();
    const Tensor& lg = c.in[0];
    if (lg.dtype() != DType::F32)
      be(c).cross_entropy_bwd16(bits16(lg), c.in[1].i32(), (*c.saved)[0].f32(), c.dout[0].f32(), grad_of(c, 0), N, V,
                                c.loss_denom);
    else
      be(c).cross_entropy_bwd(lg.f32(), c.in[1].i32(), (*c.saved)[0].f32(), c.dout[0].f32(), grad_of(c, 0), N, V,
                              c.loss_denom);
  }
};

class Mse : public Op {
 public:
  bool is_loss() const override { return true; }
  std::vector<ValueInfo> infer(const Node&, const std::vector<ValueInfo>& in,
                               const std::map<std::string, Shape>&) const override {
    expect_inputs(in, 2);
    expect_f32(in[0], "prediction");
    expect_f32(in[1], "target");
    ZR_CHECK(in[0].shape == in[1].shape, "prediction ", shape_str(in[0].shape), " and target ", shape_str(in[1].shape),
             " differ");
    return {{{}, DType::F32}};
  }
  void forward(NodeCtx& c) const override {
    Tensor loss = new_out({}, device_of(c));  // written on the device: nothing waits for the forward here
    be(c).mse_fwd(c.in[0].f32(), c.in[1].f32(), c.in[0].numel(), loss.f32());
    c.out = {loss};
  }
  bool writes_grad(size_t input) const override { return input == 0; }  // the target gets no gradient
  void backward(NodeCtx& c) const override {
    if (c.din[0].defined())
      be(c).mse_bwd(c.in[0].f32(), c.in[1].f32(), c.dout[0].f32(), grad_of(c, 0), c.in[0].numel());
  }
};
}  // namespace
std::unique_ptr<Op> make_cross_entropy() { return std::make_unique<CrossEntropy>(); }
std::unique_ptr<Op> make_mse() { return std::make_unique<Mse>(); }
}  // namespace zerorun::ops
