#!/usr/bin/env bash
# Installs what is missing, builds kilter (with CUDA/cuDNN/NCCL where the toolkit is present, so
# the GPU code at least compiles) and runs the CPU machine's full suite: ctest -LE gpu.
# KILTER_SKIP_ASAN_TESTED=1 (.ci/run, whose ASan part compiles and runs them): the unit and mpi test
# binaries that scripts/sanitize.sh address,undefined runs stay out of the build, unless a test
# selected here runs them too; everything else (kilter, the GPU code and binaries, the tools the
# e2e scripts call, the benchmarks) is built as without it.
# Usage: scripts/test.sh [extra ctest args]     (BUILD_DIR=build by default)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

scripts/install-deps.sh --with-test-extras
# KILTER_NOT_BUILT (cmake/KilterTesting.cmake) is a cache entry: emptied here on every run.
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DKILTER_NOT_BUILT=
if [[ ${KILTER_SKIP_ASAN_TESTED:-0} == 1 ]]; then
  mapfile -t asan_selection < <(scripts/sanitize.sh address,undefined --selection)
  build_abs=$(cd "$BUILD_DIR" && pwd)
  not_built=$(cd "$BUILD_DIR" && "${KILTER_PYTHON:-/usr/bin/python3}" - "$build_abs" \
    <(ctest "${asan_selection[@]}" --show-only=json-v1) <(ctest -LE gpu "$@" --show-only=json-v1) <<'PY'
import json, os, re, sys
build, asan_tests, these_tests = sys.argv[1:4]
# Each test's command as CMake wrote it (ctest --show-only leaves out those not built yet).
commands = {}
for line in open(os.path.join(build, "CTestTestfile.cmake")):
    m = re.match(r"add_test\(\[=\[(.+?)\]=\] (.*)\)\s*$", line)
    if m:
        commands[m.group(1)] = re.findall(r'"([^"]*)"', m.group(2))
def names(path):
    return [t["name"] for t in json.load(open(path))["tests"]]
def build_files(name):  # the build folder's files a test's command names
    return [os.path.basename(a) for a in commands.get(name, []) if a.startswith(build + "/")]
# The program an ASan-run test runs: a GoogleTest binary, or the one mpirun starts; not an e2e
# script's kilter or tools.
run_there = set()
for name in names(asan_tests):
    command, files = commands.get(name, []), build_files(name)
    if files and os.path.basename(command[0]) not in ("bash", "sh"):
        run_there.add(files[0])
needed_here = {f for name in names(these_tests) for f in build_files(name)}
print(";".join(sorted(run_there - needed_here - {"kilter"})))
PY
  )
  echo "test.sh: not built (compiled and run by the ASan build): ${not_built//;/ }"
  cmake -S . -B "$BUILD_DIR" -DKILTER_NOT_BUILT="$not_built"
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
cd "$BUILD_DIR"
ctest -LE gpu --output-on-failure "$@"
