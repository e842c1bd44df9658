// rope: rotary position embeddings (transformers' Llama convention) on packed
// qkv [B, T, (H + 2K) D], with transformers' rope types (default, linear,
// dynamic, llama3, yarn) as the frequency table the kernels read. Output
// [B, T, 3 H D] with the K key/value heads of grouped-query attention repeated
// H / K times (repeat_kv, the default of older graphs), or the input's layout
// for attention that reads grouped heads in place. Saves nothing; 16-bit
// storage on either side where the backend has it. An optional second input,
// positions [B, T] i32 (the graph's optional "positions" input), gives each
// token's position (restarting at 0 in each packed document); left out
// (undefined), token t of a row is at position t.
#include <algorithm>

#include "op_util.h"

namespace zerorun::ops {
namespace {
struct RopeDims {
  int64_t H, K, D;
  bool repeat;
};
RopeDims dims_of(const Node& n, int64_t width) {
  const QkvHeads h = qkv_heads(n, width);
  ZR_CHECK(h.D % 2 == 0, "rope needs an even head size, got ", h.D);
  ZR_CHECK(h.D / 2 <= kernels::RopeFreqs::kMaxPairs, "rope: head size ", h.D, " is above the largest supported, ",
           2 * kernels::RopeFreqs::kMaxPairs);
  return {h.H, h.K, h.D, attr_bool(n, "repeat_kv", true)};
}

// A number of the scaling object; `def` where absent (NaN: required, unless `optional`).
double num(const json& o, const char* key, double def, bool optional = false) {
  if (!o.contains(key) || o[key].is_null()) {
    ZR_CHECK(optional || def == def, "attribute 'scaling': '", key, "' is required for rope_type ",
             o.value("rope_type", json()).dump());
    return def;
  }
  ZR_CHECK(o[key].is_number() && std::isfinite(o[key].get<double>()), "attribute 'scaling': '", key,
           "' must be a number, got ", o[key].dump());
  return o[key].get<double>();
}
}  // namespace

// The frequency table of a rope node at sequence length T: transformers' inv_freq for the node's rope type
// (modeling_rope_utils: _compute_{default,linear_scaling,dynamic_ntk,llama3,yarn}_parameters), computed in double
// and rounded to f32, and the attention factor cos/sin are scaled by.
kernels::RopeFreqs rope_freqs(const Node& n, int64_t D, int64_t T) {
  const double theta = attr_float(n, "theta", 10000.f);
  ZR_CHECK(theta > 1.0, "attribute 'theta' must be > 1, got ", theta);
  const json sc = n.attrs.value("scaling", json());
  ZR_CHECK(sc.is_null() || sc.is_object(), "attribute 'scaling' must be an object");
  const std::string type = sc.is_object() ? sc.value("rope_type", std::string("default")) : "default";
  const double nan = std::nan("");
  const int64_t half = D / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  auto base_inv = [&](double base) {
    for (int64_t i = 0; i < half; ++i)
      inv[static_cast<size_t>(i)] = 1.0 / std::pow(base, static_cast<double>(2 * i) / static_cast<double>(D));
  };
  double scale = 1.0;
  if (type == "default") {
    base_inv(theta);
  } else if (type == "linear") {
    const double factor = num(sc, "factor", nan);
    ZR_CHECK(factor > 0, "attribute 'scaling': factor must be > 0, got ", factor);
    base_inv(theta);
    for (double& v : inv) v /= factor;
  } else if (type == "dynamic") {
    // NTK-aware: the base grows once the sequence is longer than the trained length.
    const double factor = num(sc, "factor", nan);
    const double max_pos = static_cast<double>(n.attrs.value("max_position_embeddings", int64_t{0}));
    ZR_CHECK(factor > 0 && max_pos > 0,
             "attribute 'scaling': dynamic rope needs factor > 0 and the node's "
             "max_position_embeddings");
    double base = theta;
    if (static_cast<double>(T) > max_pos)
      base = theta * std::pow(factor * static_cast<double>(T) / max_pos - (factor - 1.0),
                              static_cast<double>(D) / static_cast<double>(D - 2));
    base_inv(base);
  } else if (type == "llama3") {
    const double factor = num(sc, "factor", nan), lo = num(sc, "low_freq_factor", nan),
                 hi = num(sc, "high_freq_factor", nan), old = num(sc, "original_max_position_embeddings", nan);
    ZR_CHECK(factor > 0 && hi > lo && old > 0,
             "attribute 'scaling': llama3 needs factor > 0, high_freq_factor > "
             "low_freq_factor and original_max_position_embeddings > 0");
    base_inv(theta);
    const double lo_wl = old / lo, hi_wl = old / hi, pi = 3.14159265358979323846;
    for (double& v : inv) {
      const double wl = 2 * pi / v;
      if (wl > lo_wl) {
        v /= factor;
      } else if (!(wl < hi_wl)) {  // between the two: interpolate
        const double s = (old / wl - lo) / (hi - lo);
        v = (1 - s) * v / factor + s * v;
      }
    }
  } else if (type == "yarn") {
    const double factor = num(sc, "factor", nan);
    ZR_CHECK(factor > 0, "attribute 'scaling': factor must be > 0, got ", factor);
    const double max_pos = num(sc, "original_max_position_embeddings",
                               static_cast<double>(n.attrs.value("max_position_embeddings", int64_t{0})));
    ZR_CHECK(max_pos > 0,
             "attribute 'scaling': yarn needs original_max_position_embeddings or the node's "
             "max_position_embeddings");
    auto mscale = [](double s, double m) { return s <= 1 ? 1.0 : 0.1 * m * std::log(s) + 1.0; };
    const double af = num(sc, "attention_factor", nan, true), ms = num(sc, "mscale", 0),
                 msa = num(sc, "mscale_all_dim", 0);
    scale = af == af ? af : (ms != 0 && msa != 0 ? mscale(factor, ms) / mscale(factor, msa) : mscale(factor, 1));
    const double fast = num(sc, "beta_fast", 32), slow = num(sc, "beta_slow", 1);
    const bool truncate = sc.value("truncate", true);
    const double pi = 3.14159265358979323846;
    auto dim_of = [&](double rot) {
      return static_cast<double>(D) * std::log(max_pos / (rot * 2 * pi)) / (2 * std::log(theta));
    };
    double low = dim_of(fast), high = dim_of(slow);
    if (truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(D - 1));
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < half; ++i) {
      // f32 as transformers computes the ramp and the blend: pos_freqs = theta^(2i/D) in f32.
      const float pos = static_cast<float>(std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(D)));
      const float extra = 1.f / pos, inter = 1.f / (static_cast<float>(factor) * pos);
      const float ramp = std::clamp(
          (static_cast<float>(i) - static_cast<float>(low)) / (static_cast<float>(high) - static_cast<float>(low)), 0.f,
          1.f);
      const float ef = 1.f - ramp;
      inv[static_cast<size_t>(i)] = inter * (1.f - ef) + extra * ef;
    }
  } else {
    ZR_FAIL("attribute 'scaling': rope_type ", json(type).dump(),
            " is not supported (default, linear, dynamic, llama3 and yarn are)");
  }
  kernels::RopeFreqs f;
  for (int64_t i = 0; i < half; ++i) f.inv[i] = static_cast<float>(inv[static_cast<size_t>(i)]);
  f.scale = static_cast<float>(scale);
  return f;
}

