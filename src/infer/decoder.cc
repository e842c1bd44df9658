// Incremental decoding of a zerorun decoder graph (include/zerorun/sample.h): the graph runs node by node on chunks
// of new tokens. Three ops depend on where the tokens are in the sequence and are run here: rope (at positions
// length() .. length() + n - 1), the learned position table (rows at those positions) and attention (through
// Backend::attention_cached over this node's key/value cache). Every other op runs its own forward unchanged, so
// any op a graph uses decodes as it trains. The loss node is left out: its input is the logits.
#include <algorithm>
#include <cmath>

#include "kernels/backend.h"
#include "src/graph/ops/op_util.h"
#include "zerorun/error.h"
#include "zerorun/sample.h"

namespace zerorun {

namespace ops {
kernels::RopeFreqs rope_freqs(const Node& n, int64_t D, int64_t T);  // rope.cc
}

struct Decoder::Impl {
  const Graph* g = nullptr;
  Device dev;
  std::map<std::string, Tensor> params;
  std::map<size_t, std::pair<Tensor, Tensor>> cache;  // per attention node: keys, values [K, cap, D]
  std::string logits;                                 // the loss node's input
  size_t loss_node = 0;
};

namespace {
kernels::AttnDims attn_dims(const Node& n, int64_t T, int64_t width) {
  kernels::AttnDims d;
  d.B = 1;
  d.T = T;
  const ops::QkvHeads h = ops::qkv_heads(n, width);
  d.H = h.H;
  d.K = h.K;
  d.D = h.D;
  d.scale = ops::attr_float(n, "scale", 1.f / std::sqrt(static_cast<float>(d.D)));
  d.window = n.attrs.contains("window") ? ops::attr_int(n, "window") : 0;
  d.softcap = ops::attr_float(n, "softcap", 0.f);
  return d;
}
}  // namespace

Decoder::Decoder(const Model& m, Device dev, int64_t capacity) : impl_(std::make_unique<Impl>()), cap_(capacity) {
  Impl& s = *impl_;
  s.g = &m.graph;
  s.dev = dev;
  const Graph& g = m.graph;
  bool tokens = false;
  for (const InputSpec& in : g.inputs) tokens = tokens || (in.name == "tokens" && in.dtype == DType::I32);
  ZR_CHECK(tokens, "sample: the model has no 'tokens' input (sampling needs a token model: gpt2, llama, ...)");
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (!n.out.empty() && n.out[0] == g.loss) {
      ZR_CHECK(n.op == "cross_entropy", "sample: the model's loss is '", n.op, "', not cross_entropy over logits");
      s.logits = n.in.at(0);
      s.loss_node = i;
    }
    if (n.op == "embedding" && n.in.at(0) == "tokens") {
      const Shape& w = m.tensors.at(n.params.at("weight")).shape();
      if (ops::attr_bool(n, "position", false))
        max_pos_ = w[0];
      else
        vocab_ = w[0];
    }
  }
  ZR_CHECK(!s.logits.empty() && vocab_ > 0, "sample: cannot find the model's token embedding and logits");
  if (max_pos_ == 0 && m.symbols.count("T")) max_pos_ = m.symbols.at("T");
  ZR_CHECK(capacity > 0, "sample: a cache of ", capacity, " tokens");
  for (auto& [name, t] : m.tensors) s.params[name] = dev.is_cpu() ? t : t.to(dev);
}

Decoder::~Decoder() = default;

void Decoder::reset() {
  len_ = 0;  // the caches are overwritten from row 0
}

