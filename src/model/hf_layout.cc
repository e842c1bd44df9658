// The one mapping between zerorun parameter names/shapes and transformers'
// (see include/zerorun/hf_layout.h): merge writes through it, import reads
// through it, so a merge imports back to the same model exactly.
#include "zerorun/hf_layout.h"

#include <map>

#include "zerorun/model.h"

namespace zerorun {

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
int64_t cfg_int(const Graph& g, const char* key) {
  const json& ac = g.meta.at("arch_config");
  ZR_CHECK(ac.contains(key) && ac[key].is_number_integer() && ac[key].get<int64_t>() > 0, "graph arch_config '", key,
           "' must be a positive integer");
  return ac[key].get<int64_t>();
}
}  // namespace

bool hf_gpt2_conv1d(const std::string& name) {
  for (const std::string s : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
    if (ends_with(name, s)) return true;
  return false;
}

std::string model_type_of(const Graph& g) { return g.meta.value("model_type", std::string("llama")); }

std::string hf_class(const Graph& g) {
  const json arch = g.meta.value("arch", json());
  if (arch == "gpt2") return "GPT2LMHeadModel";
  if (arch != "llama" || !llama_is_hf_compatible(g)) return "";
  static const std::map<std::string, std::string> cls = {
      {"llama", "LlamaForCausalLM"}, {"mistral", "MistralForCausalLM"}, {"qwen2", "Qwen2ForCausalLM"},
      {"qwen3", "Qwen3ForCausalLM"}, {"phi3", "Phi3ForCausalLM"},       {"olmo2", "Olmo2ForCausalLM"},
      {"gemma", "GemmaForCausalLM"}, {"gemma2", "Gemma2ForCausalLM"},   {"gemma3_text", "Gemma3ForCausalLM"}};
  auto it = cls.find(model_type_of(g));
  return it == cls.end() ? "" : it->second;
}

std::vector<HfPiece> hf_pieces(const Graph& g, const std::string& name, const Shape& shape) {
  const std::string cls = hf_class(g);
  const int64_t rows = shape.empty() ? 1 : shape[0];
  if (cls == "GPT2LMHeadModel") {
    HfPiece p{name == "lm_head.weight" ? name : "transformer." + name, shape, 0, rows, false};
    if (hf_gpt2_conv1d(name) && shape.size() == 2) {
      p.transpose = true;
      p.shape = {shape[1], shape[0]};
    }
    return {p};
  }
  ZR_CHECK(!cls.empty(), "the graph (arch ", g.meta.value("arch", json()).dump(), ") has no transformers layout");
  const std::string hf = name == "lm_head.weight" ? name : "model." + name;
  const bool phi3 = model_type_of(g) == "phi3";
  if (phi3 && (ends_with(name, ".mlp.gate_proj.weight") || ends_with(name, ".mlp.up_proj.weight"))) {
    // Phi-3's gate_up_proj: [gate; up] rows of one tensor.
    const bool up = ends_with(name, ".mlp.up_proj.weight");
    const std::string stem = hf.substr(0, hf.rfind(".mlp.") + 5);
    return {{stem + "gate_up_proj.weight", {2 * rows, shape[1]}, 0, rows, false, up ? rows : 0}};
  }
  const bool w = ends_with(name, ".self_attn.qkv_proj.weight"), b = ends_with(name, ".self_attn.qkv_proj.bias");
  if (phi3 || (!w && !b)) return {{hf, shape, 0, rows, false}};
  const int64_t H = cfg_int(g, "num_attention_heads"), K = cfg_int(g, "num_key_value_heads");
  ZR_CHECK(shape.size() == (w ? 2u : 1u) && shape[0] % (H + 2 * K) == 0, name, ": shape ", shape_str(shape),
           " is not [(num_attention_heads + 2 num_key_value_heads) x head size", w ? ", hidden]" : "]");
  const int64_t D = shape[0] / (H + 2 * K);
  const std::string stem = hf.substr(0, hf.rfind("qkv_proj."));
  const std::string kind = w ? ".weight" : ".bias";
  auto shp = [&](int64_t r) { return w ? Shape{r, shape[1]} : Shape{r}; };
  return {{stem + "q_proj" + kind, shp(H * D), 0, H * D, false},
          {stem + "k_proj" + kind, shp(K * D), H * D, K * D, false},
          {stem + "v_proj" + kind, shp(K * D), (H + K) * D, K * D, false}};
}

void hf_copy_piece(const HfPiece& p, int64_t cols, const float* src, float* dst, bool to_hf) {
  if (!p.transpose) {
    const size_t n = static_cast<size_t>(p.rows * cols), off = static_cast<size_t>(p.row0 * cols),
                 hoff = static_cast<size_t>(p.hf_row0 * cols);
    if (to_hf)
      std::copy(src + off, src + off + n, dst + hoff);
    else
      std::copy(src + hoff, src + hoff + n, dst + off);
    return;
  }
  for (int64_t i = 0; i < p.rows; ++i)  // zerorun [out, in] row i <-> column i of [in, out]
    for (int64_t j = 0; j < cols; ++j) {
      const size_t zr = static_cast<size_t>((p.row0 + i) * cols + j), hf = static_cast<size_t>(j * p.rows + i);
      if (to_hf)
        dst[hf] = src[zr];
      else
        dst[zr] = src[hf];
    }
}

json hf_config_json(const Graph& g) {
  const std::string cls = hf_class(g);
  ZR_CHECK(!cls.empty(), "the graph has no transformers layout");
  json ac = g.meta.at("arch_config");
  if (cls == "GPT2LMHeadModel") {
    ac["model_type"] = "gpt2";
    ac["architectures"] = {cls};
    for (const char* p : {"resid_pdrop", "embd_pdrop", "attn_pdrop"})  // the dropouts zerorun trained with
      if (!ac.contains(p)) ac[p] = 0.0;
    ac["n_ctx"] = ac.value("n_positions", 1024);
    ac["activation_function"] = "gelu_new";
    double eps = 1e-5;
    for (const auto& n : g.nodes)
      if (n.op == "layernorm" && n.attrs.contains("eps") && n.attrs["eps"].is_number()) eps = n.attrs["eps"];
    ac["layer_norm_epsilon"] = eps;
    return ac;
  }
  if (g.meta.contains("hf_config") && g.meta["hf_config"].is_object()) {
    // The imported config.json, every field kept. A Gemma 3 multimodal checkpoint's language model is saved as
    // the text-only Gemma3ForCausalLM (zerorun trains the text model): its text_config, with the token ids.
    json c = g.meta["hf_config"];
    if (c.value("model_type", std::string()) == "gemma3") {
      json t = c.at("text_config");
      for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
        if (c.contains(k) && !t.contains(k)) t[k] = c[k];
      t["model_type"] = "gemma3_text";
      if (c.contains("transformers_version")) t["transformers_version"] = c["transformers_version"];
      c = t;
    }
    c["architectures"] = {cls};
    return c;
  }
  ac["model_type"] = model_type_of(g);
  ac["architectures"] = {cls};
  ac["hidden_act"] = "silu";
  ac["attention_bias"] = false;
  ac["mlp_bias"] = false;
  ac["attention_dropout"] = 0.0;
  ac["rope_scaling"] = nullptr;
  if (!ac.contains("head_dim")) ac["head_dim"] = cfg_int(g, "hidden_size") / cfg_int(g, "num_attention_heads");
  return ac;
}

}  // namespace zerorun
