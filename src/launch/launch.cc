// Hostfile / include-exclude parsing, rank placement, launcher argv.
#include "zerorun/launch.h"

#include <omp.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "zerorun/error.h"
#include "zerorun/fsutil.h"
#include "zerorun/platform.h"

namespace zerorun::launch {

namespace {
std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}
// The name as printable ASCII for messages (control, bidi and other non-ASCII bytes as \xNN).
std::string printable(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      o += static_cast<char>(c);
    } else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02X", c);
      o += b;
    }
  }
  return o;
}
int to_int(const std::string& s, const std::string& what) {
  ZR_CHECK(!s.empty() && s.find_first_not_of("0123456789") == std::string::npos, what, ": '", s,
           "' is not a non-negative integer");
  ZR_CHECK(s.size() <= 6, what, ": '", s, "' is too large (at most 999999)");
  return std::stoi(s);
}
}  // namespace

bool valid_host_name(const std::string& name) {
  if (name.empty() || name.size() > 253) return false;
  if (name.find(':') != std::string::npos) return platform::is_ipv6_literal(name);
  // A host name (RFC 1123 labels, plus '_' that real clusters use) or an IPv4 literal: dot-separated labels of
  // letters, digits, '-' and '_', none empty, none starting or ending with '-' (no option can pass as a host).
  size_t label = 0;
  for (size_t i = 0; i <= name.size(); ++i) {
    const char c = i < name.size() ? name[i] : '.';
    if (c == '.') {
      if (label == 0 || label > 63 || name[i - 1] == '-' || name[i - label] == '-') return false;
      label = 0;
      continue;
    }
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
    ++label;
  }
  return true;
}

std::vector<Host> parse_hostfile(const std::string& text, const std::string& source) {
  std::vector<Host> hosts;
  std::istringstream in(text);
  std::string line;
  int ln = 0;
  while (std::getline(in, line)) {
    ++ln;
    std::string where = source + ":" + std::to_string(ln);
    if (auto h = line.find('#'); h != std::string::npos) line = line.substr(0, h);
    line = trim(line);
    if (line.empty()) continue;
    std::istringstream ls(line);
    std::string name, slots, extra;
    ls >> name >> slots >> extra;
    ZR_CHECK(!slots.empty() && extra.empty() && slots.rfind("slots=", 0) == 0, where,
             ": expected 'HOSTNAME slots=N', got '", line, "'");
    ZR_CHECK(valid_host_name(name), where, ": '", printable(name),
             "' is not a host name or IP address (letters, digits, '-', '_' and '.', not starting with '-'; or an "
             "IPv6 literal)");
    Host h{name, to_int(slots.substr(6), where + ": slots")};
    ZR_CHECK(h.slots > 0, where, ": slots must be positive");
    for (auto& o : hosts) ZR_CHECK(o.name != h.name, where, ": host '", h.name, "' is listed twice");
    hosts.push_back(h);
  }
  ZR_CHECK(!hosts.empty(), source, ": hostfile lists no hosts");
  return hosts;
}

std::vector<Host> load_hostfile(const std::string& path) { return parse_hostfile(read_file(path), path); }

std::map<std::string, std::set<int>> parse_filter(const std::string& spec, const std::string& flag) {
  std::map<std::string, std::set<int>> r;
  std::istringstream in(spec);
  std::string part;
  while (std::getline(in, part, '@')) {
    part = trim(part);
    ZR_CHECK(!part.empty(), flag, " '", spec, "': empty host entry");
    std::string host = part, slots;
    if (auto c = part.find(':'); c != std::string::npos) host = part.substr(0, c), slots = part.substr(c + 1);
    ZR_CHECK(!host.empty(), flag, " '", spec, "': missing host name");
    ZR_CHECK(!r.count(host), flag, " '", spec, "': host '", host, "' given twice");
    std::set<int>& s = r[host];
    if (part.find(':') != std::string::npos) {
      std::istringstream ss(slots);
      std::string id;
      while (std::getline(ss, id, ',')) s.insert(to_int(trim(id), flag + " '" + spec + "' slot"));
      ZR_CHECK(!s.empty(), flag, " '", spec, "': no slots after ':'");
    }
  }
  ZR_CHECK(!r.empty(), flag, " is empty");
  return r;
}

