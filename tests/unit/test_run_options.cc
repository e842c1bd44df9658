// The run options' one schema (src/cli/run_options.h): every option the launcher forwards reaches each rank's
// `train` unchanged (the test walks the schema, so a new option cannot be left out of rank_command), the commands
// register what the schema says, and the rank command is the one the launcher has always written.

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <variant>
#include <vector>

#include "src/cli/run_options.h"
#include "zerorun/platform.h"

using namespace zerorun;

namespace {

// main.cc's parsers: the launcher's run options on the app, `train` and `eval` as its subcommands.
struct Parsers {
  TrainOptions launch, train, eval;
  CLI::App app{"zerorun"};
  CLI::App* train_cmd = nullptr;
  CLI::App* eval_cmd = nullptr;
  Parsers() {
    app.allow_windows_style_options(false);
    app.require_subcommand(0, 1);
    add_run_options(app, launch, kRunLaunch);
    train_cmd = app.add_subcommand("train");
    add_run_options(*train_cmd, train, kRunTrain);
    eval_cmd = app.add_subcommand("eval");
    add_run_options(*eval_cmd, eval, kRunEval);
  }
  // `args` without the program's name; throws CLI::ParseError as main's parse does.
  void parse(const std::vector<std::string>& args) {
    std::vector<std::string> all = {"zerorun"};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> ptrs;
    for (std::string& a : all) ptrs.push_back(&a[0]);
    app.parse(static_cast<int>(ptrs.size()), ptrs.data());
  }
};

bool same(const TrainOptions& a, const TrainOptions& b, const RunOption& r) {
  return std::visit([&](auto m) { return a.*m == b.*m; }, r.member);
}

// Equal in every option the schema declares, and in what no option sets.
void require_equal(const TrainOptions& a, const TrainOptions& b) {
  for (const RunOption& r : run_options()) {
    INFO(r.name);
    CHECK(same(a, b, r));
  }
  CHECK(a.eval_only == b.eval_only);
  CHECK(a.device_note == b.device_note);
}

// The launcher's command line -> its TrainOptions -> rank_command -> parsed as `train`: the rank's TrainOptions.
TrainOptions round_trip(const TrainOptions& launched, std::vector<std::string>* rank_argv = nullptr) {
  const std::vector<std::string> cmd = rank_command(launched);
  REQUIRE(cmd.size() >= 2);
  CHECK(cmd[0] == platform::executable_path());
  CHECK(cmd[1] == "train");
  Parsers rank;
  rank.parse(std::vector<std::string>(cmd.begin() + 1, cmd.end()));
  REQUIRE(*rank.train_cmd);
  if (rank_argv) *rank_argv = cmd;
  return rank.train;
}

const std::vector<std::string> kBase = {"m x.bin", "--config", "my c's.json"};

// Values to try for an option, in turn, until one passes its check and sets something other than the default.
const std::vector<std::string> kCandidates = {"dir with space/it's $HOME.bin", "7", "cuda", "mpi"};

// A value `r` accepts on the launcher's command line that changes its member from the default.
std::string accepted_value(const RunOption& r) {
  for (const std::string& v : kCandidates) {
    Parsers p;
    try {
      std::vector<std::string> args = kBase;
      args.insert(args.end(), {r.name, v});
      p.parse(args);
    } catch (const CLI::ParseError&) {
      continue;
    }
    if (!same(p.launch, TrainOptions{}, r)) return v;
  }
  FAIL("no candidate value passes " << r.name << "'s check: add one to kCandidates");
  return "";
}

}  // namespace

TEST_CASE("run options: every forwarded option round-trips from the launcher to a rank", "[cli]") {
  std::vector<std::string> all = kBase;
  for (const RunOption& r : run_options()) {
    if (!r.forwarded() || r.positional() || r.required) continue;
    SECTION(r.name) {
      const std::string v = accepted_value(r);
      std::vector<std::string> args = kBase;
      args.insert(args.end(), {r.name, v});
      Parsers p;
      p.parse(args);
      CHECK(p.launch.model_path == "m x.bin");
      CHECK(p.launch.config_path == "my c's.json");
      std::vector<std::string> argv;
      const TrainOptions rank = round_trip(p.launch, &argv);
      require_equal(p.launch, rank);
      CHECK(std::find(argv.begin(), argv.end(), r.name) != argv.end());
    }
    all.insert(all.end(), {r.name, accepted_value(r)});
  }
  SECTION("all at once") {
    Parsers p;
    p.parse(all);
    require_equal(p.launch, round_trip(p.launch));
  }
  SECTION("none: the required options only") {
    Parsers p;
    p.parse(kBase);
    require_equal(p.launch, round_trip(p.launch));
  }
  SECTION("an empty value is passed on as given (the rank reports it)") {
    Parsers p;
    std::vector<std::string> args = kBase;
    args.insert(args.end(), {"--data", ""});
    p.parse(args);
    REQUIRE(p.launch.data == std::string());
    require_equal(p.launch, round_trip(p.launch));
  }
}

