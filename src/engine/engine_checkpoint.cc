// The engine's side of a checkpoint: its counters, settings and client state in the manifest, the checks that a
// checkpoint fits this run, and the counters restored. The shards themselves are written and read by
// src/checkpoint through ZeRO's state (zero::ShardedState) and the optimizer.
#include "zerorun/checkpoint.h"
#include "zerorun/engine.h"

namespace zerorun {

std::string Engine::save_checkpoint(const std::string& save_dir, const nlohmann::json& client_state) {
  settle();
  const std::string tag = "global_step" + std::to_string(global_step_);
  auto fields = [&] {
    nlohmann::json m;
    m["format"] = "zerorun.checkpoint";
    m["version"] = 1;
    m["tag"] = tag;
    m["step"] = global_step_;
    m["updates"] = updates_;
    m["samples"] = samples_seen();
    m["world_size"] = comm_.size();
    m["zero_stage"] = stage_;
    m["precision"] = precision_name(cfg_.precision);
    m["graph_hash"] = model_.graph_hash;
    m["graph"] = model_.graph.to_json();
    m["config"] = cfg_.raw;
    m["optimizer"] = {{"type", cfg_.optimizer.type}, {"steps", opt_->steps()}, {"states", json::array()}};
    for (auto& [n, t] : opt_->state()) m["optimizer"]["states"].push_back(n);
    m["loss_scaler"] = scaler_->state();
    m["scheduler"] = {{"type", cfg_.scheduler.type}, {"last_batch_iteration", updates_ - 1}};
    m["data"] = {{"next_sample", samples_seen()}, {"seed", cfg_.train.seed}};
    m["rng"] = {{"data_seed", cfg_.train.seed}, {"note", "training uses no other random state"}};
    m["client_state"] = client_state;
    return m;
  };
  ckpt::save(save_dir, tag, fields, *state_, *opt_, comm_);
  return tag;
}

nlohmann::json Engine::load_checkpoint(const std::string& save_dir, const std::string& tag) {
  settle();
  const std::string dir = ckpt::resolve_dir(save_dir, tag);
  nlohmann::json m = ckpt::read_manifest(dir, false);
  const std::string mp = dir + "/manifest.json";
  ZR_CHECK(m["graph_hash"] == model_.graph_hash, mp, ": checkpoint is of another model (graph ",
           m["graph_hash"].get<std::string>(), ", this model.bin has graph ", model_.graph_hash, ")");
  ZR_CHECK(m["optimizer"]["type"] == cfg_.optimizer.type, mp, ": checkpoint optimizer is ",
           m["optimizer"]["type"].get<std::string>(), " but the config asks for ", cfg_.optimizer.type);
  ckpt::load_shards(dir, m, *state_, *opt_);
  global_step_ = m["step"].get<int64_t>();
  updates_ = m["updates"].get<int64_t>();
  // The data goes on where it stopped, also when train_batch_size changed (another world size at a fixed micro
  // batch): step * batch would skip or repeat samples then.
  samples_seen_ = m.contains("data") && m["data"].contains("next_sample") ? m["data"]["next_sample"].get<int64_t>()
                  : m.contains("samples")                                 ? m["samples"].get<int64_t>()
                                                                          : global_step_ * cfg_.batch;
  opt_->set_steps(m["optimizer"]["steps"].get<int64_t>());
  ZR_WITH_CONTEXT(mp, scaler_->load_state(m["loss_scaler"]));
  state_->after_load();  // persistent stage-3 groups gathered again, the 16-bit copies from the loaded weights
  comm_.barrier();
  return m.value("client_state", nlohmann::json::object());
}

}  // namespace zerorun
