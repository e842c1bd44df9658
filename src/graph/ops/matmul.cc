// matmul: batched a[..., M, K] @ b[..., K, N] (b may be a shared 2-D [K, N]).
#include "op_util.h"

namespace zerorun::ops {
namespace {
struct Dims {
  int64_t batch, M, K, N;
  bool shared_b;
};
Dims dims_of(const Shape& a, const Shape& b) {
  ZR_CHECK(a.size() >= 2 && b.size() >= 2, "matmul needs inputs of at least 2 dimensions, got ", shape_str(a), " and ",
           shape_str(b));
  Dims d{1, a[a.size() - 2], a.back(), b.back(), b.size() == 2};
  ZR_CHECK(b[b.size() - 2] == d.K, "matmul inner dimensions differ: ", shape_str(a), " @ ", shape_str(b));
  for (size_t i = 0; i + 2 < a.size(); ++i) d.batch *= a[i];
  if (!d.shared_b)
    ZR_CHECK(b.size() == a.size() && std::equal(a.begin(), a.end() - 2, b.begin()),
             "matmul batch dimensions differ: ", shape_str(a), " @ ", shape_str(b));
  return d;
}
class Matmul : public Op {
 public:
  std::vector<ValueInfo> infer(const Node&, const std::vector<ValueInfo>& in,
                               const std::map<std::string, Shape>&) const override {
    expect_inputs(in, 2);
    expect_f32(in[0], "a");
    expect_f32(in[1], "b");
    dims_of(in[0].shape, in[1].shape);
    Shape o = in[0].shape;
    o.back() = in[1].shape.back();
    return {{o, DType::F32}};
  }
  void forward(NodeCtx& c) const override {
    Dims d = dims_of(c.in[0].shape(), c.in[1].shape());
    Shape o = c.in[0].shape();
    o.back() = d.N;
    Tensor y = new_out(o, device_of(c));
    const float *a = c.in[0].f32(), *b = c.in[1].f32();
    for (int64_t i = 0; i < d.batch; ++i)
      be(c).gemm(false, false, d.M, d.N, d.K, 1.f, a + i * d.M * d.K, b + (d.shared_b ? 0 : i * d.K * d.N), 0.f,
                 y.f32() + i * d.M * d.N);
    c.out = {y};
  }
  bool writes_grad(size_t) const override { return true; }
  void backward(NodeCtx& c) const override {
    Dims d = dims_of(c.in[0].shape(), c.in[1].shape());
    const float *a = c.in[0].f32(), *b = c.in[1].f32(), *dy = c.dout[0].f32();
    const kernels::Grad da = grad_of(c, 0), db = grad_of(c, 1);
    for (int64_t i = 0; i < d.batch; ++i) {
      const float* dyi = dy + i * d.M * d.N;
      const float* bi = b + (d.shared_b ? 0 : i * d.K * d.N);
      if (da)  // da (+)= dy b^T
        be(c).gemm(false, true, d.M, d.K, d.N, 1.f, dyi, bi, da.acc ? 1.f : 0.f, da.p + i * d.M * d.K);
      if (db)  // db (+)= a^T dy; a shared b sums over the batch after the first product
        be(c).gemm(true, false, d.K, d.N, d.M, 1.f, a + i * d.M * d.K, dyi, db.acc || (d.shared_b && i > 0) ? 1.f : 0.f,
                   db.p + (d.shared_b ? 0 : i * d.K * d.N));
    }
  }
};
}  // namespace
std::unique_ptr<Op> make_matmul() { return std::make_unique<Matmul>(); }
}  // namespace zerorun::ops
