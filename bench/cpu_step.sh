#!/usr/bin/env bash
# CPU training-step benchmark (issues 2, 16): kilter's CPU step in fp32 and bf16 next to the same
# model in PyTorch CPU fp32 and with torch.cpu.amp.autocast(bfloat16), same machine, same run, same
# threads. For each configuration and thread count it runs the four alternately REPEATS times and
# prints tokens/s of each (best of the repeats' median steps), the kilter/torch ratio per precision
# (issue-16 target for bf16: >= 1.5x), and kilter's in-step GEMM rate next to the rate of the same
# GEMM shapes run standalone in the same process (target: >= 75%).
#
# usage: bench/cpu_step.sh [BUILD_DIR]          (default: build; needs target kilter_bench_step)
# env:   THREADS="1"       thread counts to run (e.g. "1 2"); oneDNN and torch get the same
#        CONFIGS="small llama gpt2-124m"   (llama: model.arch = llama at small's size)
#        REPEATS=2 STEPS=3  GPT2_ROWS=1 (rows of T=1024 for the 124M shape)
#        PYTHON=/usr/bin/python3
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
bench=$build/kilter_bench_step
python=${PYTHON:-/usr/bin/python3}
threads_list=${THREADS:-1}
configs=${CONFIGS:-small llama gpt2-124m}
repeats=${REPEATS:-2}
steps=${STEPS:-3}
gpt2_rows=${GPT2_ROWS:-1}
[[ -x $bench ]] || { echo "cpu_step: $bench not found (cmake --build $build --target kilter_bench_step)" >&2; exit 1; }
"$python" -c "import torch" 2>/dev/null || { echo "cpu_step: $python has no torch (apt-get install python3-torch)" >&2; exit 1; }

shape_args() {
  case $1 in
    small) echo "--layers=4 --embd=256 --heads=4 --vocab=8192 --B=8 --T=256" ;;
    gpt2-124m) echo "--layers=12 --embd=768 --heads=12 --vocab=50257 --B=$gpt2_rows --T=1024" ;;
    # The llama twin of small: the same width, depth, heads and tokens; 2 K/V heads, SwiGLU 704
    # (8/3 x 256 rounded up to 64: about the 4C MLP's FLOPs), untied head.
    llama) echo "--arch=llama --layers=4 --embd=256 --heads=4 --kv-heads=2 --ffn=704 --vocab=8192 --B=8 --T=256" ;;
    *) echo "cpu_step: unknown config $1 (small | gpt2-124m | llama)" >&2; exit 1 ;;
  esac
}

results=$(mktemp /tmp/kilter-cpu-step.XXXXXX)
trap 'rm -f "$results"' EXIT
echo "# cpu_step: $(date -u +%FT%TZ) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
status=0
for config in $configs; do
  args=$(shape_args "$config")
  for threads in $threads_list; do
    for ((r = 0; r < repeats; ++r)); do
      for precision in fp32 bf16; do
        for impl in kilter torch; do
          if [[ $impl == kilter ]]; then
            line=$(OMP_NUM_THREADS=$threads "$bench" $args --threads="$threads" --steps="$steps" --precision=$precision) || status=1
          else
            line=$(OMP_NUM_THREADS=$threads "$python" "$here/torch_step.py" $args \
                     --threads="$threads" --steps="$steps" --precision=$precision) || status=1
          fi
          echo "$line" >&2
          echo "$config $threads $impl $precision $line" >> "$results"
        done
      done
    done
  done
done
"$python" - "$results" <<'PY' || status=1
import json, sys
best = {}
for line in open(sys.argv[1]):
    config, threads, impl, precision, js = line.split(" ", 4)
    r = json.loads(js)
    if r["check"] != "ok":
        print(f"cpu_step: result check failed: {line.strip()}", file=sys.stderr)
        sys.exit(1)
    key = (config, threads, impl, precision)
    if key not in best or r["tokens_per_s"] > best[key]["tokens_per_s"]:
        best[key] = r
print(f"{'config':10s} {'thr':>3s} {'kilter fp32':>11s} {'torch fp32':>10s} {'ratio':>6s} {'kilter bf16':>11s} "
      f"{'torch bf16':>10s} {'ratio':>6s}  {'GEMM GF/s in step / standalone (fraction)':s}")
for (config, threads) in dict.fromkeys((k[0], k[1]) for k in best):
    g = lambda impl, p: best[(config, threads, impl, p)]
    kf, tf, kb, tb = g("kilter", "fp32"), g("torch", "fp32"), g("kilter", "bf16"), g("torch", "bf16")
    gemm = "  ".join(f"{p} {r['gemm_gflops']:.0f}/{r['standalone_gflops']:.0f} ({r['gemm_vs_standalone']:.2f})"
                     for p, r in (("fp32", kf), ("bf16", kb)))
    print(f"{config:10s} {threads:>3s} {kf['tokens_per_s']:11.0f} {tf['tokens_per_s']:10.0f} "
          f"{kf['tokens_per_s'] / tf['tokens_per_s']:5.2f}x {kb['tokens_per_s']:11.0f} {tb['tokens_per_s']:10.0f} "
          f"{kb['tokens_per_s'] / tb['tokens_per_s']:5.2f}x  {gemm}")
engine = next(r["engine"] for k, r in best.items() if k[2] == "kilter")
print(f"(tokens/s: best of the repeats' median steps; kilter GEMMs: {engine}; GEMM share of kilter's step: "
      + ", ".join(f"{k[0]} {k[3]} {r['gemm_fraction_of_step']:.2f}" for k, r in best.items() if k[2] == "kilter") + ")")
PY
exit $status
