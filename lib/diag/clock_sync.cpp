// Ping-pong clock alignment to rank 0 (see clock_sync.h). Runs once per run, so rank 0 serving
// the ranks one after the other (P x rounds round trips of a few microseconds) is cheap enough.
#include "lib/diag/clock_sync.h"

#include <limits>

#include "io/base/error.h"
#include "io/base/mpi_check.h"

namespace kilter::diag {

namespace {
constexpr int kTagPing = 7101;
constexpr int kTagPong = 7102;
constexpr int kTagOffset = 7103;
constexpr const char* kWhat = "diagnostics clock alignment: ";  // what a failed call's message names first
}  // namespace

ClockAlignment align_clocks(MPI_Comm comm, int rounds) {
  int rank = 0, size = 1;
  KILTER_MPI_CHECK(MPI_Comm_rank(comm, &rank), kWhat << "MPI_Comm_rank");
  KILTER_MPI_CHECK(MPI_Comm_size(comm, &size), kWhat << "MPI_Comm_size");
  ClockAlignment out;
  if (rank == 0) {
    for (int peer = 1; peer < size; ++peer) {
      int64_t best_rtt = std::numeric_limits<int64_t>::max(), best_offset = 0;
      for (int i = 0; i < rounds; ++i) {
        int64_t t0 = steady_now_ns();
        KILTER_MPI_CHECK(MPI_Send(&t0, 1, MPI_INT64_T, peer, kTagPing, comm), kWhat << "MPI_Send");
        int64_t t_peer = 0;
        KILTER_MPI_CHECK(MPI_Recv(&t_peer, 1, MPI_INT64_T, peer, kTagPong, comm, MPI_STATUS_IGNORE),
                         kWhat << "MPI_Recv");
        int64_t t1 = steady_now_ns();
        // The peer read its clock half-way through the round trip (symmetric links assumed).
        if (t1 - t0 < best_rtt) {
          best_rtt = t1 - t0;
          best_offset = t0 + (t1 - t0) / 2 - t_peer;
        }
      }
      int64_t reply[2] = {best_offset, best_rtt};
      KILTER_MPI_CHECK(MPI_Send(reply, 2, MPI_INT64_T, peer, kTagOffset, comm), kWhat << "MPI_Send");
    }
  } else {
    for (int i = 0; i < rounds; ++i) {
      int64_t t0 = 0;
      KILTER_MPI_CHECK(MPI_Recv(&t0, 1, MPI_INT64_T, 0, kTagPing, comm, MPI_STATUS_IGNORE), kWhat << "MPI_Recv");
      int64_t now = steady_now_ns();
      KILTER_MPI_CHECK(MPI_Send(&now, 1, MPI_INT64_T, 0, kTagPong, comm), kWhat << "MPI_Send");
    }
    int64_t reply[2] = {0, 0};
    KILTER_MPI_CHECK(MPI_Recv(reply, 2, MPI_INT64_T, 0, kTagOffset, comm, MPI_STATUS_IGNORE), kWhat << "MPI_Recv");
    out.offset_ns = reply[0];
    out.best_rtt_ns = reply[1];
  }
  int64_t start = rank == 0 ? steady_now_ns() : 0;
  KILTER_MPI_CHECK(MPI_Bcast(&start, 1, MPI_INT64_T, 0, comm), kWhat << "MPI_Bcast");
  out.run_start_ns = start;
  return out;
}

}  // namespace kilter::diag