std::vector<Placement> place(const LaunchRequest& r) {
  std::vector<Host> hosts = r.hosts;
  if (hosts.empty()) hosts = {{"localhost", r.num_gpus > 0 ? r.num_gpus : 1}};
  ZR_CHECK(r.include.empty() || r.exclude.empty(), "--include and --exclude cannot be used together");
  std::vector<Placement> out;
  for (auto& h : hosts) {
    Placement p{h.name, {}};
    for (int i = 0; i < h.slots; ++i) p.slots.push_back(i);
    out.push_back(p);
  }
  auto check_known = [&](const std::map<std::string, std::set<int>>& f, const char* flag) {
    for (auto& host_slots : f) {
      const std::string& host = host_slots.first;
      const std::set<int>& slots = host_slots.second;
      auto it = std::find_if(hosts.begin(), hosts.end(), [&](const Host& h) { return h.name == host; });
      ZR_CHECK(it != hosts.end(), flag, ": host '", host, "' is not in the hostfile");
      for (int s : slots)
        ZR_CHECK(s < it->slots, flag, ": host '", host, "' has slots 0..", it->slots - 1, ", not ", s);
    }
  };
  if (!r.include.empty()) {
    auto f = parse_filter(r.include, "--include");
    check_known(f, "--include");
    std::vector<Placement> kept;
    for (auto& p : out) {
      auto it = f.find(p.host);
      if (it == f.end()) continue;
      if (!it->second.empty()) p.slots.assign(it->second.begin(), it->second.end());
      kept.push_back(p);
    }
    out = kept;
  }
  if (!r.exclude.empty()) {
    auto f = parse_filter(r.exclude, "--exclude");
    check_known(f, "--exclude");
    std::vector<Placement> kept;
    for (auto& p : out) {
      auto it = f.find(p.host);
      if (it != f.end()) {
        if (it->second.empty()) continue;  // whole host excluded
        std::vector<int> s;
        for (int x : p.slots)
          if (!it->second.count(x)) s.push_back(x);
        p.slots = s;
      }
      if (!p.slots.empty()) kept.push_back(p);
    }
    out = kept;
  }
  if (r.num_nodes > 0) {
    ZR_CHECK(r.num_nodes <= static_cast<int>(out.size()), "--num_nodes ", r.num_nodes, " but only ", out.size(),
             " host(s) are available");
    out.resize(static_cast<size_t>(r.num_nodes));
  }
  if (r.num_gpus > 0 && !r.hosts.empty())
    for (auto& p : out) {
      ZR_CHECK(r.num_gpus <= static_cast<int>(p.slots.size()), "--num_gpus ", r.num_gpus, " but host '", p.host,
               "' has ", p.slots.size(), " slot(s)");
      p.slots.resize(static_cast<size_t>(r.num_gpus));
    }
  ZR_CHECK(!out.empty(), "no ranks left to launch after --include/--exclude/--num_nodes");
  return out;
}

std::vector<std::string> shell_split(const std::string& s, const std::string& option) {
  std::vector<std::string> out;
  std::string w;
  bool in_word = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) out.push_back(w), w.clear(), in_word = false;
    } else if (c == '\'') {
      const size_t e = s.find('\'', i + 1);
      ZR_CHECK(e != std::string::npos, option, " '", printable(s), "': unterminated ' quote");
      w += s.substr(i + 1, e - i - 1), i = e, in_word = true;
    } else if (c == '"') {
      size_t j = i + 1;
      for (; j < s.size() && s[j] != '"'; ++j) {
        if (s[j] == '\\' && j + 1 < s.size() && std::string("\"\\$`\n").find(s[j + 1]) != std::string::npos) {
          if (s[j + 1] != '\n') w += s[j + 1];
          ++j;
        } else {
          w += s[j];
        }
      }
      ZR_CHECK(j < s.size(), option, " '", printable(s), "': unterminated \" quote");
      i = j, in_word = true;
    } else if (c == '\\') {
      ZR_CHECK(i + 1 < s.size(), option, " '", printable(s), "': a trailing backslash escapes nothing");
      if (s[i + 1] != '\n') w += s[i + 1], in_word = true;
      ++i;
    } else {
      w += c, in_word = true;
    }
  }
  if (in_word) out.push_back(w);
  return out;
}

bool forwarded_name(const std::string& n) {
  if (n == "ZERORUN_SLOTS") return false;
  for (const char* prefix : {"ZERORUN_", "NCCL_", "UCX_"})
    if (n.rfind(prefix, 0) == 0) return true;
  return n == "OMP_NUM_THREADS";
}

