// The attention op on the CPU against a float64 reference written from transformers' eager attention
// (repeat_kv, scaling, Gemma 2's soft-capping, the sliding-window causal mask): the forward, and the backward
// against central finite differences of that reference, for every combination of grouped-query heads, scale,
// window and soft-capping; grouped-query heads read in place equal to the heads repeated; attribute errors; the CPU
// kernels' per-document masking of packed sequences (AttnDims::pos) against the same reference with documents.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <tuple>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_kernels.h"
#include "zerorun/graph.h"
#include "zerorun/rng.h"

using namespace zerorun;
using Vec = std::vector<double>;

namespace {

struct Opts {
  int64_t H = 2, K = 2, D = 4;
  double scale = 0;  // 0: 1/sqrt(D)
  int64_t window = 0;
  double softcap = 0;
  const std::vector<int32_t>* pos = nullptr;  // [B, T]: each token's position in its document (null: one document)
};

Node attn_node(const Opts& o, bool explicit_kv = true) {
  Node n;
  n.op = "attention";
  n.block = "b";
  n.out = {"y"};
  n.attrs = json::object();
  n.attrs["n_head"] = o.H;
  if (explicit_kv) n.attrs["n_kv_head"] = o.K;
  if (o.scale > 0) n.attrs["scale"] = o.scale;
  if (o.window > 0) n.attrs["window"] = o.window;
  if (o.softcap > 0) n.attrs["softcap"] = o.softcap;
  return n;
}

// transformers' eager attention in f64: qkv [B, T, (H + 2K) D] -> [B, T, H D].
Vec reference(const Vec& x, int64_t B, int64_t T, const Opts& o) {
  const int64_t H = o.H, K = o.K, D = o.D, W = (H + 2 * K) * D, rep = H / K;
  const double scale = o.scale > 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(D));
  Vec y(B * T * H * D, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / rep;
      for (int64_t t = 0; t < T; ++t) {
        Vec s(T, -INFINITY);
        double mx = -INFINITY;
        for (int64_t u = 0; u <= t; ++u) {
          if (o.window > 0 && t - u >= o.window) continue;
          if (o.pos && u < t - (*o.pos)[b * T + t]) continue;  // before the query's document
          double d = 0;
          for (int64_t i = 0; i < D; ++i) d += x[(b * T + t) * W + h * D + i] * x[(b * T + u) * W + (H + g) * D + i];
          d *= scale;
          if (o.softcap > 0) d = o.softcap * std::tanh(d / o.softcap);
          s[u] = d;
          mx = std::max(mx, d);
        }
        double z = 0;
        for (auto& v : s) z += (v = std::exp(v - mx));
        for (int64_t u = 0; u <= t; ++u)
          for (int64_t i = 0; i < D; ++i)
            y[(b * T + t) * H * D + h * D + i] += s[u] / z * x[(b * T + u) * W + (H + K + g) * D + i];
      }
    }
  return y;
}

Tensor to_tensor(const Vec& v, const Shape& s) {
  Tensor t = Tensor::empty(s, DType::F32);
  for (size_t i = 0; i < v.size(); ++i) t.f32()[i] = static_cast<float>(v[i]);
  return t;
}

struct Run {
  Tensor out, dqkv;
};
// Forward, then backward of upstream gradient R into a gradient pre-filled with `pre` (accumulate) or NaN
// (overwrite: the op must write every element).
Run run_op(const Node& n, const Tensor& qkv, const Vec& R, bool accumulate, float pre = 1.f) {
  const Op& op = op_lookup(n.op);
  NodeCtx c;
  c.node = &n;
  std::vector<Tensor> saved;
  c.saved = &saved;
  c.in = {qkv};
  op.forward(c);
  Tensor dout = to_tensor(R, c.out[0].shape());
  c.dout = {dout};
  Tensor din = Tensor::empty(qkv.shape(), DType::F32);
  for (int64_t i = 0; i < din.numel(); ++i) din.f32()[i] = accumulate ? pre : std::nanf("");
  c.din = {din};
  c.din_acc = {accumulate};
  op.backward(c);
  return {c.out[0], din};
}

