// The checkpoint file format (io/checkpoint.h): round trip, atomic publication, listing and
// pruning, and every refusal a resume relies on (truncated, corrupt, missing tensor, wrong shape,
// unsupported format_version), each naming the file.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/base/error.h"
#include "file_size_limit.h"

namespace {

using kilter::io::CheckpointContents;
using kilter::io::CheckpointTensor;

std::string make_temp_dir() {
  char tmpl[] = "/tmp/kilter-ckpt-test.XXXXXX";
  const char* dir = ::mkdtemp(tmpl);
  EXPECT_NE(dir, nullptr);
  return dir ? dir : "/tmp";
}

// Two tensors laid out like a (tiny) model: a 2-D weight and a bias.
CheckpointContents sample_contents() {
  CheckpointContents c;
  c.tensors = {{"transformer.wte.weight", {5, 3}, 0, 15}, {"transformer.ln_f.bias", {3}, 15, 3}};
  for (int i = 0; i < 18; ++i) {
    c.params.push_back(0.25f * float(i) - 1.0f);
    c.adam_m.push_back(1e-3f * float(i));
    c.adam_v.push_back(1e-6f * float(i * i));
  }
  c.info.kilter_version = "0.1.0";
  c.info.step = 42;
  c.info.epoch = 1;
  c.info.step_in_epoch = 7;
  c.info.seed = 1337;
  c.info.config_hash = 0xfedcba9876543210ull;
  c.info.tokens_seen = 123456.0;
  c.info.cut_cost_t = 2.75;
  c.info.world_size = 4;
  c.info.config = "[model]\nn_layer = 1\n";
  c.info.n_layer = 1;
  c.info.n_head = 1;
  c.info.n_embd = 3;
  c.info.block_size = 8;
  c.info.vocab_size = 5;
  return c;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const kilter::Error& e) {
    return e.what();
  }
  return "";
}

off_t file_size(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

class CheckpointFileTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir(); }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string dir_;
};

TEST_F(CheckpointFileTest, RoundTripIsBitExact) {
  CheckpointContents c = sample_contents();
  const std::string path = dir_ + "/" + kilter::io::checkpoint_file_name(42);
  EXPECT_EQ(kilter::io::checkpoint_file_name(42), "step-00000042.h5");
  kilter::io::write_checkpoint_file(path, c);
  EXPECT_EQ(::access(kilter::io::checkpoint_temp_path(path).c_str(), F_OK), -1) << "temp file left behind";

  kilter::io::CheckpointInfo info = kilter::io::read_checkpoint_info(path);
  EXPECT_EQ(info.format_version, 1);
  EXPECT_EQ(info.kilter_version, "0.1.0");
  EXPECT_EQ(info.step, 42);
  EXPECT_EQ(info.epoch, 1);
  EXPECT_EQ(info.step_in_epoch, 7);
  EXPECT_EQ(info.seed, 1337u);
  EXPECT_EQ(info.config_hash, 0xfedcba9876543210ull);
  EXPECT_EQ(info.tokens_seen, 123456.0);
  EXPECT_EQ(info.cut_cost_t, 2.75);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.config, c.info.config);
  EXPECT_EQ(info.n_embd, 3);
  EXPECT_EQ(info.vocab_size, 5);

  std::vector<float> p(18, -9), m(18, -9), v(18, -9);
  kilter::io::read_checkpoint_tensors(path, c.tensors, p.data(), m.data(), v.data());
  EXPECT_EQ(p, c.params);
  EXPECT_EQ(m, c.adam_m);
  EXPECT_EQ(v, c.adam_v);
}

// Read one tensor's `checksum` attribute (group "params", "adam/m" or "adam/v").
uint64_t stored_checksum(const std::string& path, const std::string& dataset) {
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t dset = H5Dopen2(file, dataset.c_str(), H5P_DEFAULT);
  hid_t attr = H5Aopen(dset, "checksum", H5P_DEFAULT);
  uint64_t value = 0;
  H5Aread(attr, H5T_NATIVE_UINT64, &value);
  H5Aclose(attr);
  H5Dclose(dset);
  H5Fclose(file);
  return value;
}

