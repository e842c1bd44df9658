// A training run's options, declared once (issue 33 item 3): `zerorun train`, `zerorun eval` and the launcher (the
// default command) register their CLI11 options from this table, and the launcher writes each rank's `train` command
// from it, so no option is parsed by one and forgotten by another. The launcher's own options (--num_gpus,
// --hostfile, --include, --dry_run, ...) fill a launch::LaunchRequest, not TrainOptions, and stay in main.cc.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "zerorun/trainer.h"

namespace zerorun {

// A whole number >= lo, with a message naming the value (CLI11's number checks print a range up to DBL_MAX).
CLI::Validator at_least(long long lo);

// The commands that take a run option (bits of RunOption::commands).
enum RunCommand : unsigned {
  kRunTrain = 1,   // `zerorun train`: one rank
  kRunEval = 2,    // `zerorun eval`: one rank
  kRunLaunch = 4,  // the launcher: it passes the option on to every rank's `train`
};

struct RunOption {
  using Member = std::variant<std::string TrainOptions::*, std::optional<std::string> TrainOptions::*,
                              std::optional<int64_t> TrainOptions::*, std::optional<uint64_t> TrainOptions::*>;
  std::string name;  // "--steps", or a positional's name ("model")
  Member member;     // where the value goes
  std::string help;
  std::string overrides;  // the config key the value replaces (run_training applies it), "" for none
  std::optional<CLI::Validator> check;
  unsigned commands = 0;  // RunCommand bits
  // `train` and `eval` require it, and every rank's command carries it. The launcher checks it itself (a command
  // line may name a subcommand instead).
  bool required = false;

  bool positional() const { return name.rfind("-", 0) != 0; }
  bool forwarded() const { return (commands & kRunLaunch) != 0; }
};

// Every run option, in the order the help lists them and a rank's command carries them.
const std::vector<RunOption>& run_options();

// Registers the run options `command` takes on `app`, bound to `o`.
void add_run_options(CLI::App& app, TrainOptions& o, RunCommand command);

// The per-rank command: this executable's `train` with every forwarded option `o` sets (required ones always).
std::vector<std::string> rank_command(const TrainOptions& o);

}  // namespace zerorun
