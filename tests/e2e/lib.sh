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
# Under pipefail, `cmd | grep -q PATTERN || fail` fails when grep exits at its match while cmd is
# still writing (SIGPIPE, 141): a flaky failure for output over the first write. The scripts test
# a command's output as `grep -q PATTERN <<<"$(cmd)"` instead.

rank_pid() {  # rank_pid MPIRUN_PID RANK: the pid of that rank's process (waits for it, bounded)
  # Open MPI 4.1's mpirun forks and execs every local rank itself (odls default), so a rank is its
  # child, known by OMPI_COMM_WORLD_RANK in the environment it was exec'd with (a child not yet
  # exec'd still has mpirun's, without it). grep -z reads /proc/PID/environ itself: the lookup was
  # `tr '\0' '\n' < environ | grep -qx ...`, and under pipefail it failed for a running rank
  # whenever the environment ran past tr's first 4 KiB write with the variable inside it: grep
  # matched and exited, tr's second write got SIGPIPE (141), the pipeline "failed". The TSan
  # tests' TSAN_OPTIONS put the ranks' environment near 4 KiB (3.9 KiB here); padded into that
  # window, the old lookup missed a live rank 16 times in 1000, this one never.
  local p
  for _ in $(seq 100); do
    for p in $(pgrep -P "$1"); do
      grep -qxz "OMPI_COMM_WORLD_RANK=$2" "/proc/$p/environ" 2>/dev/null && { echo "$p"; return; }
    done
    kill -0 "$1" 2>/dev/null || fail "mpirun $1 ended before rank $2 could be found"
    sleep 0.1
  done
  ps -o pid,stat,args --ppid "$1" >&2 || true
  fail "no process of rank $2 under mpirun $1 within 10 s"
}

