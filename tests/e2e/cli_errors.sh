#!/usr/bin/env bash
# The mistakes a new user made (issue 25), each with its message and exit code: options are exact
# (no prefix guessing) and near misses get "did you mean"; the world size is the launcher's;
# checks that need only the config and the dataset's index run before MPI (exit 2, nothing
# created); user errors print no source path; the messages the issue names read right.
source "$(dirname "$0")/lib.sh"

# expect RC "NEEDLE" -- command...: exit code RC, NEEDLE in stdout+stderr, no source path.
expect() {
  local want=$1 needle=$2 rc=0; shift 3
  timeout 120 "$@" > out.log 2>&1 || rc=$?
  [ "$rc" -eq "$want" ] || { cat out.log; fail "exit code $rc, expected $want: $*"; }
  grep -qF -- "$needle" out.log || { cat out.log; fail "no '$needle' from: $*"; }
  if grep -qE '\.(cpp|h|cu):[0-9]+\]' out.log; then cat out.log; fail "a user error shows a source path: $*"; fi
}

"$KILTER" prep synth --docs 60 --lengths lognormal:4,0.9,300 --vocab 97 --shards 2 --seed 7 --out data --quiet >/dev/null
TRAIN=("${MPIRUN[@]}" -np 2 "$KILTER" train --model.n_layer=1 --model.n_head=2 --model.n_embd=16
       --model.block_size=64 --data.max_tokens=256 --train.tokens_per_step=1024 --train.steps=2
       --output.trace_steps=0 --output.dir=runs/x)

# Exact names, did you mean.
expect 2 "unknown option --train.step; did you mean --train.steps?" -- "${TRAIN[@]}" --data.dir=data --train.step=0
expect 2 "unknown option --world; did you mean --world-size?" -- "$KILTER" plan --data data --world=4
expect 2 "the launcher sets the world size, not an option (mpirun -np 4 kilter train" -- "${TRAIN[@]}" --data.dir=data --world-size 4
expect 2 "unknown option --train.learning_rate; did you mean --train.lr?" -- "${TRAIN[@]}" --data.dir=data --train.learning_rate=0.1
expect 2 "unknown command 'trian'; did you mean kilter train?" -- "$KILTER" trian
expect 2 "train.backend = 'cdua': expected auto | cpu | cuda; did you mean cuda?" -- "${TRAIN[@]}" --data.dir=data --train.backend=cdua
printf '[train]\nmax_iters = 5\n' > nano.ini
expect 2 "config file nano.ini: unknown key train.max_iters; did you mean train.steps ([train] steps)?" -- "${TRAIN[@]}" --data.dir=data --config nano.ini
expect 2 "unknown option --res; did you mean --resume?" -- "${TRAIN[@]}" --data.dir=data --res runs/x
expect 2 "unknown option --htm; did you mean --html?" -- "$KILTER" report runs/x --htm a.html

# Checks before MPI: nothing is created.
expect 2 "train.eval_every = 5: needs held-out documents, but data.eval_fraction = 0" -- "${TRAIN[@]}" --data.dir=data --train.eval_every=5
expect 2 "config key data.dir = nowhere: no such folder" -- "${TRAIN[@]}" --data.dir=nowhere
mkdir empty
expect 2 "config key data.dir = empty: not a usable dataset: empty/index.h5: index file is missing" -- "${TRAIN[@]}" --data.dir=empty
expect 2 "config key data.dir is empty: name a dataset directory" -- "${TRAIN[@]}"
expect 2 "config key model.vocab_size = 50 is smaller than the vocabulary of data (97)" -- "${TRAIN[@]}" --data.dir=data --model.vocab_size=50
expect 2 "config key data.sources: dataset nowhere: no such folder" -- "${TRAIN[@]}" --data.sources=nowhere:1
expect 2 "config key data.sources: 'data' is not DIR:WEIGHT" -- "${TRAIN[@]}" --data.sources=data:1,data
expect 2 "config keys data.dir and data.sources are both set" -- "${TRAIN[@]}" --data.dir=data --data.sources=data:1
expect 2 "config keys data.sources and data.stage_dir are both set" -- "${TRAIN[@]}" --data.sources=data:1 --data.stage_dir=/tmp
expect 2 "config key train.init_from = nowhere: no such file or folder" -- "${TRAIN[@]}" --data.dir=data --train.init_from=nowhere
[ ! -e runs ] || fail "a run refused before MPI created its run directory"

