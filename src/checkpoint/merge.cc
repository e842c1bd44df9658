// `zerorun merge`: rebuilds full weights from ZeRO shards (like DeepSpeed's
// zero_to_fp32) without MPI or a GPU, one parameter at a time, into
// model.safetensors (fp32 or bf16), a model.bin that `zerorun train` can
// start from, and config.json for known architectures (gpt2 in the layout
// transformers' GPT2LMHeadModel loads).
#include "zerorun/merge.h"

#include <sys/resource.h>

#include <cstdio>

#include "zerorun/checkpoint.h"
#include "zerorun/fsutil.h"
#include "zerorun/graph.h"
#include "zerorun/model.h"
#include "zerorun/safetensors.h"

namespace zerorun {

namespace {
// The name HF's GPT2LMHeadModel saves a zerorun gpt2 parameter under.
std::string hf_name(const std::string& name) { return name == "lm_head.weight" ? name : "transformer." + name; }

// config.json: for gpt2 in HF layout a transformers GPT2Config; otherwise the architecture's sizes and a note.
nlohmann::json hf_config(const nlohmann::json& graph, bool hf_layout) {
  const nlohmann::json none;
  std::string arch = graph.value("arch", none).is_string() ? graph["arch"].get<std::string>() : "";
  nlohmann::json ac = graph.value("arch_config", none);
  if (!ac.is_object()) ac = nlohmann::json::object();
  if (arch == "gpt2" && !hf_layout) {
    ac["zerorun_arch"] = "gpt2";
    ac["zerorun_note"] =
        "zerorun layout (merge --layout zerorun): torch.nn.Linear [out, in] weights, not transformers' Conv1D "
        "[in, out]; `zerorun merge` without --layout writes what GPT2LMHeadModel loads";
    return ac;
  }
  if (arch == "gpt2") {
    ac["model_type"] = "gpt2";
    ac["architectures"] = {"GPT2LMHeadModel"};
    for (const char* p : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) ac[p] = 0.0;  // zerorun trains without dropout
    ac["n_ctx"] = ac.value("n_positions", 1024);
    ac["activation_function"] = "gelu_new";
    ac["layer_norm_epsilon"] = 1e-5;
    return ac;
  }
  if (arch == "llama") {  // no "model_type": transformers' Llama would load this with wrong weights, not fail
    ac["zerorun_arch"] = "llama";
    ac["rms_norm_eps"] = 1e-6;
    ac["hidden_act"] = "silu";
    ac["zerorun_note"] =
        "not loadable as a transformers LlamaForCausalLM: learned position table (embed_positions.weight) instead "
        "of rotary embeddings, one fused self_attn.qkv_proj instead of q/k/v_proj; weights are torch.nn.Linear "
        "[out, in]";
    return ac;
  }
  if (arch == "mlp") return ac;
  return nullptr;
}
}  // namespace

MergeResult merge_checkpoint(const std::string& ckpt, const std::string& tag, const std::string& out_dir, DType dtype,
                             MergeLayout layout) {
  ZR_CHECK(dtype == DType::F32 || dtype == DType::BF16, "merge: --dtype must be fp32 or bf16");
  rusage ru0{};
  getrusage(RUSAGE_SELF, &ru0);
  const std::string dir = ckpt::resolve_dir(ckpt, tag);
  nlohmann::json m = ckpt::read_manifest(dir, true);
  Graph g = Graph::from_json(m.at("graph"));
  make_dirs(out_dir);
  std::vector<std::string> order = g.param_order();
  MergeResult r;
  r.hf_layout = layout == MergeLayout::Hf && g.meta.value("arch", nlohmann::json()) == "gpt2";
  std::vector<SafetensorsStreamWriter::Decl> st_decl, bin_decl;
  for (auto& name : order) {
    ZR_CHECK(m["params"].contains(name), dir, "/manifest.json: graph parameter '", name, "' has no slices");
    Shape shape = m["params"][name]["shape"].get<Shape>();
    const bool transpose = r.hf_layout && hf_gpt2_conv1d(name) && shape.size() == 2;
    st_decl.push_back({r.hf_layout ? hf_name(name) : name, dtype, transpose ? Shape{shape[1], shape[0]} : shape});
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
    bin.append(name, buf.data(), buf.size() * 4);
    const Shape shape = m["params"][name]["shape"].get<Shape>();
    if (r.hf_layout && hf_gpt2_conv1d(name) && shape.size() == 2) {  // [out, in] -> [in, out], in place of buf
      std::vector<float> t(buf.size());
      const int64_t rows = shape[0], cols = shape[1];
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j)
          t[static_cast<size_t>(j * rows + i)] = buf[static_cast<size_t>(i * cols + j)];
      buf.swap(t);
    }
    const std::string out_name = r.hf_layout ? hf_name(name) : name;
    if (dtype == DType::F32) {
      st.append(out_name, buf.data(), buf.size() * 4);
    } else {
      std::vector<uint16_t> h(buf.size());
      for (size_t i = 0; i < buf.size(); ++i) h[i] = f32_to_bf16(buf[i]);
      st.append(out_name, h.data(), h.size() * 2);
    }
    r.params += n;
    r.largest = std::max(r.largest, n);
  }
  st.commit();
  bin.commit();
  nlohmann::json cfg = hf_config(m["graph"], r.hf_layout);
  if (!cfg.is_null()) {
    r.config_json = out_dir + "/config.json";
    write_file_atomic(r.config_json, cfg.dump(2) + "\n");
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  r.peak_rss_bytes = static_cast<int64_t>(ru.ru_maxrss) * 1024;
  r.baseline_rss_bytes = static_cast<int64_t>(ru0.ru_maxrss) * 1024;
  return r;
}

}  // namespace zerorun
