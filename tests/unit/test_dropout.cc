// Dropout: the counter-based mask (kernels/counter_rng.h) drops the asked fraction, differs by site and step and
// depends only on the global sample, not on how samples are split into micro-batches or ranks; the dropout op
// scales kept elements by 1 / (1 - p), is the identity when off (eval), and its backward regenerates the same mask;
// attention's probability dropout against a float64 reference with the same mask, forward and finite-difference
// gradients; and the graph builders place the dropouts transformers has.
#include <catch2/catch.hpp>
#include <cmath>

#include "kernels/backend.h"
#include "kernels/counter_rng.h"
#include "zerorun/graph.h"
#include "zerorun/model.h"
#include "zerorun/rng.h"

using namespace zerorun;
namespace rng = zerorun::kernels::rng;

namespace {
Node dropout_node(double p, int64_t site) {
  Node n;
  n.op = "dropout";
  n.block = "b";
  n.in = {"x"};
  n.out = {"y"};
  n.attrs = {{"dropout", p}, {"site", site}};
  return n;
}
Tensor random_tensor(const Shape& s, uint64_t seed) {
  Rng r(seed);
  Tensor t = Tensor::empty(s, DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = static_cast<float>(2 * r.uniform() - 1);
  return t;
}
// Forward of node n (dropout or attention) over x with the context d; then backward of dy into a gradient
// pre-filled with `pre` (accumulated into).
std::pair<Tensor, Tensor> run(const Node& n, const Tensor& x, const DropoutCtx& d, const Tensor& dy, float pre = 1.f) {
  const Op& op = op_lookup(n.op);
  NodeCtx c;
  c.node = &n;
  std::vector<Tensor> saved;
  c.saved = &saved;
  c.dropout = &d;
  c.in = {x};
  op.forward(c);
  Tensor dx = Tensor::empty(x.shape(), DType::F32);
  for (int64_t i = 0; i < dx.numel(); ++i) dx.f32()[i] = pre;
  c.dout = {dy};
  c.din = {dx};
  c.din_acc = {true};
  op.backward(c);
  return {c.out[0], dx};
}
}  // namespace

TEST_CASE("counter-based dropout bits: the asked fraction, other sites and steps draw other masks", "[dropout]") {
  for (float p : {0.1f, 0.5f, 0.9f}) {
    const uint64_t key = rng::dropout_key(1234, 3, 5);
    const uint32_t thr = rng::dropout_threshold(p);
    const int64_t n = 1 << 20;
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) kept += rng::dropout_keep(key, static_cast<uint64_t>(i), thr);
    INFO("p " << p);
    REQUIRE(std::fabs(static_cast<double>(kept) / n - (1.0 - p)) < 3e-3);
  }
  REQUIRE(rng::dropout_threshold(0.f) == 0u);
  for (uint64_t c = 0; c < 1000; ++c) REQUIRE(rng::dropout_keep(rng::dropout_key(1, 1, 0), c, 0));
  // Masks of different sites, steps and seeds agree on about p^2 + (1 - p)^2 of the elements, not all.
  auto agreement = [](uint64_t k1, uint64_t k2) {
    const uint32_t thr = rng::dropout_threshold(0.5f);
    int64_t same = 0;
    for (uint64_t i = 0; i < 100000; ++i) same += rng::dropout_keep(k1, i, thr) == rng::dropout_keep(k2, i, thr);
    return static_cast<double>(same) / 100000;
  };
  const uint64_t k = rng::dropout_key(1234, 3, 5);
  for (uint64_t other : {rng::dropout_key(1234, 3, 6), rng::dropout_key(1234, 4, 5), rng::dropout_key(1235, 3, 5)})
    REQUIRE(std::fabs(agreement(k, other) - 0.5) < 0.01);
}

