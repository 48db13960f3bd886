// The checkpoint file format (docs/design.md "Run directory"): one HDF5 file per checkpoint,
// RUN_DIR/checkpoints/step-NNNNNNNN.h5, readable by h5py without kilter:
//   /params/<nanoGPT name>   float32, torch shape (Linear weights [out, in])
//   /adam/m/<name>, /adam/v/<name>   AdamW first and second moments, same shapes
//   root attributes: format "kilter-checkpoint", format_version, kilter_version, step, epoch,
//   step_in_epoch, seed, config_hash, tokens_seen, world_size, cut_cost_t, cost_calibration (the
//   calibrated cost models, "" where none), config (resolved INI text),
//   n_layer, n_head, n_embd, block_size, vocab_size, the architecture's keys (arch, n_kv_head,
//   ffn_hidden, rope_*, norm_eps, tie_embeddings, qkv_bias; absent before model.arch: gpt2);
//   tokenizer (kind, as index.h5 records it)
//   and eos_id, with the tokenizer file's bytes in /tokenizer_data (uint8, absent when empty), so
//   a checkpoint decodes on its own. Checkpoints written before these existed read as tokenizer "".
//   /document_starts (uint64, [n, 2] rows of id and count, absent when empty): how many training
//   documents start with each id, what an unprompted `kilter sample` draws its first token from.
// Every tensor dataset carries a `checksum` attribute (64-bit hash of its bytes) so a file that
// was damaged after it was written is refused instead of silently resumed.
// Files are written atomically: a hidden temp file next to the final name, fsync, rename, fsync
// of the directory, so a crash (even kill -9) mid-write never leaves a half file under a final
// name. This layer knows HDF5 (through io/hdf5_util.h) and POSIX only (no MPI, nothing from lib/).
// Implementation, a file per part: checkpoint_write.cpp (the whole writer), checkpoint_slices.cpp
// (the writer by slices), checkpoint_read.cpp, checkpoint_prune.cpp (names, listing, pruning);
// shared by them: checkpoint_layout (groups and datasets), checkpoint_attributes (the root
// attributes, where each key is written and read), checkpoint_checksum, checkpoint_storage
// (atomic publish, free space, storage faults).
// Owner: checkpoints.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kilter::io {

constexpr int kCheckpointFormatVersion = 1;
constexpr const char* kCheckpointFormatName = "kilter-checkpoint";

// One tensor: its name, torch shape and place in the flat buffers (floats).
struct CheckpointTensor {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0;
  size_t size = 0;
};

// The root attributes.
struct CheckpointInfo {
  int format_version = kCheckpointFormatVersion;
  std::string kilter_version;
  int64_t step = 0;            // optimizer steps completed
  int64_t epoch = 0;           // data-plan position where training continues
  int64_t step_in_epoch = 0;
  uint64_t seed = 0;
  uint64_t config_hash = 0;
  double tokens_seen = 0;
  int64_t world_size = 1;      // of the run that wrote it (informational)
  // The charge per earlier token of a cut piece that the run measured and plans with since
  // (data.cut_cost_check); -1: none, the plan derives it (absent in older checkpoints).
  double cut_cost_t = -1;
  // The cost models the run's in-run calibration put in force, each with the step it took effect
  // (data.cost_calibration = auto): text that lib/train writes and reads (JSON); "" where none
  // (absent in older checkpoints). io keeps it as it is.
  std::string cost_calibration;
  std::string config;          // resolved INI text of the run
  int64_t n_layer = 0, n_head = 0, n_embd = 0, block_size = 0, vocab_size = 0;
  // The architecture, as the config's model.* keys give it (lib/model/spec.h); checkpoints from
  // before these keys read as gpt2 (the defaults).
  std::string arch = "gpt2", rope_scaling = "none", tie_embeddings = "auto";
  int64_t n_kv_head = 0, ffn_hidden = 0, rope_original_context = 8192, qkv_bias = 0;
  double rope_theta = 10000, rope_factor = 8, rope_low_freq_factor = 1, rope_high_freq_factor = 4, norm_eps = 1e-5;
  std::string tokenizer;       // the dataset's tokenizer kind ("" in older checkpoints)
  std::string tokenizer_data;  // its file bytes ("" for byte and for kinds without a file)
  int64_t eos_id = -1;         // the dataset's eos_id (-1 in older checkpoints)
  // (id, count) by id: how many training documents start with the id (empty in older checkpoints).
  std::vector<std::pair<uint32_t, uint64_t>> document_starts;
};

// A whole checkpoint in memory: params and moments are flat, in `tensors` order and offsets.
struct CheckpointContents {
  CheckpointInfo info;
  std::vector<CheckpointTensor> tensors;
  std::vector<float> params;
  std::vector<float> adam_m;
  std::vector<float> adam_v;
};

struct CheckpointWriteOptions {
  // Test hook (env KILTER_TEST_CHECKPOINT_DELAY_S): sleep this long halfway through writing the
  // tensor data, so a test can kill the process while a temp file is half written (written by
  // slices: rank 0 sleeps halfway through its slice, lib/train/checkpointer.cpp).
  double delay_midway_s = 0;
};

// Bytes the checkpoint file of `contents` takes, rounded up (data plus HDF5 metadata).
uint64_t checkpoint_size_estimate(const CheckpointContents& contents);

