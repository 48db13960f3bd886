// The gradient reducer on 1, 2 and 4 ranks (and 4 as 2 nodes x 2 with --ranks-per-node 2):
// flat == hierarchical == one plain MPI_Allreduce, exactly for integer-valued gradients and to
// float tolerance for random ones; odd sizes, several buckets, padding the model never reports,
// ranges arriving high-to-low, low-to-high or not at all, overlap off / poll / thread, and
// several steps through one reducer; the sharded (ZeRO-1) reduction and its parameter gather; the
// bound on buckets in flight over MPI and the reduce-scatter temporaries the memory plan prices.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "io/base/error.h"
#include "lib/comm/communicator.h"
#include "tests/mpi/comm_test_main.h"

namespace kilter::comm {
namespace {

using testing::global_failures;

enum class ReadyOrder { high_to_low, low_to_high, none };

struct Case {
  std::string algo;
  OverlapMode mode;
  bool blocking;        // stages with blocking collectives (off and thread modes)
  size_t shards;        // padded_size = shards * local_size
  size_t unreported;    // trailing padding elements the model never reports
  size_t bucket_bytes;
  ReadyOrder order;
};

std::string describe(const Case& c) {
  return c.algo + "/" + overlap_mode_name(c.mode) + (c.blocking ? "/blocking" : "/nonblocking") + " shards=" + std::to_string(c.shards) +
         " unreported=" + std::to_string(c.unreported) + " bucket_bytes=" + std::to_string(c.bucket_bytes) +
         " order=" + std::to_string(int(c.order));
}

class ReducerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    topo_ = make_topology(MPI_COMM_WORLD, testing::ranks_per_node_arg());
  }
  void TearDown() override { free_topology(topo_); }

  // Reports [0, reported) in irregular tensor-like pieces, as a model's backward would.
  static void report(GradientReducer& reducer, size_t reported, ReadyOrder order, uint64_t seed) {
    if (order == ReadyOrder::none) return;
    std::mt19937_64 rng(seed);  // same on every rank: the model is the same everywhere
    std::vector<std::pair<size_t, size_t>> pieces;
    for (size_t begin = 0; begin < reported;) {
      const size_t len = std::min<size_t>(reported - begin, 1 + rng() % 700);
      pieces.emplace_back(begin, len);
      begin += len;
    }
    if (order == ReadyOrder::high_to_low)
      for (size_t k = pieces.size(); k-- > 0;) reducer.ready(pieces[k].first, pieces[k].second);
    else
      for (const auto& p : pieces) reducer.ready(p.first, p.second);
  }

