#!/usr/bin/env bash
# Packs what the GPU machine lacks into .devbuild/ (git-ignored) for the
# device tool's `carry`: the CUDA build's binaries (stripped) and the Debian
# shared libraries they need beyond glibc/libstdc++ and CUDA's own. MPI's
# libraries go to lib-mpi/, used only where the GPU machine has no libmpi.so.40
# of its own (its OpenMPI's plugins must match its library).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
# The NCCL test is packed with BUNDLE_NCCL=1 only: with it the bundle plus the tree passes the 64 MiB carry limit.
NCCL_TEST=${BUNDLE_NCCL:+$B/tests/zerorun_nccl_test}
# So is the layernorm probe (BUNDLE_LN=1; 6 MB), and BUNDLE_LN=only leaves the other probes out to make room.
LN_PROBE=${BUNDLE_LN:+$B/tests/zerorun_ln_probe}
rm -rf .devbuild && mkdir -p .devbuild/bin .devbuild/lib .devbuild/lib-mpi
for f in "$B/zerorun" "$B/tests/zerorun_cuda_tests" ${NCCL_TEST:-} "$B/tests/zerorun_gemm_probe" "$B/tests/zerorun_attn_probe" ${LN_PROBE:-} "$@"; do
  [[ -f "$f" && -x "$f" ]] || continue
  [[ "${BUNDLE_LN:-}" == only && "$f" == *_probe && "$f" != *ln_probe ]] && continue
  cp "$f" .devbuild/bin/ && strip .devbuild/bin/"$(basename "$f")"
done
for f in .devbuild/bin/*; do ldd "$f"; done | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|libstdc++*|libgcc_s*|libcuda*|libcublas*|libcudart*) ;;
    libmpi*|libopen-rte*|libopen-pal*|libhwloc*|libevent*|libudev*|libz.so*) cp -L "$lib" .devbuild/lib-mpi/ ;;
    *) cp -L "$lib" .devbuild/lib/ ;;
  esac
done
du -sh .devbuild
