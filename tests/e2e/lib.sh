# Shared helpers for the e2e scripts (sourced). Each script gets the kilter binary as $1 and
# runs in a fresh temporary directory removed on exit.
set -euo pipefail
KILTER=$(readlink -f "$1")
SRC=${KILTER_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
PY=${KILTER_PYTHON:-/usr/bin/python3}
MPIEXEC=${MPIEXEC:-mpirun}
# Root and more ranks than cores on the test machines; visible on purpose.
MPIRUN=("$MPIEXEC" --allow-run-as-root --oversubscribe --bind-to none)
export OPENBLAS_NUM_THREADS=1
WORK=$(mktemp -d /tmp/kilter-e2e.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"

fail() { echo "FAIL: $*" >&2; exit 1; }
