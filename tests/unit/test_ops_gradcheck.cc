// Every op: forward against a float64 reference implementation, and backward
// against central finite differences of that float64 reference.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <tuple>

#include "zerorun/graph.h"
#include "zerorun/rng.h"

using namespace zerorun;
using Vec = std::vector<double>;
using RefFn = std::function<Vec(const std::vector<Vec>& in, const std::map<std::string, Vec>& p)>;

namespace {
constexpr double kPi = 3.14159265358979323846;  // M_PI is POSIX, not standard C++

struct Arg {
  Shape shape;
  DType dtype = DType::F32;
  std::vector<double> values;
};

Arg rnd(const Shape& s, Rng& r, double scale = 1.0) {
  Arg a{s, DType::F32, {}};
  for (int64_t i = 0; i < shape_numel(s); ++i) a.values.push_back((2 * r.uniform() - 1) * scale);
  return a;
}
Arg ids(const Shape& s, int64_t V, Rng& r) {
  Arg a{s, DType::I32, {}};
  for (int64_t i = 0; i < shape_numel(s); ++i) a.values.push_back(static_cast<double>(r.next() % V));
  return a;
}
Tensor to_tensor(const Arg& a, MemCategory c = MemCategory::Buffers) {
  Tensor t = Tensor::empty(a.shape, a.dtype, c);
  for (size_t i = 0; i < a.values.size(); ++i) {
    if (a.dtype == DType::I32)
      t.i32()[i] = static_cast<int32_t>(a.values[i]);
    else
      t.f32()[i] = static_cast<float>(a.values[i]);
  }
  return t;
}

// Runs `node` forward/backward in f32 with upstream grad R and compares
// against the f64 reference `ref`.
void check_op(Node node, const std::vector<Arg>& inputs, const std::map<std::string, Arg>& params, const RefFn& ref,
              double fwd_tol = 2e-5, double grad_tol = 2e-3) {
  INFO("op " << node.op);
  const Op& op = op_lookup(node.op);
  std::vector<ValueInfo> vin;
  for (auto& a : inputs) vin.push_back({a.shape, a.dtype});
  std::map<std::string, Shape> ps;
  for (auto& [k, a] : params) ps[k] = a.shape;
  auto outs = op.infer(node, vin, ps);
  REQUIRE(outs.size() == 1);

  // f32 forward
  NodeCtx c;
  c.node = &node;
  std::vector<Tensor> saved;
  c.saved = &saved;
  for (auto& a : inputs) c.in.push_back(to_tensor(a));
  for (auto& [k, a] : params) c.params[k] = to_tensor(a);
  op.forward(c);
  REQUIRE(c.out.size() == 1);
  REQUIRE(c.out[0].shape() == outs[0].shape);

  std::vector<Vec> in64;
  for (auto& a : inputs) in64.push_back(a.values);
  std::map<std::string, Vec> p64;
  for (auto& [k, a] : params) p64[k] = a.values;
  Vec y = ref(in64, p64);
  REQUIRE(static_cast<int64_t>(y.size()) == c.out[0].numel());
  double ymax = 1e-6;
  for (double v : y) ymax = std::max(ymax, std::fabs(v));
  for (size_t i = 0; i < y.size(); ++i) {
    INFO("forward element " << i);
    REQUIRE(std::fabs(c.out[0].f32()[i] - y[i]) <= fwd_tol * ymax);
  }

  // Upstream gradient R and the scalar objective L = sum(R * y).
  Rng r(99);
  Vec R(y.size());
  for (auto& v : R) v = 2 * r.uniform() - 1;
  auto objective = [&](const std::vector<Vec>& in, const std::map<std::string, Vec>& p) {
    Vec o = ref(in, p);
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += R[i] * o[i];
    return s;
  };
  Tensor dout = Tensor::empty(c.out[0].shape(), DType::F32);
  for (size_t i = 0; i < R.size(); ++i) dout.f32()[i] = static_cast<float>(R[i]);
  c.dout = {dout};
  for (auto& t : c.in) c.din.push_back(t.dtype() == DType::F32 ? Tensor::zeros(t.shape(), DType::F32) : Tensor());
  for (auto& [k, t] : c.params) c.dparams[k] = Tensor::zeros(t.shape(), DType::F32);
  // Pre-fill with 1 to prove backward accumulates rather than overwrites.
  for (auto& t : c.din)
    if (t.defined())
      for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = 1.f;
  op.backward(c);

  const double h = 1e-6;
  auto compare = [&](Vec& x, const Tensor& analytic, double pre, const std::string& what) {
    Vec num(x.size());
    double gmax = 1e-8;
    for (size_t i = 0; i < x.size(); ++i) {
      double old = x[i];
      x[i] = old + h;
      double lp = objective(in64, p64);
      x[i] = old - h;
      double lm = objective(in64, p64);
      x[i] = old;
      num[i] = (lp - lm) / (2 * h);
      gmax = std::max(gmax, std::fabs(num[i]));
    }
    for (size_t i = 0; i < x.size(); ++i) {
      INFO(what << " element " << i << ": analytic " << analytic.f32()[i] - pre << " numeric " << num[i]);
      REQUIRE(std::fabs((analytic.f32()[i] - pre) - num[i]) <= grad_tol * gmax);
    }
  };
  for (size_t k = 0; k < inputs.size(); ++k)
    if (inputs[k].dtype == DType::F32) compare(in64[k], c.din[k], 1.0, "input " + std::to_string(k));
  for (auto& [k, v] : p64) compare(v, c.dparams[k], 0.0, "param " + k);

  // Overwrite mode: inputs the op claims to write get NaN-filled fresh gradients (din_acc false),
  // and must come out as the plain gradient (a NaN left anywhere fails the comparison).
  bool any_write = false;
  c.din_acc.clear();
  for (size_t k = 0; k < inputs.size(); ++k) {
    const bool w = inputs[k].dtype == DType::F32 && op.writes_grad(k);
    any_write = any_write || w;
    c.din_acc.push_back(!w);
    if (w)
      for (int64_t i = 0; i < c.din[k].numel(); ++i) c.din[k].f32()[i] = std::nanf("");
    else if (c.din[k].defined())
      for (int64_t i = 0; i < c.din[k].numel(); ++i) c.din[k].f32()[i] = 1.f;
  }
  if (!any_write) return;
  for (auto& [k, t] : c.dparams) t = Tensor::zeros(t.shape(), DType::F32);
  op.backward(c);
  for (size_t k = 0; k < inputs.size(); ++k)
    if (inputs[k].dtype == DType::F32)
      compare(in64[k], c.din[k], c.din_acc[k] ? 1.0 : 0.0, "input " + std::to_string(k) + " (overwrite mode)");
  for (auto& [k, v] : p64) compare(v, c.dparams[k], 0.0, "param " + k + " (overwrite mode)");
}

Node make_node(const std::string& op, json attrs = json::object()) {
  Node n;
  n.op = op;
  n.block = "b";
  n.attrs = std::move(attrs);
  n.out = {"y"};
  return n;
}

}  // namespace

