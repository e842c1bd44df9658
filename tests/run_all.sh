#!/usr/bin/env bash
# README command 2: install dependencies, build, and run every test with ctest
# (unit tests, end-to-end CLI tests, the PyTorch oracle).
set -euo pipefail
cd "$(dirname "$0")/.."
bash cmake/install_deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
cd build
ctest --output-on-failure -j"$(nproc)"
