// The run options' one table (run_options.h says why), their registration with CLI11 and the per-rank command.
#include "run_options.h"

#include "zerorun/platform.h"

namespace zerorun {

CLI::Validator at_least(long long lo) {
  return CLI::Validator(
      [lo](std::string& v) -> std::string {
        const bool digits = !v.empty() && v.find_first_not_of("0123456789", v[0] == '-' ? 1 : 0) == std::string::npos;
        if (!digits || v == "-") return "must be a whole number, got '" + v + "'";
        if (v[0] == '-' ? lo >= 0 || std::stoll(v) < lo : lo > 0 && v.find_first_not_of('0') == std::string::npos)
          return "must be >= " + std::to_string(lo) + ", got " + v;
        return "";
      },
      ">=" + std::to_string(lo));
}

namespace {

// --comm's help: the default is mpi where NCCL does not exist (Windows).
std::string comm_help() {
  return platform::kHaveNccl ? "GPU collectives with several ranks: nccl (default; one GPU per rank) or mpi (through "
                               "host memory; ranks may share a GPU)"
                             : "GPU collectives with several ranks: mpi (default: through host memory; ranks may "
                               "share a GPU); nccl does not exist on this platform";
}

constexpr unsigned kRanks = kRunTrain | kRunEval | kRunLaunch;  // every run command; the launcher forwards it

std::vector<RunOption> make_run_options() {
  using O = TrainOptions;
  std::vector<RunOption> v;
  auto add = [&](const std::string& name, RunOption::Member m, const std::string& help, const std::string& overrides,
                 std::optional<CLI::Validator> check, unsigned commands = kRanks, bool required = false) {
    v.push_back({name, m, help, overrides, std::move(check), commands, required});
  };
  add("model", &O::model_path, "model.bin to train", "", {}, kRanks, true);
  add("--config", &O::config_path, "DeepSpeed JSON config", "", {}, kRanks, true);
  add("--steps", &O::steps, "number of optimizer steps", "train.steps", at_least(1));
  add("--data", &O::data, "token shards (glob / comma list) or 'synthetic'", "train.data", {});
  add("--eval_data", &O::eval_data, "held-out token shards: eval loss every train.eval_interval steps",
      "train.eval_data", {});
  add("--eval_interval", &O::eval_interval, "steps between evaluations", "train.eval_interval", at_least(1));
  add("--save_dir", &O::save_dir, "checkpoint directory", "train.save_dir", {});
  add("--log_dir", &O::log_dir, "write metrics.jsonl here", "train.log_dir", {});
  add("--seed", &O::seed, "data seed", "train.seed", at_least(0));
  add("--micro_batch_size", &O::micro_batch, "micro batch per rank", "train_micro_batch_size_per_gpu", at_least(1));
  add("--seq_len", &O::seq_len, "sequence length for token models", "train.seq_len", at_least(1));
  add("--final_weights", &O::final_weights, "write the trained fp32 weights (safetensors) here", "", {});
  add("--resume", &O::resume, "resume from 'latest', a tag in --save_dir, or a checkpoint directory", "", {});
  add("--device", &O::device, "auto (default: cuda when every rank sees a GPU, else cpu), cpu, or cuda", "",
      CLI::IsMember({"auto", "cpu", "cuda"}));
  add("--comm", &O::comm, comm_help(), "", CLI::IsMember({"nccl", "mpi"}));
  add("--eval_batches", &O::eval_batches, "global batches to average over, default 4", "train.eval_batches",
      at_least(1), kRunEval);
  return v;
}

}  // namespace

const std::vector<RunOption>& run_options() {
  static const std::vector<RunOption> options = make_run_options();
  return options;
}

void add_run_options(CLI::App& app, TrainOptions& o, RunCommand command) {
  for (const RunOption& r : run_options()) {
    if (!(r.commands & command)) continue;
    const std::string help = r.overrides.empty() ? r.help : r.help + " (overrides " + r.overrides + ")";
    CLI::Option* opt = std::visit([&](auto m) { return app.add_option(r.name, o.*m, help); }, r.member);
    if (r.check) opt->check(*r.check);
    if (r.required && command != kRunLaunch) opt->required();
  }
}

std::vector<std::string> rank_command(const TrainOptions& o) {
  std::vector<std::string> a = {platform::executable_path(), "train"};
  for (const RunOption& r : run_options()) {
    if (!r.forwarded()) continue;
    std::optional<std::string> value;  // unset: the rank's default
    std::visit(
        [&](auto m) {
          const auto& v = o.*m;
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::string>) {
            if (r.required || !v.empty()) value = v;
          } else if (v) {
            if constexpr (std::is_same_v<V, std::optional<std::string>>)
              value = *v;
            else
              value = std::to_string(*v);
          }
        },
        r.member);
    if (!value) continue;
    if (!r.positional()) a.push_back(r.name);
    a.push_back(*value);
  }
  return a;
}

}  // namespace zerorun
