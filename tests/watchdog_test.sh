#!/usr/bin/env bash
# A rank stuck outside a collective: the others' watchdog (ZERORUN_COMM_TIMEOUT=2)
# must end the job within seconds, non-zero, naming the op and its sequence number.
set -u
BIN=${1:?usage: watchdog_test.sh path/to/zerorun_mpi_watchdog_test}
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
t0=$(date +%s)
out=$(timeout 50 "$(command -v mpirun)" --allow-run-as-root --oversubscribe -np 2 "$BIN" 2>&1)
rc=$?
dt=$(($(date +%s) - t0))
if [[ $rc -ne 0 && $rc -ne 124 && $dt -lt 30 ]] && grep -q "watchdog: rank 0: barrier #2 (0 x f32) has not completed after 2 s" <<<"$out"; then
  echo "ok   - watchdog ended the job after ${dt}s (rc=$rc)"
  echo "1 passed, 0 failed"
else
  echo "FAIL - watchdog: rc=$rc after ${dt}s"
  echo "$out" | tail -8
  echo "0 passed, 1 failed"
  exit 1
fi
