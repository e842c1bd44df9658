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

// Splits `s` as a POSIX shell splits words (no expansion): blanks separate words, '...' keeps everything literal,
// "..." keeps everything but \" \\ \$ \` (and \newline), a backslash outside quotes escapes the next character.
// An unterminated quote or a trailing backslash is an error naming `option`.
std::vector<std::string> shell_split(const std::string& s, const std::string& option);

// One variable of the job's environment, forwarded to every rank on every host.
struct EnvVar {
  std::string name, value;
  // Taken from the launching environment: forwarded by name where the launcher reads the value from its own
  // environment (openmpi -x NAME, mpich -genvlist, slurm --export=NAME), so values stay off the command line.
  bool inherited = false;
};
// Whether zerorun forwards this variable of the launching environment to every rank: ZERORUN_*, NCCL_*, UCX_*,
// OMP_NUM_THREADS (not ZERORUN_SLOTS, which the launcher computes).
bool forwarded_name(const std::string& name);
// A DeepSpeed .deepspeed_env file: KEY=VALUE lines (key and value stripped of blanks, the value kept literally
// after the first '='); blank lines and lines starting with '#' are skipped. `source` names the file in errors
// (with line numbers): a line without '=' or a key that is not a variable name.
std::vector<EnvVar> parse_env_file(const std::string& text, const std::string& source);
// Where DeepSpeed looks for it, in its order (a later file's KEY wins): $HOME/NAME, then ./NAME, NAME being
// $DS_ENV_FILE or ".deepspeed_env".
std::vector<std::string> env_file_paths(const char* ds_env_file, const char* home);
// The job's environment: the forwarded variables of `vars` (NAME=VALUE entries), then the regular files among
// `env_files` in order, a later entry replacing an earlier one of the same name.
std::vector<EnvVar> job_environment(const std::vector<std::string>& vars, const std::vector<std::string>& env_files);
// The same from this process's environment and DeepSpeed's files.
std::vector<EnvVar> job_environment();

struct LaunchRequest {
  std::vector<Host> hosts;  // empty: this machine only ("localhost")
  std::string include, exclude;
  int num_nodes = -1;                // -1: all
  int num_gpus = -1;                 // per node; -1: all slots (or 1 with no hostfile)
  std::string launcher = "openmpi";  // openmpi | mpich | slurm | msmpi
  std::string launcher_args;         // extra launcher arguments, split like a shell
  std::string master_addr, master_port = "29500";
  std::string mpirun;  // path of mpirun/mpiexec (openmpi/mpich)
  bool as_root = false;
  int local_cores = 1;
  std::vector<EnvVar> env;  // the job's environment (job_environment())
  std::string ssh;          // remote shell agent and its arguments ("ssh -p 2222 -o X=y"), split like a shell
  int ssh_port = -1;        // -1: the agent's default
  std::string nic;          // network interface(s) for MPI's and NCCL's sockets ("eth1" or "eth1,eth2")
};

// A comma-separated list of interface names (letters, digits, '_', '-', '.', ':'; at most 15 characters each).
bool valid_nic_list(const std::string& nic);

// Threads for one rank: unset (0) when OMP_NUM_THREADS is set; otherwise the host's `cores` divided by the ranks
// on this host, as the MPI launcher tells each rank (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS, SLURM's
// SLURM_STEP_TASKS_PER_NODE + SLURM_NODEID, else ZERORUN_LOCAL_RANKS), at least 1.
int host_threads(const std::map<std::string, std::string>& env, int cores);
// In a rank: host_threads() from this process's environment and the cores it may run on, applied to OpenMP (and
// exported as OMP_NUM_THREADS) when set. Returns the threads set, 0 when OMP_NUM_THREADS was given.
int apply_host_threads();

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
// A job that fails (a rank's error, watchdog or signal death) ends within a bounded time: 3 s after the first
// failure the launcher gets SIGTERM, 8 s after it its process group SIGKILL, and then whatever it left behind on
// this host (ranks, ssh) is ended too; the ranks on other hosts end by their watchdog or when their launcher process
// goes. Then one root-cause report (FailureReport) is printed, and the exit code is the first failing rank's.
// rank_hosts: the host of each rank as placed (for ranks that said nothing).
int supervise(const std::vector<std::string>& argv, const std::string& save_dir,
              const std::vector<std::string>& rank_hosts = {});

// The root-cause report of a failed multi-rank job, in the style of torchrun's, from the lines the launcher's
// output carried. The root cause is the first failure heard of, except that a collective's timeout, a failed MPI call
// or a lost launcher process (what a peer's death does to the others) yields to a later death or error of a rank's
// own. From the ranks' status lines (rank_status.h; held back from the terminal) and, for ranks that died
// without a word, OpenMPI's own messages ("process rank N with PID P on node H exited on signal S", the first
// non-zero exit's "Process name / Exit code", a lost remote daemon's node).
class FailureReport {
 public:
  explicit FailureReport(std::vector<std::string> rank_hosts = {}, std::string launcher = "mpirun")
      : rank_hosts_(std::move(rank_hosts)), argv0_(std::move(launcher)) {}
  // One line of the launcher's stdout or stderr; false when it is to be held back (a rank status line).
  bool line(const std::string& text);
  // Whether a rank failed (an error, a watchdog, its launcher gone, a death by signal, a non-zero exit) or mpirun
  // lost a remote daemon; signals from the job's own teardown (SIGTERM) and graceful stops do not count.
  bool failed() const { return first_ >= 0 || daemon_lost_; }
  // A graceful stop was asked of every rank: a rank's exit with `code` (their graceful-stop exit code) is then the
  // stop, not a failure.
  void stopping(int code) { stop_code_ = code; }
  // The report (several lines, each starting "zerorun: "), given the launcher's exit code.
  std::string render(int launcher_code) const;
  // The first failing rank's exit code (128 + signal for a signal), else launcher_code.
  int exit_code(int launcher_code) const;

 private:
  struct Rank {
    int rank = -1, pid = -1, code = -1, signal = 0;
    std::string host, event, msg, state, source;
    bool failed = false;
  };
  Rank& at(int rank);
  void fail(Rank& r);
  std::vector<std::string> rank_hosts_;
  std::string argv0_;
  bool daemon_lost_ = false;
  std::vector<Rank> ranks_;  // by rank
  int first_ = -1, world_ = -1, pending_exit_rank_ = -1, stop_code_ = -1;
  bool first_consequence_ = false;
  std::vector<std::string> lost_hosts_;
};

}  // namespace zerorun::launch