TEST_CASE("linear gradcheck", "[ops]") {
  Rng r(1);
  const int64_t N = 6, I = 5, O = 4;
  auto ref = [&](const std::vector<Vec>& in, const std::map<std::string, Vec>& p) {
    Vec y(N * O);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o) {
        double s = p.at("bias")[o];
        for (int64_t i = 0; i < I; ++i) s += in[0][n * I + i] * p.at("weight")[o * I + i];
        y[n * O + o] = s;
      }
    return y;
  };
  check_op(make_node("linear"), {rnd({2, 3, I}, r)}, {{"weight", rnd({O, I}, r)}, {"bias", rnd({O}, r)}}, ref);
}

TEST_CASE("matmul gradcheck (batched and shared b)", "[ops]") {
  Rng r(2);
  const int64_t Bt = 2, M = 3, K = 4, N = 5;
  for (bool shared : {false, true}) {
    auto ref = [&](const std::vector<Vec>& in, const std::map<std::string, Vec>&) {
      Vec y(Bt * M * N);
      for (int64_t b = 0; b < Bt; ++b)
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            double s = 0;
            for (int64_t k = 0; k < K; ++k)
              s += in[0][(b * M + m) * K + k] * in[1][(shared ? 0 : b * K * N) + k * N + n];
            y[(b * M + m) * N + n] = s;
          }
      return y;
    };
    Shape bs = shared ? Shape{K, N} : Shape{Bt, K, N};
    check_op(make_node("matmul"), {rnd({Bt, M, K}, r), rnd(bs, r)}, {}, ref);
  }
}