# Messages.
expect 2 "kilter report: nowhere is not a directory" -- "$KILTER" report nowhere
grep -q "kilter report: kilter report:" out.log && fail "kilter report repeats its prefix"
expect 2 "prep validate needs the dataset directory: kilter prep validate DIR (see kilter prep validate --help)" -- "$KILTER" prep validate
grep -q -- "--dir" out.log && fail "prep validate points at --dir"
expect 1 "--format csv: not a format kilter prep reads (documents: text | jsonl | fortune | parquet | arrow; already tokenized: llmc | nanogpt | megatron | npy)" \
  -- "$KILTER" prep --input data --format csv --out p
expect 1 "--format jsn: not a format kilter prep reads; did you mean jsonl?" -- "$KILTER" prep --input data --format jsn --out p

# Defaults in the shortest round-trip form.
"$KILTER" train --help > help.txt
grep -q -- "--train.lr arg (=0.0003)" help.txt || fail "--help: lr default not 0.0003"
if grep -qE '\(=[0-9.]*0000000' help.txt; then grep -E '\(=[0-9.]*0000000' help.txt; fail "--help prints float noise"; fi

# plan at 4096 ranks: the two step sizes it suggests agree (the coarse-steps one is not below
# the idle-ranks one). A GPU's micro-batch cost (on a CPU a micro-batch costs nothing extra, so
# the cuts give every rank a sliver and none idles).
"$KILTER" plan --lengths lognormal:5,1,1024 --docs 3000 --world-size 4096 --data.cost_c=256 > plan.txt 2>&1
idle=$(grep -o "idle ranks still join every collective; raise train.tokens_per_step to >= [0-9]*" plan.txt | grep -o '[0-9]*$')
coarse=$(grep -o "raise train.tokens_per_step (e.g. to [0-9]*)" plan.txt | grep -o '[0-9]*' | tail -1)
[ -n "$idle" ] && [ -n "$coarse" ] || { cat plan.txt; fail "plan at 4096 ranks: expected both warnings"; }
[ "$coarse" -ge "$idle" ] || { cat plan.txt; fail "plan suggests $coarse after asking for >= $idle"; }

# .jsonl input: the format follows the extension; a --format that disagrees is warned about.
printf '{"text": "one"}\n{"text": "two"}\n{"text": "three"}\n' > docs.jsonl
"$KILTER" prep --input docs.jsonl --out j --quiet > j.log 2>&1 || { cat j.log; fail "prep of a .jsonl failed"; }
grep -q "3 documents" j.log || { cat j.log; fail ".jsonl without --format was not read as JSONL"; }
"$KILTER" prep --input docs.jsonl --format text --out t --quiet > t.log 2>&1
grep -q "warning: --format text, but the inputs' extension says jsonl" t.log || { cat t.log; fail "no warning for --format text on .jsonl"; }

# An internal error keeps its source place (KILTER_TEST_FAIL_MODE=error is an injected failure inside kilter).
rc=0
KILTER_TEST_FAIL_RANK=0 KILTER_TEST_FAIL_STEP=0 timeout 120 "${MPIRUN[@]}" -np 2 -x KILTER_TEST_FAIL_RANK -x KILTER_TEST_FAIL_STEP \
  "$KILTER" train --data.dir=data --model.n_layer=1 --model.n_head=2 --model.n_embd=16 --model.block_size=64 \
  --data.max_tokens=256 --train.tokens_per_step=1024 --train.steps=2 --output.trace_steps=0 --output.dir=runs/internal \
  > internal.log 2>&1 || rc=$?
[ $rc -ne 0 ] || fail "the injected failure did not fail the run"
grep -qE 'injected failure.*\[.*\.cpp:[0-9]+\]' internal.log || { cat internal.log; fail "an internal error lost its source place"; }
echo PASS
