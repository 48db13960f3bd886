#!/usr/bin/env bash
# `kilter prep --format llmc|nanogpt|megatron|npy` (issue 14): files written by numpy in each
# documented layout import to exactly the expected documents and tokens (read back with h5py), and
# malformed files are refused naming the file and the byte offset (tests/python/import_check.py).
source "$(dirname "$0")/lib.sh"
"$PY" -c "import numpy, h5py" 2>/dev/null || fail "$PY lacks numpy/h5py (Debian: python3-numpy python3-h5py)"
"$PY" "$SRC/tests/python/import_check.py" "$KILTER" "$WORK/import"