std::vector<float> Decoder::feed(const std::vector<int32_t>& ids, bool all) {
  Impl& s = *impl_;
  const Graph& g = *s.g;
  const int64_t n = static_cast<int64_t>(ids.size());
  ZR_CHECK(n > 0, "sample: no tokens to feed");
  ZR_CHECK(len_ + n <= cap_, "sample: ", len_ + n, " tokens do not fit the cache of ", cap_);
  for (int64_t i = 0; i < n; ++i)
    ZR_CHECK(ids[static_cast<size_t>(i)] >= 0 && ids[static_cast<size_t>(i)] < vocab_, "sample: token id ",
             ids[static_cast<size_t>(i)], " is outside the model's vocabulary of ", vocab_);
  kernels::Backend& be = kernels::backend(s.dev);
  Tensor tok = Tensor::empty({1, n}, DType::I32), pos = Tensor::empty({1, n}, DType::I32);
  for (int64_t i = 0; i < n; ++i) {
    tok.i32()[i] = ids[static_cast<size_t>(i)];
    pos.i32()[i] = static_cast<int32_t>(len_ + i);
  }
  if (!s.dev.is_cpu()) tok = tok.to(s.dev), pos = pos.to(s.dev);
  std::map<std::string, Tensor> vals{{"tokens", tok}, {"positions", pos}};
  auto out_f32 = [&](const Shape& sh) { return Tensor::uninit(sh, DType::F32, MemCategory::Activations, s.dev); };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (i == s.loss_node) continue;
    const Node& node = g.nodes[i];
    std::vector<Tensor> in;
    bool needed = true;
    for (const std::string& v : node.in) {
      auto it = vals.find(v);
      if (it == vals.end()) needed = false;  // reads the targets (another loss): not on the way to the logits
      in.push_back(it == vals.end() ? Tensor() : it->second);
    }
    if (!needed) continue;
    auto run = [&] {
      if (node.op == "attention") {
        const Tensor& qkv = in.at(0);
        const kernels::AttnDims d = attn_dims(node, n, qkv.dim(2));
        auto& c = s.cache[i];
        if (!c.first.defined()) {
          c.first = Tensor::zeros({d.K, cap_, d.D}, DType::F32, MemCategory::Activations, s.dev);
          c.second = Tensor::zeros({d.K, cap_, d.D}, DType::F32, MemCategory::Activations, s.dev);
        }
        Tensor y = out_f32({1, n, d.out_width()});
        be.attention_cached(qkv.f32(), c.first.f32(), c.second.f32(), y.f32(), d, len_, cap_);
        vals[node.out.at(0)] = y;
      } else if (node.op == "rope") {
        const Tensor& qkv = in.at(0);
        const ops::QkvHeads h = ops::qkv_heads(node, qkv.dim(2));
        const bool repeat = ops::attr_bool(node, "repeat_kv", true);
        Tensor y = out_f32({1, n, repeat ? 3 * h.H * h.D : qkv.dim(2)});
        be.rope_fwd({qkv.f32(), nullptr}, {y.f32(), nullptr}, 1, n, h.H, h.K, h.D, ops::rope_freqs(node, h.D, len_ + n),
                    repeat, pos.i32(), len_ + n);
        vals[node.out.at(0)] = y;
      } else if (node.op == "embedding" && ops::attr_bool(node, "position", false)) {
        const Tensor& w = s.params.at(node.params.at("weight"));
        ZR_CHECK(len_ + n <= w.dim(0), "position ", len_ + n - 1, " is past the model's ", w.dim(0),
                 " positions (its context length)");
        Tensor y = out_f32({1, n, w.dim(1)});
        be.embedding_fwd(pos.i32(), w.f32(), y.f32(), n, w.dim(1), w.dim(0));
        vals[node.out.at(0)] = y;
      } else {
        NodeCtx c;
        c.node = &node;
        c.in = in;
        for (auto& [role, name] : node.params) c.params[role] = s.params.at(name);
        std::vector<Tensor> saved;
        c.saved = &saved;
        op_lookup(node.op).forward(c);
        ZR_CHECK(c.out.size() == node.out.size(), "produced ", c.out.size(), " outputs");
        for (size_t k = 0; k < c.out.size(); ++k) vals[node.out[k]] = c.out[k];
      }
    };
    ZR_WITH_CONTEXT("sample: node " + std::to_string(i) + " (" + node.op + ")", run());
  }
  len_ += n;
  Tensor lg = vals.at(s.logits);
  ZR_CHECK(lg.numel() == n * vocab_, "sample: the logits '", s.logits, "' are ", shape_str(lg.shape()), ", not [1, ", n,
           ", ", vocab_, "]");
  if (!all) lg = Tensor::view_of(lg, (n - 1) * vocab_, {vocab_});
  if (!s.dev.is_cpu()) lg = lg.to(Device::cpu());
  return std::vector<float>(lg.f32(), lg.f32() + lg.numel());
}

}  // namespace zerorun
