// The root attributes of a checkpoint file and the datasets that belong with them (see
// checkpoint_attributes.h and the format in checkpoint.h). The file's key names are the ones below
// and nowhere else: a key of one attribute is one line of a table (kRunKeys, kModelKeys), which
// both the writer and the reader go through; the format and the data's tokenizer have their own
// writer and reader, side by side.
#include "io/checkpoint_attributes.h"

#include <cstdint>
#include <utility>
#include <variant>
#include <vector>

#include "io/checkpoint_checksum.h"
#include "io/error.h"
#include "io/hdf5_util.h"

namespace kilter::io {
namespace {

// ---- format: what the file is -------------------------------------------------------------------

void write_format(hid_t root, const CheckpointInfo& info, const std::string& where) {
  h5::write_utf8_attribute(root, "format", kCheckpointFormatName, where);
  h5::write_attribute(root, "format_version", int64_t(info.format_version), where);
  h5::write_utf8_attribute(root, "kilter_version", info.kilter_version, where);
}

void read_format(hid_t root, CheckpointInfo& info, const std::string& where) {
  const std::string format = h5::read_string_attribute(root, "format", where);
  KILTER_CHECK(format == kCheckpointFormatName, where << ": format attribute is '" << format << "', expected '"
                                                      << kCheckpointFormatName << "' (not a kilter checkpoint)");
  info.format_version = int(h5::read_int_attribute(root, "format_version", where));
  KILTER_CHECK(info.format_version == kCheckpointFormatVersion,
               where << ": format_version " << info.format_version
                     << " is not supported (this kilter reads format_version " << kCheckpointFormatVersion << ")");
  info.kilter_version = h5::read_string_attribute(root, "kilter_version", where);
}

// ---- keys that are one attribute each ------------------------------------------------------------

// A root attribute and the CheckpointInfo field it holds; `optional`: checkpoints written before
// the key existed lack it, and read as the field's default.
struct Key {
  const char* name;
  std::variant<int64_t CheckpointInfo::*, uint64_t CheckpointInfo::*, double CheckpointInfo::*,
               std::string CheckpointInfo::*>
      field;
  bool optional = false;
};

// The run: where training continues, and the config it continues with.
const Key kRunKeys[] = {
    {"step", &CheckpointInfo::step},
    {"epoch", &CheckpointInfo::epoch},
    {"step_in_epoch", &CheckpointInfo::step_in_epoch},
    {"seed", &CheckpointInfo::seed},
    {"config_hash", &CheckpointInfo::config_hash},
    {"tokens_seen", &CheckpointInfo::tokens_seen},
    {"world_size", &CheckpointInfo::world_size},
    {"cut_cost_t", &CheckpointInfo::cut_cost_t, /*optional=*/true},  // since the cut-cost check
    {"cost_calibration", &CheckpointInfo::cost_calibration, /*optional=*/true},  // since the in-run calibration
    {"config", &CheckpointInfo::config},
};

// The model: the keys that fix its tensors.
const Key kModelKeys[] = {
    {"n_layer", &CheckpointInfo::n_layer},
    {"n_head", &CheckpointInfo::n_head},
    {"n_embd", &CheckpointInfo::n_embd},
    {"block_size", &CheckpointInfo::block_size},
    {"vocab_size", &CheckpointInfo::vocab_size},
    // The architecture's keys (since model.arch): absent in older checkpoints, which are gpt2.
    {"arch", &CheckpointInfo::arch, true},
    {"n_kv_head", &CheckpointInfo::n_kv_head, true},
    {"ffn_hidden", &CheckpointInfo::ffn_hidden, true},
    {"rope_theta", &CheckpointInfo::rope_theta, true},
    {"rope_scaling", &CheckpointInfo::rope_scaling, true},
    {"rope_factor", &CheckpointInfo::rope_factor, true},
    {"rope_low_freq_factor", &CheckpointInfo::rope_low_freq_factor, true},
    {"rope_high_freq_factor", &CheckpointInfo::rope_high_freq_factor, true},
    {"rope_original_context", &CheckpointInfo::rope_original_context, true},
    {"norm_eps", &CheckpointInfo::norm_eps, true},
    {"tie_embeddings", &CheckpointInfo::tie_embeddings, true},
    {"qkv_bias", &CheckpointInfo::qkv_bias, true},
};

template <typename Number>
void write_value(hid_t root, const char* name, Number value, const std::string& where) {
  h5::write_attribute(root, name, value, where);
}
void write_value(hid_t root, const char* name, const std::string& value, const std::string& where) {
  h5::write_utf8_attribute(root, name, value, where);
}

void read_value(hid_t root, const char* name, int64_t& value, const std::string& where) {
  value = h5::read_int_attribute(root, name, where);
}
void read_value(hid_t root, const char* name, uint64_t& value, const std::string& where) {
  value = h5::read_uint_attribute(root, name, where);
}
void read_value(hid_t root, const char* name, double& value, const std::string& where) {
  value = h5::read_double_attribute(root, name, where);
}
void read_value(hid_t root, const char* name, std::string& value, const std::string& where) {
  value = h5::read_string_attribute(root, name, where);
}

template <size_t N>
void write_keys(hid_t root, const Key (&keys)[N], const CheckpointInfo& info, const std::string& where) {
  for (const Key& key : keys)
    std::visit([&](auto field) { write_value(root, key.name, info.*field, where); }, key.field);
}

template <size_t N>
void read_keys(hid_t root, const Key (&keys)[N], CheckpointInfo& info, const std::string& where) {
  for (const Key& key : keys) {
    if (!h5::has_attribute(root, key.name)) {
      KILTER_CHECK(key.optional,
                   where << ": the root group has no attribute '" << key.name << "' (not a complete kilter checkpoint)");
      continue;
    }
    std::visit([&](auto field) { read_value(root, key.name, info.*field, where); }, key.field);
  }
}

// ---- the data: the tokenizer that encoded it, and how its documents start ----------------------

// A dataset written whole, with its checksum attribute.
void write_checked_dataset(hid_t root, const std::string& name, hid_t file_type, hid_t mem_type,
                           const std::vector<uint64_t>& dims, const void* data, size_t n_bytes,
                           const std::string& where) {
  h5::Handle dataset = h5::create_contiguous(root, name, file_type, dims, where);
  h5::write_all(dataset, mem_type, data, where, "/" + name);
  h5::write_attribute(dataset, "checksum", checkpoint_checksum_bytes(data, n_bytes), where);
}

// Refuses `data` (read from `dataset`) unless it matches the dataset's checksum attribute.
void check_dataset_checksum(hid_t dataset, const std::string& name, const void* data, size_t n_bytes,
                            const std::string& where) {
  const uint64_t stored = h5::read_uint_attribute(dataset, "checksum", where + ": /" + name);
  KILTER_CHECK(stored == checkpoint_checksum_bytes(data, n_bytes),
               where << ": /" << name << " fails its checksum (the file was damaged after it was written)");
}

std::string read_tokenizer_data(hid_t root, const std::string& where) {
  h5::Handle dataset = h5::open_dataset(root, "tokenizer_data", where);
  const std::vector<int64_t> shape = h5::dataset_shape(dataset);
  KILTER_CHECK(h5::element_class(dataset) == H5T_INTEGER && h5::element_size(dataset) == 1 && shape.size() == 1,
               where << ": /tokenizer_data is not a 1-D uint8 dataset");
  std::string bytes(size_t(shape[0]), '\0');
  h5::read_all(dataset, H5T_NATIVE_UCHAR, bytes.data(), where, "/tokenizer_data");
  check_dataset_checksum(dataset, "tokenizer_data", bytes.data(), bytes.size(), where);
  return bytes;
}

// /document_starts: [n, 2] uint64 rows of (id, count).
std::vector<std::pair<uint32_t, uint64_t>> read_document_starts(hid_t root, const std::string& where) {
  h5::Handle dataset = h5::open_dataset(root, "document_starts", where);
  const std::vector<int64_t> shape = h5::dataset_shape(dataset);
  KILTER_CHECK(h5::element_class(dataset) == H5T_INTEGER && shape.size() == 2 && shape[1] == 2,
               where << ": /document_starts is not an [n, 2] integer dataset");
  std::vector<uint64_t> rows(size_t(shape[0]) * 2);
  h5::read_all(dataset, H5T_NATIVE_UINT64, rows.data(), where, "/document_starts");
  check_dataset_checksum(dataset, "document_starts", rows.data(), rows.size() * sizeof(uint64_t), where);
  std::vector<std::pair<uint32_t, uint64_t>> starts;
  for (size_t i = 0; i < rows.size(); i += 2) {
    KILTER_CHECK(rows[i] <= UINT32_MAX, where << ": /document_starts row " << i / 2 << " holds id " << rows[i]
                                              << ", which is not a token id");
    starts.emplace_back(uint32_t(rows[i]), rows[i + 1]);
  }
  return starts;
}

void write_data(hid_t root, const CheckpointInfo& info, const std::string& where) {
  h5::write_utf8_attribute(root, "tokenizer", info.tokenizer, where);
  h5::write_attribute(root, "eos_id", info.eos_id, where);
  // The tokenizer file's bytes as a dataset: an attribute is limited to 64 KiB.
  if (!info.tokenizer_data.empty())
    write_checked_dataset(root, "tokenizer_data", H5T_STD_U8LE, H5T_NATIVE_UCHAR, {info.tokenizer_data.size()},
                          info.tokenizer_data.data(), info.tokenizer_data.size(), where);
  if (!info.document_starts.empty()) {
    std::vector<uint64_t> rows;
    for (const auto& [id, count] : info.document_starts) rows.insert(rows.end(), {uint64_t(id), count});
    write_checked_dataset(root, "document_starts", H5T_STD_U64LE, H5T_NATIVE_UINT64, {info.document_starts.size(), 2},
                          rows.data(), rows.size() * sizeof(uint64_t), where);
  }
}

void read_data(hid_t root, CheckpointInfo& info, const std::string& where) {
  if (h5::has_attribute(root, "tokenizer")) {  // checkpoints written before tokenizers were recorded have none
    info.tokenizer = h5::read_string_attribute(root, "tokenizer", where);
    info.eos_id = h5::read_int_attribute(root, "eos_id", where);
    if (h5::has_link(root, "tokenizer_data")) info.tokenizer_data = read_tokenizer_data(root, where);
  }
  if (h5::has_link(root, "document_starts")) info.document_starts = read_document_starts(root, where);
}

}  // namespace

void write_checkpoint_attributes(hid_t root, const CheckpointInfo& info, const std::string& where) {
  write_format(root, info, where);
  write_keys(root, kRunKeys, info, where);
  write_keys(root, kModelKeys, info, where);
  write_data(root, info, where);
}

CheckpointInfo read_checkpoint_attributes(hid_t root, const std::string& where) {
  CheckpointInfo info;
  read_format(root, info, where);
  read_keys(root, kRunKeys, info, where);
  KILTER_CHECK(info.step >= 0 && info.epoch >= 0 && info.step_in_epoch >= 0,
               where << ": negative step, epoch or step_in_epoch (corrupt attributes)");
  read_keys(root, kModelKeys, info, where);
  read_data(root, info, where);
  return info;
}

}  // namespace kilter::io
