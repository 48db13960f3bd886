// The NCCL communicator on device buffers, bootstrapped through MPI: allreduce, reduce-scatter
// (out of place and in place), allgather and broadcast of rank-dependent integer-valued data
// (sums are exact), f32/f64/i64, and the error path of a collective on an aborted communicator;
// the parameter shards of train.shard = parameters (unit gathers of the fp32 parameters or of the
// bf16 working copy alone, reduce-scatters accumulated over micro-batches, HSDP's all-reduce
// across groups) on the same kind of data.
// Run under mpirun with one rank per GPU. Exit 77 (skipped) without a device, or when ranks
// would share a device (NCCL refuses that) outside the test layout of
// tests/gpu/ranks-on-one-gpu.sh (KILTER_TEST_SHARE_DEVICE=1 and an NCCL host id per rank), where
// tests/gpu/nccl-check.sh runs it on one GPU; the MPI-free GPU machine does not build it.
// GoogleTest: every rank runs the same tests on one communicator made in main (rank 0 prints
// them); each check fails the rank's test, and rank 0 prints the sum over ranks last,
// "kilter_gpu_nccl_test: <n> failure(s)", which nccl-check.sh reads.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "io/base/cuda_common.h"
#include "lib/backend/cuda_model.h"
#include "lib/comm/nccl_communicator.h"
#include "lib/comm/unit_chunks.h"
#include "lib/model/layout.h"
#include "lib/model/model.h"
#include "lib/train/param_shards_nccl.h"

namespace {

int failures = 0;
kilter::comm::Communicator* the_comm = nullptr;  // made in main, for every test

void expect(bool ok, const std::string& what, int rank) {
  if (!ok) ++failures;
  if (!ok || rank == 0) std::printf("  %-4s rank %d: %s\n", ok ? "ok" : "FAIL", rank, what.c_str());
  EXPECT_TRUE(ok) << "rank " << rank << ": " << what;
}

template <typename T>
T* to_device(const std::vector<T>& host) {
  T* ptr = nullptr;
  KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr), sizeof(T) * host.size()));
  KILTER_CUDA_CHECK(cudaMemcpy(ptr, host.data(), sizeof(T) * host.size(), cudaMemcpyHostToDevice));
  KILTER_CUDA_CHECK(cudaDeviceSynchronize());
  return ptr;
}

template <typename T>
std::vector<T> to_host(const T* ptr, size_t n) {
  std::vector<T> host(n);
  KILTER_CUDA_CHECK(cudaDeviceSynchronize());
  KILTER_CUDA_CHECK(cudaMemcpy(host.data(), ptr, sizeof(T) * n, cudaMemcpyDeviceToHost));
  return host;
}

template <typename T>
void check_collectives(kilter::comm::Communicator& comm, kilter::comm::DType dtype, const char* name) {
  const int rank = comm.rank(), size = comm.size();
  const size_t count = 1000003;  // odd: no alignment luck
  std::vector<T> data(count * size);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<T>((rank + 1) * static_cast<int>(i % 97));
  T* buf = to_device(data);
  comm.iallreduce(buf, data.size(), dtype)->wait();
  std::vector<T> reduced = to_host(buf, data.size());
  bool ok = true;
  const int rank_sum = size * (size + 1) / 2;
  for (size_t i = 0; i < reduced.size(); ++i) ok &= reduced[i] == static_cast<T>(rank_sum * static_cast<int>(i % 97));
  expect(ok, std::string("allreduce ") + name, rank);

  T* send = to_device(data);
  T* recv = nullptr;
  KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&recv), sizeof(T) * count));
  auto request = comm.ireduce_scatter(send, recv, count, dtype);
  while (!request->test()) {
  }
  std::vector<T> shard = to_host(recv, count);
  ok = true;
  for (size_t i = 0; i < count; ++i)
    ok &= shard[i] == static_cast<T>(rank_sum * static_cast<int>((rank * count + i) % 97));
  expect(ok, std::string("reduce_scatter (test() polling) ") + name, rank);

  // In place: the result lands in this rank's own block.
  comm.ireduce_scatter(send, send + rank * count, count, dtype)->wait();
  std::vector<T> in_place = to_host(send + rank * count, count);
  expect(in_place == shard, std::string("reduce_scatter in place ") + name, rank);

  std::vector<T> gathered_expected(count * size);
  for (int r = 0; r < size; ++r)
    for (size_t i = 0; i < count; ++i) gathered_expected[r * count + i] = static_cast<T>(r * 1000 + static_cast<int>(i % 89));
  std::vector<T> mine(gathered_expected.begin() + rank * count, gathered_expected.begin() + (rank + 1) * count);
  T* mine_device = to_device(mine);
  comm.iallgather(mine_device, buf, count, dtype)->wait();
  expect(to_host(buf, count * size) == gathered_expected, std::string("allgather ") + name, rank);
  cudaFree(buf);
  cudaFree(send);
  cudaFree(recv);
  cudaFree(mine_device);
}

