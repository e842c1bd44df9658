// MS-MPI without an SDK: mpiexec's argv from a DeepSpeed hostfile (--launcher msmpi), and the run-time loader of
// msmpi.dll (include/zerorun/msmpi.h): a clear message when it is missing (every platform), and, under wine, a
// one-rank stand-in DLL with MS-MPI's ABI (tests/windows/msmpi_standin.cc, path in ZERORUN_TEST_MSMPI_STANDIN).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "zerorun/launch.h"
#include "zerorun/msmpi.h"

using namespace zerorun;

TEST_CASE("launcher msmpi: mpiexec -n, -hosts N host n ..., -env NAME VALUE", "[launch][msmpi]") {
  launch::LaunchRequest r;
  r.hosts = launch::parse_hostfile("worker-0 slots=2\nworker-1 slots=3\n", "hf");
  r.launcher = "msmpi";
  r.local_cores = 8;
  r.env = {{"ZERORUN_X", "a b", false}, {"NCCL_DEBUG", "WARN", true}};
  const auto a = launch::build_command(r, launch::place(r), {"C:/zr/zerorun.exe", "train", "m.bin"});
  // mpiexec -n 5 -hosts 2 worker-0 2 worker-1 3 -env ... C:/zr/zerorun.exe train m.bin
  REQUIRE(a.size() > 9);
  CHECK(a[0] == "mpiexec");
  CHECK(a[1] == "-n");
  CHECK(a[2] == "5");
  CHECK(a[3] == "-hosts");
  CHECK(a[4] == "2");
  CHECK(a[5] == "worker-0");
  CHECK(a[6] == "2");
  CHECK(a[7] == "worker-1");
  CHECK(a[8] == "3");
  bool x = false, nccl = false;
  for (size_t i = 0; i + 2 < a.size(); ++i)
    if (a[i] == "-env") {
      x = x || (a[i + 1] == "ZERORUN_X" && a[i + 2] == "a b");  // one argv element: no shell quoting involved
      nccl = nccl || (a[i + 1] == "NCCL_DEBUG" && a[i + 2] == "WARN");
      CHECK(a[i + 1].find('=') == std::string::npos);
    }
  CHECK(x);
  CHECK(nccl);
  CHECK(a[a.size() - 3] == "C:/zr/zerorun.exe");
  for (const auto& s : a) CHECK(s.rfind("--", 0) != 0);  // no OpenMPI-style options reach MS-MPI's mpiexec
  // One host: no -hosts (mpiexec runs the ranks here).
  launch::LaunchRequest one;
  one.launcher = "msmpi";
  one.num_gpus = 2;
  one.local_cores = 8;
  const auto b = launch::build_command(one, launch::place(one), {"zerorun.exe"});
  CHECK(b[0] == "mpiexec");
  CHECK(b[2] == "2");
  for (const auto& s : b) CHECK(s != "-hosts");
}

TEST_CASE("msmpi loader: a missing msmpi.dll is a message saying what to install", "[msmpi]") {
  msmpi::Api api{};
  const std::string err = msmpi::load("zerorun_no_such_msmpi.dll", &api);
  CHECK(err.find("zerorun_no_such_msmpi.dll") != std::string::npos);
  CHECK(err.find("install Microsoft MPI") != std::string::npos);
  CHECK(api.Init_thread == nullptr);
}

TEST_CASE("msmpi loader: MS-MPI's ABI through a stand-in DLL", "[msmpi]") {
  const char* dll = std::getenv("ZERORUN_TEST_MSMPI_STANDIN");
  if (!dll || !*dll) {
    WARN("ZERORUN_TEST_MSMPI_STANDIN not set: the stand-in DLL exists in the Windows build only (wine runs this)");
    return;
  }
  msmpi::Api api{};
  REQUIRE(msmpi::load(dll, &api) == "");
  int provided = -1, rank = -1, size = -1, init = 0;
  REQUIRE(api.Init_thread(nullptr, nullptr, msmpi::kThreadFunneled, &provided) == msmpi::kSuccess);
  CHECK(provided == msmpi::kThreadFunneled);
  api.Initialized(&init);
  CHECK(init == 1);
  api.Comm_rank(msmpi::kCommWorld, &rank);
  api.Comm_size(msmpi::kCommWorld, &size);
  CHECK(rank == 0);
  CHECK(size == 1);
  float in[3] = {1, 2, 3}, out[3] = {0, 0, 0};
  REQUIRE(api.Allreduce(in, out, 3, msmpi::kFloat, msmpi::kSum, msmpi::kCommWorld) == msmpi::kSuccess);
  CHECK(out[2] == 3.f);  // 4-byte elements: the size bits of MS-MPI's MPI_FLOAT handle
  uint16_t h[2] = {7, 9}, g[2] = {0, 0};
  api.Allgather(h, 2, msmpi::kUint16, g, 2, msmpi::kUint16, msmpi::kCommWorld);
  CHECK(g[1] == 9);
  msmpi::Comm node = msmpi::kCommNull;
  REQUIRE(api.Comm_split_type(msmpi::kCommWorld, msmpi::kCommTypeShared, 0, msmpi::kInfoNull, &node) ==
          msmpi::kSuccess);
  CHECK(node != msmpi::kCommNull);
  msmpi::Request q = 0;
  api.Iallreduce(msmpi::in_place(), out, 3, msmpi::kFloat, msmpi::kSum, msmpi::kCommWorld, &q);
  CHECK(q == msmpi::kRequestNull);
  CHECK(out[0] == 1.f);  // in place: unchanged on one rank
}
