#!/usr/bin/env bash
# slurm/train.sbatch reads data.dir and train.threads from the run's INI file with its own awk
# reader (ini_value), before kilter runs. It must read every key as kilter does: here every key of
# every shipped inputs/*.ini, plus a file of inline comments and odd spacing, is read both ways
# (kilter train --print-config is kilter's reading) and compared, numbers as numbers.
source "$(dirname "$0")/lib.sh"

sed -n '/^ini_value() {/,/^}/p' "$SRC/slurm/train.sbatch" > ini_value.sh
[ -s ini_value.sh ] || fail "no ini_value() in slurm/train.sbatch"
source ini_value.sh

printf '%s\n' '# a file written the way people write them' '[data]' 'dir = /lustre/x/data   # lustre, not NVMe' \
  '  max_tokens=4096#no space' '' '[train]' $'lr = 6e-4\t# a tab, then a comment' '   # an indented comment' \
  'steps = 10 # ten' > comments.ini

checked=0
for ini in "$SRC"/inputs/*.ini comments.ini; do
  "$KILTER" train --config "$ini" --print-config > kilter.ini 2> err.log || { cat err.log; fail "kilter cannot read $ini"; }
  section=""
  in_file=0
  while IFS= read -r line; do
    if [[ $line =~ ^\[(.*)\]$ ]]; then section=${BASH_REMATCH[1]}; continue; fi
    [[ $line == *=* ]] || continue
    key=${line%% = *}
    want=${line#* = }
    got=$(ini_value "$ini" "$section" "$key")
    # A key the file does not set: the reader says "" and kilter uses its default. That every key
    # the file sets is found is checked by counting below.
    [ -n "$got" ] || continue
    in_file=$((in_file + 1))
    "$PY" -c '
import sys
a, b = sys.argv[1], sys.argv[2]
try:
    same = float(a) == float(b)
except ValueError:
    same = a == b or {a, b} <= {"0", "false"} or {a, b} <= {"1", "true"}
sys.exit(0 if same else 1)' "$got" "$want" || fail "$(basename "$ini"): [$section] $key: train.sbatch reads '$got', kilter '$want'"
    checked=$((checked + 1))
  done < kilter.ini
  set_lines=$(sed 's/#.*//' "$ini" | grep -c '=' || true)
  [ "$in_file" -eq "$set_lines" ] || fail "$(basename "$ini"): the reader found $in_file of the $set_lines keys it sets"
done
[ "$(ini_value comments.ini data dir)" = "/lustre/x/data" ] || fail "inline comment kept: '$(ini_value comments.ini data dir)'"
[ $checked -ge 20 ] || fail "only $checked keys compared"
echo "PASS: $checked keys of $(ls "$SRC"/inputs/*.ini | wc -l) shipped INI files + comments.ini read alike"
