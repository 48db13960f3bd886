// The one-GPU-per-rank check as a collective (check_one_device_per_rank, device_sharing.h): every
// rank's record travels to every rank intact, and every rank reaches the same verdict, so a
// refusal ends all ranks alike (none waits in a later collective). Records are made up here, so
// this runs without a GPU; the decision itself is tested in tests/unit/comm_device_sharing_test.cpp.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

#include "io/base/error.h"
#include "lib/comm/device_sharing.h"
#include "tests/mpi/comm_test_main.h"

namespace kilter::comm {
namespace {

using testing::global_failures;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

RankDevice record(const std::string& device) {
  RankDevice r;
  r.rank = world_rank();
  r.host = "node with spaces " + std::to_string(r.rank / 2);
  r.device = device;
  r.device_label = "cuda device 0 (fake GPU, " + device + ")";
  return r;
}

RankDevice sharing_record(const std::string& host_id) {
  RankDevice r = record("GPU-one");
  r.switch_set = true;
  r.switch_value = "1";
  r.nccl_hostid_set = true;
  r.nccl_hostid = host_id;
  return r;
}

// The refusal's message on this rank ("" and a failure when it was not refused).
std::string refusal_of(const RankDevice& mine) {
  try {
    check_one_device_per_rank(MPI_COMM_WORLD, mine);
  } catch (const Error& e) {
    EXPECT_TRUE(e.is_user_error()) << e.what();
    return e.message();
  }
  ADD_FAILURE() << "rank " << world_rank() << ": not refused";
  return "";
}

TEST(DeviceSharingCollective, DevicesOfTheirOwnPassOnEveryRank) {
  const std::string note = check_one_device_per_rank(MPI_COMM_WORLD, record("GPU-" + std::to_string(world_rank())));
  EXPECT_EQ(global_failures(!note.empty()), 0) << note;
}

TEST(DeviceSharingCollective, EveryRankRefusesASharedDevice) {
  // Every rank on one device, except the last on its own.
  const bool last = world_rank() == world_size() - 1;
  const std::string message = refusal_of(record(last ? "GPU-own" : "GPU-one"));
  const std::string sharing = "more ranks than GPUs: ranks 0-" + std::to_string(world_size() - 2) +
                              " share one GPU, cuda device 0 (fake GPU, GPU-one) on host node with spaces 0. ";
  EXPECT_EQ(global_failures(message.find(sharing) == std::string::npos), 0) << message;
}

TEST(DeviceSharingCollective, TheSwitchWithDistinctHostIdsPassesOnEveryRank) {
  const std::string note = check_one_device_per_rank(MPI_COMM_WORLD, sharing_record("kilter rank " + std::to_string(world_rank())));
  std::string ids;
  for (int r = 0; r < world_size(); ++r) ids += " 'kilter rank " + std::to_string(r) + "'";
  EXPECT_EQ(global_failures(note.find("as NCCL hosts" + ids) == std::string::npos), 0) << note;
}

TEST(DeviceSharingCollective, EveryRankRefusesARepeatedHostId) {
  const int rank = world_rank();
  const std::string message = refusal_of(sharing_record(rank == world_size() - 1 ? "kilter rank 0" : "kilter rank " + std::to_string(rank)));
  const std::string repeated = "ranks 0," + std::to_string(world_size() - 1) + " have the same NCCL_HOSTID 'kilter rank 0'";
  EXPECT_EQ(global_failures(message.find(repeated) == std::string::npos), 0) << message;
}

}  // namespace
}  // namespace kilter::comm
