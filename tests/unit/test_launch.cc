// Launcher: hostfile parsing, include/exclude, placement, launcher argv.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "zerorun/launch.h"
#include "zerorun/platform.h"

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
  REQUIRE_THAT(s, Catch::StartsWith("mpirun -n 3 -hosts worker-0:2,worker-1:1 -genv ZERORUN_SLOTS"));
  r.launcher = "slurm";
  s = join(build_command(r, p, cmd));
  REQUIRE_THAT(s, Catch::StartsWith("srun -n 3 --nodelist=worker-0,worker-1"));
  r.launcher = "pdsh";
  REQUIRE_THROWS_WITH(build_command(r, p, cmd), Catch::Contains("openmpi, mpich, slurm or msmpi"));
  LaunchRequest local;
  local.mpirun = "mpirun";
  local.num_gpus = 4;
  local.local_cores = 2;
  s = join(build_command(local, place(local), cmd));
  REQUIRE_THAT(s, Catch::StartsWith("mpirun --oversubscribe -np 4 --bind-to none -x ZERORUN_SLOTS=localhost=0+1+2+3"));
  REQUIRE_THAT(s, !Catch::Contains("OMP_NUM_THREADS"));  // each rank: its host's cores / its host's ranks
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

namespace {
std::string arg_after(const std::vector<std::string>& a, const std::string& flag, const std::string& starts = "") {
  for (size_t i = 0; i + 1 < a.size(); ++i)
    if (a[i] == flag && a[i + 1].rfind(starts, 0) == 0) return a[i + 1];
  return "<none>";
}
size_t count(const std::vector<std::string>& a, const std::string& w) { return std::count(a.begin(), a.end(), w); }
}  // namespace

