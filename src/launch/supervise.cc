// The multi-rank launcher's supervision of its launcher process (mpirun / mpiexec / srun): stop signals become a
// graceful stop of every rank, and the exit code says what ended the job.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "zerorun/error.h"
#include "zerorun/fsutil.h"
#include "zerorun/launch.h"

namespace zerorun::launch {

namespace {
// Removes what a save stopped midway leaves: "<name>.tmp.<pid>" files in save_dir and its global_step*/ folders, and
// the shards of a global_step*/ folder that has no manifest yet. Returns how many files went.
int remove_temp_files(const std::string& save_dir) {
  int n = 0;
  std::vector<std::string> dirs = {save_dir};
  for (size_t i = 0; i < dirs.size(); ++i) {
    DIR* d = opendir(dirs[i].c_str());
    if (!d) continue;
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name, path = dirs[i] + "/" + name;
      if (name.find(".tmp.") != std::string::npos) {
        if (unlink(path.c_str()) == 0) ++n;
      } else if (i == 0 && name.rfind("global_step", 0) == 0 && is_directory(path)) {
        dirs.push_back(path);  // shards sit directly in global_step<N>/
      }
    }
    closedir(d);
  }
  // A save's folder without its manifest (written last, before `latest`) is incomplete: its shards go too, and the
  // folder when nothing else is in it.
  for (size_t i = 1; i < dirs.size(); ++i) {
    if (path_exists(dirs[i] + "/manifest.json")) continue;
    DIR* d = opendir(dirs[i].c_str());
    if (!d) continue;
    std::vector<std::string> shards;
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind("zero_rank_", 0) == 0 && name.size() > 12 &&
          name.compare(name.size() - 12, 12, ".safetensors") == 0)
        shards.push_back(dirs[i] + "/" + name);
    }
    closedir(d);
    for (auto& f : shards)
      if (unlink(f.c_str()) == 0) ++n;
    rmdir(dirs[i].c_str());
  }
  return n;
}
const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGINT:
      return "SIGINT";
  }
  return "a signal";
}
}  // namespace

// Whether `cmd` names an executable (a path, or a name found in PATH), as execvp would find it.
static bool executable(const std::string& cmd) {
  if (cmd.find('/') != std::string::npos) return access(cmd.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  size_t b = 0;
  for (;;) {
    const size_t e = dirs.find(':', b);
    const std::string d = dirs.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (access(((d.empty() ? "." : d) + "/" + cmd).c_str(), X_OK) == 0) return true;
    if (e == std::string::npos) return false;
    b = e + 1;
  }
}

int supervise(const std::vector<std::string>& argv, const std::string& save_dir) {
  ZR_CHECK(!argv.empty(), "supervise: empty command");
  ZR_CHECK(executable(argv[0]), "cannot start ", argv[0], ": not found",
           argv[0] == "srun" ? "" : " (install openmpi-bin)");
  sigset_t stops, old;
  sigemptyset(&stops);
  for (int s : {SIGTERM, SIGINT, SIGUSR1, SIGHUP, SIGCHLD}) sigaddset(&stops, s);
  sigprocmask(SIG_BLOCK, &stops, &old);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = getpid();
  const pid_t child = fork();
  ZR_CHECK(child >= 0, "cannot start ", argv[0], ": fork: ", std::strerror(errno));
  if (child == 0) {
    // Its own process group: a signal sent to the whole job (a terminal's, a scheduler's) reaches the ranks through
    // this launcher as a graceful stop, not through mpirun as a kill. No terminal input: a background process group
    // reading it would be stopped.
    setpgid(0, 0);
    // The launcher killed outright (SIGKILL: nothing to forward) still ends the job, not an orphaned mpirun.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(128 + SIGTERM);
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, 0);
    sigprocmask(SIG_SETMASK, &old, nullptr);
    std::vector<char*> av;
    for (auto& x : argv) av.push_back(const_cast<char*>(x.c_str()));
    av.push_back(nullptr);
    execvp(av[0], av.data());
    std::fprintf(stderr, "zerorun: error: cannot start %s: %s%s\n", argv[0].c_str(), std::strerror(errno),
                 argv[0] == "srun" ? "" : " (install openmpi-bin)");
    _exit(127);
  }
  setpgid(child, child);  // also here: no window where a signal to the group would reach it
  int stop = 0, status = 0;
  bool forced = false;
  for (;;) {
    const pid_t w = waitpid(child, &status, WNOHANG);
    if (w == child) break;
    siginfo_t si;
    const int sig = sigwaitinfo(&stops, &si);
    if (sig < 0 || sig == SIGCHLD) continue;
    if (sig == SIGTERM || sig == SIGHUP || sig == SIGUSR1) {
      if (!stop) {
        stop = sig;
        std::fprintf(stderr,
                     "zerorun: %s: every rank stops after its current step%s; a second signal stops them at once\n",
                     signal_name(sig), save_dir.empty() ? "" : (" and saves a checkpoint in " + save_dir).c_str());
        kill(child, SIGUSR1);  // mpirun, mpiexec and srun forward SIGUSR1 to every rank
      } else {
        forced = true;
        kill(child, SIGTERM);
      }
    } else if (sig == SIGINT) {
      if (!stop) stop = SIGINT;
      forced = true;
      kill(child, SIGINT);
    }
  }
  sigprocmask(SIG_SETMASK, &old, nullptr);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (!stop) return code;
  const bool saved = !forced && code == 128 + SIGUSR1;  // the ranks' graceful-stop exit code
  if (!save_dir.empty() && !saved) {
    const int removed = remove_temp_files(save_dir);
    std::string latest = "none";
    try {
      if (path_exists(save_dir + "/latest")) latest = read_file(save_dir + "/latest");
      while (!latest.empty() && (latest.back() == '\n' || latest.back() == '\r')) latest.pop_back();
    } catch (const Error&) {
    }
    std::fprintf(
        stderr,
        "zerorun: stopped by %s before the checkpoint was complete: removed %d file(s) of the unfinished save in %s; "
        "'latest' is unchanged (%s)\n",
        signal_name(stop), removed, save_dir.c_str(), latest.c_str());
  }
  return stop == SIGUSR1 ? code : 128 + stop;
}

}  // namespace zerorun::launch