TEST_CASE("dropout op: scaled kept elements, the same mask in backward, identity when off", "[dropout]") {
  const Node n = dropout_node(0.25, 3);
  const Shape s{4, 6, 5};
  const Tensor x = random_tensor(s, 1), dy = random_tensor(s, 2);
  DropoutCtx on{true, 99, 7, 10};
  auto [y, dx] = run(n, x, on, dy);
  const uint64_t key = rng::dropout_key(99, 7, 3);
  const uint32_t thr = rng::dropout_threshold(0.25f);
  int64_t dropped = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const bool keep = rng::dropout_keep(key, static_cast<uint64_t>(10 * 30 + i), thr);
    dropped += !keep;
    INFO("element " << i);
    REQUIRE(y.f32()[i] == (keep ? x.f32()[i] * (1.f / 0.75f) : 0.f));
    REQUIRE(dx.f32()[i] == 1.f + (keep ? dy.f32()[i] * (1.f / 0.75f) : 0.f));  // accumulated
  }
  REQUIRE(dropped > 0);
  REQUIRE(dropped < x.numel());

  // Samples 12 and 13 alone (a micro-batch of another rank or split) get the rows they got inside 10 .. 13.
  Tensor tail = Tensor::empty({2, 6, 5}, DType::F32), dtail = Tensor::empty({2, 6, 5}, DType::F32);
  for (int64_t i = 0; i < tail.numel(); ++i) tail.f32()[i] = x.f32()[60 + i], dtail.f32()[i] = dy.f32()[60 + i];
  auto [y2, dx2] = run(n, tail, DropoutCtx{true, 99, 7, 12}, dtail);
  for (int64_t i = 0; i < tail.numel(); ++i) {
    REQUIRE(y2.f32()[i] == y.f32()[60 + i]);
    REQUIRE(dx2.f32()[i] == dx.f32()[60 + i]);
  }

  // Off (evaluation) and p = 0: the identity, forward and backward.
  for (const auto& [node, ctx] :
       {std::pair<Node, DropoutCtx>{n, DropoutCtx{}}, std::pair<Node, DropoutCtx>{dropout_node(0.0, 0), on}}) {
    auto [y0, dx0] = run(node, x, ctx, dy);
    for (int64_t i = 0; i < x.numel(); ++i) {
      REQUIRE(y0.f32()[i] == x.f32()[i]);
      REQUIRE(dx0.f32()[i] == 1.f + dy.f32()[i]);
    }
  }
  const Op& op = op_lookup("dropout");
  REQUIRE_THROWS_WITH(op.infer(dropout_node(1.0, 0), {{s, DType::F32}}, {}),
                      Catch::Contains("attribute 'dropout' must be in [0, 1), got 1"));
  Node nosite = dropout_node(0.1, 0);
  nosite.attrs.erase("site");
  REQUIRE_THROWS_WITH(op.infer(nosite, {{s, DType::F32}}, {}), Catch::Contains("'site' must be an integer"));
}

namespace {
// transformers' eager attention (causal, multi-head) in f64 with the probabilities dropped out by zerorun's mask.
std::vector<double> attention_ref(const std::vector<double>& x, int64_t B, int64_t T, int64_t H, int64_t D,
                                  const kernels::AttnDims& d) {
  const int64_t W = 3 * H * D;
  std::vector<double> y(static_cast<size_t>(B * T * H * D), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> s(static_cast<size_t>(t + 1));
        double mx = -INFINITY, z = 0;
        for (int64_t u = 0; u <= t; ++u) {
          double dot = 0;
          for (int64_t i = 0; i < D; ++i) dot += x[(b * T + t) * W + h * D + i] * x[(b * T + u) * W + (H + h) * D + i];
          s[u] = dot / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, s[u]);
        }
        for (auto& v : s) z += (v = std::exp(v - mx));
        for (int64_t u = 0; u <= t; ++u) {
          const double p = s[u] / z * d.drop_factor(b, h, t, u);
          for (int64_t i = 0; i < D; ++i)
            y[(b * T + t) * H * D + h * D + i] += p * x[(b * T + u) * W + (2 * H + h) * D + i];
        }
      }
  return y;
}
}  // namespace

