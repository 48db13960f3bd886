#!/usr/bin/env bash
# The GPU machine's check for the CUDA backend, in stages that fit 8 minutes of device time on an
# H100 (80 GB; an H200 is faster). Every step runs under its own time budget (killed at it), and
# each stage prints its verdict table as soon as it ends:
#   A  correctness (target 4 minutes): the library versions this process loaded and from where;
#      kilter_gpu_op_table_test (every kernel against its CPU twin); kilter_gpu_sdpa_test (the cuDNN
#      SDPA engine against the CPU packed attention), then the same test's cut-piece cases under
#      `compute-sanitizer --tool initcheck` (no read of device memory that was never written);
#      kilter_gpu_model_test, kilter_gpu_bf16_model_test, kilter_gpu_cut_test; the bf16 loss curve
#      against fp32's on the docs' text. A cuDNN refusal in the SDPA test is rerun, that one case
#      only, with cuDNN's and cudnn-frontend's own logging on. A failing stage A ends the check.
#   B  speed (target 3 minutes): kilter's tokens/s, MFU and device GiB (bench/gpu_step.sh --core:
#      GPT-2 124M and the small config, fp32 and bf16) against torch.compile on the same shapes,
#      then the table of both with kilter's ratio to torch.compile.
# A test that was not built, skipped (exit 77: no device) or killed at its budget is a failure:
# the check cannot pass by not running something.
#
# Binaries: prebuilt ones in $KILTER_GPU_CARRY (default build-gpu-carry/: stripped, with
# libkilter_gpu_core.so holding OpenBLAS, made on a build machine by --build-only and brought
# along), else a fresh standalone build in build-gpu-standalone/ (tests/gpu/standalone).
# Libraries: the machine's own cuDNN, cuBLAS(Lt) and NCCL first (the CUDA toolkit's folder, the
# ld.so cache, the system folders, Python wheels); the cuDNN front library carried in
# $KILTER_GPU_CARRY/lib only where the machine has no cuDNN at all.
#
# usage: tests/gpu/device-check.sh [--stage A|B] [--quick] [--profile]
#        tests/gpu/device-check.sh --dry-run      the stages, their commands and budgets; exit 1
#                                                 when the plan does not fit 8 minutes
#        tests/gpu/device-check.sh --build-only   build the binaries to carry (refused unless every
#                                                 GPU test, SDPA included, was built)
#        tests/gpu/device-check.sh --verify-built DIR   the build-only gate on a folder
#        tests/gpu/device-check.sh --nccl [--build-only]   the NCCL paths (tests/gpu/nccl-check.sh)
# --tests-only is --stage A. --profile adds, after B and outside the 8 minutes, the GPU time per
# kernel of one GPT-2 124M bf16-storage step (Nsight Compute). With $OUT set (the device tool),
# the whole log goes to $OUT/device-check.log and each step's log to $OUT/device-check-logs/.
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
plan_limit=480  # seconds: 8 minutes on an H100

usage() {
  echo "usage: $0 [--stage A|B] [--quick] [--profile] | --dry-run | --build-only | --verify-built DIR | --nccl" >&2
  exit 2
}
mode=check stage_only="" quick="" profile=0 verify_dir=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-only) mode=build ;;
    --dry-run) mode=dry ;;
    --verify-built) mode=verify; verify_dir=${2:-}; [[ -n $verify_dir ]] || usage; shift ;;
    --stage) stage_only=${2:-}; [[ $stage_only == A || $stage_only == B ]] || usage; shift ;;
    --tests-only) stage_only=A ;;
    --quick) quick=--quick ;;
    --profile) profile=1 ;;
    *) usage ;;
  esac
  shift
done

# Every binary the check runs. The build-only gate refuses a build that lacks any of them.
gpu_tests=(kilter_gpu_op_table_test kilter_gpu_sdpa_test kilter_gpu_model_test kilter_gpu_bf16_model_test
           kilter_gpu_cut_test)
gpu_tools=(kilter_gpu_versions kilter_gpu_loss_curve kilter_bench_gpu_step)

start=$SECONDS
say() { echo "== [$((SECONDS - start))s] $*"; }

