// Run-time knobs (zerorun/knobs.h): each ZERORUN_* variable parsed as the code reading it did before, read once,
// and read again by reload_knobs().
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "zerorun/knobs.h"
#include "zerorun/platform.h"

using namespace zerorun;

namespace {
const char* const kVars[] = {"ZERORUN_FUSE",          "ZERORUN_CUDA_GRAPHS",    "ZERORUN_OPT_OVERLAP",
                             "ZERORUN_ATTN_ATOMICS",  "ZERORUN_ATTN_GQA_SPLIT", "ZERORUN_DETERMINISTIC",
                             "ZERORUN_POISON_UNINIT", "ZERORUN_PROFILE",        "ZERORUN_RANK_STATUS",
                             "ZERORUN_COMM_TIMEOUT",  "ZERORUN_FAULT_INJECT",   "ZERORUN_NCCL_LIB",
                             "ZERORUN_MSMPI_DLL"};
}  // namespace

TEST_CASE("run-time knobs from the environment", "[knobs]") {
  // The test runner's own settings (ZERORUN_POISON_UNINIT=1 under ctest) come back at the end.
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* v : kVars)
    if (const char* e = std::getenv(v)) saved.emplace_back(v, e);
  for (const char* v : kVars) platform::unset_env(v);

  Knobs d = Knobs::from_environment();
  CHECK(d.fuse);
  CHECK(d.cuda_graphs);
  CHECK(d.opt_overlap);
  CHECK(d.attn_atomics);
  CHECK(d.attn_gqa_split);
  CHECK_FALSE(d.deterministic);
  CHECK_FALSE(d.poison_uninit);
  CHECK(d.profile == 0);
  CHECK_FALSE(d.rank_status);
  CHECK_FALSE(d.has_comm_timeout);
  CHECK_FALSE(d.has_fault_inject);
  CHECK(d.nccl_lib.empty());
  CHECK(d.msmpi_dll.empty());

  // "0" turns a default-on knob off, anything else keeps it; "1" turns a default-off one on, anything else not.
  platform::set_env("ZERORUN_FUSE", "0");
  platform::set_env("ZERORUN_CUDA_GRAPHS", "no");
  platform::set_env("ZERORUN_ATTN_ATOMICS", "0");
  platform::set_env("ZERORUN_DETERMINISTIC", "1");
  platform::set_env("ZERORUN_POISON_UNINIT", "yes");
  platform::set_env("ZERORUN_PROFILE", "host");
  platform::set_env("ZERORUN_RANK_STATUS", "1");
  platform::set_env("ZERORUN_COMM_TIMEOUT", "3");
  platform::set_env("ZERORUN_FAULT_INJECT", "fail_at_step:1:3");
  platform::set_env("ZERORUN_NCCL_LIB", "/opt/nccl/libnccl.so.2");
  Knobs k = Knobs::from_environment();
  CHECK_FALSE(k.fuse);
  CHECK(k.cuda_graphs);
  CHECK_FALSE(k.attn_atomics);
  CHECK(k.deterministic);
  CHECK_FALSE(k.poison_uninit);
  CHECK(k.profile == 2);
  CHECK(k.rank_status);
  CHECK((k.has_comm_timeout && k.comm_timeout == "3"));
  CHECK((k.has_fault_inject && k.fault_inject == "fail_at_step:1:3"));
  CHECK(k.nccl_lib == "/opt/nccl/libnccl.so.2");
  platform::set_env("ZERORUN_PROFILE", "1");
  CHECK(Knobs::from_environment().profile == 1);

  // knobs() keeps what it read until reload_knobs().
  reload_knobs();
  CHECK_FALSE(knobs().fuse);
  platform::set_env("ZERORUN_FUSE", "1");
  CHECK_FALSE(knobs().fuse);
  reload_knobs();
  CHECK(knobs().fuse);

  for (const char* v : kVars) platform::unset_env(v);
  for (const auto& [v, e] : saved) platform::set_env(v, e);
  reload_knobs();
}
