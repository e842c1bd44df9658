// Launcher logic: DeepSpeed-format hostfiles ("worker-0 slots=8"),
// --include/--exclude filters ("worker-0@worker-1:0,2"), and the MPI
// launcher command as an argv array (never a shell string).
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

namespace zerorun::launch {

struct Host {
  std::string name;
  int slots = 1;
};

// Parses hostfile text; `source` names the file in errors (with line numbers).
std::vector<Host> parse_hostfile(const std::string& text, const std::string& source);
std::vector<Host> load_hostfile(const std::string& path);

// "h1@h2:0,2" -> {h1: {}, h2: {0, 2}}; an empty set means every slot.
std::map<std::string, std::set<int>> parse_filter(const std::string& spec, const std::string& flag);

struct Placement {
  std::string host;
  std::vector<int> slots;  // slot (GPU) ids used on that host
};

struct LaunchRequest {
  std::vector<Host> hosts;  // empty: this machine only ("localhost")
  std::string include, exclude;
  int num_nodes = -1;                // -1: all
  int num_gpus = -1;                 // per node; -1: all slots (or 1 with no hostfile)
  std::string launcher = "openmpi";  // openmpi | mpich | slurm
  std::string launcher_args;         // extra launcher arguments, split on spaces
  std::string master_addr, master_port = "29500";
  std::string mpirun;  // path of mpirun/mpiexec (openmpi/mpich)
  bool as_root = false;
  int local_cores = 1;
};

std::vector<Placement> place(const LaunchRequest& r);
// argv of the launcher + `rank_cmd` (the per-rank command).
std::vector<std::string> build_command(const LaunchRequest& r, const std::vector<Placement>& p,
                                       const std::vector<std::string>& rank_cmd);

}  // namespace zerorun::launch
