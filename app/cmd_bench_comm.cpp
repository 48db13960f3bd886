// `kilter bench-comm --bytes SIZES --algo flat|hierarchical|both [--ranks-per-node L] [--iters N]
// [--json]`: the gradient reduction timed nccl-tests style (algbw, busbw) next to one plain
// MPI_Allreduce of the same bytes, every result verified; `--backward-ms X` runs the overlap
// study instead. Options are checked before MPI starts; the work is in lib/comm/comm_bench.cpp.
#include <boost/program_options.hpp>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>

#include "app/commands.h"
#include "app/launch.h"
#include "io/base/error.h"
#include "lib/core/config.h"
#include "lib/comm/comm_bench.h"

namespace po = boost::program_options;

namespace kilter::app {

namespace {

const char* kUsage =
    "usage: mpirun -np P kilter bench-comm --bytes SIZES [--algo flat|hierarchical|both]\n"
    "       [--ranks-per-node L] [--iters N] [--bucket-mb MB] [--json]\n"
    "       kilter bench-comm ... --backward-ms X   (overlap study: compute X ms per bucket while reducing)\n\n"
    "Times the gradient reduction (sum of float32) per message size, as nccl-tests does:\n"
    "algbw = bytes/time, busbw = algbw*2(n-1)/n, next to one plain MPI_Allreduce of the same bytes\n"
    "(ratio = MPI_Allreduce time / algo time). Every timed result is verified; a wrong sum exits 1.";

struct Parsed {
  comm::BenchOptions bench;
  bool json = false;
  bool help = false;
};

Parsed parse(int argc, char** argv) {
  Parsed p;
  // Defaults are what training runs: 4 MiB buckets (comm.bucket_mb) whose stages are
  // nonblocking collectives (the engine of comm.overlap = true).
  std::string bytes = "1K,64K,1M,16M,64M", algo = "both", engine = "nonblocking";
  double bucket_mb = 4;
  po::options_description desc("bench-comm options");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("bytes", po::value(&bytes)->default_value(bytes), "message sizes, comma-separated, K/M/G = 2^10/2^20/2^30 bytes")
    ("algo", po::value(&algo)->default_value(algo), "flat | hierarchical | both")
    ("ranks-per-node", po::value(&p.bench.ranks_per_node)->default_value(0), "ranks per node (0: MPI_Comm_split_type SHARED); as comm.ranks_per_node")
    ("iters", po::value(&p.bench.iters)->default_value(p.bench.iters), "timed reductions per round (overlap study: steps)")
    ("warmup", po::value(&p.bench.warmup)->default_value(p.bench.warmup), "untimed reductions first")
    ("rounds", po::value(&p.bench.rounds)->default_value(p.bench.rounds), "interleaved rounds of algo and MPI_Allreduce; the fastest is reported")
    ("bucket-mb", po::value(&bucket_mb)->default_value(bucket_mb), "reduce in buckets of this many MiB, as comm.bucket_mb (0: the whole message at once; overlap study: 0 = 1/8 of it)")
    ("engine", po::value(&engine)->default_value(engine), "blocking | nonblocking collectives for each bucket stage")
    ("backward-ms", po::value(&p.bench.backward_ms)->default_value(0.0), "overlap study: synthetic backward compute per bucket (ms); 0: off")
    ("ready-per-bucket", po::value(&p.bench.ready_per_bucket)->default_value(p.bench.ready_per_bucket), "overlap study: ready() calls per bucket")
    ("json", po::bool_switch(&p.json), "print a JSON array on stdout (rank 0)");
  // clang-format on
  po::variables_map vm;
  try {
    po::store(parse_exact(argc, argv, desc, "kilter bench-comm"), vm);
    po::notify(vm);
  } catch (po::error& e) {
    KILTER_USER_FAIL(program_options_message(e));
  }
  if (vm.count("help")) {
    if (launcher_rank() == 0) std::cout << kUsage << "\n\n" << desc << "\n";
    p.help = true;
    return p;
  }
  p.bench.sizes = comm::parse_byte_sizes(bytes, "--bytes");
  if (algo == "both")
    p.bench.algos = {"flat", "hierarchical"};
  else if (algo == "flat" || algo == "hierarchical")
    p.bench.algos = {algo};
  else
    KILTER_FAIL("--algo '" << algo << "': expected flat | hierarchical | both");
  KILTER_CHECK(p.bench.ranks_per_node >= 0, "--ranks-per-node " << p.bench.ranks_per_node << ": must be >= 0");
  KILTER_CHECK(p.bench.iters >= 1, "--iters " << p.bench.iters << ": must be >= 1");
  KILTER_CHECK(p.bench.warmup >= 0, "--warmup " << p.bench.warmup << ": must be >= 0");
  KILTER_CHECK(p.bench.rounds >= 1, "--rounds " << p.bench.rounds << ": must be >= 1");
  KILTER_CHECK(bucket_mb >= 0, "--bucket-mb " << bucket_mb << ": must be >= 0");
  KILTER_CHECK(p.bench.backward_ms >= 0, "--backward-ms " << p.bench.backward_ms << ": must be >= 0");
  KILTER_CHECK(p.bench.ready_per_bucket >= 1, "--ready-per-bucket " << p.bench.ready_per_bucket << ": must be >= 1");
  p.bench.bucket_bytes = size_t(bucket_mb * 1024 * 1024);
  if (engine == "blocking" || engine == "nonblocking")
    p.bench.blocking = engine == "blocking";
  else
    KILTER_FAIL("--engine '" << engine << "': expected blocking | nonblocking");
  return p;
}

}  // namespace

int cmd_bench_comm(int argc, char** argv) {
  Parsed p;
  try {
    p = parse(argc, argv);
  } catch (const std::exception& e) {
    if (launcher_rank() == 0) std::fprintf(stderr, "kilter bench-comm: %s\n", e.what());
    return refused_before_mpi(2);
  }
  if (p.help) return 0;

  init_mpi(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  set_error_rank(rank);
  bool all_verified = true;
  try {
    if (p.bench.backward_ms > 0) {
      const auto rows = comm::run_overlap_bench(MPI_COMM_WORLD, p.bench);
      for (const auto& r : rows) all_verified = all_verified && r.verified;
      if (rank == 0) {
        if (p.json)
          std::printf("%s\n", comm::overlap_rows_to_json(rows).dump(2).c_str());
        else
          std::printf("%s", comm::overlap_rows_to_text(rows, p.bench).c_str());
      }
    } else {
      const auto rows = comm::run_collective_bench(MPI_COMM_WORLD, p.bench);
      for (const auto& r : rows) all_verified = all_verified && r.verified;
      if (rank == 0) {
        if (p.json)
          std::printf("%s\n", comm::bench_rows_to_json(rows).dump(2).c_str());
        else
          std::printf("%s", comm::bench_rows_to_text(rows, p.bench).c_str());
      }
    }
  } catch (const std::exception& e) {
    abort_all(MPI_COMM_WORLD, std::string("bench-comm failed: ") + e.what());
  }
  std::fflush(stdout);
  // Every rank saw the same verdicts (they were reduced), so every rank exits alike.
  if (!all_verified && rank == 0)
    std::fprintf(stderr, "kilter bench-comm: a reduced result was WRONG (see the check column)\n");
  MPI_Finalize();
  return all_verified ? 0 : 1;
}

}  // namespace kilter::app
