// The POSIX (Linux) side of the platform layer (include/zerorun/platform.h): the only file in src/ that calls
// POSIX-only functions. Its Windows twin is platform_win32.cc; CMake compiles one of them.
#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <glob.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <thread>

#include "zerorun/error.h"
#include "zerorun/platform.h"

namespace zerorun::platform {

// ---- files ----
int file_create(const std::string& path, std::string* err) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 && err) *err = std::strerror(errno);
  return fd;
}

int64_t file_write(int fd, const void* data, size_t n) {
  for (;;) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    return static_cast<int64_t>(w);
  }
}

bool file_sync(int fd, std::string* err) {
  if (::fsync(fd) == 0) return true;
  if (err) *err = std::strerror(errno);
  return false;
}

void file_close(int fd) { ::close(fd); }

bool replace_file(const std::string& from, const std::string& to, std::string* err) {
  if (::rename(from.c_str(), to.c_str()) == 0) return true;
  if (err) *err = std::strerror(errno);
  return false;
}

void sync_directory(const std::string& dir) {
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

bool remove_file(const std::string& path) { return ::unlink(path.c_str()) == 0; }

FileKind file_kind(const std::string& path, uint64_t* size, std::string* err) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (err) *err = std::strerror(errno);
    return FileKind::Missing;
  }
  if (size) *size = static_cast<uint64_t>(st.st_size);
  if (S_ISREG(st.st_mode)) return FileKind::Regular;
  if (S_ISDIR(st.st_mode)) return FileKind::Directory;
  if (S_ISFIFO(st.st_mode)) return FileKind::Fifo;
  if (S_ISCHR(st.st_mode)) return FileKind::CharDevice;
  if (S_ISBLK(st.st_mode)) return FileKind::BlockDevice;
  if (S_ISSOCK(st.st_mode)) return FileKind::Socket;
  return FileKind::Other;
}

std::vector<std::string> glob(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t g{};
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.push_back(g.gl_pathv[i]);
  globfree(&g);
  return out;
}

std::string generic_path(const std::filesystem::path& p) { return p.generic_string(); }
std::filesystem::path to_path(const std::string& utf8) { return std::filesystem::path(utf8); }

// ---- processes ----
std::vector<std::string> utf8_args(int argc, char** argv) { return std::vector<std::string>(argv, argv + argc); }
int process_id() { return static_cast<int>(::getpid()); }
bool is_root_user() { return ::geteuid() == 0; }

std::string executable_path() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  ZR_CHECK(n > 0, "cannot find the zerorun executable (/proc/self/exe)");
  return std::string(self, static_cast<size_t>(n));
}

bool find_executable(const std::string& cmd) {
  if (cmd.find('/') != std::string::npos) return ::access(cmd.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  size_t b = 0;
  for (;;) {
    const size_t e = dirs.find(':', b);
    const std::string d = dirs.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (::access(((d.empty() ? "." : d) + "/" + cmd).c_str(), X_OK) == 0) return true;
    if (e == std::string::npos) return false;
    b = e + 1;
  }
}

bool stderr_is_terminal() { return ::isatty(2) != 0; }

int usable_cores() {
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cores = std::max(1, CPU_COUNT(&set));
  return cores;
}

std::string os_name() {
  struct utsname u {};
  if (::uname(&u) != 0) return "POSIX";
  return std::string(u.sysname) + " " + u.release + " " + u.machine;
}

std::string host_name() {
  char hn[256] = {};
  ::gethostname(hn, sizeof hn - 1);
  return hn;
}

bool is_ipv6_literal(const std::string& s) {
  unsigned char v6[16];
  return ::inet_pton(AF_INET6, s.c_str(), v6) == 1;
}

namespace {
std::vector<char*> c_argv(const std::vector<std::string>& argv) {
  std::vector<char*> av;
  for (auto& x : argv) av.push_back(const_cast<char*>(x.c_str()));
  av.push_back(nullptr);
  return av;
}
int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }
}  // namespace

int run_process(const std::vector<std::string>& argv, std::string* err) {
  ZR_CHECK(!argv.empty(), "run_process: empty command");
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t child = ::fork();
  if (child < 0) {
    if (err) *err = std::string("fork: ") + std::strerror(errno);
    return -1;
  }
  if (child == 0) {
    std::vector<char*> av = c_argv(argv);
    ::execvp(av[0], av.data());
    _exit(127);
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0)
    if (errno != EINTR) {
      if (err) *err = std::string("waitpid: ") + std::strerror(errno);
      return -1;
    }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127 && err) *err = "exit code 127 (not found, or not startable)";
  return exit_code(status);
}