# The kilter processes started from this test's directory (its cwd), whatever runs beside it:
# for "nothing left behind" checks (a pgrep of a relative path matched other tests' processes).
kilter_procs_here() {
  local p
  for p in $(pgrep -f "$KILTER" || true); do  # also this script, mpirun and timeout: their exe differs
    [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$KILTER" ] && [ "$(readlink "/proc/$p/cwd" 2>/dev/null)" = "$WORK" ] \
      && echo "$p"
  done
  return 0
}

# Runs and drills over the array COMMON (defined by the calling script before the first call).
train() {  # train LOG NP [args]: a run that must succeed (bounded: a hang fails the test)
  local log=$1 np=$2; shift 2
  timeout 300 "${MPIRUN[@]}" -np "$np" "$KILTER" train "${COMMON[@]}" "$@" > "$log" 2>&1 \
    || { cat "$log"; fail "$log: kilter train failed"; }
}
stop_after() {  # stop_after LOG NP N [args]: a preemption drill (test hook: rank 1 raises SIGUSR1
  # at step N-1) stops the run after N steps with exit code 85, whatever its train.steps.
  local log=$1 np=$2 n=$3; shift 3
  local rc=0
  KILTER_TEST_FAIL_RANK=1 KILTER_TEST_FAIL_STEP=$((n - 1)) KILTER_TEST_FAIL_MODE=sigusr1 \
    timeout 300 "${MPIRUN[@]}" -np "$np" -x KILTER_TEST_FAIL_RANK -x KILTER_TEST_FAIL_STEP -x KILTER_TEST_FAIL_MODE \
    "$KILTER" train "${COMMON[@]}" "$@" > "$log" 2>&1 || rc=$?
  [ $rc -eq 85 ] || { cat "$log"; fail "$log: exit code $rc, expected 85 (kExitPreempted)"; }
}

# Corpora and oracles shared by several scripts.
sentence_corpus() {  # sentence_corpus FILE: simple English-like sentences in the fortune format,
  # long enough that EOS is rare within a 128-token context (300 documents of 8 sentences).
  "$PY" - "$1" <<'PY'
import random, sys
random.seed(3)
subjects = ["The cat", "A dog", "The old man", "My friend", "The teacher", "A small bird"]
verbs = ["sees", "likes", "finds", "wants", "keeps", "brings"]
objects = ["the red ball.", "a warm house.", "the long road.", "some fresh bread.", "the blue sea."]
with open(sys.argv[1], "w") as f:
    for _ in range(300):
        f.write(" ".join(f"{random.choice(subjects)} {random.choice(verbs)} {random.choice(objects)}" for _ in range(8)))
        f.write("\n%\n")
PY
}
# The HF export tests' model: corpus.txt (sentence_corpus), its byte-level dataset data/, and a
# model trained on it into runs/t, 60 steps on 2 ranks, long enough that greedy decoding varies.
sentence_model() {  # sentence_model [MODEL ARGS]: the args give the model's shape; log in train.log
  sentence_corpus corpus.txt
  "$KILTER" prep --input corpus.txt --format fortune --shards 1 --out data --quiet >/dev/null
  timeout 300 "${MPIRUN[@]}" -np 2 "$KILTER" train --data.dir=data "$@" --train.tokens_per_step=1024 \
    --train.steps=60 --train.warmup=5 --train.lr=3e-3 --output.trace_steps=0 --output.log_every=30 \
    --output.dir=runs/t > train.log 2>&1 || { cat train.log; fail "kilter train failed"; }
}
SENTENCE_PROMPT="84,104,101,32,99,97,116,32,115,101,101,115,32,116,104,101,32,114,101,100,32,98,97,108,108,46,32,65,32"
sentence_greedy() {  # sentence_greedy RUN_DIR OUT: `kilter sample`'s 64 greedy tokens after SENTENCE_PROMPT
  # ("The cat sees the red ball. A " in bytes) as --json writes them, for tests/python/hf_export_checks.py
  "$KILTER" sample --run "$1" --prompt-tokens "$SENTENCE_PROMPT" --temperature 0 --max-new-tokens 64 --ignore-eos \
    --json > "$2" 2>/dev/null
}
hf_python() {  # hf_python: sets HFPY to the test-only venv with transformers + safetensors, or fails
  HFPY=${KILTER_HF_PYTHON:-/opt/kilter-test-venv/bin/python}
  "$HFPY" -c "import transformers, safetensors, torch, h5py" 2>/dev/null \
    || fail "$HFPY lacks transformers/safetensors/h5py (scripts/install-deps.sh --with-test-extras sets up the venv)"
}
hf_python_or_skip() {  # hf_python_or_skip: as hf_python, but where the venv is missing the test is
  # skipped (exit 77, the tests' SKIP_RETURN_CODE) with a line saying why
  HFPY=${KILTER_HF_PYTHON:-/opt/kilter-test-venv/bin/python}
  "$HFPY" -c "import transformers, safetensors, torch, h5py" 2>/dev/null && return 0
  echo "SKIP: $(basename "$0"): $HFPY lacks transformers/safetensors/h5py (scripts/install-deps.sh --with-test-extras sets up the venv)"
  exit 77
}
drill() {  # drill MODE RANK STEP NP LIMIT_S NAME [args]: a fault drill (the test hook KILTER_TEST_FAIL_*
  # on rank RANK at step STEP; run dir runs/NAME, output NAME.log) that must end every rank
  # non-zero within LIMIT_S seconds (a coarse no-hang bound, not a timing) and leave no kilter
  # process behind. DRILL_RC and DRILL_SECONDS say how it ended.
  local mode=$1 rank=$2 step=$3 np=$4 limit=$5 name=$6 start
  shift 6
  DRILL_RC=0
  start=$(date +%s)
  KILTER_TEST_FAIL_RANK=$rank KILTER_TEST_FAIL_STEP=$step KILTER_TEST_FAIL_MODE=$mode \
    timeout "$limit" "${MPIRUN[@]}" -np "$np" -x KILTER_TEST_FAIL_RANK -x KILTER_TEST_FAIL_STEP -x KILTER_TEST_FAIL_MODE \
    "$KILTER" train "${COMMON[@]}" --output.dir="runs/$name" "$@" > "$name.log" 2>&1 || DRILL_RC=$?
  DRILL_SECONDS=$(($(date +%s) - start))
  [ $DRILL_RC -ne 0 ] || { cat "$name.log"; fail "$name: the job exited 0"; }
  [ $DRILL_RC -ne 124 ] || { cat "$name.log"; fail "$name: ranks still running after $limit s"; }
  # (this test's own: another test running beside it may drill a run of the same name)
  if [ -n "$(kilter_procs_here)" ]; then fail "$name: kilter processes left behind"; fi
}