TEST_CASE("add gradcheck (same shape and suffix broadcast)", "[ops]") {
  Rng r(3);
  auto ref = [](const std::vector<Vec>& in, const std::map<std::string, Vec>&) {
    Vec y(in[0].size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = in[0][i] + in[1][i % in[1].size()];
    return y;
  };
  check_op(make_node("add"), {rnd({2, 3, 4}, r), rnd({2, 3, 4}, r)}, {}, ref);
  check_op(make_node("add"), {rnd({2, 3, 4}, r), rnd({4}, r)}, {}, ref);
}

TEST_CASE("mul gradcheck", "[ops]") {
  Rng r(4);
  auto ref = [](const std::vector<Vec>& in, const std::map<std::string, Vec>&) {
    Vec y(in[0].size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = in[0][i] * in[1][i];
    return y;
  };
  check_op(make_node("mul"), {rnd({3, 5}, r), rnd({3, 5}, r)}, {}, ref);
}

TEST_CASE("swiglu gradcheck (silu(gate) * up, and the same value as gate and up)", "[ops]") {
  Rng r(14);
  auto ref = [](const std::vector<Vec>& in, const std::map<std::string, Vec>&) {
    Vec y(in[0].size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = in[0][i] / (1 + std::exp(-in[0][i])) * in[1][i];
    return y;
  };
  check_op(make_node("swiglu"), {rnd({3, 5}, r, 3.0), rnd({3, 5}, r, 2.0)}, {}, ref);
  check_op(make_node("swiglu"), {rnd({2, 9}, r, 4.0), rnd({2, 9}, r)}, {}, ref);
}

TEST_CASE("activations gradcheck", "[ops]") {
  Rng r(5);
  std::map<std::string, std::function<double(double)>> f = {
      {"gelu", [](double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / kPi) * (x + 0.044715 * x * x * x))); }},
      {"relu", [](double x) { return x > 0 ? x : 0; }},
      {"silu", [](double x) { return x / (1 + std::exp(-x)); }},
  };
  for (auto& [name, fn] : f) {
    auto ref = [&](const std::vector<Vec>& in, const std::map<std::string, Vec>&) {
      Vec y(in[0].size());
      for (size_t i = 0; i < y.size(); ++i) y[i] = fn(in[0][i]);
      return y;
    };
    Arg x = rnd({4, 6}, r, 3.0);
    for (auto& v : x.values)
      if (std::fabs(v) < 1e-3) v = 0.5;  // keep relu's kink away from the FD step
    check_op(make_node(name), {x}, {}, ref);
  }
}

TEST_CASE("layernorm and rmsnorm gradcheck", "[ops]") {
  Rng r(6);
  const int64_t N = 5, C = 7;
  auto ln = [&](const std::vector<Vec>& in, const std::map<std::string, Vec>& p) {
    Vec y(N * C);
    for (int64_t n = 0; n < N; ++n) {
      double m = 0, v = 0;
      for (int64_t c = 0; c < C; ++c) m += in[0][n * C + c];
      m /= C;
      for (int64_t c = 0; c < C; ++c) v += (in[0][n * C + c] - m) * (in[0][n * C + c] - m);
      v /= C;
      for (int64_t c = 0; c < C; ++c)
        y[n * C + c] = (in[0][n * C + c] - m) / std::sqrt(v + 1e-5) * p.at("weight")[c] + p.at("bias")[c];
    }
    return y;
  };
  check_op(make_node("layernorm", {{"eps", 1e-5}}), {rnd({N, C}, r)}, {{"weight", rnd({C}, r)}, {"bias", rnd({C}, r)}},
           ln);
  auto rms = [&](const std::vector<Vec>& in, const std::map<std::string, Vec>& p) {
    Vec y(N * C);
    for (int64_t n = 0; n < N; ++n) {
      double ss = 0;
      for (int64_t c = 0; c < C; ++c) ss += in[0][n * C + c] * in[0][n * C + c];
      for (int64_t c = 0; c < C; ++c) y[n * C + c] = in[0][n * C + c] / std::sqrt(ss / C + 1e-6) * p.at("weight")[c];
    }
    return y;
  };
  check_op(make_node("rmsnorm", {{"eps", 1e-6}}), {rnd({N, C}, r)}, {{"weight", rnd({C}, r)}}, rms);
}

