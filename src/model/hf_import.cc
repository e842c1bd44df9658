// `zerorun import`: a transformers GPT-2 checkpoint directory (config.json + model.safetensors, or a sharded
// model.safetensors.index.json) -> model.bin, so pretrained weights can be fine-tuned. The inverse of merge's
// default layout: "transformer." names, Conv1D weights [in, out] transposed to torch.nn.Linear's [out, in].
#include <cmath>
#include <filesystem>
#include <set>

#include "zerorun/fsutil.h"
#include "zerorun/model.h"
#include "zerorun/safetensors.h"
#include "zerorun/strict_json.h"

namespace zerorun {

namespace {

// Buffers transformers keeps in some GPT-2 checkpoints (causal masks), not weights.
bool is_buffer(const std::string& name) {
  for (const std::string s : {".attn.bias", ".attn.masked_bias"})
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) return true;
  return false;
}

}  // namespace

bool hf_gpt2_conv1d(const std::string& name) {
  for (const std::string s : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) return true;
  return false;
}

Model import_hf_gpt2(const std::string& dir, std::vector<std::string>* notes) {
  namespace fs = std::filesystem;
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  ZR_CHECK(fs::is_directory(dir), dir, ": not a directory (give the transformers checkpoint directory)");
  ZR_CHECK(path_exists(cfg_path), dir, ": has no config.json");
  const json cfg = load_json_file_strict(cfg_path);
  ZR_CHECK(cfg.is_object() && cfg.value("model_type", json()) == "gpt2", cfg_path,
           ": model_type must be \"gpt2\" (zerorun imports transformers GPT-2 checkpoints), got ",
           cfg.is_object() ? cfg.value("model_type", json()).dump() : cfg.dump());
  auto size = [&](const char* k, const char* alt) {
    const char* key = cfg.contains(k) || !alt ? k : alt;
    ZR_CHECK(cfg.contains(key) && cfg[key].is_number_integer() && cfg[key].get<int64_t>() >= 1 &&
                 cfg[key].get<int64_t>() <= (int64_t{1} << 24),
             cfg_path, ": '", k, "' must be a positive integer");
    return cfg[key].get<int64_t>();
  };
  Gpt2Spec s;
  s.vocab = size("vocab_size", nullptr);
  s.n_ctx = size("n_positions", "n_ctx");
  s.n_embd = size("n_embd", "hidden_size");
  s.n_layer = size("n_layer", "num_hidden_layers");
  s.n_head = size("n_head", "num_attention_heads");
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
  const json eps = cfg.value("layer_norm_epsilon", json(1e-5));
  ZR_CHECK(eps.is_number() && eps.get<double>() > 0 && eps.get<double>() < 1, cfg_path,
           ": layer_norm_epsilon must be a small positive number, got ", eps.dump());

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
  std::map<std::string, std::pair<SafetensorsFile, SafetensorsEntry>> entries;  // name without "transformer."
  for (auto& f : files) {
    SafetensorsFile sf = read_safetensors_header(f);
    for (auto& e : sf.entries) {
      std::string n = e.name.rfind("transformer.", 0) == 0 ? e.name.substr(12) : e.name;
      ZR_CHECK(!entries.count(n), f, ": tensor '", e.name, "' is given twice (also in ",
               entries.count(n) ? entries[n].first.path : "", ")");
      entries[n] = {sf, e};
    }
  }

  Model m = build_gpt2(s, 0);
  const double eps_v = eps.get<double>();
  for (auto& n : m.graph.nodes)
    if (n.op == "layernorm") n.attrs["eps"] = eps_v;
  for (const std::string& name : m.tensor_names) {
    auto it = entries.find(name);
    ZR_CHECK(it != entries.end(), dir, ": has no tensor '", name == "lm_head.weight" ? name : "transformer." + name,
             "' (a GPT-2 of ", s.n_layer, " layers, n_embd ", s.n_embd, " needs it)");
    const SafetensorsFile& sf = it->second.first;
    const SafetensorsEntry& e = it->second.second;
    Shape want = m.tensors.at(name).shape();
    const bool transpose = hf_gpt2_conv1d(name);
    Shape stored = transpose ? Shape{want[1], want[0]} : want;
    ZR_CHECK(e.shape == stored, sf.path, ": tensor '", e.name, "' has shape ", shape_str(e.shape), ", expected ",
             shape_str(stored), transpose ? " (Conv1D weights are [in, out])" : "");
    Tensor t = read_safetensors_f32(sf, e);
    if (transpose) {
      Tensor out = Tensor::empty(want, DType::F32, MemCategory::Buffers);
      const float* src = t.f32();
      float* dst = out.f32();
      const int64_t rows = want[0], cols = want[1];  // dst [out, in] from src [in, out]
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) dst[i * cols + j] = src[j * rows + i];
      t = out;
    }
    m.tensors[name] = t;
    entries.erase(it);
  }
  std::string ignored;
  for (auto& [name, pe] : entries) {
    if (is_buffer(name)) continue;
    if (s.tied && name == "lm_head.weight") continue;  // transformers may save the tied copy too
    ignored += (ignored.empty() ? "" : ", ") + pe.second.name;
  }
  if (!ignored.empty() && notes) notes->push_back("ignored tensors that are not GPT-2 weights: " + ignored);
  finalize_model(m);
  return m;
}

}  // namespace zerorun
