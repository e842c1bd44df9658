// The multi-rank launcher's supervision of its launcher process (mpirun / mpiexec / srun): stop signals (console
// events on Windows) become a graceful stop of every rank; a failed rank ends the job within a bounded time, with one
// root-cause report read from the launcher's output (FailureReport); the exit code says what ended the job. The process
// and signal handling itself is the platform layer's (platform::Child).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <system_error>
#include <vector>

#include "zerorun/error.h"
#include "zerorun/fsutil.h"
#include "zerorun/launch.h"
#include "zerorun/platform.h"
#include "zerorun/rank_status.h"

namespace zerorun::launch {

namespace {
// Removes what a save stopped midway leaves: "<name>.tmp.<pid>" files in save_dir and its global_step*/ folders, and
// the shards of a global_step*/ folder that has no manifest yet. Returns how many files went.
int remove_temp_files(const std::string& save_dir) {
  namespace fs = std::filesystem;
  int n = 0;
  std::vector<std::string> dirs = {save_dir};
  auto names = [](const std::string& dir) {
    std::vector<std::string> out;
    std::error_code ec;
    for (fs::directory_iterator it(platform::to_path(dir), ec), end; !ec && it != end; it.increment(ec))
      out.push_back(platform::generic_path(it->path().filename()));
    return out;
  };
  for (size_t i = 0; i < dirs.size(); ++i) {
    for (const std::string& name : names(dirs[i])) {
      const std::string path = dirs[i] + "/" + name;
      if (name.find(".tmp.") != std::string::npos) {
        if (platform::remove_file(path)) ++n;
      } else if (i == 0 && name.rfind("global_step", 0) == 0 && is_directory(path)) {
        dirs.push_back(path);  // shards sit directly in global_step<N>/
      }
    }
  }
  // A save's folder without its manifest (written last, before `latest`) is incomplete: its shards go too, and the
  // folder when nothing else is in it.
  for (size_t i = 1; i < dirs.size(); ++i) {
    if (path_exists(dirs[i] + "/manifest.json")) continue;
    for (const std::string& name : names(dirs[i]))
      if (name.rfind("zero_rank_", 0) == 0 && name.size() > 12 &&
          name.compare(name.size() - 12, 12, ".safetensors") == 0 && platform::remove_file(dirs[i] + "/" + name))
        ++n;
    std::error_code ec;
    fs::remove(platform::to_path(dirs[i]), ec);  // only when empty
  }
  return n;
}
}  // namespace

FailureReport::Rank& FailureReport::at(int rank) {
  if (rank >= static_cast<int>(ranks_.size())) ranks_.resize(rank + 1);
  ranks_[rank].rank = rank;
  return ranks_[rank];
}

void FailureReport::fail(Rank& r) {
  r.failed = true;
  // A watchdog's timeout, a failed MPI call or a lost launcher process is usually what a peer's death does to a rank:
  // it is the root cause only until a rank's own death or error is heard of.
  const bool consequence = r.event == "watchdog" || r.event == "launcher_gone" ||
                           (r.event == "error" && r.msg.find("zerorun: error: MPI ") != std::string::npos);
  if (first_ < 0 || (first_consequence_ && !consequence)) {
    first_ = r.rank;
    first_consequence_ = consequence;
  }
}

bool FailureReport::line(const std::string& text) {
  rank_status::Report rep;
  if (rank_status::parse(text, &rep)) {
    if (rep.rank > 10000000) return false;
    Rank& r = at(rep.rank);
    world_ = std::max(world_, rep.world);
    r.host = rep.host;
    r.pid = rep.pid;
    r.state = rank_status::describe_state(rep);
    if (!r.failed) {
      r.event = rep.event;
      r.msg = rep.msg;
      r.code = rep.code;
      r.source = "its own report";
      if (rep.event != "signal") fail(r);  // a stop signal is the job's teardown (or a graceful stop)
    }
    return false;
  }
  static const std::regex noticed(
      R"(noticed that process rank (\d+) with PID (\d+) on node (\S+) exited on signal (\d+))");
  static const std::regex proc_name(R"(Process name:\s*\[\[\d+,\d+\],(\d+)\])");
  static const std::regex exit_code_re(R"(^\s*Exit code:\s*(-?\d+))");
  static const std::regex lost(R"(Remote daemon:\s*\S+ on node (\S+))");
  std::smatch m;
  if (text.find("noticed that process rank") != std::string::npos && std::regex_search(text, m, noticed)) {
    Rank& r = at(std::stoi(m[1]));
    if (r.host.empty()) r.host = m[3];
    if (r.pid < 0) r.pid = std::stoi(m[2]);
    if (!r.failed) {
      r.signal = std::stoi(m[4]);
      r.code = 128 + r.signal;
      r.event = "killed";
      r.source = "mpirun's report";
      fail(r);
    }
  } else if (text.find("Process name:") != std::string::npos && std::regex_search(text, m, proc_name)) {
    pending_exit_rank_ = std::stoi(m[1]);
  } else if (pending_exit_rank_ >= 0 && std::regex_search(text, m, exit_code_re)) {
    Rank& r = at(pending_exit_rank_);
    pending_exit_rank_ = -1;
    if (!r.failed && std::stoi(m[1]) != stop_code_) {
      r.code = std::stoi(m[1]);
      r.event = "exit";
      r.source = "mpirun's report";
      fail(r);
    }
  } else if (text.find("Remote daemon:") != std::string::npos && std::regex_search(text, m, lost)) {
    lost_hosts_.push_back(m[1]);
    daemon_lost_ = true;
  } else if (text.find("ORTE has lost communication with a remote daemon") != std::string::npos ||
             text.find("ORTE was unable to reliably start one or more daemons") != std::string::npos) {
    daemon_lost_ = true;  // also what OpenMPI says when a started daemon's ssh ends (keepalives on a dead link)
  }
  return true;
}

int FailureReport::exit_code(int launcher_code) const {
  if (first_ < 0) return launcher_code;
  const int c = ranks_[first_].code;
  return c > 0 ? c : launcher_code ? launcher_code : 1;
}

std::string FailureReport::render(int launcher_code) const {
  // The host as the hostfile names it, with the name the rank (or mpirun) gave when that differs.
  auto host_of = [&](const Rank& r) {
    const std::string placed = r.rank < static_cast<int>(rank_hosts_.size()) ? rank_hosts_[r.rank] : "";
    if (placed.empty()) return r.host.empty() ? std::string("?") : r.host;
    return r.host.empty() || r.host == placed ? placed : placed + " (" + r.host + ")";
  };
  auto what = [&](const Rank& r) -> std::string {
    if (r.event == "killed")
      return "exited on signal " + std::to_string(r.signal) + " (" + platform::signal_description(r.signal) + ")";
    if (r.event == "watchdog") return "collective timed out (watchdog), exit code " + std::to_string(r.code);
    if (r.event == "launcher_gone") return "its launcher process went away, exit code " + std::to_string(r.code);
    if (r.event == "signal") return "stopped by signal " + std::to_string(r.code - 128);
    return "exited with code " + std::to_string(r.code) + (r.event == "error" ? " (error)" : "");
  };
  std::string o;
  const char* rule = "zerorun: ==================================================================\n";
  o += rule;
  int world = std::max<int>({world_, static_cast<int>(rank_hosts_.size()), static_cast<int>(ranks_.size())});
  if (first_ >= 0) {
    const Rank& f = ranks_[first_];
    o += "zerorun: job failed; root cause:\n";
    o += "zerorun:   rank " + std::to_string(f.rank) + " on host " + host_of(f) +
         (f.pid > 0 ? " (pid " + std::to_string(f.pid) + ")" : "") + ": " + what(f) + " [" + f.source + "]\n";
    if (!f.msg.empty()) o += "zerorun:   error: " + f.msg + "\n";
    if (!f.state.empty()) o += "zerorun:   state: " + f.state + "\n";
  } else if (daemon_lost_) {
    // The ranks mpirun could still reach told their state when it ended them; the others are where it was lost.
    std::string silent;
    for (int i = 0; i < world; ++i)
      if (i >= static_cast<int>(ranks_.size()) || ranks_[i].event.empty()) {
        Rank none;
        none.rank = i;
        silent += std::string(silent.empty() ? "" : ", ") + std::to_string(i) + " on host " + host_of(none);
      }
    o += "zerorun: job failed; root cause: " + argv0_ + " lost (or could not start) a remote host's daemon";
    o += silent.empty() ? "\n" : "; no word from rank " + silent + " (that host or its link is down)\n";
  } else {
    o += "zerorun: job failed: the launcher exited with code " + std::to_string(launcher_code) +
         " and no rank reported a failure\n";
  }
  if (world > 1 || first_ < 0) {
    o += "zerorun: " + std::string(first_ >= 0 ? "other ranks" : "ranks") + ":\n";
    for (int i = 0; i < world; ++i) {
      if (i == first_) continue;
      const Rank* r = i < static_cast<int>(ranks_.size()) && ranks_[i].rank == i ? &ranks_[i] : nullptr;
      Rank none;
      none.rank = i;
      const std::string h = host_of(r ? *r : none);
      o += "zerorun:   rank " + std::to_string(i) + " on host " + h + ": ";
      if (!r || r->event.empty()) {
        o += "no report (its host unreachable, or it ended without a word)";
      } else {
        o += what(*r);
        if (!r->state.empty()) o += (r->event == "signal" ? " at " : "; ") + r->state;
        if (r->failed && !r->msg.empty()) o += "; " + r->msg;
      }
      o += "\n";
    }
  }
  for (const std::string& h : lost_hosts_) o += "zerorun: " + argv0_ + " lost contact with host " + h + "\n";
  o += "zerorun: exit code " + std::to_string(exit_code(launcher_code));
  if (first_ >= 0) o += " (rank " + std::to_string(first_) + "'s)";
  o += "; the launcher's was " + std::to_string(launcher_code) + "\n";
  o += rule;
  return o;
}

int supervise(const std::vector<std::string>& argv, const std::string& save_dir,
              const std::vector<std::string>& rank_hosts) {
  ZR_CHECK(!argv.empty(), "supervise: empty command");
  const std::string hint = argv[0] == "srun" ? "" : " (install openmpi-bin)";
  ZR_CHECK(platform::find_executable(argv[0]), "cannot start ", argv[0], ": not found", hint);
  FailureReport report(rank_hosts, platform::generic_path(platform::to_path(argv[0]).filename()));
  using clock = std::chrono::steady_clock;
  clock::time_point failed_at{};
  bool failed = false;
  platform::Child child(argv, hint, /*capture=*/true, rank_status::kPrefix);
  child.set_line_filter([&](int, const std::string& line) {
    const bool pass = report.line(line);
    if (!failed && report.failed()) failed = true, failed_at = clock::now();
    return pass;
  });
  int stop = 0, escalated = 0;
  bool forced = false;
  const int code = child.wait([&](int sig) {
    if (failed && escalated < 2) {  // a rank failed: the launcher has 3 s to end the job, then 5 s more
      const double since = std::chrono::duration<double>(clock::now() - failed_at).count();
      if (escalated == 0 && since >= 3) {
        escalated = 1;
        std::fprintf(stderr, "zerorun: %s still runs 3 s after a rank failed: sending it SIGTERM\n", argv[0].c_str());
        child.send(platform::kStopTerminate);
      } else if (escalated == 1 && since >= 8) {
        escalated = 2;
        std::fprintf(stderr, "zerorun: %s still runs 8 s after a rank failed: killing it and its processes\n",
                     argv[0].c_str());
        child.kill_all();
      }
    }
    if (sig == platform::kStopTerminate || sig == platform::kStopHangup || sig == platform::kStopGraceful) {
      if (!stop) {
        stop = sig;
        std::fprintf(
            stderr, "zerorun: %s: every rank stops after its current step%s; a second signal stops them at once\n",
            platform::stop_name(sig), save_dir.empty() ? "" : (" and saves a checkpoint in " + save_dir).c_str());
        report.stopping(128 + platform::kStopGraceful);  // the ranks' exit code after a graceful stop
        child.send(platform::kStopGraceful);             // mpirun, mpiexec and srun forward it to every rank
      } else {
        forced = true;
        child.send(platform::kStopTerminate);
      }
    } else if (sig == platform::kStopInterrupt) {
      if (!stop) stop = sig;
      forced = true;
      child.send(platform::kStopInterrupt);
    }
  });
  // Whatever the launcher left on this host (ranks, ssh clients waiting on a dead link) ends now.
  const int left = child.end_leftovers(2.0);
  if (left) std::fprintf(stderr, "zerorun: ended %d process(es) %s left behind on this host\n", left, argv[0].c_str());
  if (report.failed() || (code != 0 && !stop)) std::fputs(report.render(code).c_str(), stderr);
  if (!stop) return report.exit_code(code);
  const bool saved = !forced && code == 128 + platform::kStopGraceful;  // the ranks' graceful-stop exit code
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
        platform::stop_name(stop), removed, save_dir.c_str(), latest.c_str());
  }
  if (report.failed()) return report.exit_code(code);
  return stop == platform::kStopGraceful ? code : 128 + stop;
}

}  // namespace zerorun::launch