# ---- the plan: stage, name, budget (s), command (a bash line; $bin is the binaries' folder) ----
plan_stage=() plan_name=() plan_budget=() plan_cmd=() plan_when=()
add_step() { plan_stage+=("$1"); plan_name+=("$2"); plan_budget+=("$3"); plan_cmd+=("$4"); plan_when+=("${5:-always}"); }
# cuDNN 9's logging (CUDNN_LOGLEVEL_DBG: 1 errors, 2 and warnings; the CUDNN_LOG*_DBG names are
# its deprecated spellings, still read during 9.x) and cudnn-frontend's (CUDNN_FRONTEND_LOG_*).
cudnn_logging="CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGERR_DBG=1 CUDNN_LOGWARN_DBG=1 CUDNN_LOGDEST_DBG=stderr CUDNN_FRONTEND_LOG_INFO=1 CUDNN_FRONTEND_LOG_FILE=stderr"
curve_steps=200 torch_steps=10
[[ -n $quick ]] && curve_steps=60 torch_steps=4
small_shape="--layers 4 --embd 256 --heads 4 --vocab 8192 --B 32 --T 256"
torch_step="python3 \$root/bench/torch_gpu_step.py --compile --steps $torch_steps"
add_step A versions 10 "\$bin/kilter_gpu_versions"
add_step A op_table 30 "\$bin/kilter_gpu_op_table_test"
add_step A sdpa 35 "\$bin/kilter_gpu_sdpa_test"
add_step A sdpa_refusal_log 20 "$cudnn_logging \$bin/kilter_gpu_sdpa_test --case \"<the refused case>\"" "after a cuDNN refusal"
add_step A sdpa_initcheck 40 "\$sanitizer --tool initcheck --error-exitcode 3 --print-limit 20 \$bin/kilter_gpu_sdpa_test --case ', cut'"
add_step A model 35 "\$bin/kilter_gpu_model_test"
add_step A bf16_model 30 "\$bin/kilter_gpu_bf16_model_test"
add_step A cut 15 "\$bin/kilter_gpu_cut_test"
add_step A loss_curve 45 "\$bin/kilter_gpu_loss_curve --steps $curve_steps \$root/README.md \$root/docs/*.md"
add_step B kilter_bench 50 "KILTER_GPU_BENCH_TIMEOUT=20 \$root/bench/gpu_step.sh \$bin/kilter_bench_gpu_step --core $quick"
add_step B torch_gpt2_bf16 55 "$torch_step --precision bf16"
add_step B torch_gpt2_fp32 45 "$torch_step --precision fp32"
add_step B torch_small_bf16 15 "$torch_step --precision bf16 $small_shape"
add_step B torch_small_fp32 15 "$torch_step --precision fp32 $small_shape"

stage_title() { [[ $1 == A ]] && echo "correctness (a failure ends the check)" || echo "speed: kilter against torch.compile"; }
stage_target() { [[ $1 == A ]] && echo 240 || echo 180; }
stage_budget() {  # stage_budget STAGE [always]: every step's budget, or only the unconditional ones'
  local sum=0 i
  for i in "${!plan_stage[@]}"; do
    [[ ${plan_stage[$i]} == "$1" ]] || continue
    [[ ${2:-} == always && ${plan_when[$i]} != always ]] && continue
    sum=$((sum + plan_budget[i]))
  done
  echo $sum
}

if [[ $mode == dry ]]; then
  echo "device-check plan: each step is killed at its budget (seconds on an H100)"
  total=0 fits=1
  for s in A B; do
    budget=$(stage_budget $s) base=$(stage_budget $s always)
    total=$((total + budget))
    echo
    extra=""
    [[ $budget -ne $base ]] && extra=" (+$((budget - base)) s for steps that run only when needed)"
    echo "stage $s: $(stage_title $s); budget $base s$extra, target $(stage_target $s) s"
    for i in "${!plan_stage[@]}"; do
      [[ ${plan_stage[$i]} == "$s" ]] || continue
      when=""
      [[ ${plan_when[$i]} != always ]] && when=" [only ${plan_when[$i]}]"
      printf '  %-18s %4d s  %s%s\n' "${plan_name[$i]}" "${plan_budget[$i]}" "${plan_cmd[$i]}" "$when"
    done
    [[ $base -le $(stage_target $s) ]] || fits=0
  done
  echo
  [[ $total -le $plan_limit ]] || fits=0
  echo "total: $total s at most of $plan_limit s (8 minutes on an H100, machine start not included): $([[ $fits -eq 1 ]] && echo fits || echo "DOES NOT FIT")"
  [[ $profile -eq 1 ]] && echo "--profile: one more step after B, outside the plan, budget ${KILTER_PROFILE_TIMEOUT:-150} s"
  [[ $fits -eq 1 ]]
  exit $?
