// The node / cross-node layout of the ranks (docs/design.md, "Communication"): which ranks share a
// node (MPI_Comm_split_type SHARED, or `comm.ranks_per_node` consecutive ranks so one machine can
// stand in for several nodes), the communicator of ranks with the same local rank, and the checks
// that keep a hierarchical reduction honest (uniform nodes, the launcher's task count).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "io/base/error.h"
#include "io/base/mpi_check.h"
#include "lib/comm/communicator.h"

namespace kilter::comm {

namespace {

// Under Slurm, a world smaller than the allocation's task count usually means a launch that
// lost ranks (or an mpirun that ignored the allocation); training on fewer ranks would silently
// change nothing but speed, so it is refused.
void check_slurm_task_count(int world_size) {
  const char* ntasks = std::getenv("SLURM_NTASKS");
  if (!ntasks || !*ntasks) return;
  char* end = nullptr;
  long expected = std::strtol(ntasks, &end, 10);
  KILTER_CHECK(end && *end == '\0' && expected > 0,
               "environment variable SLURM_NTASKS = '" << ntasks << "' is not a positive integer");
  KILTER_CHECK(expected == world_size,
               "MPI world size " << world_size << " differs from SLURM_NTASKS = " << expected
                                 << ": launch with srun (or mpirun -np " << expected
                                 << ") inside the allocation, or unset SLURM_NTASKS");
}

}  // namespace

Topology make_topology_from_node_ids(MPI_Comm world, int node_id) {
  Topology topo;
  topo.world = world;
  KILTER_MPI_CHECK(MPI_Comm_rank(world, &topo.rank), "MPI_Comm_rank(world)");
  KILTER_MPI_CHECK(MPI_Comm_size(world, &topo.size), "MPI_Comm_size(world)");
  KILTER_CHECK(node_id >= 0, "node id " << node_id << " of rank " << topo.rank << " must be >= 0");

  KILTER_MPI_CHECK(MPI_Comm_split(world, node_id, topo.rank, &topo.node), "MPI_Comm_split(node)");
  KILTER_MPI_CHECK(MPI_Comm_rank(topo.node, &topo.local_rank), "MPI_Comm_rank(node)");
  KILTER_MPI_CHECK(MPI_Comm_size(topo.node, &topo.local_size), "MPI_Comm_size(node)");
  KILTER_MPI_CHECK(MPI_Comm_split(world, topo.local_rank, topo.rank, &topo.cross),
                   "MPI_Comm_split(cross)");

  // Every rank learns every rank's node id and node size; nodes are numbered by their lowest
  // world rank so the numbering does not depend on the ids the caller chose.
  std::vector<int> mine = {node_id, topo.local_size};
  std::vector<int> all(2 * size_t(topo.size));
  KILTER_MPI_CHECK(MPI_Allgather(mine.data(), 2, MPI_INT, all.data(), 2, MPI_INT, world),
                   "MPI_Allgather(node ids)");
  std::vector<int> node_order;  // node ids in order of their first rank
  bool uniform = true;
  for (int r = 0; r < topo.size; ++r) {
    const int id = all[2 * size_t(r)];
    if (std::find(node_order.begin(), node_order.end(), id) == node_order.end()) node_order.push_back(id);
    if (all[2 * size_t(r) + 1] != all[1]) uniform = false;
  }
  topo.num_nodes = int(node_order.size());
  topo.node_index = int(std::find(node_order.begin(), node_order.end(), node_id) - node_order.begin());
  topo.uniform = uniform;

  if (!uniform && topo.rank == 0) {
    std::string sizes;
    for (int n = 0; n < topo.num_nodes; ++n) {
      int count = 0;
      for (int r = 0; r < topo.size; ++r) count += all[2 * size_t(r)] == node_order[size_t(n)];
      sizes += (n ? "," : "") + std::to_string(count);
    }
    std::fprintf(stderr,
                 "kilter: warning: nodes hold different numbers of ranks (%s); hierarchical "
                 "reduction needs equal nodes, so gradients are reduced flat\n",
                 sizes.c_str());
  }
  return topo;
}

Topology make_topology(MPI_Comm world, int ranks_per_node) {
  int rank = 0, size = 1;
  KILTER_MPI_CHECK(MPI_Comm_rank(world, &rank), "MPI_Comm_rank(world)");
  KILTER_MPI_CHECK(MPI_Comm_size(world, &size), "MPI_Comm_size(world)");
  // Both checks depend only on values every rank sees alike, so every rank fails together and
  // none is left waiting in a collective.
  check_slurm_task_count(size);
  KILTER_CHECK(ranks_per_node >= 0, "config key comm.ranks_per_node = " << ranks_per_node << ": must be >= 0");
  KILTER_CHECK(ranks_per_node == 0 || size % ranks_per_node == 0,
               "config key comm.ranks_per_node = " << ranks_per_node << " does not divide the MPI world size "
                                                   << size);

  int node_id = 0;
  if (ranks_per_node > 0) {
    node_id = rank / ranks_per_node;
  } else {
    // The shared-memory split names no node; its lowest world rank does.
    MPI_Comm shared = MPI_COMM_NULL;
    KILTER_MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared),
                     "MPI_Comm_split_type(SHARED)");
    KILTER_MPI_CHECK(MPI_Allreduce(&rank, &node_id, 1, MPI_INT, MPI_MIN, shared),
                     "MPI_Allreduce(node leader)");
    MPI_Comm_free(&shared);
  }
  return make_topology_from_node_ids(world, node_id);
}

void free_topology(Topology& topo) {
  if (topo.node != MPI_COMM_NULL) MPI_Comm_free(&topo.node);
  if (topo.cross != MPI_COMM_NULL) MPI_Comm_free(&topo.cross);
  topo.node = MPI_COMM_NULL;
  topo.cross = MPI_COMM_NULL;
}

}  // namespace kilter::comm
