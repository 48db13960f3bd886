#!/usr/bin/env bash
# The GPU machine's check for the CUDA backend, within 8 minutes of device time (an H100 80 GB or
# an H200; every run fits 80 GB):
#   1. binaries: prebuilt ones in $KILTER_GPU_CARRY (default build-gpu-carry/: stripped, the
#      binaries and libkilter_gpu_core.so with OpenBLAS inside, made on a build machine by
#      `tests/gpu/device-check.sh --build-only` and brought along), else a fresh standalone build
#      in build-gpu-standalone/ (tests/gpu/standalone: needs nvcc, cmake and OpenBLAS only);
#   2. kilter_gpu_ops_test and kilter_gpu_bf16_ops_test (every kernel vs its CPU twin: the fp32
#      ones, the Llama family's, the bf16-storage datapath's), kilter_gpu_model_test (a full
#      training step and short runs, GPU vs CPU, fp32 and bf16 GEMM math; the memory plan against
#      the device), kilter_gpu_bf16_model_test (the bf16-storage datapath against its CPU oracle,
#      GPT-2 and Llama; train.bf16_storage=auto's self-check), kilter_gpu_cut_test (pieces cut
#      between ranks vs the uncut pieces) and kilter_gpu_sdpa_test (the cuDNN SDPA engine vs the
#      CPU packed attention; built where the cudnn-frontend headers were: "not built" otherwise);
#      then kilter_gpu_loss_curve: 200 bf16 steps against fp32 on a real text, within 1% at the end;
#   3. bench/gpu_step.sh: kilter's tokens/s, MFU and device GiB, the small config and GPT-2 124M in
#      fp32 and bf16, the old datapath (fp32 activations) against the new (bf16 storage), memory
#      rows, Llama rows;
#   4. the PyTorch peer on the same GPU (bench/torch_gpu_step.py: GPT-2 124M, bf16 autocast with
#      flash attention and fused AdamW, eager and torch.compile; fp32; the small config compiled),
#      where python3 has torch;
#   5. a table last: every kilter row with tokens/s, MFU, device GiB and its ratio to
#      torch.compile on the same shape. Exit 0 only when every test and check passed.
# With $OUT set (the device tool), the whole log also goes to $OUT/device-check.log.
# --profile adds, last, the GPU time per kernel of one GPT-2 124M bf16-storage step (Nsight Compute, one
# metric per kernel: gpu__time_duration), grouped by kernel, to find where the step's time goes.
# --tests-only runs the tests and stops.
# --nccl runs, instead of all this, kilter's NCCL paths on 1, 2 and 4 ranks of this one GPU
# against CPU/MPI runs, and two fault drills (tests/gpu/nccl-check.sh, at most 8 minutes; its
# runtime travels in build-nccl-carry/, which `--build-only --nccl` makes on a build machine).
# usage: tests/gpu/device-check.sh [--build-only] [--quick] [--profile] [--tests-only] [--nccl]
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
for arg in "$@"; do
  [[ $arg == --nccl ]] || continue
  if [[ " $* " == *" --build-only "* ]]; then exec "$root/tests/gpu/nccl-check.sh" --build-only; fi
  if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then exec > >(tee "$OUT/device-check.log") 2>&1; fi
  "$root/tests/gpu/nccl-check.sh"
  exit $?
done
build=${KILTER_GPU_BUILD:-$root/build-gpu-standalone}
carry=${KILTER_GPU_CARRY:-$root/build-gpu-carry}
# The carried binaries open cuBLASLt when the first GEMM engine is made (cublaslt_loader.h) and
# link cuDNN's small front library: the toolkit's first; the copy of libcudnn.so.9 carried in
# $carry/lib only when the machine has no cuDNN (its sub-libraries are too large to carry: the
# cuDNN tests then report cuDNN unusable and the model falls back to cuBLASLt attention).
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}:$carry/lib
# A GPU image may hold cuDNN (or cuBLAS) only inside Python wheels (nvidia-cudnn-cu13, ...): their
# folders go ahead of the carried front library, so cuDNN finds its sub-libraries.
for lib in libcudnn.so.9 libcublasLt.so.13; do
  ldconfig -p 2>/dev/null | grep -q "$lib" && continue
  [[ -e /usr/local/cuda/lib64/$lib ]] && continue
  found=$(find /opt /usr/local/lib /usr/lib/python3 -path '*nvidia*' -name "$lib" 2>/dev/null | head -1)
  [[ -n "$found" ]] && export LD_LIBRARY_PATH=$(dirname "$found"):$LD_LIBRARY_PATH
