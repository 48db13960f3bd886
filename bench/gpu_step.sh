#!/usr/bin/env bash
# GPU step throughput of the CUDA model on one device: the small config (4 layers, 256 wide,
# 4 heads, vocab 8192, T=256) and the GPT-2 124M shape (12 layers, 768 wide, 12 heads, vocab
# 50257, T=1024): fp32; bf16 on the fp32-activation datapath (storage off: bf16 GEMM math, the
# datapath measured on the H200 in 2026-12); bf16 on the bf16-storage datapath (storage on), with
# and without CUDA graphs, with cuBLASLt attention and with cuDNN SDPA (flash attention on the
# bf16 rows; graphs stay off for its batches). Prints tokens/s and MFU per run, then a table.
# Then memory (issue 24), on the bf16-storage datapath: GPT-2 124M with train.recompute = gelu,
# attention, block, and block with the AdamW moments of 1/8 of the buffer (rank 0 of a ZeRO-1 run
# of 8), and the GPT-2 large shape (774M) without and with both; GiB is the device memory the
# model took. Last, Llama rows (the small shape on both datapaths, a Llama-3.2-1B-like shape;
# KILTER_BENCH_LLAMA_1B=0 leaves that one out).
# usage: bench/gpu_step.sh [path/to/kilter_bench_gpu_step] [--quick] [--core]
# --core runs only the rows the device check's speed stage compares with torch.compile: the small
# config and GPT-2 124M, fp32 and bf16 (bf16 storage, attention auto: SDPA where it passes).
# MFU = (6 * (params - wpe) + 12 * n_layer * n_embd * T) * tokens/s / peak (Llama: the spec's dense
# FLOPs instead of 6 * params, bench/gpu_step.cpp); peak is the H100/H200
# datasheet (dense bf16 989.4 TFLOP/s; fp32 66.9) unless KILTER_PEAK_TFLOPS_BF16/_FP32 are set.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bench=${1:-$root/build-gpu/kilter_bench_gpu_step}
steps=10 core=0
for arg in "${@:2}"; do
  case "$arg" in
    --quick) steps=4 ;;
    --core) core=1 ;;
    *) echo "usage: bench/gpu_step.sh [path/to/kilter_bench_gpu_step] [--quick] [--core]" >&2; exit 2 ;;
  esac
done
[[ -x "$bench" ]] || { echo "bench/gpu_step.sh: $bench is not built (make kilter_bench_gpu_step)" >&2; exit 2; }

results=()
status=0
extra=()  # model flags of the next runs (--arch llama ...)
run() {  # name precision storage attention graphs B T n_layer n_head n_embd vocab [recompute] [shard_ranks]
  local peak_var="KILTER_PEAK_TFLOPS_${2^^}"
  local peak_flag=()
  [[ -n "${!peak_var:-}" ]] && peak_flag=(--peak-tflops "${!peak_var}")
  local out
  out=$(timeout "${KILTER_GPU_BENCH_TIMEOUT:-240}" "$bench" --name "$1" --precision "$2" --bf16-storage "$3" --attention "$4" \
        --graphs "$5" --B "$6" --T "$7" --n-layer "$8" --n-head "$9" --n-embd "${10}" --vocab "${11}" \
        --recompute "${12:-none}" --shard-ranks "${13:-1}" "${extra[@]}" --steps "$steps" --warmup 3 "${peak_flag[@]}" 2>&1)
  local rc=$?
  echo "$out" | grep -v '^RESULT'
  if [[ $rc -eq 77 ]]; then status=77; return; fi
  [[ $rc -ne 0 ]] && status=1
  results+=("$(echo "$out" | grep '^RESULT' || echo "RESULT name=$1 precision=$2 check=failed(rc=$rc)")")
}

small=(32 256 4 4 256 8192)
gpt2=(16 1024 12 12 768 50257)
if [[ $core -eq 1 ]]; then
  run small fp32 off cublaslt 0 "${small[@]}"
  run small bf16 on auto 0 "${small[@]}"
  run gpt2-124m fp32 off cublaslt 0 "${gpt2[@]}"
  run gpt2-124m bf16 on auto 0 "${gpt2[@]}"