  // Runs `steps` reductions of integer-valued gradients through one reducer, checks each
  // against the exact sum and against MPI_Allreduce. Returns this rank's mismatches.
  long run_integer_case(const Case& c, int steps) {
    const size_t padded = c.shards * size_t(topo_.local_size);
    const size_t reported = padded - std::min(padded, c.unreported);
    std::vector<float> grads(padded), reference(padded);
    ReducerOptions opts;
    opts.algo = c.algo;
    opts.overlap = c.mode;
    opts.blocking_collectives = c.blocking;
    opts.bucket_bytes = c.bucket_bytes;
    opts.reported_size = reported;
    auto reducer = make_gradient_reducer(topo_, grads.data(), padded, opts);
    long bad = 0;
    for (int step = 0; step < steps; ++step) {
      for (size_t i = 0; i < padded; ++i)
        grads[i] = i < reported ? float(int((i * 5 + size_t(topo_.rank) * 11 + size_t(step) * 3) % 19) - 9) : 0.f;
      reference = grads;
      MPI_Allreduce(MPI_IN_PLACE, reference.data(), int(padded), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      // Earlier micro-batches report too; the reducer ignores them until begin().
      reducer->ready(0, padded);
      reducer->begin();
      report(*reducer, reported, c.order, 1000 + uint64_t(step));
      const double exposed = reducer->finish();
      bad += !(exposed >= 0);
      for (size_t i = 0; i < padded; ++i) {
        double exact = 0;
        for (int r = 0; r < topo_.size; ++r)
          exact += i < reported ? int((i * 5 + size_t(r) * 11 + size_t(step) * 3) % 19) - 9 : 0;
        bad += grads[i] != float(exact) || grads[i] != reference[i];
      }
    }
    if (bad) ADD_FAILURE() << "rank " << topo_.rank << ": " << bad << " mismatches in " << describe(c);
    return bad;
  }

  Topology topo_;
};

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  const std::pair<OverlapMode, bool> engines[] = {{OverlapMode::off, true},     {OverlapMode::off, false},
                                                  {OverlapMode::poll, false},   {OverlapMode::thread, true},
                                                  {OverlapMode::thread, false}};
  for (const char* algo : {"flat", "hierarchical"})
    for (const auto& [mode, blocking] : engines) {
      // Several small buckets (sizes not multiples of 64 per shard), trailing padding.
      cases.push_back({algo, mode, blocking, 1237, 3, 4 * 300, ReadyOrder::high_to_low});
      // 64-aligned buckets with an odd remainder bucket at offset 0; ranges low-to-high.
      cases.push_back({algo, mode, blocking, 64 * 9 + 17, 0, 4 * 64 * 2 * 4, ReadyOrder::low_to_high});
      // One bucket; nothing reported (finish() must reduce everything).
      cases.push_back({algo, mode, blocking, 4099, 1, size_t(1) << 24, ReadyOrder::none});
      // Tiny buffer: one shard per rank, buckets of one shard.
      cases.push_back({algo, mode, blocking, 1, 0, 4, ReadyOrder::high_to_low});
    }
  return cases;
}

TEST_F(ReducerTest, IntegerGradientsSumExactlyInEveryMode) {
  for (const Case& c : all_cases()) {
    EXPECT_EQ(global_failures(run_integer_case(c, 2)), 0) << describe(c);
  }
}