done
build_only=0 quick="" profile=0 tests_only=0
for arg in "$@"; do
  case "$arg" in
    --build-only) build_only=1 ;;
    --quick) quick=--quick ;;
    --profile) profile=1 ;;
    --tests-only) tests_only=1 ;;
    *) echo "usage: $0 [--build-only] [--quick] [--profile] [--tests-only] [--nccl]" >&2; exit 2 ;;
  esac
done
start=$SECONDS
say() { echo "== [$((SECONDS - start))s] $*"; }

build_standalone() {
  local generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  local static=OFF
  [[ $build_only -eq 1 ]] && static=ON   # binaries meant to travel carry their BLAS
  say "building $build (KILTER_STATIC_BLAS=$static)"
  mkdir -p "$build"
  cmake -S "$root/tests/gpu/standalone" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DKILTER_STATIC_BLAS=$static >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
  cmake --build "$build" -j "$(nproc)" 2>&1 | tail -3
  [[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "device-check: build failed" >&2; exit 1; }
}

binaries=(kilter_gpu_ops_test kilter_gpu_bf16_ops_test kilter_gpu_model_test kilter_gpu_bf16_model_test
          kilter_gpu_cut_test kilter_gpu_sdpa_test kilter_bench_gpu_step kilter_gpu_loss_curve)
tests=(ops bf16_ops model bf16_model cut sdpa)
if [[ $build_only -eq 1 ]]; then
  build_standalone
  mkdir -p "$carry"
  for b in "${binaries[@]}" libkilter_gpu_core.so; do
    [[ -e "$build/$b" ]] && strip -o "$carry/$b" "$build/$b"
  done
  mkdir -p "$carry/lib"
  cudnn_front=$(ldd "$carry/kilter_gpu_ops_test" | awk '/libcudnn\.so/ {print $3}')
  [[ -n "$cudnn_front" ]] && cp -L "$cudnn_front" "$carry/lib/"
  say "portable binaries in $carry ($(du -sh "$carry" | cut -f1)); they need from the system:"
  ldd "$carry/kilter_gpu_ops_test" | awk '{print "  " $1}'
  exit 0
fi

if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then exec > >(tee "$OUT/device-check.log") 2>&1; fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [[ -x "$carry/kilter_gpu_ops_test" ]] && ! ldd "$carry/kilter_gpu_ops_test" | grep -q "not found"; then
  say "using prebuilt binaries in $carry"
  build=$carry
else
  [[ -x "$carry/kilter_gpu_ops_test" ]] && { ldd "$carry/kilter_gpu_ops_test" | grep "not found"; say "prebuilt binaries miss libraries here"; }
  build_standalone
fi
ldd "$build/kilter_gpu_ops_test" | grep -E "cudnn|cublasLt|cudart" | sed 's/^/  /'

declare -A result
for t in "${tests[@]}"; do
  if [[ ! -x "$build/kilter_gpu_${t}_test" ]]; then result[$t]="not built"; say "kilter_gpu_${t}_test: not built"; continue; fi
  say "kilter_gpu_${t}_test"
  timeout "${KILTER_GPU_TEST_TIMEOUT:-150}" "$build/kilter_gpu_${t}_test"
  rc=$?
  case $rc in 0) result[$t]=pass ;; 77) result[$t]=skipped ;; *) result[$t]="FAIL(rc=$rc)" ;; esac
