#!/usr/bin/env bash
# Installs what is missing, builds kilter (with CUDA/cuDNN/NCCL where the toolkit is present, so
# the GPU code at least compiles) and runs the CPU machine's full suite: ctest -LE gpu.
# Usage: scripts/test.sh [extra ctest args]     (BUILD_DIR=build by default)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

scripts/install-deps.sh --with-test-extras
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j "$JOBS"
cd "$BUILD_DIR"
ctest -LE gpu --output-on-failure "$@"
