#!/usr/bin/env bash
# Issue 31 item 5: the default CUDA architecture list (cmake/ZerorunDeps.cmake: sm_80, 86, 89, 90 and, with CUDA
# 12.8+, 100 and 120) must compile, while CI builds sm_90 alone for time. Compiles every CUDA source of the tree
# (kernels/cuda, src/comm) for each listed architecture the build itself did not (as PTX: the front end and NVVM,
# which reject what an architecture lacks, such as sm_90's float2 atomicAdd on sm_80); CUDA_ARCH_JOBS=N files at a
# time (1: ctest runs other tests beside it).
#   cuda_arch_test.sh NVCC SOURCE_DIR "ARCH ARCH ..." "BUILT ARCHS" -I... [-I...]
set -uo pipefail
NVCC=$1 SRC=$2 ARCHS=${3//;/ } BUILT=${4//;/ }  # CMake lists
shift 4
INC=()
for i in $*; do  # the target's include directories, once each, without /usr/include (it breaks #include_next)
  [[ "$i" == -I/usr/include || " ${INC[*]} " == *" $i "* ]] || INC+=("$i")
done
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
todo=()
for a in $ARCHS; do
  n=${a%%-*}  # 90-real -> 90
  [[ " $BUILT " == *" $n "* || " $BUILT " == *" $n-real "* || " $BUILT " == *" $n-virtual "* ]] && continue
  todo+=("$n")
done
[[ ${#todo[@]} -gt 0 ]] || { echo "every architecture of the list ($ARCHS) is built already ($BUILT)"; exit 0; }
files=("$SRC"/kernels/cuda/*.cu "$SRC"/src/comm/*.cu)
echo "compiling ${#files[@]} CUDA sources for sm_${todo[*]// / sm_} (the build made: $BUILT)"
t0=$(date +%s)
export NVCC W INCS="${INC[*]}"  # (the include paths have no spaces: the script's own directories and Debian's)
for a in "${todo[@]}"; do for f in "${files[@]}"; do echo "$a $f"; done; done |
  xargs -P "${CUDA_ARCH_JOBS:-1}" -L 1 bash -c '
    a=$1 f=$2
    if ! "$NVCC" $INCS -O3 -std=c++17 -DZERORUN_WITH_CUDA=1 -DZERORUN_CUDA_ARCHS=\"check\" -arch=compute_$a -ptx -x cu "$f" \
         -o "$W/$(basename "$f").$a.ptx" >"$W/$(basename "$f").$a.log" 2>&1; then
      echo "FAIL sm_$a $f:"; head -20 "$W/$(basename "$f").$a.log"; exit 255
    fi' _ 2>&1
rc=$?
echo "$(ls "$W"/*.ptx 2>/dev/null | wc -l) of $((${#todo[@]} * ${#files[@]})) compiled in $(($(date +%s) - t0)) s"
[[ $rc -eq 0 ]] && echo "1 passed, 0 failed" || { echo "0 passed, 1 failed"; exit 1; }
