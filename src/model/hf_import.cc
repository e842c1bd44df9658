// `zerorun import`: a transformers GPT-2 or Llama checkpoint directory (config.json + model.safetensors, or a
// sharded model.safetensors.index.json) -> model.bin, so pretrained weights can be fine-tuned. The inverse of
// merge's default layout through include/zerorun/hf_layout.h: GPT-2's "transformer." names and Conv1D weights
// [in, out]; Llama's "model." names and q/k/v_proj stacked into qkv_proj. Config the zerorun graph would not
// compute the same way is an error naming the key.
#include <cmath>
#include <filesystem>
#include <set>

#include "zerorun/fsutil.h"
#include "zerorun/platform.h"
#include "zerorun/hf_arch.h"
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
  ZR_CHECK(is_directory(dir), dir, ": not a directory (give the transformers checkpoint directory)");
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
  const std::string single = platform::generic_path(platform::to_path(dir) / "model.safetensors");
  const std::string index = platform::generic_path(platform::to_path(dir) / "model.safetensors.index.json");
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
    for (auto& f : shards) files.push_back(platform::generic_path(platform::to_path(dir) / f));
  } else {
    ZR_FAIL(dir, ": has no model.safetensors or model.safetensors.index.json",
            path_exists(platform::generic_path(platform::to_path(dir) / "pytorch_model.bin"))
                ? " (only pytorch_model.bin, a pickle zerorun does not read: save it with safe_serialization=True, "
                  "or convert it with transformers)"
                : "");
  }
  // By name without the base model's prefix ("transformer." / "model."; a Gemma 3 multimodal checkpoint's
  // language model under "language_model.model." (transformers 4) or "model.language_model." (5)): checkpoints of
  // the bare GPT2Model / LlamaModel have none.
  auto bare = [](const std::string& n) {
    for (const std::string pre :
         {"model.language_model.", "language_model.model.", "language_model.", "transformer.", "model."})
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
  std::set<std::string> used;
  std::set<DType> stored;  // the checkpoint's dtypes: model.bin keeps them (bf16 stays bf16, not widened)
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
      stored.insert(e.dtype);
      for (int64_t i = 0; i < t.numel(); ++i)
        ZR_CHECK(std::isfinite(t.f32()[i]), sf.path, ": tensor '", e.name, "' holds a non-finite value (", t.f32()[i],
                 " at element ", i, ")");
      hf_copy_piece(p, cols, t.f32(), dst.f32(), false);
      used.insert(it->first);
    }
  }
  // Every tensor of the checkpoint is a weight of the model: one that is not would be dropped silently (a Qwen2
  // checkpoint labelled llama would lose its biases). Gemma 3's vision tower is left out by name.
  std::string unused;
  int64_t vision = 0;
  for (auto& [name, pe] : entries) {
    if (used.count(name) || is_buffer(name)) continue;
    if (tied && name == "lm_head.weight") continue;  // transformers may save the tied copy too
    if (name.rfind("vision_tower.", 0) == 0 || name.rfind("multi_modal_projector.", 0) == 0) {
      ++vision;
      continue;
    }
    unused += (unused.empty() ? "" : ", ") + pe.second.name;
  }
  ZR_CHECK(unused.empty(), dir, ": tensors that are not weights of ", what, ": ", unused,
           " (is config.json's model_type right?)");
  m.dtype = stored.size() == 1 ? *stored.begin() : DType::F32;  // mixed dtypes: f32 holds every value exactly
  if (vision && notes)
    notes->push_back("left out " + std::to_string(vision) +
                     " tensors of the vision tower and projector: zerorun trains the language model");
  finalize_model(m);
}

// What merge writes back beside the weights: generation_config.json as it was, and where the tokenizer files are
// (merge copies them from there; their sizes and checksums tell a changed file).
void keep_hf_files(Model& m, const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string gen = platform::generic_path(platform::to_path(dir) / "generation_config.json");
  if (path_exists(gen)) m.graph.meta["hf_generation_config"] = load_json_file_strict(gen);
  json files = json::object();
  for (const char* f : hf_tokenizer_files()) {
    const fs::path p = platform::to_path(dir) / f;
    if (fs::is_regular_file(p))
      files[f] = {{"bytes", fs::file_size(p)}, {"crc32", file_crc32(platform::generic_path(p))}};
  }
  if (!files.empty())
    m.graph.meta["hf_tokenizer"] = {
        {"dir", platform::generic_path(fs::absolute(platform::to_path(dir)).lexically_normal())}, {"files", files}};
}

