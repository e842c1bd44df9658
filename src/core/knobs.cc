// Run-time knobs read once (see knobs.h).
#include "zerorun/knobs.h"

#include <cstdlib>
#include <cstring>
#include <mutex>

namespace zerorun {
namespace {

const char* env(const char* name) { return std::getenv(name); }
// "0" turns a default-on knob off (anything else, or unset, keeps it on).
bool off_if_zero(const char* name) {
  const char* e = env(name);
  return !(e && std::strcmp(e, "0") == 0);
}
bool on_if_one(const char* name) {
  const char* e = env(name);
  return e && std::strcmp(e, "1") == 0;
}

Knobs g_knobs;
bool g_read = false;
std::mutex g_mu;

}  // namespace

Knobs Knobs::from_environment() {
  Knobs k;
  k.fuse = off_if_zero("ZERORUN_FUSE");
  k.cuda_graphs = off_if_zero("ZERORUN_CUDA_GRAPHS");
  k.opt_overlap = off_if_zero("ZERORUN_OPT_OVERLAP");
  k.attn_atomics = off_if_zero("ZERORUN_ATTN_ATOMICS");
  k.attn_gqa_split = off_if_zero("ZERORUN_ATTN_GQA_SPLIT");
  k.deterministic = on_if_one("ZERORUN_DETERMINISTIC");
  k.poison_uninit = on_if_one("ZERORUN_POISON_UNINIT");
  if (const char* e = env("ZERORUN_PROFILE"); e && *e && std::strcmp(e, "0") != 0)
    k.profile = std::strcmp(e, "host") == 0 ? 2 : 1;
  k.rank_status = on_if_one("ZERORUN_RANK_STATUS");
  if (const char* e = env("ZERORUN_COMM_TIMEOUT")) k.comm_timeout = e, k.has_comm_timeout = true;
  if (const char* e = env("ZERORUN_FAULT_INJECT")) k.fault_inject = e, k.has_fault_inject = true;
  if (const char* e = env("ZERORUN_NCCL_LIB")) k.nccl_lib = e;
  if (const char* e = env("ZERORUN_MSMPI_DLL")) k.msmpi_dll = e;
  return k;
}

const Knobs& knobs() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_read) g_knobs = Knobs::from_environment(), g_read = true;
  return g_knobs;
}

void reload_knobs() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_knobs = Knobs::from_environment();
  g_read = true;
}

}  // namespace zerorun
