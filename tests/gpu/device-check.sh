#!/usr/bin/env bash
# The GPU machine's check for the CUDA backend (issue 7), all within 8 minutes:
#   1. binaries: prebuilt ones in $KILTER_GPU_CARRY (default build-gpu-carry/: stripped, with
#      OpenBLAS and libstdc++ linked in, made on a build machine by
#      `tests/gpu/device-check.sh --build-only` and brought along), else a fresh standalone build
#      in build-gpu-standalone/ (tests/gpu/standalone: needs nvcc, cmake and OpenBLAS only);
#   2. kilter_gpu_ops_test (every kernel vs its CPU twin) and kilter_gpu_model_test (a full
#      training step and a 2-step run, GPU vs CPU, fp32 and bf16);
#   3. bench/gpu_step.sh: tokens/s and MFU, small config and GPT-2 124M, fp32 and bf16;
#   4. a short table last. Exit 0 only when every test and benchmark check passed.
# usage: tests/gpu/device-check.sh [--build-only] [--quick]
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${KILTER_GPU_BUILD:-$root/build-gpu-standalone}
carry=${KILTER_GPU_CARRY:-$root/build-gpu-carry}
# The carried binaries link cuBLASLt (and cuDNN's small front library) dynamically: the toolkit's
# first; the copy of libcudnn.so.9 carried in $carry/lib only when the machine has no cuDNN (its
# sub-libraries are too large to carry: the cuDNN tests then report cuDNN unusable and the model
# falls back to cuBLASLt attention).
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}:$carry/lib
build_only=0 quick=""
for arg in "$@"; do
  case "$arg" in
    --build-only) build_only=1 ;;
    --quick) quick=--quick ;;
    *) echo "usage: $0 [--build-only] [--quick]" >&2; exit 2 ;;
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

binaries=(kilter_gpu_ops_test kilter_gpu_model_test kilter_bench_gpu_step)
if [[ $build_only -eq 1 ]]; then
  build_standalone
  mkdir -p "$carry"
  for b in "${binaries[@]}"; do strip -o "$carry/$b" "$build/$b"; done
  mkdir -p "$carry/lib"
  cudnn_front=$(ldd "$carry/kilter_gpu_ops_test" | awk '/libcudnn\.so/ {print $3}')
  [[ -n "$cudnn_front" ]] && cp -L "$cudnn_front" "$carry/lib/"
  say "portable binaries in $carry ($(du -sh "$carry" | cut -f1)); they need from the system:"
  ldd "$carry/kilter_gpu_ops_test" | awk '{print "  " $1}'
  exit 0
fi

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [[ -x "$carry/kilter_gpu_ops_test" ]] && ! ldd "$carry/kilter_gpu_ops_test" | grep -q "not found"; then
  say "using prebuilt binaries in $carry"
  build=$carry
else
  [[ -x "$carry/kilter_gpu_ops_test" ]] && { ldd "$carry/kilter_gpu_ops_test" | grep "not found"; say "prebuilt binaries miss libraries here"; }
  build_standalone
fi

declare -A result
for t in ops model; do
  say "kilter_gpu_${t}_test"
  timeout 180 "$build/kilter_gpu_${t}_test"
  rc=$?
  case $rc in 0) result[$t]=pass ;; 77) result[$t]=skipped ;; *) result[$t]="FAIL(rc=$rc)" ;; esac
done

say "benchmark"
bench_out=$("$root/bench/gpu_step.sh" "$build/kilter_bench_gpu_step" $quick 2>&1)
bench_rc=$?
echo "$bench_out" | sed '/^config /,$d'
case $bench_rc in 0) result[bench]=pass ;; 77) result[bench]=skipped ;; *) result[bench]="FAIL(rc=$bench_rc)" ;; esac

echo
say "summary"
printf 'gpu_ops_test: %s   gpu_model_test: %s   benchmark checks: %s\n' "${result[ops]}" "${result[model]}" "${result[bench]}"
echo "$bench_out" | sed -n '/^config /,$p'
for v in "${result[@]}"; do [[ "$v" == pass ]] || exit 1; done
exit 0
