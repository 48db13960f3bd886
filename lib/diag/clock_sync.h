// Clock alignment across ranks: each rank's steady clock is offset to rank 0's by a ping-pong
// exchange (the round trip with the smallest time wins, as in NTP's best-sample filter), so
// arrival times at the gradient collective compare across nodes.
#pragma once
#include <mpi.h>

#include <chrono>
#include <cstdint>

namespace kilter::diag {

inline int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct ClockAlignment {
  int64_t offset_ns = 0;      // add to this rank's steady_now_ns() to get rank 0's clock
  int64_t best_rtt_ns = 0;    // round trip of the sample used (0 on rank 0); error <= rtt / 2
  int64_t run_start_ns = 0;   // rank 0's clock when the alignment finished, shared by all ranks
};

// Collective over `comm`: rank 0 exchanges `rounds` ping-pongs with every other rank in turn.
ClockAlignment align_clocks(MPI_Comm comm, int rounds = 16);

}  // namespace kilter::diag