TEST_CASE("run options: each command registers the options the schema gives it", "[cli]") {
  Parsers p;
  for (const RunOption& r : run_options()) {
    INFO(r.name);
    CHECK((p.app.get_option_no_throw(r.name) != nullptr) == ((r.commands & kRunLaunch) != 0));
    CHECK((p.train_cmd->get_option_no_throw(r.name) != nullptr) == ((r.commands & kRunTrain) != 0));
    CHECK((p.eval_cmd->get_option_no_throw(r.name) != nullptr) == ((r.commands & kRunEval) != 0));
    if (r.required && (r.commands & kRunTrain)) CHECK(p.train_cmd->get_option(r.name)->get_required());
    if (r.commands & kRunLaunch) CHECK(!p.app.get_option(r.name)->get_required());  // a subcommand may stand in
  }
  // --eval_batches is eval's own: the launcher and train refuse it.
  CHECK_THROWS_AS(Parsers().parse({"m.bin", "--config", "c.json", "--eval_batches", "2"}), CLI::ParseError);
  CHECK_THROWS_AS(Parsers().parse({"train", "m.bin", "--config", "c.json", "--eval_batches", "2"}), CLI::ParseError);
  Parsers e;
  e.parse({"eval", "m.bin", "--config", "c.json", "--eval_batches", "2"});
  CHECK(e.eval.eval_batches == 2);
  // The checks: the same on the launcher and on a rank.
  for (const std::vector<std::string>& bad : std::vector<std::vector<std::string>>{
           {"--steps", "0"}, {"--seed", "-1"}, {"--device", "tpu"}, {"--comm", "gloo"}, {"--micro_batch_size", "x"}}) {
    INFO(bad[0] << " " << bad[1]);
    std::vector<std::string> args = {"m.bin", "--config", "c.json", bad[0], bad[1]};
    CHECK_THROWS_AS(Parsers().parse(args), CLI::ParseError);
    args.insert(args.begin(), "train");
    CHECK_THROWS_AS(Parsers().parse(args), CLI::ParseError);
  }
}

TEST_CASE("run options: the rank command is the one the launcher has always written", "[cli]") {
  Parsers p;
  p.parse({"m.bin", "--config", "c.json"});
  std::vector<std::string> cmd = rank_command(p.launch);
  cmd.erase(cmd.begin());
  CHECK(cmd == std::vector<std::string>{"train", "m.bin", "--config", "c.json", "--device", "auto"});

  Parsers q;
  q.parse(
      {"--comm",     "mpi", "--device",           "cpu",         "--resume",    "latest", "--final_weights", "f.st",
       "--seq_len",  "16",  "--micro_batch_size", "4",           "--seed",      "0",      "--log_dir",       "l",
       "--save_dir", "s",   "--eval_interval",    "2",           "--eval_data", "e",      "--data",          "a*.bin,b",
       "--steps",    "3",   "--config",           "my c's.json", "m x.bin"});
  cmd = rank_command(q.launch);
  cmd.erase(cmd.begin());
  CHECK(cmd == std::vector<std::string>{"train",
                                        "m x.bin",
                                        "--config",
                                        "my c's.json",
                                        "--steps",
                                        "3",
                                        "--data",
                                        "a*.bin,b",
                                        "--eval_data",
                                        "e",
                                        "--eval_interval",
                                        "2",
                                        "--save_dir",
                                        "s",
                                        "--log_dir",
                                        "l",
                                        "--seed",
                                        "0",
                                        "--micro_batch_size",
                                        "4",
                                        "--seq_len",
                                        "16",
                                        "--final_weights",
                                        "f.st",
                                        "--resume",
                                        "latest",
                                        "--device",
                                        "cpu",
                                        "--comm",
                                        "mpi"});
}
