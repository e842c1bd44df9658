// rope: rotary position embeddings (transformers' Llama convention) on packed
// qkv [B, T, (H + 2K) D] -> [B, T, 3 H D] for the attention op, with the K
// key/value heads of grouped-query attention repeated H / K times. Saves
// nothing; 16-bit storage on either side where the backend has it.
#include "op_util.h"

namespace zerorun::ops {
namespace {
struct RopeDims {
  int64_t H, K, D;
  float theta;
};
RopeDims dims_of(const Node& n, int64_t width) {
  const int64_t H = attr_int(n, "n_head");
  const int64_t K = n.attrs.contains("n_kv_head") ? attr_int(n, "n_kv_head") : H;
  ZR_CHECK(H > 0 && K > 0 && H % K == 0, "n_kv_head ", K, " must be positive and divide n_head ", H);
  ZR_CHECK(H <= width && width % (H + 2 * K) == 0, "qkv width ", width,
           " is not (n_head + 2 n_kv_head) x head size, n_head ", H, ", n_kv_head ", K);
  const int64_t D = width / (H + 2 * K);
  ZR_CHECK(D > 0 && D % 2 == 0, "rope needs an even head size, got ", D);
  const float theta = attr_float(n, "theta", 10000.f);
  ZR_CHECK(theta > 1.f, "attribute 'theta' must be > 1, got ", theta);
  return {H, K, D, theta};
}
// 16-bit storage on either side (bf16/fp16 runs on CUDA): rope saves nothing, so its input and output can both
// stay in the matmul dtype between the qkv projection and attention.
class Rope : public Op16 {
 public:
  std::vector<ValueInfo> infer(const Node& n, const std::vector<ValueInfo>& in,
                               const std::map<std::string, Shape>&) const override {
    expect_inputs(in, 1);
    expect_f32(in[0], "qkv");
    const Shape& s = in[0].shape;
    ZR_CHECK(s.size() == 3, "qkv must be [B, T, (n_head + 2 n_kv_head) x head size], got ", shape_str(s));
    RopeDims d = dims_of(n, s[2]);
    return {{{s[0], s[1], 3 * d.H * d.D}, DType::F32}};
  }
  void forward(NodeCtx& c) const override {
    const Tensor& qkv = c.in[0];
    RopeDims d = dims_of(*c.node, qkv.dim(2));
    const Shape os{qkv.dim(0), qkv.dim(1), 3 * d.H * d.D};
    Tensor y = want16(c, 0) ? new_out16(c, os) : new_out(os, device_of(c));
    be(c).rope_fwd(src_of(qkv), dst_of(y), qkv.dim(0), qkv.dim(1), d.H, d.K, d.D, d.theta);
    c.out = {y};
  }
  bool writes_grad(size_t) const override { return true; }
  void backward(NodeCtx& c) const override {
    if (!c.din[0].defined()) return;
    const Tensor& qkv = c.in[0];
    RopeDims d = dims_of(*c.node, qkv.dim(2));
    be(c).rope_bwd(src_of(c.dout[0]), grad_of(c, 0), qkv.dim(0), qkv.dim(1), d.H, d.K, d.D, d.theta);
  }
};
}  // namespace
std::unique_ptr<Op> make_rope() { return std::make_unique<Rope>(); }
}  // namespace zerorun::ops