// "step-00000010.h5"
std::string checkpoint_file_name(int64_t step);
// Temp name used while `final_path` is being written: ".step-00000010.h5.tmp" in the same folder.
std::string checkpoint_temp_path(const std::string& final_path);

// Writes `contents` to `final_path` atomically (temp file, fsync, rename, fsync of the folder).
// The tensor data go straight to the file with pwrite() at each dataset's offset. Throws
// kilter::Error naming the file on any failure and removes the temp file; a write that cannot
// fit in the free space (checkpoint_size_estimate) is refused before it starts. A storage fault
// (full, quota, read-only, file size limit, I/O error) gives a first line that says so and what
// to do ("checkpoint F not written: no space left on the file system of D (...); free space
// there, or set output.dir to a larger file system"), then "  detail: " and the failing call
// with HDF5's messages, each once.
void write_checkpoint_file(const std::string& final_path, const CheckpointContents& contents,
                           const CheckpointWriteOptions& opts = {});

// Writing by slices (a sharded optimizer: no process holds the whole state; docs/checkpoints.md
// "Sharded checkpoints"). The file is the same as write_checkpoint_file's, made in three steps:
//   1. one process: create_checkpoint_file() makes the temp file of `final_path` with every
//      dataset allocated (contiguous, full shape) and every attribute written, the tensors'
//      `checksum` attributes holding 0 for now; it returns where each tensor's bytes go;
//   2. any processes, at the same time, on disjoint parts: CheckpointSliceWriter writes floats
//      of the flat params / adam/m / adam/v buffers at their places (pwrite, no HDF5);
//   3. one process, after every slice is written and closed: finish_checkpoint_file() reads the
//      tensors back in bounded pieces to compute their checksums, writes them, fsyncs and renames
//      (the same atomic publish as write_checkpoint_file). abandon_checkpoint_file() removes the
//      temp file of a write that failed on some process.
// A kill anywhere before the rename leaves only the temp file, as with write_checkpoint_file.
// Errors are kilter::Error naming the file, with the same storage-fault first lines.

// Byte offsets in the temp file: [group * tensors.size() + i] for group 0 params, 1 adam/m,
// 2 adam/v and tensor i.
using CheckpointFileOffsets = std::vector<uint64_t>;

// Step 1. Refuses a write that cannot fit in the free space (as write_checkpoint_file does).
CheckpointFileOffsets create_checkpoint_file(const std::string& final_path, const CheckpointInfo& info,
                                             const std::vector<CheckpointTensor>& tensors);

// Step 2: writes into the temp file of `final_path` made by create_checkpoint_file.
class CheckpointSliceWriter {
 public:
  CheckpointSliceWriter(const std::string& final_path, const std::vector<CheckpointTensor>& tensors,
                        CheckpointFileOffsets offsets);
  ~CheckpointSliceWriter();
  CheckpointSliceWriter(const CheckpointSliceWriter&) = delete;
  CheckpointSliceWriter& operator=(const CheckpointSliceWriter&) = delete;
  // Floats [first, first + count) of flat buffer `group` (0 params, 1 adam/m, 2 adam/v), in layout
  // order; parts that lie in no tensor (padding) are skipped.
  void write(int group, size_t first, const float* data, size_t count);
  // Closes the file (its data reach the file system's cache; finish_checkpoint_file fsyncs).
  void close();

 private:
  std::string final_path_, tmp_;
  const std::vector<CheckpointTensor>& tensors_;
  CheckpointFileOffsets offsets_;
  int fd_ = -1;
};

// Step 3.
void finish_checkpoint_file(const std::string& final_path, const std::vector<CheckpointTensor>& tensors,
                            const CheckpointFileOffsets& offsets);
// Removes the temp file of `final_path` (a write some process could not complete).
void abandon_checkpoint_file(const std::string& final_path);

// Opens `path` and reads the root attributes; checks format and format_version. Throws
// kilter::Error naming the file and the problem (missing, truncated or not HDF5, wrong format).
CheckpointInfo read_checkpoint_info(const std::string& path);

// Reads every tensor of `expected` (names and shapes; offsets/sizes into the flat buffers) from
// /params, /adam/m and /adam/v into params, adam_m, adam_v, and verifies each checksum. Throws
// naming the file and the tensor: a missing tensor, a shape or type mismatch, a tensor the file
// has but `expected` does not list, a checksum mismatch.
void read_checkpoint_tensors(const std::string& path, const std::vector<CheckpointTensor>& expected,
                             float* params, float* adam_m, float* adam_v);

// Reads /params only (what `kilter sample` needs), with the same checks as
// read_checkpoint_tensors.
void read_checkpoint_params(const std::string& path, const std::vector<CheckpointTensor>& expected, float* params);

// Complete checkpoints in `dir` as (step, path), oldest first; temp files are not listed.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir);
// Deletes all but the newest `keep` checkpoints in `dir`; returns the paths removed.
std::vector<std::string> prune_checkpoints(const std::string& dir, int keep);
// Temp files left by a writer that died (kill -9 mid-write), sorted.
std::vector<std::string> stale_temp_files(const std::string& dir);
// Deletes temp files left by a writer that died (kill -9 mid-write); returns the paths removed.
std::vector<std::string> remove_stale_temp_files(const std::string& dir);

// The 64-bit content hash stored in each tensor's `checksum` attribute.
uint64_t checkpoint_checksum(const float* data, size_t count);

}  // namespace kilter::io
