// attention: causal multi-head self-attention from packed qkv [B, T, 3C]
// (q, k, v along the last dim, heads contiguous inside each) to [B, T, C].
#include "op_util.h"

namespace zerorun::ops {
namespace {
class Attention : public Op {
 public:
  std::vector<ValueInfo> infer(const Node& n, const std::vector<ValueInfo>& in,
                               const std::map<std::string, Shape>&) const override {
    expect_inputs(in, 1);
    expect_f32(in[0], "qkv");
    const Shape& s = in[0].shape;
    ZR_CHECK(s.size() == 3 && s[2] % 3 == 0, "qkv must be [B, T, 3C], got ", shape_str(s));
    int64_t H = attr_int(n, "n_head");
    ZR_CHECK(H > 0 && (s[2] / 3) % H == 0, "n_head ", H, " does not divide C = ", s[2] / 3);
    return {{{s[0], s[1], s[2] / 3}, DType::F32}};
  }
  void forward(NodeCtx& c) const override {
    const Tensor& qkv = c.in[0];
    int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3, H = attr_int(*c.node, "n_head");
    if (be(c).has_flash_attention(C / H)) {  // saves only the log-sum-exp per row
      // The output in 16 bits when its consumers asked and the kernels write it so.
      Tensor out =
          want16(c, 0) && be(c).attention16(C / H) ? new_out16(c, {B, T, C}) : new_out({B, T, C}, device_of(c));
      Tensor lse = new_out({B, H, T}, device_of(c));
      be(c).flash_attention_fwd(src_of(qkv), dst_of(out), lse.f32(), B, T, C, H);
      *c.saved = {lse};
      c.out = {out};
      return;
    }
    Tensor out = new_out({B, T, C}, device_of(c));
    Tensor probs = new_out({B, H, T, T}, device_of(c));
    be(c).attention_fwd(widened(c, qkv).f32(), out.f32(), probs.f32(), B, T, C, H);
    *c.saved = {probs};
    c.out = {out};
  }
  // 16-bit storage of qkv, the output and both gradients: the flash kernels take (or widen) any of them.
  bool takes16(size_t) const override { return true; }
  bool emits16(size_t) const override { return true; }
  bool takes_dout16(size_t) const override { return true; }
  bool writes_grad(size_t) const override { return true; }
  bool writes_grad16(const NodeCtx& c, size_t) const override {
    const Tensor& qkv = c.in[0];
    return be(c).attention16(qkv.dim(2) / 3 / attr_int(*c.node, "n_head"));
  }
  void backward(NodeCtx& c) const override {
    if (!c.din[0].defined()) return;
    const Tensor& qkv = c.in[0];
    int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3, H = attr_int(*c.node, "n_head");
    if (be(c).has_flash_attention(C / H)) {
      be(c).flash_attention_bwd(src_of(qkv), src_of(c.out[0]), (*c.saved)[0].f32(), src_of(c.dout[0]), grad_of(c, 0), B,
                                T, C, H);
      return;
    }
    be(c).attention_bwd(widened(c, qkv).f32(), (*c.saved)[0].f32(), widened(c, c.dout[0]).f32(), grad_of(c, 0), B, T, C,
                        H);
  }
};
}  // namespace
std::unique_ptr<Op> make_attention() { return std::make_unique<Attention>(); }
}  // namespace zerorun::ops
