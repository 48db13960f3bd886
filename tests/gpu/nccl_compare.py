"""The table of tests/gpu/nccl-check.sh: each multi-rank run's losses against the 1-rank run of the
same backend and against the CPU/MPI run of the same config, and the fault drills' verdicts.
Python's standard library only (the GPU machine has no h5py or numpy to count on).

usage: nccl_compare.py ROWS_TSV
ROWS_TSV, one row per line, tab-separated:
  loss  PATH  RANKS  PRECISION  RUN_CSVS  ONE_RANK_CSVS  CPU_CSVS  EXPECT  NOTE  [PEER_CSVS]
  drill PATH  RANKS  DETAIL  VERDICT
*_CSVS: comma-separated metrics files (a run's first part, then its resume: a later row of a step
wins), or "-" when there is none; PEER_CSVS: another multi-rank run of the same backend whose
losses the row's must match (absent or "-": none). EXPECT: "pass", or "fail" for a control row that must fail
(a run with perturbed losses: the check can fail). NOTE: "" or why the run itself failed.
Exit 0 when every row met its expectation.
"""
import csv
import math
import sys

STEPS = 6
# Max relative loss difference allowed, by precision and reference:
#   fp32 against the 1-rank run: the CPU world-size invariance tests' 1e-5
#     (tests/python/run_compare.py); against the CPU: gpu_model's fp32 loss tolerance, 1e-5.
#   bf16 against either: gpu_model's bf16 loss tolerance, 2e-2 (bf16 GEMM kernels are chosen per
#     shape, and the shapes change with the world size and the backend).
#   against a peer run on the same ranks and shapes (parameters under bf16 storage against
#     optimizer's distributed optimizer: the same working copy, the gradient sums in another
#     order): e2e_distributed_optimizer's bound, 1e-4 (docs/comm.md); fp32 as against 1 rank.
TOLERANCE = {"fp32": {"one_rank": 1e-5, "cpu": 1e-5, "peer": 1e-5},
             "bf16": {"one_rank": 2e-2, "cpu": 2e-2, "peer": 1e-4}}


def losses(files):
    rows = {}
    for name in files.split(","):
        with open(name) as f:
            for r in csv.DictReader(f):
                rows[int(r["step"])] = float(r["loss"])
    return [rows.get(s, float("nan")) for s in range(STEPS)]


def max_relative_difference(run, reference):
    worst = 0.0
    for a, b in zip(run, reference):
        if not (math.isfinite(a) and math.isfinite(b)) or b == 0:
            return float("inf")
        worst = max(worst, abs(a - b) / abs(b))
    return worst


def loss_row(path, ranks, precision, run_files, one_rank_files, cpu_files, expect, note, peer_files="-"):
    """(cells, met expectation) of a loss row."""
    cells = [path, ranks, precision]
    failures = [note] if note else []
    limits = TOLERANCE[precision]
    run = None
    if not failures:
        try:
            run = losses(run_files)
        except (OSError, KeyError, ValueError) as e:
            failures.append(f"no losses: {e}")
    for key, files in (("one_rank", one_rank_files), ("cpu", cpu_files), ("peer", peer_files)):
        if files == "-" or run is None:
            cells.append("n/a")
            continue
        try:
            d = max_relative_difference(run, losses(files))
        except (OSError, KeyError, ValueError) as e:
            cells.append("n/a")
            failures.append(f"no reference losses: {e}")
            continue
        cells.append(f"{d:.1e}" + ("" if d <= limits[key] else f" > {limits[key]:g}"))
        if d > limits[key]:
            failures.append(f"{key.replace('_', '-')} difference {d:.1e} over {limits[key]:g}")
    passed = not failures
    if expect == "fail":
        cells.append("pass (control failed as it must)" if not passed else "FAIL (control passed: the check cannot fail)")
        return cells, not passed
    cells.append("pass" if passed else "FAIL: " + "; ".join(failures))
    return cells, passed


def main(rows_file):
    loss_rows, drill_rows, ok = [], [], True
    with open(rows_file) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if fields[0] == "loss":
                cells, met = loss_row(*fields[1:10])
                loss_rows.append(cells)
            else:
                _, path, ranks, detail, verdict = fields
                met = verdict == "pass"
                drill_rows.append([path, ranks, detail, verdict])
            ok &= met
    header = ["path", "ranks", "precision", "vs 1 rank", "vs CPU/MPI", "vs peer", "result"]
    widths = [max(len(str(r[i])) for r in [header] + loss_rows) for i in range(len(header) - 1)]
    print("max relative loss difference over %d steps (fp32 limits %g / %g / %g, bf16 %g / %g / %g):" % (
        STEPS, TOLERANCE["fp32"]["one_rank"], TOLERANCE["fp32"]["cpu"], TOLERANCE["fp32"]["peer"],
        TOLERANCE["bf16"]["one_rank"], TOLERANCE["bf16"]["cpu"], TOLERANCE["bf16"]["peer"]))
    for r in [header] + loss_rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    for path, ranks, detail, verdict in drill_rows:
        print(f"{path} ({ranks} ranks): {detail}: {verdict}")
    print("nccl-check: %s" % ("every row passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