TEST_F(CheckpointFileTest, WrittenBySlicesEqualsWrittenWhole) {
  // Slices of any size, in any order, crossing tensors and running into the padding after the
  // last tensor, give the same tensors and checksums as the whole writer.
  CheckpointContents c = sample_contents();
  const std::string whole = dir_ + "/whole/" + kilter::io::checkpoint_file_name(42);
  const std::string sliced = dir_ + "/" + kilter::io::checkpoint_file_name(42);
  ::mkdir((dir_ + "/whole").c_str(), 0755);
  kilter::io::write_checkpoint_file(whole, c);
  kilter::io::CheckpointFileOffsets offsets = kilter::io::create_checkpoint_file(sliced, c.info, c.tensors);
  EXPECT_EQ(::access(sliced.c_str(), F_OK), -1) << "published before it was finished";
  {
    kilter::io::CheckpointSliceWriter writer(sliced, c.tensors, offsets);
    std::vector<float> padded[3] = {c.params, c.adam_m, c.adam_v};
    for (auto& b : padded) b.resize(21, 99.0f);  // 3 floats of padding, which no dataset holds
    for (size_t first : {14, 7, 0}) {
      for (int g = 2; g >= 0; --g) writer.write(g, first, padded[g].data() + first, 7);
    }
    writer.close();
  }
  kilter::io::finish_checkpoint_file(sliced, c.tensors, offsets);
  EXPECT_EQ(::access(kilter::io::checkpoint_temp_path(sliced).c_str(), F_OK), -1) << "temp file left behind";

  std::vector<float> p(18, -9), m(18, -9), v(18, -9);
  kilter::io::read_checkpoint_tensors(sliced, c.tensors, p.data(), m.data(), v.data());  // checks checksums
  EXPECT_EQ(p, c.params);
  EXPECT_EQ(m, c.adam_m);
  EXPECT_EQ(v, c.adam_v);
  EXPECT_EQ(kilter::io::read_checkpoint_info(sliced).step, 42);
  for (const char* group : {"/params/", "/adam/m/", "/adam/v/"})
    for (const auto& t : c.tensors)
      EXPECT_EQ(stored_checksum(sliced, group + t.name), stored_checksum(whole, group + t.name)) << group << t.name;

  // A write some process could not complete: abandoned, nothing published.
  const std::string failed = dir_ + "/" + kilter::io::checkpoint_file_name(43);
  kilter::io::create_checkpoint_file(failed, c.info, c.tensors);
  kilter::io::abandon_checkpoint_file(failed);
  EXPECT_TRUE(kilter::io::stale_temp_files(dir_).empty());
  EXPECT_EQ(::access(failed.c_str(), F_OK), -1);
}

TEST_F(CheckpointFileTest, TruncatedFileIsAClearError) {
  CheckpointContents c = sample_contents();
  const std::string path = dir_ + "/step-00000001.h5";
  kilter::io::write_checkpoint_file(path, c);
  ASSERT_EQ(::truncate(path.c_str(), file_size(path) / 2), 0);
  std::string err = error_of([&] { kilter::io::read_checkpoint_info(path); });
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
}

TEST_F(CheckpointFileTest, MissingFileAndNonHdf5FileAreClearErrors) {
  std::string err = error_of([&] { kilter::io::read_checkpoint_info(dir_ + "/step-00000009.h5"); });
  EXPECT_NE(err.find("step-00000009.h5"), std::string::npos) << err;
  EXPECT_NE(err.find("No such file"), std::string::npos) << err;
  const std::string junk = dir_ + "/junk.h5";
  std::ofstream(junk) << "this is not HDF5";
  err = error_of([&] { kilter::io::read_checkpoint_info(junk); });
  EXPECT_NE(err.find("cannot be opened as HDF5"), std::string::npos) << err;
}

