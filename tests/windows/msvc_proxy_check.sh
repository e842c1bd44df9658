#!/usr/bin/env bash
# The MSVC proxy (issue 36): no Visual Studio runs here, so CI checks what would break cl.exe in three parts.
#  1. tests/windows/msvc_constructs.py: no POSIX-only header or call outside the platform layer (unistd.h, dlfcn.h,
#     sys/*.h, setenv/unsetenv, ssize_t, ...), no __VERSION__, M_PI, __attribute__, __builtin_* (outside a guarded
#     helper), no OpenMP beyond MSVC's /openmp 2.0 (collapse, simd, tasks, min/max reductions, unsigned loop indices
#     of an omp for). Its exemption list (the platform layer's two .cc files, Linux-only test mains) is in the script.
#  2. Every .cc the Windows build compiles — src/, kernels/cpu, kernels/stub, kernels/blas_builtin, include/ (through
#     them), tests/ and examples/ — through g++ -std=c++17 (no GNU extensions) -Wpedantic -Werror=pedantic
#     -Werror=vla -fsyntax-only, seeing the headers a Windows build sees (zerorun's SDK-less <mpi.h> and <cblas.h>);
#     and, where MinGW-w64 is installed (tests/windows/build_windows.sh installs it), the Win32-only sources the same
#     way with x86_64-w64-mingw32-g++-posix. The CUDA sources (.cu) get half 1 only.
#  3. tests/windows/cmake_flags_test.cmake: the flags CMake gives cl.exe, GCC and nvcc (cmake/ZerorunFlags.cmake).
# What it cannot see: MSVC's own front end (two-phase lookup, /permissive- differences) and nvcc with cl.exe.
# About 150 s of CPU time: 2 min 39 s on this 2-core machine with other builds running (load 5), 6 min at load 10;
# JOBS=N sets the parallelism (default: the cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s)
echo "== MSVC-hostile constructs (tests/windows/msvc_constructs.py)"
python3 tests/windows/msvc_constructs.py .
echo "== flags per compiler (cmake -P tests/windows/cmake_flags_test.cmake)"
cmake -P tests/windows/cmake_flags_test.cmake

CXX=${CXX:-g++}
JOBS=${JOBS:-$(nproc)}
FLAGS=(-std=c++17 -Wpedantic -Werror=pedantic -Werror=vla -fsyntax-only -fopenmp -Iinclude -I. -Ikernels/blas_builtin
       -Isrc/comm/msmpi -DSPDLOG_COMPILED_LIB -DSPDLOG_FMT_EXTERNAL -DZERORUN_VERSION=\"0\" -DZERORUN_MPIRUN=\"mpiexec\"
       -DZERORUN_COMPILER=\"proxy\" -DZR_SOURCE_DIR=\".\" -DZR_FUZZ_TARGET=\"tokenizer\")
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
# check COMPILER FILE...: one syntax-only compile a file, JOBS at a time; prints each failing file's diagnostics.
check() {
  local cxx=$1
  shift
  printf '%s\n' "$@" | xargs -P "$JOBS" -I{} sh -c \
    'f="$1"; shift; "$@" "$f" >"$0/$(echo "$f" | tr / _).log" 2>&1 || echo "$f" >>"$0/failed"' \
    "$LOGS" {} "$cxx" "${FLAGS[@]}" || true
}
mapfile -t SOURCES < <(find src kernels/cpu kernels/stub kernels/blas_builtin tests examples -name '*.cc' \
  ! -path src/core/platform_win32.cc ! -path 'tests/windows/*' | sort)
echo "== ${#SOURCES[@]} sources: $CXX ${FLAGS[*]:0:6}"
check "$CXX" "${SOURCES[@]}"
MINGW=x86_64-w64-mingw32-g++-posix
if command -v "$MINGW" >/dev/null; then
  WIN_SOURCES=(src/core/platform_win32.cc tests/windows/msmpi_standin.cc kernels/cpu/optim.cc)
  echo "== ${#WIN_SOURCES[@]} Win32 sources: $MINGW (same flags)"
  check "$MINGW" "${WIN_SOURCES[@]}"
else
  echo "== $MINGW not installed: the Win32-only sources are left to the cross-build"
fi
if [[ -f "$LOGS/failed" ]]; then
  while read -r f; do
    echo "---- $f"
    head -40 "$LOGS/$(echo "$f" | tr / _).log"
  done <"$LOGS/failed"
  echo "FAIL: $(wc -l <"$LOGS/failed") file(s) not clean under -std=c++17 -Wpedantic -Werror=pedantic"
  exit 1
fi
echo "msvc proxy: clean in $(($(date +%s) - t0))s"