// Sharded (ZeRO-1): the owned ranges tile the buffer over the ranks (each element owned once),
// each holds the exact sum after finish(), and gather() gives every rank every owner's values;
// so does start_gather() (in the background in thread mode), [0, end) complete once
// wait_gather(end) returns, and the next step's reduction runs after it.
TEST_F(ReducerTest, ShardedReductionOwnsOneShareAndGathers) {
  const size_t P = size_t(topo_.size);
  const std::pair<OverlapMode, bool> engines[] = {{OverlapMode::off, true},
                                                  {OverlapMode::poll, false},
                                                  {OverlapMode::thread, true},
                                                  {OverlapMode::thread, false}};
  struct Shape {
    size_t units, bucket_bytes;
  };
  // Several buckets with an odd remainder bucket at offset 0; one bucket; one element per rank.
  const Shape shapes[] = {{64 * 5 + 7, 4 * 64 * 2 * P}, {811, size_t(1) << 24}, {1, 4}};
  // Within the node (HSDP): each node's ranks shard, every element is owned once per node.
  for (const bool within_node : {false, true})
  for (const char* algo : {"flat", "hierarchical"})
    for (const auto& [mode, blocking] : engines)
      for (const Shape& shape : shapes) {
        if (within_node && std::string(algo) == "flat") continue;  // HSDP needs the hierarchical stages
        const bool hsdp = within_node && topo_.num_nodes > 1;
        const size_t G = hsdp ? size_t(topo_.local_size) : P;
        const std::string what = std::string(algo) + "/" + overlap_mode_name(mode) + (blocking ? "/blocking" : "") +
                                 (within_node ? "/within node" : "") + " units=" + std::to_string(shape.units);
        const size_t padded = shape.units * P;
        std::vector<float> grads(padded), params(padded);
        ReducerOptions opts;
        opts.algo = algo;
        opts.overlap = mode;
        opts.blocking_collectives = blocking;
        opts.bucket_bytes = shape.bucket_bytes;
        opts.shard = true;
        opts.shard_within_node = within_node;
        auto reducer = make_gradient_reducer(topo_, grads.data(), padded, opts);
        long bad = 0;
        for (int step = 0; step < 3; ++step) {
          for (size_t i = 0; i < padded; ++i)
            grads[i] = float(int((i * 7 + size_t(topo_.rank) * 5 + size_t(step)) % 23) - 11);
          reducer->begin();
          report(*reducer, padded, ReadyOrder::high_to_low, 77 + uint64_t(step));
          reducer->finish();
          std::vector<int> owners(padded, 0);
          size_t owned_total = 0;
          for (const BufferRange& r : reducer->owned()) {
            owned_total += r.count;
            for (size_t i = r.offset; i < r.offset + r.count; ++i) {
              owners[i] += 1;
              double exact = 0;
              for (int q = 0; q < topo_.size; ++q) exact += int((i * 7 + size_t(q) * 5 + size_t(step)) % 23) - 11;
              bad += grads[i] != float(exact);
            }
          }
          bad += owned_total != padded / G;  // 1/G each
          MPI_Allreduce(MPI_IN_PLACE, owners.data(), int(padded), MPI_INT, MPI_SUM, MPI_COMM_WORLD);
          for (int n : owners) bad += n != int(P / G);
          // Owners write their ranges; everything else is this rank's garbage until gathered.
          std::fill(params.begin(), params.end(), -1000.f - float(topo_.rank));
          for (const BufferRange& r : reducer->owned())
            for (size_t i = r.offset; i < r.offset + r.count; ++i) params[i] = float(i % 1009) + 0.5f * float(step);
          if (step == 1) {
            reducer->start_gather(params.data());
            bad += reducer->gathers_in_background() != (mode == OverlapMode::thread && G > 1);
            for (size_t end : {size_t(1), padded / 3, padded / 2, padded}) {
              reducer->wait_gather(end);
              for (size_t i = 0; i < end; ++i) bad += params[i] != float(i % 1009) + 0.5f * float(step);
            }
          } else {
            reducer->gather(params.data());
          }
          for (size_t i = 0; i < padded; ++i) bad += params[i] != float(i % 1009) + 0.5f * float(step);
          // The distributed optimizer's bf16 working copy travels the same buckets, 2 bytes an
          // element: each owner's bit patterns (distinct per element and step) reach every rank.
          std::vector<uint16_t> working(padded, uint16_t(0xFFFF - topo_.rank));
          const auto pattern = [&](size_t i) { return uint16_t((i * 31 + size_t(step) * 7) % 65521); };
          for (const BufferRange& r : reducer->owned())
            for (size_t i = r.offset; i < r.offset + r.count; ++i) working[i] = pattern(i);
          if (step == 2) {
            reducer->start_gather_bf16(working.data());
            reducer->wait_gather(padded);
          } else {
            reducer->gather_bf16(working.data());
          }
          for (size_t i = 0; i < padded; ++i) bad += working[i] != pattern(i);
        }
        EXPECT_EQ(global_failures(bad), 0) << what;
      }
}

TEST_F(ReducerTest, ShardedBufferMustSplitOverTheRanks) {
  if (topo_.size == 1) GTEST_SKIP() << "one rank: every size splits";
  // Whole node shards (when the node is not the world) but not whole world shares.
  const size_t extra = topo_.local_size < topo_.size ? size_t(topo_.local_size) : 1;
  std::vector<float> grads(size_t(topo_.size) * 10 + extra);
  ReducerOptions opts;
  opts.shard = true;
  long named = 0;
  try {
    make_gradient_reducer(topo_, grads.data(), grads.size(), opts);
  } catch (const Error& e) {
    named = std::string(e.what()).find("not a multiple") != std::string::npos;
  }
  EXPECT_EQ(global_failures(named), topo_.size);
}

