// The rank side of the launcher's root-cause report (include/zerorun/rank_status.h): the state a failing rank
// tells, written with write(2) on a preformatted buffer so that a signal handler may write it too.
#include "zerorun/rank_status.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "zerorun/error.h"
#include "zerorun/knobs.h"
#include "zerorun/platform.h"

namespace zerorun::rank_status {
namespace {
std::atomic<bool> g_on{false};
std::atomic<int> g_rank{-1}, g_world{-1};
std::atomic<int64_t> g_step{0}, g_seq{-1}, g_since_ms{0};
std::atomic<bool> g_active{false};
char g_op[32] = "";     // the op's name (copied: async handles own theirs)
char g_host[128] = "";  // set once
int g_fail_rank = -1;
int64_t g_fail_step = -1;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A fixed buffer filled without allocating (signal handlers).
struct Line {
  char b[2048];
  size_t n = 0;
  void put(const char* s) {
    while (*s && n < sizeof b - 2) b[n++] = *s++;
  }
  void put_clean(const char* s) {  // one line: newlines and tabs become spaces
    for (; *s && n < sizeof b - 2; ++s) b[n++] = (*s == '\n' || *s == '\r' || *s == '\t') ? ' ' : *s;
  }
  void num(int64_t v) {
    char t[24];
    int k = 0;
    const bool neg = v < 0;
    uint64_t u = neg ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
    do {
      t[k++] = static_cast<char>('0' + u % 10);
      u /= 10;
    } while (u);
    if (neg) t[k++] = '-';
    while (k && n < sizeof b - 2) b[n++] = t[--k];
  }
  void kv(const char* k, int64_t v) {
    put(" ");
    put(k);
    put("=");
    num(v);
  }
};

void write_line(const char* event, const char* msg, int code) {
  Line l;
  l.put(kPrefix);
  l.put("rank=");
  l.num(g_rank.load());
  l.kv("world", g_world.load());
  l.put(" host=");
  l.put(g_host[0] ? g_host : "?");
  l.kv("pid", platform::process_id());
  l.put(" event=");
  l.put(event);
  l.kv("code", code);
  l.kv("step", g_step.load());
  const bool active = g_active.load();
  if (g_seq.load() >= 0) {
    l.put(" op=");
    l.put(g_op[0] ? g_op : "?");
    l.kv("seq", g_seq.load());
    l.kv("active", active ? 1 : 0);
    if (active) l.kv("for_ms", now_ms() - g_since_ms.load());
  }
  l.put(" msg=");
  l.put_clean(msg);
  l.b[l.n++] = '\n';
  platform::file_write(2, l.b, l.n);
}
}  // namespace

void set_identity(int rank, int world) {
  g_rank.store(rank);
  g_world.store(world);
  if (world > 1 && knobs().rank_status) {
    const std::string h = platform::host_name();
    std::strncpy(g_host, h.c_str(), sizeof g_host - 1);
    for (char* c = g_host; *c; ++c)
      if (*c == ' ' || *c == '=') *c = '_';
    g_on.store(true);
  }
  if (const char* f = knobs().has_fault_inject ? knobs().fault_inject.c_str() : nullptr) {
    int r = -1;
    long long s = -1;
    if (std::sscanf(f, "fail_at_step:%d:%lld", &r, &s) == 2) g_fail_rank = r, g_fail_step = s;
  }
}

bool enabled() { return g_on.load(); }

void set_step(int64_t step) {
  g_step.store(step);
  if (g_fail_rank >= 0 && g_fail_rank == g_rank.load() && step == g_fail_step)
    ZR_FAIL("fault injection (ZERORUN_FAULT_INJECT): rank ", g_fail_rank, " fails at step ", step);
}

void collective_begin(const char* op, int64_t seq) {
  size_t i = 0;
  for (; op[i] && i < sizeof g_op - 1; ++i) g_op[i] = op[i];
  g_op[i] = 0;
  g_seq.store(seq);
  g_since_ms.store(now_ms());
  g_active.store(true);
}

void collective_end() { g_active.store(false); }

void report(const char* event, const std::string& message, int exit_code) {
  static std::atomic<bool> once{false};  // the first failure is the one that counts (an error rethrown, say)
  if (enabled() && !once.exchange(true)) write_line(event, message.c_str(), exit_code);
}

void report_signal(int sig) {
  if (!enabled()) return;
  Line m;
  m.put("stopped by ");
  m.put(platform::stop_name(sig));
  m.b[m.n] = 0;
  write_line("signal", m.b, 128 + sig);
}

bool parse(const std::string& line, Report* out) {
  const size_t plen = std::strlen(kPrefix);
  if (line.compare(0, plen, kPrefix) != 0) return false;
  Report r;
  size_t i = plen;
  while (i < line.size()) {
    const size_t eq = line.find('=', i);
    if (eq == std::string::npos) break;
    const std::string key = line.substr(i, eq - i);
    if (key == "msg") {
      r.msg = line.substr(eq + 1);
      break;
    }
    size_t end = line.find(' ', eq + 1);
    if (end == std::string::npos) end = line.size();
    const std::string v = line.substr(eq + 1, end - eq - 1);
    const long long n = std::strtoll(v.c_str(), nullptr, 10);
    if (key == "rank")
      r.rank = static_cast<int>(n);
    else if (key == "world")
      r.world = static_cast<int>(n);
    else if (key == "pid")
      r.pid = static_cast<int>(n);
    else if (key == "code")
      r.code = static_cast<int>(n);
    else if (key == "host")
      r.host = v;
    else if (key == "event")
      r.event = v;
    else if (key == "op")
      r.op = v;
    else if (key == "step")
      r.step = n;
    else if (key == "seq")
      r.seq = n;
    else if (key == "for_ms")
      r.for_ms = n;
    else if (key == "active")
      r.active = n != 0;
    i = end + 1;
  }
  if (r.rank < 0 || r.event.empty()) return false;
  *out = r;
  return true;
}

std::string describe_state(const Report& r) {
  std::string s = r.step > 0 ? "step " + std::to_string(r.step) : "before the first step";
  if (r.seq < 0) return s;
  if (r.active) {
    char t[32];
    std::snprintf(t, sizeof t, "%.1f", r.for_ms / 1000.0);
    return s + ", in " + r.op + " #" + std::to_string(r.seq) + (r.for_ms >= 0 ? std::string(" for ") + t + " s" : "");
  }
  return s + ", last collective " + r.op + " #" + std::to_string(r.seq) + " (completed)";
}

}  // namespace zerorun::rank_status