namespace {
// 16-bit storage on either side (bf16/fp16 runs on CUDA): rope saves nothing, so its input and output can both
// stay in the matmul dtype between the qkv projection and attention.
// The positions input where given (each in [0, T): training's documents start inside the row), else null.
const int32_t* positions(const NodeCtx& c) { return c.in.size() > 1 && c.in[1].defined() ? c.in[1].i32() : nullptr; }

class Rope : public Op16 {
 public:
  std::vector<ValueInfo> infer(const Node& n, const std::vector<ValueInfo>& in,
                               const std::map<std::string, Shape>&) const override {
    ZR_CHECK(in.size() == 1 || in.size() == 2, "expects qkv and optionally positions, got ", in.size(), " inputs");
    expect_f32(in[0], "qkv");
    const Shape& s = in[0].shape;
    ZR_CHECK(s.size() == 3, "qkv must be [B, T, (n_head + 2 n_kv_head) x head size], got ", shape_str(s));
    if (in.size() == 2) check_positions(in[1], s[0], s[1]);
    RopeDims d = dims_of(n, s[2]);
    rope_freqs(n, d.D, 1);  // the attributes, checked once at load
    return {{{s[0], s[1], d.repeat ? 3 * d.H * d.D : s[2]}, DType::F32}};
  }
  void forward(NodeCtx& c) const override {
    const Tensor& qkv = c.in[0];
    RopeDims d = dims_of(*c.node, qkv.dim(2));
    const Shape os{qkv.dim(0), qkv.dim(1), d.repeat ? 3 * d.H * d.D : qkv.dim(2)};
    Tensor y = want16(c, 0) ? new_out16(c, os) : new_out(os, device_of(c));
    be(c).rope_fwd(src_of(qkv), dst_of(y), qkv.dim(0), qkv.dim(1), d.H, d.K, d.D, rope_freqs(*c.node, d.D, qkv.dim(1)),
                   d.repeat, positions(c), qkv.dim(1));
    c.out = {y};
  }
  bool writes_grad(size_t) const override { return true; }
  void backward(NodeCtx& c) const override {
    if (!c.din[0].defined()) return;
    const Tensor& qkv = c.in[0];
    RopeDims d = dims_of(*c.node, qkv.dim(2));
    be(c).rope_bwd(src_of(c.dout[0]), grad_of(c, 0), qkv.dim(0), qkv.dim(1), d.H, d.K, d.D,
                   rope_freqs(*c.node, d.D, qkv.dim(1)), d.repeat, positions(c), qkv.dim(1));
  }
};
}  // namespace
std::unique_ptr<Op> make_rope() { return std::make_unique<Rope>(); }
}  // namespace zerorun::ops
