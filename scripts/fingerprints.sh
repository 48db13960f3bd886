#!/usr/bin/env bash
# Fingerprints of the CPU model's numbers, to compare two builds bit for bit (a refactor of the
# model, its ops or its settings must not change one). For each configuration it prints one line:
# the configuration and a SHA-256 over every rank's losses (metrics/rank-*.csv), the final
# checkpoint's parameters and AdamW moments, and, for the single-process cases, the gradients,
# updated weights and the KV-cache generator's logits that kilter_model_dump writes.
#   gpt2 and llama x fp32, bf16 GEMMs and bf16 storage x recompute none, gelu, attention, block;
#   pieces cut between 2 ranks (a context longer than data.max_tokens) x the same;
#   the optimizer sharded (ZeRO-1) and not.
# usage: scripts/fingerprints.sh BUILD_DIR [OUT_FILE]     (BUILD_DIR holds kilter and kilter_model_dump)
# Compare: scripts/fingerprints.sh build-old a.txt; scripts/fingerprints.sh build-new b.txt; diff a.txt b.txt
set -euo pipefail
build=$(readlink -f "$1")
out=/dev/stdout; [ -n "${2:-}" ] && out=$(readlink -m "$2")
kilter=$build/kilter
dump=$build/kilter_model_dump
[ -x "$kilter" ] || { echo "fingerprints: $kilter is not an executable; build the kilter target first" >&2; exit 2; }
PY=${KILTER_PYTHON:-/usr/bin/python3}   # Debian's, with h5py (not a pyenv shim)
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
export OPENBLAS_NUM_THREADS=1
work=$(mktemp -d /tmp/kilter-fingerprints.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$kilter" prep synth --docs 300 --lengths lognormal:4,0.9,300 --vocab 97 --shards 2 --seed 5 --out data >/dev/null

BASE=(--data.dir=data --model.n_layer=2 --model.n_head=4 --model.n_embd=32 --train.steps=4 --train.warmup=2
      --train.lr=3e-3 --output.log_every=1 --output.trace_steps=0 --comm.timeout_s=120
      --data.cost_calibration=off)
LLAMA=(--model.arch=llama --model.n_kv_head=2 --model.ffn_hidden=80 --model.rope_theta=10000
       --model.tie_embeddings=false)
WHOLE=(--model.block_size=64 --data.max_tokens=256 --train.tokens_per_step=1024)
CUT=(--model.block_size=128 --data.max_tokens=64 --train.tokens_per_step=384)
declare -A PRECISION=([fp32]="--train.precision=fp32" [bf16gemm]="--train.precision=bf16 --train.bf16_storage=off"
                      [bf16store]="--train.precision=bf16 --train.bf16_storage=on")

hash_run() {  # hash_run DIR: losses of every rank and the newest checkpoint's params and moments
  "$PY" - "$1" <<'PY'
import csv, glob, hashlib, sys
import h5py
run = sys.argv[1]
h = hashlib.sha256()
for path in sorted(glob.glob(f"{run}/metrics/rank-*.csv")):
    with open(path) as f:
        for row in csv.DictReader(f):
            h.update(row["loss"].encode())
ckpt = sorted(glob.glob(f"{run}/checkpoints/step-*.h5"))[-1]
with h5py.File(ckpt, "r") as f:
    names = []
    f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) and n.split("/")[0] in ("params", "adam") else None)
    for n in sorted(names):
        h.update(n.encode()); h.update(f[n][...].tobytes())
print(h.hexdigest()[:16])
PY
}

line() {  # line NAME HASH: a failed hash (empty) ends the script
  [ -n "$2" ] || { echo "fingerprints: no hash for $1" >&2; exit 1; }
  printf '%-44s %s\n' "$1" "$2" >> "$work/fingerprints.txt"
}
: > "$work/fingerprints.txt"
have_bf16=0
grep -q -m1 -E 'avx512_bf16|amx_bf16' /proc/cpuinfo && have_bf16=1
for arch in gpt2 llama; do
  archargs=(); [ $arch = llama ] && archargs=("${LLAMA[@]}")
  for prec in fp32 bf16gemm bf16store; do
    [ $prec != fp32 ] && [ $have_bf16 = 0 ] && continue
    for shape in whole cut; do
      for rc in none gelu attention block; do
        [ $shape = cut ] && [ $rc = gelu ] && continue
        name=$arch-$prec-$shape-$rc
        shapeargs=("${WHOLE[@]}"); [ $shape = cut ] && shapeargs=("${CUT[@]}")
        # shellcheck disable=SC2086
        timeout 300 "${MPIRUN[@]}" -np 2 "$kilter" train "${BASE[@]}" "${archargs[@]}" "${shapeargs[@]}" \
          ${PRECISION[$prec]} --train.recompute=$rc --output.dir=runs/$name > $name.log 2>&1 \
          || { cat $name.log >&2; echo "fingerprints: $name failed" >&2; exit 1; }
        line "$name" "$(hash_run runs/$name)"
      done
    done
  done
  name=$arch-fp32-whole-none-unsharded
  timeout 300 "${MPIRUN[@]}" -np 2 "$kilter" train "${BASE[@]}" "${archargs[@]}" "${WHOLE[@]}" \
    --train.shard_optimizer=false --output.dir=runs/$name > $name.log 2>&1 \
    || { cat $name.log >&2; echo "fingerprints: $name failed" >&2; exit 1; }
  line "$name" "$(hash_run runs/$name)"
done

if [ -x "$dump" ]; then
  for case in "" "--cut" "--llama gqa" "--llama tied" "--llama llama3" "--llama qwen2"; do
    d=dump-$(echo "$case" | tr -d ' -'); mkdir -p "$d"
    # shellcheck disable=SC2086
    "$dump" "$d" $case > /dev/null
    line "model_dump ${case:-gpt2}" "$(cat "$d"/*.f32 | sha256sum | cut -c1-16)"
  done
fi
cat "$work/fingerprints.txt" > "$out"
