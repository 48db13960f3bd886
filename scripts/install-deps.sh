#!/usr/bin/env bash
# Installs the Debian packages kilter needs to build, test and run its demo.
# Idempotent: packages already present are skipped; apt-get runs only when something is missing.
# Usage: scripts/install-deps.sh [--with-test-extras]   (torch/h5py/chromium/slurm/lmod for tests)
set -euo pipefail

BUILD_PKGS=(build-essential cmake pkg-config git
  openmpi-bin libopenmpi-dev
  libhdf5-dev hdf5-tools
  libboost-program-options-dev
  libopenblas-dev
  libgtest-dev googletest
  nlohmann-json3-dev libfmt-dev
  fortunes fortunes-min)
TEST_PKGS=(python3 python3-numpy python3-h5py python3-torch
  chromium
  slurm-wlm munge lmod
  iproute2 util-linux mount
  procps)

want=("${BUILD_PKGS[@]}")
if [[ "${1:-}" == "--with-test-extras" ]]; then want+=("${TEST_PKGS[@]}"); fi

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if (( ${#missing[@]} == 0 )); then
  echo "install-deps: all ${#want[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
