// Run-time knobs: the ZERORUN_* environment variables that change how zerorun runs (not what it trains), in one
// struct read once, at the first call of knobs(); README (Commands, "Environment") says what each does. A new knob
// is a field here and its line in from_environment(). Tests that change the environment call reload_knobs().
// Not read through here: the attention candidates' per-head-size variables (ZERORUN_ATTN_FWD_TILING_D<D>,
// ZERORUN_ATTN_BWD_VARIANT_D<D>, kernels/cuda/flash_attention_tc.cu: benchmark switches, names made from the size).
#pragma once
#include <string>

namespace zerorun {

struct Knobs {
  bool fuse = true;            // ZERORUN_FUSE=0: no executor fusions (A/B measurements)
  bool cuda_graphs = true;     // ZERORUN_CUDA_GRAPHS=0: every micro-batch eagerly
  bool opt_overlap = true;     // ZERORUN_OPT_OVERLAP=0: the optimizer on the main stream after the backward
  bool attn_atomics = true;    // ZERORUN_ATTN_ATOMICS=0: attention backward atomic-free (two kernels)
  bool attn_gqa_split = true;  // ZERORUN_ATTN_GQA_SPLIT=0: no grouped-query split of the key-block backward
  bool deterministic = false;  // ZERORUN_DETERMINISTIC=1: the same bits every run (sorted embedding gradient, ...)
  bool poison_uninit = false;  // ZERORUN_POISON_UNINIT=1: unfilled allocations are NaN (tests)
  int profile = 0;             // ZERORUN_PROFILE: 0 off, 1 synchronised per-op table, 2 ("host") host time only
  bool rank_status = false;    // ZERORUN_RANK_STATUS=1: tell the launcher why a rank ended (set by the launcher)
  std::string comm_timeout;    // ZERORUN_COMM_TIMEOUT: seconds of the collective watchdog (each communicator parses)
  std::string fault_inject;    // ZERORUN_FAULT_INJECT: testing (fail_at_step:R:S, die_after_shard:R)
  std::string nccl_lib;        // ZERORUN_NCCL_LIB: the NCCL library to load before libnccl.so.2
  std::string msmpi_dll;       // ZERORUN_MSMPI_DLL: the MS-MPI DLL to load instead of msmpi.dll
  bool has_comm_timeout = false;
  bool has_fault_inject = false;

  static Knobs from_environment();
};

// The knobs of this process, read from the environment at the first call.
const Knobs& knobs();
// Reads the environment again (tests that set a knob's variable after the first read).
void reload_knobs();

}  // namespace zerorun