done
# The loss curve: 200 steps of the GPT-2 124M shape (byte vocabulary) on the docs' English text,
# bf16 (storage, SDPA where it passes its self-check) against fp32 from the same weights: the
# final loss within 1%.
if [[ -x "$build/kilter_gpu_loss_curve" ]]; then
  say "loss curve: bf16 against fp32, GPT-2 124M shape, the docs' text"
  timeout "${KILTER_LOSS_CURVE_TIMEOUT:-240}" "$build/kilter_gpu_loss_curve" --steps "$([[ -n $quick ]] && echo 60 || echo 200)" \
    "$root/README.md" "$root"/docs/*.md
  rc=$?
  case $rc in 0) result[loss_curve]=pass ;; 77) result[loss_curve]=skipped ;; *) result[loss_curve]="FAIL(rc=$rc)" ;; esac
else
  result[loss_curve]="not built"
fi
test_line() {
  for t in "${tests[@]}"; do printf 'gpu_%s_test: %s   ' "$t" "${result[$t]}"; done
  printf 'loss_curve: %s   ' "${result[loss_curve]}"
}

if [[ $tests_only -eq 1 ]]; then
  echo "$(test_line)"
  for v in "${result[@]}"; do [[ "$v" == pass || "$v" == "not built" ]] || exit 1; done
  exit 0
fi

say "benchmark: kilter"
bench_out=$(KILTER_GPU_BENCH_TIMEOUT=${KILTER_GPU_BENCH_TIMEOUT:-90} "$root/bench/gpu_step.sh" "$build/kilter_bench_gpu_step" $quick 2>&1)
bench_rc=$?
echo "$bench_out" | sed '/^config /,$d'
case $bench_rc in 0) result[bench]=pass ;; 77) result[bench]=skipped ;; *) result[bench]="FAIL(rc=$bench_rc)" ;; esac

# The peer: PyTorch on the same GPU and shapes (GPT-2 124M, B 16, T 1024; the small config).
peer_rows=()
small_shape=(--layers 4 --embd 256 --heads 4 --vocab 8192 --B 32 --T 256)
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  for spec in "gpt2-124m bf16 eager" "gpt2-124m bf16 compile" "gpt2-124m fp32 eager" "small bf16 compile"; do
    set -- $spec
    say "benchmark: PyTorch $1 $2 $3"
    flag=(); [[ $3 == compile ]] && flag=(--compile)
    [[ $1 == small ]] && flag+=("${small_shape[@]}")
    line=$(timeout "${KILTER_TORCH_TIMEOUT:-180}" python3 "$root/bench/torch_gpu_step.py" --precision "$2" "${flag[@]}" \
           --steps "$([[ -n $quick ]] && echo 4 || echo 10)" 2>&1 | tail -1)
    echo "  $line"
    peer_rows+=("$1 $2 $3 $(sed -n 's/.*"tokens_per_s": \([0-9.]*\).*"check": "\([^"]*\)".*/\1 \2/p' <<<"$line")")
  done
else
  say "no PyTorch with CUDA here: the peer is not measured"
fi

echo
say "summary"
echo "$(test_line)  kilter benchmark checks: ${result[bench]}"
if [[ ${#peer_rows[@]} -gt 0 ]]; then
  echo
  printf '%-28s %12s\n' "PyTorch" tokens/s
  for row in "${peer_rows[@]}"; do set -- $row; printf '%-28s %12s %s\n' "$1 $2 $3" "${4:-n/a}" "${5:-failed}"; done
fi
# The last table: every kilter row (bench/gpu_step.sh's columns) and its tokens/s against
# torch.compile's on the same shape and precision (bf16; fp32 against eager, which is all it ran).
echo
peer_table=$(printf '%s\n' "${peer_rows[@]}")
echo "$bench_out" | sed -n '/^config /,$p' | awk -v peers="$peer_table" '
  BEGIN { n = split(peers, rows, "\n"); for (i = 1; i <= n; ++i) { split(rows[i], f, " ");
          if (f[5] == "ok") { if (f[3] == "compile" || f[2] == "fp32") best[f[1] " " f[2]] = f[4] } } }
  NR == 1 { printf "%s %10s\n", $0, "x torch"; next }
  { key = $1 " " $2; t = best[key]; r = (t > 0 && $11 > 0) ? sprintf("%.2fx", $11 / t) : "-";
    printf "%s %10s\n", $0, r }'
if [[ $profile -eq 1 ]]; then
  echo
  say "profile: GPU time per kernel, one GPT-2 124M bf16-storage step (attention auto: SDPA where it passes)"
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [[ -z "$ncu_bin" ]]; then
    echo "  no ncu here"
  else
    # 2 warm-up steps, then ~one step of kernels (a step launches several hundred).
    csv=${OUT:-/tmp}/profile.csv
    timeout "${KILTER_PROFILE_TIMEOUT:-150}" "$ncu_bin" --csv --metrics gpu__time_duration.sum --launch-skip 1200 \
      --launch-count 900 "$build/kilter_bench_gpu_step" --name p --precision bf16 --bf16-storage on --attention auto --B 16 --T 1024 \
      --n-layer 12 --n-head 12 --n-embd 768 --vocab 50257 --steps 4 --warmup 2 >"$csv" 2>/dev/null
    python3 - "$csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    print("  no profile rows"); sys.exit(0)
head = rows[0]; name, unit, value = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6, "nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}
total = collections.Counter(); count = collections.Counter()
for r in rows[1:]:
    try: us = float(r[value].replace(",", "")) * scale.get(r[unit], 1.0)
    except ValueError: continue
    k = r[name].split("(")[0][:70]; total[k] += us; count[k] += 1
all_us = sum(total.values())
print(f"  {len(rows) - 1} kernels, {all_us / 1e3:.1f} ms of GPU time")
for k, us in total.most_common(25):
    print(f"  {100 * us / all_us:5.1f}%  {us / 1e3:8.2f} ms  x{count[k]:<4d} {k}")
PY
  fi
fi
for v in "${result[@]}"; do [[ "$v" == pass || "$v" == "not built" ]] || exit 1; done
exit 0
