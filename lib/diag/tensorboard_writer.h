// TensorBoard event files, written without TensorFlow or protobuf: a file of TFRecords (uint64
// length, masked CRC32C of the length, the data, masked CRC32C of the data), each holding one
// `Event` message encoded by hand: wall_time (1, double), step (2, int64), file_version (3,
// string; the first record, "brain.Event:2") or summary (5) with its values {tag (1),
// simple_value (2, float)}. TensorBoard, tensorboardX and torch.utils.tensorboard read them.
//
// A folder is one TensorBoard run; its event files are read in name order, so a writer starts a
// new file named by the time (as TensorFlow does) and a resumed run's file sorts after the ones
// before it. Steps already in the folder's files are not written again (a resumed run recomputes
// the steps after its checkpoint).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kilter::diag {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), continuing from `crc` (0 to start).
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
// The TFRecord form: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t size);

using Scalars = std::vector<std::pair<std::string, double>>;  // (tag, value)

// One Event message: the file's first (file_version) or a summary of scalars at `step`.
std::string encode_file_version_event(double wall_time);
std::string encode_scalars_event(double wall_time, int64_t step, const Scalars& values);
// `data` framed as one TFRecord.
std::string frame_record(const std::string& data);

// The largest step of every scalar tag in the event files of `dir` (not its subfolders). A record
// whose length or CRC does not check (a file cut short by a crash) ends that file's reading.
std::map<std::string, int64_t> scalar_steps_in(const std::string& dir);

// One event file in `dir` (created with its parents). With `resume`, the tags' steps already in
// the folder are skipped; without it, a folder whose files hold scalars is refused (kilter::Error
// naming it), as a new run never mixes its curve with another's.
class TensorBoardWriter {
 public:
  TensorBoardWriter(const std::string& dir, bool resume);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event at `step` with the values whose tag has not reached `step` yet; non-finite values
  // are left out. Buffered until flush().
  void add_scalars(int64_t step, const Scalars& values);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::string path_;
  std::FILE* file_ = nullptr;
  std::map<std::string, int64_t> written_;  // tag -> the largest step in the folder
};

}  // namespace kilter::diag