TEST(NcclCommunicator, CollectivesF32) {
  check_collectives<float>(*the_comm, kilter::comm::DType::f32, "f32");
}

TEST(NcclCommunicator, CollectivesF64) {
  check_collectives<double>(*the_comm, kilter::comm::DType::f64, "f64");
}

TEST(NcclCommunicator, CollectivesI64) {
  check_collectives<int64_t>(*the_comm, kilter::comm::DType::i64, "i64");
}

TEST(NcclCommunicator, BroadcastFromTheLastRank) {
  const int rank = the_comm->rank(), size = the_comm->size();
  std::vector<float> value(17, rank == size - 1 ? 42.0f : 0.0f);
  float* device_value = to_device(value);
  the_comm->broadcast(device_value, sizeof(float) * value.size(), size - 1);
  expect(to_host(device_value, value.size()) == std::vector<float>(17, 42.0f), "broadcast from the last rank", rank);
  cudaFree(device_value);
}

// The NCCL parameter shards (lib/train/param_shards_nccl.h) on a small GPT-2's units, in groups
// of `group` consecutive ranks (the world, or HSDP with the chunks all-reduced across the groups):
// integer-valued data, so every gather and sum is exact. working_copy: the model keeps the fp32
// master (bf16 storage under parameters), so the units gather a bf16 working copy alone, bit for
// bit, and the fp32 ranges asked for (the norms' tensors) stay backed and keep what was written.
void check_param_shards(int group, bool working_copy) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm shard_group = MPI_COMM_WORLD, replicas = MPI_COMM_NULL;
  if (group < size) {
    MPI_Comm_split(MPI_COMM_WORLD, rank / group, rank, &shard_group);
    MPI_Comm_split(MPI_COMM_WORLD, rank % group, rank, &replicas);
  }
  const kilter::model::ModelSpec spec{3, 4, 48, 32, 101};
  const auto layout = kilter::model::ParamLayout::build(spec, size_t(size) * 64);
  const size_t n = layout.padded_size;
  const auto chunks = kilter::comm::UnitChunks::of(layout, group, rank % group);
  std::vector<char> mine(n, 0);
  for (const auto& r : chunks.owned())
    for (size_t i = r.offset; i < r.offset + r.count; ++i) mine[i] = 1;
  const std::string where =
      " (groups of " + std::to_string(group) + (working_copy ? ", the bf16 working copy gathered)" : ")");
  // The gathered value at parameter offset i: an fp32 parameter, or a bf16 copy's bits (below the
  // NaN patterns, 0x7f80 and up).
  auto value_at = [](size_t i) { return uint16_t(i % 1013); };
  {
    // The shards own the buffers (sparsely backed: only this rank's chunks until a unit is in use).
    auto shards = kilter::train::make_nccl_param_shards(shard_group, replicas, layout,
                                                        /*reshard_after_forward=*/true, 60.0);
    float* device_params = shards->params_storage();
    float* device_grads = shards->grads_storage();
    const std::vector<kilter::model::ParamRange> norms = kilter::model::norm_tensor_ranges(layout);
    uint16_t* device_copy =
        working_copy ? static_cast<uint16_t*>(shards->working_copy_storage(sizeof(uint16_t), norms)) : nullptr;
    for (const auto& r : chunks.owned()) {
      std::vector<float> values(r.count);
      std::vector<uint16_t> bits(r.count);
      for (size_t i = 0; i < r.count; ++i) values[i] = float(bits[i] = value_at(r.offset + i));
      if (working_copy)
        KILTER_CUDA_CHECK(cudaMemcpy(device_copy + r.offset, bits.data(), sizeof(uint16_t) * r.count,
                                     cudaMemcpyHostToDevice));
      else
        KILTER_CUDA_CHECK(cudaMemcpy(device_params + r.offset, values.data(), sizeof(float) * r.count,
                                     cudaMemcpyHostToDevice));
    }
    // The norms' fp32 tensors the model widens from the copy: backed for good.
    if (working_copy)
      for (const auto& r : norms) {
        const std::vector<float> values(r.count, float(rank + 1));
        KILTER_CUDA_CHECK(cudaMemcpy(device_params + r.offset, values.data(), sizeof(float) * r.count,
                                     cudaMemcpyHostToDevice));
      }
    const int units = chunks.num_units();
    bool whole = true, regathered = true;
    // Two micro-batches, each a forward (every unit gathered whole, the first prefetched, blocks
    // released after use) and a backward (each unit's gradient written after its need, as the
    // model's kernels would, then reduce-scattered): the chunks accumulate both reduced sums.
    for (int pass = 0; pass < 2; ++pass) {
      shards->prefetch(1);
      for (int u = 0; u < units; ++u) {
        const bool gathered = shards->need(u);
        if (pass == 1 && u > 0) regathered &= gathered;
        KILTER_CUDA_CHECK(cudaDeviceSynchronize());
        const auto& c = chunks.unit(u);
        if (working_copy) {
          const std::vector<uint16_t> got = to_host(device_copy + c.offset, c.count);
          for (size_t i = 0; i < c.count; ++i) whole &= got[i] == value_at(c.offset + i);
        } else {
          const std::vector<float> got = to_host(device_params + c.offset, c.count);
          for (size_t i = 0; i < c.count; ++i) whole &= got[i] == float(value_at(c.offset + i));
        }
        shards->forward_done(u);
      }
      for (int u = units - 1; u >= 0; --u) {
        shards->need(u);
        KILTER_CUDA_CHECK(cudaDeviceSynchronize());
        const auto& c = chunks.unit(u);
        std::vector<float> g = to_host(device_grads + c.offset, c.count);
        for (size_t i = 0; i < c.count; ++i) g[i] += float((rank + 1) * int((c.offset + i) % 7));
        KILTER_CUDA_CHECK(cudaMemcpy(device_grads + c.offset, g.data(), sizeof(float) * c.count,
                                     cudaMemcpyHostToDevice));
        KILTER_CUDA_CHECK(cudaDeviceSynchronize());
        shards->grads_final(u);
      }
      shards->pass_done();
    }
    shards->finish();
    shards->release_all();  // every unit's pages given back: outside the chunks reads the zeroed scratch page
    KILTER_CUDA_CHECK(cudaDeviceSynchronize());
    expect(whole, "parameter units all-gathered whole" + where, rank);
    if (working_copy) {
      bool kept = true;
      for (const auto& r : norms)
        for (float v : to_host(device_params + r.offset, r.count)) kept &= v == float(rank + 1);
      expect(kept, "the norms' fp32 tensors kept through the gathers and releases" + where, rank);
    }
    expect(regathered, "units released after each pass and gathered again" + where, rank);
    const std::vector<float> reduced = to_host(device_grads, n);
    // Per float: the sum of (rank + 1) over the group's ranks (the reduce-scatter), then over the
    // groups (finish's all-reduce under HSDP): over every rank either way.
    const int rank_sum = size * (size + 1) / 2;
    bool summed = true;
    for (size_t i = 0; i < n; ++i)
      summed &= mine[i] ? reduced[i] == float(2 * rank_sum * int(i % 7)) : reduced[i] == 0.0f;
    expect(summed, "gradient chunks reduce-scattered and accumulated over two micro-batches" + where, rank);
  }
  if (group < size) MPI_Comm_free(&shard_group), MPI_Comm_free(&replicas);
}

