#!/usr/bin/env bash
# Cross-builds zerorun.exe, the unit tests, the fuzz test and the MS-MPI stand-in for 64-bit Windows from Debian
# packages (g++-mingw-w64-x86-64-posix; wine runs them: tests/windows/run_wine_tests.sh), into build-win/ (or $1).
# CPU only (no CUDA). Dependencies: Debian's header-only nlohmann-json, spdlog + fmt (used header-only), CLI11 and
# Catch2 headers, copied into build-win/deps; MS-MPI is loaded at run time (no SDK); GEMM is zerorun's builtin one
# (kernels/blas_builtin: Debian ships no Windows OpenBLAS, and a thread-safe cross-built OpenBLAS would add ~10
# minutes to every CI run) — pass ZERORUN_WIN_CMAKE_ARGS="-DZERORUN_BUILTIN_GEMM=OFF" with an OpenBLAS for
# x86_64-w64-mingw32 in CMAKE_FIND_ROOT_PATH to use one instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-win}
[[ "$BUILD" = /* ]] || BUILD=$PWD/$BUILD
JOBS=${JOBS:-$(nproc)}
bash tests/windows/install_deps.sh
mkdir -p "$BUILD/deps"
for d in nlohmann spdlog fmt CLI catch2; do
  rm -rf "$BUILD/deps/$d"
  cp -r "/usr/include/$d" "$BUILD/deps/$d"
done
LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# libgomp.a, not FindOpenMP's libgomp.dll.a: a static .exe needs no libgomp-1.dll next to it.
GOMP=$(x86_64-w64-mingw32-g++-posix -print-file-name=libgomp.a)
# shellcheck disable=SC2086
cmake -S . -B "$BUILD" -DOpenMP_gomp_LIBRARY="$GOMP" -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/toolchain-mingw64.cmake" -DCMAKE_BUILD_TYPE=Release \
  -DZERORUN_ENABLE_CUDA=OFF -DZERORUN_BUILTIN_GEMM=ON -DZERORUN_HEADER_DEPS="$BUILD/deps" "${LAUNCHER[@]}" \
  ${ZERORUN_WIN_CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD" -j"$JOBS" --target zerorun zerorun_tests zerorun_fuzz_test zerorun_msmpi_standin
ls -la "$BUILD/zerorun.exe" "$BUILD/tests/zerorun_tests.exe" "$BUILD/tests/zerorun_fuzz_test.exe"
