#!/usr/bin/env bash
# Sanitizer runs (issue 17): builds kilter with the given sanitizers (CUDA off) and runs the tests
# they cover, failing on any report (tests/sanitizers/reports.sh checks every test's report files).
#   scripts/sanitize.sh address,undefined   ASan + UBSan + LSan, in build-asan: the unit, mpi and
#                                           e2e tiers (not gpu, cluster, or the few no_asan
#                                           numerics tests: KILTER_NO_ASAN_TESTS)
#   scripts/sanitize.sh thread              TSan, in build-tsan: the thread-heavy tests (label
#                                           tsan; the list is KILTER_TSAN_TESTS in
#                                           cmake/KilterTesting.cmake)
# Extra arguments go to ctest (e.g. -R e2e_fault_signal). BUILD_DIR overrides the folder.
# --selection prints the ctest selection of that kind, one argument a line, and builds nothing
# (scripts/test.sh reads the ASan run's, whose test binaries CI's normal build leaves out).
# Usage: scripts/sanitize.sh address,undefined|thread [--selection | ctest args]
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-}
shift || true
case "$kind" in
  address,undefined) BUILD_DIR=${BUILD_DIR:-build-asan}; select=(-L '^(unit|mpi|e2e)$' -LE '^(gpu|cluster|no_asan)$') ;;
  thread)            BUILD_DIR=${BUILD_DIR:-build-tsan}; select=(-L '^tsan$') ;;
  *) echo "usage: scripts/sanitize.sh address,undefined|thread [--selection | ctest args]" >&2; exit 2 ;;
esac
if [[ "${1:-}" == --selection ]]; then
  printf '%s\n' "${select[@]}"
  exit 0
fi
JOBS=${JOBS:-$(nproc)}

scripts/install-deps.sh --with-test-extras
# RelWithDebInfo: no -O3 to undo; KILTER_SANITIZE adds -O1 -g and the sanitizer flags anyway.
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILTER_SANITIZE="$kind" -DENABLE_CUDA=OFF
if [[ "$kind" == thread ]]; then
  # Only what the selected tests run: the TSan build of everything would double the time.
  # A test's target: its executable under the build folder, or (not built yet, so ctest has no
  # command for it) the test's own name; kept when CMake knows such a target.
  build_abs=$(cd "$BUILD_DIR" && pwd)  # here: inside the pipeline below the relative path no longer resolves
  targets=$(cd "$BUILD_DIR" && ctest "${select[@]}" --show-only=json-v1 |
            "${KILTER_PYTHON:-/usr/bin/python3}" -c '
import json, os, re, sys
build = sys.argv[1]
known = set(re.findall(r"CMakeFiles/([^/\s]+)\.dir", open(os.path.join(build, "CMakeFiles/TargetDirectories.txt")).read()))
names = {"kilter"}
for t in json.load(sys.stdin)["tests"]:
    command = t.get("command") or [t["name"]]
    names.update(os.path.basename(a) for a in command if a == t["name"] or a.startswith(build + "/"))
print(" ".join(sorted(names & known)))' "$build_abs")
  cmake --build "$BUILD_DIR" -j "$JOBS" --target $targets
else
  cmake --build "$BUILD_DIR" -j "$JOBS"
fi
cd "$BUILD_DIR"
# Tests in parallel (ctest honours each test's PROCESSORS): most of a sanitizer run is waiting.
ctest "${select[@]}" -j "$JOBS" --output-on-failure "$@"
