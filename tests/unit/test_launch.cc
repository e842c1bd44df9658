// Launcher: hostfile parsing, include/exclude, placement, launcher argv.
#include <algorithm>
#include <catch2/catch.hpp>

#include "zerorun/launch.h"

using namespace zerorun::launch;

namespace {
std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}
LaunchRequest two_hosts() {
  LaunchRequest r;
  r.hosts = parse_hostfile("worker-0 slots=4\nworker-1 slots=4\n", "hf");
  r.mpirun = "mpirun";
  r.local_cores = 8;
  return r;
}
}  // namespace

TEST_CASE("hostfile parsing and errors naming the line", "[launch]") {
  auto h = parse_hostfile("# cluster\nworker-0 slots=8\n\n  worker-1   slots=2  # two GPUs\n", "hf");
  REQUIRE(h.size() == 2);
  REQUIRE(h[1].name == "worker-1");
  REQUIRE(h[1].slots == 2);
  REQUIRE_THROWS_WITH(parse_hostfile("a slots=1\nb slots=x\n", "hf"), Catch::Contains("hf:2"));
  REQUIRE_THROWS_WITH(parse_hostfile("a slots=1\na slots=2\n", "hf"),
                      Catch::Contains("hf:2") && Catch::Contains("twice"));
  REQUIRE_THROWS_WITH(parse_hostfile("a 4\n", "hf"), Catch::Contains("hf:1: expected 'HOSTNAME slots=N'"));
  REQUIRE_THROWS_WITH(parse_hostfile("a slots=0\n", "hf"), Catch::Contains("positive"));
  REQUIRE_THROWS_WITH(parse_hostfile("\n# only comments\n", "hf"), Catch::Contains("no hosts"));
  REQUIRE_THROWS_WITH(load_hostfile("/nonexistent/hostfile"), Catch::Contains("/nonexistent/hostfile"));
}

TEST_CASE("include / exclude / num_nodes / num_gpus", "[launch]") {
  LaunchRequest r = two_hosts();
  r.include = "worker-0@worker-1:0,2";
  auto p = place(r);
  REQUIRE(p.size() == 2);
  REQUIRE(p[0].slots == std::vector<int>{0, 1, 2, 3});
  REQUIRE(p[1].slots == std::vector<int>{0, 2});
  r.include = "worker-1:1";
  p = place(r);
  REQUIRE(p.size() == 1);
  REQUIRE(p[0].host == "worker-1");
  r.include = "";
  r.exclude = "worker-0";
  p = place(r);
  REQUIRE(p.size() == 1);
  REQUIRE(p[0].host == "worker-1");
  r.exclude = "worker-1:0,3";
  p = place(r);
  REQUIRE(p[1].slots == std::vector<int>{1, 2});
  r.exclude = "";
  r.num_nodes = 1;
  r.num_gpus = 2;
  p = place(r);
  REQUIRE(p.size() == 1);
  REQUIRE(p[0].slots == std::vector<int>{0, 1});
  LaunchRequest bad = two_hosts();
  bad.include = "worker-7";
  REQUIRE_THROWS_WITH(place(bad), Catch::Contains("'worker-7' is not in the hostfile"));
  bad.include = "worker-1:4";
  REQUIRE_THROWS_WITH(place(bad), Catch::Contains("slots 0..3, not 4"));
  bad.include = "worker-0";
  bad.exclude = "worker-1";
  REQUIRE_THROWS_WITH(place(bad), Catch::Contains("cannot be used together"));
  LaunchRequest nn = two_hosts();
  nn.num_nodes = 3;
  REQUIRE_THROWS_WITH(place(nn), Catch::Contains("only 2 host(s)"));
  LaunchRequest all_out = two_hosts();
  all_out.exclude = "worker-0@worker-1";
  REQUIRE_THROWS_WITH(place(all_out), Catch::Contains("no ranks left"));
  REQUIRE_THROWS_WITH(parse_filter("a@@b", "--include"), Catch::Contains("empty host entry"));
  REQUIRE_THROWS_WITH(parse_filter("a:1,x", "--include"), Catch::Contains("'x' is not a non-negative integer"));
}

