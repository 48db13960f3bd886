#!/usr/bin/env bash
# `kilter report --compare` end to end (issue 25): two short training runs (another learning rate,
# another sampler) with evaluation are compared on one self-contained page, which headless
# Chromium renders: both charts are drawn, the loss chart has a train and an eval curve per run
# with one point per train.csv row, the tokens/s chart one curve per run with one point per step,
# and the table has a column per run. The single-run report.html gets its train/eval chart too.
# Skipped (exit 77) where chromium is not installed.
source "$(dirname "$0")/lib.sh"
command -v chromium > /dev/null || { echo "SKIP: chromium not installed (scripts/install-deps.sh --with-test-extras)"; exit 77; }

"$KILTER" prep synth --docs 80 --lengths lognormal:4,0.9,300 --vocab 97 --shards 2 --seed 7 --out data --quiet >/dev/null
COMMON=(--data.dir=data --model.n_layer=1 --model.n_head=2 --model.n_embd=16 --model.block_size=64
        --data.max_tokens=256 --train.tokens_per_step=1024 --train.steps=8 --output.trace_steps=0
        --output.log_every=2 --data.eval_fraction=0.1 --train.eval_every=4 --comm.timeout_s=60)
train a.log 2 --output.dir=runs/a
train b.log 2 --output.dir=runs/b --train.lr=0.001 --data.sampler=naive

"$KILTER" report --compare runs/a runs/b --html cmp.html > cmp.txt || { cat cmp.txt; fail "report --compare failed"; }
cat cmp.txt
grep -q "^padding_efficiency" cmp.txt || fail "no padding_efficiency row in the text comparison"
[ -s cmp.html ] || fail "no cmp.html"
if grep -qiE '(src|href)=["'"'"']?(https?:)?//' cmp.html; then fail "cmp.html references the network"; fi

render() {  # render HTML OUT: the DOM after the page's scripts ran
  timeout 60 chromium --headless --no-sandbox --disable-gpu --virtual-time-budget=5000 \
    --dump-dom "file://$WORK/$1" > "$2" 2> chromium.log || { tail chromium.log; fail "chromium failed on $1"; }
}
render cmp.html dom.html
grep -q 'data-charts-rendered="2"' dom.html || fail "not both charts rendered (script error?)"
"$PY" - dom.html runs/a/metrics/train.csv runs/b/metrics/train.csv <<'PY'
import csv, re, sys
dom = open(sys.argv[1]).read()
curves = re.findall(r'<polyline[^>]*class="curve"[^>]*>', dom)
points = [int(re.search(r'data-points="(\d+)"', c).group(1)) for c in curves]
rows = [list(csv.DictReader(open(p))) for p in sys.argv[2:]]
train = [len(r) for r in rows]
evals = [sum(1 for x in r if x["eval_loss"]) for r in rows]
# loss chart: a train, b train... in page order: a train, a eval, b train, b eval; then tps a, b.
assert points[:4] == [train[0], evals[0], train[1], evals[1]], (points, train, evals)
assert points[4:] == [8, 8], points
assert all(p > 0 for p in points)
for run in ("runs/a", "runs/b"):
    assert f"<th>{run}</th>" in dom, run
print("compare page: curves with", points, "points")
PY

# The single-run report: its train/eval chart is drawn as well.
"$KILTER" report runs/a > a_report.txt || { cat a_report.txt; fail "kilter report runs/a failed"; }
render runs/a/report.html a_dom.html
grep -q 'data-charts-rendered="6"' a_dom.html || fail "report.html: the train/eval chart is not drawn"
[ "$(grep -o 'class="curve"' a_dom.html | wc -l)" -eq 2 ] || fail "report.html: expected a train and an eval curve"
echo PASS