// The architectures' imports from config.json already read (cfg, from cfg_path).
Model gpt2_from(const std::string& dir, const std::string& cfg_path, const json& cfg, std::vector<std::string>* notes,
                bool no_dropout) {
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
  // GPT-2's dropouts (0.1 in every published config.json), applied in training unless --no_dropout.
  s.attn_pdrop = hf_dropout(cfg, cfg_path, "attn_pdrop", no_dropout, notes);
  s.resid_pdrop = hf_dropout(cfg, cfg_path, "resid_pdrop", no_dropout, notes);
  s.embd_pdrop = hf_dropout(cfg, cfg_path, "embd_pdrop", no_dropout, notes);
  const double eps = cfg_eps(cfg, cfg_path, "layer_norm_epsilon", 1e-5);
  Model m = build_gpt2(s, 0);
  for (auto& n : m.graph.nodes)
    if (n.op == "layernorm") n.attrs["eps"] = eps;
  load_hf_weights(m, dir, "a GPT-2 of " + std::to_string(s.n_layer) + " layers, n_embd " + std::to_string(s.n_embd),
                  s.tied, notes);
  return m;
}

// Any decoder model_type of hf_arch.h (llama, mistral, qwen2, qwen3, phi3, olmo2, gemma, gemma2, gemma3).
Model decoder_from(const std::string& dir, const std::string& cfg_path, const json& cfg,
                   std::vector<std::string>* notes, bool no_dropout) {
  LlamaSpec s = hf_decoder_spec(cfg, cfg_path, notes, no_dropout);
  if (no_dropout)  // merge writes the probabilities zerorun trained with
    for (const char* k : {"attention_dropout", "resid_pdrop", "embd_pdrop"})
      if (s.hf_config.contains(k)) s.hf_config[k] = 0.0;
  Model m = build_llama(s, 0);
  keep_hf_files(m, dir);
  load_hf_weights(
      m, dir,
      "a " + s.model_type + " of " + std::to_string(s.n_layer) + " layers, hidden_size " + std::to_string(s.n_embd),
      s.tied, notes);
  return m;
}

std::string config_path(const std::string& dir) {
  return platform::generic_path(platform::to_path(dir) / "config.json");
}
}  // namespace

Model import_hf_gpt2(const std::string& dir, std::vector<std::string>* notes, bool no_dropout) {
  const std::string cfg_path = config_path(dir);
  return gpt2_from(dir, cfg_path, read_config(dir, cfg_path), notes, no_dropout);
}

Model import_hf_llama(const std::string& dir, std::vector<std::string>* notes, bool no_dropout) {
  const std::string cfg_path = config_path(dir);
  const json cfg = read_config(dir, cfg_path);
  ZR_CHECK(cfg.value("model_type", json()) == "llama", cfg_path, ": model_type must be \"llama\", got ",
           cfg.value("model_type", json()).dump());
  return decoder_from(dir, cfg_path, cfg, notes, no_dropout);
}

Model import_hf(const std::string& dir, std::vector<std::string>* notes, bool no_dropout) {
  const std::string cfg_path = config_path(dir);
  const json cfg = read_config(dir, cfg_path);
  const json type = cfg.value("model_type", json());
  if (type == "gpt2") return gpt2_from(dir, cfg_path, cfg, notes, no_dropout);
  if (type.is_string() && hf_decoder_type(type.get<std::string>()))
    return decoder_from(dir, cfg_path, cfg, notes, no_dropout);
  ZR_FAIL(cfg_path, ": model_type ", type.dump(),
          " is not one zerorun imports (gpt2, llama, mistral, qwen2, qwen3, phi3, olmo2, gemma, gemma2, gemma3, "
          "gemma3_text)");
}

}  // namespace zerorun
