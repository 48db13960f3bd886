// Fuzz harness (issue 17), structure-aware: the fuzz input drives the building of a checkpoint
// file (io/checkpoint.h's format: root attributes, /tokenizer_data, /params, /adam/m, /adam/v with
// a checksum attribute on every tensor) for a small fixed model, every attribute, group and
// tensor valid or adversarial as the input picks (tests/fuzz/fuzz_hdf5.h), plus tensors the model
// does not have. kilter then reads it as a resume does: read_checkpoint_info(), then
// read_checkpoint_tensors() (`kilter sample`'s read_checkpoint_params() is its first group, the
// same code). Refusals must be kilter::Error; a file that reads must give back the tensors that
// were written.
#include <cstring>

#include "fuzz_hdf5.h"
#include "io/checkpoint.h"

namespace {

using namespace kilter::fuzz;

std::vector<kilter::io::CheckpointTensor> model_tensors() {
  std::vector<kilter::io::CheckpointTensor> tensors = {
      {"transformer.wte.weight", {6, 4}, 0, 0},
      {"transformer.ln_f.bias", {4}, 0, 0},
  };
  size_t offset = 0;
  for (auto& t : tensors) {
    t.size = 1;
    for (int64_t d : t.shape) t.size *= size_t(d);
    t.offset = offset;
    offset += t.size;
  }
  return tensors;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  static const std::vector<kilter::io::CheckpointTensor> expected = model_tensors();
  const size_t total = expected.back().offset + expected.back().size;
  std::vector<float> written[3];
  for (auto& w : written) {
    w.resize(total);
    for (float& v : w) v = float(int8_t(in.u8())) / 8.0f;
  }

  h5b::MemFile file;
  const hid_t root = file.id();
  h5b::attr_str(root, "format", kilter::io::kCheckpointFormatName, in);
  h5b::attr_i64(root, "format_version", kilter::io::kCheckpointFormatVersion, in);
  h5b::attr_str(root, "kilter_version", "0.1.0", in);
  h5b::attr_i64(root, "step", 10, in);
  h5b::attr_i64(root, "epoch", 1, in);
  h5b::attr_i64(root, "step_in_epoch", 3, in);
  h5b::attr_u64(root, "seed", 1337, in);
  h5b::attr_u64(root, "config_hash", 0x9e3779b97f4a7c15ull, in);
  h5b::attr_f64(root, "tokens_seen", 40960, in);
  h5b::attr_i64(root, "world_size", 2, in);
  h5b::attr_str(root, "config", "[model]\nn_layer = 1\n", in);
  h5b::attr_i64(root, "n_layer", 1, in);
  h5b::attr_i64(root, "n_head", 1, in);
  h5b::attr_i64(root, "n_embd", 4, in);
  h5b::attr_i64(root, "block_size", 8, in);
  h5b::attr_i64(root, "vocab_size", 6, in);
  h5b::attr_str(root, "tokenizer", "byte", in);
  h5b::attr_i64(root, "eos_id", 5, in);
  if (in.u8() & 1) {
    const std::string bytes = in.bytes(256);
    std::vector<uint64_t> values(bytes.begin(), bytes.end());
    for (uint64_t& b : values) b &= 0xff;
    h5b::Id ds = h5b::dataset<uint64_t>(root, "tokenizer_data", H5T_STD_U8LE, {hsize_t(values.size())}, values, in);
    if (ds.valid()) h5b::attr_u64(ds, "checksum", 0, in);
  }

  static const char* const kGroups[3] = {"params", "adam/m", "adam/v"};
  int which = 0;
  if (!(h5b::mutate(in, which) && which % 3 == 0))
    h5b::Id(H5Gcreate2(root, "adam", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  for (int g = 0; g < 3; ++g) {
    if (h5b::mutate(in, which) && which % 4 == 0) {  // the group is missing or is a dataset
      if (which & 4) h5b::dataset<uint64_t>(root, kGroups[g], H5T_STD_U8LE, {1}, {0}, in);
      continue;
    }
    h5b::Id group(H5Gcreate2(root, kGroups[g], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    if (!group.valid()) continue;
    for (const auto& t : expected) {
      std::vector<float> values(written[g].begin() + t.offset, written[g].begin() + t.offset + t.size);
      std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
      h5b::Id ds = h5b::dataset<float>(group, t.name.c_str(), H5T_IEEE_F32LE, dims, values, in);
      if (ds.valid())
        h5b::attr_u64(ds, "checksum", kilter::io::checkpoint_checksum(values.data(), values.size()), in);
    }
    if (h5b::mutate(in, which) && which % 4 == 0) {  // a tensor the model does not have
      h5b::Id ds = h5b::dataset<float>(group, "transformer.extra", H5T_IEEE_F32LE, {2}, {1.0f, 2.0f}, in);
      if (ds.valid()) h5b::attr_u64(ds, "checksum", kilter::io::checkpoint_checksum(nullptr, 0), in);
    }
  }
  const std::string path = scratch_dir() + "/step-00000010.h5";
  const std::string image = h5b::maybe_truncated(file.image(), in);
  write_file(path, image.data(), image.size());

  try {
    (void)kilter::io::read_checkpoint_info(path);
  } catch (const kilter::Error& e) {
    if (h5b::debug()) std::fprintf(stderr, "read_checkpoint_info: %s\n", e.what());
  }
  std::vector<float> read[3];
  for (auto& r : read) r.assign(total, -7.0f);
  try {
    kilter::io::read_checkpoint_tensors(path, expected, read[0].data(), read[1].data(), read[2].data());
    for (int g = 0; g < 3; ++g)
      KILTER_FUZZ_EXPECT(std::memcmp(read[g].data(), written[g].data(), total * sizeof(float)) == 0,
                         "a checkpoint that reads gives back other tensors than were written");
  } catch (const kilter::Error& e) {
    if (h5b::debug()) std::fprintf(stderr, "read_checkpoint_tensors: %s\n", e.what());
  }
  return 0;
}
