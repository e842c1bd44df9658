#!/usr/bin/env bash
# README command 2: install dependencies, build, and run every test with ctest
# (unit tests, end-to-end CLI tests, the PyTorch oracle), then the parsers' fuzz
# test again under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/;
# ZERORUN_SKIP_SANITIZE=1 leaves that out), then the Windows cross-build's tests under wine (build-win/;
# ZERORUN_SKIP_WINDOWS=1 leaves that out), then the MSVC proxy (tests/windows/msvc_proxy_check.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash cmake/install_deps.sh
# One CUDA architecture (sm_90) where a toolkit is found, for time; ctest cuda_arch_list compiles the default list's
# others (README: Install). The variable is ignored without CUDA.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90
cmake --build build -j"$(nproc)"
(cd build && ctest --output-on-failure -j"$(nproc)")
if [[ "${ZERORUN_SKIP_SANITIZE:-0}" != 1 ]]; then
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Release -DZERORUN_SANITIZE=ON -DZERORUN_ENABLE_CUDA=OFF
  cmake --build build-asan -j"$(nproc)" --target zerorun_fuzz_test
  (cd build-asan/tests && UBSAN_OPTIONS=print_stacktrace=1 OMP_NUM_THREADS=1 ./zerorun_fuzz_test --iters 400)
fi
# Windows (issue 36): a static CPU-only zerorun.exe cross-built with MinGW-w64 (tests/windows/build_windows.sh
# installs mingw-w64 and wine) and its unit tests, fuzz test and single-rank CLI checks under wine
# (tests/windows/run_wine_tests.sh); ZERORUN_SKIP_WINDOWS=1 leaves that out.
if [[ "${ZERORUN_SKIP_WINDOWS:-0}" != 1 ]]; then
  t_win=$(date +%s)
  bash tests/windows/build_windows.sh build-win
  bash tests/windows/run_wine_tests.sh build-win
  echo "windows part: $(($(date +%s) - t_win))s"
fi
# The MSVC proxy (issue 36): no MSVC-hostile construct, every source clean under g++ -std=c++17 -Wpedantic
# -Werror=pedantic (tests/windows/msvc_proxy_check.sh); ZERORUN_SKIP_MSVC_PROXY=1 leaves it out.
if [[ "${ZERORUN_SKIP_MSVC_PROXY:-0}" != 1 ]]; then
  bash tests/windows/msvc_proxy_check.sh
fi
