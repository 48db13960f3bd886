#!/usr/bin/env bash
# The memory plan by sharding mode, from `kilter plan --memory --json` alone (no training):
# - optimizer shards the moments only (1/G), parameters shards the weights, the gradients and
#   the moments (1/G) and adds the other ranks' parts of the units resident at once (the
#   blocks: two in use, one prefetched; or every unit with train.reshard_after_forward = false), on
#   the CPU backend; on the CUDA backend the pages its NCCL shards back (2 MiB pages: the chunks,
#   at most the embeddings, the final unit and three blocks of parameters, the embeddings and two
#   units of gradients) and a staging buffer; under bf16 storage the units gather the bf16 working
#   copy alone and the chunks hold the distributed optimizer's state (the fp32 master, the copy's
#   chunk pages, the norms' fp32 pages, the head's padded copy);
# - train.shard_group = node shards over the node's ranks (G = L), world over all;
# - the advice names the cheapest setting in order: a node that holds only the parameters mode
#   is told "set train.shard = parameters", one that holds optimizer is told that.
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR

# Wide layers and a small vocabulary: the state, not the activations, decides what fits.
MODEL=(--lengths uniform:64,64 --docs 200 --model.n_layer=8 --model.n_head=8 --model.n_embd=1024 --model.block_size=64
       --data.max_tokens=64 --train.tokens_per_step=256 --model.vocab_size=256)