namespace {
bool valid_env_name(const std::string& n) {
  if (n.empty() || std::isdigit(static_cast<unsigned char>(n[0]))) return false;
  for (unsigned char c : n)
    if (!std::isalnum(c) && c != '_') return false;
  return true;
}
void set_var(std::vector<EnvVar>& env, EnvVar v) {
  for (auto& e : env)
    if (e.name == v.name) {
      e = std::move(v);
      return;
    }
  env.push_back(std::move(v));
}
std::string strip(const std::string& s) {  // Python's str.strip(): every blank, newline included
  size_t b = s.find_first_not_of(" \t\r\n\v\f"), e = s.find_last_not_of(" \t\r\n\v\f");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}
}  // namespace

std::vector<EnvVar> parse_env_file(const std::string& text, const std::string& source) {
  std::vector<EnvVar> env;
  std::istringstream in(text);
  std::string line;
  int ln = 0;
  while (std::getline(in, line)) {
    ++ln;
    const std::string t = strip(line);
    if (t.empty() || t[0] == '#') continue;
    const std::string where = source + ":" + std::to_string(ln);
    const size_t eq = t.find('=');
    ZR_CHECK(eq != std::string::npos, where, ": expected 'NAME=VALUE', got '", printable(t), "'");
    const std::string name = strip(t.substr(0, eq));
    ZR_CHECK(valid_env_name(name), where, ": '", printable(name),
             "' is not an environment variable name (letters, digits and '_', not starting with a digit)");
    ZR_CHECK(t.find('\0') == std::string::npos, where, ": a NUL byte in the value");
    set_var(env, {name, strip(t.substr(eq + 1)), false});
  }
  return env;
}

std::vector<std::string> env_file_paths(const char* ds_env_file, const char* home) {
  const std::string name = ds_env_file && *ds_env_file ? ds_env_file : ".deepspeed_env";
  std::vector<std::string> paths;
  // As Python's os.path.join: an absolute name stays itself (DeepSpeed then reads that file twice; once is enough).
  if (name[0] == '/') return {name};
  if (home && *home) paths.push_back(std::string(home) + "/" + name);
  paths.push_back("./" + name);
  return paths;
}

std::vector<EnvVar> job_environment(const std::vector<std::string>& vars,
                                    const std::vector<std::string>& env_files) {
  std::vector<EnvVar> env;
  for (const std::string& e : vars) {
    const size_t eq = e.find('=');
    if (eq == std::string::npos || !forwarded_name(e.substr(0, eq))) continue;
    set_var(env, {e.substr(0, eq), e.substr(eq + 1), true});
  }
  for (const std::string& f : env_files) {
    if (platform::file_kind(f) != platform::FileKind::Regular) continue;  // DeepSpeed: os.path.isfile
    for (EnvVar& v : parse_env_file(read_file(f), f)) set_var(env, std::move(v));
  }
  return env;
}

std::vector<EnvVar> job_environment() {
  return job_environment(platform::environment(), env_file_paths(std::getenv("DS_ENV_FILE"), std::getenv("HOME")));
}

bool valid_nic_list(const std::string& nic) {
  if (nic.empty()) return false;
  std::istringstream in(nic);
  std::string n;
  size_t count = 0;
  while (std::getline(in, n, ',')) {
    ++count;
    if (n.empty() || n.size() > 15 || n[0] == '-') return false;
    for (unsigned char c : n)
      if (!std::isalnum(c) && c != '_' && c != '-' && c != '.' && c != ':') return false;
  }
  return count > 0 && nic.back() != ',';
}

int host_threads(const std::map<std::string, std::string>& env, int cores) {
  auto get = [&](const char* k) -> std::string {
    auto it = env.find(k);
    return it == env.end() ? "" : it->second;
  };
  if (env.count("OMP_NUM_THREADS")) return 0;
  auto num = [](const std::string& v) {
    if (v.empty() || v.size() > 6 || v.find_first_not_of("0123456789") != std::string::npos) return 0;
    return std::stoi(v);
  };
  int local = num(get("OMPI_COMM_WORLD_LOCAL_SIZE"));
  if (!local) local = num(get("MPI_LOCALNRANKS"));
  if (!local && !get("SLURM_STEP_TASKS_PER_NODE").empty()) {
    // "2(x3),1": tasks on each node of the step, node SLURM_NODEID's entry taken.
    int node = num(get("SLURM_NODEID")), at = 0;
    std::istringstream in(get("SLURM_STEP_TASKS_PER_NODE"));
    std::string part;
    while (!local && std::getline(in, part, ',')) {
      const size_t x = part.find("(x");
      const int tasks = num(part.substr(0, x));
      const int reps = x == std::string::npos ? 1 : num(part.substr(x + 2, part.size() - x - 3));
      if (node < at + reps) local = tasks;
      at += reps;
    }
  }
  if (!local) local = num(get("ZERORUN_LOCAL_RANKS"));
  return std::max(1, cores / std::max(1, local));
}