TEST(NcclParamShards, GatherAndReduceScatterOverTheWorld) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  check_param_shards(size, false);
}

TEST(NcclParamShards, GroupsOfTwoAcrossReplicas) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 4 || size % 2 != 0) GTEST_SKIP() << "HSDP needs 4 or more ranks in pairs";
  check_param_shards(2, false);
}

// bf16 storage: the working copy gathered alone, the gradients reduce-scattered in fp32 as above.
TEST(NcclParamShards, WorkingCopyGatheredAlone) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  check_param_shards(size, true);
  if (size >= 4 && size % 2 == 0) check_param_shards(2, true);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  kilter::set_error_rank(rank);
  if (rank != 0) delete ::testing::UnitTest::GetInstance()->listeners().Release(
      ::testing::UnitTest::GetInstance()->listeners().default_result_printer());
  const std::string reason = kilter::backend::cuda_device_absent_reason();
  int devices = 0;
  if (reason.empty()) cudaGetDeviceCount(&devices);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int local_size = 1;
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  const char* share_device = std::getenv("KILTER_TEST_SHARE_DEVICE");
  const bool one_gpu_layout = share_device != nullptr && std::string(share_device) == "1";
  if (!reason.empty() || (local_size > devices && !one_gpu_layout)) {
    if (rank == 0)
      std::printf("SKIPPED: no CUDA device (%s)\n",
                  reason.empty() ? (std::to_string(local_size) + " ranks per node share " + std::to_string(devices) +
                                    " device(s); NCCL needs one device per rank").c_str()
                                 : reason.c_str());
    MPI_Finalize();
    return 77;
  }
  int rc = 0;
  try {
    auto comm = kilter::comm::make_nccl_communicator(MPI_COMM_WORLD, 60.0);
    if (rank == 0) std::printf("%s, %d rank(s)\n", kilter::comm::nccl_version_string().c_str(), size);
    the_comm = comm.get();
    rc = RUN_ALL_TESTS();
    the_comm = nullptr;
  } catch (const std::exception& e) {
    std::printf("FAIL rank %d: %s\n", rank, e.what());
    ++failures;
  }
  if (rc != 0 && failures == 0) ++failures;  // a test failed outside expect() (an exception)
  int total_failures = 0;
  MPI_Allreduce(&failures, &total_failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) std::printf("kilter_gpu_nccl_test: %d failure(s)\n", total_failures);
  MPI_Finalize();
  return total_failures == 0 ? 0 : 1;
}
