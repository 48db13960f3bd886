// lib/train/staging across ranks of one node: local rank 0 copies and verifies, the others wait
// and read the staged copy; a second call reuses the verified copy; a failure on the copying
// rank reaches every rank as an error (no hang). Run with 2+ ranks on one machine. GoogleTest,
// with the MPI main of tests/mpi/comm_test_main.cpp (rank 0 prints; any rank's failure fails the
// job); the tests run in order on every rank, on one synthetic dataset.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "io/error.h"
#include "io/prep.h"
#include "io/reader.h"
#include "lib/train/staging.h"

namespace fs = std::filesystem;
using namespace kilter;

namespace {

std::string broadcast_string(std::string text, MPI_Comm comm) {
  int length = int(text.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, comm);
  text.resize(length);
  MPI_Bcast(&text[0], length, MPI_CHAR, 0, comm);
  return text;
}

// The dataset (3 shards, made by rank 0 in a temporary folder) and the node's communicator.
class NodeStaging : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    set_error_rank(world_rank);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_size(node, &local_size);
    root = world_rank == 0 ? (fs::temp_directory_path() / ("kilter-io-staging-" + std::to_string(::getpid()))).string()
                           : "";
    root = broadcast_string(root, MPI_COMM_WORLD);
    if (world_rank == 0) {
      io::SynthOptions synth;
      synth.docs = 300;
      synth.lengths = "uniform:10,400";
      synth.vocab = 5000;
      synth.shards = 3;
      synth.out = root + "/dataset";
      synth.progress = false;
      io::synthesize_dataset(synth);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    index = new io::DatasetIndex(io::load_index(root + "/dataset"));
    stage = root + "/node-local";
  }
  static void TearDownTestSuite() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank == 0) {
      fs::remove_all(root);
      std::printf("io_staging_test: %d ranks on this node\n", local_size);
    }
    delete index;
    MPI_Comm_free(&node);
  }
  static int world_rank, local_rank, local_size;
  static MPI_Comm node;
  static std::string root, stage;
  static io::DatasetIndex* index;
};
int NodeStaging::world_rank = 0, NodeStaging::local_rank = 0, NodeStaging::local_size = 1;
MPI_Comm NodeStaging::node = MPI_COMM_NULL;
std::string NodeStaging::root, NodeStaging::stage;
io::DatasetIndex* NodeStaging::index = nullptr;

// Reading in place needs no staging.
TEST_F(NodeStaging, EmptyStageDirReadsInPlace) {
  EXPECT_EQ(train::stage_dataset(*index, "", node, local_rank), index->dir) << "rank " << world_rank;
}

TEST_F(NodeStaging, FirstCallCopiesAndEveryRankReadsTheCopySecondReuses) {
  io::StageReport first;
  const std::string dir = train::stage_dataset(*index, stage, node, local_rank, &first);
  EXPECT_EQ(dir, stage) << "every rank learns the stage directory (rank " << world_rank << ")";
  EXPECT_TRUE(first.shards_copied == 3 && first.shards_reused == 0) << "first staging copies 3 shards";
  EXPECT_TRUE(fs::exists(stage + "/index.h5")) << "staged index present after the call on rank " << world_rank;
  // Every rank reads a document from the staged copy and from the original: same tokens.
  {
    io::DatasetIndex staged_index = io::load_index(dir);
    io::PrefetchReader staged(staged_index, dir, io::ReaderOptions{});
    io::PrefetchReader original(*index, index->dir, io::ReaderOptions{});
    const uint64_t doc = uint64_t(world_rank * 37) % index->num_docs();
    staged.enqueue({{doc, 0, index->doc_lengths[doc]}});
    original.enqueue({{doc, 0, index->doc_lengths[doc]}});
    const io::ReadyGroup& a = staged.next();
    const io::ReadyGroup& b = original.next();
    bool same = true;
    for (uint32_t t = 0; t <= index->doc_lengths[doc]; ++t) same &= a.tokens[t] == b.tokens[t];
    EXPECT_TRUE(same) << "staged tokens equal the original's (rank " << world_rank << ")";
  }
  io::StageReport second;
  train::stage_dataset(*index, stage, node, local_rank, &second);
  EXPECT_TRUE(second.shards_reused == 3 && second.shards_copied == 0) << "second staging reuses the copies";
}

// A stage_dir that cannot be created: every rank of the node gets the error, none hangs.
TEST_F(NodeStaging, FailureOnTheCopyingRankReachesEveryRank) {
  if (world_rank == 0) std::ofstream(root + "/not-a-directory") << "x";
  MPI_Barrier(MPI_COMM_WORLD);
  bool threw = false;
  try {
    train::stage_dataset(*index, root + "/not-a-directory/stage", node, local_rank);
  } catch (const Error& e) {
    threw = true;
    const std::string message = e.what();
    EXPECT_NE(message.find("cannot create the directory"), std::string::npos) << "failure names the cause: " << message;
    if (local_rank != 0)
      EXPECT_NE(message.find("this node's rank 0"), std::string::npos) << "failure says which rank copied: " << message;
  }
  EXPECT_TRUE(threw) << "staging failure raises on rank " << world_rank;
}

}  // namespace
