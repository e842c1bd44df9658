// `zerorun merge`: rebuilds full weights from ZeRO shards (like DeepSpeed's
// zero_to_fp32) without MPI or a GPU, one parameter at a time, into
// model.safetensors (fp32 or bf16), a model.bin that `zerorun train` can
// start from, and config.json for known architectures.
#include "zerorun/merge.h"

#include <sys/resource.h>

#include <cstdio>

#include "zerorun/checkpoint.h"
#include "zerorun/fsutil.h"
#include "zerorun/graph.h"
#include "zerorun/safetensors.h"

namespace zerorun {

namespace {
nlohmann::json hf_config(const nlohmann::json& graph) {
  const nlohmann::json none;
  std::string arch = graph.value("arch", none).is_string() ? graph["arch"].get<std::string>() : "";
  nlohmann::json ac = graph.value("arch_config", none);
  if (!ac.is_object()) ac = nlohmann::json::object();
  if (arch == "gpt2") {
    ac["model_type"] = "gpt2";
    ac["architectures"] = {"GPT2LMHeadModel"};
    ac["n_ctx"] = ac.value("n_positions", 1024);
    ac["activation_function"] = "gelu_new";
    ac["layer_norm_epsilon"] = 1e-5;
    ac["zerorun_weight_layout"] = "torch.nn.Linear [out, in] (HF GPT-2 Conv1D weights are the transpose)";
    return ac;
  }
  if (arch == "llama") {
    ac["model_type"] = "llama";
    ac["rms_norm_eps"] = 1e-6;
    ac["hidden_act"] = "silu";
    ac["zerorun_positions"] = "learned table (embed_positions.weight), not rotary";
    return ac;
  }
  if (arch == "mlp") return ac;
  return nullptr;
}
}  // namespace

MergeResult merge_checkpoint(const std::string& ckpt, const std::string& tag, const std::string& out_dir, DType dtype) {
  ZR_CHECK(dtype == DType::F32 || dtype == DType::BF16, "merge: --dtype must be fp32 or bf16");
  rusage ru0{};
  getrusage(RUSAGE_SELF, &ru0);
  const std::string dir = ckpt::resolve_dir(ckpt, tag);
  nlohmann::json m = ckpt::read_manifest(dir, true);
  Graph g = Graph::from_json(m.at("graph"));
  make_dirs(out_dir);
  std::vector<std::string> order = g.param_order();
  std::vector<SafetensorsStreamWriter::Decl> st_decl, bin_decl;
  for (auto& name : order) {
    ZR_CHECK(m["params"].contains(name), dir, "/manifest.json: graph parameter '", name, "' has no slices");
    Shape shape = m["params"][name]["shape"].get<Shape>();
    st_decl.push_back({name, dtype, shape});
    bin_decl.push_back({name, DType::F32, shape});
  }
  MergeResult r;
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
    if (dtype == DType::F32) {
      st.append(name, buf.data(), buf.size() * 4);
    } else {
      std::vector<uint16_t> h(buf.size());
      for (size_t i = 0; i < buf.size(); ++i) h[i] = f32_to_bf16(buf[i]);
      st.append(name, h.data(), h.size() * 2);
    }
    r.params += n;
    r.largest = std::max(r.largest, n);
  }
  st.commit();
  bin.commit();
  nlohmann::json cfg = hf_config(m["graph"]);
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