TEST_CASE("causal attention gradcheck", "[ops]") {
  Rng r(7);
  const int64_t B = 2, T = 5, C = 8, H = 2, hs = C / H;
  auto ref = [&](const std::vector<Vec>& in, const std::map<std::string, Vec>&) {
    const Vec& q = in[0];
    Vec y(B * T * C, 0.0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t) {
          Vec s(t + 1);
          double mx = -1e300;
          for (int64_t u = 0; u <= t; ++u) {
            double d = 0;
            for (int64_t i = 0; i < hs; ++i)
              d += q[(b * T + t) * 3 * C + h * hs + i] * q[(b * T + u) * 3 * C + C + h * hs + i];
            s[u] = d / std::sqrt(static_cast<double>(hs));
            mx = std::max(mx, s[u]);
          }
          double z = 0;
          for (auto& v : s) z += (v = std::exp(v - mx));
          for (int64_t u = 0; u <= t; ++u)
            for (int64_t i = 0; i < hs; ++i)
              y[(b * T + t) * C + h * hs + i] += s[u] / z * q[(b * T + u) * 3 * C + 2 * C + h * hs + i];
        }
    return y;
  };
  check_op(make_node("attention", {{"n_head", H}}), {rnd({B, T, 3 * C}, r)}, {}, ref);
}

TEST_CASE("rope gradcheck (multi-head and grouped-query)", "[ops]") {
  // The reference is transformers' apply_rotary_pos_emb + repeat_kv written out in f64: q' = q cos + rotate_half(q)
  // sin with rotate_half(x) = cat(-x[D/2:], x[:D/2]), angle t / theta^(2i/D); key/value head g serves query heads
  // g * H/K .. (g + 1) * H/K - 1.
  Rng r(12);
  for (auto [H, K, theta] : {std::tuple<int64_t, int64_t, double>{2, 2, 10000.0}, {4, 2, 50.0}, {6, 1, 3.0}}) {
    const int64_t B = 2, T = 5, D = 6, half = D / 2, W = (H + 2 * K) * D, rep = H / K;
    INFO("H " << H << " K " << K);
    auto ref = [&](const std::vector<Vec>& in, const std::map<std::string, Vec>&) {
      const Vec& x = in[0];
      Vec y(B * T * 3 * H * D);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t) {
          const double* row = x.data() + (b * T + t) * W;
          double* out = y.data() + (b * T + t) * 3 * H * D;
          for (int64_t j = 0; j < 3 * H; ++j) {
            const int64_t src = j < H ? j : j < 2 * H ? H + (j - H) / rep : H + K + (j - 2 * H) / rep;
            for (int64_t i = 0; i < D; ++i) {
              const double v = row[src * D + i];
              if (j >= 2 * H) {
                out[j * D + i] = v;
                continue;
              }
              const double a = t / std::pow(theta, 2.0 * (i % half) / D);
              const double rot = i < half ? -row[src * D + i + half] : row[src * D + i - half];
              out[j * D + i] = v * std::cos(a) + rot * std::sin(a);
            }
          }
        }
      return y;
    };
    check_op(make_node("rope", {{"n_head", H}, {"n_kv_head", K}, {"theta", theta}}), {rnd({B, T, W}, r)}, {}, ref);
  }
  Node bad = make_node("rope", {{"n_head", 4}, {"n_kv_head", 3}});
  REQUIRE_THROWS_WITH(op_lookup("rope").infer(bad, {{{1, 2, 40}, DType::F32}}, {}),
                      Catch::Contains("n_kv_head 3 must be positive and divide n_head 4"));
  Node odd = make_node("rope", {{"n_head", 2}});
  REQUIRE_THROWS_WITH(op_lookup("rope").infer(odd, {{{1, 2, 18}, DType::F32}}, {}),
                      Catch::Contains("rope needs an even head size, got 3"));
}

TEST_CASE("embedding gradcheck (token and positional)", "[ops]") {
  Rng r(8);
  const int64_t V = 6, C = 3, B = 2, T = 4;
  Arg id = ids({B, T}, V, r);
  id.values[0] = id.values[1];  // repeated id: gradients must sum
  auto tok = [&](const std::vector<Vec>& in, const std::map<std::string, Vec>& p) {
    Vec y;
    for (double v : in[0])
      for (int64_t c = 0; c < C; ++c) y.push_back(p.at("weight")[static_cast<int64_t>(v) * C + c]);
    return y;
  };
  check_op(make_node("embedding"), {id}, {{"weight", rnd({V, C}, r)}}, tok);
  auto pos = [&](const std::vector<Vec>&, const std::map<std::string, Vec>& p) {
    Vec y;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < C; ++c) y.push_back(p.at("weight")[t * C + c]);
    return y;
  };
  check_op(make_node("embedding", {{"position", true}}), {id}, {{"weight", rnd({T + 2, C}, r)}}, pos);
}

