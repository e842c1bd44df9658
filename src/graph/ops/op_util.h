// Small helpers shared by the op files (shape checks, attribute reading).
#pragma once
#include <cfloat>
#include <cmath>
#include <memory>

#include "kernels/backend.h"
#include "zerorun/graph.h"

namespace zerorun::ops {

inline int64_t rows_of(const Shape& s) {
  int64_t r = 1;
  for (size_t i = 0; i + 1 < s.size(); ++i) r *= s[i];
  return r;
}
inline void expect_inputs(const std::vector<ValueInfo>& in, size_t n) {
  ZR_CHECK(in.size() == n, "expects ", n, " input(s), got ", in.size());
}
inline void expect_f32(const ValueInfo& v, const char* what) {
  ZR_CHECK(v.dtype == DType::F32, what, " must be f32, got ", dtype_name(v.dtype));
}
inline float attr_float(const Node& n, const char* key, float def) {
  if (!n.attrs.contains(key)) return def;
  ZR_CHECK(n.attrs[key].is_number(), "attribute '", key, "' must be a number");
  const double v = n.attrs[key].get<double>();
  ZR_CHECK(std::isfinite(v) && std::fabs(v) <= FLT_MAX, "attribute '", key, "' is out of float range: ", v);
  return static_cast<float>(v);
}
inline bool attr_bool(const Node& n, const char* key, bool def) {
  if (!n.attrs.contains(key)) return def;
  ZR_CHECK(n.attrs[key].is_boolean(), "attribute '", key, "' must be true or false");
  return n.attrs[key].get<bool>();
}
inline int64_t attr_int(const Node& n, const char* key) {
  ZR_CHECK(n.attrs.contains(key) && n.attrs[key].is_number_integer(), "attribute '", key, "' must be an integer");
  return n.attrs[key].get<int64_t>();
}
// Op outputs are written in full by their kernels: no zero-fill.
inline Tensor new_out(const Shape& s, Device d) { return Tensor::uninit(s, DType::F32, MemCategory::Activations, d); }
// The device an op runs on: that of its first input; every input and param must be there too.
inline Device device_of(const NodeCtx& c) {
  Device d = c.in.at(0).device();
  for (auto& t : c.in)
    ZR_CHECK(!t.defined() || t.device() == d, "op '", c.node->op, "' has inputs on different devices");
  for (auto& [r, t] : c.params)
    ZR_CHECK(t.device() == d, "op '", c.node->op, "': param '", r, "' is on another device than the input");
  return d;
}
inline kernels::Backend& be(const NodeCtx& c) { return kernels::backend(device_of(c)); }
// Whether the executor asked for output k in 16 bits (and the backend can).
inline bool want16(const NodeCtx& c, size_t k) { return k < c.out16.size() && c.out16[k] && be(c).activations16(); }
inline Tensor new_out16(const NodeCtx& c, const Shape& s) {
  return Tensor::uninit(s, be(c).matmul_dtype(), MemCategory::Activations, device_of(c));
}
inline const uint16_t* bits16(const Tensor& t) { return static_cast<const uint16_t*>(t.raw()); }
inline bool is16(const Tensor& t) { return t.dtype() != DType::F32; }
// A tensor as kernels see it: f32, or 16-bit storage in the matmul dtype.
inline kernels::Src src_of(const Tensor& t) {
  if (is16(t)) return {nullptr, bits16(t)};
  return {t.f32(), nullptr};
}
// t itself when f32, else an f32 copy (for kernels without a 16-bit path).
inline Tensor widened(const NodeCtx& c, const Tensor& t) {
  if (!is16(t)) return t;
  Tensor f = Tensor::uninit(t.shape(), DType::F32, MemCategory::Activations, t.device());
  be(c).widen16(bits16(t), f.f32(), t.numel());
  return f;
}
inline kernels::Dst dst_of(Tensor& t) {
  if (is16(t)) return {nullptr, static_cast<uint16_t*>(t.raw())};
  return {t.f32(), nullptr};
}
// Input k's gradient for a backend call: null when not wanted; overwrite or accumulate per din_acc.
inline kernels::Grad grad_of(const NodeCtx& c, size_t k) {
  if (k >= c.din.size() || !c.din[k].defined()) return {};
  if (c.din[k].dtype() != DType::F32) return kernels::Grad::half(static_cast<uint16_t*>(c.din[k].raw()));
  return {c.din[k].f32(), k >= c.din_acc.size() || c.din_acc[k]};
}
// An op whose every input, output and gradient may be stored in 16 bits (bf16/fp16 runs on CUDA): it reads and
// writes them through src_of / dst_of / grad_of.
class Op16 : public Op {
 public:
  bool emits16(size_t) const override { return true; }
  bool takes16(size_t) const override { return true; }
  bool writes_grad16(const NodeCtx& c, size_t) const override { return be(c).activations16(); }
  bool takes_dout16(size_t) const override { return true; }
};

// The heads of packed qkv [.., (H + 2K) D] of a node with n_head H and n_kv_head K (default H): H, K, D.
struct QkvHeads {
  int64_t H, K, D;
};
inline QkvHeads qkv_heads(const Node& n, int64_t width) {
  const int64_t H = attr_int(n, "n_head");
  const int64_t K = n.attrs.contains("n_kv_head") ? attr_int(n, "n_kv_head") : H;
  ZR_CHECK(H > 0 && K > 0 && H % K == 0, "n_kv_head ", K, " must be positive and divide n_head ", H);
  ZR_CHECK(width > 0 && width % (H + 2 * K) == 0, "qkv width ", width,
           " is not (n_head + 2 n_kv_head) x head size, n_head ", H, ", n_kv_head ", K);
  return {H, K, width / (H + 2 * K)};
}

// A norm's weight as its kernels read it: w itself, or w + offset (Gemma's RMSNorm scales by 1 + w) in scratch.
inline Tensor offset_weight(const NodeCtx& c, const Tensor& w, float offset) {
  if (offset == 0.f) return w;
  Tensor s = Tensor::uninit(w.shape(), DType::F32, MemCategory::Activations, w.device());
  be(c).unary_fwd(kernels::Unary::Shift, offset, w.f32(), s.f32(), w.numel());
  return s;
}

// Every id in [0, V): on the CPU naming the first bad id and its position, on a
// GPU by a device-side check that raises at the next read of a device value (the loss), so the forward is not held
// up. `what` is "token" or "target"; `input` the node input holding the ids.
inline void check_ids(const NodeCtx& c, const int32_t* id, int64_t N, int64_t V, const char* what, size_t input,
                      int32_t ignore = INT32_MIN) {
  if (device_of(c).is_cpu()) {
    for (int64_t i = 0; i < N; ++i)
      ZR_CHECK((id[i] >= 0 && id[i] < V) || id[i] == ignore, what, " id ", id[i], " at position ", i,
               " is outside the vocabulary of ", V);
  } else {
    const std::string in = input < c.node->in.size() ? c.node->in[input] : "#" + std::to_string(input);
    be(c).check_ids_deferred(id, N, V,
                             "a " + std::string(what) + " id is outside the vocabulary of " + std::to_string(V) +
                                 " (op '" + c.node->op + "', input '" + in + "')",
                             ignore);
  }
}

// The optional positions input of attention, rope and the positional embedding: i32 [B, T] (graph.h InputSpec).
inline void check_positions(const ValueInfo& v, int64_t B, int64_t T) {
  ZR_CHECK(v.dtype == DType::I32 && v.shape == Shape({B, T}), "positions must be i32 [", B, ", ", T, "], got ",
           dtype_name(v.dtype), " ", shape_str(v.shape));
}
// Host positions: each token's position in its document, in [0, t] at index t of its row (the document starts at
// t - pos, inside the row).
inline void check_position_values(const int32_t* pos, int64_t B, int64_t T) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      ZR_CHECK(pos[b * T + t] >= 0 && pos[b * T + t] <= t, "positions[", b, ", ", t, "] = ", pos[b * T + t],
               " is outside [0, ", t, "] (a token's position in its document, which starts inside the row)");
}

