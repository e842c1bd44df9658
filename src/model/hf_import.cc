// `zerorun import`: a transformers GPT-2 or Llama checkpoint directory (config.json + model.safetensors, or a
// sharded model.safetensors.index.json) -> model.bin, so pretrained weights can be fine-tuned. The inverse of
// merge's default layout through include/zerorun/hf_layout.h: GPT-2's "transformer." names and Conv1D weights
// [in, out]; Llama's "model." names and q/k/v_proj stacked into qkv_proj. Config the zerorun graph would not
// compute the same way is an error naming the key.
#include <cmath>
#include <filesystem>
#include <set>

#include "zerorun/fsutil.h"
#include "zerorun/hf_layout.h"
#include "zerorun/model.h"
#include "zerorun/safetensors.h"
#include "zerorun/strict_json.h"

namespace zerorun {

namespace {

// Buffers transformers keeps in some checkpoints (GPT-2's causal masks, old Llamas' rotary frequencies), not weights.
bool is_buffer(const std::string& name) {
  for (const std::string s : {".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq"})
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) return true;
  return false;
}

json read_config(const std::string& dir, const std::string& cfg_path) {
  ZR_CHECK(std::filesystem::is_directory(dir), dir, ": not a directory (give the transformers checkpoint directory)");
  ZR_CHECK(path_exists(cfg_path), dir, ": has no config.json");
  const json cfg = load_json_file_strict(cfg_path);
  ZR_CHECK(cfg.is_object(), cfg_path, ": must be a JSON object");
  return cfg;
}

// A positive integer size of config.json (`alt`: an older name for it), `def` where absent (0: required).
int64_t cfg_size(const json& cfg, const std::string& cfg_path, const char* k, const char* alt, int64_t def = 0) {
  const char* key = cfg.contains(k) || !alt ? k : alt;
  if (!cfg.contains(key) && def > 0) return def;
  ZR_CHECK(cfg.contains(key) && cfg[key].is_number_integer() && cfg[key].get<int64_t>() >= 1 &&
               cfg[key].get<int64_t>() <= (int64_t{1} << 24),
           cfg_path, ": '", k, "' must be a positive integer");
  return cfg[key].get<int64_t>();
}

double cfg_eps(const json& cfg, const std::string& cfg_path, const char* k, double def) {
  const json eps = cfg.value(k, json(def));
  ZR_CHECK(eps.is_number() && eps.get<double>() > 0 && eps.get<double>() < 1, cfg_path, ": ", k,
           " must be a small positive number, got ", eps.dump());
  return eps.get<double>();
}

// Fills every parameter of `m` (built for the config) from the checkpoint's tensors through hf_pieces.
void load_hf_weights(Model& m, const std::string& dir, const std::string& what, bool tied,
                     std::vector<std::string>* notes) {
  namespace fs = std::filesystem;
  // The weight files: one model.safetensors, or the shards an index names.
  const std::string single = (fs::path(dir) / "model.safetensors").string();
  const std::string index = (fs::path(dir) / "model.safetensors.index.json").string();
  std::vector<std::string> files;
  if (path_exists(single)) {
    files.push_back(single);
  } else if (path_exists(index)) {
    const json idx = load_json_file_strict(index);
    ZR_CHECK(idx.is_object() && idx.contains("weight_map") && idx["weight_map"].is_object(), index,
             ": has no 'weight_map' object");
    std::set<std::string> shards;
    for (auto& [name, file] : idx["weight_map"].items()) {
      ZR_CHECK(file.is_string() && !file.get<std::string>().empty() &&
                   file.get<std::string>().find('/') == std::string::npos,
               index, ": weight_map['", name, "'] must be a file name in ", dir);
      shards.insert(file.get<std::string>());
    }
    for (auto& f : shards) files.push_back((fs::path(dir) / f).string());
  } else {
    ZR_FAIL(dir, ": has no model.safetensors or model.safetensors.index.json",
            path_exists((fs::path(dir) / "pytorch_model.bin").string())
                ? " (only pytorch_model.bin, a pickle zerorun does not read: save it with safe_serialization=True, "
                  "or convert it with transformers)"
                : "");
  }
  // By name without the base model's prefix ("transformer." / "model."): checkpoints of the bare GPT2Model /
  // LlamaModel have none.
  auto bare = [](const std::string& n) {
    for (const std::string pre : {"transformer.", "model."})
      if (n.rfind(pre, 0) == 0) return n.substr(pre.size());
    return n;
  };
  std::map<std::string, std::pair<SafetensorsFile, SafetensorsEntry>> entries;
  for (auto& f : files) {
    SafetensorsFile sf = read_safetensors_header(f);
    for (auto& e : sf.entries) {
      std::string n = bare(e.name);
      ZR_CHECK(!entries.count(n), f, ": tensor '", e.name, "' is given twice (also in ",
               entries.count(n) ? entries[n].first.path : "", ")");
      entries[n] = {sf, e};
    }
  }
  for (const std::string& name : m.tensor_names) {
    Tensor& dst = m.tensors.at(name);
    const Shape want = dst.shape();
    const int64_t cols = dst.numel() / (want.empty() ? 1 : want[0]);
    for (const HfPiece& p : hf_pieces(m.graph, name, want)) {
      auto it = entries.find(bare(p.name));
      ZR_CHECK(it != entries.end(), dir, ": has no tensor '", p.name, "' (", what, " needs it)");
      const SafetensorsFile& sf = it->second.first;
      const SafetensorsEntry& e = it->second.second;
      ZR_CHECK(e.shape == p.shape, sf.path, ": tensor '", e.name, "' has shape ", shape_str(e.shape), ", expected ",
               shape_str(p.shape), p.transpose ? " (Conv1D weights are [in, out])" : "", " for ", what);
      Tensor t = read_safetensors_f32(sf, e);
      hf_copy_piece(p, cols, t.f32(), dst.f32(), false);
      entries.erase(it);
    }
  }
  std::string ignored;
  for (auto& [name, pe] : entries) {
    if (is_buffer(name)) continue;
    if (tied && name == "lm_head.weight") continue;  // transformers may save the tied copy too
    ignored += (ignored.empty() ? "" : ", ") + pe.second.name;
  }
  if (!ignored.empty() && notes) notes->push_back("ignored tensors that are not weights of " + what + ": " + ignored);
  finalize_model(m);
}

// The architectures' imports from config.json already read (cfg, from cfg_path).
Model gpt2_from(const std::string& dir, const std::string& cfg_path, const json& cfg, std::vector<std::string>* notes) {
  ZR_CHECK(cfg.value("model_type", json()) == "gpt2", cfg_path, ": model_type must be \"gpt2\", got ",
           cfg.value("model_type", json()).dump());
  Gpt2Spec s;
  s.vocab = cfg_size(cfg, cfg_path, "vocab_size", nullptr);
  s.n_ctx = cfg_size(cfg, cfg_path, "n_positions", "n_ctx");
  s.n_embd = cfg_size(cfg, cfg_path, "n_embd", "hidden_size");
  s.n_layer = cfg_size(cfg, cfg_path, "n_layer", "num_hidden_layers");
  s.n_head = cfg_size(cfg, cfg_path, "n_head", "num_attention_heads");
  s.tied = cfg.value("tie_word_embeddings", json(true)) != json(false);
  // What zerorun's gpt2 graph computes; anything else would load and compute another function.
  const json act = cfg.value("activation_function", json("gelu_new"));
  ZR_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh", cfg_path, ": activation_function ", act.dump(),
           " is not supported (zerorun's GELU is the tanh approximation: gelu_new)");
  const json inner = cfg.value("n_inner", json());
  ZR_CHECK(inner.is_null() || inner == json(4 * s.n_embd), cfg_path, ": n_inner ", inner.dump(),
           " is not supported (zerorun's MLP is 4 x n_embd = ", 4 * s.n_embd, ")");
  for (const char* k : {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"})
    ZR_CHECK(cfg.value(k, json(false)) == json(false), cfg_path, ": ", k, " = true is not supported");
  ZR_CHECK(cfg.value("scale_attn_weights", json(true)) == json(true), cfg_path,
           ": scale_attn_weights = false is not supported");
  const double eps = cfg_eps(cfg, cfg_path, "layer_norm_epsilon", 1e-5);
  Model m = build_gpt2(s, 0);
  for (auto& n : m.graph.nodes)
    if (n.op == "layernorm") n.attrs["eps"] = eps;
  load_hf_weights(m, dir, "a GPT-2 of " + std::to_string(s.n_layer) + " layers, n_embd " + std::to_string(s.n_embd),
                  s.tied, notes);
  return m;
}

Model llama_from(const std::string& dir, const std::string& cfg_path, const json& cfg,
                 std::vector<std::string>* notes) {
  ZR_CHECK(cfg.value("model_type", json()) == "llama", cfg_path, ": model_type must be \"llama\", got ",
           cfg.value("model_type", json()).dump());
  LlamaSpec s;
  s.vocab = cfg_size(cfg, cfg_path, "vocab_size", nullptr);
  s.n_ctx = cfg_size(cfg, cfg_path, "max_position_embeddings", nullptr, 2048);
  s.n_embd = cfg_size(cfg, cfg_path, "hidden_size", nullptr);
  s.n_layer = cfg_size(cfg, cfg_path, "num_hidden_layers", nullptr);
  s.n_head = cfg_size(cfg, cfg_path, "num_attention_heads", nullptr);
  s.ffn = cfg_size(cfg, cfg_path, "intermediate_size", nullptr);
  s.n_kv_head = cfg_size(cfg, cfg_path, "num_key_value_heads", nullptr, s.n_head);
  ZR_CHECK(s.n_head % s.n_kv_head == 0, cfg_path, ": num_key_value_heads ", s.n_kv_head,
           " must divide num_attention_heads ", s.n_head);
  ZR_CHECK(s.n_embd % s.n_head == 0, cfg_path, ": hidden_size ", s.n_embd, " is not divisible by num_attention_heads ",
           s.n_head);
  s.tied = cfg.value("tie_word_embeddings", json(false)) == json(true);
  s.rms_eps = cfg_eps(cfg, cfg_path, "rms_norm_eps", 1e-6);
  const json act = cfg.value("hidden_act", json("silu"));
  ZR_CHECK(act == "silu", cfg_path, ": hidden_act ", act.dump(),
           " is not supported (zerorun's Llama MLP is SwiGLU: silu)");
  for (const char* k : {"attention_bias", "mlp_bias"})
    ZR_CHECK(cfg.value(k, json(false)) == json(false), cfg_path, ": ", k, " = ", cfg[k].dump(),
             " is not supported (zerorun's Llama has no biases)");
  const json hd = cfg.value("head_dim", json());
  ZR_CHECK(hd.is_null() || (s.n_embd % s.n_head == 0 && hd == json(s.n_embd / s.n_head)), cfg_path, ": head_dim ",
           hd.dump(), " is not supported (zerorun's head size is hidden_size / num_attention_heads)");
  // The rotary base: rope_theta (transformers 4), or rope_parameters {"rope_type": "default", "rope_theta"} (5);
  // scaled variants (linear, dynamic, llama3, yarn) compute other angles.
  json theta = cfg.value("rope_theta", json(10000.0));
  const json scaling = cfg.value("rope_scaling", json());
  const json params = cfg.value("rope_parameters", json());
  for (const auto& [key, rp] :
       {std::pair<const char*, const json&>{"rope_scaling", scaling}, {"rope_parameters", params}}) {
    if (rp.is_null()) continue;
    ZR_CHECK(rp.is_object(), cfg_path, ": ", key, " must be an object or null");
    const json type = rp.value("rope_type", rp.value("type", json("default")));
    ZR_CHECK(type == "default", cfg_path, ": ", key, " rope_type ", type.dump(),
             " is not supported (zerorun's rotary embedding is the unscaled default)");
    if (rp.contains("rope_theta")) theta = rp["rope_theta"];
  }
  ZR_CHECK(theta.is_number() && theta.get<double>() > 1, cfg_path, ": rope_theta must be a number > 1, got ",
           theta.dump());
  s.rope_theta = theta.get<double>();
  Model m = build_llama(s, 0);
  load_hf_weights(m, dir,
                  "a Llama of " + std::to_string(s.n_layer) + " layers, hidden_size " + std::to_string(s.n_embd),
                  s.tied, notes);
  return m;
}

std::string config_path(const std::string& dir) { return (std::filesystem::path(dir) / "config.json").string(); }
}  // namespace

Model import_hf_gpt2(const std::string& dir, std::vector<std::string>* notes) {
  const std::string cfg_path = config_path(dir);
  return gpt2_from(dir, cfg_path, read_config(dir, cfg_path), notes);
}

Model import_hf_llama(const std::string& dir, std::vector<std::string>* notes) {
  const std::string cfg_path = config_path(dir);
  return llama_from(dir, cfg_path, read_config(dir, cfg_path), notes);
}

Model import_hf(const std::string& dir, std::vector<std::string>* notes) {
  const std::string cfg_path = config_path(dir);
  const json cfg = read_config(dir, cfg_path);
  const json type = cfg.value("model_type", json());
  if (type == "gpt2") return gpt2_from(dir, cfg_path, cfg, notes);
  if (type == "llama") return llama_from(dir, cfg_path, cfg, notes);
  ZR_FAIL(cfg_path, ": model_type must be \"gpt2\" or \"llama\" (the transformers architectures zerorun imports), got ",
          type.dump());
}

}  // namespace zerorun
