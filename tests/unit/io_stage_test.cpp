// Node-local staging, the io/ half: copies every shard and the index, verifies each copy against
// the index hash, keeps a verified existing copy, replaces a corrupted one, refuses a corrupted
// source.
#include <gtest/gtest.h>

#include "io/stage.h"
#include "file_size_limit.h"
#include "io_testing.h"

namespace kilter::io {
namespace {

using namespace kilter::io::testing;

TEST(IoStage, CopiesVerifiesAndReuses) {
  ScratchDir tmp;
  DatasetIndex index = load_index(make_synth(tmp.path("d"), 200, 3));
  StageReport first = stage_shards(index, tmp.path("nvme/stage"));
  EXPECT_EQ(first.shards_copied, 3u);
  EXPECT_EQ(first.shards_reused, 0u);
  EXPECT_GT(first.bytes_copied, 0u);
  EXPECT_TRUE(validate_dataset(tmp.path("nvme/stage")).empty());
  DatasetIndex staged = load_index(tmp.path("nvme/stage"));
  EXPECT_EQ(staged.doc_lengths, index.doc_lengths);

  StageReport second = stage_shards(index, tmp.path("nvme/stage"));
  EXPECT_EQ(second.shards_copied, 0u);
  EXPECT_EQ(second.shards_reused, 3u);
  EXPECT_EQ(second.bytes_copied, 0u);
}

TEST(IoStage, CorruptedCopyIsReplaced) {
  ScratchDir tmp;
  DatasetIndex index = load_index(make_synth(tmp.path("d"), 200, 3));
  stage_shards(index, tmp.path("stage"));
  const std::string copy = tmp.path("stage/shard-00001.h5");
  uint32_t token = shard_tokens(copy)[0];
  set_token(copy, 0, (token + 1) % 999);           // same size, different content
  fs::resize_file(tmp.path("stage/shard-00002.h5"), 1000);  // truncated copy
  StageReport report = stage_shards(index, tmp.path("stage"));
  EXPECT_EQ(report.shards_reused, 1u);
  EXPECT_EQ(report.shards_replaced, 2u);
  EXPECT_TRUE(validate_dataset(tmp.path("stage")).empty()) << join(validate_dataset(tmp.path("stage")));
  // No temporary files are left behind.
  for (const auto& entry : fs::directory_iterator(tmp.path("stage")))
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos);
}

TEST(IoStage, CorruptedSourceIsRefused) {
  ScratchDir tmp;
  DatasetIndex index = load_index(make_synth(tmp.path("d"), 100, 2));
  uint32_t token = shard_tokens(tmp.path("d/shard-00000.h5"))[5];
  set_token(tmp.path("d/shard-00000.h5"), 5, (token + 1) % 999);
  expect_error([&] { stage_shards(index, tmp.path("stage")); },
               {"shard-00000.h5", "the index says", "prep validate"});
  EXPECT_FALSE(fs::exists(tmp.path("stage/shard-00000.h5")));
  EXPECT_FALSE(fs::exists(tmp.path("stage/index.h5")));  // an incomplete stage has no index
}

TEST(IoStage, StageDirMustNotBeTheDataset) {
  ScratchDir tmp;
  DatasetIndex index = load_index(make_synth(tmp.path("d"), 10, 1));
  expect_error([&] { stage_shards(index, tmp.path("d")); }, {"is the dataset directory itself"});
  write_file(tmp.path("file"), "x");
  expect_error([&] { stage_shards(index, tmp.path("file/sub")); }, {"data.stage_dir", "cannot create"});
}

TEST(IoStage, StorageFaultMidCopy) {
  // A write that fails in the middle of a shard's copy (a file size limit below the shard's
  // size: EFBIG, as a full node-local disk gives ENOSPC; issue 17) leads with the stage folder,
  // the cause and what to do, names the shard, and leaves no temp file.
  ScratchDir tmp;
  DatasetIndex index = load_index(make_synth(tmp.path("d"), 400, 2));
  const uintmax_t shard_size = fs::file_size(tmp.path("d/shard-00000.h5"));
  const std::string stage = tmp.path("stage");
  std::string err;
  {
    kilter::testing::FileSizeLimit limited{rlim_t(shard_size / 2)};
    try {
      stage_shards(index, stage);
    } catch (const Error& e) {
      err = e.message();
    }
  }
  EXPECT_EQ(err.find("data.stage_dir " + stage + ": file size limit reached in " + stage), 0u) << err;
  EXPECT_NE(err.find("while copying shard-00000.h5; free space there, or set data.stage_dir to a larger file "
                     "system; or leave data.stage_dir empty to read " + index.dir + " in place"),
            std::string::npos) << err;
  EXPECT_NE(err.find("\n  detail: "), std::string::npos) << err;
  for (const auto& entry : fs::directory_iterator(stage))
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
}

}  // namespace
}  // namespace kilter::io
