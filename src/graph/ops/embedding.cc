// embedding: rows of a [V, C] table picked by i32 ids. With attrs
// {"position": true} it ignores the id values and adds row t to position t
// of a [B, T] input (GPT-2's learned positional embedding), or row positions[b, t]
// where the node has a second input, positions [B, T] i32 (the graph's optional
// "positions" input: packed documents restart at 0; undefined when left out).
// padding_idx: as
// torch.nn.Embedding's (transformers passes config.pad_token_id): that row's
// gradient from this lookup is zero.
#include "op_util.h"

namespace zerorun::ops {
namespace {
bool positional(const Node& n) { return attr_bool(n, "position", false); }
bool has_positions(const NodeCtx& c) { return c.in.size() > 1 && c.in[1].defined(); }

class Embedding : public Op {
 public:
  std::vector<std::string> required_params() const override { return {"weight"}; }
  std::vector<ValueInfo> infer(const Node& n, const std::vector<ValueInfo>& in,
                               const std::map<std::string, Shape>& p) const override {
    ZR_CHECK(in.size() == 1 || (in.size() == 2 && positional(n)), "expects ids",
             positional(n) ? " and optionally positions" : "", ", got ", in.size(), " inputs");
    ZR_CHECK(in[0].dtype == DType::I32, "ids must be i32, got ", dtype_name(in[0].dtype));
    const Shape& w = p.at("weight");
    ZR_CHECK(w.size() == 2, "weight must be [V, C], got ", shape_str(w));
    if (n.attrs.contains("padding_idx")) {
      const int64_t p = attr_int(n, "padding_idx");
      ZR_CHECK(p >= 0 && p < w[0] && !positional(n), "attribute 'padding_idx' ", p,
               " must name a row of the token table (0 .. ", w[0] - 1, ")");
    }
    if (positional(n)) {
      ZR_CHECK(in[0].shape.size() == 2, "positional embedding needs [B, T] ids");
      ZR_CHECK(in[0].shape[1] <= w[0], "sequence length ", in[0].shape[1], " exceeds the ", w[0],
               " positions of the table");
      if (in.size() == 2) check_positions(in[1], in[0].shape[0], in[0].shape[1]);
    }
    Shape o = in[0].shape;
    o.push_back(w[1]);
    return {{o, DType::F32}};
  }
  void forward(NodeCtx& c) const override {
    const Tensor& ids = c.in[0];
    const Tensor& w = c.param("weight");
    int64_t V = w.dim(0), C = w.dim(1), N = ids.numel();
    Shape o = ids.shape();
    o.push_back(C);
    Tensor y = new_out(o, device_of(c));
    if (positional(*c.node) && has_positions(c)) {  // the rows of the given positions: a lookup by them
      check_ids(c, c.in[1].i32(), N, V, "position", 1);
      be(c).embedding_fwd(c.in[1].i32(), w.f32(), y.f32(), N, C, V);
    } else if (positional(*c.node)) {
      be(c).pos_embedding_fwd(w.f32(), y.f32(), ids.dim(0), ids.dim(1), C);
    } else {
      const int32_t* id = ids.i32();
      check_ids(c, id, N, V, "token", 0);
      be(c).embedding_fwd(id, w.f32(), y.f32(), N, C, V);
    }
    c.out = {y};
  }
  void backward(NodeCtx& c) const override {
    Tensor dw = c.dparam("weight");
    if (!dw.defined()) return;
    const Tensor& ids = c.in[0];
    int64_t C = dw.dim(1);
    if (positional(*c.node) && has_positions(c))
      be(c).embedding_bwd(c.in[1].i32(), c.dout[0].f32(), dw.f32(), ids.numel(), C, dw.dim(0));
    else if (positional(*c.node))
      be(c).pos_embedding_bwd(c.dout[0].f32(), dw.f32(), ids.dim(0), ids.dim(1), C);
    else if (c.node->attrs.contains("padding_idx")) {  // the gradient without the padding token's positions
      const Tensor& dy = c.dout[0];
      Tensor d = new_out(dy.shape(), device_of(c));
      be(c).unary_fwd(kernels::Unary::Scale, 1.f, dy.f32(), d.f32(), dy.numel());
      be(c).zero_rows(ids.i32(), static_cast<int32_t>(attr_int(*c.node, "padding_idx")), d.f32(), ids.numel(), C);
      be(c).embedding_bwd(ids.i32(), d.f32(), dw.f32(), ids.numel(), C, dw.dim(0));
    } else {
      be(c).embedding_bwd(ids.i32(), c.dout[0].f32(), dw.f32(), ids.numel(), C, dw.dim(0));
    }
  }
};
}  // namespace
std::unique_ptr<Op> make_embedding() { return std::make_unique<Embedding>(); }
}  // namespace zerorun::ops
