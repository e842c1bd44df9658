// transformers' decoder model_types as compositions of zerorun's features: a
// config.json (transformers 4.x or 5.x spelling) -> LlamaSpec, reading every
// key that changes what the model computes and refusing, by name, each one
// whose effect zerorun does not compute. The per-model facts follow
// transformers' configuration_*.py / modeling_*.py of llama, mistral, qwen2,
// qwen3, phi3, olmo2, gemma, gemma2 and gemma3(_text).
#include "zerorun/hf_arch.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

namespace zerorun {

namespace {
struct Cfg {
  const json& j;
  const std::string& path;
  bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
  int64_t size(const char* k, int64_t def = 0) const {
    if (!has(k) && def > 0) return def;
    ZR_CHECK(
        has(k) && j[k].is_number_integer() && j[k].get<int64_t>() >= 1 && j[k].get<int64_t>() <= (int64_t{1} << 24),
        path, ": '", k, "' must be a positive integer", has(k) ? ", got " + j[k].dump() : "");
    return j[k].get<int64_t>();
  }
  double number(const char* k, double def) const {
    if (!has(k)) return def;
    ZR_CHECK(j[k].is_number() && std::isfinite(j[k].get<double>()), path, ": '", k, "' must be a number, got ",
             j[k].dump());
    return j[k].get<double>();
  }
  bool flag(const char* k, bool def) const {
    if (!has(k)) return def;
    ZR_CHECK(j[k].is_boolean(), path, ": '", k, "' must be true or false, got ", j[k].dump());
    return j[k].get<bool>();
  }
  std::string str(const char* k, const std::string& def) const {
    if (!has(k)) return def;
    ZR_CHECK(j[k].is_string(), path, ": '", k, "' must be a string, got ", j[k].dump());
    return j[k].get<std::string>();
  }
};

// Keys that change nothing zerorun computes: token ids, inference and bookkeeping settings.
const std::set<std::string>& inert_keys() {
  static const std::set<std::string> k = {"architectures",
                                          "model_type",
                                          "transformers_version",
                                          "torch_dtype",
                                          "dtype",
                                          "_name_or_path",
                                          "initializer_range",
                                          "use_cache",
                                          "bos_token_id",
                                          "eos_token_id",
                                          "pad_token_id",
                                          "tie_word_embeddings",
                                          "output_attentions",
                                          "output_hidden_states",
                                          "return_dict",
                                          "is_decoder",
                                          "is_encoder_decoder",
                                          "max_window_layers",
                                          "cache_implementation",
                                          "use_bidirectional_attention",
                                          "sliding_window_pattern",
                                          "_sliding_window_pattern",
                                          "attn_implementation",
                                          "_attn_implementation",
                                          "id2label",
                                          "label2id",
                                          "problem_type",
                                          "chunk_size_feed_forward",
                                          "tokenizer_class",
                                          "prefix",
                                          "task_specific_params",
                                          "finetuning_task",
                                          "num_labels",
                                          "output_router_logits",
                                          "generation_config",
                                          "layer_types",
                                          "rope_scaling",
                                          "rope_parameters",
                                          "rope_theta",
                                          "rope_local_base_freq",
                                          "head_dim",
                                          "hidden_act",
                                          "hidden_activation",
                                          "partial_rotary_factor",
                                          "original_max_position_embeddings",
                                          "image_token_index",
                                          "boi_token_index",
                                          "eoi_token_index",
                                          "mm_tokens_per_image",
                                          "use_return_dict",
                                          "max_length",
                                          "vision_config",
                                          "text_config",
                                          "initializer_factor",
                                          "quantization_config_unused",
                                          "use_sliding_window",
                                          "sliding_window",
                                          "query_pre_attn_scalar",
                                          "attn_logit_softcapping",
                                          "final_logit_softcapping",
                                          "attention_bias",
                                          "mlp_bias",
                                          "attention_dropout",
                                          "resid_pdrop",
                                          "embd_pdrop",
                                          "pretraining_tp",
                                          "num_key_value_heads",
                                          "rms_norm_eps",
                                          "vocab_size",
                                          "hidden_size",
                                          "intermediate_size",
                                          "num_hidden_layers",
                                          "num_attention_heads",
                                          "max_position_embeddings",
                                          "qkv_bias",
                                          "clip_qkv"};
  return k;
}

// The rotary settings: rope_theta + rope_scaling (transformers 4) or rope_parameters (5; Gemma 3's per layer type).
// Returns the scaling object for the rope op (null: default) and sets theta.
json read_rope(const Cfg& c, const json& rp, double& theta, const std::string& where) {
  if (rp.is_null()) return json();
  ZR_CHECK(rp.is_object(), c.path, ": ", where, " must be an object or null");
  const std::string type = rp.value("rope_type", rp.value("type", std::string("default")));
  if (rp.contains("rope_theta")) {
    ZR_CHECK(rp["rope_theta"].is_number(), c.path, ": ", where, ".rope_theta must be a number");
    theta = rp["rope_theta"].get<double>();
  }
  static const std::map<std::string, std::set<std::string>> allowed = {
      {"default", {}},
      {"linear", {"factor"}},
      {"dynamic", {"factor", "original_max_position_embeddings"}},
      {"llama3", {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}},
      {"yarn",
       {"factor", "attention_factor", "beta_fast", "beta_slow", "original_max_position_embeddings", "mscale",
        "mscale_all_dim", "truncate"}}};
  auto it = allowed.find(type);
  ZR_CHECK(it != allowed.end(), c.path, ": ", where, ".rope_type ", json(type).dump(),
           " is not supported (zerorun computes default, linear, dynamic, llama3 and yarn",
           type == "longrope" ? "; longrope, for Phi-3's 128k variants, is not implemented yet" : "", ")");
  json out = {{"rope_type", type}};
  for (auto& [k, v] : rp.items()) {
    if (k == "rope_type" || k == "type" || k == "rope_theta") continue;
    if (k == "partial_rotary_factor") {  // transformers 5 writes Phi-3's 1.0 here: the whole head rotates, as ours
      ZR_CHECK(v.is_null() || (v.is_number() && v.get<double>() == 1.0), c.path, ": ", where,
               ".partial_rotary_factor ", v.dump(), " is not supported (zerorun rotates the whole head)");
      continue;
    }
    ZR_CHECK(it->second.count(k), c.path, ": ", where, ".", k, " is not a setting of rope_type ", type,
             " that zerorun computes");
    if (!v.is_null()) out[k] = v;
  }
  if (type == "default") return json();
  return out;
}

// The per-layer sliding flags: transformers 5's layer_types, else the model's older rule.
std::vector<bool> read_layer_types(const Cfg& c, int64_t L, const std::function<bool(int64_t)>& older) {
  std::vector<bool> s(static_cast<size_t>(L));
  if (c.has("layer_types")) {
    const json& lt = c.j["layer_types"];
    ZR_CHECK(lt.is_array() && static_cast<int64_t>(lt.size()) == L, c.path, ": layer_types must list the ", L,
             " layers");
    for (int64_t l = 0; l < L; ++l) {
      const json& t = lt[static_cast<size_t>(l)];
      ZR_CHECK(t == "sliding_attention" || t == "full_attention", c.path, ": layer_types[", l, "] ", t.dump(),
               " is not supported (full_attention or sliding_attention)");
      s[static_cast<size_t>(l)] = t == "sliding_attention";
    }
    return s;
  }
  for (int64_t l = 0; l < L; ++l) s[static_cast<size_t>(l)] = older(l);
  return s;
}
}  // namespace

double hf_dropout(const json& config, const std::string& path, const char* key, bool no_dropout,
                  std::vector<std::string>* notes) {
  const double p = Cfg{config, path}.number(key, 0.0);
  if (p == 0.0) return 0.0;
  ZR_CHECK(p > 0 && p < 1, path, ": '", key, "' must be a probability in [0, 1), got ", p);
  if (!no_dropout) return p;
  if (notes)
    notes->push_back(std::string("--no_dropout: trains without the ") + key + " of " + std::to_string(p) +
                     " that config.json asks for");
  return 0.0;
}

bool hf_decoder_type(const std::string& t) {
  static const std::set<std::string> k = {"llama", "mistral", "qwen2",  "qwen3",  "phi3",
                                          "olmo2", "gemma",   "gemma2", "gemma3", "gemma3_text"};
  return k.count(t) > 0;
}

LlamaSpec hf_decoder_spec(const json& full, const std::string& path, std::vector<std::string>* notes, bool no_dropout) {
  const std::string outer = full.value("model_type", std::string());
  ZR_CHECK(hf_decoder_type(outer), path, ": model_type ", json(outer).dump(), " is not a decoder zerorun imports");
  // Gemma 3 multimodal checkpoints nest the language model's config in text_config.
  const json& j = outer == "gemma3" ? full.at("text_config") : full;
  ZR_CHECK(j.is_object(), path, ": text_config must be an object");
  const std::string mt = outer == "gemma3" ? "gemma3_text" : outer;
  Cfg c{j, path};
  LlamaSpec s;
  s.model_type = mt;
  s.hf_config = full;
  const bool gemma = mt.rfind("gemma", 0) == 0;
  s.vocab = c.size("vocab_size");
  s.n_embd = c.size("hidden_size");
  s.n_layer = c.size("num_hidden_layers");
  s.n_head = c.size("num_attention_heads");
  s.ffn = c.size("intermediate_size");
  s.n_ctx = c.size("max_position_embeddings", 2048);
  s.n_kv_head = c.size("num_key_value_heads", s.n_head);
  ZR_CHECK(s.n_head % s.n_kv_head == 0, path, ": num_key_value_heads ", s.n_kv_head,
           " must divide num_attention_heads ", s.n_head);
  const int64_t def_hd = mt == "qwen3" ? 128 : gemma ? 256 : 0;
  s.head_dim = c.has("head_dim") ? c.size("head_dim") : def_hd;
  if (s.head_dim == 0) {
    ZR_CHECK(s.n_embd % s.n_head == 0, path, ": hidden_size ", s.n_embd, " is not divisible by num_attention_heads ",
             s.n_head, " (set head_dim)");
  } else if (s.head_dim * s.n_head == s.n_embd) {
    s.head_dim = 0;  // the default: no attribute needed
  }
  s.tied = c.flag("tie_word_embeddings", gemma);
  // transformers' embedding takes pad_token_id as torch's padding_idx (no gradient for that row from the lookup;
  // negative counts from the end; outside the vocabulary torch refuses to build the model).
  if (c.has("pad_token_id")) {
    ZR_CHECK(c.j["pad_token_id"].is_number_integer(), path, ": pad_token_id must be an integer or null, got ",
             c.j["pad_token_id"].dump());
    const int64_t p = c.j["pad_token_id"].get<int64_t>();
    ZR_CHECK(p >= -s.vocab && p < s.vocab, path, ": pad_token_id ", p, " is outside the vocabulary of ", s.vocab,
             " (torch's embedding refuses it as padding_idx too)");
    s.padding_idx = p < 0 ? p + s.vocab : p;
  }
  s.rms_eps = c.number("rms_norm_eps", mt == "phi3" || mt == "olmo2" ? 1e-5 : 1e-6);
  ZR_CHECK(s.rms_eps > 0 && s.rms_eps < 1, path, ": rms_norm_eps must be a small positive number");
  // The MLP's activation.
  // (Gemma reads hidden_activation, default gelu_pytorch_tanh; its hidden_act is the original checkpoint's label.)
  const std::string act = gemma ? c.str("hidden_activation", "gelu_pytorch_tanh") : c.str("hidden_act", "silu");
  if (act == "silu" || act == "swish") {
    s.act = "silu";
  } else if (act == "gelu_pytorch_tanh" || act == "gelu_new") {
    s.act = "gelu_tanh";
  } else {
    ZR_FAIL(path, ": ", gemma ? "hidden_activation " : "hidden_act ", json(act).dump(),
            " is not supported (zerorun's gated MLPs are silu and gelu_pytorch_tanh)");
  }
  // Biases.
  if (mt == "qwen2") {
    s.qkv_bias = true;  // Qwen2 always has q/k/v biases and none on o_proj
  } else if (mt == "llama" || mt == "qwen3" || mt == "olmo2" || gemma) {
    s.qkv_bias = s.o_bias = c.flag("attention_bias", false);
  }
  if (mt == "llama") s.mlp_bias = c.flag("mlp_bias", false);
  for (const char* k : {"mlp_bias"})
    if (mt != "llama" && c.has(k)) ZR_CHECK(!c.flag(k, false), path, ": ", k, " = true is not a ", mt, " setting");
  ZR_CHECK(c.number("pretraining_tp", 1) == 1, path, ": pretraining_tp ", c.number("pretraining_tp", 1),
           " is not supported (1: the plain projections)");
  ZR_CHECK(!c.has("clip_qkv"), path, ": clip_qkv is not supported (zerorun does not clamp q/k/v)");
  // Dropouts as transformers applies them in training: every model_type here drops attention probabilities
  // (attention_dropout); Phi-3 also its attention and MLP outputs (resid_pdrop) and never reads embd_pdrop.
  s.attn_dropout = hf_dropout(j, path, "attention_dropout", no_dropout, notes);
  if (mt == "phi3") s.resid_dropout = hf_dropout(j, path, "resid_pdrop", no_dropout, notes);
  for (const char* k : {"resid_pdrop", "embd_pdrop"})
    if ((mt != "phi3" || std::string(k) == "embd_pdrop") && c.number(k, 0.0) != 0.0 && notes)
      notes->push_back(path + ": " + k + " = " + std::to_string(c.number(k, 0.0)) + " is not read by transformers' " +
                       mt + " (no dropout there)");
  ZR_CHECK(c.number("partial_rotary_factor", 1.0) == 1.0, path, ": partial_rotary_factor ",
           c.number("partial_rotary_factor", 1.0), " is not supported (zerorun rotates the whole head)");
  // Norm placement and q/k norms.
  if (mt == "qwen3") s.qk_norm = "head";
  if (mt == "olmo2") {
    s.qk_norm = "full";
    s.norm_place = "post";
  }
  if (gemma) {
    s.norm_offset = 1.0;
    s.embed_scale = std::sqrt(static_cast<double>(s.n_embd));
    if (mt != "gemma") s.norm_place = "sandwich";
    if (mt == "gemma3_text") s.qk_norm = "head";
  }
  if (mt == "gemma2" || mt == "gemma3_text") {
    s.attn_scale = 1.0 / std::sqrt(c.number("query_pre_attn_scalar", 256.0));  // Gemma2/3Config's default
    if (s.attn_scale * std::sqrt(static_cast<double>(s.head_size())) == 1.0) s.attn_scale = 0;
  }
  if (mt == "gemma2") {
    s.attn_softcap = c.number("attn_logit_softcapping", 50.0);
    s.final_softcap = c.number("final_logit_softcapping", 30.0);
  } else if (mt == "gemma3_text") {
    s.attn_softcap = c.number("attn_logit_softcapping", 0.0);
    s.final_softcap = c.number("final_logit_softcapping", 0.0);
  } else {
    for (const char* k : {"attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"})
      if (c.has(k) && notes)
        notes->push_back(std::string(k) + " is not read: transformers' " + mt + " does not compute it either");
  }
  // Rotary embeddings.
  double theta = c.number("rope_theta", gemma && mt == "gemma3_text" ? 1000000.0 : 10000.0);
  if (mt == "gemma3_text") {
    s.local_rope_theta = c.number("rope_local_base_freq", 10000.0);
    const json rp = c.has("rope_parameters") ? c.j["rope_parameters"] : json();
    if (rp.is_object() && (rp.contains("full_attention") || rp.contains("sliding_attention"))) {
      s.rope_scaling = read_rope(c, rp.value("full_attention", json()), theta, "rope_parameters.full_attention");
      double local = s.local_rope_theta;
      ZR_CHECK(
          read_rope(c, rp.value("sliding_attention", json()), local, "rope_parameters.sliding_attention").is_null(),
          path, ": rope_parameters.sliding_attention must be the default rope type");
      s.local_rope_theta = local;
    } else {
      s.rope_scaling = read_rope(c, c.has("rope_scaling") ? c.j["rope_scaling"] : rp, theta, "rope_scaling");
    }
  } else {
    json sc = c.has("rope_scaling") ? c.j["rope_scaling"] : json();
    const json rp = c.has("rope_parameters") ? c.j["rope_parameters"] : json();
    if (!rp.is_null()) sc = rp;  // transformers 5's name
    s.rope_scaling = read_rope(c, sc, theta, c.has("rope_parameters") ? "rope_parameters" : "rope_scaling");
  }
  ZR_CHECK(theta > 1 && std::isfinite(theta), path, ": rope_theta must be a number > 1, got ", theta);
  s.rope_theta = theta;
  // Sliding windows.
  const int64_t L = s.n_layer;
  if (mt == "mistral" || mt == "phi3") {
    if (c.has("sliding_window"))
      s.window = c.size("sliding_window");
    else if (mt == "mistral" && !c.j.contains("sliding_window"))
      s.window = 4096;  // MistralConfig's default (v0.3's config.json says null)
  } else if (mt == "qwen2" || mt == "qwen3") {
    if (c.flag("use_sliding_window", false) && c.has("sliding_window")) {
      s.window = c.size("sliding_window");
      const int64_t mw = c.has("max_window_layers") ? c.size("max_window_layers", L) : L;
      s.sliding = read_layer_types(c, L, [&](int64_t l) { return l >= mw; });
    } else if (c.has("layer_types")) {
      for (const json& t : c.j["layer_types"])
        ZR_CHECK(t != "sliding_attention", path,
                 ": layer_types asks for sliding_attention but use_sliding_window "
                 "is off");
    }
  } else if (mt == "gemma2") {
    s.window = c.size("sliding_window", 4096);
    s.sliding = read_layer_types(c, L, [](int64_t l) { return l % 2 == 0; });
  } else if (mt == "gemma3_text") {
    s.window = c.size("sliding_window", 4096);
    const int64_t pattern = c.has("sliding_window_pattern") ? c.size("sliding_window_pattern") : 6;
    s.sliding = read_layer_types(c, L, [&](int64_t l) { return (l + 1) % pattern != 0; });
  } else if (c.has("sliding_window") && notes) {
    notes->push_back("sliding_window is not read: transformers' " + mt + " attends to every earlier position");
  }
  if (s.window > 0 && !s.sliding.empty() && std::none_of(s.sliding.begin(), s.sliding.end(), [](bool b) { return b; }))
    s.window = 0, s.sliding.clear();
  // Keys refused outright and keys not read.
  for (const char* k : {"quantization_config", "auto_map", "rope_interleave", "num_experts", "moe_intermediate_size"})
    ZR_CHECK(!c.has(k), path, ": '", k, "' is not supported (",
             k == std::string("auto_map") ? "custom modeling code" : "an architecture feature zerorun does not compute",
             ")");
  std::string unread;
  for (auto& [k, v] : j.items())
    if (!inert_keys().count(k)) unread += (unread.empty() ? "" : ", ") + k;
  if (!unread.empty() && notes) notes->push_back("config keys not read (no effect known to zerorun): " + unread);
  return s;
}

}  // namespace zerorun