TEST_F(CheckpointFileTest, DamagedTensorBytesFailTheChecksum) {
  CheckpointContents c = sample_contents();
  const std::string path = dir_ + "/step-00000002.h5";
  kilter::io::write_checkpoint_file(path, c);
  // Find /adam/v/transformer.wte.weight's bytes and flip one, behind HDF5's back.
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t dset = H5Dopen2(file, "/adam/v/transformer.wte.weight", H5P_DEFAULT);
  haddr_t offset = H5Dget_offset(dset);
  H5Dclose(dset);
  H5Fclose(file);
  ASSERT_NE(offset, HADDR_UNDEF);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(offset + 9));
    f.put('\x5a');
  }
  std::vector<float> p(18), m(18), v(18);
  std::string err = error_of([&] { kilter::io::read_checkpoint_tensors(path, c.tensors, p.data(), m.data(), v.data()); });
  EXPECT_NE(err.find("/adam/v/transformer.wte.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("checksum"), std::string::npos) << err;
}

TEST_F(CheckpointFileTest, MissingTensorWrongShapeAndExtraTensorAreNamed) {
  CheckpointContents c = sample_contents();
  const std::string path = dir_ + "/step-00000003.h5";
  kilter::io::write_checkpoint_file(path, c);
  std::vector<float> p(64), m(64), v(64);

  auto expected = c.tensors;
  expected.push_back({"transformer.wpe.weight", {2, 3}, 18, 6});
  std::string err = error_of([&] { kilter::io::read_checkpoint_tensors(path, expected, p.data(), m.data(), v.data()); });
  EXPECT_NE(err.find("/params/transformer.wpe.weight is missing"), std::string::npos) << err;

  expected = c.tensors;
  expected[0].shape = {3, 5};
  err = error_of([&] { kilter::io::read_checkpoint_tensors(path, expected, p.data(), m.data(), v.data()); });
  EXPECT_NE(err.find("has shape [5, 3]"), std::string::npos) << err;
  EXPECT_NE(err.find("[3, 5]"), std::string::npos) << err;

  expected = {c.tensors[0]};
  err = error_of([&] { kilter::io::read_checkpoint_tensors(path, expected, p.data(), m.data(), v.data()); });
  EXPECT_NE(err.find("transformer.ln_f.bias that the configured model does not have"), std::string::npos) << err;
}

TEST_F(CheckpointFileTest, UnsupportedFormatVersionIsRefused) {
  CheckpointContents c = sample_contents();
  c.info.format_version = 2;
  const std::string path = dir_ + "/step-00000004.h5";
  kilter::io::write_checkpoint_file(path, c);
  std::string err = error_of([&] { kilter::io::read_checkpoint_info(path); });
  EXPECT_NE(err.find("format_version 2 is not supported"), std::string::npos) << err;
  EXPECT_NE(err.find(path), std::string::npos) << err;
}

TEST_F(CheckpointFileTest, ListPruneAndStaleTempFiles) {
  CheckpointContents c = sample_contents();
  for (int64_t step : {30, 10, 20, 40}) kilter::io::write_checkpoint_file(dir_ + "/" + kilter::io::checkpoint_file_name(step), c);
  std::ofstream(dir_ + "/.step-00000050.h5.tmp") << "half written";
  std::ofstream(dir_ + "/step-notanumber.h5") << "ignored";
  auto listed = kilter::io::list_checkpoints(dir_);
  ASSERT_EQ(listed.size(), 4u);
  EXPECT_EQ(listed.front().first, 10);
  EXPECT_EQ(listed.back().first, 40);
  EXPECT_EQ(listed.back().second, dir_ + "/step-00000040.h5");

  auto removed = kilter::io::prune_checkpoints(dir_, 2);
  EXPECT_EQ(removed.size(), 2u);
  listed = kilter::io::list_checkpoints(dir_);
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].first, 30);
  EXPECT_EQ(listed[1].first, 40);

  auto stale = kilter::io::remove_stale_temp_files(dir_);
  ASSERT_EQ(stale.size(), 1u);
  EXPECT_EQ(stale[0], dir_ + "/.step-00000050.h5.tmp");
  EXPECT_EQ(::access((dir_ + "/step-notanumber.h5").c_str(), F_OK), 0) << "not ours: must stay";
}

