// Architecture builders for `zerorun init`: MLP, GPT-2 and Llama (the
// graphs transformers' GPT2LMHeadModel / LlamaForCausalLM compute), as graphs
// + freshly initialised tensors.
#include <cmath>

#include "zerorun/model.h"
#include "zerorun/rng.h"

namespace zerorun {
namespace {

class Builder {
 public:
  explicit Builder(uint64_t seed, bool shapes_only = false) : rng_(seed), shapes_only_(shapes_only) {}
  Model m;
  std::string block;

  std::string node(const std::string& op, std::vector<std::string> in, const std::string& out,
                   std::map<std::string, std::string> params = {}, json attrs = json::object()) {
    Node n;
    n.op = op;
    n.block = block;
    n.in = std::move(in);
    n.out = {out};
    n.params = std::move(params);
    n.attrs = std::move(attrs);
    m.graph.nodes.push_back(std::move(n));
    return out;
  }
  void normal(const std::string& name, const Shape& s, double std) {
    if (shaped(name, s)) return;
    Tensor t = Tensor::empty(s, DType::F32, MemCategory::Buffers);
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = static_cast<float>(rng_.normal() * std);
    m.tensors[name] = t;
  }
  void uniform(const std::string& name, const Shape& s, double bound) {
    if (shaped(name, s)) return;
    Tensor t = Tensor::empty(s, DType::F32, MemCategory::Buffers);
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = static_cast<float>((2.0 * rng_.uniform() - 1.0) * bound);
    m.tensors[name] = t;
  }
  void fill(const std::string& name, const Shape& s, float v) {
    if (shaped(name, s)) return;
    Tensor t = Tensor::empty(s, DType::F32, MemCategory::Buffers);
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = v;
    m.tensors[name] = t;
  }
  // GPT-2 style linear: N(0, std) weight, zero bias.
  std::string linear(const std::string& x, const std::string& name, int64_t in, int64_t out, double std,
                     bool bias = true) {
    normal(name + ".weight", {out, in}, std);
    std::map<std::string, std::string> p{{"weight", name + ".weight"}};
    if (bias) {
      fill(name + ".bias", {out}, 0.f);
      p["bias"] = name + ".bias";
    }
    return node("linear", {x}, name, p);
  }
  std::string layernorm(const std::string& x, const std::string& name, int64_t C) {
    fill(name + ".weight", {C}, 1.f);
    fill(name + ".bias", {C}, 0.f);
    return node("layernorm", {x}, name, {{"weight", name + ".weight"}, {"bias", name + ".bias"}}, {{"eps", 1e-5}});
  }
  // Token-model inputs and the "embed" block: the token table, plus a learned position table unless pos is ""
  // (rotary models: positions enter in the attention blocks). The optional input "positions" (each token's position
  // in its document, given by data sources that pack documents) goes to the position table, rope and attention.
  std::string token_embed(const std::string& tok, const std::string& pos, int64_t V, int64_t T, int64_t C, double std) {
    m.graph.inputs = {{"tokens", DType::I32, {"B", "T"}},
                      {"targets", DType::I32, {"B", "T"}},
                      {"positions", DType::I32, {"B", "T"}, true}};
    block = "embed";
    m.graph.blocks.push_back("embed");
    normal(tok, {V, C}, std);
    if (pos.empty()) return node("embedding", {"tokens"}, "x.0", {{"weight", tok}});
    normal(pos, {T, C}, std);
    node("embedding", {"tokens"}, "tok_emb", {{"weight", tok}});
    node("embedding", {"tokens", "positions"}, "pos_emb", {{"weight", pos}}, {{"position", true}});
    return node("add", {"tok_emb", "pos_emb"}, "x.0");
  }
  // x dropped out with probability p in training (x itself where p is 0). Sites number the graph's dropouts in
  // order (attention's too: site()), each its own random stream (kernels/counter_rng.h).
  std::string dropout(const std::string& x, double p, const std::string& out) {
    if (p <= 0) return x;
    return node("dropout", {x}, out, {}, {{"dropout", p}, {"site", site_++}});
  }
  void attention_dropout(json& attrs, double p) {
    if (p <= 0) return;
    attrs["dropout"] = p;
    attrs["site"] = site_++;
  }
  Model done() {
    finalize_model(m);
    return std::move(m);
  }

