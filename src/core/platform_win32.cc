// The Windows side of the platform layer (include/zerorun/platform.h), for MinGW-w64 and MSVC: the only file in src/
// that calls Win32 functions. Its POSIX twin is platform_posix.cc; CMake compiles one of them. Paths arrive as UTF-8
// and go to the wide (UTF-16) Win32 calls.
#ifndef NOMINMAX
#define NOMINMAX
#endif
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <winsock2.h>
// winsock2 before windows.h
#include <windows.h>
#include <ws2tcpip.h>
// after windows.h
#include <fcntl.h>
#include <io.h>
#include <malloc.h>
#include <process.h>
#include <psapi.h>
#include <shellapi.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <system_error>

#include "zerorun/error.h"
#include "zerorun/platform.h"

namespace zerorun::platform {

namespace {
std::wstring wide(const std::string& s) {
  if (s.empty()) return {};
  const int n = MultiByteToWideChar(CP_UTF8, 0, s.data(), static_cast<int>(s.size()), nullptr, 0);
  std::wstring w(static_cast<size_t>(n), L'\0');
  MultiByteToWideChar(CP_UTF8, 0, s.data(), static_cast<int>(s.size()), w.data(), n);
  return w;
}
std::string narrow(const std::wstring& w) {
  if (w.empty()) return {};
  const int n = WideCharToMultiByte(CP_UTF8, 0, w.data(), static_cast<int>(w.size()), nullptr, 0, nullptr, nullptr);
  std::string s(static_cast<size_t>(n), '\0');
  WideCharToMultiByte(CP_UTF8, 0, w.data(), static_cast<int>(w.size()), s.data(), n, nullptr, nullptr);
  return s;
}
std::string win_error(DWORD code) {
  wchar_t* buf = nullptr;
  FormatMessageW(FORMAT_MESSAGE_ALLOCATE_BUFFER | FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS, nullptr,
                 code, 0, reinterpret_cast<wchar_t*>(&buf), 0, nullptr);
  std::string m = buf ? narrow(buf) : "error " + std::to_string(code);
  if (buf) LocalFree(buf);
  while (!m.empty() && (m.back() == '\n' || m.back() == '\r' || m.back() == ' ' || m.back() == '.')) m.pop_back();
  return m;
}
std::string slashes(std::string s) {
  std::replace(s.begin(), s.end(), '\\', '/');
  return s;
}
}  // namespace

// ---- files ----
int file_create(const std::string& path, std::string* err) {
  const int fd =
      ::_wopen(wide(path).c_str(), _O_WRONLY | _O_CREAT | _O_TRUNC | _O_BINARY | _O_NOINHERIT, _S_IREAD | _S_IWRITE);
  if (fd < 0 && err) *err = std::strerror(errno);
  return fd;
}

int64_t file_write(int fd, const void* data, size_t n) {
  const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n, 1u << 30));  // _write takes an unsigned count
  return ::_write(fd, data, chunk);
}

bool file_sync(int fd, std::string* err) {
  // _commit is FlushFileBuffers on the file's handle.
  if (::_commit(fd) == 0) return true;
  if (err) *err = std::strerror(errno);
  return false;
}

void file_close(int fd) { ::_close(fd); }

bool replace_file(const std::string& from, const std::string& to, std::string* err) {
  if (MoveFileExW(wide(from).c_str(), wide(to).c_str(), MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH))
    return true;
  if (err) *err = win_error(GetLastError());
  return false;
}

void sync_directory(const std::string&) {}  // MOVEFILE_WRITE_THROUGH made the rename durable

bool remove_file(const std::string& path) { return DeleteFileW(wide(path).c_str()) != 0; }

FileKind file_kind(const std::string& path, uint64_t* size, std::string* err) {
  const DWORD attr = GetFileAttributesW(wide(path).c_str());
  if (attr == INVALID_FILE_ATTRIBUTES) {
    if (err) *err = win_error(GetLastError());
    return FileKind::Missing;
  }
  if (attr & FILE_ATTRIBUTE_DIRECTORY) return FileKind::Directory;
  HANDLE h = CreateFileW(wide(path).c_str(), 0, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr,
                         OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL, nullptr);
  if (h == INVALID_HANDLE_VALUE) {  // e.g. a device name; say what it is not
    if (err) *err = win_error(GetLastError());
    return FileKind::Other;
  }
  const DWORD type = GetFileType(h);
  LARGE_INTEGER sz{};
  const bool have_size = GetFileSizeEx(h, &sz);
  CloseHandle(h);
  if (type == FILE_TYPE_PIPE) return FileKind::Fifo;
  if (type == FILE_TYPE_CHAR) return FileKind::CharDevice;
  if (type != FILE_TYPE_DISK) return FileKind::Other;
  if (size && have_size) *size = static_cast<uint64_t>(sz.QuadPart);
  return FileKind::Regular;
}