TEST_CASE("cross_entropy and mse gradcheck", "[ops]") {
  Rng r(9);
  const int64_t N = 6, V = 5;
  auto ce = [&](const std::vector<Vec>& in, const std::map<std::string, Vec>&) {
    double tot = 0;
    for (int64_t n = 0; n < N; ++n) {
      double mx = -1e300, z = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, in[0][n * V + v]);
      for (int64_t v = 0; v < V; ++v) z += std::exp(in[0][n * V + v] - mx);
      tot += std::log(z) + mx - in[0][n * V + static_cast<int64_t>(in[1][n])];
    }
    return Vec{tot / N};
  };
  check_op(make_node("cross_entropy"), {rnd({2, 3, V}, r, 3.0), ids({2, 3}, V, r)}, {}, ce);
  auto mse = [&](const std::vector<Vec>& in, const std::map<std::string, Vec>&) {
    double s = 0;
    for (size_t i = 0; i < in[0].size(); ++i) s += (in[0][i] - in[1][i]) * (in[0][i] - in[1][i]);
    return Vec{s / in[0].size()};
  };
  // The target input gets no gradient (it is data); check only the prediction.
  Node n = make_node("mse");
  Rng r2(10);
  Arg pred = rnd({4, 3}, r2), tgt = rnd({4, 3}, r2);
  const Op& op = op_lookup("mse");
  NodeCtx c;
  std::vector<Tensor> saved;
  c.node = &n;
  c.saved = &saved;
  c.in = {to_tensor(pred), to_tensor(tgt)};
  op.forward(c);
  REQUIRE(c.out[0].f32()[0] == Approx(mse({pred.values, tgt.values}, {})[0]).epsilon(1e-6));
  Tensor d = Tensor::empty({}, DType::F32);
  d.f32()[0] = 1.f;
  c.dout = {d};
  c.din = {Tensor::zeros({4, 3}, DType::F32), Tensor()};
  op.backward(c);
  for (int i = 0; i < 12; ++i)
    REQUIRE(c.din[0].f32()[i] == Approx(2 * (pred.values[i] - tgt.values[i]) / 12).margin(1e-6));
}

TEST_CASE("ops reject bad shapes and ids with clear errors", "[ops]") {
  Node lin = make_node("linear");
  REQUIRE_THROWS_WITH(op_lookup("linear").infer(lin, {{{2, 3}, DType::F32}}, {{"weight", {4, 5}}}),
                      Catch::Contains("does not match weight"));
  Node att = make_node("attention", {{"n_head", 3}});
  REQUIRE_THROWS_WITH(op_lookup("attention").infer(att, {{{1, 2, 12}, DType::F32}}, {}),
                      Catch::Contains("n_head 3 does not divide C = 4"));
  REQUIRE_THROWS_WITH(op_lookup("nope"), Catch::Contains("unknown op 'nope'"));
  Node emb = make_node("embedding");
  NodeCtx c;
  std::vector<Tensor> saved;
  c.node = &emb;
  c.saved = &saved;
  Tensor id = Tensor::empty({1, 2}, DType::I32);
  id.i32()[0] = 1;
  id.i32()[1] = 9;
  c.in = {id};
  c.params["weight"] = Tensor::zeros({4, 2}, DType::F32);
  REQUIRE_THROWS_WITH(op_lookup("embedding").forward(c), Catch::Contains("token id 9 at position 1"));
}

// ---- the features of today's decoders (Qwen3, OLMo-2, Gemma, Llama 3 rope scaling) ----

