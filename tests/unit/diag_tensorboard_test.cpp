// TensorBoard event files (lib/diag/tensorboard_writer.h): the CRC against its published check
// value, the record framing and the Event fields byte for byte, and the folder scan a resumed run
// uses to skip steps already written. tests/e2e/tensorboard.sh reads real runs' files back with
// TensorBoard itself.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "io/base/error.h"
#include "lib/diag/tensorboard_writer.h"

namespace kilter::diag {
namespace {

std::string temp_folder(const char* name) {
  const std::string dir = std::filesystem::temp_directory_path() / (std::string("kilter-tb-") + name + "-" +
                                                                    std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(TensorBoard, Crc32cCheckValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the CRC-32C check value (RFC 3720)
  EXPECT_EQ(crc32c("", 0), 0u);
  const char zeros[32] = {};
  EXPECT_EQ(crc32c(zeros, 32), 0x8A9136AAu);      // RFC 3720 B.4: 32 bytes of zeros
  EXPECT_EQ(crc32c("56789", 5, crc32c("1234", 4)), 0xE3069283u);  // continued
}

TEST(TensorBoard, RecordFraming) {
  const std::string data = "abc";
  const std::string record = frame_record(data);
  ASSERT_EQ(record.size(), 8u + 4u + 3u + 4u);
  uint64_t length = 0;
  std::memcpy(&length, record.data(), 8);
  EXPECT_EQ(length, 3u);
  uint32_t length_crc = 0, data_crc = 0;
  std::memcpy(&length_crc, record.data() + 8, 4);
  std::memcpy(&data_crc, record.data() + 15, 4);
  const uint32_t raw = crc32c(record.data(), 8);
  EXPECT_EQ(length_crc, ((raw >> 15) | (raw << 17)) + 0xa282ead8u);
  EXPECT_EQ(data_crc, masked_crc32c("abc", 3));
  EXPECT_EQ(record.substr(12, 3), "abc");
}

TEST(TensorBoard, EventFieldsByHand) {
  // wall_time 1.5 (field 1, fixed64), step 300 (field 2, varint 0xac 0x02), summary (field 5)
  // holding one value {tag "a" (field 1), simple_value 2.0f (field 2, fixed32)}.
  const std::string event = encode_scalars_event(1.5, 300, {{"a", 2.0}});
  const std::string expected = std::string("\x09\x00\x00\x00\x00\x00\x00\xf8\x3f", 9) + "\x10\xac\x02" +
                               std::string("\x2a\x0a\x0a\x08\x0a\x01" "a" "\x15\x00\x00\x00\x40", 12);
  EXPECT_EQ(event, expected);
  const std::string version = encode_file_version_event(0.0);
  EXPECT_EQ(version, std::string("\x09\0\0\0\0\0\0\0\0\x1a\x0d" "brain.Event:2", 24));
}

TEST(TensorBoard, ResumeSkipsStepsAlreadyWritten) {
  const std::string dir = temp_folder("resume");
  {
    TensorBoardWriter first(dir, false);
    first.add_scalars(2, {{"loss", 3.0}, {"lr", 0.1}});
    first.add_scalars(4, {{"loss", 2.0}});
    first.add_scalars(4, {{"loss", 9.0}});  // the same step again: left out
    first.flush();
  }
  auto steps = scalar_steps_in(dir);
  EXPECT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps["loss"], 4);
  EXPECT_EQ(steps["lr"], 2);
  // A new run into the folder is refused; a resumed one writes only what is new.
  EXPECT_THROW(TensorBoardWriter(dir, false), kilter::Error);
  {
    TensorBoardWriter resumed(dir, true);
    resumed.add_scalars(4, {{"loss", 7.0}, {"lr", 0.2}, {"nan", std::nan("")}});
    resumed.add_scalars(6, {{"loss", 1.0}});
    resumed.flush();
  }
  steps = scalar_steps_in(dir);
  EXPECT_EQ(steps.size(), 2u);  // the NaN was left out
  EXPECT_EQ(steps["loss"], 6);
  EXPECT_EQ(steps["lr"], 4);
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.path().filename().string().find("tfevents") != std::string::npos;
  EXPECT_EQ(files, 2);
  std::filesystem::remove_all(dir);
}

TEST(TensorBoard, ScanStopsAtADamagedTail) {
  const std::string dir = temp_folder("tail");
  std::string path;
  {
    TensorBoardWriter w(dir, false);
    w.add_scalars(1, {{"loss", 3.0}});
    w.add_scalars(2, {{"loss", 2.0}});
    w.flush();
    path = w.path();
  }
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size - 3);  // the last record cut short, as by a crash
  EXPECT_EQ(scalar_steps_in(dir)["loss"], 1);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(size - 10));
    f.put('\x7f');  // a flipped byte in the last record's data: its CRC no longer checks
  }
  EXPECT_EQ(scalar_steps_in(dir)["loss"], 1);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kilter::diag