namespace {
// fnmatch of one path component: *, ?, [abc], [a-z], [!a] / [^a]. Case-insensitive, as Windows' file names are.
bool match(const wchar_t* p, const wchar_t* s) {
  for (; *p; ++p, ++s) {
    if (*p == L'*') {
      while (p[1] == L'*') ++p;
      for (const wchar_t* t = s;; ++t) {
        if (match(p + 1, t)) return true;
        if (!*t) return false;
      }
    }
    if (!*s) return false;
    if (*p == L'?') continue;
    if (*p == L'[') {
      const wchar_t* q = p + 1;
      const bool neg = *q == L'!' || *q == L'^';
      if (neg) ++q;
      bool hit = false;
      const wchar_t c = towlower(*s);
      for (bool first = true; *q && (first || *q != L']'); first = false, ++q) {
        if (q[1] == L'-' && q[2] && q[2] != L']') {
          if (towlower(q[0]) <= c && c <= towlower(q[2])) hit = true;
          q += 2;
        } else if (towlower(*q) == c) {
          hit = true;
        }
      }
      if (*q != L']') {  // no closing bracket: a literal '['
        if (*s != L'[') return false;
        continue;
      }
      if (hit == neg) return false;
      p = q;
      continue;
    }
    if (towlower(*p) != towlower(*s)) return false;
  }
  return !*s;
}
bool has_wild(const std::wstring& s) { return s.find_first_of(L"*?[") != std::wstring::npos; }
}  // namespace

std::vector<std::string> glob(const std::string& pattern) {
  // Split into the part before the first wildcard component and the components from there on.
  const std::wstring w = wide(pattern);
  std::vector<std::wstring> parts;
  size_t b = 0;
  for (size_t i = 0; i <= w.size(); ++i)
    if (i == w.size() || w[i] == L'/' || w[i] == L'\\') {
      parts.push_back(w.substr(b, i - b));
      b = i + 1;
    }
  std::vector<std::wstring> found;
  std::wstring base;
  size_t k = 0;
  for (; k < parts.size() && !has_wild(parts[k]); ++k) base += (k ? L"/" : L"") + parts[k];
  if (k == parts.size()) {
    if (GetFileAttributesW(w.c_str()) != INVALID_FILE_ATTRIBUTES) return {pattern};
    return {};
  }
  std::vector<std::wstring> level = {base};
  for (; k < parts.size(); ++k) {
    std::vector<std::wstring> next;
    for (const std::wstring& dir : level) {
      const std::wstring prefix = dir.empty() ? L"" : dir + L"/";
      if (!has_wild(parts[k])) {
        const std::wstring p = prefix + parts[k];
        if (GetFileAttributesW(p.c_str()) != INVALID_FILE_ATTRIBUTES) next.push_back(p);
        continue;
      }
      WIN32_FIND_DATAW fd;
      HANDLE h = FindFirstFileW((prefix + L"*").c_str(), &fd);
      if (h == INVALID_HANDLE_VALUE) continue;
      std::vector<std::wstring> names;
      do {
        const std::wstring n = fd.cFileName;
        if (n == L"." || n == L"..") continue;
        if (n[0] == L'.' && parts[k][0] != L'.') continue;  // like glob(3): '*' does not match a leading dot
        if (k + 1 < parts.size() && !(fd.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY)) continue;
        if (match(parts[k].c_str(), n.c_str())) names.push_back(n);
      } while (FindNextFileW(h, &fd));
      FindClose(h);
      std::sort(names.begin(), names.end());
      for (auto& n : names) next.push_back(prefix + n);
    }
    level = std::move(next);
  }
  std::vector<std::string> out;
  for (auto& p : level) out.push_back(narrow(p));
  std::sort(out.begin(), out.end());
  return out;
}

std::string generic_path(const std::filesystem::path& p) {
  const auto u8 = p.generic_u8string();  // std::string in C++17, std::u8string in C++20
  return slashes(std::string(u8.begin(), u8.end()));
}
std::filesystem::path to_path(const std::string& utf8) { return std::filesystem::path(wide(utf8)); }