TEST_CASE("attention dropout: forward and gradients vs a float64 reference with the same mask", "[dropout]") {
  const int64_t B = 2, T = 7, H = 2, D = 4, W = 3 * H * D;
  Node n;
  n.op = "attention";
  n.block = "b";
  n.out = {"y"};
  n.attrs = {{"n_head", H}, {"dropout", 0.3}, {"site", 4}};
  const DropoutCtx ctx{true, 5, 2, 6};
  kernels::AttnDims d;
  d.B = B, d.T = T, d.H = H, d.K = H, d.D = D;
  d.drop = {rng::dropout_key(5, 2, 4), rng::dropout_threshold(0.3f), 1.f / 0.7f, 6ull * H * T * T};
  Rng r(3);
  std::vector<double> x(static_cast<size_t>(B * T * W));
  for (auto& v : x) v = 2 * r.uniform() - 1;
  std::vector<double> R(static_cast<size_t>(B * T * H * D));
  for (auto& v : R) v = 2 * r.uniform() - 1;
  Tensor qkv = Tensor::empty({B, T, W}, DType::F32);
  for (size_t i = 0; i < x.size(); ++i) qkv.f32()[i] = static_cast<float>(x[i]);

  Tensor dout = Tensor::empty({B, T, H * D}, DType::F32);
  for (size_t i = 0; i < R.size(); ++i) dout.f32()[i] = static_cast<float>(R[i]);
  const auto [out, din] = run(n, qkv, ctx, dout, 0.f);
  const std::vector<double> y = attention_ref(x, B, T, H, D, d);
  double ymax = 0;
  for (double v : y) ymax = std::max(ymax, std::fabs(v));
  for (size_t i = 0; i < y.size(); ++i) REQUIRE(std::fabs(out.f32()[i] - y[i]) <= 2e-5 * ymax);
  int zeros = 0;  // some probabilities were dropped: outputs differ from the undropped reference
  kernels::AttnDims plain = d;
  plain.drop = {};
  const std::vector<double> y0 = attention_ref(x, B, T, H, D, plain);
  for (size_t i = 0; i < y.size(); ++i) zeros += std::fabs(y[i] - y0[i]) > 1e-6;
  REQUIRE(zeros > 0);

  const double h = 1e-6;
  double gmax = 1e-8;
  std::vector<double> num(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double old = x[i];
    double l[2];
    for (int k = 0; k < 2; ++k) {
      x[i] = old + (k ? -h : h);
      const std::vector<double> yy = attention_ref(x, B, T, H, D, d);
      l[k] = 0;
      for (size_t j = 0; j < yy.size(); ++j) l[k] += R[j] * yy[j];
    }
    x[i] = old;
    num[i] = (l[0] - l[1]) / (2 * h);
    gmax = std::max(gmax, std::fabs(num[i]));
  }
  for (size_t i = 0; i < x.size(); ++i) {
    INFO("qkv element " << i << ": analytic " << din.f32()[i] << " numeric " << num[i]);
    REQUIRE(std::fabs(din.f32()[i] - num[i]) <= 2e-3 * gmax);
  }
}

TEST_CASE("builders place transformers' dropouts, each its own site", "[dropout]") {
  Gpt2Spec g;
  g.vocab = 64, g.n_ctx = 16, g.n_embd = 32, g.n_layer = 3, g.n_head = 4;
  g.attn_pdrop = 0.1, g.resid_pdrop = 0.2, g.embd_pdrop = 0.3;
  LlamaSpec l;
  l.vocab = 64, l.n_ctx = 16, l.n_embd = 32, l.n_layer = 2, l.n_head = 4, l.ffn = 48;
  l.attn_dropout = 0.1, l.resid_dropout = 0.2;
  for (const Model& m : {build_gpt2(g, 1, true), build_llama(l, 1, true)}) {
    std::vector<int64_t> sites;
    int drops = 0, attn = 0;
    for (const Node& n : m.graph.nodes) {
      if (!n.attrs.contains("dropout")) continue;
      sites.push_back(n.attrs["site"].get<int64_t>());
      drops += n.op == "dropout";
      attn += n.op == "attention";
    }
    const bool gpt2 = m.graph.meta["arch"] == "gpt2";
    REQUIRE(attn == (gpt2 ? 3 : 2));
    REQUIRE(drops == (gpt2 ? 1 + 2 * 3 : 2 * 2));
    for (size_t i = 0; i < sites.size(); ++i) REQUIRE(sites[i] == static_cast<int64_t>(i));  // in node order
  }
  g.attn_pdrop = g.resid_pdrop = g.embd_pdrop = 0;
  for (const Node& n : build_gpt2(g, 1, true).graph.nodes) REQUIRE(!n.attrs.contains("dropout"));
}