plan() {  # plan NAME [args]: the memory plan's JSON into NAME.json
  local name=$1; shift
  "$KILTER" plan "${MODEL[@]}" --world-size 4 --memory --json "$@" > "$name.json" 2> "$name.err" \
    || { cat "$name.err"; fail "kilter plan $name failed"; }
}
plan none --train.shard=none --train.backend=cpu
plan opt --train.shard=optimizer --train.backend=cpu
plan par --train.shard=parameters --train.backend=cpu
plan keep --train.shard=parameters --train.reshard_after_forward=false --train.backend=cpu
plan node --train.shard=parameters --train.shard_group=node --ranks-per-node 2 --train.backend=cpu
plan cuda --train.shard=parameters --train.backend=cuda --device-memory 80
BF16=(--train.precision=bf16 --train.bf16_storage=on)
plan bnone --train.shard=none --train.backend=cpu "${BF16[@]}"
plan bopt --train.shard=optimizer --train.backend=cpu "${BF16[@]}"
plan bcuda --train.shard=optimizer --train.backend=cuda --device-memory 80 "${BF16[@]}"
plan bcudanone --train.shard=none --train.backend=cuda --device-memory 80 "${BF16[@]}"
plan bcudapar --train.shard=parameters --train.backend=cuda --device-memory 80 "${BF16[@]}"
"$PY" - <<'PY'
import json
m = {k: json.load(open(f"{k}.json"))["memory"] for k in ("none", "opt", "par", "keep", "node", "cuda")}
n, o, p, k, nd = m["none"], m["opt"], m["par"], m["keep"], m["node"]
padded_floats = o["parameters_bytes"] // 4
unit = p["unit_floats"]
assert 0 < unit < padded_floats // 4, unit
assert (n["shard"], o["shard"], p["shard"]) == ("none", "optimizer", "parameters")
assert (o["shard_group"], p["shard_group"], nd["shard_group"]) == (4, 4, 2)
# optimizer: only the moments shrink.
assert o["parameters_bytes"] == n["parameters_bytes"] and o["gradients_bytes"] == n["gradients_bytes"]
assert o["optimizer_bytes"] == padded_floats // 4 * 8, (o["optimizer_bytes"], padded_floats)
assert o["gathered_bytes"] == 0 and n["gathered_bytes"] == 0
# parameters: 1/G of weights, gradients and moments; the other ranks' parts of the units resident
# at once (the embeddings and three blocks here, two in use and one prefetched: 8 blocks of 12.6 M
# floats, embeddings of 0.33 M).
assert p["parameters_bytes"] == padded_floats // 4 * 4
assert p["optimizer_bytes"] == o["optimizer_bytes"]
block = (padded_floats - 2 * 1024 - 256 * 1024 - 64 * 1024) // 8  # the final norm, the tied embeddings
assert 3 * block * 3 // 4 * 4 <= p["gathered_bytes"] <= 4 * block * 3 // 4 * 4, (p["gathered_bytes"], block)
# Gradients: the chunk, two blocks' whole gradients (one computing, one reduce-scattering), the
# reduce-scatter's pieces (2 x 4 Mi floats).
assert padded_floats // 4 * 4 + block * 7 // 5 * 4 + 8 * 2**20 * 4 <= p["gradients_bytes"] <= padded_floats // 4 * 4 + 3 * block * 4
assert k["gathered_bytes"] == padded_floats * 3 // 4 * 4, "reshard_after_forward = false keeps every unit"
assert nd["parameters_bytes"] == padded_floats // 2 * 4, "shard_group = node: G = 2"
assert p["other_rank_bytes"] < o["other_rank_bytes"] < n["other_rank_bytes"]
# cuda: the pages the NCCL shards back, derived here from the unit layout (the embeddings of
# 320 K floats, 8 blocks, the final norm with the padding), G = 4, rank 0's chunks (the fullest).
c = m["cuda"]
page = 2 << 20
block = (padded_floats - 2 * 1024 - 256 * 1024 - 64 * 1024) // 8
bounds = [0, 320 * 1024] + [320 * 1024 + (l + 1) * block for l in range(8)] + [padded_floats]
units = [(bounds[i], bounds[i + 1] - bounds[i]) for i in range(len(bounds) - 1)]
def pages(offset, count):
    return set(range(offset * 4 // page, ((offset + count) * 4 + page - 1) // page))
pinned = set()
for offset, count in units:
    chunk = ((count + 3) // 4 + 63) // 64 * 64
    pinned |= pages(offset, min(count, chunk))
spans = [len(pages(o, n)) for o, n in units]
top = max(spans[1:-1])
gathered_pages = min(sum(spans), spans[0] + spans[-1] + 3 * top)
grad_pages = min(sum(spans), spans[0] + 2 * max(top, spans[-1]))
chunk = ((unit + 3) // 4 + 63) // 64 * 64
assert c["parameters_bytes"] == len(pinned) * page, (c["parameters_bytes"], len(pinned))
assert c["gradients_bytes"] == (len(pinned) + grad_pages) * page, (c["gradients_bytes"], grad_pages)
assert c["gathered_bytes"] == gathered_pages * page + 5 * chunk * 4, (c["gathered_bytes"], gathered_pages, chunk)
assert c["optimizer_bytes"] == o["optimizer_bytes"]
# Far below the whole buffers it held before.
assert c["parameters_bytes"] + c["gradients_bytes"] + c["gathered_bytes"] < 2 * padded_floats * 4
assert "device_total_designed_bytes" not in c
assert c["device_total_bytes"] >= c["parameters_bytes"] + c["gathered_bytes"] + c["gradients_bytes"] + c["optimizer_bytes"]
# The distributed optimizer (bf16 storage): the cpu backend keeps the fp32 master 1/G with the
# moments beside the whole bf16 working copy (and a page or two per norm tensor widened from it);
# so does the cuda backend (its norms widened into managed memory, priced at 2 MiB pages); under
# none the master is whole.
b = {k: json.load(open(f"{k}.json"))["memory"] for k in ("bnone", "bopt", "bcuda", "bcudanone")}
padded = b["bnone"]["parameters_bytes"] // 6
norm_pages = b["bopt"]["parameters_bytes"] - (2 * padded + padded // 4 * 4)
assert 0 < norm_pages <= 34 * 2 * 4096, norm_pages  # 8 blocks x 4 norm tensors and the final 2, 2 pages each
assert b["bopt"]["optimizer_bytes"] == padded // 4 * 8
cuda_norm_pages = b["bcuda"]["parameters_bytes"] - (2 * padded + padded // 4 * 4)
assert 0 < cuda_norm_pages <= 34 * 2 * 2**21, (b["bcuda"]["parameters_bytes"], padded)
assert b["bcudanone"]["parameters_bytes"] >= 6 * padded, (b["bcudanone"]["parameters_bytes"], padded)
assert b["bcuda"]["device_total_bytes"] < b["bcudanone"]["device_total_bytes"]
# parameters under bf16 storage on cuda: no fp32 page of a unit; the master of rank 0's chunks (4
# bytes a float), the working copy's chunk pages (2 bytes an element), the norms' fp32 pages (a
# page or two per norm tensor), the head's padded copy (the vocabulary padded to 128 rows); the
# copy's unit pages (the fp32 budget's units at 2 bytes) and the same staging as fp32; the
# gradients as in fp32.
bp = json.load(open("bcudapar.json"))["memory"]
def pages_of(ranges, element):
    covered = set()
    for offset, count in ranges:
        covered |= set(range(offset * element // page, ((offset + count) * element + page - 1) // page))
    return len(covered)
chunks = [(o, min(n, ((n + 3) // 4 + 63) // 64 * 64)) for o, n in units]
master = sum(n for _, n in chunks) * 4
head_copy = 2 * 256 * 1024
norm_bytes = bp["parameters_bytes"] - master - pages_of(chunks, 2) * page - head_copy
assert norm_bytes % page == 0 and 0 < norm_bytes <= 34 * 2 * page, (bp["parameters_bytes"], norm_bytes)
copy_spans = [pages_of([u], 2) for u in units]
copy_pages = min(sum(copy_spans), copy_spans[0] + copy_spans[-1] + 3 * max(copy_spans[1:-1]))
assert bp["gathered_bytes"] == copy_pages * page + 5 * chunk * 4, (bp["gathered_bytes"], copy_pages, chunk)
assert bp["gradients_bytes"] == c["gradients_bytes"], (bp["gradients_bytes"], c["gradients_bytes"])
assert bp["gathered_bytes"] < c["gathered_bytes"], "the bf16 copy's units take half the fp32 ones' pages"
# Machines for the advice: between parameters' node and optimizer's with block recompute; between
# optimizer's and none's.
PY
read -r par_node opt_node none_node < <("$PY" -c '
import json
m = {k: json.load(open(f"{k}.json"))["memory"] for k in ("none", "opt", "par")}
print(m["par"]["node_bytes"], m["opt"]["node_bytes"], m["none"]["node_bytes"])')
plan optblock --train.shard=optimizer --train.recompute=block --train.backend=cpu
optblock_node=$("$PY" -c 'import json; print(json.load(open("optblock.json"))["memory"]["node_bytes"])')
(( par_node < optblock_node )) || fail "the parameters mode ($par_node B) should need less than optimizer with recompute ($optblock_node B)"
between=$(( (par_node + optblock_node) / 2 ))
KILTER_TEST_NODE_MEMORY_BYTES=$between "$KILTER" plan "${MODEL[@]}" --world-size 4 --memory --train.shard=none --train.backend=cpu \
  > advice_par.txt 2>&1 || { cat advice_par.txt; fail "kilter plan (advice, parameters) failed"; }
grep -q "fits with: set train.shard = parameters (train.shard_group = world)" advice_par.txt \
  || { cat advice_par.txt; fail "a node that holds only the parameters mode was not told so"; }
between=$(( (opt_node + none_node) / 2 ))
KILTER_TEST_NODE_MEMORY_BYTES=$between "$KILTER" plan "${MODEL[@]}" --world-size 4 --memory --train.shard=none --train.backend=cpu \
  > advice_opt.txt 2>&1 || { cat advice_opt.txt; fail "kilter plan (advice, optimizer) failed"; }
grep -q "fits with: set train.shard = optimizer$" advice_opt.txt \
  || { cat advice_opt.txt; fail "a node that holds the optimizer mode was not told so"; }
echo "memory_plan_modes: OK"