TEST_CASE("launcher argv for openmpi, mpich, slurm", "[launch]") {
  LaunchRequest r = two_hosts();
  r.include = "worker-0:0,1@worker-1:3";
  r.master_addr = "10.0.0.1";
  r.as_root = true;
  r.launcher_args = "--mca btl self,tcp";
  auto p = place(r);
  std::vector<std::string> cmd = {"/opt/zerorun", "train", "m.bin", "--config", "my config.json"};
  auto a = build_command(r, p, cmd);
  REQUIRE(a.front() == "mpirun");
  std::string s = join(a);
  REQUIRE_THAT(s, Catch::Contains("--allow-run-as-root -np 3 --bind-to none --host worker-0:2,worker-1:1"));
  REQUIRE_THAT(s, Catch::Contains("-x ZERORUN_SLOTS=worker-0=0+1;worker-1=3"));
  REQUIRE_THAT(s, Catch::Contains("-x MASTER_ADDR=10.0.0.1"));
  REQUIRE_THAT(s, Catch::Contains("--mca btl self,tcp /opt/zerorun train"));
  REQUIRE(a.back() == "my config.json");  // one argv entry: no shell splitting
  r.launcher = "mpich";
  s = join(build_command(r, p, cmd));
  REQUIRE_THAT(s, Catch::StartsWith("mpirun -n 3 -hosts worker-0:2,worker-1:1 -genv OMP_NUM_THREADS"));
  r.launcher = "slurm";
  s = join(build_command(r, p, cmd));
  REQUIRE_THAT(s, Catch::StartsWith("srun -n 3 --nodelist=worker-0,worker-1"));
  r.launcher = "pdsh";
  REQUIRE_THROWS_WITH(build_command(r, p, cmd), Catch::Contains("openmpi, mpich or slurm"));
  LaunchRequest local;
  local.mpirun = "mpirun";
  local.num_gpus = 4;
  local.local_cores = 2;
  s = join(build_command(local, place(local), cmd));
  REQUIRE_THAT(s, Catch::StartsWith("mpirun --oversubscribe -np 4 --bind-to none -x OMP_NUM_THREADS=1"));
  REQUIRE_THAT(s, !Catch::Contains("--host"));
}

TEST_CASE("host names: host names and IP literals only, anything else names the hostfile line", "[launch]") {
  for (const char* ok : {"worker-0", "node_3.cluster.local", "10.0.0.7", "fe80::1", "::1", "a", "x1-y2.z"})
    CHECK(valid_host_name(ok));
  for (const char* no : {"", "-oProxyCommand=x", "a;b", "$(x)", "`x`", "a|b", "a b", "a..b", "a-", "x-.y", ".a", "a/b",
                         "fe80::zz", "a\x01", "evil\xe2\x80\xae"})
    CHECK(!valid_host_name(no));
  CHECK(!valid_host_name(std::string(64, 'a')));  // a label of 64
  CHECK_THROWS_WITH(parse_hostfile("ok slots=1\n-oProxyCommand=x slots=1\n", "hf"),
                    Catch::Contains("hf:2: '-oProxyCommand=x' is not a host name or IP address"));
  // Control and bidi characters are shown escaped, so the message itself is plain text.
  CHECK_THROWS_WITH(parse_hostfile("evil\xe2\x80\xaename slots=1\n", "hf"),
                    Catch::Contains("hf:1: 'evil\\xE2\\x80\\xAEname'"));
  LaunchRequest r = two_hosts();
  r.master_addr = "$(reboot)";
  CHECK_THROWS_WITH(build_command(r, place(r), {"zerorun", "train"}), Catch::Contains("--master_addr"));
}

TEST_CASE("the dry run rendering is shell-quoted, the argv stays an array", "[launch]") {
  CHECK(shell_quote({"mpirun", "-np", "2", "-x", "ZERORUN_SLOTS=worker-0=0+1;worker-1=0+1"}) ==
        "mpirun -np 2 -x 'ZERORUN_SLOTS=worker-0=0+1;worker-1=0+1'");
  CHECK(shell_quote({"a b", "it's", "", "$HOME", "`x`", "plain/path.json"}) ==
        "'a b' 'it'\\''s' '' '$HOME' '`x`' plain/path.json");
  LaunchRequest r = two_hosts();
  auto argv = build_command(r, place(r), {"zerorun", "train", "--config", "my cfg.json"});
  CHECK(std::find(argv.begin(), argv.end(), "my cfg.json") != argv.end());  // one element, unsplit
  CHECK_THAT(shell_quote(argv), Catch::Contains("'ZERORUN_SLOTS=worker-0=0+1+2+3;worker-1=0+1+2+3'") &&
                                    Catch::Contains("--config 'my cfg.json'"));
}