TEST_CASE("qk_norm gradcheck (per head, full width, Gemma's 1 + w)", "[ops]") {
  Rng r(21);
  const int64_t B = 2, T = 3, H = 4, K = 2, D = 4, W = (H + 2 * K) * D;
  for (bool full : {false, true})
    for (double offset : {0.0, 1.0}) {
      INFO("full " << full << " offset " << offset);
      auto ref = [&](const std::vector<Vec>& in, const std::map<std::string, Vec>& p) {
        Vec y = in[0];
        for (int64_t row = 0; row < B * T; ++row) {
          const int64_t groups = full ? 2 : H + K;
          for (int64_t g = 0; g < groups; ++g) {
            const int64_t off = full ? (g == 0 ? 0 : H * D) : g * D, size = full ? (g == 0 ? H : K) * D : D;
            const Vec& w = p.at(g < (full ? 1 : H) ? "q_weight" : "k_weight");
            double ss = 0;
            for (int64_t c = 0; c < size; ++c) ss += in[0][row * W + off + c] * in[0][row * W + off + c];
            for (int64_t c = 0; c < size; ++c)
              y[row * W + off + c] = in[0][row * W + off + c] / std::sqrt(ss / size + 1e-6) * (w[c] + offset);
          }
        }
        return y;
      };
      const int64_t wq = full ? H * D : D, wk = full ? K * D : D;
      check_op(
          make_node("qk_norm", {{"n_head", H}, {"n_kv_head", K}, {"eps", 1e-6}, {"full", full}, {"offset", offset}}),
          {rnd({B, T, W}, r)}, {{"q_weight", rnd({wq}, r)}, {"k_weight", rnd({wk}, r)}}, ref);
    }
  Node bad = make_node("qk_norm", {{"n_head", 4}, {"n_kv_head", 2}});
  REQUIRE_THROWS_WITH(
      op_lookup("qk_norm").infer(bad, {{{1, 2, 32}, DType::F32}}, {{"q_weight", {8}}, {"k_weight", {4}}}),
      Catch::Contains("q_weight must be [4], got [8]"));
}

TEST_CASE("rmsnorm with Gemma's offset, geglu, scale and softcap gradcheck", "[ops]") {
  Rng r(22);
  const int64_t N = 4, C = 6;
  auto rms = [&](const std::vector<Vec>& in, const std::map<std::string, Vec>& p) {
    Vec y(N * C);
    for (int64_t n = 0; n < N; ++n) {
      double ss = 0;
      for (int64_t c = 0; c < C; ++c) ss += in[0][n * C + c] * in[0][n * C + c];
      for (int64_t c = 0; c < C; ++c)
        y[n * C + c] = in[0][n * C + c] / std::sqrt(ss / C + 1e-6) * (1.0 + p.at("weight")[c]);
    }
    return y;
  };
  check_op(make_node("rmsnorm", {{"eps", 1e-6}, {"offset", 1.0}}), {rnd({N, C}, r)}, {{"weight", rnd({C}, r)}}, rms);
  auto geglu = [](const std::vector<Vec>& in, const std::map<std::string, Vec>&) {
    Vec y(in[0].size());
    for (size_t i = 0; i < y.size(); ++i) {
      const double g = in[0][i];
      y[i] = 0.5 * g * (1 + std::tanh(std::sqrt(2 / kPi) * (g + 0.044715 * g * g * g))) * in[1][i];
    }
    return y;
  };
  check_op(make_node("geglu"), {rnd({3, 5}, r, 3.0), rnd({3, 5}, r, 2.0)}, {}, geglu);
  auto scale = [](const std::vector<Vec>& in, const std::map<std::string, Vec>&) {
    Vec y = in[0];
    for (double& v : y) v *= 6.928203230275509;
    return y;
  };
  check_op(make_node("scale", {{"factor", 6.928203230275509}}), {rnd({2, 7}, r)}, {}, scale);
  auto cap = [](const std::vector<Vec>& in, const std::map<std::string, Vec>&) {
    Vec y = in[0];
    for (double& v : y) v = 3.0 * std::tanh(v / 3.0);
    return y;
  };
  check_op(make_node("softcap", {{"cap", 3.0}}), {rnd({2, 9}, r, 8.0)}, {}, cap);
  REQUIRE_THROWS_WITH(op_lookup("softcap").infer(make_node("softcap", {{"cap", -1.0}}), {{{2}, DType::F32}}, {}),
                      Catch::Contains("attribute 'cap' must be positive"));
  REQUIRE_THROWS_WITH(op_lookup("scale").infer(make_node("scale"), {{{2}, DType::F32}}, {}),
                      Catch::Contains("attribute 'factor' is required"));
}

