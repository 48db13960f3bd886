// Node-local staging orchestration (see staging.h).
#include "lib/train/staging.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "io/base/error.h"

namespace kilter::train {

std::string stage_dataset(const io::DatasetIndex& index, const std::string& stage_dir,
                          MPI_Comm node_comm, int local_rank, io::StageReport* report) {
  if (stage_dir.empty()) return index.dir;  // read in place: nothing to agree on

  // Local rank 0 copies; its outcome (a failure message, or the figures) goes to the others.
  io::StageReport result;
  std::string failure;
  if (local_rank == 0) {
    try {
      result = io::stage_shards(index, stage_dir);
    } catch (const Error& e) {
      failure = e.message();
    } catch (const std::exception& e) {
      failure = std::string("staging into ") + stage_dir + " failed: " + e.what();
    }
  }
  uint64_t failure_length = failure.size();
  MPI_Bcast(&failure_length, 1, MPI_UINT64_T, 0, node_comm);
  failure.resize(failure_length);
  if (failure_length > 0) MPI_Bcast(&failure[0], int(failure_length), MPI_CHAR, 0, node_comm);
  KILTER_CHECK(failure.empty(), (local_rank == 0 ? "" : "node-local staging failed on this node's "
                                                        "rank 0: ") << failure);

  // One line per node, from the rank that copied: on a cluster it shows which nodes copied and
  // which found a verified copy left by an earlier job.
  if (local_rank == 0) {
    char host[256] = {0};
    if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "?");
    std::fprintf(stderr,
                 "kilter: staged %s on %s: %u shards copied, %u reused, %u replaced (%llu bytes in %.2f s), "
                 "all verified\n",
                 stage_dir.c_str(), host, result.shards_copied, result.shards_reused, result.shards_replaced,
                 (unsigned long long)result.bytes_copied, result.seconds);
  }

  uint64_t figures[4] = {result.shards_copied, result.shards_reused, result.shards_replaced,
                         result.bytes_copied};
  double seconds = result.seconds;
  MPI_Bcast(figures, 4, MPI_UINT64_T, 0, node_comm);
  MPI_Bcast(&seconds, 1, MPI_DOUBLE, 0, node_comm);
  if (report) {
    report->dir = stage_dir;
    report->shards_copied = uint32_t(figures[0]);
    report->shards_reused = uint32_t(figures[1]);
    report->shards_replaced = uint32_t(figures[2]);
    report->bytes_copied = figures[3];
    report->seconds = seconds;
  }
  return stage_dir;
}

}  // namespace kilter::train