// ---- processes ----
std::vector<std::string> utf8_args(int argc, char** argv) {
  SetConsoleOutputCP(CP_UTF8);  // what zerorun prints is UTF-8
  int n = 0;
  wchar_t** w = CommandLineToArgvW(GetCommandLineW(), &n);
  if (!w || n != argc) {  // not this process's command line as main saw it: keep main's argv
    if (w) LocalFree(w);
    return std::vector<std::string>(argv, argv + argc);
  }
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(narrow(w[i]));
  LocalFree(w);
  return out;
}
int process_id() { return static_cast<int>(GetCurrentProcessId()); }
bool is_root_user() { return false; }

std::string executable_path() {
  std::wstring buf(32768, L'\0');
  const DWORD n = GetModuleFileNameW(nullptr, buf.data(), static_cast<DWORD>(buf.size()));
  ZR_CHECK(n > 0 && n < buf.size(), "cannot find the zerorun executable: ", win_error(GetLastError()));
  buf.resize(n);
  return slashes(narrow(buf));
}

namespace {
std::vector<std::wstring> path_exts() {
  const char* pe = std::getenv("PATHEXT");
  std::string s = pe && *pe ? pe : ".COM;.EXE;.BAT;.CMD";
  std::vector<std::wstring> out = {L""};
  size_t b = 0;
  for (;;) {
    const size_t e = s.find(';', b);
    const std::string x = s.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (!x.empty()) out.push_back(wide(x));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return out;
}
bool is_file(const std::wstring& p) {
  const DWORD a = GetFileAttributesW(p.c_str());
  return a != INVALID_FILE_ATTRIBUTES && !(a & FILE_ATTRIBUTE_DIRECTORY);
}
}  // namespace

bool find_executable(const std::string& cmd) {
  const std::wstring c = wide(cmd);
  const auto exts = path_exts();
  if (c.find_first_of(L"/\\:") != std::wstring::npos) {
    for (auto& x : exts)
      if (is_file(c + x)) return true;
    return false;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = std::string(".;") + (path ? path : "");
  size_t b = 0;
  for (;;) {
    const size_t e = dirs.find(';', b);
    const std::string d = dirs.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (!d.empty())
      for (auto& x : exts)
        if (is_file(wide(d) + L"\\" + c + x)) return true;
    if (e == std::string::npos) return false;
    b = e + 1;
  }
}

bool stderr_is_terminal() { return ::_isatty(2) != 0; }

int usable_cores() {
  DWORD_PTR proc = 0, sys = 0;
  if (GetProcessAffinityMask(GetCurrentProcess(), &proc, &sys) && proc) {
    int n = 0;
    for (; proc; proc &= proc - 1) ++n;
    return n;
  }
  return static_cast<int>(std::max<DWORD>(1, GetActiveProcessorCount(ALL_PROCESSOR_GROUPS)));
}

std::string os_name() {
  // RtlGetVersion tells the real version (GetVersionEx answers 6.2 to a program without a compatibility manifest).
  OSVERSIONINFOW v{};
  v.dwOSVersionInfoSize = sizeof v;
  using RtlGetVersionFn = LONG(WINAPI*)(OSVERSIONINFOW*);
  auto fn = reinterpret_cast<RtlGetVersionFn>(
      reinterpret_cast<void*>(GetProcAddress(GetModuleHandleW(L"ntdll.dll"), "RtlGetVersion")));
  std::string name = "Windows";
  if (fn && fn(&v) == 0)
    name += " " + std::to_string(v.dwMajorVersion) + "." + std::to_string(v.dwMinorVersion) + "." +
            std::to_string(v.dwBuildNumber);
  SYSTEM_INFO si{};
  GetNativeSystemInfo(&si);
  const WORD a = si.wProcessorArchitecture;
  return name + (a == PROCESSOR_ARCHITECTURE_AMD64 ? " x86_64" : a == PROCESSOR_ARCHITECTURE_ARM64 ? " arm64" : "");
}

std::string host_name() {
  wchar_t buf[256];
  DWORD n = 256;
  if (!GetComputerNameExW(ComputerNameDnsHostname, buf, &n)) return "localhost";
  return narrow(std::wstring(buf, n));
}

bool is_ipv6_literal(const std::string& s) {
  IN6_ADDR a{};
  return InetPtonW(AF_INET6, wide(s).c_str(), &a) == 1;
}

namespace {
// One argument quoted for CommandLineToArgvW / the MSVC runtime's parser.
std::wstring quote_arg(const std::wstring& a) {
  if (!a.empty() && a.find_first_of(L" \t\n\v\"") == std::wstring::npos) return a;
  std::wstring q = L"\"";
  for (size_t i = 0;; ++i) {
    size_t bs = 0;
    while (i < a.size() && a[i] == L'\\') ++i, ++bs;
    if (i == a.size()) {
      q.append(bs * 2, L'\\');
      break;
    }
    if (a[i] == L'"') {
      q.append(bs * 2 + 1, L'\\');
      q += L'"';
    } else {
      q.append(bs, L'\\');
      q += a[i];
    }
  }
  return q + L"\"";
}
std::wstring command_line(const std::vector<std::string>& argv) {
  std::wstring cl;
  for (auto& a : argv) cl += (cl.empty() ? L"" : L" ") + quote_arg(wide(a));
  return cl;
}

// Console control events of this process, seen by the supervisor's wait (code) or by the stop handler.
std::atomic<int> g_pending_event{0};
std::atomic<bool> g_supervising{false};
void (*g_on_first)(int) = nullptr;
std::atomic<int> g_seen{0};

int event_code(DWORD type) {
  switch (type) {
    case CTRL_C_EVENT:
      return 2;  // kStopInterrupt
    case CTRL_BREAK_EVENT:
      return 10;  // kStopGraceful
    case CTRL_CLOSE_EVENT:
      return 1;  // kStopHangup
    default:
      return 15;  // LOGOFF, SHUTDOWN: kStopTerminate
  }
}

BOOL WINAPI on_console(DWORD type) {
  const int code = event_code(type);
  if (g_supervising.load()) {
    g_pending_event.store(code);
    return TRUE;
  }
  if (g_on_first && (code == 10 || code == 15 || code == 1)) {
    if (g_seen.exchange(1)) return FALSE;  // a second event: the default handler ends the process
    g_on_first(code == 1 ? 15 : code);
    return TRUE;
  }
  return FALSE;
}

void install_console_handler() {
  static const bool once = [] {
    SetConsoleCtrlHandler(on_console, TRUE);
    return true;
  }();
  (void)once;
}
}  // namespace

int run_process(const std::vector<std::string>& argv, std::string* err) {
  ZR_CHECK(!argv.empty(), "run_process: empty command");
  std::fflush(stdout);
  std::fflush(stderr);
  STARTUPINFOW si{};
  si.cb = sizeof si;
  PROCESS_INFORMATION pi{};
  std::wstring cl = command_line(argv);
  // CreateProcess waits for the child's exit code itself: execvp on Windows returns at once and loses it.
  if (!CreateProcessW(nullptr, cl.data(), nullptr, nullptr, TRUE, 0, nullptr, nullptr, &si, &pi)) {
    if (err) *err = win_error(GetLastError());
    return -1;
  }
  WaitForSingleObject(pi.hProcess, INFINITE);
  DWORD code = 1;
  GetExitCodeProcess(pi.hProcess, &code);
  CloseHandle(pi.hThread);
  CloseHandle(pi.hProcess);
  return static_cast<int>(code);
}

void kill_self_hard() {
  TerminateProcess(GetCurrentProcess(), 137);
  std::_Exit(137);
}

struct Child::Impl {
  HANDLE process = nullptr, job = nullptr;
  DWORD pid = 0;
};

// capture and hold_prefix are not implemented here: the child's output is inherited (no line filter runs), so the
// multi-rank launcher's report knows only the exit code on Windows.
Child::Child(const std::vector<std::string>& argv, const std::string& hint, bool /*capture*/,
             const std::string& /*hold_prefix*/)
    : impl_(new Impl) {
  ZR_CHECK(!argv.empty(), "supervise: empty command");
  install_console_handler();
  g_supervising.store(true);
  std::fflush(stdout);
  std::fflush(stderr);
  SECURITY_ATTRIBUTES sa{sizeof(SECURITY_ATTRIBUTES), nullptr, TRUE};
  HANDLE nul = CreateFileW(L"NUL", GENERIC_READ, FILE_SHARE_READ | FILE_SHARE_WRITE, &sa, OPEN_EXISTING, 0, nullptr);
  STARTUPINFOW si{};
  si.cb = sizeof si;
  si.dwFlags = STARTF_USESTDHANDLES;
  si.hStdInput = nul;
  si.hStdOutput = GetStdHandle(STD_OUTPUT_HANDLE);
  si.hStdError = GetStdHandle(STD_ERROR_HANDLE);
  PROCESS_INFORMATION pi{};
  std::wstring cl = command_line(argv);
  // Its own process group (CTRL_BREAK reaches it and its ranks, not this process), started suspended so that it is
  // in the job object (which ends it when this process ends) before it runs.
  const BOOL ok = CreateProcessW(nullptr, cl.data(), nullptr, nullptr, TRUE,
                                 CREATE_NEW_PROCESS_GROUP | CREATE_SUSPENDED, nullptr, nullptr, &si, &pi);
  const DWORD e = GetLastError();
  if (nul != INVALID_HANDLE_VALUE) CloseHandle(nul);
  if (!ok) {
    g_supervising.store(false);
    delete impl_;
    ZR_FAIL("cannot start ", argv[0], ": ", win_error(e), hint);
  }
  impl_->job = CreateJobObjectW(nullptr, nullptr);
  if (impl_->job) {
    JOBOBJECT_EXTENDED_LIMIT_INFORMATION li{};
    li.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE;
    SetInformationJobObject(impl_->job, JobObjectExtendedLimitInformation, &li, sizeof li);
    AssignProcessToJobObject(impl_->job, pi.hProcess);
  }
  ResumeThread(pi.hThread);
  CloseHandle(pi.hThread);
  impl_->process = pi.hProcess;
  impl_->pid = pi.dwProcessId;
}

Child::~Child() {
  g_supervising.store(false);
  if (impl_->process) CloseHandle(impl_->process);
  if (impl_->job) CloseHandle(impl_->job);
  delete impl_;
}

void Child::send(int stop_code) {
  if (stop_code == 15 && impl_->process) {  // no console event means "terminate": end it
    TerminateProcess(impl_->process, 128 + 15);
    return;
  }
  // A new process group ignores CTRL_C; CTRL_BREAK is the event mpiexec forwards to the ranks.
  GenerateConsoleCtrlEvent(CTRL_BREAK_EVENT, impl_->pid);
}

void Child::set_line_filter(std::function<bool(int, const std::string&)>) {}

void Child::kill_all() {
  if (impl_->job) TerminateJobObject(impl_->job, 137);
  if (impl_->process) TerminateProcess(impl_->process, 137);
}

int Child::end_leftovers(double) { return 0; }  // the job object (KILL_ON_JOB_CLOSE) ends them

int parent_process_id() { return 0; }

int Child::wait_step(int* event) {
  *event = 0;
  if (!impl_->process) return 127;
  if (WaitForSingleObject(impl_->process, 100) == WAIT_OBJECT_0) {
    DWORD code = 1;
    GetExitCodeProcess(impl_->process, &code);
    return static_cast<int>(code);
  }
  *event = g_pending_event.exchange(0);
  return -1;
}

// ---- stop events ----
const int kStopGraceful = 10;
const int kStopTerminate = 15;
const int kStopInterrupt = 2;
const int kStopHangup = 1;

const char* stop_name(int code) {
  switch (code) {
    case 15:
      return "SIGTERM (console logoff/shutdown)";
    case 1:
      return "SIGHUP (console closed)";
    case 10:
      return "SIGUSR1 (Ctrl+Break)";
    case 2:
      return "SIGINT (Ctrl+C)";
  }
  return "a signal";
}

std::string signal_description(int code) {
  switch (code) {
    case 15:
      return "Terminated";
    case 1:
      return "Hangup";
    case 10:
      return "User defined signal 1";
    case 2:
      return "Interrupt";
  }
  return "Signal " + std::to_string(code);
}

void install_stop_events(void (*on_first)(int code)) {
  g_on_first = on_first;
  install_console_handler();
}

// ---- crashes ----
namespace {
int (*g_rank)() = nullptr;
LONG WINAPI on_fatal(EXCEPTION_POINTERS* ep) {
  const DWORD code = ep && ep->ExceptionRecord ? ep->ExceptionRecord->ExceptionCode : 0;
  std::fprintf(stderr, "[zerorun] fatal exception 0x%08lx in pid %lu, rank %d; backtrace:\n",
               static_cast<unsigned long>(code), static_cast<unsigned long>(GetCurrentProcessId()),
               g_rank ? g_rank() : 0);
  void* frames[64];
  const USHORT k = CaptureStackBackTrace(0, 64, frames, nullptr);
  for (USHORT i = 0; i < k; ++i) {
    HMODULE mod = nullptr;
    wchar_t name[MAX_PATH] = L"?";
    if (GetModuleHandleExW(GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS | GET_MODULE_HANDLE_EX_FLAG_UNCHANGED_REFCOUNT,
                           static_cast<LPCWSTR>(frames[i]), &mod))
      GetModuleFileNameW(mod, name, MAX_PATH);
    std::fprintf(
        stderr, "  %s+0x%llx\n", narrow(name).c_str(),
        static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(frames[i]) - reinterpret_cast<uintptr_t>(mod)));
  }
  std::fflush(stderr);
  // End here with the exception's code as the exit status (what Windows' default action gives): passing the
  // exception on would start a debugger where one is registered (wine's winedbg, which then exits 0).
  TerminateProcess(GetCurrentProcess(), code ? static_cast<UINT>(code) : 3u);
  return EXCEPTION_CONTINUE_SEARCH;
}
}  // namespace

void install_crash_backtrace(int (*rank)()) {
  g_rank = rank;
  SetUnhandledExceptionFilter(on_fatal);
}

// ---- memory ----
uint64_t peak_rss_bytes() {
  PROCESS_MEMORY_COUNTERS pmc{};
  pmc.cb = sizeof pmc;
  if (!GetProcessMemoryInfo(GetCurrentProcess(), &pmc, sizeof pmc)) return 0;
  return static_cast<uint64_t>(pmc.PeakWorkingSetSize);
}

void* aligned_alloc(size_t alignment, size_t bytes) { return ::_aligned_malloc(bytes, alignment); }
void aligned_free(void* p) { ::_aligned_free(p); }

// ---- time ----
void utc_time(std::time_t t, std::tm* out) { ::gmtime_s(out, &t); }

// ---- environment ----
void set_env(const std::string& name, const std::string& value) {
  // _wputenv_s also updates the process environment block that child processes inherit.
  ::_wputenv_s(wide(name).c_str(), wide(value).c_str());
}
void unset_env(const std::string& name) { ::_wputenv_s(wide(name).c_str(), L""); }

std::vector<std::string> environment() {
  std::vector<std::string> out;
  wchar_t* block = GetEnvironmentStringsW();
  for (const wchar_t* e = block; e && *e; e += wcslen(e) + 1)
    if (*e != L'=') out.push_back(narrow(e));  // "=C:=C:\..." entries are the shell's drive cwds
  if (block) FreeEnvironmentStringsW(block);
  return out;
}

std::string temp_dir() {
  wchar_t buf[MAX_PATH + 2];
  const DWORD n = GetTempPathW(MAX_PATH + 2, buf);
  std::string d = n ? slashes(narrow(std::wstring(buf, n))) : std::string(".");
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return d;
}

std::string make_temp_dir(const std::string& prefix) {
  std::mt19937_64 rng(static_cast<uint64_t>(GetCurrentProcessId()) * 0x9E3779B97F4A7C15ull ^
                      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  for (int attempt = 0; attempt < 100; ++attempt) {
    char suffix[16];
    std::snprintf(suffix, sizeof suffix, "%06llx", static_cast<unsigned long long>(rng() & 0xffffff));
    const std::string d = temp_dir() + "/" + prefix + suffix;
    if (CreateDirectoryW(wide(d).c_str(), nullptr)) return d;
    if (GetLastError() != ERROR_ALREADY_EXISTS)
      ZR_FAIL(d, ": cannot create a temporary directory: ", win_error(GetLastError()));
  }
  ZR_FAIL("cannot create a temporary directory in ", temp_dir());
}

const bool kHaveNccl = false;

// ---- shared libraries ----
void* load_library(const std::string& name, std::string* err, bool) {
  HMODULE h = LoadLibraryW(wide(name).c_str());
  if (!h && err) *err = win_error(GetLastError());
  return reinterpret_cast<void*>(h);
}

void* library_symbol(void* lib, const char* name) {
  return reinterpret_cast<void*>(GetProcAddress(static_cast<HMODULE>(lib), name));
}

}  // namespace zerorun::platform

namespace zerorun::platform {
std::string library_path_of(void* symbol) {
  HMODULE mod = nullptr;
  wchar_t name[MAX_PATH];
  if (!GetModuleHandleExW(GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS | GET_MODULE_HANDLE_EX_FLAG_UNCHANGED_REFCOUNT,
                          static_cast<LPCWSTR>(symbol), &mod))
    return "";
  const DWORD n = GetModuleFileNameW(mod, name, MAX_PATH);
  return n ? slashes(narrow(std::wstring(name, n))) : "";
}
}  // namespace zerorun::platform
