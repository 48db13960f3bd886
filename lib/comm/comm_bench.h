// `kilter bench-comm`'s engine (the app only parses options): nccl-tests-style timing of the
// gradient reduction, flat and hierarchical, against one plain MPI_Allreduce of the same bytes,
// every result verified; and the overlap study, which runs a synthetic backward (fixed compute
// per bucket) while the reducer works and measures how much of the reduction it hides.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/comm/communicator.h"

namespace kilter::comm {

// "1K,64K,1M,16M,64M" -> bytes (K/M/G are powers of 1024; a plain number is bytes). Throws
// kilter::Error naming `option` on a malformed list.
std::vector<size_t> parse_byte_sizes(const std::string& list, const std::string& option);

struct BenchOptions {
  std::vector<size_t> sizes;             // bytes per message
  std::vector<std::string> algos;        // flat | hierarchical
  int ranks_per_node = 0;                // as comm.ranks_per_node
  int iters = 20;                        // timed reductions per round
  int warmup = 3;                        // untimed reductions before the first round
  int rounds = 3;                        // interleaved rounds; the fastest one is reported
  size_t bucket_bytes = 0;               // 0: each message is one bucket
  bool blocking = true;                  // stages with blocking (else nonblocking) collectives
  // Overlap study (when backward_ms > 0): compute per bucket and ready() calls per bucket.
  double backward_ms = 0;
  int ready_per_bucket = 4;
};

// nccl-tests formulas: algbw = bytes / time; allreduce busbw = algbw * 2(n-1)/n.
struct BenchRow {
  size_t bytes = 0;          // bytes reduced (the request rounded up to whole node shards)
  std::string algo;
  int ranks = 1, nodes = 1, ranks_per_node = 1;
  size_t buckets = 1;
  double time_us = 0, algbw_gbs = 0, busbw_gbs = 0;
  double mpi_time_us = 0, mpi_busbw_gbs = 0;  // one plain MPI_Allreduce of the same bytes
  double ratio = 0;                           // mpi_time_us / time_us (= busbw ratio)
  bool verified = false;
};

// Collective over `world`. Every rank returns the same rows.
std::vector<BenchRow> run_collective_bench(MPI_Comm world, const BenchOptions& opts);
nlohmann::json bench_rows_to_json(const std::vector<BenchRow>& rows);
std::string bench_rows_to_text(const std::vector<BenchRow>& rows, const BenchOptions& opts);

// Overlap study, per message size, algo and overlap engine: off, poll, thread (blocking
// collectives in the thread), thread-nb (nonblocking ones tested by the thread).
struct OverlapRow {
  size_t bytes = 0;
  std::string algo, mode;
  size_t buckets = 0;
  double backward_ms_per_bucket = 0;
  double compute_s = 0;       // the synthetic backward alone
  double reduce_alone_s = 0;  // the reduction alone (overlap off, nothing computing)
  double step_s = 0;          // backward + finish() in this mode
  double exposed_s = 0;       // finish() blocked (comm_exposed)
  double hidden_fraction = 0;      // 1 - exposed / reduce_alone
  double net_hidden_fraction = 0;  // (compute + reduce_alone - step) / reduce_alone: counts the
                                   // compute slowed down by communication too
  bool verified = false;
};
std::vector<OverlapRow> run_overlap_bench(MPI_Comm world, const BenchOptions& opts);
nlohmann::json overlap_rows_to_json(const std::vector<OverlapRow>& rows);
std::string overlap_rows_to_text(const std::vector<OverlapRow>& rows, const BenchOptions& opts);

}  // namespace kilter::comm