fi

# ---- the build-only gate: every GPU test and tool of the plan, SDPA included, was built --------
verify_built() {
  local dir=$1 missing=0 b
  for b in "${gpu_tests[@]}" "${gpu_tools[@]}"; do
    if [[ -x "$dir/$b" ]]; then
      printf '  %-30s built\n' "$b"
    else
      printf '  %-30s NOT BUILT\n' "$b"
      missing=$((missing + 1))
    fi
  done
  if [[ $missing -gt 0 ]]; then
    echo "device-check: $missing of the check's binaries were not built in $dir; a binary that is not built is a" \
         "failure (the SDPA test needs the cudnn-frontend headers: scripts/install-deps.sh, or" \
         "CUDNN_FRONTEND_INCLUDE_DIR=...)" >&2
    return 1
  fi
}
if [[ $mode == verify ]]; then
  verify_built "$verify_dir"
  exit $?
fi

build_standalone() {
  local generator=() static=OFF gate=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  if [[ $mode == build ]]; then
    static=ON   # binaries meant to travel carry their BLAS
    # Binaries meant for a device run must hold cuDNN attention and its SDPA engine: configuring
    # fails, before anything is compiled, where cuDNN or the cudnn-frontend headers are missing.
    gate=(-DENABLE_CUDNN=ON -DENABLE_SDPA=ON)
    [[ -n "${CUDNN_FRONTEND_INCLUDE_DIR:-}" ]] && gate+=(-DCUDNN_FRONTEND_INCLUDE_DIR="$CUDNN_FRONTEND_INCLUDE_DIR")
  fi
  say "building $build (KILTER_STATIC_BLAS=$static ${gate[*]})"
  mkdir -p "$build"
  if ! cmake -S "$root/tests/gpu/standalone" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DKILTER_STATIC_BLAS=$static "${gate[@]}" >"$build/configure.log" 2>&1; then
    grep -E "CMake Error|ENABLE_|cudnn|not found" "$build/configure.log" | head -20 >&2
    echo "device-check: configuring $build failed (log: $build/configure.log)$([[ $mode == build ]] &&
          echo "; --build-only needs nvcc, OpenBLAS, cuDNN and the cudnn-frontend headers (scripts/install-deps.sh)")" >&2
    exit 1
  fi
  cmake --build "$build" -j "$(nproc)" 2>&1 | tail -3
  [[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "device-check: build failed" >&2; exit 1; }
}

if [[ $mode == build ]]; then
  build_standalone
  say "the binaries built in $build:"
  verify_built "$build" || exit 1
  mkdir -p "$carry"
  for b in "${gpu_tests[@]}" "${gpu_tools[@]}" libkilter_gpu_core.so; do
    [[ -e "$build/$b" ]] && strip -o "$carry/$b" "$build/$b"
  done
  mkdir -p "$carry/lib"
  cudnn_front=$(ldd "$carry/kilter_gpu_sdpa_test" | awk '/libcudnn\.so/ {print $3}')
  [[ -n "$cudnn_front" ]] && cp -L "$cudnn_front" "$carry/lib/"
  say "portable binaries in $carry ($(du -sh "$carry" | cut -f1)); they need from the system:"
  ldd "$carry/kilter_gpu_sdpa_test" | awk '{print "  " $1}'
  exit 0
fi

