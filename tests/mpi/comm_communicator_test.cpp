// The MPI Communicator on any number of ranks: every collective, nonblocking and blocking, in
// place and not, for each element type, checked against sums computed locally; and the
// selection point's errors.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "io/base/error.h"
#include "lib/comm/communicator.h"
#include "tests/mpi/comm_test_main.h"

namespace kilter::comm {
namespace {

using testing::global_failures;

struct World {
  int rank = 0, size = 1;
  World() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
};

// Rank-dependent integer test data; sums of these are exact in every type.
template <class T>
T value(int rank, size_t i) {
  return T(int((i * 7 + size_t(rank) * 13) % 23) - 11);
}
template <class T>
T summed(int size, size_t i) {
  T s = 0;
  for (int r = 0; r < size; ++r) s += value<T>(r, i);
  return s;
}

template <class T>
long check_allreduce(Communicator& c, DType t, bool blocking) {
  World w;
  const size_t n = 1001;
  std::vector<T> buf(n);
  for (size_t i = 0; i < n; ++i) buf[i] = value<T>(w.rank, i);
  if (blocking) {
    c.allreduce(buf.data(), n, t);
  } else {
    auto request = c.iallreduce(buf.data(), n, t);
    while (!request->test()) {
    }
    EXPECT_TRUE(request->test());  // stays complete
  }
  long bad = 0;
  for (size_t i = 0; i < n; ++i) bad += buf[i] != summed<T>(w.size, i);
  return bad;
}

template <class T>
long check_reduce_scatter(Communicator& c, DType t, bool in_place, bool blocking) {
  World w;
  const size_t block = 37;
  std::vector<T> send(block * size_t(w.size)), out(block);
  for (size_t i = 0; i < send.size(); ++i) send[i] = value<T>(w.rank, i);
  T* recv = in_place ? send.data() + size_t(w.rank) * block : out.data();
  if (blocking)
    c.reduce_scatter(send.data(), recv, block, t);
  else
    c.ireduce_scatter(send.data(), recv, block, t)->wait();
  long bad = 0;
  for (size_t i = 0; i < block; ++i) bad += recv[i] != summed<T>(w.size, size_t(w.rank) * block + i);
  return bad;
}

template <class T>
long check_allgather(Communicator& c, DType t, bool in_place, bool blocking) {
  World w;
  const size_t block = 29;
  std::vector<T> recv(block * size_t(w.size), T(-99)), own(block);
  T* send = in_place ? recv.data() + size_t(w.rank) * block : own.data();
  for (size_t i = 0; i < block; ++i) send[i] = value<T>(w.rank, i);
  if (blocking)
    c.allgather(send, recv.data(), block, t);
  else
    c.iallgather(send, recv.data(), block, t)->wait();
  long bad = 0;
  for (int r = 0; r < w.size; ++r)
    for (size_t i = 0; i < block; ++i) bad += recv[size_t(r) * block + i] != value<T>(r, i);
  return bad;
}

TEST(CommCommunicator, RankAndSize) {
  World w;
  auto c = make_communicator("mpi", MPI_COMM_WORLD);
  EXPECT_EQ(c->rank(), w.rank);
  EXPECT_EQ(c->size(), w.size);
}

TEST(CommCommunicator, AllreduceEveryTypeBlockingAndNot) {
  auto c = make_communicator("mpi", MPI_COMM_WORLD);
  for (bool blocking : {false, true}) {
    EXPECT_EQ(global_failures(check_allreduce<float>(*c, DType::f32, blocking)), 0) << blocking;
    EXPECT_EQ(global_failures(check_allreduce<double>(*c, DType::f64, blocking)), 0) << blocking;
    EXPECT_EQ(global_failures(check_allreduce<int64_t>(*c, DType::i64, blocking)), 0) << blocking;
  }
}

TEST(CommCommunicator, ReduceScatterInPlaceAndNot) {
  auto c = make_communicator("mpi", MPI_COMM_WORLD);
  for (bool blocking : {false, true})
    for (bool in_place : {false, true}) {
      EXPECT_EQ(global_failures(check_reduce_scatter<float>(*c, DType::f32, in_place, blocking)), 0)
          << "in_place " << in_place << " blocking " << blocking;
      EXPECT_EQ(global_failures(check_reduce_scatter<int64_t>(*c, DType::i64, in_place, blocking)), 0)
          << "in_place " << in_place << " blocking " << blocking;
    }
}

TEST(CommCommunicator, AllgatherInPlaceAndNot) {
  auto c = make_communicator("mpi", MPI_COMM_WORLD);
  for (bool blocking : {false, true})
    for (bool in_place : {false, true}) {
      EXPECT_EQ(global_failures(check_allgather<float>(*c, DType::f32, in_place, blocking)), 0)
          << "in_place " << in_place << " blocking " << blocking;
      EXPECT_EQ(global_failures(check_allgather<double>(*c, DType::f64, in_place, blocking)), 0)
          << "in_place " << in_place << " blocking " << blocking;
    }
}

TEST(CommCommunicator, BroadcastFromEveryRoot) {
  World w;
  auto c = make_communicator("mpi", MPI_COMM_WORLD);
  long bad = 0;
  for (int root = 0; root < w.size; ++root) {
    std::vector<char> bytes(333, char(w.rank));
    c->broadcast(bytes.data(), bytes.size(), root);
    for (char b : bytes) bad += b != char(root);
  }
  EXPECT_EQ(global_failures(bad), 0);
}

TEST(CommCommunicator, SeveralRequestsInFlightCompleteInAnyWaitOrder) {
  World w;
  auto c = make_communicator("mpi", MPI_COMM_WORLD);
  std::vector<std::vector<float>> bufs(4, std::vector<float>(513));
  std::vector<std::unique_ptr<Request>> requests;
  for (size_t k = 0; k < bufs.size(); ++k) {
    for (size_t i = 0; i < bufs[k].size(); ++i) bufs[k][i] = value<float>(w.rank, i + k);
    requests.push_back(c->iallreduce(bufs[k].data(), bufs[k].size(), DType::f32));
  }
  for (size_t k = requests.size(); k-- > 0;) requests[k]->wait();
  long bad = 0;
  for (size_t k = 0; k < bufs.size(); ++k)
    for (size_t i = 0; i < bufs[k].size(); ++i) bad += bufs[k][i] != summed<float>(w.size, i + k);
  EXPECT_EQ(global_failures(bad), 0);
}

TEST(CommCommunicator, SelectionRefusesUnknownKinds) {
  EXPECT_THROW(make_communicator("gloo", MPI_COMM_WORLD), Error);
#ifndef KILTER_WITH_NCCL
  try {
    make_communicator("nccl", MPI_COMM_WORLD);
    ADD_FAILURE() << "nccl accepted without KILTER_WITH_NCCL";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nccl"), std::string::npos) << e.what();
  }
#endif
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
}

}  // namespace
}  // namespace kilter::comm
