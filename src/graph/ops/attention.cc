// attention: causal self-attention from packed qkv [B, T, (H + 2K) D] (H query heads, then K key heads, then K value
// heads, D features each, heads contiguous; K = H with qkv [B, T, 3C] is multi-head attention) to [B, T, H D].
// Attributes: n_head H (required); n_kv_head K (default H; H % K == 0): query head h reads key/value head h / (H / K)
// in place; scale (default 1/sqrt(D)) multiplies q.k; window (default 0 = none): query t sees key s iff s <= t and
// t - s < window (transformers' sliding_window); softcap (default 0 = none): the score is
// softcap * tanh(scale q.k / softcap) before the mask and the softmax (Gemma 2).
// An optional second input, positions [B, T] i32 (the graph's optional "positions" input: each token's position in
// its document, 0 where a document starts), restricts attention to each document of packed sequences: query t sees
// no key before t - positions[b, t]. Left out (undefined), every row is one document. dropout (default 0) with
// site: in training the probabilities are dropped out (transformers' attention_dropout / GPT-2's attn_pdrop) with
// the counter-based mask of kernels/counter_rng.h, on the kernels that keep the probabilities.
#include "op_util.h"

namespace zerorun::ops {
namespace {
using kernels::AttnDims;

// The sizes and options of a node over a qkv of shape s; every attribute checked, an unknown one named.
AttnDims dims_of(const Node& n, const Shape& s) {
  for (auto it = n.attrs.begin(); it != n.attrs.end(); ++it) {
    const std::string& k = it.key();
    ZR_CHECK(k == "n_head" || k == "n_kv_head" || k == "scale" || k == "window" || k == "softcap" || k == "dropout" ||
                 k == "site",
             "attention has no attribute '", k,
             "' (it takes n_head, n_kv_head, scale, window, softcap, dropout, site)");
  }
  ZR_CHECK(s.size() == 3, "qkv must be [B, T, (n_head + 2 n_kv_head) x head size], got ", shape_str(s));
  AttnDims d;
  d.B = s[0];
  d.T = s[1];
  d.H = attr_int(n, "n_head");
  ZR_CHECK(d.H > 0, "attribute 'n_head' must be positive, got ", d.H);
  const bool gqa = n.attrs.contains("n_kv_head");
  d.K = gqa ? attr_int(n, "n_kv_head") : d.H;
  ZR_CHECK(d.K > 0 && d.H % d.K == 0, "attribute 'n_kv_head' ", d.K, " must be positive and divide n_head ", d.H);
  if (!gqa) {
    ZR_CHECK(s[2] % 3 == 0, "qkv must be [B, T, 3C], got ", shape_str(s));
    ZR_CHECK((s[2] / 3) % d.H == 0 && s[2] > 0, "n_head ", d.H, " does not divide C = ", s[2] / 3);
  }
  ZR_CHECK(s[2] > 0 && s[2] % (d.H + 2 * d.K) == 0, "qkv width ", s[2],
           " is not (n_head + 2 n_kv_head) x head size, n_head ", d.H, ", n_kv_head ", d.K);
  d.D = s[2] / (d.H + 2 * d.K);
  d.scale = attr_float(n, "scale", 1.f / std::sqrt(static_cast<float>(d.D)));
  ZR_CHECK(d.scale > 0.f, "attribute 'scale' must be positive, got ", d.scale);
  if (n.attrs.contains("window")) {
    d.window = attr_int(n, "window");
    ZR_CHECK(d.window >= 0, "attribute 'window' must be 0 (none) or positive, got ", d.window);
  }
  d.softcap = attr_float(n, "softcap", 0.f);
  ZR_CHECK(d.softcap >= 0.f, "attribute 'softcap' must be 0 (none) or positive, got ", d.softcap);
  dropout_p(n);
  return d;
}

// The node's sizes with the positions input where given (checked on the CPU: each in [0, t]) and this micro-batch's
// dropout mask in training.
AttnDims dims_with_positions(const NodeCtx& c) {
  AttnDims d = dims_of(*c.node, c.in[0].shape());
  dropout_mask(c, dropout_p(*c.node), d.H * d.T * d.T, &d.drop);
  if (c.in.size() > 1 && c.in[1].defined()) {
    d.pos = c.in[1].i32();
    if (c.in[1].device().is_cpu()) check_position_values(d.pos, d.B, d.T);
  }
  return d;
}

class Attention : public Op {
 public:
  const char* recompute_class() const override { return "attention"; }
  // f32 B x H x T x T probabilities (CPU) or B x H x T row statistics (GPU).
  double saved_bytes(const Node& n, const std::vector<ValueInfo>& in, bool gpu) const override {
    const double B = static_cast<double>(in.at(0).shape.at(0)), T = static_cast<double>(in.at(0).shape.at(1));
    const double H = static_cast<double>(n.attrs.value("n_head", int64_t{1}));
    return 4.0 * B * H * T * (gpu ? 1.0 : T);
  }
  std::vector<ValueInfo> infer(const Node& n, const std::vector<ValueInfo>& in,
                               const std::map<std::string, Shape>&) const override {
    ZR_CHECK(in.size() == 1 || in.size() == 2, "expects qkv and optionally positions, got ", in.size(), " inputs");
    expect_f32(in[0], "qkv");
    const AttnDims d = dims_of(n, in[0].shape);
    if (in.size() == 2) check_positions(in[1], d.B, d.T);
    return {{{d.B, d.T, d.out_width()}, DType::F32}};
  }
  void forward(NodeCtx& c) const override {
    const Tensor& qkv = c.in[0];
    const AttnDims d = dims_with_positions(c);
    const Shape os{d.B, d.T, d.out_width()};
    if (be(c).has_flash_attention(d)) {  // saves only the log-sum-exp per row
      // The output in 16 bits when its consumers asked and the kernels write it so.
      Tensor out = want16(c, 0) && be(c).attention16(d) ? new_out16(c, os) : new_out(os, device_of(c));
      Tensor lse = new_out({d.B, d.H, d.T}, device_of(c));
      be(c).flash_attention_fwd(src_of(qkv), dst_of(out), lse.f32(), d);
      *c.saved = {lse};
      c.out = {out};
      return;
    }
    Tensor out = new_out(os, device_of(c));
    Tensor probs = new_out({d.B, d.H, d.T, d.T}, device_of(c));
    be(c).attention_fwd(widened(c, qkv).f32(), out.f32(), probs.f32(), d);
    *c.saved = {probs};
    c.out = {out};
  }
  // 16-bit storage of qkv, the output and both gradients: the flash kernels take (or widen) any of them.
  bool takes16(size_t) const override { return true; }
  bool emits16(size_t) const override { return true; }
  bool takes_dout16(size_t) const override { return true; }
  bool writes_grad(size_t) const override { return true; }
  bool writes_grad16(const NodeCtx& c, size_t) const override {  // not with dropout: the materialised path's f32
    return dropout_p(*c.node) == 0.f && be(c).attention16(dims_of(*c.node, c.in[0].shape()));
  }
  void backward(NodeCtx& c) const override {
    if (!c.din[0].defined()) return;
    const Tensor& qkv = c.in[0];
    const AttnDims d = dims_with_positions(c);
    if (be(c).has_flash_attention(d)) {
      be(c).flash_attention_bwd(src_of(qkv), src_of(c.out[0]), (*c.saved)[0].f32(), src_of(c.dout[0]), grad_of(c, 0),
                                d);
      return;
    }
    be(c).attention_bwd(widened(c, qkv).f32(), (*c.saved)[0].f32(), widened(c, c.dout[0]).f32(), grad_of(c, 0), d);
  }
};
}  // namespace
std::unique_ptr<Op> make_attention() { return std::make_unique<Attention>(); }
}  // namespace zerorun::ops