void gradcheck(const Opts& o, int64_t B, int64_t T, Rng& r, double amp) {
  INFO("H " << o.H << " K " << o.K << " D " << o.D << " T " << T << " scale " << o.scale << " window " << o.window
            << " softcap " << o.softcap);
  const int64_t W = (o.H + 2 * o.K) * o.D;
  Vec x(B * T * W);
  for (auto& v : x) v = (2 * r.uniform() - 1) * amp;
  const Node n = attn_node(o);
  const Shape s{B, T, W};
  auto vi = op_lookup("attention").infer(n, {{s, DType::F32}}, {});
  REQUIRE(vi[0].shape == Shape{B, T, o.H * o.D});

  const Vec y = reference(x, B, T, o);
  Vec R(y.size());
  for (auto& v : R) v = 2 * r.uniform() - 1;
  for (bool accumulate : {true, false}) {
    INFO((accumulate ? "accumulate" : "overwrite"));
    Run run = run_op(n, to_tensor(x, s), R, accumulate);
    double ymax = 1e-6;
    for (double v : y) ymax = std::max(ymax, std::fabs(v));
    for (size_t i = 0; i < y.size(); ++i) {
      INFO("forward element " << i);
      REQUIRE(std::fabs(run.out.f32()[i] - y[i]) <= 2e-5 * ymax);
    }
    const double h = 1e-6;
    Vec num(x.size());
    double gmax = 1e-8;
    for (size_t i = 0; i < x.size(); ++i) {
      const double old = x[i];
      double l[2];
      for (int k = 0; k < 2; ++k) {
        x[i] = old + (k ? -h : h);
        Vec yy = reference(x, B, T, o);
        l[k] = 0;
        for (size_t j = 0; j < yy.size(); ++j) l[k] += R[j] * yy[j];
      }
      x[i] = old;
      num[i] = (l[0] - l[1]) / (2 * h);
      gmax = std::max(gmax, std::fabs(num[i]));
    }
    for (size_t i = 0; i < x.size(); ++i) {
      const double an = run.dqkv.f32()[i] - (accumulate ? 1.0 : 0.0);
      INFO("qkv gradient element " << i << " (row " << i / W << ", column " << i % W << "): analytic " << an
                                   << " numeric " << num[i]);
      REQUIRE(std::fabs(an - num[i]) <= 2e-3 * gmax);
    }
  }
}

}  // namespace

TEST_CASE("attention gradcheck: grouped-query heads, scale, sliding window, soft-capping", "[ops][attention]") {
  Rng r(31);
  for (auto [H, K] : {std::pair<int64_t, int64_t>{2, 2}, {4, 2}, {6, 1}})
    for (int64_t window : {0, 1, 3})
      for (double softcap : {0.0, 1.5})
        for (double scale : {0.0, 0.9}) {
          Opts o;
          o.H = H, o.K = K, o.D = 4, o.window = window, o.softcap = softcap, o.scale = scale;
          // Inputs large enough that the cap bends the scores (|scale q.k| up to ~3 against a cap of 1.5).
          gradcheck(o, 2, 5, r, 1.2);
        }
}

TEST_CASE("attention gradcheck: odd T, head size 3, windows at and past T", "[ops][attention]") {
  Rng r(32);
  for (int64_t window : {2, 7, 9}) {
    Opts o;
    o.H = 3, o.K = 1, o.D = 3, o.window = window, o.softcap = 0.8, o.scale = 0.6;
    gradcheck(o, 1, 7, r, 1.0);
  }
}

TEST_CASE("attention: grouped-query heads read in place equal the heads repeated", "[ops][attention]") {
  // H query heads over K key/value heads vs the same qkv with every key/value head repeated H / K times as H
  // heads (what rope's repeat produced): the same output bits; the key/value gradient is the sum over each group.
  Rng r(33);
  const int64_t B = 2, T = 6, H = 6, K = 2, D = 4, rep = H / K, W = (H + 2 * K) * D, Wr = 3 * H * D;
  Vec x(B * T * W), xr(B * T * Wr);
  for (auto& v : x) v = 2 * r.uniform() - 1;
  for (int64_t row = 0; row < B * T; ++row)
    for (int64_t j = 0; j < 3 * H; ++j) {
      const int64_t src = j < H ? j : j < 2 * H ? H + (j - H) / rep : H + K + (j - 2 * H) / rep;
      for (int64_t i = 0; i < D; ++i) xr[row * Wr + j * D + i] = x[row * W + src * D + i];
    }
  Vec R(B * T * H * D);
  for (auto& v : R) v = 2 * r.uniform() - 1;
  Opts o;
  o.H = H, o.K = K, o.D = D, o.window = 4, o.softcap = 2.0;
  Opts orp = o;
  orp.K = H;
  Run a = run_op(attn_node(o), to_tensor(x, {B, T, W}), R, false);
  Run b = run_op(attn_node(orp, false), to_tensor(xr, {B, T, Wr}), R, false);
  for (int64_t i = 0; i < a.out.numel(); ++i) REQUIRE(a.out.f32()[i] == b.out.f32()[i]);
  for (int64_t row = 0; row < B * T; ++row)
    for (int64_t j = 0; j < H + 2 * K; ++j)
      for (int64_t i = 0; i < D; ++i) {
        double want = 0;
        if (j < H)
          want = b.dqkv.f32()[row * Wr + j * D + i];
        else
          for (int64_t k = 0; k < rep; ++k) {
            const int64_t jr = j < H + K ? H + (j - H) * rep + k : 2 * H + (j - H - K) * rep + k;
            want += b.dqkv.f32()[row * Wr + jr * D + i];
          }
        INFO("row " << row << " head " << j << " feature " << i);
        REQUIRE(a.dqkv.f32()[row * W + j * D + i] == Approx(want).margin(1e-6));
      }
}

