// `zerorun merge`: rebuilds full weights from ZeRO shards (like DeepSpeed's
// zero_to_fp32) without MPI or a GPU, one parameter at a time, into
// model.safetensors (fp32 or bf16), a model.bin that `zerorun train` can
// start from, and config.json for known architectures (gpt2 and llama in the
// layout transformers' GPT2LMHeadModel / LlamaForCausalLM load).
#include "zerorun/merge.h"

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "zerorun/checkpoint.h"
#include "zerorun/fsutil.h"
#include "zerorun/graph.h"
#include "zerorun/hf_layout.h"
#include "zerorun/model.h"
#include "zerorun/platform.h"
#include "zerorun/safetensors.h"

namespace zerorun {

namespace {
// config.json: in transformers' layout, the class's config; otherwise the architecture's sizes and a note.
nlohmann::json merge_config(const Graph& g, bool hf_layout) {
  if (hf_layout) return hf_config_json(g);
  const nlohmann::json none;
  const std::string arch = g.meta.value("arch", none).is_string() ? g.meta["arch"].get<std::string>() : "";
  nlohmann::json ac = g.meta.value("arch_config", none);
  if (!ac.is_object()) ac = nlohmann::json::object();
  if (arch == "mlp") return ac;
  if (arch != "gpt2" && arch != "llama") return nullptr;
  ac["zerorun_arch"] = arch;  // no "model_type": transformers would load these names and layouts wrongly, not fail
  const std::string cls = hf_class(g);
  if (cls.empty())
    ac["zerorun_note"] =
        "not loadable as a transformers LlamaForCausalLM: a model.bin from before rotary embeddings (learned "
        "position table embed_positions.weight, one fused self_attn.qkv_proj); weights are torch.nn.Linear "
        "[out, in]";
  else
    ac["zerorun_note"] =
        "zerorun layout (merge --layout zerorun): model.bin's names and torch.nn.Linear [out, in] "
        "weights; `zerorun merge` without --layout writes what transformers' " +
        cls + " loads";
  return ac;
}
// generation_config.json (the imported one, else the config's token ids) and the imported directory's tokenizer
// files, unchanged since the import (sizes and checksums), so transformers' Auto classes load the folder as it is.
void write_hf_extras(const Graph& g, const nlohmann::json& cfg, const std::string& out_dir, MergeResult& r) {
  nlohmann::json gen = g.meta.value("hf_generation_config", nlohmann::json());
  if (!gen.is_object()) {
    gen = {{"_from_model_config", true}};
    for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
      if (cfg.contains(k) && !cfg[k].is_null()) gen[k] = cfg[k];
  }
  write_file_atomic(out_dir + "/generation_config.json", gen.dump(2) + "\n");
  const nlohmann::json tok = g.meta.value("hf_tokenizer", nlohmann::json());
  if (!tok.is_object()) {
    r.notes.push_back("no tokenizer files: the model was not imported from a transformers directory that had them");
    return;
  }
  const std::string src = tok.value("dir", std::string());
  for (auto& [f, info] : tok.at("files").items()) {
    const std::string from = src + "/" + f;
    if (!path_exists(from) || regular_file_size(from) != info.value("bytes", uint64_t{0}) ||
        file_crc32(from) != info.value("crc32", uint32_t{0})) {
      r.notes.push_back("tokenizer file " + from + " is gone or changed since the import: not copied (copy the " +
                        "tokenizer of the imported checkpoint into " + out_dir + " by hand)");
      continue;
    }
    write_file_atomic(out_dir + "/" + f, read_file(from));
    r.tokenizer_files.push_back(f);
  }
}
}  // namespace

MergeResult merge_checkpoint(const std::string& ckpt, const std::string& tag, const std::string& out_dir, DType dtype,
                             MergeLayout layout) {
  ZR_CHECK(dtype == DType::F32 || dtype == DType::BF16, "merge: --dtype must be fp32 or bf16");
  const uint64_t rss0 = platform::peak_rss_bytes();
  const std::string dir = ckpt::resolve_dir(ckpt, tag);
  nlohmann::json m = ckpt::read_manifest(dir, true);
  Graph g = Graph::from_json(m.at("graph"));
  make_dirs(out_dir);
  std::vector<std::string> order = g.param_order();
  MergeResult r;
  r.hf_class = layout == MergeLayout::Hf ? hf_class(g) : "";
  std::vector<SafetensorsStreamWriter::Decl> st_decl, bin_decl;
  std::map<std::string, std::vector<HfPiece>> pieces;  // each parameter's tensors in model.safetensors
  for (auto& name : order) {
    ZR_CHECK(m["params"].contains(name), dir, "/manifest.json: graph parameter '", name, "' has no slices");
    Shape shape = m["params"][name]["shape"].get<Shape>();
    const int64_t rows = shape.empty() ? 1 : shape[0];
    pieces[name] = r.hf_layout() ? hf_pieces(g, name, shape) : std::vector<HfPiece>{{name, shape, 0, rows, false}};
    for (auto& p : pieces[name])  // a tensor fused from several parameters (Phi-3's gate_up_proj) is declared once
      if (st_decl.empty() || st_decl.back().name != p.name) st_decl.push_back({p.name, dtype, p.shape});
    bin_decl.push_back({name, DType::F32, shape});
  }
  r.dir = dir;
  r.safetensors = out_dir + "/model.safetensors";
  r.model_bin = out_dir + "/model.bin";
  SafetensorsStreamWriter st(r.safetensors, st_decl,
                             {{"format", "pt"}, {"zerorun_step", std::to_string(m["step"].get<int64_t>())}});
  SafetensorsStreamWriter bin(r.model_bin, bin_decl,
                              {{"format", "zerorun.model"}, {"version", "1"}, {"graph", g.to_json().dump()}});
  std::map<std::string, SafetensorsFile> headers;
  for (auto& name : order) {
    int64_t n = m["params"][name]["numel"].get<int64_t>();
    std::vector<float> buf(static_cast<size_t>(n));
    for (auto& pc : ckpt::pieces_for(m, name, "master", 0, n)) {
      auto it = headers.find(pc.file);
      if (it == headers.end()) it = headers.emplace(pc.file, read_safetensors_header(dir + "/" + pc.file)).first;
      const SafetensorsEntry* e = it->second.find(pc.tensor);
      ZR_CHECK(e && e->dtype == DType::F32 && shape_numel(e->shape) == pc.stored, dir, "/", pc.file,
               ": has no f32 tensor '", pc.tensor, "' of ", pc.stored, " elements (the manifest's slice)");
      read_safetensors_range(it->second, *e, pc.src_first, pc.count, buf.data() + pc.dst_offset);
    }
    for (int64_t i = 0; i < n; ++i)  // merge never writes NaN/Inf weights (model.bin loading would reject them)
      ZR_CHECK(std::isfinite(buf[static_cast<size_t>(i)]), dir, ": parameter '", name,
               "' holds a non-finite value (NaN or Inf) at element ", i,
               " of its fp32 master weights: the run diverged or a shard is damaged; nothing was written");
    bin.append(name, buf.data(), buf.size() * 4);
    const Shape shape = m["params"][name]["shape"].get<Shape>();
    const int64_t rows = shape.empty() ? 1 : shape[0], cols = n / rows;
    std::vector<float> copy;
    for (const HfPiece& p : pieces[name]) {
      const size_t count = static_cast<size_t>(p.rows * cols);
      const float* piece = buf.data() + p.row0 * cols;  // rows of buf as they are: no copy
      if (p.transpose) {
        copy.resize(count);
        hf_copy_piece(p, cols, buf.data(), copy.data(), true);
        piece = copy.data();
      }
      if (dtype == DType::F32) {
        st.append(p.name, piece, count * 4);
      } else {
        std::vector<uint16_t> h(count);
        for (size_t i = 0; i < count; ++i) h[i] = f32_to_bf16(piece[i]);
        st.append(p.name, h.data(), h.size() * 2);
      }
    }
    r.params += n;
    r.largest = std::max(r.largest, n);
  }
  st.commit();
  bin.commit();
  nlohmann::json cfg = merge_config(g, r.hf_layout());
  if (!cfg.is_null()) {
    r.config_json = out_dir + "/config.json";
    write_file_atomic(r.config_json, cfg.dump(2) + "\n");
  }
  if (r.hf_layout() && hf_class(g) != "GPT2LMHeadModel") write_hf_extras(g, cfg, out_dir, r);
  r.peak_rss_bytes = static_cast<int64_t>(platform::peak_rss_bytes());
  r.baseline_rss_bytes = static_cast<int64_t>(rss0);
  return r;
}

}  // namespace zerorun