else
# storage: off = fp32 activations with bf16 GEMM math (the datapath before bf16 storage); on = the
# bf16-storage datapath (bf16 activations, fused kernels): the old datapath against the new.
run small fp32 off cublaslt 0 "${small[@]}"
run small bf16 off cublaslt 0 "${small[@]}"
run small bf16 on cublaslt 0 "${small[@]}"
run small bf16 on cublaslt 1 "${small[@]}"
run gpt2-124m fp32 off cublaslt 0 "${gpt2[@]}"
run gpt2-124m bf16 off cublaslt 0 "${gpt2[@]}"
run gpt2-124m bf16 on cublaslt 0 "${gpt2[@]}"
run gpt2-124m bf16 on cublaslt 1 "${gpt2[@]}"
# cuDNN SDPA (flash attention) on the bf16 rows: the datapath's fastest configuration where the
# engine is built and passes its self-check (the attn column says which engine ran).
run small bf16 on sdpa 0 "${small[@]}"
run gpt2-124m bf16 on sdpa 0 "${gpt2[@]}"
# Memory (issue 24) on the new datapath: activation recomputation and the sharded optimizer (this
# rank's 1/8 of the moments, as rank 0 of 8 holds them), GPT-2 124M and the GPT-2 large shape.
for mode in gelu attention block; do run gpt2-124m bf16 on cublaslt 0 "${gpt2[@]}" $mode; done
run gpt2-124m bf16 on cublaslt 0 "${gpt2[@]}" block 8
large=(8 1024 36 20 1280 50257)
run gpt2-774m bf16 on cublaslt 0 "${large[@]}"
run gpt2-774m bf16 on cublaslt 0 "${large[@]}" block 8
# Llama (issue 38): the small shape with 2 K/V heads, SwiGLU 704, untied (bench/cpu_step.sh's), on
# both datapaths; and a Llama-3.2-1B-like shape (16 x 2048, 32 heads, 8 K/V heads, SwiGLU 8192,
# vocabulary 128256, tied), 8 x 1024 tokens.
extra=(--arch llama --n-kv-head 2 --ffn-hidden 704 --untied 1)
run llama-small bf16 off cublaslt 0 "${small[@]}"
run llama-small bf16 on cublaslt 0 "${small[@]}"
run llama-small bf16 on sdpa 0 "${small[@]}"
extra=(--arch llama --n-kv-head 8 --ffn-hidden 8192 --untied 0)
[[ "${KILTER_BENCH_LLAMA_1B:-1}" == 1 ]] && run llama-1b bf16 on sdpa 0 8 1024 16 32 2048 128256
extra=()
fi

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }
echo
printf '%-11s %-5s %-7s %-8s %6s %-9s %5s %4s %5s %7s %12s %10s %8s %7s %s\n' config prec storage attn graphs recompute \
  shard B T GiB tokens/s ms/step TFLOP/s MFU check
for r in "${results[@]}"; do
  mfu=$(field mfu "$r")
  [[ -n "$mfu" && "$mfu" != "-1.0000" ]] && mfu=$(awk -v m="$mfu" 'BEGIN{printf "%.1f%%", 100*m}') || mfu=n/a
  printf '%-11s %-5s %-7s %-8s %6s %-9s %5s %4s %5s %7s %12s %10s %8s %7s %s\n' "$(field name "$r")" \
    "$(field precision "$r")" "$(field storage "$r")" \
    "$(field attention "$r")" "$(field graphs "$r")" "$(field recompute "$r")" "1/$(field shard "$r")" \
    "$(field B "$r")" "$(field T "$r")" "$(field memory_gib "$r")" "$(field tokens_per_s "$r")" "$(field ms_per_step "$r")" \
    "$(field tflops "$r")" "$mfu" "$(field check "$r")"
done
exit $status