 private:
  // shapes_only: the parameter's shape without weights (m.shapes; finalize_model keeps it).
  bool shaped(const std::string& name, const Shape& s) {
    if (shapes_only_) m.shapes[name] = s;
    return shapes_only_;
  }
  Rng rng_;
  bool shapes_only_ = false;
  int64_t site_ = 0;
};

}  // namespace

Model build_mlp(const MlpSpec& s, uint64_t seed, bool shapes_only) {
  ZR_CHECK(s.in > 0 && s.hidden > 0 && s.out > 0 && s.layers >= 1, "mlp sizes must be positive");
  ZR_CHECK(s.act == "relu" || s.act == "gelu" || s.act == "silu", "mlp activation must be relu, gelu or silu");
  Builder b(seed, shapes_only);
  b.m.graph.inputs = {{"x", DType::F32, {"B", std::to_string(s.in)}}, {"y", DType::F32, {"B", std::to_string(s.out)}}};
  std::string x = "x";
  int64_t width = s.in;
  for (int64_t l = 0; l <= s.layers; ++l) {
    bool last = l == s.layers;
    int64_t out = last ? s.out : s.hidden;
    std::string name = "fc" + std::to_string(l);
    b.block = name;
    b.m.graph.blocks.push_back(name);
    double bound = 1.0 / std::sqrt(static_cast<double>(width));  // torch.nn.Linear default init
    b.uniform(name + ".weight", {out, width}, bound);
    b.uniform(name + ".bias", {out}, bound);
    x = b.node("linear", {x}, name, {{"weight", name + ".weight"}, {"bias", name + ".bias"}});
    if (!last) x = b.node(s.act, {x}, name + "." + s.act);
    width = out;
  }
  b.node("mse", {x, "y"}, "loss");
  b.m.graph.loss = "loss";
  b.m.graph.meta["arch"] = "mlp";
  b.m.graph.meta["arch_config"] = {
      {"in", s.in}, {"hidden", s.hidden}, {"out", s.out}, {"layers", s.layers}, {"act", s.act}};
  return b.done();
}

namespace {
// Names the size at fault (`zerorun init` passes the flags' values straight through).
void check_transformer_sizes(const char* arch, int64_t vocab, int64_t n_ctx, int64_t n_embd, int64_t n_layer,
                             int64_t n_head, int64_t ffn, bool heads_divide = true) {
  const std::pair<const char*, int64_t> sizes[] = {{"vocab", vocab},     {"n_ctx", n_ctx},   {"n_embd", n_embd},
                                                   {"n_layer", n_layer}, {"n_head", n_head}, {"ffn", ffn}};
  for (const auto& [name, v] : sizes) ZR_CHECK(v > 0, arch, ": --", name, " must be positive, got ", v);
  ZR_CHECK(!heads_divide || n_embd % n_head == 0, arch, ": --n_embd ", n_embd, " is not divisible by --n_head ", n_head,
           " (each head gets n_embd / n_head features)");
}
}  // namespace

Model build_gpt2(const Gpt2Spec& s, uint64_t seed, bool shapes_only) {
  check_transformer_sizes("gpt2", s.vocab, s.n_ctx, s.n_embd, s.n_layer, s.n_head, 1);
  Builder b(seed, shapes_only);
  const int64_t C = s.n_embd;
  const double std = 0.02, proj_std = 0.02 / std::sqrt(2.0 * s.n_layer);
  for (double p : {s.attn_pdrop, s.resid_pdrop, s.embd_pdrop})
    ZR_CHECK(p >= 0 && p < 1, "gpt2: dropout probabilities must be in [0, 1), got ", p);
  std::string x = b.token_embed("wte.weight", "wpe.weight", s.vocab, s.n_ctx, C, std);
  x = b.dropout(x, s.embd_pdrop, "drop");
  for (int64_t l = 0; l < s.n_layer; ++l) {
    std::string p = "h." + std::to_string(l);
    b.block = p;
    b.m.graph.blocks.push_back(p);
    std::string h = b.layernorm(x, p + ".ln_1", C);
    h = b.linear(h, p + ".attn.c_attn", C, 3 * C, std);
    json aa = {{"n_head", s.n_head}};
    b.attention_dropout(aa, s.attn_pdrop);
    h = b.node("attention", {h, "positions"}, p + ".attn.out", {}, aa);
    h = b.linear(h, p + ".attn.c_proj", C, C, proj_std);
    h = b.dropout(h, s.resid_pdrop, p + ".attn.resid_dropout");
    x = b.node("add", {x, h}, p + ".res1");
    h = b.layernorm(x, p + ".ln_2", C);
    h = b.linear(h, p + ".mlp.c_fc", C, 4 * C, std);
    h = b.node("gelu", {h}, p + ".mlp.gelu");
    h = b.linear(h, p + ".mlp.c_proj", 4 * C, C, proj_std);
    h = b.dropout(h, s.resid_pdrop, p + ".mlp.dropout");
    x = b.node("add", {x, h}, p + ".res2");
  }
  b.block = "head";
  b.m.graph.blocks.push_back("head");
  x = b.layernorm(x, "ln_f", C);
  std::string head_w = "wte.weight";
  if (!s.tied) {
    b.normal("lm_head.weight", {s.vocab, C}, std);
    head_w = "lm_head.weight";
  }
  x = b.node("linear", {x}, "logits", {{"weight", head_w}});
  b.node("cross_entropy", {x, "targets"}, "loss");
  b.m.graph.loss = "loss";
  b.m.graph.meta["arch"] = "gpt2";
  b.m.graph.meta["arch_config"] = {{"vocab_size", s.vocab}, {"n_positions", s.n_ctx}, {"n_embd", C},
                                   {"n_layer", s.n_layer},  {"n_head", s.n_head},     {"tie_word_embeddings", s.tied},
                                   {"attn_pdrop", s.attn_pdrop}, {"resid_pdrop", s.resid_pdrop},
                                   {"embd_pdrop", s.embd_pdrop}};
  b.m.graph.meta["symbols"] = {{"T", s.n_ctx}};
  return b.done();
}

Model build_llama(const LlamaSpec& s, uint64_t seed, bool shapes_only) {
  const char* mt = s.model_type.c_str();
  const int64_t C = s.n_embd, H = s.n_head, K = s.n_kv_head == 0 ? s.n_head : s.n_kv_head;
  ZR_CHECK(s.head_dim >= 0, mt, ": head_dim must be positive, got ", s.head_dim);
  check_transformer_sizes(mt, s.vocab, s.n_ctx, s.n_embd, s.n_layer, s.n_head, s.ffn, s.head_dim == 0);
  const int64_t D = s.head_size();
  ZR_CHECK(K > 0 && H % K == 0, mt, ": --n_kv_head ", K, " must be positive and divide --n_head ", H,
           " (each key/value head serves n_head / n_kv_head query heads)");
  ZR_CHECK(D % 2 == 0, mt, ": the head size ", s.head_dim > 0 ? "head_dim" : "n_embd / n_head", " = ", D,
           " must be even (rotary embeddings rotate pairs)");
  ZR_CHECK(s.rope_theta > 1.0 && std::isfinite(s.rope_theta), mt, ": --rope_theta must be > 1, got ", s.rope_theta);
  ZR_CHECK(s.rms_eps > 0.0 && s.rms_eps < 1.0, mt, ": rms_norm_eps must be in (0, 1), got ", s.rms_eps);
  ZR_CHECK(s.qk_norm.empty() || s.qk_norm == "head" || s.qk_norm == "full", mt, ": qk_norm must be head or full");
  ZR_CHECK(s.norm_place == "pre" || s.norm_place == "post" || s.norm_place == "sandwich", mt,
           ": norm placement must be pre, post or sandwich");
  ZR_CHECK(s.act == "silu" || s.act == "gelu_tanh", mt, ": the MLP activation must be silu or gelu_tanh");
  ZR_CHECK(s.window >= 0 && s.attn_scale >= 0 && s.attn_softcap >= 0 && s.final_softcap >= 0 && s.embed_scale >= 0, mt,
           ": window, scales and soft-caps must be >= 0");
  ZR_CHECK(s.sliding.empty() || static_cast<int64_t>(s.sliding.size()) == s.n_layer, mt, ": ", s.sliding.size(),
           " per-layer sliding flags for ", s.n_layer, " layers");
  ZR_CHECK(s.attn_dropout >= 0 && s.attn_dropout < 1 && s.resid_dropout >= 0 && s.resid_dropout < 1, mt,
           ": dropout probabilities must be in [0, 1)");
  Builder b(seed, shapes_only);
  const double std = 0.02, proj_std = 0.02 / std::sqrt(2.0 * s.n_layer);
  std::string x = b.token_embed("embed_tokens.weight", "", s.vocab, s.n_ctx, C, std);
  if (s.padding_idx >= 0) {  // transformers' nn.Embedding(vocab, hidden, padding_idx=config.pad_token_id)
    ZR_CHECK(s.padding_idx < s.vocab, mt, ": pad_token_id ", s.padding_idx, " is outside the vocabulary of ", s.vocab);
    b.m.graph.nodes.back().attrs["padding_idx"] = s.padding_idx;
  }
  if (s.embed_scale > 0) x = b.node("scale", {x}, "embed_tokens.scaled", {}, {{"factor", s.embed_scale}});
  json norm_attrs = {{"eps", s.rms_eps}};
  if (s.norm_offset != 0) norm_attrs["offset"] = s.norm_offset;
  auto rms = [&](const std::string& in, const std::string& name) {
    b.fill(name + ".weight", {C}, s.norm_offset != 0 ? 0.f : 1.f);  // the scale offset + w starts at 1
    return b.node("rmsnorm", {in}, name, {{"weight", name + ".weight"}}, norm_attrs);
  };
  const bool post = s.norm_place == "post", sandwich = s.norm_place == "sandwich";
  for (int64_t l = 0; l < s.n_layer; ++l) {
    std::string p = "layers." + std::to_string(l);
    b.block = p;
    b.m.graph.blocks.push_back(p);
    const bool slide = s.window > 0 && (s.sliding.empty() || s.sliding[static_cast<size_t>(l)]);
    std::string h = post ? x : rms(x, p + ".input_layernorm");
    // q_proj, k_proj, v_proj stacked: [(H + 2K) D, C].
    h = b.linear(h, p + ".self_attn.qkv_proj", C, (H + 2 * K) * D, std, s.qkv_bias);
    if (!s.qk_norm.empty()) {
      const bool full = s.qk_norm == "full";
      const std::string qn = p + ".self_attn.q_norm.weight", kn = p + ".self_attn.k_norm.weight";
      b.fill(qn, {full ? H * D : D}, s.norm_offset != 0 ? 0.f : 1.f);
      b.fill(kn, {full ? K * D : D}, s.norm_offset != 0 ? 0.f : 1.f);
      json a = {{"n_head", H}, {"n_kv_head", K}, {"eps", s.rms_eps}, {"full", full}};
      if (s.norm_offset != 0) a["offset"] = s.norm_offset;
      h = b.node("qk_norm", {h}, p + ".self_attn.qk_norm", {{"q_weight", qn}, {"k_weight", kn}}, a);
    }
    // rope rotates q and k; grouped-query key/value heads stay K (attention reads each for its H / K query heads).
    json ra = {{"n_head", H}, {"n_kv_head", K}};
    if (K != H) ra["repeat_kv"] = false;
    if (slide && s.local_rope_theta > 0) {
      ra["theta"] = s.local_rope_theta;
    } else {
      ra["theta"] = s.rope_theta;
      if (!s.rope_scaling.is_null()) {
        ra["scaling"] = s.rope_scaling;
        ra["max_position_embeddings"] = s.n_ctx;
      }
    }
    h = b.node("rope", {h, "positions"}, p + ".self_attn.rope", {}, ra);
    json aa = {{"n_head", H}};
    if (K != H) aa["n_kv_head"] = K;
    if (s.attn_scale > 0) aa["scale"] = s.attn_scale;
    if (slide) aa["window"] = s.window;
    if (s.attn_softcap > 0) aa["softcap"] = s.attn_softcap;
    b.attention_dropout(aa, s.attn_dropout);
    h = b.node("attention", {h, "positions"}, p + ".self_attn.out", {}, aa);
    h = b.linear(h, p + ".self_attn.o_proj", H * D, C, proj_std, s.o_bias);
    h = b.dropout(h, s.resid_dropout, p + ".resid_attn_dropout");
    if (post || sandwich) h = rms(h, p + ".post_attention_layernorm");
    x = b.node("add", {x, h}, p + ".res1");
    h = post ? x : rms(x, p + (sandwich ? ".pre_feedforward_layernorm" : ".post_attention_layernorm"));
    std::string g = b.linear(h, p + ".mlp.gate_proj", C, s.ffn, std, s.mlp_bias);
    std::string u = b.linear(h, p + ".mlp.up_proj", C, s.ffn, std, s.mlp_bias);
    h = b.node(s.act == "silu" ? "swiglu" : "geglu", {g, u}, p + ".mlp.gated");
    h = b.linear(h, p + ".mlp.down_proj", s.ffn, C, proj_std, s.mlp_bias);
    h = b.dropout(h, s.resid_dropout, p + ".resid_mlp_dropout");
    if (post || sandwich) h = rms(h, p + ".post_feedforward_layernorm");
    x = b.node("add", {x, h}, p + ".res2");
  }
  b.block = "head";
  b.m.graph.blocks.push_back("head");
  x = rms(x, "norm");
  if (s.tied) {
    x = b.node("linear", {x}, "lm_head", {{"weight", "embed_tokens.weight"}});
  } else {
    x = b.linear(x, "lm_head", C, s.vocab, std, false);
  }
  if (s.final_softcap > 0) x = b.node("softcap", {x}, "lm_head.capped", {}, {{"cap", s.final_softcap}});
  b.node("cross_entropy", {x, "targets"}, "loss");
  b.m.graph.loss = "loss";
  b.m.graph.meta["arch"] = "llama";
  b.m.graph.meta["model_type"] = s.model_type;
  json ac = {{"vocab_size", s.vocab},          {"max_position_embeddings", s.n_ctx}, {"hidden_size", C},
             {"num_hidden_layers", s.n_layer}, {"num_attention_heads", H},           {"num_key_value_heads", K},
             {"intermediate_size", s.ffn},     {"rope_theta", s.rope_theta},         {"rms_norm_eps", s.rms_eps},
             {"tie_word_embeddings", s.tied}};
  if (s.head_dim > 0) ac["head_dim"] = s.head_dim;
  b.m.graph.meta["arch_config"] = ac;
  if (!s.hf_config.is_null()) b.m.graph.meta["hf_config"] = s.hf_config;
  b.m.graph.meta["symbols"] = {{"T", s.n_ctx}};
  return b.done();
}

bool llama_is_hf_compatible(const Graph& g) {
  if (g.meta.value("arch", json()) != "llama") return false;
  bool rope = false;
  for (const auto& n : g.nodes) {
    if (n.op == "rope") rope = true;
    if (n.op == "embedding" && n.attrs.value("position", false)) return false;
  }
  return rope;
}

}  // namespace zerorun
