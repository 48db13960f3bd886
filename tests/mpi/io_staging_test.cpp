// lib/train/staging across ranks of one node: local rank 0 copies and verifies, the others wait
// and read the staged copy; a second call reuses the verified copy; a failure on the copying
// rank reaches every rank as an error (no hang). Run with 2+ ranks on one machine.
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "io/base/error.h"
#include "io/prep.h"
#include "io/reader.h"
#include "lib/train/staging.h"

namespace fs = std::filesystem;
using namespace kilter;

static int failures = 0;
static int world_rank = 0;

#define EXPECT(cond, what)                                                               \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "rank %d: FAILED %s (%s:%d)\n", world_rank, what, __FILE__, __LINE__); \
      ++failures;                                                                        \
    }                                                                                    \
  } while (0)

static std::string broadcast_string(std::string text, MPI_Comm comm) {
  int length = int(text.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, comm);
  text.resize(length);
  MPI_Bcast(&text[0], length, MPI_CHAR, 0, comm);
  return text;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  set_error_rank(world_rank);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node);
  int local_rank = 0, local_size = 1;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);

  std::string root = world_rank == 0 ? (fs::temp_directory_path() /
                                        ("kilter-io-staging-" + std::to_string(::getpid()))).string()
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
  io::DatasetIndex index = io::load_index(root + "/dataset");
  const std::string stage = root + "/node-local";

  // Reading in place needs no staging.
  EXPECT(train::stage_dataset(index, "", node, local_rank) == index.dir, "empty stage_dir reads in place");

  io::StageReport first;
  std::string dir = train::stage_dataset(index, stage, node, local_rank, &first);
  EXPECT(dir == stage, "every rank learns the stage directory");
  EXPECT(first.shards_copied == 3 && first.shards_reused == 0, "first staging copies 3 shards");
  EXPECT(fs::exists(stage + "/index.h5"), "staged index present after the call on every rank");

  // Every rank reads a document from the staged copy and from the original: same tokens.
  {
    io::DatasetIndex staged_index = io::load_index(dir);
    io::PrefetchReader staged(staged_index, dir, io::ReaderOptions{});
    io::PrefetchReader original(index, index.dir, io::ReaderOptions{});
    uint64_t doc = uint64_t(world_rank * 37) % index.num_docs();
    staged.enqueue({{doc, 0, index.doc_lengths[doc]}});
    original.enqueue({{doc, 0, index.doc_lengths[doc]}});
    const io::ReadyGroup& a = staged.next();
    const io::ReadyGroup& b = original.next();
    bool same = true;
    for (uint32_t t = 0; t <= index.doc_lengths[doc]; ++t) same &= a.tokens[t] == b.tokens[t];
    EXPECT(same, "staged tokens equal the original's");
  }

  io::StageReport second;
  train::stage_dataset(index, stage, node, local_rank, &second);
  EXPECT(second.shards_reused == 3 && second.shards_copied == 0, "second staging reuses the copies");

  // A stage_dir that cannot be created: every rank of the node gets the error, none hangs.
  if (world_rank == 0) std::ofstream(root + "/not-a-directory") << "x";
  MPI_Barrier(MPI_COMM_WORLD);
  bool threw = false;
  try {
    train::stage_dataset(index, root + "/not-a-directory/stage", node, local_rank);
  } catch (const Error& e) {
    threw = true;
    std::string message = e.what();
    EXPECT(message.find("cannot create the directory") != std::string::npos, "failure names the cause");
    if (local_rank != 0)
      EXPECT(message.find("this node's rank 0") != std::string::npos, "failure says which rank copied");
  }
  EXPECT(threw, "staging failure raises on every rank");

  int total_failures = 0;
  MPI_Allreduce(&failures, &total_failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank == 0) {
    fs::remove_all(root);
    std::printf("io_staging_test: %d ranks (%d on this node), %d failures\n", int(local_size),
                int(local_size), total_failures);
  }
  MPI_Comm_free(&node);
  MPI_Finalize();
  return total_failures == 0 ? 0 : 1;
}
