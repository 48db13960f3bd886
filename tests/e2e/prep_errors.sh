#!/usr/bin/env bash
# e2e (issue 3): the prep CLI on bad input. Each case exits non-zero with a message naming the
# file and the problem, and leaves no dataset behind; validate reports a hash mismatch; synth is
# deterministic from its seed; --help lists every option with its default.
# Usage: prep_errors.sh /path/to/kilter
set -euo pipefail
KILTER=$(readlink -f "$1")
PY=${KILTER_PYTHON:-/usr/bin/python3}
WORK=$(mktemp -d /tmp/kilter-e2e-prep-errors.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
fail() { echo "FAIL: $*" >&2; exit 1; }

# expect_failure "needle..." -- command: non-zero exit and every needle in stderr+stdout.
expect_failure() {
  local needles=()
  while [[ $1 != -- ]]; do needles+=("$1"); shift; done
  shift
  if "$@" > out.txt 2>&1; then fail "succeeded unexpectedly: $*"; fi
  for n in "${needles[@]}"; do grep -qF -- "$n" out.txt || { cat out.txt; fail "message lacks '$n': $*"; }; done
}

"$KILTER" prep --help > help.txt
for opt in --input --format --shards --out --force --quiet '(=1)' '(=text)' 'eos_id = 256'; do
  grep -qF -- "$opt" help.txt || fail "prep --help lacks $opt"
done
grep -qF 'lognormal:MU,SIGMA' <<<"$("$KILTER" prep synth --help)" || fail "synth --help lacks --lengths"
grep -qF 'validate DIR' <<<"$("$KILTER" prep validate --help)" || fail "validate --help"

printf 'hello' > a.txt
expect_failure "nope.txt" "does not exist" -- "$KILTER" prep --input a.txt nope.txt --out ds --quiet
[[ ! -e ds ]] || fail "a failed prep left ds behind"
printf '{"text": "ok"}\n{"text": 3}\n' > bad.jsonl
expect_failure "bad.jsonl:2" 'string field "text"' -- "$KILTER" prep --input bad.jsonl --format jsonl --out ds --quiet
expect_failure "--format" "csv" -- "$KILTER" prep --input a.txt --format csv --out ds --quiet
expect_failure "--out" -- "$KILTER" prep --input a.txt
[[ ! -e ds ]] || fail "a failed prep left ds behind"

# Empty documents dropped and counted; non-UTF-8 kept (byte 0xff is token 255).
mkdir docs && printf '' > docs/0.txt && printf 'x\xffy' > docs/1.txt && printf 'z' > docs/2.txt
"$KILTER" prep --input docs --out ds --quiet | tee prep.out
grep -qF "2 documents" prep.out && grep -qF "1 empty documents dropped" prep.out || fail "empty document not counted"
"$PY" -c "import h5py; t=h5py.File('ds/shard-00000.h5','r')['tokens'][:]; assert list(t)==[120,255,121,122], list(t)"

# Synth: same seed, same bytes of data; validate catches a modified token.
"$KILTER" prep synth --docs 300 --lengths lognormal:4,1,512 --vocab 1000 --shards 2 --seed 4 --out s1 --quiet
"$KILTER" prep synth --docs 300 --lengths lognormal:4,1,512 --vocab 1000 --shards 2 --seed 4 --out s2 --quiet
"$PY" - <<'PYEOF'
import h5py, numpy as np
for s in range(2):
    a, b = h5py.File("s1/shard-%05d.h5" % s, "r"), h5py.File("s2/shard-%05d.h5" % s, "r")
    assert np.array_equal(a["tokens"][:], b["tokens"][:]) and np.array_equal(a["offsets"][:], b["offsets"][:])
    assert a.attrs["eos_id"] == 999 and int(a["tokens"][:].max()) < 999
    a.close(); b.close()
f = h5py.File("s1/shard-00001.h5", "r+"); f["tokens"][7] = (int(f["tokens"][7]) + 1) % 999; f.close()
PYEOF
grep -q '^OK' <<<"$("$KILTER" prep validate s2)" || fail "validate s2"
expect_failure "shard-00001.h5" "does not match the index" -- "$KILTER" prep validate s1
expect_failure "shard-00000.h5" "shard file is missing" -- bash -c "rm s2/shard-00000.h5 && '$KILTER' prep validate s2"
expect_failure "exists and is not empty" "--force" -- "$KILTER" prep --input a.txt --out s1 --quiet
echo "prep_errors: OK"
