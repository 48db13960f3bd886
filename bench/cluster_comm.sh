#!/usr/bin/env bash
# Gradient reduction across real nodes (issue 15): 2 nodes x 2 ranks on scripts/vcluster (nodes
# as network namespaces, topology from the hosts: no --ranks-per-node), with the inter-node link
# shaped to LINK_GBIT (tbf, both directions) and unshaped, side by side:
#   - busbw of `kilter bench-comm` flat and hierarchical and of one plain MPI_Allreduce, 1-64 MB;
#   - the share of the link's rate that the hierarchical reduction's cross-node traffic reaches:
#     it must move 2(N-1)/N * S bytes per node and direction across the link (N nodes; L cross-node
#     allreduces of S/L each), so share = that / time / link rate (time includes the in-node
#     stages: a lower bound of the cross-node stage's own share);
#   - the in-node part alone (an allreduce over one node's 2 ranks) and the link's own time for
#     the cross-node bytes, which together bound what the hierarchical reduction can reach here;
#   - training on the shaped link: comm_exposed (seconds per step, mean over ranks and steps
#     after the first) flat vs hierarchical, overlap on vs off.
# Targets (issue 15; at LINK_GBIT = 1 and >= 16 MB): hierarchical busbw >= 1.4x flat; the link
# share >= 70%; comm_exposed with overlap on <= half of the reduction time with overlap off.
# Every bench-comm number comes from a run whose sums were verified.
#
# usage: bench/cluster_comm.sh [path/to/kilter]       (root: it stands up and removes a vcluster)
#   env: LINK_GBIT (1), SIZES (1M,4M,16M,64M), ITERS (5), ROUNDS (3), TRAIN_STEPS (8),
#        TRAIN_MODEL ("--model.n_layer=4 --model.n_head=4 --model.n_embd=256 --model.block_size=128")
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kilter=$(readlink -f "${1:-$root/build/kilter}")
[[ -x $kilter ]] || { echo "bench/cluster_comm.sh: $kilter is not built" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "bench/cluster_comm.sh: run as root (scripts/vcluster needs it)" >&2; exit 2; }
vcluster=$root/scripts/vcluster
link_gbit=${LINK_GBIT:-1}
sizes=${SIZES:-1M,4M,16M,64M}
iters=${ITERS:-5}
rounds=${ROUNDS:-3}
train_steps=${TRAIN_STEPS:-8}
read -r -a train_model <<< "${TRAIN_MODEL:---model.n_layer=4 --model.n_head=4 --model.n_embd=256 --model.block_size=128}"
export OPENBLAS_NUM_THREADS=1
"$vcluster" status | grep -q "^vcluster: down" || { echo "bench/cluster_comm.sh: a vcluster is up; vcluster down first" >&2; exit 2; }
work=$(mktemp -d /tmp/kilter-cluster-bench.XXXXXX)
trap '"$vcluster" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
cd "$work"
mpirun_nodes() { "$vcluster" mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS -np 4 --npernode 2 "$@" 2>>"$work/mpirun.log"; }
# One TCP stream node2 -> node1 for 3 s: what the link gives a single connection right now (the
# ceiling for a link share, on a machine whose cores the nodes and their TCP stacks share).
tcp_probe() {
  cat > probe.py <<'PROBE'
import socket, sys, time
if sys.argv[1] == "serve":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 5399)); s.listen(1)
    c, _ = s.accept(); n = 0; t = time.time()
    while True:
        b = c.recv(1 << 20)
        if not b: break
        n += len(b)
    print(f"{n * 8 / (time.time() - t) / 1e9:.3f}")
else:
    for _ in range(50):
        try: s = socket.create_connection((sys.argv[2], 5399)); break
        except OSError: time.sleep(0.1)
    buf = b"x" * (1 << 20); t = time.time()
    while time.time() - t < 3: s.sendall(buf)
    s.close()
PROBE
  "$vcluster" exec node1 /usr/bin/python3 probe.py serve > "$1.tcp" &
  local server=$!
  "$vcluster" exec node2 /usr/bin/python3 probe.py send node1
  wait "$server"
}
bench() {  # bench NAME [bench-comm args]
  local name=$1
  shift
  mpirun_nodes "$kilter" bench-comm --bytes "$sizes" --iters "$iters" --rounds "$rounds" --json "$@" > "$name.json"
}

echo "# $(date -u +%FT%TZ) $(hostname): $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $(mpirun --version 2>/dev/null | head -1)"
echo "# 2 nodes x 2 ranks on scripts/vcluster; the machine's cores are shared by both nodes"

# ---- shaped link ---------------------------------------------------------------------------------
"$vcluster" up --nodes 2 --link-gbit "$link_gbit" 2>/dev/null
tcp_probe shaped
bench shaped --algo both
# The in-node part alone: an allreduce of S over node1's 2 ranks (shared memory), what the
# hierarchical reduction's reduce-scatter + allgather cost together on this machine.
"$vcluster" exec node1 mpirun --allow-run-as-root --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS -np 2 \
  "$kilter" bench-comm --bytes "$sizes" --iters "$iters" --rounds "$rounds" --algo flat --json > innode.json 2>>mpirun.log