TEST_CASE("attention: defaults keep multi-head attention bit for bit", "[ops][attention]") {
  // n_kv_head = n_head, scale = 1/sqrt(D) and window >= T spelled out give the bits of the plain GPT-2 node.
  Rng r(34);
  const int64_t B = 2, T = 5, H = 3, D = 8, W = 3 * H * D;
  Vec x(B * T * W), R(B * T * H * D);
  for (auto& v : x) v = 2 * r.uniform() - 1;
  for (auto& v : R) v = 2 * r.uniform() - 1;
  Opts o;
  o.H = H, o.K = H, o.D = D;
  Run plain = run_op(attn_node(o, false), to_tensor(x, {B, T, W}), R, true, 0.25f);
  o.scale = 1.f / std::sqrt(static_cast<float>(D));  // the default, as a float
  o.window = T;
  Run spelled = run_op(attn_node(o), to_tensor(x, {B, T, W}), R, true, 0.25f);
  for (int64_t i = 0; i < plain.out.numel(); ++i) REQUIRE(plain.out.f32()[i] == spelled.out.f32()[i]);
  for (int64_t i = 0; i < plain.dqkv.numel(); ++i) REQUIRE(plain.dqkv.f32()[i] == spelled.dqkv.f32()[i]);
}

TEST_CASE("attention: bad attributes are errors naming them", "[ops][attention]") {
  const Op& op = op_lookup("attention");
  auto infer = [&](json attrs, int64_t width) {
    Node n;
    n.op = "attention";
    n.attrs = std::move(attrs);
    return op.infer(n, {{{1, 4, width}, DType::F32}}, {});
  };
  REQUIRE_THROWS_WITH(infer({{"n_head", 2}, {"sliding_window", 4}}, 24), Catch::Contains("'sliding_window'"));
  REQUIRE_THROWS_WITH(infer({{"n_head", 4}, {"n_kv_head", 3}}, 40),
                      Catch::Contains("'n_kv_head' 3 must be positive and divide n_head 4"));
  REQUIRE_THROWS_WITH(infer({{"n_head", 4}, {"n_kv_head", 2}}, 30),
                      Catch::Contains("qkv width 30 is not (n_head + 2 n_kv_head) x head size"));
  REQUIRE_THROWS_WITH(infer({{"n_head", 2}, {"window", -1}}, 24), Catch::Contains("'window' must be 0"));
  REQUIRE_THROWS_WITH(infer({{"n_head", 2}, {"window", 2.5}}, 24), Catch::Contains("'window' must be an integer"));
  REQUIRE_THROWS_WITH(infer({{"n_head", 2}, {"softcap", -1.0}}, 24), Catch::Contains("'softcap' must be 0"));
  REQUIRE_THROWS_WITH(infer({{"n_head", 2}, {"scale", 0.0}}, 24), Catch::Contains("'scale' must be positive"));
  REQUIRE_THROWS_WITH(infer({{"n_head", 2}, {"scale", "x"}}, 24), Catch::Contains("'scale' must be a number"));
  REQUIRE_THROWS_WITH(infer({{"n_head", 0}}, 24), Catch::Contains("'n_head' must be positive"));
  // Grouped-query: [B, T, (H + 2K) D] -> [B, T, H D].
  REQUIRE(infer({{"n_head", 4}, {"n_kv_head", 2}}, 64)[0].shape == Shape{1, 4, 32});
  REQUIRE(infer({{"n_head", 3}}, 36)[0].shape == Shape{1, 4, 12});
}