// A node's dropout probability (attribute "dropout", default 0) and its "site", checked.
inline float dropout_p(const Node& n) {
  const float p = attr_float(n, "dropout", 0.f);
  ZR_CHECK(p >= 0.f && p < 1.f, "attribute 'dropout' must be in [0, 1), got ", p);
  if (p > 0.f) ZR_CHECK(attr_int(n, "site") >= 0, "attribute 'site' must be 0 or more");
  return p;
}
// The mask of one dropout of this node in this forward/backward (kernels/counter_rng.h): element i of a tensor
// whose first dimension is the micro-batch's samples, `per_sample` elements each, counts from the global index of
// the micro-batch's first sample. Null where nothing is dropped (p 0 or dropout off: eval).
inline bool dropout_mask(const NodeCtx& c, float p, int64_t per_sample, kernels::rng::Dropout* d) {
  if (p <= 0.f || !c.dropout || !c.dropout->on) return false;
  const DropoutCtx& x = *c.dropout;
  d->key = kernels::rng::dropout_key(x.seed, x.step, static_cast<uint64_t>(attr_int(*c.node, "site")));
  d->threshold = kernels::rng::dropout_threshold(p);
  d->scale = 1.f / (1.f - p);
  d->counter0 = static_cast<uint64_t>(x.sample0) * static_cast<uint64_t>(per_sample);
  return true;
}

// The op factories, one per line of op_list.h, each defined in its op's file.
#define ZR_OP(name) std::unique_ptr<Op> make_##name();
#include "op_list.h"
#undef ZR_OP

}  // namespace zerorun::ops
