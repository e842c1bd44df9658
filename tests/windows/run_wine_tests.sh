#!/usr/bin/env bash
# Runs the Windows cross-build's tests under wine (after tests/windows/build_windows.sh): the Catch2 unit tests
# (with the MS-MPI stand-in DLL for the loader test), the parsers' fuzz test, the single-rank part of
# tests/cli_test.sh through zerorun.exe, and one training run through `--comm mpi` over the stand-in msmpi.dll.
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
echo "windows tests under wine: all passed in $(($(date +%s) - t0))s"
