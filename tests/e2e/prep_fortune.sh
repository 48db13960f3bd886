#!/usr/bin/env bash
# e2e (issue 3): prepare the demo corpus (Debian's fortunes), validate it, show its structure
# with h5dump -H, and read every shard with h5py: documents equal an independent Python parse
# of the fortune files, attributes are as docs/design.md says, and the content hash recomputes.
# Usage: prep_fortune.sh /path/to/kilter
set -euo pipefail
KILTER=$(readlink -f "$1")
PY=${KILTER_PYTHON:-/usr/bin/python3}
FORTUNES=${KILTER_FORTUNES:-/usr/share/games/fortunes}
WORK=$(mktemp -d /tmp/kilter-e2e-prep.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
fail() { echo "FAIL: $*" >&2; exit 1; }

[[ -d $FORTUNES ]] || fail "$FORTUNES is missing (scripts/install-deps.sh installs the fortunes packages)"

"$KILTER" prep --input "$FORTUNES" --format fortune --shards 3 --out fortunes 2> prep.err > prep.out
cat prep.out
grep -q "3 shards" prep.out || fail "prep report lacks the shard count"
grep -q "empty documents dropped" prep.out || fail "prep report lacks the empty-document count"
grep -q "docs/s" prep.err || fail "no progress line with docs/s on stderr"
grep -q "MB/s" prep.err || fail "no progress line with MB/s on stderr"
[[ $(ls fortunes) == $'index.h5\nshard-00000.h5\nshard-00001.h5\nshard-00002.h5' ]] || fail "unexpected files: $(ls fortunes)"
ls -a . | grep -q 'tmp-' && fail "a temporary directory was left behind"

"$KILTER" prep validate fortunes | tee validate.out
grep -q '^OK: fortunes: 3 shards' validate.out || fail "validate did not say OK"

h5dump -H fortunes/shard-00001.h5 > dump.txt
for needle in 'DATASET "tokens"' 'H5T_STD_U16LE' 'DATASET "offsets"' 'H5T_STD_U64LE' \
              'ATTRIBUTE "format"' 'ATTRIBUTE "format_version"' 'ATTRIBUTE "vocab_size"' \
              'ATTRIBUTE "tokenizer"' 'ATTRIBUTE "eos_id"' 'ATTRIBUTE "shard_index"' 'ATTRIBUTE "num_shards"'; do
  grep -qF "$needle" dump.txt || fail "h5dump -H lacks $needle"
done
grep -qF 'DATASET "doc_lengths"' <<<"$(h5dump -H fortunes/index.h5)" || fail "index.h5 lacks doc_lengths"
grep -q CONTIGUOUS <<<"$(h5dump -p -H -d /tokens fortunes/shard-00000.h5)" || fail "/tokens is not contiguous"

"$PY" - "$FORTUNES" fortunes <<'PYEOF'
import os, sys, h5py, numpy as np
src, out = sys.argv[1], sys.argv[2]

def is_separator(line):
    return line in (b"%\n", b"%\r\n", b"%", b"%\r")

docs, empty = [], 0
for name in sorted(os.listdir(src)):
    path = os.path.join(src, name)
    if os.path.islink(path) or not os.path.isfile(path) or name.endswith(".dat"):
        continue
    current, any_line = b"", False
    with open(path, "rb") as f:
        for line in f:
            any_line = True
            if is_separator(line):
                if current: docs.append(current)
                else: empty += 1
                current = b""
            else:
                current += line
    if current: docs.append(current)
    elif not any_line: empty += 1

index = h5py.File(os.path.join(out, "index.h5"), "r")
def attr(f, name):
    v = f.attrs[name]
    return v.decode() if isinstance(v, bytes) else (v.item() if hasattr(v, "item") else v)
assert attr(index, "format") == "kilter-index", attr(index, "format")
assert attr(index, "format_version") == 1
assert attr(index, "vocab_size") == 257 and attr(index, "eos_id") == 256
assert attr(index, "tokenizer") == "byte"
assert attr(index, "num_docs") == len(docs), (attr(index, "num_docs"), len(docs))
lengths = index["doc_lengths"][:]
assert lengths.dtype == np.uint32
assert list(lengths) == [len(d) for d in docs]

got = []
for s in range(attr(index, "num_shards")):
    shard = h5py.File(os.path.join(out, "shard-%05d.h5" % s), "r")
    assert attr(shard, "format") == "kilter-shard" and attr(shard, "shard_index") == s
    assert attr(shard, "num_shards") == 3 and attr(shard, "vocab_size") == 257
    tokens, offsets = shard["tokens"][:], shard["offsets"][:]
    assert tokens.dtype == np.uint16 and offsets.dtype == np.uint64
    assert shard["tokens"].chunks is None and shard["tokens"].compression is None
    assert offsets[0] == 0 and offsets[-1] == len(tokens) and np.all(np.diff(offsets.astype(np.int64)) >= 0)
    assert int(tokens.max()) < 256   # EOS is never stored
    for a, b in zip(offsets[:-1], offsets[1:]):
        got.append(tokens[a:b].astype(np.uint8).tobytes())
    if s == 0:  # the content hash, recomputed: FNV-1a 64 over tokens then offsets (little-endian)
        h = 0xcbf29ce484222325
        for byte in tokens.astype("<u2").tobytes() + offsets.astype("<u8").tobytes():
            h = ((h ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
        assert h == int(index["shard_hash"][0]), (hex(h), hex(int(index["shard_hash"][0])))
assert got == docs, "documents differ from an independent parse of the fortune files"
print("h5py: %d documents (%d empty dropped) match; shard 0 hash %016x recomputed" % (len(docs), empty, h))
PYEOF
echo "prep_fortune: OK"
