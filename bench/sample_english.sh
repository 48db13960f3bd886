#!/usr/bin/env bash
# bench/sample_english.sh — does a model trained on the fortunes corpus write recognisable English?
# (issue 14). Prepares the Debian fortunes with the chosen tokenizer, trains inputs/demo.ini's model
# on 2 CPU ranks, samples SAMPLES texts without a prompt from the last checkpoint (temperature 0.8,
# top-k 40; each starts a new document, its first token drawn from the training documents' first
# tokens, see docs/sampling.md) and scores them: the share of their words (letters only, 2+
# characters, lowercased) that occur as words in the corpus the model was trained on.
#
#   bench/sample_english.sh [KILTER]        KILTER: the kilter binary (default: build/kilter)
#   env: TOKENIZER  byte (default) | sentencepiece (trains a SentencePiece BPE model of VOCAB ids
#                   with `kilter prep tokenizer train` and prepares the corpus with it)
#        VOCAB (default 2000), STEPS (default 2000), LR (default 2e-3, peak), WARMUP (default 50),
#        RANKS (default 2), MIN_SCORE (default 0.8),
#        SAMPLES (default 8), FORTUNES (default /usr/share/games/fortunes),
#        TRAIN_ARGS (extra `--section.key=value` overrides of inputs/demo.ini, e.g. "--train.lr=2e-3"),
#        KEEP=1 keeps the working directory (dataset, tokenizer, run) and prints its path
#
# Prints the samples and the score, and exits 1 when the score is below MIN_SCORE or the samples
# hold fewer than 50 words: the check of "writes recognisable English". An empty or very short
# sample is counted as it is (its few words, none when empty), never dropped or regenerated.
# Never run as a test (minutes of training on 2 cores).
set -euo pipefail

KILTER=$(readlink -f "${1:-build/kilter}")
TOKENIZER=${TOKENIZER:-byte}
VOCAB=${VOCAB:-2000}
STEPS=${STEPS:-2000}
LR=${LR:-2e-3}
WARMUP=${WARMUP:-50}
RANKS=${RANKS:-2}
MIN_SCORE=${MIN_SCORE:-0.8}
SAMPLES=${SAMPLES:-8}
read -r -a TRAIN_EXTRA <<< "${TRAIN_ARGS:-}"
FORTUNES=${FORTUNES:-/usr/share/games/fortunes}
PY=${PY:-/usr/bin/python3}
SRC=$(cd "$(dirname "$0")/.." && pwd)
[[ -x "$KILTER" ]] || { echo "bench/sample_english.sh: no kilter binary at $KILTER (pass its path)" >&2; exit 2; }
[[ -e "$FORTUNES" ]] || { echo "bench/sample_english.sh: no fortunes at $FORTUNES (apt-get install fortunes)" >&2; exit 2; }
work=$(mktemp -d /tmp/kilter-english.XXXXXX)
if [[ "${KEEP:-0}" == 1 ]]; then
  trap 'echo "== kept $work"' EXIT
else
  trap 'rm -rf "$work"' EXIT
fi
export OPENBLAS_NUM_THREADS=1
MPI_FLAGS=(--oversubscribe --bind-to none)
if [[ $(id -u) -eq 0 ]]; then MPI_FLAGS+=(--allow-run-as-root); fi

case "$TOKENIZER" in
  byte)
    "$KILTER" prep --input "$FORTUNES" --format fortune --shards 2 --out "$work/data" --quiet ;;
  sentencepiece)
    # --format fortune: the same documents prep reads (no .dat index files, no "%" separator lines).
    "$KILTER" prep tokenizer train --input "$FORTUNES" --format fortune --vocab "$VOCAB" --kind bpe \
      --out "$work/fortunes.model" --quiet
    "$KILTER" prep --input "$FORTUNES" --format fortune --tokenizer "$work/fortunes.model" --shards 2 \
      --out "$work/data" --quiet ;;
  *) echo "bench/sample_english.sh: TOKENIZER must be byte or sentencepiece" >&2; exit 2 ;;
esac

echo "== training inputs/demo.ini's model for $STEPS steps (lr $LR, warmup $WARMUP) on $RANKS ranks ($TOKENIZER tokenizer)"
mpirun -np "$RANKS" "${MPI_FLAGS[@]}" "$KILTER" train --config "$SRC/inputs/demo.ini" --data.dir="$work/data" \
  --data.eval_fraction=0 --train.eval_every=0 --train.steps="$STEPS" --train.lr="$LR" --train.warmup="$WARMUP" \
  --output.checkpoint_every=0 \
  --output.trace_steps=0 --output.log_every=100 --output.dir="$work/run" "${TRAIN_EXTRA[@]}"

for seed in $(seq 1 "$SAMPLES"); do
  "$KILTER" sample --run "$work/run" --max-new-tokens 120 --temperature 0.8 --top-k 40 --seed $seed --json \
    > "$work/sample-$seed.json"
done

"$PY" - "$work" "$FORTUNES" "$MIN_SCORE" <<'PY'
import glob, json, os, re, sys
work, fortunes, min_score = sys.argv[1], sys.argv[2], float(sys.argv[3])
files = [fortunes] if os.path.isfile(fortunes) else [
    p for p in glob.glob(os.path.join(fortunes, "*")) if os.path.isfile(p) and not p.endswith((".dat", ".u8"))]
words = lambda text: [w.lower() for w in re.findall(r"[A-Za-z]{2,}", text)]
known = set()
for path in files:
    known.update(words(open(path, encoding="utf-8", errors="replace").read()))
total = hits = 0
for path in sorted(glob.glob(os.path.join(work, "sample-*.json"))):
    sample = json.load(open(path))
    text = sample["completion"]
    ws = words(text)
    found = sum(w in known for w in ws)
    print("----", os.path.basename(path), f"({sample['new_tokens']} tokens, stopped: {sample['stop_reason']}, "
          f"{found}/{len(ws)} words known)")
    print(text)
    total += len(ws)
    hits += found
score = hits / max(total, 1)
print(f"== {hits} of {total} words are words of the corpus: score {score:.2f} (required {min_score})")
sys.exit(0 if score >= min_score and total >= 50 else 1)
PY
