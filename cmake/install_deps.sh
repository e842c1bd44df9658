#!/usr/bin/env bash
# Installs zerorun's build and test dependencies from Debian's packages
# (only the ones missing). Used by examples/quickstart.sh, tests/run_all.sh
# and .ci/run.
set -euo pipefail
PKGS=(cmake g++ make pkg-config nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev catch2 libopenblas-dev
  openmpi-bin libopenmpi-dev python3 python3-numpy python3-torch liburing-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
