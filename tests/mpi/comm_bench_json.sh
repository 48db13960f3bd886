#!/usr/bin/env bash
# `kilter bench-comm --json` on 4 ranks as 2 nodes x 2: exits 0, prints a JSON array with one
# verified row per (size, algo) holding the nccl-tests fields, busbw = algbw * 2(n-1)/n; and a
# bad option is refused with its name and a non-zero exit before MPI starts.
# Usage: comm_bench_json.sh KILTER_BINARY   (MPIEXEC, KILTER_MPIRUN_FLAGS, KILTER_PYTHON from ctest)
set -euo pipefail
kilter=${1:?usage: comm_bench_json.sh KILTER_BINARY}
mpiexec=${MPIEXEC:-mpirun}
python=${KILTER_PYTHON:-/usr/bin/python3}
read -r -a mpirun_flags <<< "${KILTER_MPIRUN_FLAGS:---allow-run-as-root --oversubscribe --bind-to none}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$mpiexec" -n 4 "${mpirun_flags[@]}" "$kilter" bench-comm --bytes 1K,3K,64K,1M --algo both \
  --ranks-per-node 2 --iters 3 --rounds 1 --warmup 1 --json > "$work/out.json"

"$python" - "$work/out.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
assert isinstance(rows, list), "not a JSON array"
seen = set()
for r in rows:
    for key in ("bytes", "algo", "time_us", "algbw_gbs", "busbw_gbs", "verified",
                "mpi_allreduce_busbw_gbs", "ratio_vs_mpi_allreduce"):
        assert key in r, f"row lacks {key}: {r}"
    assert r["verified"] is True, f"unverified row: {r}"
    assert r["ranks"] == 4 and r["nodes"] == 2 and r["ranks_per_node"] == 2, r
    assert r["time_us"] > 0 and r["algbw_gbs"] > 0, r
    expect = r["algbw_gbs"] * 2 * 3 / 4
    assert abs(r["busbw_gbs"] - expect) <= 1e-9 + 1e-6 * expect, f"busbw formula: {r}"
    assert abs(r["algbw_gbs"] - r["bytes"] / (r["time_us"] * 1e-6) / 1e9) <= 1e-6 * r["algbw_gbs"], r
    seen.add((r["bytes"], r["algo"]))
# 3K is rounded up to whole node shards (768 floats = 3072 bytes: already whole).
want = {(b, a) for b in (1024, 3072, 65536, 1048576) for a in ("flat", "hierarchical")}
assert seen == want, f"rows {sorted(seen)} != {sorted(want)}"
print(f"bench-comm --json: {len(rows)} verified rows")
PY

# Option errors: named, non-zero, no MPI needed.
if "$kilter" bench-comm --bytes 12Q > "$work/bad.txt" 2>&1; then
  echo "bench-comm accepted --bytes 12Q"; exit 1
fi
grep -q -- "--bytes" "$work/bad.txt" || { echo "error does not name --bytes:"; cat "$work/bad.txt"; exit 1; }
if "$kilter" bench-comm --algo ring > "$work/bad.txt" 2>&1; then
  echo "bench-comm accepted --algo ring"; exit 1
fi
grep -q -- "--algo" "$work/bad.txt" || { echo "error does not name --algo:"; cat "$work/bad.txt"; exit 1; }
echo "bench-comm option errors: ok"