int apply_host_threads() {
  std::map<std::string, std::string> env;
  for (const char* k : {"OMP_NUM_THREADS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_STEP_TASKS_PER_NODE",
                        "SLURM_NODEID", "ZERORUN_LOCAL_RANKS"})
    if (const char* v = std::getenv(k)) env[k] = v;
  const int t = host_threads(env, platform::usable_cores());
  if (t > 0) {
    platform::set_env("OMP_NUM_THREADS", std::to_string(t));
    omp_set_num_threads(t);
  }
  return t;
}

std::vector<std::string> build_command(const LaunchRequest& r, const std::vector<Placement>& p,
                                       const std::vector<std::string>& rank_cmd) {
  int total = 0, most_local = 0;
  std::string hostlist, slotmap;
  for (auto& x : p) {
    total += static_cast<int>(x.slots.size());
    most_local = std::max(most_local, static_cast<int>(x.slots.size()));
    hostlist += (hostlist.empty() ? "" : ",") + x.host + ":" + std::to_string(x.slots.size());
    std::string ids;
    for (int s : x.slots) ids += (ids.empty() ? "" : "+") + std::to_string(s);
    slotmap += (slotmap.empty() ? "" : ";") + x.host + "=" + ids;
  }
  ZR_CHECK(r.master_addr.empty() || valid_host_name(r.master_addr), "--master_addr '", printable(r.master_addr),
           "' is not a host name or IP address");
  ZR_CHECK(r.nic.empty() || valid_nic_list(r.nic), "--nic '", printable(r.nic),
           "' is not a comma-separated list of network interface names");
  const bool local_only = p.size() == 1 && r.hosts.empty();
  // The job's environment: the user's (launching environment, then .deepspeed_env), then what the launcher sets,
  // which wins. OMP_NUM_THREADS is left to each rank (its own host's cores / ranks on that host) unless given.
  std::vector<EnvVar> env;
  auto set = [&](const std::string& k, const std::string& v) {
    for (auto& e : env)
      if (e.name == k) {
        e = {k, v, false};
        return;
      }
    env.push_back({k, v, false});
  };
  for (const EnvVar& v : r.env) {
    if (v.name == "ZERORUN_COMM_TIMEOUT") {  // checked here too: one message before any rank starts
      char* end = nullptr;
      const double t = std::strtod(v.value.c_str(), &end);
      ZR_CHECK(!v.value.empty() && *end == '\0' && t >= 0 && t < 1e9, "ZERORUN_COMM_TIMEOUT '", printable(v.value),
               "' is not a number of seconds (0 turns the watchdog off)");
    }
    if (v.name != "ZERORUN_SLOTS" && v.name != "MASTER_ADDR" && v.name != "MASTER_PORT") env.push_back(v);
  }
  set("ZERORUN_SLOTS", slotmap);
  set("MASTER_PORT", r.master_port);
  set("MASTER_ADDR", r.master_addr.empty() ? p.front().host : r.master_addr);
  if (r.launcher == "msmpi") set("ZERORUN_LOCAL_RANKS", std::to_string(most_local));  // no per-host count
  if (!r.nic.empty()) set("NCCL_SOCKET_IFNAME", r.nic);
  // The remote shell: agent + arguments (+ -p PORT).
  std::vector<std::string> ssh = r.ssh.empty() ? std::vector<std::string>{} : shell_split(r.ssh, "--ssh");
  ZR_CHECK(r.ssh.empty() || !ssh.empty(), "--ssh is empty");
  ZR_CHECK(ssh.empty() || (!ssh[0].empty() && ssh[0][0] != '-'), "--ssh '", printable(r.ssh),
           "': the first word is the remote shell program (e.g. \"ssh -p 2222\"), not an option");
  if (r.ssh_port > 0) {
    ZR_CHECK(r.ssh_port <= 65535, "--ssh_port ", r.ssh_port, " is not a port (1..65535)");
    if (ssh.empty()) ssh = {"ssh"};
    ssh.push_back("-p");
    ssh.push_back(std::to_string(r.ssh_port));
  }
  std::vector<std::string> a;
  if (r.launcher == "openmpi") {
    a = {r.mpirun};
    if (r.as_root) a.push_back("--allow-run-as-root");
    if (local_only && total > r.local_cores) a.push_back("--oversubscribe");
    for (const std::string& x : std::vector<std::string>{"-np", std::to_string(total), "--bind-to", "none"})
      a.push_back(x);
    if (!local_only) a.push_back("--host"), a.push_back(hostlist);
    if (!ssh.empty()) {
      a.insert(a.end(), {"--mca", "plm_rsh_agent", ssh[0]});
      std::string args;
      for (size_t i = 1; i < ssh.size(); ++i) {
        // OpenMPI splits plm_rsh_args on blanks again: a word with one cannot pass.
        ZR_CHECK(ssh[i].find_first_of(" \t\n") == std::string::npos, "--ssh: '", printable(ssh[i]),
                 "' has a blank, which OpenMPI's plm_rsh_args cannot carry (use ~/.ssh/config)");
        args += (args.empty() ? "" : " ") + ssh[i];
      }
      if (!args.empty()) a.insert(a.end(), {"--mca", "plm_rsh_args", args});
    }
    if (!r.nic.empty()) a.insert(a.end(), {"--mca", "btl_tcp_if_include", r.nic, "--mca", "oob_tcp_if_include", r.nic});
    for (auto& v : env) a.push_back("-x"), a.push_back(v.inherited ? v.name : v.name + "=" + v.value);
  } else if (r.launcher == "mpich") {
    a = {r.mpirun, "-n", std::to_string(total)};
    if (!local_only) a.push_back("-hosts"), a.push_back(hostlist);
    if (!ssh.empty()) {
      ZR_CHECK(ssh.size() == 1, "--ssh/--ssh_port: MPICH's mpiexec takes a launcher program, not its arguments ",
               "(give a wrapper script, or use ~/.ssh/config)");
      a.insert(a.end(), {"-launcher", "ssh", "-launcher-exec", ssh[0]});
    }
    if (!r.nic.empty()) a.push_back("-iface"), a.push_back(r.nic);
    std::string names;
    for (auto& v : env)
      if (v.inherited) names += (names.empty() ? "" : ",") + v.name;
    if (!names.empty()) a.push_back("-genvlist"), a.push_back(names);
    for (auto& v : env)
      if (!v.inherited) a.push_back("-genv"), a.push_back(v.name), a.push_back(v.value);
  } else if (r.launcher == "slurm") {
    ZR_CHECK(ssh.empty(), "--ssh/--ssh_port: srun starts ranks through slurmd, not a remote shell");
    a = {"srun", "-n", std::to_string(total)};
    if (!local_only) {
      std::string nodes;
      for (auto& x : p) nodes += (nodes.empty() ? "" : ",") + x.host;
      a.push_back("--nodelist=" + nodes);
      a.push_back("--ntasks-per-node=" + std::to_string(p.front().slots.size()));
    }
    if (!r.nic.empty()) {  // OpenMPI ranks under srun read their MCA parameters from the environment
      set("OMPI_MCA_btl_tcp_if_include", r.nic);
      set("OMPI_MCA_oob_tcp_if_include", r.nic);
    }
    std::string e = "--export=ALL";
    for (auto& v : env) {
      ZR_CHECK(v.inherited || v.value.find(',') == std::string::npos, "--launcher slurm: ", v.name, "='",
               printable(v.value), "' has a ',', which srun's --export cannot carry (export it in the environment)");
      e += "," + (v.inherited ? v.name : v.name + "=" + v.value);
    }
    a.push_back(e);
  } else if (r.launcher == "msmpi") {
    ZR_CHECK(ssh.empty(), "--ssh/--ssh_port: MS-MPI's mpiexec starts ranks through its launch service, not ssh");
    a = {"mpiexec", "-n", std::to_string(total)};
    if (!local_only) {
      a.push_back("-hosts");
      a.push_back(std::to_string(p.size()));
      for (auto& x : p) a.push_back(x.host), a.push_back(std::to_string(x.slots.size()));
    }
    for (auto& v : env) a.push_back("-env"), a.push_back(v.name), a.push_back(v.value);
  } else {
    ZR_FAIL("--launcher must be openmpi, mpich, slurm or msmpi, got '", r.launcher, "'");
  }
  for (std::string& w : shell_split(r.launcher_args, "--launcher_args")) a.push_back(std::move(w));
  a.insert(a.end(), rank_cmd.begin(), rank_cmd.end());
  return a;
}

std::string shell_quote(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& w : argv) {
    if (!out.empty()) out += ' ';
    const bool plain = !w.empty() && w.find_first_not_of(
                                         "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                         "0123456789_@%+=:,./-") == std::string::npos;
    if (plain) {
      out += w;
      continue;
    }
    out += '\'';
    for (char c : w) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += '\'';
  }
  return out;
}

}  // namespace zerorun::launch
