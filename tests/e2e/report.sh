#!/usr/bin/env bash
# `kilter report` end to end (issue 6): a 4-rank diagnostics run (the MPI test program
# diag_rank_test writes real run directories: rank 2 slow in backward) is reported as text and as
# report.html, which headless Chromium renders: the heatmap has one cell per rank and step, the
# phase bars one bar per rank and component, both line charts and the figures table are drawn,
# and the page loads nothing from the network. A run that died mid-write (no summary.json, a
# half-written CSV row) still gets a report.
source "$(dirname "$0")/lib.sh"
RANK_TEST=$(dirname "$KILTER")/diag_rank_test
[ -x "$RANK_TEST" ] || fail "$RANK_TEST not built (make diag_rank_test)"

mkdir runs
OMPI_MCA_mpi_yield_when_idle=1 timeout 300 "${MPIRUN[@]}" -np 4 "$RANK_TEST" "$WORK/runs" > rank_test.log 2>&1 \
  || { cat rank_test.log; fail "diag_rank_test failed"; }
RUN=runs/slow-backward

"$KILTER" report "$RUN" > report.txt || { cat report.txt; fail "kilter report failed"; }
cat report.txt
grep -q "straggler: rank 2, .*slowest phase backward" report.txt || fail "text report does not name rank 2 / backward"
grep -q "padding_efficiency 0.9" report.txt || fail "text report lacks the plan statistics"
[ "$(grep -cE '^ +[0-3] +[0-9.]+ ' report.txt)" -eq 4 ] || fail "per-rank phase table should have 4 rows"
[ -s "$RUN/report.html" ] || fail "no $RUN/report.html"

# Self-contained: no external scripts, styles or images.
if grep -qiE '(src|href)=["'"'"']?(https?:)?//' "$RUN/report.html"; then fail "report.html references the network"; fi

render() {  # render HTML OUT: the DOM after the page's scripts ran
  timeout 120 chromium --headless --no-sandbox --disable-gpu --virtual-time-budget=5000 \
    --dump-dom "file://$WORK/$1" > "$2" 2> chromium.log || { tail chromium.log; fail "chromium failed on $1"; }
}
render "$RUN/report.html" dom.html
grep -q 'data-charts-rendered="5"' dom.html || fail "not all 5 charts rendered (script error?)"
cells=$(grep -o 'class="cell"' dom.html | wc -l)
bars=$(grep -o 'class="bar"' dom.html | wc -l)
series=$(grep -o 'class="series"' dom.html | wc -l)
steps=$("$PY" -c "import json,sys; print(json.load(open('$RUN/summary.json'))['steps'])")
echo "heatmap cells $cells, phase bars $bars, line series $series, steps $steps"
[ "$cells" -eq $((4 * steps)) ] || fail "heatmap: $cells cells, expected 4 x $steps"
[ "$bars" -eq $((4 * 11)) ] || fail "phase bars: $bars, expected 4 ranks x 11 components (9 phases, other, outside)"
[ "$series" -eq 2 ] || fail "expected the loss and tokens/s lines"
grep -q 'id="heatmap-svg"' dom.html && grep -q 'id="phases-svg"' dom.html || fail "chart SVGs missing"
grep -q 'Straggler: <b>rank 2</b>' dom.html || fail "verdict missing from the page"

timeout 120 chromium --headless --no-sandbox --disable-gpu --virtual-time-budget=5000 --window-size=1200,2400 \
  --screenshot="$WORK/shot.png" "file://$WORK/$RUN/report.html" > /dev/null 2>&1 || fail "screenshot failed"
[ "$(stat -c %s shot.png)" -gt 20000 ] || fail "screenshot suspiciously small"

# The balanced run names nobody.
"$KILTER" report runs/balanced > balanced.txt
grep -q "straggler: none beyond noise" balanced.txt || { cat balanced.txt; fail "balanced run named a straggler"; }

# A run that died: no summary.json and a half-written last row on rank 1.
cp -r runs/inject crashed
rm crashed/summary.json
printf '24,4096,4.7,0.0001' >> crashed/metrics/rank-00001.csv
"$KILTER" report crashed > crashed.txt || { cat crashed.txt; fail "report of a crashed run failed"; }
grep -q "no summary.json" crashed.txt || fail "crashed run: no note about the missing summary"
grep -q "straggler: rank 1, .*slowest phase forward" crashed.txt || { cat crashed.txt; fail "crashed run: rank 1 not named"; }
render crashed/report.html crashed_dom.html
grep -q 'data-charts-rendered="4"\|data-charts-rendered="5"' crashed_dom.html || fail "crashed run: charts not rendered"

# A missing run directory is an error naming it.
if "$KILTER" report nowhere > missing.txt 2>&1; then fail "report of a missing directory succeeded"; fi
grep -q "nowhere" missing.txt || fail "error does not name the directory"
echo "PASS"