void kill_self_hard() {
  ::raise(SIGKILL);
  _exit(137);
}

struct Child::Impl {
  pid_t pid = -1;
  sigset_t stops{}, old{};
  int sigfd = -1;
  bool capture = false;
  std::string hold_prefix;
  std::function<bool(int, const std::string&)> filter;
  struct Stream {
    int fd = -1;       // read end of the pipe; -1 once closed
    int out = 1;       // where its lines go
    std::string buf;   // the line not complete yet
    bool mid = false;  // part of the current line was passed through already
  } streams[2];

  static void write_all(int fd, const char* p, size_t n) {
    while (n) {
      const ssize_t w = ::write(fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return;
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  // Hands complete lines to the filter, passes the rest on where it cannot be a held-back line. eof: flush all.
  void drain(Stream& st, bool eof) {
    size_t start = 0;
    for (size_t nl; (nl = st.buf.find('\n', start)) != std::string::npos; start = nl + 1) {
      const std::string line = st.buf.substr(start, nl - start);
      bool pass = true;
      if (!st.mid && filter) pass = filter(st.out, line);
      if (pass) write_all(st.out, st.buf.data() + start, nl - start + 1);
      st.mid = false;
    }
    st.buf.erase(0, start);
    if (st.buf.empty()) return;
    const size_t k = std::min(st.buf.size(), hold_prefix.size());
    const bool may_hold = !st.mid && !hold_prefix.empty() && st.buf.compare(0, k, hold_prefix, 0, k) == 0;
    if (eof || !may_hold || st.buf.size() > (1u << 16)) {
      if (eof && !st.mid && filter && !filter(st.out, st.buf)) {
        st.buf.clear();
        return;
      }
      write_all(st.out, st.buf.data(), st.buf.size());
      st.buf.clear();
      st.mid = !eof;
    }
  }
  // Reads what is there (non-blocking); false at end of file.
  bool read_some(Stream& st) {
    char b[65536];
    for (;;) {
      const ssize_t n = ::read(st.fd, b, sizeof b);
      if (n > 0) {
        st.buf.append(b, static_cast<size_t>(n));
        if (static_cast<size_t>(n) < sizeof b) break;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      drain(st, true);
      ::close(st.fd);
      st.fd = -1;
      return false;
    }
    drain(st, false);
    return true;
  }
};

Child::Child(const std::vector<std::string>& argv, const std::string& hint, bool capture,
             const std::string& hold_prefix)
    : impl_(new Impl) {
  ZR_CHECK(!argv.empty(), "supervise: empty command");
  sigemptyset(&impl_->stops);
  for (int s : {SIGTERM, SIGINT, SIGUSR1, SIGHUP, SIGCHLD}) sigaddset(&impl_->stops, s);
  sigprocmask(SIG_BLOCK, &impl_->stops, &impl_->old);
  impl_->sigfd = ::signalfd(-1, &impl_->stops, SFD_NONBLOCK | SFD_CLOEXEC);
  // Orphans of the child (ranks, ssh, after mpirun was killed) are reparented here, not to init: end_leftovers().
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  impl_->capture = capture;
  impl_->hold_prefix = hold_prefix;
  int pipes[2][2] = {{-1, -1}, {-1, -1}};
  if (capture)
    for (int i = 0; i < 2; ++i) {
      if (::pipe2(pipes[i], O_CLOEXEC) != 0) {
        const int e = errno;
        sigprocmask(SIG_SETMASK, &impl_->old, nullptr);
        delete impl_;
        ZR_FAIL("cannot start ", argv[0], ": pipe: ", std::strerror(e));
      }
    }
  std::fflush(stdout);
  std::fflush(stderr);
  // The job's output passes through this process: a reader that goes away (`| grep -q`, `| head`) must not kill
  // the supervisor and orphan the ranks. Writes then fail with EPIPE and the output is dropped until the job ends.
  if (capture) ::signal(SIGPIPE, SIG_IGN);
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) {
    const int e = errno;
    sigprocmask(SIG_SETMASK, &impl_->old, nullptr);
    delete impl_;
    ZR_FAIL("cannot start ", argv[0], ": fork: ", std::strerror(e));
  }
  if (child == 0) {
    // Its own process group: a signal sent to the whole job (a terminal's, a scheduler's) reaches the ranks through
    // the parent as a graceful stop, not through mpirun as a kill. No terminal input: a background process group
    // reading it would be stopped.
    ::setpgid(0, 0);
    ::signal(SIGPIPE, SIG_DFL);  // the launcher and the ranks keep the usual behaviour
    // The parent killed outright (SIGKILL: nothing to forward) still ends the job, not an orphaned mpirun.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) _exit(128 + SIGTERM);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, 0);
    if (capture) {
      ::dup2(pipes[0][1], 1);  // dup2 clears O_CLOEXEC on the copies
      ::dup2(pipes[1][1], 2);
    }
    sigprocmask(SIG_SETMASK, &impl_->old, nullptr);
    std::vector<char*> av = c_argv(argv);
    ::execvp(av[0], av.data());
    std::fprintf(stderr, "zerorun: error: cannot start %s: %s%s\n", argv[0].c_str(), std::strerror(errno),
                 hint.c_str());
    _exit(127);
  }
  ::setpgid(child, child);  // also here: no window where a signal to the group would reach it
  impl_->pid = child;
  if (capture)
    for (int i = 0; i < 2; ++i) {
      ::close(pipes[i][1]);
      ::fcntl(pipes[i][0], F_SETFL, O_NONBLOCK);
      impl_->streams[i].fd = pipes[i][0];
      impl_->streams[i].out = i + 1;
    }
}

Child::~Child() {
  for (auto& st : impl_->streams)
    if (st.fd >= 0) {
      impl_->drain(st, true);
      ::close(st.fd);
    }
  if (impl_->sigfd >= 0) ::close(impl_->sigfd);
  sigprocmask(SIG_SETMASK, &impl_->old, nullptr);
  delete impl_;
}

void Child::set_line_filter(std::function<bool(int, const std::string&)> filter) { impl_->filter = std::move(filter); }

void Child::send(int stop_code) {
  if (impl_->pid > 0) ::kill(impl_->pid, stop_code);
}

void Child::kill_all() {
  if (impl_->pid > 0) {
    ::kill(-impl_->pid, SIGKILL);
    ::kill(impl_->pid, SIGKILL);
  }
}

namespace {
// This process's descendants (through /proc's parent links), deepest last.
std::vector<pid_t> descendants() {
  std::vector<std::pair<pid_t, pid_t>> procs;  // pid, ppid
  if (DIR* d = ::opendir("/proc")) {
    while (dirent* e = ::readdir(d)) {
      const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
      if (pid <= 0) continue;
      char path[64];
      std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
      FILE* f = std::fopen(path, "r");
      if (!f) continue;
      char buf[512];
      const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
      std::fclose(f);
      buf[n] = 0;
      const char* close = std::strrchr(buf, ')');  // "pid (comm) state ppid ..."; comm may hold spaces
      char state = 0;
      int ppid = 0;
      if (close && std::sscanf(close + 1, " %c %d", &state, &ppid) == 2 && state != 'Z')
        procs.push_back({pid, static_cast<pid_t>(ppid)});
    }
    ::closedir(d);
  }
  std::vector<pid_t> out = {::getpid()};
  for (size_t i = 0; i < out.size(); ++i)
    for (auto& [pid, ppid] : procs)
      if (ppid == out[i]) out.push_back(pid);
  out.erase(out.begin());
  return out;
}
void reap_all() {
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
}
}  // namespace

int Child::end_leftovers(double grace_s) {
  reap_all();
  std::vector<pid_t> left = descendants();
  if (left.empty()) return 0;
  const int n = static_cast<int>(left.size());
  for (pid_t p : left) ::kill(p, SIGTERM);
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  while (std::chrono::steady_clock::now() < until) {
    reap_all();
    if (descendants().empty()) return n;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (pid_t p : descendants()) ::kill(p, SIGKILL);
  for (int i = 0; i < 40 && !descendants().empty(); ++i) {
    reap_all();
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  reap_all();
  return n;
}

int Child::wait_step(int* event) {
  *event = 0;
  int status = 0;
  if (impl_->pid < 0) return 127;
  pollfd fds[3];
  int nfds = 0;
  fds[nfds++] = {impl_->sigfd, POLLIN, 0};
  for (auto& st : impl_->streams)
    if (st.fd >= 0) fds[nfds++] = {st.fd, POLLIN, 0};
  if (::poll(fds, static_cast<nfds_t>(nfds), 200) > 0) {
    for (auto& st : impl_->streams)
      if (st.fd >= 0) impl_->read_some(st);
    signalfd_siginfo si;
    while (::read(impl_->sigfd, &si, sizeof si) == static_cast<ssize_t>(sizeof si))
      if (si.ssi_signo != SIGCHLD && !*event) *event = static_cast<int>(si.ssi_signo);
  }
  // Reaps the child and any orphan of its tree that ended meanwhile (they are this subreaper's children now).
  bool ended = false;
  for (pid_t p; !ended && (p = ::waitpid(-1, &status, WNOHANG)) > 0;) ended = p == impl_->pid;
  if (ended) {
    // What the child wrote last: read until its pipes end (closed by every process holding them, e.g. a rank
    // mpirun left behind), for at most 2 s.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    for (;;) {
      pollfd pf[2];
      int n = 0;
      for (auto& st : impl_->streams)
        if (st.fd >= 0) pf[n++] = {st.fd, POLLIN, 0};
      if (!n || std::chrono::steady_clock::now() >= until) break;
      if (::poll(pf, static_cast<nfds_t>(n), 100) > 0)
        for (auto& st : impl_->streams)
          if (st.fd >= 0) impl_->read_some(st);
    }
    for (auto& st : impl_->streams)
      if (st.fd >= 0) impl_->drain(st, true), st.buf.clear();
    impl_->pid = -1;
    return exit_code(status);
  }
  return -1;
}

int parent_process_id() { return static_cast<int>(::getppid()); }

// ---- stop events ----
const int kStopGraceful = SIGUSR1;
const int kStopTerminate = SIGTERM;
const int kStopInterrupt = SIGINT;
const int kStopHangup = SIGHUP;

const char* stop_name(int sig) {
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

std::string signal_description(int sig) { return strsignal(sig); }

namespace {
void (*g_on_first)(int) = nullptr;
volatile sig_atomic_t g_seen = 0;
void on_stop(int sig) {
  if (g_seen) {  // a second signal: the stop is not waited for (a step that hangs, impatience)
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  g_seen = 1;
  if (g_on_first) g_on_first(sig);
}
}  // namespace

void install_stop_events(void (*on_first)(int code)) {
  g_on_first = on_first;
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // system calls in flight (file writes, MPI) go on
  for (int s : {SIGUSR1, SIGTERM}) sigaction(s, &sa, nullptr);
}

// ---- crashes ----
namespace {
int (*g_rank)() = nullptr;
void on_fatal(int sig) {
  char head[160];
  const int n = std::snprintf(head, sizeof head, "[zerorun] fatal signal %d (%s) in pid %d, rank %d; backtrace:\n", sig,
                              strsignal(sig), static_cast<int>(getpid()), g_rank ? g_rank() : 0);
  if (n > 0) (void)!::write(STDERR_FILENO, head, static_cast<size_t>(n));
  void* frames[64];
  const int k = backtrace(frames, 64);
  backtrace_symbols_fd(frames, k, STDERR_FILENO);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}
}  // namespace

void install_crash_backtrace(int (*rank)()) {
  g_rank = rank;
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
  for (int s : {SIGSEGV, SIGBUS, SIGILL, SIGFPE}) std::signal(s, on_fatal);
}

// ---- memory ----
uint64_t peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // KiB on Linux
}

void* aligned_alloc(size_t alignment, size_t bytes) { return std::aligned_alloc(alignment, bytes); }
void aligned_free(void* p) { std::free(p); }

// ---- time ----
void utc_time(std::time_t t, std::tm* out) { ::gmtime_r(&t, out); }

// ---- environment ----
void set_env(const std::string& name, const std::string& value) { ::setenv(name.c_str(), value.c_str(), 1); }
void unset_env(const std::string& name) { ::unsetenv(name.c_str()); }

extern "C" char** environ;
std::vector<std::string> environment() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) out.emplace_back(*e);
  return out;
}

std::string temp_dir() {
  const char* t = std::getenv("TMPDIR");
  std::string d = t && *t ? t : "/tmp";
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return d;
}

std::string make_temp_dir(const std::string& prefix) {
  std::string tmpl = temp_dir() + "/" + prefix + "XXXXXX";
  ZR_CHECK(::mkdtemp(tmpl.data()) != nullptr, tmpl, ": cannot create a temporary directory: ", std::strerror(errno));
  return tmpl;
}

const bool kHaveNccl = true;

// ---- shared libraries ----
void* load_library(const std::string& name, std::string* err, bool global) {
  void* h = ::dlopen(name.c_str(), RTLD_NOW | (global ? RTLD_GLOBAL : RTLD_LOCAL));
  if (!h && err) {
    const char* e = ::dlerror();
    *err = e ? e : "not found";
  }
  return h;
}

void* library_symbol(void* lib, const char* name) { return ::dlsym(lib, name); }

std::string library_path_of(void* symbol) {
  Dl_info info{};
  if (::dladdr(symbol, &info) && info.dli_fname) return info.dli_fname;
  return "";
}

}  // namespace zerorun::platform
