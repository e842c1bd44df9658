// DeepSpeed config parsing: key tables per block, typed reads with the key
// path in every message, DeepSpeed's batch-size rule and "auto" resolution.
#include "zerorun/config.h"

#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "zerorun/error.h"
#include "zerorun/strict_json.h"

namespace zerorun {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::FP32:
      return "fp32";
    case Precision::BF16:
      return "bf16";
    case Precision::FP16:
      return "fp16";
  }
  return "?";
}

DType precision_dtype(Precision p) {
  return p == Precision::BF16 ? DType::BF16 : p == Precision::FP16 ? DType::F16 : DType::F32;
}

namespace {
using json = nlohmann::json;

class Reader {
 public:
  Reader(const json& j, std::string path, Config& c) : j_(j), path_(std::move(path)), c_(c) {
    ZR_CHECK(j.is_object(), c.source, ": '", path_.empty() ? "<top level>" : path_, "' must be a JSON object");
  }
  // Declares keys: `impl` are understood; `known` are DeepSpeed keys zerorun ignores (warning). Any other key is an
  // error with a suggestion inside a block (DeepSpeed's blocks forbid extra keys) and, with `unknown_warns` (the
  // top level, where DeepSpeed ignores keys it does not know), a warning with a suggestion.
  void keys(const std::vector<std::string>& impl, const std::vector<std::string>& known = {},
            bool unknown_warns = false) {
    std::vector<std::string> all = impl;
    all.insert(all.end(), known.begin(), known.end());
    for (auto& [k, v] : j_.items()) {
      if (std::find(impl.begin(), impl.end(), k) != impl.end()) continue;
      if (std::find(known.begin(), known.end(), k) != known.end()) {
        c_.warnings.push_back("config key '" + key(k) + "' is a DeepSpeed option zerorun does not implement; ignored");
        continue;
      }
      std::string s = did_you_mean(k, all);
      const std::string hint = s.empty() ? "" : " (did you mean '" + key(s) + "'?)";
      if (unknown_warns) {
        c_.warnings.push_back(c_.source + ": unknown " + (path_.empty() ? "top-level key '" : "key '") + key(k) +
                              "' ignored, as DeepSpeed ignores it" + hint);
        continue;
      }
      ZR_FAIL(c_.source, ": unknown key '", key(k), "'", hint);
    }
  }
  bool has(const std::string& k) const { return j_.contains(k); }
  bool is_auto(const std::string& k) const { return has(k) && j_[k].is_string() && j_[k] == "auto"; }
  std::string key(const std::string& k) const { return path_.empty() ? k : path_ + "." + k; }
  [[noreturn]] void bad(const std::string& k, const std::string& want) const {
    ZR_FAIL(c_.source, ": '", key(k), "' must be ", want, ", got ", j_[k].dump());
  }
  double num(const std::string& k, double def) const {
    if (!has(k)) return def;
    if (!j_[k].is_number()) bad(k, "a number");
    return j_[k].get<double>();
  }
  int64_t integer(const std::string& k, int64_t def) const {
    if (!has(k)) return def;
    if (!j_[k].is_number()) bad(k, "an integer");
    double d = j_[k].get<double>();
    if (std::floor(d) != d || std::fabs(d) > 9.2e18) bad(k, "an integer");
    return static_cast<int64_t>(d);
  }
  std::optional<int64_t> int_or_auto(const std::string& k, std::optional<int64_t> def) const {
    if (!has(k)) return def;
    if (is_auto(k)) return std::nullopt;
    return integer(k, 0);
  }
  bool boolean(const std::string& k, bool def) const {
    if (!has(k)) return def;
    if (!j_[k].is_boolean()) bad(k, "true or false");
    return j_[k].get<bool>();
  }
  std::string bool_or_auto(const std::string& k, const std::string& def) const {
    if (!has(k)) return def;
    if (is_auto(k)) return "auto";
    return boolean(k, false) ? "true" : "false";
  }
  std::string str(const std::string& k, const std::string& def) const {
    if (!has(k)) return def;
    if (!j_[k].is_string()) bad(k, "a string");
    return j_[k].get<std::string>();
  }
  Reader sub(const std::string& k) const { return Reader(j_[k], key(k), c_); }
  // "auto" (or absent) -> `def`; an "auto" is noted with the value and why.
  int64_t integer_auto(const std::string& k, int64_t def, const std::string& why) const {
    if (!is_auto(k)) return integer(k, def);
    note_auto(k, std::to_string(def), why);
    return def;
  }
  bool boolean_auto(const std::string& k, bool def, const std::string& why) const {
    if (!is_auto(k)) return boolean(k, def);
    note_auto(k, def ? "true" : "false", why);
    return def;
  }
  void note_auto(const std::string& k, const std::string& value, const std::string& why) const {
    c_.notes.push_back("config: '" + key(k) + "' \"auto\" -> " + value + " (" + why + ")");
  }
  const json& at(const std::string& k) const { return j_[k]; }
  const json& self() const { return j_; }

