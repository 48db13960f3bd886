// Topology from MPI (run on 4 ranks): 2 nodes x 2 via comm.ranks_per_node, the shared-memory
// split, a ranks_per_node that does not divide the world, the SLURM_NTASKS check and a
// non-uniform layout that must fall back to flat reduction and still sum correctly. The
// shared-memory split is checked against the hosts the ranks run on, so the same binary also
// runs across real (or namespaced: scripts/vcluster, tests/cluster) nodes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "io/base/error.h"
#include "lib/comm/communicator.h"
#include "tests/mpi/comm_test_main.h"

namespace kilter::comm {
namespace {

using testing::global_failures;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// World ranks of the members of `comm`, in comm rank order.
std::vector<int> members(MPI_Comm comm) {
  int n = 0;
  MPI_Comm_size(comm, &n);
  std::vector<int> out(size_t(n), -1);
  int me = world_rank();
  MPI_Allgather(&me, 1, MPI_INT, out.data(), 1, MPI_INT, comm);
  return out;
}

// Calls f on every rank and returns how many ranks caught a kilter::Error whose text holds
// `needle` (and how many threw nothing through `silent`).
template <class F>
long ranks_failing_with(const std::string& needle, F f, long* silent) {
  long ok = 0, quiet = 0;
  try {
    f();
    quiet = 1;
  } catch (const Error& e) {
    ok = std::string(e.what()).find(needle) != std::string::npos;
    if (!ok) ADD_FAILURE() << "message lacks '" << needle << "': " << e.what();
  }
  *silent = global_failures(quiet);
  return global_failures(ok);
}

TEST(CommTopology, TwoNodesOfTwoByRanksPerNode) {
  ASSERT_EQ(world_size(), 4) << "run this test on 4 ranks";
  Topology t = make_topology(MPI_COMM_WORLD, 2);
  const int r = world_rank();
  long bad = 0;
  bad += t.rank != r || t.size != 4;
  bad += t.local_rank != r % 2 || t.local_size != 2;
  bad += t.node_index != r / 2 || t.num_nodes != 2 || !t.uniform;
  bad += members(t.node) != std::vector<int>{2 * (r / 2), 2 * (r / 2) + 1};
  bad += members(t.cross) != std::vector<int>{r % 2, r % 2 + 2};
  EXPECT_EQ(global_failures(bad), 0);
  free_topology(t);
  EXPECT_EQ(t.node, MPI_COMM_NULL);
  EXPECT_EQ(t.cross, MPI_COMM_NULL);
}

TEST(CommTopology, OneRankPerNodeAndOneNode) {
  Topology each = make_topology(MPI_COMM_WORLD, 1);
  Topology one = make_topology(MPI_COMM_WORLD, world_size());
  long bad = 0;
  bad += each.local_size != 1 || each.local_rank != 0 || each.num_nodes != world_size() ||
         each.node_index != world_rank();
  bad += one.local_size != world_size() || one.local_rank != world_rank() || one.num_nodes != 1 || one.node_index != 0;
  EXPECT_EQ(global_failures(bad), 0);
  free_topology(each);
  free_topology(one);
}

// Every rank's host name (MPI_Get_processor_name), indexed by world rank.
std::vector<std::string> hosts_of_ranks() {
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int length = 0;
  MPI_Get_processor_name(name, &length);
  std::vector<char> all(size_t(world_size()) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                MPI_COMM_WORLD);
  std::vector<std::string> hosts;
  for (int r = 0; r < world_size(); ++r) hosts.emplace_back(&all[size_t(r) * MPI_MAX_PROCESSOR_NAME]);
  return hosts;
}

TEST(CommTopology, SharedMemorySplitGroupsRanksByHost) {
  Topology t = make_topology(MPI_COMM_WORLD, 0);
  const std::vector<std::string> hosts = hosts_of_ranks();
  const std::string& mine = hosts[size_t(world_rank())];
  std::vector<int> same_host;  // world ranks on this rank's host, ascending
  for (int r = 0; r < world_size(); ++r)
    if (hosts[size_t(r)] == mine) same_host.push_back(r);
  std::vector<std::string> distinct = hosts;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());