TEST_CASE("launcher_args and --ssh are split like a shell", "[launch]") {
  using V = std::vector<std::string>;
  CHECK(shell_split("", "--x").empty());
  CHECK(shell_split("  a\tb  ", "--x") == V{"a", "b"});
  CHECK(shell_split("--mca plm_rsh_args '-p 2222 -o A=b'", "--x") == V{"--mca", "plm_rsh_args", "-p 2222 -o A=b"});
  CHECK(shell_split(R"(a"b c"d 'e'"f" "" '')", "--x") == V{"ab cd", "ef", "", ""});
  CHECK(shell_split(R"("q\"x\\y\$z\a" 'n\o' a\ b \')", "--x") == V{"q\"x\\y$z\\a", "n\\o", "a b", "'"});
  CHECK_THROWS_WITH(shell_split("-x 'a", "--launcher_args"),
                    Catch::Contains("--launcher_args") && Catch::Contains("unterminated ' quote"));
  CHECK_THROWS_WITH(shell_split("\"a", "--ssh"), Catch::Contains("--ssh") && Catch::Contains("unterminated \" quote"));
  CHECK_THROWS_WITH(shell_split("a\\", "--ssh"), Catch::Contains("trailing backslash"));
  LaunchRequest r = two_hosts();
  r.launcher_args = "--mca plm_rsh_agent 'my agent.sh' -x \"A=b c\"";
  auto a = build_command(r, place(r), {"zerorun", "train"});
  CHECK(arg_after(a, "plm_rsh_agent") == "my agent.sh");
  CHECK(arg_after(a, "-x", "A=") == "A=b c");
  CHECK(a.back() == "train");
}

TEST_CASE("the remote shell: --ssh with arguments, --ssh_port, per launcher", "[launch]") {
  LaunchRequest r = two_hosts();
  r.ssh = "/usr/bin/ssh -o StrictHostKeyChecking=no -i '/keys/id'";
  r.ssh_port = 2222;
  auto a = build_command(r, place(r), {"zerorun"});
  CHECK(arg_after(a, "--mca", "plm_rsh_agent") == "plm_rsh_agent");
  CHECK(arg_after(a, "plm_rsh_agent") == "/usr/bin/ssh");
  CHECK(arg_after(a, "plm_rsh_args") == "-o StrictHostKeyChecking=no -i /keys/id -p 2222");
  r.ssh = "";  // the port alone: ssh -p
  a = build_command(r, place(r), {"zerorun"});
  CHECK(arg_after(a, "plm_rsh_agent") == "ssh");
  CHECK(arg_after(a, "plm_rsh_args") == "-p 2222");
  r.ssh = "ssh -o 'ProxyCommand=nc a b'";  // OpenMPI re-splits plm_rsh_args on blanks
  CHECK_THROWS_WITH(build_command(r, place(r), {"zerorun"}), Catch::Contains("--ssh") && Catch::Contains("blank"));
  r.ssh = "-p 2222";
  CHECK_THROWS_WITH(build_command(r, place(r), {"zerorun"}), Catch::Contains("remote shell program"));
  r.ssh = "''";
  CHECK_THROWS(build_command(r, place(r), {"zerorun"}));
  r.ssh = "ssh";
  r.ssh_port = -1;
  a = build_command(r, place(r), {"zerorun"});
  CHECK(arg_after(a, "plm_rsh_agent") == "ssh");
  CHECK(count(a, "plm_rsh_args") == 0);
  r.launcher = "mpich";
  r.ssh = "/opt/myssh";
  a = build_command(r, place(r), {"zerorun"});
  CHECK(arg_after(a, "-launcher-exec") == "/opt/myssh");
  r.ssh_port = 2222;
  CHECK_THROWS_WITH(build_command(r, place(r), {"zerorun"}), Catch::Contains("--ssh"));
  r.launcher = "slurm";
  CHECK_THROWS_WITH(build_command(r, place(r), {"zerorun"}), Catch::Contains("slurmd"));
  r.launcher = "msmpi";
  CHECK_THROWS_WITH(build_command(r, place(r), {"zerorun"}), Catch::Contains("--ssh"));
}

TEST_CASE("nic option (--nic): MPI's TCP interfaces and NCCL_SOCKET_IFNAME", "[launch]") {
  for (const char* ok : {"eth1", "eth1,eth2", "ib0", "enp65s0f1", "bond0.100", "eth0:1"}) CHECK(valid_nic_list(ok));
  for (const char* no : {"", "eth1,", ",eth1", "-x", "a b", "eth;rm", "sixteen_chars_xx", "a,,b"})
    CHECK(!valid_nic_list(no));
  LaunchRequest r = two_hosts();
  r.nic = "eth1";
  auto a = build_command(r, place(r), {"zerorun"});
  CHECK(arg_after(a, "btl_tcp_if_include") == "eth1");
  CHECK(arg_after(a, "oob_tcp_if_include") == "eth1");
  CHECK(arg_after(a, "-x", "NCCL_SOCKET_IFNAME") == "NCCL_SOCKET_IFNAME=eth1");
  r.env = {{"NCCL_SOCKET_IFNAME", "eth0", true}};  // the option wins over the environment
  a = build_command(r, place(r), {"zerorun"});
  CHECK(arg_after(a, "-x", "NCCL_SOCKET_IFNAME") == "NCCL_SOCKET_IFNAME=eth1");
  CHECK(count(a, "NCCL_SOCKET_IFNAME") == 0);
  r.launcher = "mpich";
  a = build_command(r, place(r), {"zerorun"});
  CHECK(arg_after(a, "-iface") == "eth1");
  CHECK(arg_after(a, "-genv", "NCCL_SOCKET_IFNAME") == "NCCL_SOCKET_IFNAME");
  r.launcher = "slurm";
  CHECK_THAT(join(build_command(r, place(r), {"zerorun"})), Catch::Contains(",NCCL_SOCKET_IFNAME=eth1,") &&
                                                                Catch::Contains(",OMPI_MCA_btl_tcp_if_include=eth1,") &&
                                                                Catch::Contains(",OMPI_MCA_oob_tcp_if_include=eth1 "));
  r.nic = "eth1;reboot";
  CHECK_THROWS_WITH(build_command(r, place(r), {"zerorun"}), Catch::Contains("--nic"));
}

TEST_CASE(".deepspeed_env: DeepSpeed's files and rules, errors naming the line", "[launch]") {
  auto e = parse_env_file("# comment\n\nNCCL_IB_DISABLE=1\n  PATH_X = /a b=c \r\nEMPTY=\nNCCL_IB_DISABLE=0\n", "f");
  REQUIRE(e.size() == 3);
  CHECK((e[0].name == "NCCL_IB_DISABLE" && e[0].value == "0" && !e[0].inherited));  // a later line wins
  CHECK((e[1].name == "PATH_X" && e[1].value == "/a b=c"));                         // stripped, split at the first '='
  CHECK((e[2].name == "EMPTY" && e[2].value.empty()));
  CHECK_THROWS_WITH(parse_env_file("A=1\nNOEQUALS\n", "env"), Catch::Contains("env:2: expected 'NAME=VALUE'"));
  CHECK_THROWS_WITH(parse_env_file("A B=1\n", "env"), Catch::Contains("env:1: 'A B' is not an environment variable"));
  CHECK_THROWS_WITH(parse_env_file("1A=1\n", "env"), Catch::Contains("env:1"));
  CHECK(env_file_paths(nullptr, "/home/u") == std::vector<std::string>{"/home/u/.deepspeed_env", "./.deepspeed_env"});
  CHECK(env_file_paths("my_env", "/h") == std::vector<std::string>{"/h/my_env", "./my_env"});  // DS_ENV_FILE
  CHECK(env_file_paths("/etc/job_env", "/h") == std::vector<std::string>{"/etc/job_env"});
  CHECK(env_file_paths("", nullptr) == std::vector<std::string>{"./.deepspeed_env"});
  // The launching environment's forwarded variables, then the files in order (home, then the working directory).
  const std::string h = zerorun::platform::make_temp_dir("zr_env");
  FILE* f = std::fopen((h + "/home_env").c_str(), "w");
  std::fputs("NCCL_DEBUG=WARN\nMY_VAR=home\nOTHER=1\n", f);
  std::fclose(f);
  f = std::fopen((h + "/cwd_env").c_str(), "w");
  std::fputs("MY_VAR=cwd\n", f);
  std::fclose(f);
  auto j = job_environment({"ZERORUN_COMM_TIMEOUT=20", "NCCL_DEBUG=INFO", "HOME=/x", "UCX_TLS=tcp", "OMP_NUM_THREADS=3",
                            "ZERORUN_SLOTS=a=0", "NCCL_X=a=b"},
                           {h + "/home_env", h + "/cwd_env", h + "/missing", h});
  std::map<std::string, std::pair<std::string, bool>> m;
  for (auto& v : j) m[v.name] = {v.value, v.inherited};
  CHECK(m.size() == 7);
  CHECK(m["ZERORUN_COMM_TIMEOUT"] == std::make_pair(std::string("20"), true));
  CHECK(m["NCCL_X"] == std::make_pair(std::string("a=b"), true));
  CHECK(m["NCCL_DEBUG"] == std::make_pair(std::string("WARN"), false));  // the file wins over the environment
  CHECK(m["MY_VAR"].first == "cwd");                                     // the working directory's over home's
  CHECK(m["OTHER"].first == "1");
  CHECK(m.count("OMP_NUM_THREADS"));
  CHECK(m.count("UCX_TLS"));
  CHECK(!m.count("HOME"));
  CHECK(!m.count("ZERORUN_SLOTS"));
  std::remove((h + "/home_env").c_str());
  std::remove((h + "/cwd_env").c_str());
  std::filesystem::remove(h);
}

TEST_CASE("every launcher forwards the job's environment to every rank", "[launch]") {
  LaunchRequest r = two_hosts();
  r.master_addr = "10.0.0.1";
  r.env = {{"ZERORUN_COMM_TIMEOUT", "20", true},
           {"NCCL_DEBUG", "INFO", true},
           {"MY_VAR", "a b;c", false},
           {"MASTER_ADDR", "9.9.9.9", false}};  // the launcher's own win
  const std::vector<std::string> cmd = {"zerorun", "train"};
  auto a = build_command(r, place(r), cmd);
  CHECK(arg_after(a, "-x", "ZERORUN_COMM") == "ZERORUN_COMM_TIMEOUT");  // by name: the value from mpirun's env
  CHECK(arg_after(a, "-x", "NCCL_DEBUG") == "NCCL_DEBUG");
  CHECK(arg_after(a, "-x", "MY_VAR") == "MY_VAR=a b;c");  // one argv entry
  CHECK(arg_after(a, "-x", "MASTER_ADDR") == "MASTER_ADDR=10.0.0.1");
  CHECK(count(a, "MASTER_ADDR=9.9.9.9") == 0);
  CHECK_THAT(shell_quote(a), Catch::Contains("-x 'MY_VAR=a b;c'"));
  for (const char* bad : {"abc", "", "20s", "-1", "nan", "inf"}) {
    LaunchRequest b = r;
    b.env[0].value = bad;
    CHECK_THROWS_WITH(build_command(b, place(b), cmd), Catch::Contains("ZERORUN_COMM_TIMEOUT '"));
  }
  r.launcher = "mpich";
  a = build_command(r, place(r), cmd);
  CHECK(arg_after(a, "-genvlist") == "ZERORUN_COMM_TIMEOUT,NCCL_DEBUG");
  CHECK(arg_after(a, "-genv", "MY_VAR") == "MY_VAR");
  CHECK(count(a, "a b;c") == 1);
  r.launcher = "slurm";
  a = build_command(r, place(r), cmd);
  CHECK(arg_after(a, "--ntasks-per-node=4", "--export") ==
        "--export=ALL,ZERORUN_COMM_TIMEOUT,NCCL_DEBUG,MY_VAR=a b;c,ZERORUN_SLOTS=worker-0=0+1+2+3;worker-1=0+1+2+3,"
        "MASTER_PORT=29500,MASTER_ADDR=10.0.0.1");
  r.env.push_back({"LIST", "a,b", false});
  CHECK_THROWS_WITH(build_command(r, place(r), cmd), Catch::Contains("LIST='a,b'") && Catch::Contains("--export"));
  r.env.pop_back();
  r.launcher = "msmpi";
  a = build_command(r, place(r), cmd);
  CHECK_THAT(join(a), Catch::StartsWith("mpiexec -n 8 -hosts 2 worker-0 4 worker-1 4 -env ZERORUN_COMM_TIMEOUT 20 "
                                        "-env NCCL_DEBUG INFO -env MY_VAR a b;c"));
  CHECK(arg_after(a, "-env", "ZERORUN_LOCAL_RANKS") == "ZERORUN_LOCAL_RANKS");
  CHECK(a[std::find(a.begin(), a.end(), "ZERORUN_LOCAL_RANKS") - a.begin() + 1] == "4");
}

TEST_CASE("per-host threads: this host's cores / the ranks on this host", "[launch]") {
  using M = std::map<std::string, std::string>;
  CHECK(host_threads(M{{"OMP_NUM_THREADS", "3"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}, 16) == 0);  // given: kept
  CHECK(host_threads(M{}, 16) == 16);
  CHECK(host_threads(M{{"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}, 16) == 4);
  CHECK(host_threads(M{{"MPI_LOCALNRANKS", "3"}}, 16) == 5);
  CHECK(host_threads(M{{"OMPI_COMM_WORLD_LOCAL_SIZE", "32"}}, 16) == 1);
  // SLURM: "2(x3),1" is 2 tasks on nodes 0..2 and 1 on node 3.
  CHECK(host_threads(M{{"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"}, {"SLURM_NODEID", "2"}}, 16) == 8);
  CHECK(host_threads(M{{"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"}, {"SLURM_NODEID", "3"}}, 16) == 16);
  CHECK(host_threads(M{{"SLURM_STEP_TASKS_PER_NODE", "4"}, {"SLURM_NODEID", "0"}}, 16) == 4);
  CHECK(host_threads(M{{"ZERORUN_LOCAL_RANKS", "8"}}, 16) == 2);
  CHECK(host_threads(M{{"OMPI_COMM_WORLD_LOCAL_SIZE", "junk"}}, 16) == 16);
}

// ---- the launcher's root-cause report (FailureReport, rank_status lines) ----
#include "zerorun/rank_status.h"

TEST_CASE("rank status lines parse, and describe the rank's state", "[launch][report]") {
  namespace rs = zerorun::rank_status;
  rs::Report r;
  REQUIRE(
      rs::parse("ZERORUN_RANK_STATUS rank=3 world=4 host=node-b pid=77 event=watchdog code=1 step=12 "
                "op=all_gather seq=311 active=1 for_ms=10012 msg=zerorun: watchdog: a = b stuck",
                &r));
  CHECK(r.rank == 3);
  CHECK(r.world == 4);
  CHECK(r.host == "node-b");
  CHECK(r.pid == 77);
  CHECK(r.event == "watchdog");
  CHECK(r.code == 1);
  CHECK(r.msg == "zerorun: watchdog: a = b stuck");  // msg is the rest of the line, '=' and all
  CHECK(rs::describe_state(r) == "step 12, in all_gather #311 for 10.0 s");
  r.active = false;
  CHECK(rs::describe_state(r) == "step 12, last collective all_gather #311 (completed)");
  CHECK_FALSE(rs::parse("zerorun: error: ZERORUN_RANK_STATUS rank=1 event=error", &r));  // only at the start
  CHECK_FALSE(rs::parse("ZERORUN_RANK_STATUS world=2 msg=x", &r));                       // no rank/event
}

TEST_CASE("FailureReport: first failing rank, held-back lines, exit code", "[launch][report]") {
  FailureReport f({"hA", "hA", "hB"}, "mpirun");
  CHECK(f.line("[zerorun] step 1/10 | loss 4.1"));  // ordinary lines pass through
  CHECK_FALSE(f.failed());
  // A teardown signal is not a failure; an error is, and the first one is the root cause.
  CHECK_FALSE(
      f.line("ZERORUN_RANK_STATUS rank=0 world=3 host=a pid=1 event=signal code=143 step=4 op=all_reduce "
             "seq=9 active=1 for_ms=50 msg=stopped by SIGTERM"));
  CHECK_FALSE(f.failed());
  CHECK_FALSE(
      f.line("ZERORUN_RANK_STATUS rank=2 world=3 host=b pid=3 event=error code=1 step=4 op=all_reduce seq=8 "
             "active=0 msg=zerorun: error: bad shard"));
  CHECK(f.failed());
  CHECK_FALSE(f.line("ZERORUN_RANK_STATUS rank=1 world=3 host=a pid=2 event=watchdog code=1 step=4 msg=later"));
  CHECK(f.exit_code(255) == 1);
  const std::string out = f.render(255);
  CHECK(out.find("rank 2 on host hB (b) (pid 3): exited with code 1 (error)") != std::string::npos);
  CHECK(out.find("error: zerorun: error: bad shard") != std::string::npos);
  CHECK(out.find("rank 0 on host hA (a): stopped by signal 15 at step 4, in all_reduce #9") != std::string::npos);
  CHECK(out.find("rank 1 on host hA (a): collective timed out (watchdog)") != std::string::npos);
  CHECK(out.find("exit code 1 (rank 2's); the launcher's was 255") != std::string::npos);
}

TEST_CASE("FailureReport: a peer's timeout or MPI error yields to a rank's own death", "[launch][report]") {
  FailureReport f({"hA", "hB"});
  CHECK_FALSE(
      f.line("ZERORUN_RANK_STATUS rank=0 world=2 host=a pid=1 event=error code=1 step=4 msg=zerorun: error: "
             "MPI all_reduce failed: MPI_ERR_OTHER"));
  CHECK(f.failed());
  CHECK(f.exit_code(1) == 1);
  CHECK(f.line("mpirun noticed that process rank 1 with PID 9 on node hB exited on signal 9 (Killed)."));
  CHECK(f.exit_code(1) == 137);  // rank 1's death is the root cause
  CHECK(f.render(1).find("root cause:\nzerorun:   rank 1 on host hB (pid 9): exited on signal 9") != std::string::npos);
  // A watchdog alone stays the root cause; a later consequence does not replace an earlier one.
  FailureReport w({"hA", "hB"});
  CHECK_FALSE(w.line("ZERORUN_RANK_STATUS rank=1 world=2 host=b pid=2 event=watchdog code=1 step=4 msg=timed out"));
  CHECK_FALSE(w.line("ZERORUN_RANK_STATUS rank=0 world=2 host=a pid=1 event=watchdog code=1 step=4 msg=timed out"));
  CHECK(w.render(1).find("root cause:\nzerorun:   rank 1 on host hB (b) (pid 2): collective timed out") !=
        std::string::npos);
}

TEST_CASE("FailureReport: OpenMPI's messages for ranks that said nothing", "[launch][report]") {
  FailureReport f({"hA", "hB"});
  CHECK(f.line("mpirun noticed that process rank 1 with PID 4242 on node hB exited on signal 9 (Killed)."));
  CHECK(f.failed());
  CHECK(f.exit_code(137) == 137);
  CHECK(f.render(137).find("rank 1 on host hB (pid 4242): exited on signal 9") != std::string::npos);
  CHECK(f.render(137).find("rank 0 on host hA: no report") != std::string::npos);

  FailureReport e({"hA", "hB"});
  CHECK(e.line("  Process name: [[47307,1],1]"));
  CHECK(e.line("  Exit code:    3"));
  CHECK(e.exit_code(1) == 3);

  FailureReport d({"hA", "hB"}, "mpiexec");
  CHECK(d.line("ORTE was unable to reliably start one or more daemons."));
  CHECK(d.failed());
  CHECK(d.render(255).find("mpiexec lost (or could not start) a remote host's daemon; no word from rank 0 on host "
                           "hA, 1 on host hB") != std::string::npos);
  CHECK(d.exit_code(255) == 255);
}

TEST_CASE("Child: captured lines reach the filter in order; leftovers are ended", "[launch][platform][posix]") {
  using zerorun::platform::Child;
  std::vector<std::string> seen;
  {
    Child c({"sh", "-c", "echo one; echo two >&2; echo three; printf ZERORUN_RANK"}, "", true, "ZERORUN_RANK_STATUS ");
    c.set_line_filter([&](int stream, const std::string& line) {
      seen.push_back(std::to_string(stream) + ":" + line);
      return false;  // held back: nothing reaches the test's output
    });
    CHECK(c.wait([](int) {}) == 0);
  }
  std::vector<std::string> out1, out2;
  for (auto& s : seen) (s[0] == '1' ? out1 : out2).push_back(s);
  // The last, unterminated line starts like the held-back lines: kept until the end, then given to the filter.
  CHECK(out1 == std::vector<std::string>{"1:one", "1:three", "1:ZERORUN_RANK"});
  CHECK(out2 == std::vector<std::string>{"2:two"});
  // A process the child leaves behind (reparented here: this process is a subreaper) is found and ended.
  Child c({"sh", "-c", "sleep 60 >/dev/null 2>&1 & exit 0"}, "", true);
  CHECK(c.wait([](int) {}) == 0);
  CHECK(c.end_leftovers(1.0) == 1);
  CHECK(c.end_leftovers(1.0) == 0);
}
