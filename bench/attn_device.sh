#!/usr/bin/env bash
# One device call's attention work (issue 31): zerorun_attn_probe (every head size, its tilings and variants; the
# grouped-query split at the variants ATTN_PROBE_SPLIT lists) and bench/torch_sdpa.py on the same GPU, one after the
# other; then the candidate defaults (ATTN_CAND: ZERORUN_ATTN_FWD_TILING_D<D> / ZERORUN_ATTN_BWD_VARIANT_D<D>
# settings, flash_attention_tc.cu's env_default) on the grouped-query, window, cap and document shapes, and the
# CUDA-vs-CPU attention tests under them (so the tests cover the candidates with every option, the split and
# documents; ATTN_CAND= empty: the build's defaults). Logs under OUT_DIR; the same-call tables
# (bench/attn_table.py) printed last.
# Usage (device machine, after DEVBUILD=.devbuild-attn tests/make_device_bundle.sh build-attn):
#   DEVBUILD=.devbuild-attn bash bench/attn_device.sh OUT_DIR [TEST_TIMEOUT_S]
set -uo pipefail
cd "$(dirname "$0")/.."
source tests/device_env.sh
OUTD=${1:-/tmp}
BIN=$PWD/${DEVBUILD:-.devbuild}/bin
CAND=${ATTN_CAND-"ZERORUN_ATTN_BWD_VARIANT_D96=3 ZERORUN_ATTN_BWD_VARIANT_D128=6 ZERORUN_ATTN_BWD_VARIANT_D256=2 ZERORUN_ATTN_FWD_TILING_D256=4"}
export ATTN_PROBE_SPLIT=${ATTN_PROBE_SPLIT:-0,3,6,7,8}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$OUTD/gpu.txt"
echo "candidates: $CAND"
"$BIN/zerorun_attn_probe" >"$OUTD/probe.jsonl" 2>"$OUTD/probe.err" || { echo "probe failed"; tail -5 "$OUTD/probe.err"; }
PYTHONUNBUFFERED=1 python3 bench/torch_sdpa.py >"$OUTD/sdpa.jsonl" 2>"$OUTD/sdpa.err" || tail -5 "$OUTD/sdpa.err"
if [[ -n "$CAND" ]]; then
  for s in "4 16 16 2048 96" "4 16 16 2048 128" "4 16 16 2048 256" "4 16 4 2048 128" "4 12 2 4096 128" \
    "2 32 8 2048 128" "4 16 4 2048 128 512" "4 16 16 2048 256 1024 50" "4 12 2 4096 128 0 0 512"; do
    env ATTN_PROBE_SPLIT=0 $CAND "$BIN/zerorun_attn_probe" $s >>"$OUTD/cand.jsonl" 2>>"$OUTD/cand.err" ||
      { echo "candidate probe failed at $s"; tail -3 "$OUTD/cand.err"; }
  done
fi
env $CAND timeout "${2:-150}" "$BIN/zerorun_cuda_tests" "[attention]" >"$OUTD/tests.log" 2>&1
echo "tests (candidates: ${CAND:-none}) rc $?"
grep -E -B2 -A6 "FAILED" "$OUTD/tests.log" | head -30
tail -4 "$OUTD/tests.log"
python3 bench/attn_table.py "$OUTD/sdpa.jsonl" "$OUTD/probe.jsonl" "$OUTD/cand.jsonl"
