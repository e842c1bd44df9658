// The platform layer: every call into the operating system that differs between POSIX and Windows goes through
// here, so nothing above src/core calls a POSIX- or Win32-only function. CMake compiles src/core/platform_posix.cc
// or src/core/platform_win32.cc (never both); the code above sees one interface and no #ifdef.
//
// Paths are std::string holding UTF-8. On Windows every function here converts them to UTF-16 for the wide Win32
// calls, and paths zerorun writes (messages, manifests) use forward slashes on both platforms (generic_path()).
#pragma once
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace zerorun::platform {

// ---- files ----
// Files are always binary (O_BINARY on Windows: text mode would turn every "\n" byte into "\r\n").
// Returns a descriptor (>= 0) or -1 with *err set to the reason.
int file_create(const std::string& path, std::string* err);  // write-only, created or truncated, 0644
int64_t file_write(int fd, const void* data, size_t n);  // like write(2): bytes written, -1 on error (EINTR retried)
bool file_sync(int fd, std::string* err);                // fsync / FlushFileBuffers: on disk when it returns
void file_close(int fd);
// Atomically replaces `to` by `from` (rename(2); MoveFileEx with REPLACE_EXISTING | WRITE_THROUGH on Windows, where
// rename() onto an existing file fails).
bool replace_file(const std::string& from, const std::string& to, std::string* err);
// Makes a rename in `dir` durable (fsync of the directory on POSIX; Windows has no directory handle to flush and
// WRITE_THROUGH covers the rename, so nothing to do there).
void sync_directory(const std::string& dir);
bool remove_file(const std::string& path);  // true when it was removed

enum class FileKind { Missing, Regular, Directory, Fifo, CharDevice, BlockDevice, Socket, Other };
// What `path` is (following symlinks), and its size when regular. *err (optional) gets the reason for Missing.
FileKind file_kind(const std::string& path, uint64_t* size = nullptr, std::string* err = nullptr);
const char* file_kind_name(FileKind k);  // "a directory", "a FIFO (named pipe)", ...

// Paths matching a shell wildcard pattern (*, ?, [...] in any component), sorted; empty when none matches. A pattern
// without wildcards matches itself when it exists.
std::vector<std::string> glob(const std::string& pattern);

// A path as zerorun writes it: UTF-8 with forward slashes on every platform.
std::string generic_path(const std::filesystem::path& p);
// A UTF-8 string as a path (std::filesystem::path(std::string) would read it in the ANSI code page on Windows).
// Everything that opens a file by a std::string path goes through it: std::ifstream in(to_path(p), ...), and the
// std::filesystem calls (exists, create_directories, ...) get to_path(p), never the string (which converts the same
// way). Paths come back as generic_path(p), never p.string() (ANSI on Windows).
std::filesystem::path to_path(const std::string& utf8);

// ---- processes ----
// The program's arguments as UTF-8: argv as it is on POSIX; on Windows, where main's argv is in the ANSI code page
// (a path with a letter outside it arrives as '?'), the wide command line (CommandLineToArgvW) converted, and the
// console set to print UTF-8 (SetConsoleOutputCP).
std::vector<std::string> utf8_args(int argc, char** argv);
int process_id();
bool is_root_user();            // euid 0 (mpirun then needs --allow-run-as-root); false on Windows
std::string executable_path();  // this program's own file (/proc/self/exe; GetModuleFileNameW)
// Whether `cmd` names an executable: a path, or a name found in PATH (with PATHEXT's extensions on Windows).
bool find_executable(const std::string& cmd);
bool stderr_is_terminal();
int usable_cores();
// The operating system, its version and the machine: "Linux 6.1.0-18-amd64 x86_64" (uname), "Windows 10.0.19045
// x86_64" (RtlGetVersion, GetNativeSystemInfo): `zerorun report`.
std::string os_name();
std::string host_name();  // gethostname / GetComputerNameEx                          // cores this process may run on
                          // (its affinity mask), at least 1
bool is_ipv6_literal(const std::string& s);  // inet_pton(AF_INET6)
// Runs argv[0] (searched in PATH) with argv, waits, and returns its exit code (128 + signal when a signal ended it);
// -1 with *err when it could not start. stdin, stdout and stderr are inherited.
int run_process(const std::vector<std::string>& argv, std::string* err);
// Dies at once without running any handler (SIGKILL; TerminateProcess with 137): fault-injection tests.
[[noreturn]] void kill_self_hard();

// A child process (the multi-rank launcher's mpirun / mpiexec / srun) started in its own process group with stdin
// from the null device, which ends when this process ends, while the stop events below are delivered to the waiter.
// On POSIX this process also becomes a child subreaper, so what the child leaves behind (ranks, ssh) stays
// findable and killable after the child is gone (end_leftovers).
class Child {
 public:
  // Starts argv; throws zerorun::Error naming argv[0] and `hint` (e.g. " (install openmpi-bin)") when it cannot.
  // capture: the child's stdout and stderr come through pipes (POSIX; ignored on Windows, where they are inherited):
  // each complete line goes to the line filter and is written to this process's stdout/stderr unless the filter
  // says not to, in the order it came. A partial line (no newline yet, e.g. a progress line) is passed through at
  // once unless it starts like `hold_prefix`, the start of the lines a filter may hold back.
  Child(const std::vector<std::string>& argv, const std::string& hint, bool capture = false,
        const std::string& hold_prefix = "");
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  // Called with each complete captured line (stream 1 or 2, without its newline); false holds the line back.
  void set_line_filter(std::function<bool(int stream, const std::string& line)> filter);
  // Sends a stop event (kStop* below) to the child: SIGUSR1/SIGTERM/SIGINT on POSIX; on Windows the console control
  // event (CTRL_BREAK for a graceful stop, as mpiexec forwards it) or termination for kStopTerminate.
  void send(int stop_code);
  // Kills the child and its process group at once (SIGKILL; the job object's processes on Windows).
  void kill_all();
  // After the child ended: every process it left behind (descendants reparented to this process) gets SIGTERM,
  // and SIGKILL after grace_s; returns how many there were (0 on Windows, where the job object ends them).
  int end_leftovers(double grace_s);
  // Waits until the child exits; each stop event this process receives meanwhile is passed to on_event (the
  // handlers installed by install_stop_events are not run), and on_event(0) is called at least every 250 ms (for
  // the caller's timers). Returns its exit code (128 + signal for a signal).
  template <class F>
  int wait(F&& on_event) {
    for (;;) {
      int ev = 0;
      const int code = wait_step(&ev);
      on_event(ev);
      if (code >= 0) return code;
    }
  }

 private:
  int wait_step(int* event);  // exit code when it ended, else -1 with *event set (0 when nothing happened)
  struct Impl;
  Impl* impl_;
};
// The parent's process id (getppid), 0 where not known (Windows): a rank notices its launcher went away.
int parent_process_id();

// ---- stop events ----
// Stop codes are POSIX signal numbers on POSIX; Windows' console control events map onto the same meanings:
// CTRL_C -> kStopInterrupt, CTRL_BREAK -> kStopGraceful, CTRL_CLOSE -> kStopHangup, LOGOFF/SHUTDOWN -> kStopTerminate.
extern const int kStopGraceful;                 // SIGUSR1: stop after the current step (schedulers, the launcher)
extern const int kStopTerminate;                // SIGTERM
extern const int kStopInterrupt;                // SIGINT
extern const int kStopHangup;                   // SIGHUP
const char* stop_name(int stop_code);           // "SIGTERM", ... ("a signal" for others)
std::string signal_description(int stop_code);  // strsignal(): "User defined signal 1", ...
// The graceful stop: the first kStopGraceful / kStopTerminate event calls on_first(code) (from a signal handler or
// the console handler thread: it must only store to an atomic); a second one takes the default action (death).
void install_stop_events(void (*on_first)(int code));

// ---- crashes ----
// A fatal fault (SIGSEGV/SIGBUS/SIGILL/SIGFPE; an unhandled SEH exception on Windows) prints
// "[zerorun] fatal signal ... in pid P, rank R; backtrace:" and the frames to stderr, then dies as the fault would.
void install_crash_backtrace(int (*rank)());

// ---- memory ----
uint64_t peak_rss_bytes();  // the process's peak resident set (getrusage ru_maxrss; PeakWorkingSetSize)
void* aligned_alloc(size_t alignment, size_t bytes);  // bytes a multiple of alignment; nullptr when out of memory
void aligned_free(void* p);

// ---- time ----
void utc_time(std::time_t t, std::tm* out);  // gmtime_r / gmtime_s

// ---- environment ----
void set_env(const std::string& name, const std::string& value);  // setenv(…, 1) / _putenv_s
void unset_env(const std::string& name);
std::vector<std::string> environment();  // this process's NAME=VALUE entries (environ; GetEnvironmentStringsW)
std::string temp_dir();                  // $TMPDIR or /tmp; GetTempPath (forward slashes, no trailing slash)
// A new, empty directory under temp_dir() whose name starts with prefix (mkdtemp).
std::string make_temp_dir(const std::string& prefix);

// ---- GPU collectives ----
// Whether NCCL exists for this platform (Linux). Windows has none: GPU ranks default to --comm mpi (host-staged).
extern const bool kHaveNccl;

// ---- shared libraries ----
// dlopen (RTLD_GLOBAL with global) / LoadLibrary; nullptr with *err (dlerror / the Windows message) when missing.
void* load_library(const std::string& name, std::string* err, bool global = false);
void* library_symbol(void* lib, const char* name);  // nullptr when absent
std::string library_path_of(void* symbol);          // the file of the library holding it (dladdr); "" if unknown

}  // namespace zerorun::platform