# ---- libraries: the machine's first, the carried cuDNN only where the machine has none ---------
# The folder holding the machine's copy of library $1: the toolkit's, the ld.so cache's, the
# system folders', or a Python wheel's (nvidia-cudnn-cu13, ...); nothing when it has none.
machine_library_dir() {
  local found
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [[ -e $dir/$1 ]] && { echo "$dir"; return; }; done
  found=$(ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n {print $NF; exit}')
  [[ -n "$found" ]] && { dirname "$found"; return; }
  for dir in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /usr/local/lib; do [[ -e $dir/$1 ]] && { echo "$dir"; return; }; done
  found=$(find /opt /usr/local/lib /usr/lib/python3* -path '*nvidia*' -name "$1" 2>/dev/null | head -1)
  [[ -n "$found" ]] && dirname "$found"
}
resolve_libraries() {
  local path="/usr/local/cuda/lib64:/usr/local/cuda/lib" dir lib
  for lib in libcudnn.so.9 libcublasLt.so.13 libnccl.so.2; do
    dir=$(machine_library_dir "$lib")
    if [[ -n "$dir" ]]; then
      echo "  $lib: the machine's, in $dir"
      # A folder outside the loader's own search (a wheel's) goes on the path, ahead of the rest.
      [[ ":$path:" == *":$dir:"* ]] || ldconfig -p 2>/dev/null | grep -q "=> $dir/$lib\$" || path="$dir:$path"
    elif [[ $lib == libcudnn.so.9 && -e "$carry/lib/$lib" ]]; then
      echo "  $lib: none on this machine; the carried front library $carry/lib/$lib (its sub-libraries are not" \
           "carried: cuDNN is then unusable and the SDPA test fails)"
      path="$path:$carry/lib"
    else
      echo "  $lib: none on this machine"
    fi
  done
  export LD_LIBRARY_PATH=$path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}

if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then exec > >(tee "$OUT/device-check.log") 2>&1; fi
logs=${OUT:-$root/build-device-check}/device-check-logs
mkdir -p "$logs"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
say "libraries"
resolve_libraries
if [[ -x "$carry/kilter_gpu_sdpa_test" ]] && ! ldd "$carry/kilter_gpu_sdpa_test" 2>/dev/null | grep -q "not found"; then
  say "using prebuilt binaries in $carry"
  bin=$carry
else
  [[ -x "$carry/kilter_gpu_sdpa_test" ]] && { ldd "$carry/kilter_gpu_sdpa_test" 2>/dev/null | grep "not found"; say "prebuilt binaries miss libraries here"; }
  build_standalone
  bin=$build
fi
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
            /usr/local/cuda/compute-sanitizer/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | head -1)
export root bin sanitizer

# ---- running steps -----------------------------------------------------------------------------
declare -A verdict seconds
fatal=0     # a correctness failure: B does not run
unchecked=0 # a step that could not run here (no compute-sanitizer, no PyTorch): not a pass
run_step() {  # run_step INDEX [COMMAND]: the plan's step (or COMMAND under its name and budget)
  local i=$1 name=${plan_name[$1]} budget=${plan_budget[$1]} cmd=${2:-${plan_cmd[$1]}} t0=$SECONDS rc
  say "stage ${plan_stage[$i]}: $name (budget $budget s)"
  timeout --kill-after=5 "$budget" bash -c "$cmd" 2>&1 | tee "$logs/$name.log"
  rc=${PIPESTATUS[0]}
  seconds[$name]=$((SECONDS - t0))
  case $rc in
    0) verdict[$name]=pass ;;
    77) verdict[$name]="FAIL: skipped (no usable device)" ;;
    124|137) verdict[$name]="FAIL: killed at its budget" ;;
    *) verdict[$name]="FAIL (exit $rc)" ;;
  esac
  [[ $rc -eq 0 ]]
}
step_index() { local i; for i in "${!plan_name[@]}"; do [[ ${plan_name[$i]} == "$1" ]] && { echo "$i"; return; }; done; }
mark() { verdict[$1]=$2; seconds[$1]=0; }

print_stage_table() {
  local s=$1 i name budget=0 used=0
  echo
  echo "stage $s: $(stage_title "$s")"
  printf '  %-18s %-40s %6s %7s\n' step verdict seconds budget
  for i in "${!plan_stage[@]}"; do
    [[ ${plan_stage[$i]} == "$s" ]] || continue
    name=${plan_name[$i]}
    [[ -n "${verdict[$name]:-}" ]] || continue
    printf '  %-18s %-40s %6s %7s\n' "$name" "${verdict[$name]}" "${seconds[$name]}" "${plan_budget[$i]}"
    used=$((used + seconds[$name]))
  done
  echo "  stage $s took $used s (target $(stage_target "$s") s)"
}

