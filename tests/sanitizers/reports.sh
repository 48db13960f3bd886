#!/usr/bin/env bash
# The sanitizer builds' report check (cmake/KilterTesting.cmake registers it as two ctest tests
# around every other test). Each instrumented process writes its ASan/UBSan/LSan/TSan reports to
# DIR/<test name>.<pid> (log_path), so a report fails the run even where the process's exit code
# is not looked at (a command expected to fail, a rank killed by mpirun, a background process).
#   reports.sh clear DIR   empties DIR before the tests (fixture setup)
#   reports.sh check DIR   prints every report and fails if there is one (fixture cleanup)
set -euo pipefail
mode=$1 dir=$2
case "$mode" in
  clear)
    rm -rf "$dir"
    mkdir -p "$dir"
    ;;
  check)
    shopt -s nullglob
    reports=("$dir"/*)
    if (( ${#reports[@]} == 0 )); then
      echo "sanitizer reports: none in $dir"
      exit 0
    fi
    for report in "${reports[@]}"; do
      echo "==== $(basename "$report") (test name.pid) ===="
      head -c 20000 "$report"
    done
    echo "FAIL: ${#reports[@]} sanitizer report file(s) in $dir, from the tests:" \
         "$(for r in "${reports[@]}"; do basename "${r%.*}"; done | sort -u | tr '\n' ' ')" >&2
    exit 1
    ;;
  *)
    echo "usage: reports.sh clear|check DIR" >&2
    exit 2
    ;;
esac
