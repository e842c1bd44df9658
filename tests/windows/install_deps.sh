#!/usr/bin/env bash
# Debian packages the Windows cross-build and its tests need (only the missing ones): MinGW-w64 with the posix thread
# model, and wine to run the .exe files. Used by tests/windows/build_windows.sh and tests/run_all.sh.
set -euo pipefail
PKGS=(g++-mingw-w64-x86-64-posix gcc-mingw-w64-x86-64-posix mingw-w64-x86-64-dev wine wine64 nlohmann-json3-dev
  libspdlog-dev libfmt-dev libcli11-dev catch2)
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