TEST_F(ReducerTest, FlatAndHierarchicalAgreeOnRandomGradients) {
  const size_t padded = 5003 * size_t(topo_.local_size);
  std::mt19937 rng(17 + unsigned(topo_.rank));
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> original(padded);
  for (float& x : original) x = normal(rng) * 1e-3f;
  std::vector<float> abs_sum(padded);
  for (size_t i = 0; i < padded; ++i) abs_sum[i] = std::fabs(original[i]);
  MPI_Allreduce(MPI_IN_PLACE, abs_sum.data(), int(padded), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);

  std::vector<std::vector<float>> results;
  for (const char* algo : {"flat", "hierarchical"}) {
    std::vector<float> grads = original;
    ReducerOptions opts;
    opts.algo = algo;
    opts.bucket_bytes = 4 * 1024;
    opts.overlap = OverlapMode::poll;
    auto reducer = make_gradient_reducer(topo_, grads.data(), padded, opts);
    reducer->begin();
    report(*reducer, padded, ReadyOrder::high_to_low, 5);
    reducer->finish();
    results.push_back(grads);
  }
  std::vector<float> reference = original;
  MPI_Allreduce(MPI_IN_PLACE, reference.data(), int(padded), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  long bad = 0;
  for (size_t i = 0; i < padded; ++i) {
    const float tolerance = 1e-6f * abs_sum[i] + 1e-12f;
    bad += std::fabs(results[0][i] - results[1][i]) > tolerance;
    bad += std::fabs(results[1][i] - reference[i]) > tolerance;
  }
  EXPECT_EQ(global_failures(bad), 0);
  // Every rank holds the same hierarchical result, bit for bit (the node allgather copies it).
  std::vector<float> from_rank0 = results[1];
  MPI_Bcast(from_rank0.data(), int(padded), MPI_FLOAT, 0, MPI_COMM_WORLD);
  long differs = 0;
  for (size_t i = 0; i < padded; ++i) differs += from_rank0[i] != results[1][i];
  EXPECT_EQ(global_failures(differs), 0);
}

// Not a timing: which buckets were launched before finish(). Polling launches a bucket the
// moment its last range is reported and a place in flight is free (kMpiBucketsInFlight: the
// first ones at least, more as earlier ones complete); with overlap off nothing leaves before
// finish().
TEST_F(ReducerTest, BucketsStartAsSoonAsTheyAreReported) {
  const size_t padded = 1000 * size_t(topo_.local_size);
  std::vector<float> grads(padded, 1.f);
  long bad = 0;
  for (OverlapMode mode : {OverlapMode::poll, OverlapMode::off}) {
    ReducerOptions opts;
    opts.overlap = mode;
    opts.bucket_bytes = 4 * 64 * size_t(topo_.local_size);  // 64 floats per shard
    opts.reported_size = padded - 5;                          // the model never reports padding
    auto reducer = make_gradient_reducer(topo_, grads.data(), padded, opts);
    reducer->begin();
    report(*reducer, padded - 5, ReadyOrder::high_to_low, 9);
    const bool reduces = topo_.size > 1;
    bad += reducer->num_buckets() != (padded + 64 * size_t(topo_.local_size) - 1) / (64 * size_t(topo_.local_size));
    // Reported high-to-low, every bucket was complete before finish(): the first ones launched
    // then, and the rest as places came free.
    const size_t first = std::min(kMpiBucketsInFlight, reducer->num_buckets());
    const size_t early = reducer->buckets_started_early();
    if (mode == OverlapMode::poll && reduces)
      bad += early < first || early > reducer->num_buckets();
    else
      bad += early != 0;
    reducer->finish();
    bad += reducer->buckets_started_early() != early;
  }
  EXPECT_EQ(global_failures(bad), 0);
}

// Over MPI a stage holds at most kMpiBucketsInFlight buckets in flight (each holds Open MPI's
// temporary of the bucket's size or twice it): the whole buffer reported before finish() leaves
// the rest waiting for a free place, in the nonblocking modes, sharded or not, flat or
// hierarchical, and every bucket is still reduced (the sums are checked by the tests above).
TEST_F(ReducerTest, StagesHoldAFewBucketsInFlight) {
  if (topo_.size == 1) GTEST_SKIP() << "one rank: nothing is reduced";
  const size_t padded = 64 * 40 * size_t(topo_.size);
  std::vector<float> grads(padded, 1.f);
  long bad = 0;
  for (const bool shard : {false, true})
    for (const char* algo : {"flat", "hierarchical"})
      for (const OverlapMode mode : {OverlapMode::poll, OverlapMode::thread}) {
        ReducerOptions opts;
        opts.algo = algo;
        opts.overlap = mode;
        opts.blocking_collectives = false;
        opts.shard = shard;
        opts.bucket_bytes = 4 * 64 * size_t(topo_.size);  // 40 buckets
        auto reducer = make_gradient_reducer(topo_, grads.data(), padded, opts);
        for (int step = 0; step < 2; ++step) {
          std::fill(grads.begin(), grads.end(), 1.f);
          reducer->begin();
          report(*reducer, padded, ReadyOrder::high_to_low, 3 + uint64_t(step));
          reducer->finish();
          const size_t most = reducer->most_buckets_in_flight();
          bad += most < 1 || most > kMpiBucketsInFlight;
          for (const BufferRange& r : reducer->owned())
            for (size_t i = r.offset; i < r.offset + r.count; ++i) bad += grads[i] != float(topo_.size);
          if (shard) reducer->gather(grads.data());
        }
        if (bad) ADD_FAILURE() << "rank " << topo_.rank << ": " << algo << "/" << overlap_mode_name(mode)
                               << (shard ? "/sharded" : "") << ": most in flight "
                               << reducer->most_buckets_in_flight();
      }
  EXPECT_EQ(global_failures(bad), 0);
}

// The temporaries Open MPI's reduce-scatter writes (the memory plan prices them): its binomial
// reduction to rank 0 receives twice on rank 0 (both halves of its temporary) from 3 ranks on,
// once on the other even ranks, twice on rank 4 of 7 or more; the odd ranks only send.
TEST_F(ReducerTest, ReduceScatterScratchFollowsTheBinomialTree) {
  const uint64_t B = 1000, K = kMpiBucketsInFlight;
  const std::pair<int, std::pair<uint64_t, uint64_t>> expected[] = {
      {1, {0, 0}}, {2, {K * B, 0}}, {3, {2 * K * B, 0}}, {4, {2 * K * B, K * B}},
      {6, {2 * K * B, K * B}}, {7, {2 * K * B, 2 * K * B}}, {8, {2 * K * B, 2 * K * B}}};
  for (const auto& [size, want] : expected) {
    const ReduceScatterScratch got = mpi_reduce_scatter_scratch(B, size);
    EXPECT_EQ(got.rank0, want.first) << size << " ranks";
    EXPECT_EQ(got.other, want.second) << size << " ranks";
  }
}

TEST_F(ReducerTest, RangeReportedTwiceIsAnError) {
  std::vector<float> grads(size_t(topo_.local_size) * 100);
  auto reducer = make_gradient_reducer(topo_, "mpi", "flat", grads.data(), grads.size(), 1 << 20, false);
  reducer->begin();
  reducer->ready(10, 20);
  long named = 0;
  try {
    reducer->ready(25, 10);
  } catch (const Error& e) {
    named = std::string(e.what()).find("reported twice") != std::string::npos;
  }
  EXPECT_EQ(global_failures(named), topo_.size);
}

TEST_F(ReducerTest, BufferMustHoldWholeNodeShards) {
  if (topo_.local_size == 1) GTEST_SKIP() << "one rank per node: every size is whole shards";
  std::vector<float> grads(size_t(topo_.local_size) * 10 + 1);
  long named = 0;
  try {
    make_gradient_reducer(topo_, "mpi", "hierarchical", grads.data(), grads.size(), 1 << 20, true);
  } catch (const Error& e) {
    named = std::string(e.what()).find("not a multiple") != std::string::npos;
  }
  EXPECT_EQ(global_failures(named), topo_.size);
}

TEST_F(ReducerTest, OverlapModesParse) {
  EXPECT_EQ(parse_overlap_mode("off"), OverlapMode::off);
  EXPECT_EQ(parse_overlap_mode("poll"), OverlapMode::poll);
  EXPECT_EQ(parse_overlap_mode("thread"), OverlapMode::thread);
  EXPECT_EQ(parse_overlap_mode("auto"), OverlapMode::automatic);
  EXPECT_THROW(parse_overlap_mode("sometimes"), Error);
}

}  // namespace
}  // namespace kilter::comm
