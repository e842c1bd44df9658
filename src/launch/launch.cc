// Hostfile / include-exclude parsing, rank placement, launcher argv.
#include "zerorun/launch.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <sstream>

#include "zerorun/error.h"
#include "zerorun/fsutil.h"

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
  unsigned char v6[16];
  if (name.find(':') != std::string::npos) return inet_pton(AF_INET6, name.c_str(), v6) == 1;  // an IPv6 literal
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

std::vector<std::string> build_command(const LaunchRequest& r, const std::vector<Placement>& p,
                                       const std::vector<std::string>& rank_cmd) {
  int total = 0;
  std::string hostlist, slotmap;
  for (auto& x : p) {
    total += static_cast<int>(x.slots.size());
    hostlist += (hostlist.empty() ? "" : ",") + x.host + ":" + std::to_string(x.slots.size());
    std::string ids;
    for (int s : x.slots) ids += (ids.empty() ? "" : "+") + std::to_string(s);
    slotmap += (slotmap.empty() ? "" : ";") + x.host + "=" + ids;
  }
  ZR_CHECK(r.master_addr.empty() || valid_host_name(r.master_addr), "--master_addr '", printable(r.master_addr),
           "' is not a host name or IP address");
  const bool local_only = p.size() == 1 && r.hosts.empty();
  int threads = std::max(1, r.local_cores / std::max(1, static_cast<int>(p.front().slots.size())));
  std::vector<std::pair<std::string, std::string>> env = {
      {"OMP_NUM_THREADS", std::to_string(threads)}, {"ZERORUN_SLOTS", slotmap}, {"MASTER_PORT", r.master_port}};
  env.push_back({"MASTER_ADDR", r.master_addr.empty() ? p.front().host : r.master_addr});
  std::vector<std::string> a;
  if (r.launcher == "openmpi") {
    a = {r.mpirun};
    if (r.as_root) a.push_back("--allow-run-as-root");
    if (local_only && total > r.local_cores) a.push_back("--oversubscribe");
    for (const std::string& x : std::vector<std::string>{"-np", std::to_string(total), "--bind-to", "none"})
      a.push_back(x);
    if (!local_only) a.push_back("--host"), a.push_back(hostlist);
    for (auto& [k, v] : env) a.push_back("-x"), a.push_back(k + "=" + v);
  } else if (r.launcher == "mpich") {
    a = {r.mpirun, "-n", std::to_string(total)};
    if (!local_only) a.push_back("-hosts"), a.push_back(hostlist);
    for (auto& [k, v] : env) a.push_back("-genv"), a.push_back(k), a.push_back(v);
  } else if (r.launcher == "slurm") {
    a = {"srun", "-n", std::to_string(total)};
    if (!local_only) {
      std::string nodes;
      for (auto& x : p) nodes += (nodes.empty() ? "" : ",") + x.host;
      a.push_back("--nodelist=" + nodes);
      a.push_back("--ntasks-per-node=" + std::to_string(p.front().slots.size()));
    }
    std::string e = "--export=ALL";
    for (auto& [k, v] : env) e += "," + k + "=" + v;
    a.push_back(e);
  } else {
    ZR_FAIL("--launcher must be openmpi, mpich or slurm, got '", r.launcher, "'");
  }
  std::istringstream extra(r.launcher_args);
  std::string w;
  while (extra >> w) a.push_back(w);
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
