#!/usr/bin/env bash
# Where the attention kernels' time goes: ncu's speed-of-light, occupancy, warp-state (stall reasons) and
# pipe-utilisation sections for one launch of each tensor-core attention kernel, run by zerorun_attn_probe at
# GPT-2 124M's shape (PROBE_ARGS="B H K T D" for another). Full reports go to OUT_DIR/attn_ncu_<kernel>.txt; the
# headline lines are printed (k_bwd_sd, the FA2-layout candidate, runs only where the probe sweeps it or
# ZERORUN_ATTN_BWD_VARIANT_D<D> names it). DEVBUILD=dir: the bundle made with that variable.
# Usage (device machine, after tests/make_device_bundle.sh): bash bench/attn_ncu.sh OUT_DIR [kernel regexes...]
set -uo pipefail
cd "$(dirname "$0")/.."
source tests/device_env.sh
OUTD=${1:-/tmp}
shift || true
KS=${*:-k_fwd k_bwd_kv k_bwd_q k_bwd_kv2 k_bwd_sd}  # (k_bwd_kv: its third launch is the two-kernel one)
for k in $KS; do
  f=$OUTD/attn_ncu_$k.txt
  ncu --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section SchedulerStats --section LaunchStats -k "regex:^$k" --launch-skip 2 --launch-count 1 \
    ${DEVBUILD:-.devbuild}/bin/zerorun_attn_probe ${PROBE_ARGS:-8 12 12 1024 64} >"$f" 2>&1
  echo "== $k"
  grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Compute \(SM\) Throughput|Memory Throughput|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Stall|Executed Ipc A" "$f" |
    sed -E 's/ +/ /g' | head -20
done
