// The multi-rank launcher's supervision of its launcher process (mpirun / mpiexec / srun): stop signals (console
// events on Windows) become a graceful stop of every rank, and the exit code says what ended the job. The process
// and signal handling itself is the platform layer's (platform::Child).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

#include "zerorun/error.h"
#include "zerorun/fsutil.h"
#include "zerorun/launch.h"
#include "zerorun/platform.h"

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

int supervise(const std::vector<std::string>& argv, const std::string& save_dir) {
  ZR_CHECK(!argv.empty(), "supervise: empty command");
  const std::string hint = argv[0] == "srun" ? "" : " (install openmpi-bin)";
  ZR_CHECK(platform::find_executable(argv[0]), "cannot start ", argv[0], ": not found", hint);
  platform::Child child(argv, hint);
  int stop = 0;
  bool forced = false;
  const int code = child.wait([&](int sig) {
    if (sig == platform::kStopTerminate || sig == platform::kStopHangup || sig == platform::kStopGraceful) {
      if (!stop) {
        stop = sig;
        std::fprintf(
            stderr, "zerorun: %s: every rank stops after its current step%s; a second signal stops them at once\n",
            platform::stop_name(sig), save_dir.empty() ? "" : (" and saves a checkpoint in " + save_dir).c_str());
        child.send(platform::kStopGraceful);  // mpirun, mpiexec and srun forward it to every rank
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
  if (!stop) return code;
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
  return stop == platform::kStopGraceful ? code : 128 + stop;
}

}  // namespace zerorun::launch