"$kilter" prep synth --docs 2000 --lengths lognormal:5,0.6,128 --vocab 4096 --shards 2 --seed 1 --out data >/dev/null 2>&1
for algo in flat hierarchical; do
  for overlap in true false; do
    mpirun_nodes "$kilter" train --data.dir="$work/data" "${train_model[@]}" --data.max_tokens=1024 \
      --train.tokens_per_step=4096 --train.steps="$train_steps" --train.warmup=1 --comm.algo="$algo" \
      --comm.overlap="$overlap" --output.log_every=100 --output.checkpoint_every=0 \
      --output.dir="$work/runs/$algo-$overlap" > "train-$algo-$overlap.log" 2>&1 ||
      { cat "train-$algo-$overlap.log"; exit 1; }
  done
done
"$vcluster" down >/dev/null 2>&1

# ---- unshaped link -----------------------------------------------------------------------------------
"$vcluster" up --nodes 2 2>/dev/null
tcp_probe unshaped
bench unshaped --algo both
"$vcluster" down >/dev/null 2>&1

/usr/bin/python3 - "$link_gbit" "$iters" "$rounds" <<'PY'
import csv, glob, json, sys
link_gbit, iters, rounds = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
link_bytes_s = link_gbit * 1e9 / 8

def rows(name):
    data = json.load(open(f"{name}.json"))
    assert all(r["verified"] for r in data), f"{name}: a result did not verify"
    out = {}
    for r in data:
        assert r["nodes"] == 2 and r["ranks_per_node"] == 2, f"{name}: not 2 nodes x 2 ({r['nodes']}x{r['ranks_per_node']})"
        out[(r["bytes"], r["algo"])] = r
    return out

print()
for name in ["shaped", "unshaped"]:
    print(f"## one TCP stream node2 -> node1, {name} link: {float(open(name + '.tcp').read()):.3f} Gbit/s")
print("## allreduce of S bytes (sum, float32), 2 nodes x 2 ranks; busbw = algbw*2(n-1)/n in GB/s (n = 4 ranks);")
print(f"## fastest of {rounds} rounds x {iters}; link share = 2(N-1)/N*S per node and direction / hierarchical time / link rate")
print(f"{'link':>9} {'bytes':>9} {'flat':>7} {'hier':>7} {'MPI_Allr':>8} {'hier/flat':>9} {'hier/MPI':>8} {'link share':>10} {'targets (>=16MB)':>18}")
for name, label, rate in [("shaped", f"{link_gbit:g} Gbit/s", link_bytes_s), ("unshaped", "unshaped", None)]:
    r = rows(name)
    for size in sorted({b for b, _ in r}):
        f, h = r[(size, "flat")], r[(size, "hierarchical")]
        speedup = f["time_us"] / h["time_us"]
        cross_bytes = 2 * (2 - 1) / 2 * size          # N = 2 nodes
        share = cross_bytes / (h["time_us"] * 1e-6) / rate if rate else None
        target = ""
        if rate and size >= 16 << 20:
            target = ("1.4x " + ("met" if speedup >= 1.4 else "MISSED") + ", 70% " + ("met" if share >= 0.7 else "MISSED"))
        print(f"{label:>9} {size >> 20:>7}MB {f['busbw_gbs']:>7.3f} {h['busbw_gbs']:>7.3f} {h['mpi_allreduce_busbw_gbs']:>8.3f} "
              f"{speedup:>8.2f}x {h['mpi_allreduce_time_us'] / h['time_us']:>7.2f}x "
              f"{(f'{share:.0%}' if share is not None else '-'):>10} {target:>18}")

print()
innode = {r["bytes"]: r for r in json.load(open("innode.json")) if r["verified"]}
shaped = rows("shaped")
print()
print("## where the hierarchical time goes on the shaped link: in-node part alone (2 ranks of node1, measured),")
print("## cross-node bytes at the link rate (computed), their sum, and the measured hierarchical time (ms)")
print(f"{'bytes':>9} {'in-node':>9} {'link':>9} {'sum':>9} {'hier':>9}")
for size in sorted(innode):
    if (size, "hierarchical") not in shaped: continue
    t_in = innode[size]["time_us"] / 1e3
    t_link = size / link_bytes_s * 1e3
    t_h = shaped[(size, "hierarchical")]["time_us"] / 1e3
    print(f"{size >> 20:>7}MB {t_in:>9.1f} {t_link:>9.1f} {t_in + t_link:>9.1f} {t_h:>9.1f}")
print(f"## load after the runs: {open('/proc/loadavg').read().split()[:3]} on {__import__('os').cpu_count()} cores")
print(f"## training on the {link_gbit:g} Gbit/s link, 2 nodes x 2 (steps after the first; mean over ranks):")
print(f"{'algo':>13} {'overlap':>8} {'step s':>8} {'comm_exposed s':>15} {'exposed frac':>13}")
exposed = {}
for path in sorted(glob.glob("runs/*")):
    algo, overlap = path.split("/")[-1].rsplit("-", 1)
    steps, comm = [], []
    for f in glob.glob(f"{path}/metrics/rank-*.csv"):
        rs = list(csv.DictReader(open(f)))[1:]
        steps += [float(x["step_total"]) for x in rs]
        comm += [float(x["comm_exposed"]) for x in rs]
    st, ce = sum(steps) / len(steps), sum(comm) / len(comm)
    exposed[(algo, overlap)] = ce
    print(f"{algo:>13} {overlap:>8} {st:>8.3f} {ce:>15.3f} {ce / st:>13.1%}")
for algo in ["flat", "hierarchical"]:
    on, off = exposed[(algo, "true")], exposed[(algo, "false")]
    print(f"{algo}: comm_exposed with overlap on / reduction time with overlap off = {on / off:.2f} "
          f"(target <= 0.5: {'met' if on <= 0.5 * off else 'MISSED'})")
PY