  long bad = 0;
  if (members(t.node) != same_host) {
    ADD_FAILURE() << "rank " << world_rank() << " on " << mine << ": node communicator does not hold exactly "
                  << "the ranks on this host";
    bad = 1;
  }
  if (t.num_nodes != int(distinct.size())) {
    ADD_FAILURE() << "num_nodes " << t.num_nodes << ", but the ranks run on " << distinct.size() << " host(s)";
    bad = 1;
  }
  // Cross-node communicator: one rank per host, all with this rank's local rank.
  const std::vector<int> cross = members(t.cross);
  std::vector<std::string> cross_hosts;
  for (int r : cross) cross_hosts.push_back(hosts[size_t(r)]);
  std::sort(cross_hosts.begin(), cross_hosts.end());
  if (t.uniform && cross_hosts != distinct) {
    ADD_FAILURE() << "cross-node communicator of rank " << world_rank() << " does not hold one rank per host";
    bad = 1;
  }
  EXPECT_EQ(global_failures(bad), 0);
  free_topology(t);
}

TEST(CommTopology, RanksPerNodeMustDivideTheWorld) {
  long silent = 0;
  const long named = ranks_failing_with("comm.ranks_per_node", [] { make_topology(MPI_COMM_WORLD, 3); }, &silent);
  EXPECT_EQ(named, world_size() % 3 ? world_size() : 0);
}

TEST(CommTopology, WorldSizeMustMatchSlurmTasks) {
  const char* saved = std::getenv("SLURM_NTASKS");
  const std::string saved_value = saved ? saved : "";
  setenv("SLURM_NTASKS", std::to_string(world_size() + 3).c_str(), 1);
  long silent = 0;
  const long named = ranks_failing_with("SLURM_NTASKS", [] { make_topology(MPI_COMM_WORLD, 0); }, &silent);
  EXPECT_EQ(named, world_size());
  setenv("SLURM_NTASKS", std::to_string(world_size()).c_str(), 1);
  Topology t = make_topology(MPI_COMM_WORLD, 0);  // matching count: accepted
  free_topology(t);
  if (saved)
    setenv("SLURM_NTASKS", saved_value.c_str(), 1);
  else
    unsetenv("SLURM_NTASKS");
}

TEST(CommTopology, NonUniformNodesFallBackToFlatReduction) {
  ASSERT_EQ(world_size(), 4) << "run this test on 4 ranks";
  const int r = world_rank();
  // Nodes {0,1,2} and {3}: a hierarchical reduce-scatter could not split a bucket evenly.
  Topology t = make_topology_from_node_ids(MPI_COMM_WORLD, r < 3 ? 7 : 2);
  long bad = 0;
  bad += t.uniform || t.num_nodes != 2 || t.node_index != (r < 3 ? 0 : 1);
  bad += t.local_size != (r < 3 ? 3 : 1);
  EXPECT_EQ(global_failures(bad), 0);

  // Hierarchical asked for, flat done: the sum is still exact. The buffer must be a multiple of
  // this rank's local size, so use one all local sizes divide.
  std::vector<float> grads(3 * 101);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = float((r + 1) * (i % 9));
  auto reducer = make_gradient_reducer(t, "mpi", "hierarchical", grads.data(), grads.size(), 64 * 4, true);
  reducer->begin();
  for (size_t end = grads.size(); end > 0;) {
    const size_t begin = end > 37 ? end - 37 : 0;
    reducer->ready(begin, end - begin);
    end = begin;
  }
  reducer->finish();
  long wrong = 0;
  for (size_t i = 0; i < grads.size(); ++i) wrong += grads[i] != float(10 * (i % 9));  // 1+2+3+4 = 10
  EXPECT_EQ(global_failures(wrong), 0);
  reducer.reset();
  free_topology(t);
}

}  // namespace
}  // namespace kilter::comm
