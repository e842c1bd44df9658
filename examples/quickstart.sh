#!/usr/bin/env bash
# README command 1: install dependencies, build zerorun, and train a tiny
# GPT-2 on CPU with a DeepSpeed config (synthetic data unless DATA is set).
set -euo pipefail
cd "$(dirname "$0")/.."
bash cmake/install_deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
mkdir -p runs/quickstart
./build/zerorun init --arch gpt2 --vocab 512 --n_ctx 64 --n_embd 128 --n_layer 4 --n_head 4 \
  -o runs/quickstart/model.bin
./build/zerorun --device cpu --config configs/quickstart_cpu.json runs/quickstart/model.bin \
  --data "${DATA:-synthetic}" --steps "${STEPS:-200}" --log_dir runs/quickstart