# The engines' verdicts as the tests' logs name them (cuDNN SDPA buckets, bf16 storage, fallbacks).
print_engine_verdicts() {
  echo
  echo "engine verdicts in stage A's logs:"
  grep -h -E "kilter: cuda backend:|graphs built in|cuDNN refused case:|bf16-storage|SDPA .*(passed|refused|fell back)" \
    "$logs"/*.log 2>/dev/null | sed 's/^ */  /' | sort | uniq -c | sort -rn | head -30
}

# ---- stage A -----------------------------------------------------------------------------------
if [[ -z $stage_only || $stage_only == A ]]; then
  for t in "${gpu_tests[@]}" "${gpu_tools[@]}"; do
    [[ -x "$bin/$t" ]] || { echo "device-check: $bin/$t was not built: a failure" >&2; fatal=1; }
  done
  for name in versions op_table sdpa; do
    run_step "$(step_index $name)" || fatal=1
  done
  # A cuDNN refusal: that case again, with cuDNN's own error logging (the reason a graph or plan
  # was refused), within one budget.
  refused=$(sed -n 's/^  cuDNN refused case: //p' "$logs/sdpa.log" | head -1)
  if [[ -n "$refused" ]]; then
    i=$(step_index sdpa_refusal_log)
    run_step "$i" "$cudnn_logging \$bin/kilter_gpu_sdpa_test --case $(printf '%q' "$refused")"
    verdict[sdpa_refusal_log]="logged (the refusal stands)"
  fi
  i=$(step_index sdpa_initcheck)
  if [[ -n "$sanitizer" ]]; then
    run_step "$i" || fatal=1
  else
    mark sdpa_initcheck "NOT RUN: no compute-sanitizer here"
    unchecked=1
  fi
  for name in model bf16_model cut loss_curve; do run_step "$(step_index $name)" || fatal=1; done
  print_stage_table A
  print_engine_verdicts
  if [[ $fatal -ne 0 ]]; then
    say "stage A failed: stage B is not run (each step's log: $logs)"
    exit 1
  fi
  [[ $stage_only == A ]] && exit $unchecked
fi

# ---- stage B -----------------------------------------------------------------------------------
run_step "$(step_index kilter_bench)" || fatal=1
bench_out=$(cat "$logs/kilter_bench.log")
peer_rows=()
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  for spec in "gpt2-124m bf16" "gpt2-124m fp32" "small bf16" "small fp32"; do
    set -- $spec
    name=torch_${1%%-*}_$2
    run_step "$(step_index "$name")" || fatal=1
    line=$(grep '^{' "$logs/$name.log" | tail -1)
    peer_rows+=("$1 $2 compile $(sed -n 's/.*"tokens_per_s": \([0-9.]*\).*"check": "\([^"]*\)".*/\1 \2/p' <<<"$line")")
  done
else
  for name in torch_gpt2_bf16 torch_gpt2_fp32 torch_small_bf16 torch_small_fp32; do mark "$name" "NOT RUN: no PyTorch with CUDA"; done
  unchecked=1
fi
print_stage_table B
# The last table: every kilter row (bench/gpu_step.sh's columns) and its tokens/s against
# torch.compile's on the same shape and precision.
echo
peer_table=$(printf '%s\n' "${peer_rows[@]}")
echo "$bench_out" | sed -n '/^config /,$p' | awk -v peers="$peer_table" '
  BEGIN { n = split(peers, rows, "\n"); for (i = 1; i <= n; ++i) { split(rows[i], f, " ");
          if (f[5] == "ok") best[f[1] " " f[2]] = f[4] } }
  NR == 1 { printf "%s %10s\n", $0, "x compile"; next }
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
    csv=$logs/profile.csv
    timeout "${KILTER_PROFILE_TIMEOUT:-150}" "$ncu_bin" --csv --metrics gpu__time_duration.sum --launch-skip 1200 \
      --launch-count 900 "$bin/kilter_bench_gpu_step" --name p --precision bf16 --bf16-storage on --attention auto --B 16 --T 1024 \
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
say "done: $([[ $fatal -eq 0 && $unchecked -eq 0 ]] && echo "every step passed" || echo "not every step passed")"
[[ $fatal -eq 0 && $unchecked -eq 0 ]]
