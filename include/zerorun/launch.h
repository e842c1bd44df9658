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

// A host name (letters, digits, '-', '_', dot-separated labels not starting or ending with '-') or an IP literal.
bool valid_host_name(const std::string& name);
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
// The command as one line a POSIX shell runs as is (each word quoted where it needs to be): for --dry_run.
std::string shell_quote(const std::vector<std::string>& argv);
// Runs the launcher command (argv stays an array) in its own process group and waits for it. SIGTERM, SIGHUP or
// SIGUSR1 become a graceful stop (SIGUSR1 forwarded: every rank stops after its step and saves to save_dir); a
// second signal stops the ranks at once; SIGINT is passed on. Returns the exit code: the launcher's own, or
// 128 + the signal that stopped the job (SIGTERM: 143). A stop that ended before the ranks' checkpoint was
// complete removes the save's temporary files in save_dir and says so; `latest` keeps naming the previous one.
int supervise(const std::vector<std::string>& argv, const std::string& save_dir);

}  // namespace zerorun::launch
