# Sourced (from the repository root) by the scripts that run the bundle of
# tests/make_device_bundle.sh on a GPU machine: library paths for the carried
# Debian libraries, MPI's only where the machine has no libmpi.so.40 of its own
# (its OpenMPI's plugins must match its library), NCCL from PyTorch's wheel
# (zerorun dlopens libnccl.so.2), and NVLink multicast off. Unpacks the
# bundle's archive first where that has not been done yet. DEVBUILD=dir: a bundle made with the same variable.
D=${DEVBUILD:-.devbuild}
if [[ -f "$D/bundle.tar.xz" && ! -d "$D/bin" ]]; then
  tar -C "$D" -xJf "$D/bundle.tar.xz" || { echo "device_env: cannot unpack $D/bundle.tar.xz" >&2; return 1; }
fi
export LD_LIBRARY_PATH="$PWD/$D/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
ldconfig -p | grep -q "libmpi.so.40 " || export LD_LIBRARY_PATH="$PWD/$D/lib-mpi:$LD_LIBRARY_PATH"
NCCL_DIR=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
[[ -n "$NCCL_DIR" ]] && export LD_LIBRARY_PATH="$NCCL_DIR:$LD_LIBRARY_PATH"
export NCCL_NVLS_ENABLE=0
