#!/usr/bin/env bash
# CPU training-step benchmark (issue 2): kilter's CPU step next to the same model in PyTorch CPU,
# same machine, same run, same threads. For each configuration and thread count it runs
# kilter_bench_step and bench/torch_step.py alternately REPEATS times and prints tokens/s of each
# (best of the repeats' median steps), the ratio of the bests, the ratio of each back-to-back
# pair (the spread shows how much a busy machine moved the figures), and kilter's in-step GEMM
# rate next to a plain SGEMM rate measured in the same process.
#
# usage: bench/cpu_step.sh [BUILD_DIR]          (default: build; needs target kilter_bench_step)
# env:   THREADS="1"       thread counts to run (e.g. "1 2"); OpenBLAS and torch get the same
#        CONFIGS="small gpt2-124m"
#        REPEATS=2 STEPS=3  GPT2_ROWS=1 (rows of T=1024 for the 124M shape)
#        PYTHON=/usr/bin/python3
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
bench=$build/kilter_bench_step
python=${PYTHON:-/usr/bin/python3}
threads_list=${THREADS:-1}
configs=${CONFIGS:-small gpt2-124m}
repeats=${REPEATS:-2}
steps=${STEPS:-3}
gpt2_rows=${GPT2_ROWS:-1}
[[ -x $bench ]] || { echo "cpu_step: $bench not found (cmake --build $build --target kilter_bench_step)" >&2; exit 1; }
"$python" -c "import torch" 2>/dev/null || { echo "cpu_step: $python has no torch (apt-get install python3-torch)" >&2; exit 1; }

shape_args() {
  case $1 in
    small) echo "--layers=4 --embd=256 --heads=4 --vocab=8192 --B=8 --T=256" ;;
    gpt2-124m) echo "--layers=12 --embd=768 --heads=12 --vocab=50257 --B=$gpt2_rows --T=1024" ;;
    *) echo "cpu_step: unknown config $1 (small | gpt2-124m)" >&2; exit 1 ;;
  esac
}

json_field() { "$python" -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }

echo "# cpu_step: $(date -u +%FT%TZ) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
printf "%-10s %7s %12s %12s %7s %11s %11s %8s  %s\n" config threads kilter_tok/s torch_tok/s ratio gemm_GF/s plain_GF/s gemm_frac pair_ratios
status=0
for config in $configs; do
  args=$(shape_args "$config")
  for threads in $threads_list; do
    best_k=0 best_t=0 gemm=0 plain=0 frac=0 pairs=""
    for ((r = 0; r < repeats; ++r)); do
      k=$(OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads "$bench" $args --threads="$threads" --steps="$steps") || status=1
      t=$(OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads "$python" "$here/torch_step.py" $args --threads="$threads" --steps="$steps") || status=1
      echo "$k" >&2
      echo "$t" >&2
      [[ $(json_field "$k" check) == ok && $(json_field "$t" check) == ok ]] || { echo "cpu_step: result check failed" >&2; status=1; }
      kt=$(json_field "$k" tokens_per_s)
      tt=$(json_field "$t" tokens_per_s)
      pairs="$pairs $("$python" -c "import sys; print('%.2f' % (float(sys.argv[1]) / float(sys.argv[2])))" "$kt" "$tt")"
      if "$python" -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$kt" "$best_k"; then
        best_k=$kt gemm=$(json_field "$k" gemm_gflops) plain=$(json_field "$k" plain_sgemm_gflops) frac=$(json_field "$k" gemm_fraction_of_step)
      fi
      "$python" -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$tt" "$best_t" && best_t=$tt
    done
    ratio=$("$python" -c "import sys; print('%.2f' % (float(sys.argv[1]) / float(sys.argv[2])))" "$best_k" "$best_t")
    printf "%-10s %7s %12s %12s %7s %11s %11s %8s %s\n" "$config" "$threads" "$best_k" "$best_t" "$ratio" "$gemm" "$plain" "$frac" "$pairs"
  done
done
exit $status