TEST_CASE("attention kernels with documents (pos): float64 gradcheck, windows, grouped-query heads, soft-capping",
          "[ops][attention]") {
  // The CPU kernels called with AttnDims::pos (the graph wires pos elsewhere): documents of several lengths packed
  // into rows of odd T, one of length 1, a document cut by the row's end, and each row's documents laid out
  // differently; against the float64 reference (no key before the query's document) and its central differences.
  const int64_t B = 2, T = 9;
  // Row 0: documents of 3, 1, 4 and 1 tokens; row 1: 5 tokens (a document continued from an earlier row: its
  // positions start at 2), then 4.
  const std::vector<int32_t> pos = {0, 1, 2, 0, 0, 1, 2, 3, 0, 2, 3, 4, 5, 6, 0, 1, 2, 3};
  Rng r(35);
  for (auto [H, K] : {std::pair<int64_t, int64_t>{2, 2}, {4, 1}})
    for (int64_t window : {0, 2, 4})
      for (double softcap : {0.0, 1.5}) {
        Opts o;
        o.H = H, o.K = K, o.D = 4, o.window = window, o.softcap = softcap, o.pos = &pos;
        INFO("H " << H << " K " << K << " window " << window << " softcap " << softcap);
        const int64_t W = (H + 2 * K) * o.D;
        Vec x(B * T * W);
        for (auto& v : x) v = (2 * r.uniform() - 1) * 1.2;
        const Vec y = reference(x, B, T, o);
        Vec R(y.size());
        for (auto& v : R) v = 2 * r.uniform() - 1;
        kernels::AttnDims d;
        d.B = B, d.T = T, d.H = H, d.K = K, d.D = o.D, d.window = window, d.softcap = static_cast<float>(softcap);
        d.scale = 1.f / std::sqrt(static_cast<float>(o.D));
        d.pos = pos.data();
        std::vector<float> xf(x.begin(), x.end()), Rf(R.begin(), R.end()), out(y.size()), probs(B * H * T * T),
            dx(x.size(), 0.f);
        kernels::cpu::attention_fwd(xf.data(), out.data(), probs.data(), d);
        kernels::cpu::attention_bwd(xf.data(), probs.data(), Rf.data(), dx.data(), d);
        double ymax = 1e-6;
        for (double v : y) ymax = std::max(ymax, std::fabs(v));
        for (size_t i = 0; i < y.size(); ++i) {
          INFO("forward element " << i);
          REQUIRE(std::fabs(out[i] - y[i]) <= 2e-5 * ymax);
        }
        // A key before its query's document gets exactly zero probability.
        for (int64_t b = 0; b < B; ++b)
          for (int64_t t = 0; t < T; ++t)
            for (int64_t s = 0; s < t - pos[b * T + t]; ++s) REQUIRE(probs[((b * H) * T + t) * T + s] == 0.f);
        const double h = 1e-6;
        Vec num(x.size());
        double gmax = 1e-8;
        for (size_t i = 0; i < x.size(); ++i) {
          const double old = x[i];
          double l[2];
          for (int k = 0; k < 2; ++k) {
            x[i] = old + (k ? -h : h);
            const Vec yy = reference(x, B, T, o);
            l[k] = 0;
            for (size_t j = 0; j < yy.size(); ++j) l[k] += R[j] * yy[j];
          }
          x[i] = old;
          num[i] = (l[0] - l[1]) / (2 * h);
          gmax = std::max(gmax, std::fabs(num[i]));
        }
        for (size_t i = 0; i < x.size(); ++i) {
          INFO("qkv gradient element " << i << ": analytic " << dx[i] << " numeric " << num[i]);
          REQUIRE(std::fabs(dx[i] - num[i]) <= 2e-3 * gmax);
        }
        // The documents matter: without pos the output differs.
        kernels::AttnDims whole = d;
        whole.pos = nullptr;
        std::vector<float> out1(y.size());
        kernels::cpu::attention_fwd(xf.data(), out1.data(), probs.data(), whole);
        double diff = 0;
        for (size_t i = 0; i < y.size(); ++i) diff = std::max(diff, std::fabs((double)out1[i] - out[i]));
        REQUIRE(diff > 1e-3);
      }
}

TEST_CASE("attention kernels: pos of one document a row gives the bits of no pos", "[ops][attention]") {
  const int64_t B = 2, T = 7, H = 4, K = 2, D = 8, W = (H + 2 * K) * D;
  Rng r(36);
  std::vector<float> x(B * T * W), R(B * T * H * D);
  for (auto& v : x) v = static_cast<float>(2 * r.uniform() - 1);
  for (auto& v : R) v = static_cast<float>(2 * r.uniform() - 1);
  std::vector<int32_t> pos(B * T);
  for (int64_t i = 0; i < B * T; ++i) pos[i] = static_cast<int32_t>(i % T);
  kernels::AttnDims d;
  d.B = B, d.T = T, d.H = H, d.K = K, d.D = D, d.window = 3, d.softcap = 2.f, d.scale = 0.4f;
  std::vector<float> out[2], dx[2], probs(B * H * T * T);
  for (int k = 0; k < 2; ++k) {
    d.pos = k ? pos.data() : nullptr;
    out[k].assign(B * T * H * D, 0.f);
    dx[k].assign(x.size(), 0.f);
    kernels::cpu::attention_fwd(x.data(), out[k].data(), probs.data(), d);
    kernels::cpu::attention_bwd(x.data(), probs.data(), R.data(), dx[k].data(), d);
  }
  REQUIRE(out[0] == out[1]);
  REQUIRE(dx[0] == dx[1]);
}