TEST_F(CheckpointFileTest, FailedWriteLeavesNoFileAndNamesIt) {
  CheckpointContents c = sample_contents();
  c.tensors[1].offset = 17;  // runs past the 18-float buffers
  const std::string path = dir_ + "/step-00000005.h5";
  std::string err = error_of([&] { kilter::io::write_checkpoint_file(path, c); });
  EXPECT_NE(err.find("transformer.ln_f.bias lies outside"), std::string::npos) << err;
  EXPECT_EQ(::access(path.c_str(), F_OK), -1);
  EXPECT_EQ(::access(kilter::io::checkpoint_temp_path(path).c_str(), F_OK), -1);
  err = error_of([&] { kilter::io::write_checkpoint_file(dir_ + "/no/such/dir/step-00000001.h5", sample_contents()); });
  EXPECT_NE(err.find("no/such/dir"), std::string::npos) << err;
}

TEST(CheckpointChecksum, ChangesWithAnyByte) {
  std::vector<float> a(1001);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i) * 0.5f;
  const uint64_t h = kilter::io::checkpoint_checksum(a.data(), a.size());
  for (size_t i : {size_t(0), size_t(500), size_t(1000)}) {
    std::vector<float> b = a;
    b[i] = std::nextafter(b[i], 1e9f);
    EXPECT_NE(kilter::io::checkpoint_checksum(b.data(), b.size()), h) << "element " << i;
  }
  EXPECT_NE(kilter::io::checkpoint_checksum(a.data(), a.size() - 1), h);
  EXPECT_EQ(kilter::io::checkpoint_checksum(a.data(), a.size()), h);
}

}  // namespace

// A storage fault while writing (issue 17), made with a file size limit (EFBIG, as a full disk
// gives ENOSPC), hit inside HDF5 when it closes the file: a tiny limit (its first metadata write
// fails) and a limit just under the file's size (extending the file to its end fails). Either
// way the first line names the file, the cause and what to do; HDF5's messages follow once, as
// the detail (its file driver's message is repeated at every level of the flush: kept once);
// nothing is printed (no HDF5 stack on stderr); no temp file or final file is left.
TEST_F(CheckpointFileTest, StorageFaultIsOnePlainLineThenTheDetail) {
  CheckpointContents c = sample_contents();
  const std::string probe = dir_ + "/step-00000001.h5";
  kilter::io::write_checkpoint_file(probe, c);
  const off_t full_size = file_size(probe);
  ASSERT_GT(full_size, 1000);
  for (off_t limit : {off_t(800), full_size - 8}) {
    const std::string path = dir_ + "/step-00000042.h5";
    std::string err;
    ::testing::internal::CaptureStderr();
    {
      kilter::testing::FileSizeLimit limited{rlim_t(limit)};
      err = error_of([&] { kilter::io::write_checkpoint_file(path, c); });
    }
    const std::string printed = ::testing::internal::GetCapturedStderr();
    SCOPED_TRACE("file size limit " + std::to_string(limit));
    const std::string first_line = err.substr(0, err.find('\n'));
    EXPECT_EQ(first_line.find("checkpoint " + path + " not written: file size limit reached in " + dir_), 0u) << err;
    EXPECT_NE(first_line.find("free space there, or set output.dir to a larger file system"), std::string::npos) << err;
    EXPECT_NE(err.find("\n  detail: checkpoint " + path), std::string::npos) << err;
    const size_t driver_message = err.find("file write failed: time = ");
    ASSERT_NE(driver_message, std::string::npos) << err;
    EXPECT_EQ(err.find("file write failed: time = ", driver_message + 1), std::string::npos) << err;
    EXPECT_NE(err.find("errno = 27, error message = 'File too large'"), std::string::npos) << err;
    EXPECT_EQ(printed, "");
    EXPECT_EQ(file_size(path), -1);
    EXPECT_EQ(file_size(kilter::io::checkpoint_temp_path(path)), -1);
  }
}