TEST_CASE("rope gradcheck with transformers' rope types (linear, dynamic, llama3, yarn) and grouped heads in place",
          "[ops]") {
  // The reference inv_freq of each type, from modeling_rope_utils' formulas in double; the angle t * inv_freq,
  // cos and sin times the attention factor.
  Rng r(23);
  const int64_t B = 2, T = 6, H = 4, K = 2, D = 8, half = D / 2, W = (H + 2 * K) * D;
  const double theta = 500.0, pi = 3.14159265358979323846;
  struct Case {
    json scaling;
    std::function<Vec()> inv;
    double factor;
  };
  auto base = [&] {
    Vec v(half);
    for (int64_t i = 0; i < half; ++i) v[i] = 1.0 / std::pow(theta, 2.0 * i / D);
    return v;
  };
  std::vector<Case> cases = {
      {{{"rope_type", "linear"}, {"factor", 4.0}},
       [&] {
         Vec v = base();
         for (double& x : v) x /= 4.0;
         return v;
       },
       1.0},
      {{{"rope_type", "dynamic"}, {"factor", 2.0}},  // T = 6 > max_position_embeddings 4: the base grows
       [&] {
         const double b = theta * std::pow(2.0 * T / 4 - 1.0, static_cast<double>(D) / (D - 2));
         Vec v(half);
         for (int64_t i = 0; i < half; ++i) v[i] = 1.0 / std::pow(b, 2.0 * i / D);
         return v;
       },
       1.0},
      {{{"rope_type", "llama3"},
        {"factor", 8.0},
        {"low_freq_factor", 1.0},
        {"high_freq_factor", 4.0},
        {"original_max_position_embeddings", 40}},
       [&] {
         Vec v = base();
         for (double& x : v) {
           const double wl = 2 * pi / x;
           if (wl > 40.0)
             x /= 8.0;
           else if (wl >= 10.0) {
             const double s = (40.0 / wl - 1.0) / 3.0;
             x = (1 - s) * x / 8.0 + s * x;
           }
         }
         return v;
       },
       1.0},
      {{{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64}},
       [&] {
         auto dim = [&](double rot) { return D * std::log(64 / (rot * 2 * pi)) / (2 * std::log(theta)); };
         double lo = std::max(std::floor(dim(32)), 0.0), hi = std::min(std::ceil(dim(1)), D - 1.0);
         if (lo == hi) hi += 0.001;
         Vec v = base();
         for (int64_t i = 0; i < half; ++i) {
           const double ramp = std::clamp((i - lo) / (hi - lo), 0.0, 1.0), ef = 1 - ramp;
           v[i] = v[i] / 4.0 * (1 - ef) + v[i] * ef;
         }
         return v;
       },
       0.1 * std::log(4.0) + 1.0}};
  for (const Case& cs : cases) {
    INFO("scaling " << cs.scaling.dump());
    const Vec inv = cs.inv();
    auto ref = [&](const std::vector<Vec>& in, const std::map<std::string, Vec>&) {
      Vec y(in[0].size());
      for (int64_t row = 0; row < B * T; ++row) {
        const int64_t t = row % T;
        for (int64_t j = 0; j < H + 2 * K; ++j)
          for (int64_t i = 0; i < D; ++i) {
            const double v = in[0][row * W + j * D + i];
            if (j >= H + K) {
              y[row * W + j * D + i] = v;
              continue;
            }
            const double a = t * inv[i % half];
            const double rot = i < half ? -in[0][row * W + j * D + i + half] : in[0][row * W + j * D + i - half];
            y[row * W + j * D + i] = (v * std::cos(a) + rot * std::sin(a)) * cs.factor;
          }
      }
      return y;
    };
    check_op(make_node("rope", {{"n_head", H},
                                {"n_kv_head", K},
                                {"theta", theta},
                                {"scaling", cs.scaling},
                                {"max_position_embeddings", 4},
                                {"repeat_kv", false}}),
             {rnd({B, T, W}, r)}, {}, ref);
  }
  REQUIRE_THROWS_WITH(
      op_lookup("rope").infer(make_node("rope", {{"n_head", 2}, {"scaling", {{"rope_type", "longrope"}}}}),
                              {{{1, 2, 24}, DType::F32}}, {}),
      Catch::Contains("rope_type \"longrope\" is not supported"));
  REQUIRE_THROWS_WITH(
      op_lookup("rope").infer(make_node("rope", {{"n_head", 2}, {"scaling", {{"rope_type", "llama3"}}}}),
                              {{{1, 2, 24}, DType::F32}}, {}),
      Catch::Contains("'factor' is required for rope_type \"llama3\""));
}