 private:
  const json& j_;
  std::string path_;
  Config& c_;
};

std::string fmt(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

void parse_optimizer(Reader r, Config& c) {
  r.keys({"type", "params"}, {"legacy_fusion"}, /*unknown_warns=*/true);  // DeepSpeed reads these keys, ignores others
  OptimizerConfig& o = c.optimizer;
  o.given = true;
  std::string t = r.str("type", "");
  std::string lower;
  for (char ch : t) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (lower == "adam")
    o.type = "Adam";
  else if (lower == "adamw")
    o.type = "AdamW";
  else if (lower == "sgd")
    o.type = "SGD";
  else
    ZR_FAIL(c.source, ": 'optimizer.type' \"", t, "\" is not supported (zerorun implements Adam, AdamW, SGD)");
  if (!r.has("params")) return;
  Reader p = r.sub("params");
  // DeepSpeed hands these to the optimizer's constructor, which rejects them (it only warns about the value).
  if (p.has("max_grad_norm"))
    ZR_FAIL(c.source, ": 'optimizer.params.max_grad_norm' is not an optimizer parameter (DeepSpeed's optimizers ",
            "reject it): clip with the top-level \"gradient_clipping\": ", p.at("max_grad_norm").dump(), " instead");
  if (o.type == "SGD") {
    p.keys({"lr", "momentum", "dampening", "weight_decay", "nesterov"}, {"maximize", "foreach", "differentiable"});
    o.momentum = p.num("momentum", 0.0);
    o.dampening = p.num("dampening", 0.0);
    o.nesterov = p.boolean("nesterov", false);
  } else {
    p.keys({"lr", "betas", "eps", "weight_decay", "adam_w_mode", "bias_correction", "torch_adam"},
           {"amsgrad", "fused", "foreach", "capturable", "set_grad_none"});
    if (p.is_auto("betas")) {
      p.note_auto("betas", "[0.9, 0.999]", "torch's default, as the HF Trainer fills it");
    } else if (p.has("betas")) {
      const json& b = p.at("betas");
      ZR_CHECK(b.is_array() && b.size() == 2 && b[0].is_number() && b[1].is_number(), c.source,
               ": 'optimizer.params.betas' must be [beta1, beta2], got ", b.dump());
      o.beta1 = b[0].get<double>();
      o.beta2 = b[1].get<double>();
      ZR_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, c.source,
               ": 'optimizer.params.betas' must lie in [0, 1)");
    }
    if (p.is_auto("eps"))
      p.note_auto("eps", fmt(o.eps), "the default, as the HF Trainer fills it");
    else
      o.eps = p.num("eps", o.eps);
    o.adam_w_mode = o.type == "AdamW" ? true : p.boolean("adam_w_mode", true);
    o.bias_correction = p.boolean("bias_correction", true);
    if (p.has("amsgrad") && p.at("amsgrad") == true)
      ZR_FAIL(c.source, ": 'optimizer.params.amsgrad' true is not supported");
  }
  if (p.is_auto("lr"))
    p.note_auto("lr", fmt(o.lr), "DeepSpeed's default lr; write a number to choose another");
  else
    o.lr = p.num("lr", o.lr);
  if (p.is_auto("weight_decay"))
    p.note_auto("weight_decay", fmt(o.weight_decay), "the default, as the HF Trainer fills it");
  else
    o.weight_decay = p.num("weight_decay", o.weight_decay);
  ZR_CHECK(std::isfinite(o.lr) && o.lr >= 0, c.source, ": 'optimizer.params.lr' must be >= 0");
  ZR_CHECK(o.weight_decay >= 0, c.source, ": 'optimizer.params.weight_decay' must be >= 0, got ", o.weight_decay);
  ZR_CHECK(o.eps >= 0, c.source, ": 'optimizer.params.eps' must be >= 0, got ", o.eps);
  ZR_CHECK(o.momentum >= 0 && o.dampening >= 0, c.source, ": 'optimizer.params.momentum' and 'dampening' must be >= 0");
}

void parse_scheduler(Reader r, Config& c) {
  r.keys({"type", "params"}, {}, /*unknown_warns=*/true);
  c.scheduler.type = r.str("type", "");
  static const std::map<std::string, std::vector<std::string>> kParams = {
      {"WarmupLR", {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"}},
      {"WarmupDecayLR",
       {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps",
        "last_batch_iteration"}},
      {"WarmupCosineLR",
       {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type",
        "last_batch_iteration"}},
      {"OneCycle",
       {"cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size", "cycle_second_step_size",
        "cycle_first_stair_count", "cycle_second_stair_count", "decay_step_size", "cycle_momentum", "cycle_min_mom",
        "cycle_max_mom", "decay_mom_rate", "last_batch_iteration"}},
      {"LRRangeTest",
       {"lr_range_test_min_lr", "lr_range_test_step_size", "lr_range_test_step_rate", "lr_range_test_staircase",
        "last_batch_iteration"}},
  };
  auto it = kParams.find(c.scheduler.type);
  if (it == kParams.end()) {
    std::vector<std::string> names;
    for (auto& [k, v] : kParams) names.push_back(k);
    std::string s = did_you_mean(c.scheduler.type, names);
    ZR_FAIL(c.source, ": 'scheduler.type' \"", c.scheduler.type, "\" is not one of WarmupLR, WarmupDecayLR, ",
            "WarmupCosineLR, OneCycle, LRRangeTest", s.empty() ? "" : " (did you mean \"" + s + "\"?)");
  }
  if (r.has("params")) {
    Reader p = r.sub("params");
    p.keys(it->second);
    for (auto& [k, v] : r.at("params").items()) {
      if (k == "warmup_type") {
        ZR_CHECK(v.is_string(), c.source, ": 'scheduler.params.warmup_type' must be \"log\" or \"linear\", got ",
                 v.dump());
        if (v != "log" && v != "linear")  // DeepSpeed 0.19.5 warns and warms up logarithmically
          c.warnings.push_back(c.source + ": 'scheduler.params.warmup_type' " + v.dump() +
                               " is neither \"log\" nor \"linear\": the warmup is logarithmic, as in DeepSpeed");
      } else if (k == "lr_range_test_staircase" || k == "cycle_momentum") {
        ZR_CHECK(v.is_boolean(), c.source, ": 'scheduler.params.", k, "' must be true or false");
      } else {
        ZR_CHECK(v.is_number() || v == "auto", c.source, ": 'scheduler.params.", k, "' must be a number, got ",
                 v.dump());
      }
    }
    c.scheduler.params = r.at("params");
  }
  // Ranges (a value that DeepSpeed would take and then divide by zero or run with a negative lr is an error here).
  const json& sp = c.scheduler.params;
  auto num = [&](const char* k) -> std::optional<double> {
    if (!sp.contains(k) || !sp.at(k).is_number()) return std::nullopt;  // absent or "auto"
    return sp.at(k).get<double>();
  };
  for (const auto& [k, v] : sp.items()) {
    if (!v.is_number()) continue;
    const double x = v.get<double>();
    const bool lr = k.size() > 3 && k.compare(k.size() - 3, 3, "_lr") == 0;
    const bool positive = k == "cycle_first_step_size" || k == "lr_range_test_step_size";
    const bool ratio = k == "warmup_min_ratio" || k == "cos_min_ratio";
    if (positive)
      ZR_CHECK(x > 0, c.source, ": 'scheduler.params.", k, "' must be > 0, got ", x);
    else if (ratio)
      ZR_CHECK(x >= 0 && x <= 1, c.source, ": 'scheduler.params.", k, "' must lie in [0, 1], got ", x);
    else if (lr || k.find("steps") != std::string::npos || k.find("step_size") != std::string::npos ||
             k.find("stair_count") != std::string::npos)
      ZR_CHECK(x >= 0, c.source, ": 'scheduler.params.", k, "' must be >= 0, got ", x);
  }
  const std::string& type = c.scheduler.type;
  if ((type == "WarmupDecayLR" || type == "WarmupCosineLR") && !sp.contains("total_num_steps"))
    ZR_FAIL(c.source, ": scheduler ", type, " needs 'scheduler.params.total_num_steps' (DeepSpeed has no default; ",
            "\"auto\" is the run's steps)");
  if (type == "OneCycle")
    for (const char* k : {"cycle_min_lr", "cycle_max_lr"})
      ZR_CHECK(sp.contains(k), c.source, ": scheduler OneCycle needs 'scheduler.params.", k,
               "' (DeepSpeed has no default)");
  if ((type == "WarmupDecayLR" || type == "WarmupCosineLR") && num("total_num_steps")) {
    const double warm = std::max(2.0, num("warmup_num_steps").value_or(1000));
    const double total = *num("total_num_steps");
    if (total < warm)
      c.warnings.push_back(c.source + ": scheduler " + type + ": total_num_steps " + fmt(total) +
                           " < warmup_num_steps " + fmt(warm) + " (DeepSpeed warns too)");
  }
  if (type == "OneCycle" && sp.value("cycle_momentum", true)) {
    if (c.optimizer.type == "SGD") {
      c.warnings.push_back(c.source +
                           ": scheduler OneCycle: cycle_momentum is off with SGD, as in DeepSpeed (torch's SGD has "
                           "no betas); the momentum stays at optimizer.params.momentum");
    } else if (c.optimizer.beta2 != 0.99) {
      c.notes.push_back(
          "config: scheduler OneCycle with cycle_momentum sets the optimizer's betas to (momentum, 0.99) "
          "as DeepSpeed's does: beta2 " +
          fmt(c.optimizer.beta2) + " -> 0.99");
      c.optimizer.beta2 = 0.99;
    }
  }
}

void parse_loss_scale(Reader r, Config& c) {
  r.keys({"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "consecutive_hysteresis",
          "min_loss_scale"},
         {"auto_cast", "fp16_master_weights_and_grads", "loss_scale_type"});
  c.fp16_enabled = r.bool_or_auto("enabled", "false");
  LossScaleConfig& l = c.loss_scale;
  l.loss_scale = r.num("loss_scale", 0.0);
  l.initial_scale_power = static_cast<int>(r.integer("initial_scale_power", 16));
  l.loss_scale_window = static_cast<int>(r.integer("loss_scale_window", 1000));
  l.hysteresis = static_cast<int>(r.integer("hysteresis", 2));
  l.consecutive_hysteresis = r.boolean("consecutive_hysteresis", false);
  l.min_loss_scale = r.num("min_loss_scale", 1.0);
  ZR_CHECK(l.loss_scale >= 0, c.source, ": 'fp16.loss_scale' must be >= 0 (0 = dynamic)");
  ZR_CHECK(l.initial_scale_power >= 0 && l.initial_scale_power <= 127, c.source,
           ": 'fp16.initial_scale_power' must be in [0, 127]");
  ZR_CHECK(l.loss_scale_window > 0, c.source, ": 'fp16.loss_scale_window' must be positive");
  ZR_CHECK(l.hysteresis >= 1, c.source, ": 'fp16.hysteresis' must be >= 1");
  ZR_CHECK(l.min_loss_scale > 0, c.source, ": 'fp16.min_loss_scale' must be positive");
}

OffloadConfig parse_offload(Reader r, const Config& c, bool param) {
  if (param)
    r.keys({"device", "pin_memory", "buffer_count", "buffer_size", "max_in_cpu", "nvme_path"});
  else
    r.keys({"device", "pin_memory", "nvme_path", "buffer_count", "pipeline_read", "pipeline_write", "fast_init"},
           {"pipeline", "ratio", "super_offload", "cpuadam_cores_perc", "convert_grad_on_cpu"});
  OffloadConfig o;
  o.device = r.str("device", "none");
  ZR_CHECK(o.device == "none" || o.device == "cpu" || o.device == "nvme", c.source, ": '", r.key("device"), "' \"",
           o.device, "\" is not supported (zerorun offloads ", param ? "parameters" : "the optimizer",
           " to \"cpu\", \"nvme\" or \"none\")");
  o.pin_memory = r.boolean("pin_memory", false);
  o.nvme_path = r.str("nvme_path", "");
  o.buffer_count = static_cast<int>(r.integer("buffer_count", param ? 5 : 4));
  ZR_CHECK(o.buffer_count >= 1, c.source, ": '", r.key("buffer_count"), "' must be >= 1");
  o.buffer_size = r.integer("buffer_size", o.buffer_size);
  o.max_in_cpu = r.integer("max_in_cpu", o.max_in_cpu);
  ZR_CHECK(o.buffer_size >= 1 && o.max_in_cpu >= 0, c.source, ": '", r.key("buffer_size"), "' / '", r.key("max_in_cpu"),
           "' must be positive");
  o.pipeline_read = r.boolean("pipeline_read", false);
  o.pipeline_write = r.boolean("pipeline_write", false);
  r.boolean("fast_init", false);  // DeepSpeed's faster first fill of the swap files: zerorun's start as zeros
  ZR_CHECK(o.device != "nvme" || !o.nvme_path.empty(), c.source, ": '", r.key("device"), "' \"nvme\" needs '",
           r.key("nvme_path"), "' (a directory on the NVMe disk)");
  return o;
}

void parse_aio(Reader r, Config& c) {
  r.keys({"block_size", "queue_depth", "thread_count", "intra_op_parallelism", "single_submit", "overlap_events",
          "use_gds"});
  zero::AioConfig& a = c.aio;
  a.block_size = r.integer("block_size", a.block_size);
  a.queue_depth = static_cast<int>(r.integer("queue_depth", a.queue_depth));
  ZR_CHECK(!(r.has("thread_count") && r.has("intra_op_parallelism")), c.source,
           ": 'aio.thread_count' and 'aio.intra_op_parallelism' (its newer name) are the same setting: give one");
  a.thread_count =
      static_cast<int>(r.integer(r.has("thread_count") ? "thread_count" : "intra_op_parallelism", a.thread_count));
  a.single_submit = r.boolean("single_submit", a.single_submit);
  a.overlap_events = r.boolean("overlap_events", a.overlap_events);
  ZR_CHECK(a.block_size >= 1 && a.queue_depth >= 1 && a.thread_count >= 1, c.source,
           ": 'aio.block_size', 'aio.queue_depth' and 'aio.thread_count' must be positive");
  ZR_CHECK(!r.boolean("use_gds", false), c.source,
           ": 'aio.use_gds' true (GPUDirect Storage) is not supported: zerorun reads NVMe into host memory");
}

void parse_zero(Reader r, Config& c) {
  const json& zj = r.self();
  // DeepSpeed's field names without the stage3_ prefix are accepted as aliases (pydantic populate_by_name).
  static const char* kAliased[] = {"prefetch_bucket_size",         "param_persistence_threshold",
                                   "model_persistence_threshold",  "max_live_parameters",
                                   "max_reuse_distance",           "gather_16bit_weights_on_model_save",
                                   "module_granularity_threshold", "use_all_reduce_for_fetch_params",
                                   "allgather_sequential",         "partition_stream_chunk_size"};
  json z_in = zj;
  for (const char* a : kAliased) {
    const std::string full = std::string("stage3_") + a;
    if (!z_in.contains(a)) continue;
    ZR_CHECK(!z_in.contains(full), c.source, ": 'zero_optimization.", a, "' and 'zero_optimization.", full,
             "' are the same setting: give one");
    c.notes.push_back("config: 'zero_optimization." + std::string(a) + "' read as 'zero_optimization." + full +
                      "' (DeepSpeed's alias)");
    z_in[full] = z_in[a];
    z_in.erase(a);
  }
  // Deprecated spellings DeepSpeed maps onto their replacements (an error when both are given, as there).
  auto deprecated = [&](const char* old_key, const char* new_key) {
    if (!z_in.contains(old_key)) return false;
    ZR_CHECK(!z_in.contains(new_key), c.source, ": 'zero_optimization.", old_key,
             "' (deprecated) and 'zero_optimization.", new_key, "' cannot be given together");
    return true;
  };
  if (deprecated("stage3_gather_fp16_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save")) {
    z_in["stage3_gather_16bit_weights_on_model_save"] = z_in["stage3_gather_fp16_weights_on_model_save"];
    z_in.erase("stage3_gather_fp16_weights_on_model_save");
  }
  for (auto [old_key, new_key] :
       {std::pair{"cpu_offload", "offload_optimizer"}, std::pair{"cpu_offload_param", "offload_param"}}) {
    if (!deprecated(old_key, new_key)) continue;
    const json v = z_in[old_key];
    ZR_CHECK(v.is_boolean(), c.source, ": 'zero_optimization.", old_key, "' must be true or false, got ", v.dump());
    if (v.get<bool>()) {
      z_in[new_key] = json{{"device", "cpu"}};
      c.notes.push_back(std::string("config: 'zero_optimization.") + old_key + "' true (deprecated) read as '" +
                        "zero_optimization." + new_key + "': {\"device\": \"cpu\"}, as DeepSpeed maps it");
    }
    z_in.erase(old_key);
  }
  if (z_in.contains("cpu_offload_use_pin_memory")) {  // DeepSpeed keeps it only for the warning
    c.warnings.push_back(c.source +
                         ": 'zero_optimization.cpu_offload_use_pin_memory' is deprecated and ignored, as in "
                         "DeepSpeed: set pin_memory in offload_optimizer/offload_param");
    z_in.erase("cpu_offload_use_pin_memory");
  }
  Reader zr(z_in, "zero_optimization", c);
  zr.keys({"stage",
           "offload_optimizer",
           "offload_param",
           "overlap_comm",
           "contiguous_gradients",
           "reduce_scatter",
           "reduce_bucket_size",
           "allgather_partitions",
           "allgather_bucket_size",
           "stage3_prefetch_bucket_size",
           "stage3_param_persistence_threshold",
           "stage3_max_live_parameters",
           "stage3_max_reuse_distance",
           "stage3_gather_16bit_weights_on_model_save",
           "sub_group_size",
           "round_robin_gradients",
           "elastic_checkpoint",
           "ignore_unused_parameters",
           "load_from_fp32_weights",
           "use_multi_rank_bucket_allreduce",
           "log_trace_cache_warnings",
           "enable_sanity_checks"},
          {"zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_nontrainable_weights",
           "zero_quantized_gradients", "mics_shard_size", "mics_hierarchical_params_gather", "memory_efficient_linear",
           "pipeline_loading_checkpoint", "override_module_apply", "stage3_model_persistence_threshold",
           "legacy_stage1", "zeropp_loco_param", "zenflow", "stage3_module_granularity_threshold",
           "stage3_use_all_reduce_for_fetch_params", "stage3_allgather_sequential",
           "stage3_partition_stream_chunk_size", "save_muon_momentum_buffer_in_memory", "leaf_module"});
  ZeroConfig& z = c.zero;
  int64_t st = zr.integer("stage", 0);
  ZR_CHECK(st >= 0 && st <= 3, c.source, ": 'zero_optimization.stage' must be 0, 1, 2 or 3, got ", st);
  z.stage = static_cast<int>(st);
  if (zr.has("offload_optimizer") && !zr.at("offload_optimizer").is_null())
    z.offload_optimizer = parse_offload(zr.sub("offload_optimizer"), c, false);
  if (zr.has("offload_param") && !zr.at("offload_param").is_null())
    z.offload_param = parse_offload(zr.sub("offload_param"), c, true);
  ZR_CHECK(z.offload_param.device == "none" || z.stage == 3, c.source,
           ": 'zero_optimization.offload_param' needs stage 3 (stage is ", z.stage, ")");
  const std::string dflt = "DeepSpeed's default";
  z.overlap_comm = zr.boolean_auto("overlap_comm", z.stage == 3, dflt + " for stage " + std::to_string(z.stage));
  z.contiguous_gradients = zr.boolean_auto("contiguous_gradients", true, dflt);
  z.reduce_scatter = zr.boolean_auto("reduce_scatter", true, dflt);
  for (const char* k : {"allgather_partitions", "ignore_unused_parameters", "load_from_fp32_weights",
                        "use_multi_rank_bucket_allreduce"})
    zr.boolean_auto(k, true, dflt);
  for (const char* k :
       {"round_robin_gradients", "elastic_checkpoint", "log_trace_cache_warnings", "enable_sanity_checks"})
    zr.boolean_auto(k, false, dflt);
  const int64_t kDefBucket = 500000000;
  z.reduce_bucket_size = zr.int_or_auto("reduce_bucket_size", kDefBucket);
  z.allgather_bucket_size = zr.int_or_auto("allgather_bucket_size", kDefBucket);
  z.stage3_prefetch_bucket_size = zr.int_or_auto("stage3_prefetch_bucket_size", 50000000);
  z.stage3_param_persistence_threshold = zr.int_or_auto("stage3_param_persistence_threshold", 100000);
  z.stage3_max_live_parameters = zr.integer_auto("stage3_max_live_parameters", z.stage3_max_live_parameters, dflt);
  z.stage3_max_reuse_distance = zr.integer_auto("stage3_max_reuse_distance", z.stage3_max_reuse_distance, dflt);
  z.sub_group_size = zr.integer_auto("sub_group_size", z.sub_group_size, dflt);
  z.stage3_gather_16bit_weights_on_model_save = zr.boolean_auto(
      "stage3_gather_16bit_weights_on_model_save", false,
      "accelerate's default zero3_save_16bit_model; zerorun merge writes whole weights from any checkpoint");
  // DeepSpeed's fields are Field(ge=0): 0 is allowed (a bucket per parameter, no prefetch, nothing kept whole).
  for (auto* k : {"reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size",
                  "stage3_param_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
                  "sub_group_size"}) {
    if (zr.is_auto(k) || !zr.has(k)) continue;
    ZR_CHECK(zr.integer(k, 0) >= 0, c.source, ": 'zero_optimization.", k, "' must be >= 0, got ", zr.at(k).dump());
  }
  // Values asking for a behaviour zerorun does not have: said once, not silently ignored.
  auto no_effect = [&](const char* key, const char* value, const std::string& why) {
    c.warnings.push_back(c.source + ": 'zero_optimization." + key + "' " + value + " has no effect here: " + why);
  };
  if (zr.has("reduce_scatter") && !z.reduce_scatter)
    no_effect("reduce_scatter", "false",
              "stages 2-3 always reduce-scatter each gradient bucket (an all-reduce would give the same values)");
  if (zr.has("contiguous_gradients") && !z.contiguous_gradients)
    no_effect("contiguous_gradients", "false", "gradients always live in one flat buffer");
  if (zr.has("overlap_comm") && !z.overlap_comm && z.stage == 3)
    no_effect("overlap_comm", "false", "stage 3 always prefetches the next block's parameters");
  if (z.stage3_gather_16bit_weights_on_model_save)
    no_effect("stage3_gather_16bit_weights_on_model_save", "true",
              "checkpoints keep only the shards; `zerorun merge CKPT OUT --dtype bf16` (or --final_weights) writes the "
              "whole weights");
}

void parse_train(Reader r, Config& c) {
  r.keys({"steps", "data", "save_dir", "save_interval", "eval_interval", "eval_data", "eval_batches", "seed", "log_dir",
          "seq_len", "packing", "loss_chunk_mib", "loss_chunk_rows"});
  TrainConfig& t = c.train;
  t.steps = r.integer("steps", 0);
  t.data = r.str("data", "");
  t.save_dir = r.str("save_dir", "");
  t.save_interval = r.integer("save_interval", 0);
  t.eval_interval = r.integer("eval_interval", 0);
  t.eval_data = r.str("eval_data", "");
  t.eval_batches = r.integer("eval_batches", 4);
  t.seed = static_cast<uint64_t>(r.integer("seed", 1234));
  t.log_dir = r.str("log_dir", "");
  t.seq_len = r.integer("seq_len", 0);
  t.packing = r.boolean("packing", true);
  t.loss_chunk_mib = r.integer("loss_chunk_mib", t.loss_chunk_mib);
  ZR_CHECK(t.loss_chunk_mib >= -1, c.source, ": 'train.loss_chunk_mib' must be >= 0 (or -1: automatic), got ",
           t.loss_chunk_mib);
  t.loss_chunk_rows = r.integer("loss_chunk_rows", 0);
  const std::pair<const char*, int64_t> counts[] = {
      {"steps", t.steps},     {"save_interval", t.save_interval},     {"eval_interval", t.eval_interval},
      {"seq_len", t.seq_len}, {"loss_chunk_rows", t.loss_chunk_rows}, {"seed", static_cast<int64_t>(t.seed)}};
  for (auto& [k, v] : counts) ZR_CHECK(v >= 0, c.source, ": 'train.", k, "' must be >= 0, got ", v);
  ZR_CHECK(t.eval_batches >= 1, c.source, ": 'train.eval_batches' must be >= 1, got ", t.eval_batches);
}

}  // namespace

Config parse_config(const json& j, const std::string& source) {
  Config c;
  c.source = source;
  c.raw = j;
  Reader r(j, "", c);
  r.keys({"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer", "scheduler",
          "fp16", "bf16", "bfloat16", "zero_optimization", "gradient_clipping", "steps_per_print",
          "wall_clock_breakdown", "activation_checkpointing", "train", "zero_allow_untested_optimizer",
          "prescale_gradients", "gradient_predivide_factor", "aio"},
         {"amp",
          "flops_profiler",
          "tensorboard",
          "wandb",
          "csv_monitor",
          "comet",
          "comms_logger",
          "autotuning",
          "elasticity",
          "compression_training",
          "data_efficiency",
          "curriculum_learning",
          "sparse_attention",
          "pipeline",
          "communication_data_type",
          "dump_state",
          "memory_breakdown",
          "zero_force_ds_cpu_optimizer",
          "checkpoint",
          "disable_allgather",
          "sparse_gradients",
          "data_types",
          "seq_parallel_communication_data_type",
          "torch_autocast",
          "graph_harvesting",
          "use_data_before_expert_parallelism",
          "timers",
          "nebula",
          "weight_quantization",
          "hybrid_engine",
          "eigenvalue",
          "progressive_layer_drop",
          "quantize_training",
          "compile",
          "tensor_parallel",
          "expert_parallel",
          "gradient_allreduce_op",
          "managed_gradient_accumulation",
          "dataloader_drop_last",
          "log_level",
          "datastates_ckpt",
          "sequence_parallel_size",
          "vocabulary_size"},
         /*unknown_warns=*/true);
  auto batch_key = [&](const char* k) -> std::optional<int64_t> {
    if (!r.has(k) || r.is_auto(k)) return std::nullopt;
    int64_t v = r.integer(k, 0);
    ZR_CHECK(v > 0, source, ": '", k, "' must be a positive integer, got ", v);
    return v;
  };
  // Values DeepSpeed rejects in keys zerorun otherwise ignores (checked in DeepSpeed's order: before the blocks).
  for (const char* k : {"communication_data_type", "seq_parallel_communication_data_type"}) {
    if (!r.has(k) || r.at(k).is_null()) continue;
    std::string v = r.at(k).is_string() ? r.at(k).get<std::string>() : r.at(k).dump();
    for (char& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    ZR_CHECK(v == "fp32" || v == "fp16" || v == "bf16", source, ": '", k, "' ", r.at(k).dump(),
             " is not a data type DeepSpeed supports (\"fp16\", \"bf16\" or \"fp32\"; DeepSpeed rejects the config)");
  }
  c.train_batch_size = batch_key("train_batch_size");
  c.micro_batch = batch_key("train_micro_batch_size_per_gpu");
  c.grad_accum = batch_key("gradient_accumulation_steps");
  if (r.has("optimizer")) parse_optimizer(r.sub("optimizer"), c);
  if (r.has("scheduler")) parse_scheduler(r.sub("scheduler"), c);
  if (r.has("fp16")) parse_loss_scale(r.sub("fp16"), c);
  if (r.has("aio")) parse_aio(r.sub("aio"), c);
  // "bfloat16" is the block's old name (DeepSpeed reads it when "bf16" is absent).
  const char* bf_key = r.has("bf16") ? "bf16" : r.has("bfloat16") ? "bfloat16" : nullptr;
  if (r.has("bf16") && r.has("bfloat16"))
    c.warnings.push_back(source +
                         ": both 'bf16' and 'bfloat16' (its old name) are given: 'bfloat16' is ignored, as "
                         "in DeepSpeed");
  else if (bf_key && std::string(bf_key) == "bfloat16")
    c.notes.push_back("config: 'bfloat16' read as 'bf16' (its old name in DeepSpeed)");
  if (bf_key) {
    Reader b = r.sub(bf_key);
    b.keys({"enabled", "bf16_master_weights_and_grads", "bf16_optimizer_states"},
           {"immediate_grad_update", "check_grad_overflow"});
    c.bf16_enabled = b.bool_or_auto("enabled", "false");
    // DeepSpeed (BF16 low-precision master state): the ZeRO optimizer's master weights and gradients in bf16, and
    // (only with them) Adam's exp_avg / exp_avg_sq in bf16.
    c.bf16_master_weights_and_grads = b.boolean("bf16_master_weights_and_grads", false);
    c.bf16_optimizer_states = b.boolean("bf16_optimizer_states", false);
    ZR_CHECK(!c.bf16_optimizer_states || c.bf16_master_weights_and_grads, source, ": '", b.key("bf16_optimizer_states"),
             "' requires '", b.key("bf16_master_weights_and_grads"), "' (as in DeepSpeed)");
  }
  if (c.fp16_enabled == "true" && c.bf16_enabled == "true")
    ZR_FAIL(source, ": 'fp16.enabled' and 'bf16.enabled' cannot both be true");
  if (r.has("zero_optimization")) {
    if (r.at("zero_optimization").is_boolean()) {  // DeepSpeed's deprecated form: true = stage 1
      const bool on = r.at("zero_optimization").get<bool>();
      c.zero.stage = on ? 1 : 0;
      c.warnings.push_back(source + ": 'zero_optimization': " + (on ? "true" : "false") +
                           " is DeepSpeed's deprecated form, read as {\"stage\": " + (on ? "1" : "0") +
                           "}; write the block instead");
    } else {
      parse_zero(r.sub("zero_optimization"), c);
    }
  }
  if (c.bf16_master_weights_and_grads) {  // DeepSpeed's engine and ZeRO optimizer checks
    ZR_CHECK(c.zero.stage >= 1, source,
             ": 'bf16.bf16_master_weights_and_grads' is only supported with ZeRO stage 1, 2 or 3 (stage is ",
             c.zero.stage, ")");
    ZR_CHECK(c.bf16_optimizer_states || c.zero.offload_optimizer.device != "none", source,
             ": 'bf16.bf16_master_weights_and_grads' with fp32 optimizer states needs "
             "'zero_optimization.offload_optimizer.device' \"cpu\" (as in DeepSpeed); or set "
             "'bf16.bf16_optimizer_states' true");
  }
  if (r.is_auto("gradient_clipping")) {
    c.gradient_clipping = 1.0;
    r.note_auto("gradient_clipping", "1.0", "the HF Trainer's max_grad_norm default, which it fills in");
  } else {
    c.gradient_clipping = r.num("gradient_clipping", 0.0);
  }
  ZR_CHECK(c.gradient_clipping >= 0, source, ": 'gradient_clipping' must be >= 0");
  c.steps_per_print = r.integer_auto("steps_per_print", 10, "DeepSpeed's default");
  ZR_CHECK(c.steps_per_print > 0, source, ": 'steps_per_print' must be positive");
  c.wall_clock_breakdown = r.boolean_auto("wall_clock_breakdown", false, "DeepSpeed's default");
  if (c.wall_clock_breakdown)
    c.warnings.push_back(c.source +
                         ": 'wall_clock_breakdown' true has no effect here: ZERORUN_PROFILE=1 prints time per op, "
                         "engine phase and product at the end of the run");
  r.boolean("zero_allow_untested_optimizer", false);
  r.boolean("prescale_gradients", false);
  r.num("gradient_predivide_factor", 1.0);
  if (r.has("activation_checkpointing")) {
    Reader a = r.sub("activation_checkpointing");
    // DeepSpeed reads this block key by key and ignores the rest: unknown keys warn.
    a.keys({"enabled", "recompute"},
           {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization", "number_checkpoints",
            "synchronize_checkpoint_boundary", "profile"},
           /*unknown_warns=*/true);
    c.activation_checkpointing = a.boolean("enabled", true);
    // zerorun's own key: what is recomputed in backward instead of kept ("block": every transformer block whole,
    // DeepSpeed's checkpointing; or any of "norms", "mlp_act", "attention"; "none": nothing).
    if (a.has("recompute")) {
      const json& v = a.at("recompute");
      std::vector<std::string> modes;
      if (v.is_string()) {
        modes.push_back(v.get<std::string>());
      } else if (v.is_array() && !v.empty()) {
        for (auto& e : v) {
          if (!e.is_string()) a.bad("recompute", "a string or a list of strings");
          modes.push_back(e.get<std::string>());
        }
      } else {
        a.bad("recompute", "one of none, norms, mlp_act, attention, block, or a list of them");
      }
      const std::vector<std::string> all = {"none", "norms", "mlp_act", "attention", "block"};
      c.recompute.clear();
      for (auto& m : modes) {
        if (std::find(all.begin(), all.end(), m) == all.end()) {
          const std::string s = did_you_mean(m, all);
          ZR_FAIL(c.source, ": 'activation_checkpointing.recompute' has '", m,
                  "': it takes none, norms, mlp_act, attention, block",
                  s.empty() ? "" : " (did you mean '" + s + "'?)");
        }
        ZR_CHECK(m != "none" || modes.size() == 1, c.source,
                 ": 'activation_checkpointing.recompute': \"none\" goes alone");
        if (m != "none" && std::find(c.recompute.begin(), c.recompute.end(), m) == c.recompute.end())
          c.recompute.push_back(m);
      }
    }
  }
  if (r.has("train")) parse_train(r.sub("train"), c);
  return c;
}

Config load_config(const std::string& path) { return parse_config(load_config_file(path), path); }

void resolve_config(Config& c, const ResolveContext& ctx) {
  const int64_t W = ctx.world_size;
  ZR_CHECK(W >= 1, "world size must be >= 1");
  c.world_size = ctx.world_size;
  auto tb = c.train_batch_size, mb = c.micro_batch, ga = c.grad_accum;
  // The parser checks the file's values; these may also come from --micro_batch_size or the library's caller.
  for (auto [v, key] : {std::pair{tb, "train_batch_size"}, std::pair{mb, "train_micro_batch_size_per_gpu"},
                        std::pair{ga, "gradient_accumulation_steps"}})
    ZR_CHECK(!v || *v > 0, c.source, ": ", key, " must be a positive integer, got ", *v);
  // A micro batch left "auto" with nothing to derive it from: the HF Trainer's default per_device_train_batch_size.
  const bool hf_micro =
      !tb && !mb && c.raw.is_object() && c.raw.value("train_micro_batch_size_per_gpu", json()) == "auto";
  if (hf_micro) mb = 8;
  // DeepSpeed's _set_batch_related_parameters.
  if (tb && mb && ga) {
  } else if (tb && mb) {
    ga = *tb / *mb / W;
  } else if (tb && ga) {
    mb = *tb / W / *ga;
  } else if (mb && ga) {
    tb = *mb * *ga * W;
  } else if (tb) {
    ga = 1;
    mb = *tb / W;
  } else if (mb) {
    ga = 1;
    tb = *mb * W;
  } else {
    ZR_FAIL(c.source, ": either train_batch_size or train_micro_batch_size_per_gpu needs to be provided",
            " (or pass --micro_batch_size N, the HF Trainer's per_device_train_batch_size)");
  }
  ZR_CHECK(*tb > 0 && *mb > 0 && *ga > 0 && *tb == *mb * *ga * W, c.source,
           ": Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
           "gradient_acc_step * world_size ",
           *tb, " != ", *mb, " * ", *ga, " * ", W);
  const bool first = c.batch == 0;  // resolve may run again (tests); note once
  c.batch = *tb;
  c.micro = *mb;
  c.gas = *ga;
  auto is_auto = [&](const json& j, const char* k) { return j.is_object() && j.contains(k) && j[k] == "auto"; };
  auto note = [&](const std::string& key, const std::string& v, const std::string& why) {
    if (first) c.notes.push_back("config: '" + key + "' \"auto\" -> " + v + " (" + why + ")");
  };
  const std::string rule = "DeepSpeed's rule train_batch_size = micro x gas x world (" + std::to_string(W) + ")";
  if (is_auto(c.raw, "train_batch_size")) note("train_batch_size", std::to_string(*tb), rule);
  if (is_auto(c.raw, "train_micro_batch_size_per_gpu"))
    note("train_micro_batch_size_per_gpu", std::to_string(*mb),
         hf_micro ? "the HF Trainer's default per_device_train_batch_size; --micro_batch_size N sets another"
         : c.train_batch_size || !c.micro_batch ? rule
                                                : "--micro_batch_size");
  if (is_auto(c.raw, "gradient_accumulation_steps")) note("gradient_accumulation_steps", std::to_string(*ga), rule);
  // Precision: "auto" -> bf16 on GPUs that have it, fp32 on CPU.
  auto pick = [&](const std::string& v) { return v == "true" || (v == "auto" && ctx.on_gpu); };
  if (pick(c.bf16_enabled) && (c.bf16_enabled == "true" || ctx.gpu_has_bf16))
    c.precision = Precision::BF16;
  else if (pick(c.fp16_enabled))
    c.precision = Precision::FP16;
  else
    c.precision = Precision::FP32;
  if (c.bf16_enabled == "auto")
    note("bf16.enabled", c.precision == Precision::BF16 ? "true" : "false",
         ctx.on_gpu ? (ctx.gpu_has_bf16 ? "the GPU has bf16" : "the GPU has no bf16") : "training on the CPU");
  if ((c.bf16_master_weights_and_grads || c.bf16_optimizer_states) && c.precision != Precision::BF16) {
    if (first)
      c.warnings.push_back(c.source + ": 'bf16.bf16_master_weights_and_grads' / 'bf16.bf16_optimizer_states' " +
                           "have no effect: training runs in " + precision_name(c.precision) +
                           " (bf16.enabled is not true)");
    c.bf16_master_weights_and_grads = c.bf16_optimizer_states = false;
  }
  if (c.fp16_enabled == "auto")
    note("fp16.enabled", c.precision == Precision::FP16 ? "true" : "false",
         c.precision == Precision::BF16 ? "bf16 is used"
         : ctx.on_gpu                   ? "the GPU"
                                        : "training on the CPU");
  // Bucket "auto" values from the hidden size (as the HF integration does).
  const int64_t h2 = ctx.hidden * ctx.hidden;
  ZeroConfig& z = c.zero;
  const std::string hid = "hidden size " + std::to_string(ctx.hidden);
  if (!z.reduce_bucket_size) {
    z.reduce_bucket_size = std::max<int64_t>(h2, 1);
    note("zero_optimization.reduce_bucket_size", std::to_string(*z.reduce_bucket_size), "hidden^2, " + hid);
  }
  if (!z.allgather_bucket_size) {
    z.allgather_bucket_size = std::max<int64_t>(h2, 1);
    note("zero_optimization.allgather_bucket_size", std::to_string(*z.allgather_bucket_size), "hidden^2, " + hid);
  }
  if (!z.stage3_prefetch_bucket_size) {
    z.stage3_prefetch_bucket_size = std::max<int64_t>(static_cast<int64_t>(0.9 * static_cast<double>(h2)), 1);
    note("zero_optimization.stage3_prefetch_bucket_size", std::to_string(*z.stage3_prefetch_bucket_size),
         "0.9 x hidden^2, " + hid);
  }
  if (!z.stage3_param_persistence_threshold) {
    z.stage3_param_persistence_threshold = 10 * ctx.hidden;
    note("zero_optimization.stage3_param_persistence_threshold", std::to_string(*z.stage3_param_persistence_threshold),
         "10 x hidden, " + hid);
  }
  // Scheduler "auto" values, as the HF Trainer fills them.
  json& sp = c.scheduler.params;
  if (!c.scheduler.type.empty() && sp.is_object()) {
    const std::string lr = fmt(c.optimizer.lr);
    for (auto& [k, v] : sp.items()) {
      if (v != "auto") continue;
      const std::string key = "scheduler.params." + k;
      if (k == "warmup_max_lr" || k == "cycle_max_lr") {
        v = c.optimizer.lr;
        note(key, lr, "the optimizer's lr");
      } else if (k == "total_num_steps" && c.train.steps > 0) {
        v = c.train.steps;
        note(key, std::to_string(c.train.steps), "the run's steps");
      } else if (k == "warmup_num_steps") {
        v = 0;
        note(key, "0", "the HF Trainer's default warmup_steps (DeepSpeed then warms up over 2 steps)");
      } else if (k == "warmup_min_lr" || k == "cycle_min_lr") {
        v = 0;
        note(key, "0", "as the HF Trainer fills it");
      }
    }
  }
}

}  // namespace zerorun
