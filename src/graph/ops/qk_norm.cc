// qk_norm: RMSNorm of the query and key parts of packed qkv [B, T, (H + 2K) D]
// before rotary embeddings, values passed through: per head over D features
// with q_weight, k_weight [D] (Qwen3; Gemma 3 with offset 1: scale 1 + w), or
// `full` over all H D query and K D key features with q_weight [H D],
// k_weight [K D] (OLMo-2). Saves the per-group 1/rms.
#include "op_util.h"

namespace zerorun::ops {
namespace {
struct QkDims {
  int64_t H, K, D;
  bool full;
};
QkDims dims_of(const Node& n, int64_t width) {
  const QkvHeads h = qkv_heads(n, width);
  return {h.H, h.K, h.D, attr_bool(n, "full", false)};
}
class QkNorm : public Op {
 public:
  const char* recompute_class() const override { return "norms"; }
  std::vector<std::string> required_params() const override { return {"q_weight", "k_weight"}; }
  std::vector<ValueInfo> infer(const Node& n, const std::vector<ValueInfo>& in,
                               const std::map<std::string, Shape>& p) const override {
    expect_inputs(in, 1);
    expect_f32(in[0], "qkv");
    const Shape& s = in[0].shape;
    ZR_CHECK(s.size() == 3, "qkv must be [B, T, (n_head + 2 n_kv_head) x head size], got ", shape_str(s));
    const QkDims d = dims_of(n, s[2]);
    const Shape wq{d.full ? d.H * d.D : d.D}, wk{d.full ? d.K * d.D : d.D};
    ZR_CHECK(p.at("q_weight") == wq, "q_weight must be ", shape_str(wq), ", got ", shape_str(p.at("q_weight")));
    ZR_CHECK(p.at("k_weight") == wk, "k_weight must be ", shape_str(wk), ", got ", shape_str(p.at("k_weight")));
    ZR_CHECK(attr_float(n, "eps", 1e-6f) > 0.f, "attribute 'eps' must be positive");
    attr_float(n, "offset", 0.f);
    return {in[0]};
  }
  void forward(NodeCtx& c) const override {
    const Tensor& x = c.in[0];
    const QkDims d = dims_of(*c.node, x.dim(2));
    const int64_t N = x.dim(0) * x.dim(1);
    const float offset = attr_float(*c.node, "offset", 0.f);
    const Tensor wq = offset_weight(c, c.param("q_weight"), offset), wk = offset_weight(c, c.param("k_weight"), offset);
    Tensor y = new_out(x.shape(), device_of(c)), rstd = new_out({N, d.full ? 2 : d.H + d.K}, device_of(c));
    be(c).qk_norm_fwd(x.f32(), wq.f32(), wk.f32(), y.f32(), rstd.f32(), N, d.H, d.K, d.D, d.full,
                      attr_float(*c.node, "eps", 1e-6f));
    *c.saved = {rstd};
    c.out = {y};
  }
  bool writes_grad(size_t) const override { return true; }
  void backward(NodeCtx& c) const override {
    const Tensor& x = c.in[0];
    const QkDims d = dims_of(*c.node, x.dim(2));
    const float offset = attr_float(*c.node, "offset", 0.f);
    const Tensor wq = offset_weight(c, c.param("q_weight"), offset), wk = offset_weight(c, c.param("k_weight"), offset);
    Tensor dq = c.dparam("q_weight"), dk = c.dparam("k_weight");
    be(c).qk_norm_bwd(x.f32(), wq.f32(), wk.f32(), (*c.saved)[0].f32(), c.dout[0].f32(), grad_of(c, 0),
                      dq.defined() ? dq.f32() : nullptr, dk.defined() ? dk.f32() : nullptr, x.dim(0) * x.dim(1), d.H,
                      d.K, d.D, d.full);
  }
};
}  // namespace
std::unique_ptr<Op> make_qk_norm() { return std::make_unique<QkNorm>(); }
}  // namespace zerorun::ops
