#!/usr/bin/env bash
# Packs what the GPU machine lacks into .devbuild/ (git-ignored) for the
# device tool's `carry`: the CUDA build's binaries (stripped) and the Debian
# shared libraries they need beyond glibc/libstdc++ and CUDA's own, as one
# xz archive (.devbuild/bundle.tar.xz: ~11 MB where the files are ~70 MB, over
# the carry limit). tests/device_env.sh unpacks it on the GPU machine. MPI's
# libraries go to lib-mpi/, used only where the GPU machine has no
# libmpi.so.40 of its own (its OpenMPI's plugins must match its library).
# Usage: bash tests/make_device_bundle.sh [BUILD_DIR] [EXTRA_BINARIES...]
# DEVBUILD=dir (default .devbuild) puts the bundle elsewhere, so two builds can travel side by side.
# BUNDLE_MIN=1 packs only zerorun, zerorun_cuda_tests and the EXTRA_BINARIES (the carry limit is 64 MiB with the tree).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
[[ $# -gt 0 ]] && shift
S=$(mktemp -d)
trap 'rm -rf "$S"' EXIT
mkdir -p "$S/bin" "$S/lib" "$S/lib-mpi"
ALL=("$B"/tests/zerorun_nccl_test "$B"/tests/zerorun_mpi_engine_test "$B"/tests/zerorun_*_probe)
[[ "${BUNDLE_MIN:-0}" == 1 ]] && ALL=()
for f in "$B/zerorun" "$B"/tests/zerorun_cuda_tests "${ALL[@]}" "$@"; do
  [[ -f "$f" && -x "$f" ]] || continue
  cp "$f" "$S/bin/" && strip "$S/bin/$(basename "$f")"
done
for f in "$S"/bin/*; do ldd "$f"; done | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|libstdc++*|libgcc_s*|libcuda*|libcublas*|libcudart*) ;;
    libmpi*|libopen-rte*|libopen-pal*|libhwloc*|libevent*|libudev*|libz.so*) cp -L "$lib" "$S/lib-mpi/" ;;
    *) cp -L "$lib" "$S/lib/" ;;
  esac
done
D=${DEVBUILD:-.devbuild}
rm -rf "$D" && mkdir -p "$D"
tar -C "$S" -cf - bin lib lib-mpi | xz -T0 -6 >"$D/bundle.tar.xz"
echo "$(ls "$S/bin" | tr '\n' ' ')-> $D/bundle.tar.xz ($(du -h "$D/bundle.tar.xz" | cut -f1))"
