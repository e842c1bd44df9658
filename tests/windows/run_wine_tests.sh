#!/usr/bin/env bash
# Runs the Windows cross-build's tests under wine (after tests/windows/build_windows.sh): the Catch2 unit tests
# (with the MS-MPI stand-in DLL for the loader test), the parsers' fuzz test, the single-rank part of
# tests/cli_test.sh through zerorun.exe, one training run through `--comm mpi` over the stand-in msmpi.dll, a run
# whose model, checkpoints and logs live under a non-ASCII directory (UTF-8 arguments and paths), and
# examples/quickstart.cmd (README's second Windows command) through wine's cmd.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=$(realpath "${1:-build-win}")
export WINEPREFIX=${WINEPREFIX:-$BUILD/wineprefix} WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml="
# The .exe files are linked statically; MinGW's runtime DLLs stay reachable in case a library came in as a DLL.
GCCDIR=$(dirname "$(x86_64-w64-mingw32-g++-posix -print-libgcc-file-name)")
export WINEPATH="Z:${GCCDIR//\//\\};Z:\\usr\\x86_64-w64-mingw32\\lib"
t0=$(date +%s)
if [[ ! -f "$WINEPREFIX/system.reg" ]]; then
  wineboot -i >/dev/null 2>&1 || true
fi
wineserver -p 600 >/dev/null 2>&1 || true  # one wineserver for every run below
trap 'wineserver -k >/dev/null 2>&1 || true' EXIT
echo "wine $(wine --version) ready in $(($(date +%s) - t0))s"

echo "== unit tests (Catch2) under wine (not those tagged [posix]: io_uring, sh)"
ZERORUN_TEST_MSMPI_STANDIN="$BUILD/tests/msmpi_standin.dll" ZERORUN_POISON_UNINIT=1 \
  wine "$BUILD/tests/zerorun_tests.exe" "~[posix]"

echo "== fuzz test under wine"
OMP_NUM_THREADS=1 wine "$BUILD/tests/zerorun_fuzz_test.exe" --iters "${ZERORUN_WINE_FUZZ_ITERS:-100}"

echo "== single-rank CLI checks (tests/cli_test.sh) through zerorun.exe"
WRAP=$(mktemp -d)
trap 'rm -rf "$WRAP"; wineserver -k >/dev/null 2>&1 || true' EXIT
cat >"$WRAP/zerorun" <<SH
#!/usr/bin/env bash
exec wine "$BUILD/zerorun.exe" "\$@"
SH
chmod +x "$WRAP/zerorun"
SHARED=$ROOT/../shared/configs
[[ -f "$SHARED/ds_config_zero3.json" ]] || SHARED=$ROOT/configs
ZERORUN_CLI_SINGLE_RANK=1 ZERORUN_POISON_UNINIT=1 bash tests/cli_test.sh "$WRAP/zerorun" "$SHARED"

echo "== --comm mpi through msmpi.dll (the stand-in) and its absence"
cd "$WRAP"
wine "$BUILD/zerorun.exe" init --arch gpt2 --vocab 64 --n_ctx 16 --n_embd 32 --n_layer 1 --n_head 2 -o m.bin >/dev/null
echo '{"train_batch_size": 4}' >c.json
# One rank "started by mpiexec" (PMI_SIZE as MS-MPI sets it, 1 here) goes through MPI: the stand-in counts it.
out=$(ZERORUN_MSMPI_DLL="$BUILD/tests/msmpi_standin.dll" MSMPI_STANDIN_LOG="$WRAP/standin.log" PMI_SIZE=2 \
  wine "$BUILD/zerorun.exe" train m.bin --config c.json --steps 2 --seq_len 8 2>&1) || {
  echo "$out" | tail -5
  echo "FAIL: training through the msmpi stand-in"
  exit 1
}
grep -q "collectives [1-9]" "$WRAP/standin.log" || {
  echo "FAIL: the stand-in msmpi.dll served no collective"
  exit 1
}
echo "ok   - training through msmpi.dll ($(cat "$WRAP/standin.log"))"
out=$(ZERORUN_MSMPI_DLL=no_such_msmpi.dll PMI_SIZE=2 wine "$BUILD/zerorun.exe" train m.bin --config c.json \
  --steps 1 --seq_len 8 2>&1) && {
  echo "FAIL: a multi-rank start without msmpi.dll succeeded"
  exit 1
}
grep -q "install Microsoft MPI" <<<"$out" || {
  echo "$out" | tail -3
  echo "FAIL: no install hint without msmpi.dll"
  exit 1
}
echo "ok   - without msmpi.dll: '$(grep -o 'cannot load.*' <<<"$out" | head -1 | cut -c1-100)...'"

echo "== UTF-8 paths through zerorun.exe (a model, data and checkpoints under a non-ASCII directory)"
# wine hands the Unix argv (UTF-8 under a UTF-8 locale) to the wide command line zerorun.exe reads (utf8_args).
U="$WRAP/J"$'\xc3\xbc'"rgen_"$'\xe6\x97\xa5\xe6\x9c\xac'  # "Jürgen_日本" in UTF-8 bytes
mkdir -p "$U"
LC_ALL=C.UTF-8 wine "$BUILD/zerorun.exe" init --arch gpt2 --vocab 64 --n_ctx 16 --n_embd 32 --n_layer 1 --n_head 2 \
  -o "$U/m.bin" >/dev/null
out=$(LC_ALL=C.UTF-8 wine "$BUILD/zerorun.exe" train "$U/m.bin" --config c.json --steps 2 --seq_len 8 \
  --save_dir "$U/ckpt" --log_dir "$U/logs" 2>&1) || {
  echo "$out" | tail -5
  echo "FAIL: training from and into a non-ASCII directory"
  exit 1
}
[[ -f "$U/ckpt/latest" && -s "$U/logs/metrics.jsonl" ]] || {
  ls -R "$WRAP" | head -20
  echo "FAIL: no checkpoint or metrics under $U"
  exit 1
}
LC_ALL=C.UTF-8 wine "$BUILD/zerorun.exe" merge "$U/ckpt" "$U/merged" --layout zerorun >/dev/null
[[ -f "$U/merged/model.bin" ]] || {
  echo "FAIL: merge of a checkpoint under a non-ASCII directory"
  exit 1
}
echo "ok   - UTF-8 paths: init, train, checkpoint, merge under '$(basename "$U")'"

echo "== examples/quickstart.cmd under wine's cmd (README's second Windows command; STEPS=${ZERORUN_WINE_QUICKSTART_STEPS:-10})"
cd "$ROOT"
t_q=$(date +%s)
out=$(ZERORUN_EXE="$(winepath -w "$BUILD/zerorun.exe")" STEPS=${ZERORUN_WINE_QUICKSTART_STEPS:-10} \
  wine cmd /c "$(winepath -w "$ROOT/examples/quickstart.cmd")" 2>&1) || {
  echo "$out" | tail -8
  echo "FAIL: examples/quickstart.cmd"
  exit 1
}
grep -q "eval_loss" <<<"$out" && grep -q -- "--- a sample" <<<"$out" || {
  echo "$out" | tail -8
  echo "FAIL: quickstart.cmd printed no held-out loss or no sample"
  exit 1
}
rm -rf "$ROOT/runs/quickstart"
echo "ok   - quickstart.cmd: $(grep -o 'eval_loss [0-9.]*' <<<"$out" | tail -1) in $(($(date +%s) - t_q))s"
echo "windows tests under wine: all passed in $(($(date +%s) - t0))s"
