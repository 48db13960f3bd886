// The checkpoint file format (see checkpoint.h): writing with HDF5 metadata + pwrite()d tensor
// data into a temp file that is fsync'ed and renamed, and reading with every check a resume needs.
#include "io/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include "io/error.h"
#include "io/text_format.h"
#include "io/write_failure.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoint tensors are pwrite()n as float32 little-endian host bytes");

namespace kilter::io {
namespace {

// A file whose H5Fclose failed (its metadata flush met a full disk or a quota) stays in HDF5's
// tables, and HDF5 1.10's clean-up at exit then crashes closing it again (H5F__close_cb, seen
// with a file size limit). kilter closes every file it opens itself, so that clean-up has nothing
// else to do: it is switched off before HDF5 starts (a no-op if HDF5 already has).
[[maybe_unused]] const bool kHdf5ExitCleanupOff = H5dont_atexit() >= 0;

// ---- HDF5 plumbing ---------------------------------------------------------------------------

// Owns an hid_t and closes it with the matching H5?close.
class Hid {
 public:
  Hid() = default;
  Hid(hid_t id, herr_t (*closer)(hid_t)) : id_(id), closer_(closer) {}
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  Hid(Hid&& other) noexcept : id_(other.id_), closer_(other.closer_) { other.id_ = -1; }
  Hid& operator=(Hid&& other) noexcept {
    std::swap(id_, other.id_);
    std::swap(closer_, other.closer_);
    return *this;
  }
  ~Hid() {
    if (id_ >= 0 && closer_) closer_(id_);
  }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now and reports the result (H5Fclose flushes: its failure matters).
  herr_t close() {
    herr_t status = 0;
    if (id_ >= 0 && closer_) status = closer_(id_);
    id_ = -1;
    return status;
  }

 private:
  hid_t id_ = -1;
  herr_t (*closer_)(hid_t) = nullptr;
};

// Silences HDF5's automatic error printing on this thread while alive (the messages go into our
// kilter::Error instead); HDF5's threadsafe build keeps this setting per thread.
class QuietHdf5 {
 public:
  QuietHdf5() {
    H5Eget_auto2(H5E_DEFAULT, &old_func_, &old_data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietHdf5() { H5Eset_auto2(H5E_DEFAULT, old_func_, old_data_); }

 private:
  H5E_auto2_t old_func_ = nullptr;
  void* old_data_ = nullptr;
};

herr_t collect_hdf5_error(unsigned n, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (err->desc && *err->desc) {
    if (!out->empty()) *out += "; ";
    *out += err->desc;
  }
  (void)n;
  return 0;
}

// The OS errno behind the last failed write of this thread's checkpoint write (0: none seen),
// from our own write calls or from HDF5's file driver; it picks the message's first line.
thread_local int t_write_errno = 0;

// The messages of HDF5's current error stack, innermost first, each once ("" when empty).
std::string hdf5_error_text() {
  std::string text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_hdf5_error, &text);
  H5Eclear2(H5E_DEFAULT);
  if (text.empty()) return "no HDF5 detail";
  if (int err = errno_in_hdf5_text(text)) t_write_errno = err;
  return compact_hdf5_text(text);
}

bool has_link(hid_t loc, const std::string& name) {
  htri_t exists = H5Lexists(loc, name.c_str(), H5P_DEFAULT);
  return exists > 0;
}

void write_string_attribute(hid_t loc, const char* name, const std::string& value, const std::string& path) {
  Hid type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  Hid attr(H5Acreate2(loc, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  const char* ptr = value.c_str();
  KILTER_CHECK(attr.valid() && H5Awrite(attr.get(), type.get(), &ptr) >= 0,
               "checkpoint " << path << ": cannot write attribute " << name << ": " << hdf5_error_text());
}

template <typename T>
void write_scalar_attribute(hid_t loc, const char* name, hid_t file_type, hid_t mem_type, T value,
                            const std::string& path) {
  Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  Hid attr(H5Acreate2(loc, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  KILTER_CHECK(attr.valid() && H5Awrite(attr.get(), mem_type, &value) >= 0,
               "checkpoint " << path << ": cannot write attribute " << name << ": " << hdf5_error_text());
}

Hid open_attribute(hid_t loc, const char* name, const std::string& path, const std::string& where) {
  KILTER_CHECK(H5Aexists(loc, name) > 0,
               "checkpoint " << path << ": " << where << " has no attribute '" << name
                             << "' (not a complete kilter checkpoint)");
  Hid attr(H5Aopen(loc, name, H5P_DEFAULT), H5Aclose);
  KILTER_CHECK(attr.valid(), "checkpoint " << path << ": cannot open attribute " << name << ": "
                                           << hdf5_error_text());
  // The readers read one value: an array attribute would overrun their buffer.
  Hid space(H5Aget_space(attr.get()), H5Sclose);
  KILTER_CHECK(H5Sget_simple_extent_npoints(space.get()) == 1,
               "checkpoint " << path << ": attribute '" << name << "' of " << where
                             << " is not a single value (corrupt file)");
  return attr;
}

std::string read_string_attribute(hid_t loc, const char* name, const std::string& path) {
  Hid attr = open_attribute(loc, name, path, "the root group");
  Hid file_type(H5Aget_type(attr.get()), H5Tclose);
  KILTER_CHECK(H5Tget_class(file_type.get()) == H5T_STRING,
               "checkpoint " << path << ": attribute '" << name << "' is not a string");
  if (H5Tis_variable_str(file_type.get()) > 0) {
    Hid mem_type(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem_type.get(), H5T_VARIABLE);
    H5Tset_cset(mem_type.get(), H5Tget_cset(file_type.get()));
    char* value = nullptr;
    KILTER_CHECK(H5Aread(attr.get(), mem_type.get(), &value) >= 0,
                 "checkpoint " << path << ": cannot read attribute " << name << ": " << hdf5_error_text());
    std::string out = value ? value : "";
    Hid space(H5Aget_space(attr.get()), H5Sclose);
    H5Dvlen_reclaim(mem_type.get(), space.get(), H5P_DEFAULT, &value);
    return out;
  }
  size_t size = H5Tget_size(file_type.get());
  std::string out(size, '\0');
  KILTER_CHECK(H5Aread(attr.get(), file_type.get(), out.data()) >= 0,
               "checkpoint " << path << ": cannot read attribute " << name << ": " << hdf5_error_text());
  out.resize(std::strlen(out.c_str()));
  return out;
}

template <typename T>
T read_scalar_attribute(hid_t loc, const char* name, hid_t mem_type, const std::string& path,
                        const std::string& where = "the root group") {
  Hid attr = open_attribute(loc, name, path, where);
  T value{};
  KILTER_CHECK(H5Aread(attr.get(), mem_type, &value) >= 0,
               "checkpoint " << path << ": cannot read attribute " << name << " of " << where << ": "
                             << hdf5_error_text());
  return value;
}

// Word-wise multiply-rotate mix (murmur-style constants) of a byte stream, seeded with `count`
// (the number of floats, or of bytes for /tokenizer_data), fed in pieces of any size: the result
// does not depend on how the stream was cut (finish_checkpoint_file hashes tensors piece by piece).
class StreamHash {
 public:
  explicit StreamHash(uint64_t count) : h_(0x9e3779b97f4a7c15ull ^ (count * k2)) {}
  void update(const void* data, size_t n_bytes) {
    // Fast enough to run over every checkpoint in the writer thread, and any flipped or zeroed
    // region changes it.
    const unsigned char* bytes = static_cast<const unsigned char*>(data);
    while (n_bytes > 0 && carried_ > 0 && carried_ < 8) {  // complete a word cut by the last piece
      carry_[carried_++] = *bytes++;
      --n_bytes;
      if (carried_ == 8) {
        mix(carry_);
        carried_ = 0;
      }
    }
    size_t i = 0;
    for (; i + 8 <= n_bytes; i += 8) mix(bytes + i);
    for (; i < n_bytes; ++i) carry_[carried_++] = bytes[i];
  }
  uint64_t finish() {
    uint64_t h = h_;
    if (carried_ > 0) {
      uint64_t w = 0;
      std::memcpy(&w, carry_, carried_);
      w *= k1;
      w = (w << 31) | (w >> 33);
      h ^= w * k2;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
  }

 private:
  static constexpr uint64_t k1 = 0x87c37b91114253d5ull, k2 = 0x4cf5ad432745937full;
  void mix(const unsigned char* word) {
    uint64_t w;
    std::memcpy(&w, word, 8);
    w *= k1;
    w = (w << 31) | (w >> 33);
    w *= k2;
    h_ ^= w;
    h_ = ((h_ << 27) | (h_ >> 37)) * 5 + 0x52dce729;
  }
  uint64_t h_;
  unsigned char carry_[8] = {};
  size_t carried_ = 0;
};

uint64_t hash_bytes(const void* data, size_t n_bytes, uint64_t count) {
  StreamHash hash(count);
  hash.update(data, n_bytes);
  return hash.finish();
}

// The checksum of /tokenizer_data.
uint64_t checkpoint_checksum_bytes(const void* data, size_t n_bytes) { return hash_bytes(data, n_bytes, n_bytes); }

// The tokenizer file's bytes as a 1-D uint8 dataset (an attribute is limited to 64 KiB).
void write_tokenizer_data(hid_t root, const std::string& bytes, const std::string& path) {
  hsize_t dims[1] = {hsize_t(bytes.size())};
  Hid space(H5Screate_simple(1, dims, nullptr), H5Sclose);
  Hid dset(H5Dcreate2(root, "tokenizer_data", H5T_STD_U8LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
           H5Dclose);
  KILTER_CHECK(dset.valid() && H5Dwrite(dset.get(), H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()) >= 0,
               "checkpoint " << path << ": cannot write /tokenizer_data: " << hdf5_error_text());
  const uint64_t checksum = checkpoint_checksum_bytes(bytes.data(), bytes.size());
  write_scalar_attribute<uint64_t>(dset.get(), "checksum", H5T_STD_U64LE, H5T_NATIVE_UINT64, checksum, path);
}

std::string read_tokenizer_data(hid_t root, const std::string& path) {
  Hid dset(H5Dopen2(root, "tokenizer_data", H5P_DEFAULT), H5Dclose);
  KILTER_CHECK(dset.valid(), "checkpoint " << path << ": cannot open /tokenizer_data: " << hdf5_error_text());
  Hid type(H5Dget_type(dset.get()), H5Tclose);
  Hid space(H5Dget_space(dset.get()), H5Sclose);
  KILTER_CHECK(H5Tget_class(type.get()) == H5T_INTEGER && H5Tget_size(type.get()) == 1 &&
                   H5Sget_simple_extent_ndims(space.get()) == 1,
               "checkpoint " << path << ": /tokenizer_data is not a 1-D uint8 dataset");
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.get(), &n, nullptr);
  std::string bytes(size_t(n), '\0');
  KILTER_CHECK(H5Dread(dset.get(), H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()) >= 0,
               "checkpoint " << path << ": reading /tokenizer_data failed (truncated or corrupt file): "
                             << hdf5_error_text());
  const uint64_t stored = read_scalar_attribute<uint64_t>(dset.get(), "checksum", H5T_NATIVE_UINT64, path,
                                                          "/tokenizer_data");
  KILTER_CHECK(stored == checkpoint_checksum_bytes(bytes.data(), bytes.size()),
               "checkpoint " << path << ": /tokenizer_data fails its checksum (the file was damaged after it was written)");
  return bytes;
}

// The document starts as a [n, 2] uint64 dataset of (id, count) rows, with a checksum.
void write_document_starts(hid_t root, const std::vector<std::pair<uint32_t, uint64_t>>& starts,
                           const std::string& path) {
  std::vector<uint64_t> rows;
  for (const auto& [id, count] : starts) rows.insert(rows.end(), {uint64_t(id), count});
  hsize_t dims[2] = {hsize_t(starts.size()), 2};
  Hid space(H5Screate_simple(2, dims, nullptr), H5Sclose);
  Hid dset(H5Dcreate2(root, "document_starts", H5T_STD_U64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
           H5Dclose);
  KILTER_CHECK(dset.valid() && H5Dwrite(dset.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data()) >= 0,
               "checkpoint " << path << ": cannot write /document_starts: " << hdf5_error_text());
  const uint64_t checksum = checkpoint_checksum_bytes(rows.data(), rows.size() * sizeof(uint64_t));
  write_scalar_attribute<uint64_t>(dset.get(), "checksum", H5T_STD_U64LE, H5T_NATIVE_UINT64, checksum, path);
}

std::vector<std::pair<uint32_t, uint64_t>> read_document_starts(hid_t root, const std::string& path) {
  Hid dset(H5Dopen2(root, "document_starts", H5P_DEFAULT), H5Dclose);
  KILTER_CHECK(dset.valid(), "checkpoint " << path << ": cannot open /document_starts: " << hdf5_error_text());
  Hid type(H5Dget_type(dset.get()), H5Tclose);
  Hid space(H5Dget_space(dset.get()), H5Sclose);
  hsize_t dims[2] = {0, 0};
  KILTER_CHECK(H5Tget_class(type.get()) == H5T_INTEGER && H5Sget_simple_extent_ndims(space.get()) == 2 &&
                   H5Sget_simple_extent_dims(space.get(), dims, nullptr) == 2 && dims[1] == 2,
               "checkpoint " << path << ": /document_starts is not an [n, 2] integer dataset");
  std::vector<uint64_t> rows(size_t(dims[0]) * 2);
  KILTER_CHECK(H5Dread(dset.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data()) >= 0,
               "checkpoint " << path << ": reading /document_starts failed (truncated or corrupt file): "
                             << hdf5_error_text());
  const uint64_t stored = read_scalar_attribute<uint64_t>(dset.get(), "checksum", H5T_NATIVE_UINT64, path,
                                                          "/document_starts");
  KILTER_CHECK(stored == checkpoint_checksum_bytes(rows.data(), rows.size() * sizeof(uint64_t)),
               "checkpoint " << path << ": /document_starts fails its checksum (the file was damaged after it was written)");
  std::vector<std::pair<uint32_t, uint64_t>> starts;
  for (size_t i = 0; i < rows.size(); i += 2) {
    KILTER_CHECK(rows[i] <= UINT32_MAX, "checkpoint " << path << ": /document_starts row " << i / 2 << " holds id "
                                                       << rows[i] << ", which is not a token id");
    starts.emplace_back(uint32_t(rows[i]), rows[i + 1]);
  }
  return starts;
}

// The three tensor groups, in file order, with the flat buffer each one reads from / into.
const char* const kTensorGroups[3] = {"params", "adam/m", "adam/v"};

// ---- POSIX plumbing --------------------------------------------------------------------------

std::string parent_dir(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

void pwrite_all(int fd, const char* data, size_t bytes, off_t offset, const std::string& path) {
  while (bytes > 0) {
    ssize_t n = ::pwrite(fd, data, bytes, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) t_write_errno = n < 0 ? errno : ENOSPC;
    KILTER_CHECK(n > 0, "checkpoint " << path << ": write failed: " << std::strerror(t_write_errno));
    data += n;
    bytes -= size_t(n);
    offset += n;
  }
}

void fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  KILTER_CHECK(fd >= 0, "checkpoint folder " << dir << ": cannot open for fsync: " << std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems (and /proc-like mounts) refuse fsync on a directory; the rename is still
  // atomic there, only its durability across power loss is not promised.
  KILTER_CHECK(rc == 0 || err == EINVAL || err == EROFS,
               "checkpoint folder " << dir << ": fsync failed: " << std::strerror(err));
}

// Parses "step-NNNNNNNN.h5" (digits only between the dash and the suffix); -1 otherwise.
int64_t step_of_file_name(const std::string& name) {
  const std::string prefix = "step-", suffix = ".h5";
  if (name.size() <= prefix.size() + suffix.size()) return -1;
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  if (name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return -1;
  std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.empty() || digits.size() > 18) return -1;
  for (char c : digits)
    if (c < '0' || c > '9') return -1;
  return std::stoll(digits);
}

std::vector<std::string> directory_entries(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return names;
  while (dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  return names;
}

// fsync()s and closes `fd`, the temp file `tmp` of `final_path`, and renames it to final_path.
void sync_close_and_rename(int fd, const std::string& tmp, const std::string& final_path) {
  const int synced = ::fsync(fd);
  const int sync_errno = errno;
  const int closed = ::close(fd);
  const int close_errno = errno;
  if (synced != 0) {
    t_write_errno = sync_errno;
    KILTER_FAIL("checkpoint " << final_path << ": fsync of " << tmp << " failed: " << std::strerror(sync_errno));
  }
  if (closed != 0) {
    t_write_errno = close_errno;
    KILTER_FAIL("checkpoint " << final_path << ": close of " << tmp << " failed: " << std::strerror(close_errno));
  }
  KILTER_CHECK(::rename(tmp.c_str(), final_path.c_str()) == 0,
               "checkpoint " << final_path << ": rename from " << tmp << " failed: " << std::strerror(errno));
}

// Where each tensor's bytes go in the temp file, found after HDF5 allocated the space.
struct PendingWrite {
  const float* data;
  size_t count;
  haddr_t file_offset;
};

}  // namespace

uint64_t checkpoint_checksum(const float* data, size_t count) {
  return hash_bytes(data, count * sizeof(float), count);
}

std::string checkpoint_file_name(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "step-%08lld.h5", static_cast<long long>(step));
  return buf;
}

std::string checkpoint_temp_path(const std::string& final_path) {
  auto slash = final_path.find_last_of('/');
  std::string dir = slash == std::string::npos ? "" : final_path.substr(0, slash + 1);
  std::string name = slash == std::string::npos ? final_path : final_path.substr(slash + 1);
  return dir + "." + name + ".tmp";
}

namespace {
// Checks the tensors' shapes and sizes against the flat buffers' size (num_floats each).
void check_tensors(const std::string& final_path, const std::vector<CheckpointTensor>& tensors,
                   const size_t buffer_sizes[3]) {
  for (const auto& t : tensors) {
    int64_t elements = 1;
    for (int64_t d : t.shape) elements *= d;
    KILTER_CHECK(size_t(elements) == t.size && t.size > 0,
                 "checkpoint " << final_path << ": tensor " << t.name << " has shape " << shape_text(t.shape)
                               << " but size " << t.size);
    for (int g = 0; g < 3; ++g)
      KILTER_CHECK(t.offset + t.size <= buffer_sizes[g],
                   "checkpoint " << final_path << ": tensor " << t.name << " lies outside the "
                                 << kTensorGroups[g] << " buffer (" << buffer_sizes[g] << " floats)");
  }
}

// Step 1 of both writers: the temp file with every dataset allocated and every attribute, closed.
// Each tensor's checksum comes from buffers[group] (nullptr: 0, for finish_checkpoint_file to
// fill). Returns each tensor's file offset (CheckpointFileOffsets order). The caller removes the
// temp file on failure.
CheckpointFileOffsets create_temp_file(const std::string& final_path, const std::string& tmp, const CheckpointInfo& info,
                                       const std::vector<CheckpointTensor>& tensors, const float* const buffers[3]) {
  QuietHdf5 quiet;
  CheckpointFileOffsets offsets;
  offsets.reserve(3 * tensors.size());
  {
    Hid file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    KILTER_CHECK(file.valid(), "checkpoint " << final_path << ": cannot create temp file " << tmp << ": "
                                             << hdf5_error_text());
    Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS);
    H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY);
    H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
    Hid lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
    H5Pset_create_intermediate_group(lcpl.get(), 1);
    for (int g = 0; g < 3; ++g) {
      Hid group(H5Gcreate2(file.get(), kTensorGroups[g], lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      KILTER_CHECK(group.valid(), "checkpoint " << final_path << ": cannot create group /" << kTensorGroups[g]
                                                << ": " << hdf5_error_text());
      for (const auto& t : tensors) {
        std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
        Hid space(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose);
        Hid dset(H5Dcreate2(group.get(), t.name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT,
                            dcpl.get(), H5P_DEFAULT),
                 H5Dclose);
        KILTER_CHECK(dset.valid(), "checkpoint " << final_path << ": cannot create dataset /" << kTensorGroups[g]
                                                 << "/" << t.name << ": " << hdf5_error_text());
        const uint64_t checksum = buffers ? checkpoint_checksum(buffers[g] + t.offset, t.size) : 0;
        write_scalar_attribute<uint64_t>(dset.get(), "checksum", H5T_STD_U64LE, H5T_NATIVE_UINT64, checksum,
                                         final_path);
        haddr_t offset = H5Dget_offset(dset.get());
        KILTER_CHECK(offset != HADDR_UNDEF, "checkpoint " << final_path << ": dataset /" << kTensorGroups[g]
                                                          << "/" << t.name << " has no file offset");
        offsets.push_back(uint64_t(offset));
      }
    }
        hid_t root = file.get();
    write_string_attribute(root, "format", kCheckpointFormatName, final_path);
    write_scalar_attribute<int64_t>(root, "format_version", H5T_STD_I64LE, H5T_NATIVE_INT64, info.format_version, final_path);
    write_string_attribute(root, "kilter_version", info.kilter_version, final_path);
    write_scalar_attribute<int64_t>(root, "step", H5T_STD_I64LE, H5T_NATIVE_INT64, info.step, final_path);
    write_scalar_attribute<int64_t>(root, "epoch", H5T_STD_I64LE, H5T_NATIVE_INT64, info.epoch, final_path);
    write_scalar_attribute<int64_t>(root, "step_in_epoch", H5T_STD_I64LE, H5T_NATIVE_INT64, info.step_in_epoch, final_path);
    write_scalar_attribute<uint64_t>(root, "seed", H5T_STD_U64LE, H5T_NATIVE_UINT64, info.seed, final_path);
    write_scalar_attribute<uint64_t>(root, "config_hash", H5T_STD_U64LE, H5T_NATIVE_UINT64, info.config_hash, final_path);
    write_scalar_attribute<double>(root, "tokens_seen", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, info.tokens_seen, final_path);
    write_scalar_attribute<int64_t>(root, "world_size", H5T_STD_I64LE, H5T_NATIVE_INT64, info.world_size, final_path);
    write_scalar_attribute<double>(root, "cut_cost_t", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, info.cut_cost_t, final_path);
    write_string_attribute(root, "config", info.config, final_path);
    write_scalar_attribute<int64_t>(root, "n_layer", H5T_STD_I64LE, H5T_NATIVE_INT64, info.n_layer, final_path);
    write_scalar_attribute<int64_t>(root, "n_head", H5T_STD_I64LE, H5T_NATIVE_INT64, info.n_head, final_path);
    write_scalar_attribute<int64_t>(root, "n_embd", H5T_STD_I64LE, H5T_NATIVE_INT64, info.n_embd, final_path);
    write_scalar_attribute<int64_t>(root, "block_size", H5T_STD_I64LE, H5T_NATIVE_INT64, info.block_size, final_path);
    write_scalar_attribute<int64_t>(root, "vocab_size", H5T_STD_I64LE, H5T_NATIVE_INT64, info.vocab_size, final_path);
    write_string_attribute(root, "tokenizer", info.tokenizer, final_path);
    write_scalar_attribute<int64_t>(root, "eos_id", H5T_STD_I64LE, H5T_NATIVE_INT64, info.eos_id, final_path);
    if (!info.tokenizer_data.empty()) write_tokenizer_data(root, info.tokenizer_data, final_path);
    if (!info.document_starts.empty()) write_document_starts(root, info.document_starts, final_path);
    KILTER_CHECK(file.close() >= 0, "checkpoint " << final_path << ": closing temp file " << tmp
                                                  << " failed: " << hdf5_error_text());

  }
  return offsets;
}

void write_checkpoint_file_unchecked(const std::string& final_path, const CheckpointContents& c,
                                     const CheckpointWriteOptions& opts) {
  const std::string tmp = checkpoint_temp_path(final_path);
  const float* buffers[3] = {c.params.data(), c.adam_m.data(), c.adam_v.data()};
  const size_t buffer_sizes[3] = {c.params.size(), c.adam_m.size(), c.adam_v.size()};
  check_tensors(final_path, c.tensors, buffer_sizes);
  ::unlink(tmp.c_str());  // a leftover of a writer that died

  std::vector<PendingWrite> pending;
  try {
    // 1. Metadata with HDF5: every dataset contiguous and allocated now (no fill values written),
    //    so its file offset is known and the bytes can be written without HDF5 afterwards.
    const CheckpointFileOffsets offsets = create_temp_file(final_path, tmp, c.info, c.tensors, buffers);
    for (int g = 0; g < 3; ++g)
      for (size_t i = 0; i < c.tensors.size(); ++i) {
        const CheckpointTensor& t = c.tensors[i];
        pending.push_back({buffers[g] + t.offset, t.size, haddr_t(offsets[g * c.tensors.size() + i])});
      }
    // 2. The tensor bytes, straight into the allocated space, then fsync.
    int fd = ::open(tmp.c_str(), O_WRONLY);
    if (fd < 0) t_write_errno = errno;
    KILTER_CHECK(fd >= 0, "checkpoint " << final_path << ": cannot reopen temp file " << tmp << ": "
                                        << std::strerror(t_write_errno));
    try {
      size_t total = 0, written = 0;
      for (const auto& p : pending) total += p.count;
      bool delayed = opts.delay_midway_s <= 0;
      for (const auto& p : pending) {
        pwrite_all(fd, reinterpret_cast<const char*>(p.data), p.count * sizeof(float), off_t(p.file_offset), tmp);
        written += p.count;
        if (!delayed && written * 2 >= total) {
          delayed = true;
          std::this_thread::sleep_for(std::chrono::duration<double>(opts.delay_midway_s));
        }
      }
    } catch (...) {
      ::close(fd);
      throw;
    }
    // 3. Publish atomically.
    sync_close_and_rename(fd, tmp, final_path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_directory(parent_dir(final_path));
}
}  // namespace

namespace {
// Bytes a checkpoint file takes, rounded up: tensor data (`floats` of all three groups), the two
// texts, /document_starts (two uint64 a row), and HDF5's metadata: the superblock and groups
// (16 kB covers them) and an object header with a checksum attribute per dataset (under 1 kB each).
uint64_t size_estimate(uint64_t floats, const CheckpointInfo& info, size_t n_tensors) {
  return floats * sizeof(float) + info.tokenizer_data.size() + info.config.size() + info.document_starts.size() * 16 +
         16 * 1024 + 3 * n_tensors * 1024;
}

// A write that cannot fit is refused before it fills the file system: the other files of the
// run (metrics, the next checkpoint) and other jobs keep the space that is left.
void check_free_space(const std::string& final_path, uint64_t needed) {
  const std::string dir = parent_dir(final_path);
  const int64_t available = free_bytes(dir);
  KILTER_CHECK(available < 0 || uint64_t(available) >= needed,
               "checkpoint " << final_path << " not written: " << describe_write_errno(ENOSPC, dir) << " ("
                             << human_bytes(needed) << " needed, " << human_bytes(uint64_t(available))
                             << " free); " << write_errno_advice(ENOSPC, dir, "output.dir"));
}

// Runs `write`; a storage fault it meets (full, quota, read-only, ...) is rethrown leading with
// what happened and what to do, the failing call and HDF5's own messages following once as the
// detail. `needed`: the file's size estimate (0: not said).
template <typename Write>
void with_storage_faults(const std::string& final_path, uint64_t needed, Write&& write) {
  t_write_errno = 0;
  try {
    write();
  } catch (const Error& e) {
    const int err = t_write_errno;
    if (!is_storage_errno(err)) throw;
    const std::string dir = parent_dir(final_path);
    std::string space;
    if (err == ENOSPC && needed > 0) {
      const int64_t now_free = free_bytes(dir);
      space = " (" + human_bytes(needed) + " needed" +
              (now_free >= 0 ? ", " + human_bytes(uint64_t(now_free)) + " free" : std::string()) + ")";
    }
    KILTER_FAIL("checkpoint " << final_path << " not written: " << describe_write_errno(err, dir) << space << "; "
                              << write_errno_advice(err, dir, "output.dir") << "\n  detail: " << e.message());
  }
}

// The tensor holding flat position `at` (tensors in layout order), or tensors.size() if none
// holds it (padding beyond, or a gap).
size_t tensor_at(const std::vector<CheckpointTensor>& tensors, size_t at) {
  auto it = std::upper_bound(tensors.begin(), tensors.end(), at,
                             [](size_t x, const CheckpointTensor& t) { return x < t.offset; });
  if (it == tensors.begin()) return tensors.size();
  --it;
  return at < it->offset + it->size ? size_t(it - tensors.begin()) : tensors.size();
}

// Floats read back per piece by finish_checkpoint_file (16 MiB).
constexpr size_t kReadBackPiece = size_t(1) << 22;
}  // namespace

uint64_t checkpoint_size_estimate(const CheckpointContents& c) {
  return size_estimate(c.params.size() + c.adam_m.size() + c.adam_v.size(), c.info, c.tensors.size());
}

void write_checkpoint_file(const std::string& final_path, const CheckpointContents& c,
                           const CheckpointWriteOptions& opts) {
  const uint64_t needed = checkpoint_size_estimate(c);
  check_free_space(final_path, needed);
  with_storage_faults(final_path, needed, [&] { write_checkpoint_file_unchecked(final_path, c, opts); });
}

CheckpointFileOffsets create_checkpoint_file(const std::string& final_path, const CheckpointInfo& info,
                                             const std::vector<CheckpointTensor>& tensors) {
  size_t floats = 0;
  for (const auto& t : tensors) floats = std::max(floats, t.offset + t.size);
  const size_t sizes[3] = {floats, floats, floats};
  check_tensors(final_path, tensors, sizes);
  KILTER_CHECK(std::is_sorted(tensors.begin(), tensors.end(),
                              [](const CheckpointTensor& a, const CheckpointTensor& b) { return a.offset < b.offset; }),
               "checkpoint " << final_path << ": tensors are not in layout order");
  uint64_t data_floats = 0;
  for (const auto& t : tensors) data_floats += 3 * t.size;
  const uint64_t needed = size_estimate(data_floats, info, tensors.size());
  check_free_space(final_path, needed);
  const std::string tmp = checkpoint_temp_path(final_path);
  ::unlink(tmp.c_str());  // a leftover of a writer that died
  CheckpointFileOffsets offsets;
  try {
    with_storage_faults(final_path, needed, [&] { offsets = create_temp_file(final_path, tmp, info, tensors, nullptr); });
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  return offsets;
}

CheckpointSliceWriter::CheckpointSliceWriter(const std::string& final_path, const std::vector<CheckpointTensor>& tensors,
                                             CheckpointFileOffsets offsets)
    : final_path_(final_path), tmp_(checkpoint_temp_path(final_path)), tensors_(tensors), offsets_(std::move(offsets)) {
  KILTER_CHECK(offsets_.size() == 3 * tensors_.size(), "checkpoint " << final_path_ << ": " << offsets_.size()
                                                                     << " file offsets for " << tensors_.size()
                                                                     << " tensors");
  with_storage_faults(final_path_, 0, [&] {
    fd_ = ::open(tmp_.c_str(), O_WRONLY);
    if (fd_ < 0) t_write_errno = errno;
    KILTER_CHECK(fd_ >= 0, "checkpoint " << final_path_ << ": cannot open temp file " << tmp_ << ": "
                                         << std::strerror(t_write_errno));
  });
}

CheckpointSliceWriter::~CheckpointSliceWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void CheckpointSliceWriter::write(int group, size_t first, const float* data, size_t count) {
  KILTER_CHECK(group >= 0 && group < 3 && fd_ >= 0, "checkpoint " << final_path_ << ": slice write to group "
                                                                  << group << " of a closed writer");
  with_storage_faults(final_path_, 0, [&] {
    const size_t end = first + count;
    size_t at = first;
    while (at < end) {
      const size_t i = tensor_at(tensors_, at);
      if (i == tensors_.size()) {  // padding or a gap: skip to the next tensor's start, if any
        auto next = std::upper_bound(tensors_.begin(), tensors_.end(), at,
                                     [](size_t x, const CheckpointTensor& t) { return x < t.offset; });
        if (next == tensors_.end()) break;
        at = std::max(at + 1, next->offset);
        continue;
      }
      const CheckpointTensor& t = tensors_[i];
      const size_t n = std::min(end, t.offset + t.size) - at;
      const uint64_t file_offset = offsets_[size_t(group) * tensors_.size() + i] + (at - t.offset) * sizeof(float);
      pwrite_all(fd_, reinterpret_cast<const char*>(data + (at - first)), n * sizeof(float), off_t(file_offset), tmp_);
      at += n;
    }
  });
}

void CheckpointSliceWriter::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  with_storage_faults(final_path_, 0, [&] {
    if (::close(fd) != 0) {
      t_write_errno = errno;
      KILTER_FAIL("checkpoint " << final_path_ << ": close of " << tmp_ << " failed: " << std::strerror(t_write_errno));
    }
  });
}

void finish_checkpoint_file(const std::string& final_path, const std::vector<CheckpointTensor>& tensors,
                            const CheckpointFileOffsets& offsets) {
  const std::string tmp = checkpoint_temp_path(final_path);
  KILTER_CHECK(offsets.size() == 3 * tensors.size(), "checkpoint " << final_path << ": " << offsets.size()
                                                                   << " file offsets for " << tensors.size() << " tensors");
  try {
    with_storage_faults(final_path, 0, [&] {
      // 1. Each tensor's checksum, from its bytes as they are in the file, read in bounded pieces.
      std::vector<uint64_t> checksums(offsets.size());
      {
        int fd = ::open(tmp.c_str(), O_RDONLY);
        KILTER_CHECK(fd >= 0, "checkpoint " << final_path << ": cannot open temp file " << tmp << ": "
                                            << std::strerror(errno));
        std::vector<char> piece;
        try {
          for (size_t k = 0; k < offsets.size(); ++k) {
            const CheckpointTensor& t = tensors[k % tensors.size()];
            StreamHash hash(t.size);
            for (size_t done = 0; done < t.size;) {
              const size_t n = std::min(kReadBackPiece, t.size - done);
              piece.resize(n * sizeof(float));
              size_t got = 0;
              while (got < piece.size()) {
                ssize_t r = ::pread(fd, piece.data() + got, piece.size() - got,
                                    off_t(offsets[k] + done * sizeof(float) + got));
                if (r < 0 && errno == EINTR) continue;
                KILTER_CHECK(r > 0, "checkpoint " << final_path << ": reading back " << tmp << " failed: "
                                                  << (r < 0 ? std::strerror(errno) : "unexpected end of file"));
                got += size_t(r);
              }
              hash.update(piece.data(), piece.size());
              done += n;
            }
            checksums[k] = hash.finish();
          }
        } catch (...) {
          ::close(fd);
          throw;
        }
        ::close(fd);
      }
      // 2. The checksums into their attributes (in place: the file keeps its layout).
      {
        QuietHdf5 quiet;
        Hid file(H5Fopen(tmp.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
        KILTER_CHECK(file.valid(), "checkpoint " << final_path << ": cannot reopen temp file " << tmp << ": "
                                                 << hdf5_error_text());
        for (size_t k = 0; k < offsets.size(); ++k) {
          const std::string name =
              std::string("/") + kTensorGroups[k / tensors.size()] + "/" + tensors[k % tensors.size()].name;
          Hid dset(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
          KILTER_CHECK(dset.valid(), "checkpoint " << final_path << ": cannot open dataset " << name << ": "
                                                   << hdf5_error_text());
          Hid attr(H5Aopen(dset.get(), "checksum", H5P_DEFAULT), H5Aclose);
          KILTER_CHECK(attr.valid() && H5Awrite(attr.get(), H5T_NATIVE_UINT64, &checksums[k]) >= 0,
                       "checkpoint " << final_path << ": cannot write the checksum of " << name << ": "
                                     << hdf5_error_text());
        }
        KILTER_CHECK(file.close() >= 0, "checkpoint " << final_path << ": closing temp file " << tmp
                                                      << " failed: " << hdf5_error_text());
      }
      // 3. Every process's data and the attributes reach the disk, then publish atomically.
      int fd = ::open(tmp.c_str(), O_WRONLY);
      if (fd < 0) t_write_errno = errno;
      KILTER_CHECK(fd >= 0, "checkpoint " << final_path << ": cannot reopen temp file " << tmp << ": "
                                          << std::strerror(t_write_errno));
      sync_close_and_rename(fd, tmp, final_path);
    });
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_directory(parent_dir(final_path));
}

void abandon_checkpoint_file(const std::string& final_path) { ::unlink(checkpoint_temp_path(final_path).c_str()); }

CheckpointInfo read_checkpoint_info(const std::string& path) {
  struct stat st;
  KILTER_CHECK(::stat(path.c_str(), &st) == 0, "checkpoint " << path << ": " << std::strerror(errno));
  KILTER_CHECK(S_ISREG(st.st_mode), "checkpoint " << path << ": not a regular file");
  QuietHdf5 quiet;
  Hid file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  KILTER_CHECK(file.valid(), "checkpoint " << path << " (" << st.st_size
                                           << " bytes) cannot be opened as HDF5 - truncated or corrupt file\n  detail: HDF5: "
                                           << hdf5_error_text());
  hid_t root = file.get();
  CheckpointInfo info;
  std::string format = read_string_attribute(root, "format", path);
  KILTER_CHECK(format == kCheckpointFormatName,
               "checkpoint " << path << ": format attribute is '" << format << "', expected '"
                             << kCheckpointFormatName << "' (not a kilter checkpoint)");
  info.format_version = int(read_scalar_attribute<int64_t>(root, "format_version", H5T_NATIVE_INT64, path));
  KILTER_CHECK(info.format_version == kCheckpointFormatVersion,
               "checkpoint " << path << ": format_version " << info.format_version << " is not supported (this kilter reads format_version "
                             << kCheckpointFormatVersion << ")");
  info.kilter_version = read_string_attribute(root, "kilter_version", path);
  info.step = read_scalar_attribute<int64_t>(root, "step", H5T_NATIVE_INT64, path);
  info.epoch = read_scalar_attribute<int64_t>(root, "epoch", H5T_NATIVE_INT64, path);
  info.step_in_epoch = read_scalar_attribute<int64_t>(root, "step_in_epoch", H5T_NATIVE_INT64, path);
  info.seed = read_scalar_attribute<uint64_t>(root, "seed", H5T_NATIVE_UINT64, path);
  info.config_hash = read_scalar_attribute<uint64_t>(root, "config_hash", H5T_NATIVE_UINT64, path);
  info.tokens_seen = read_scalar_attribute<double>(root, "tokens_seen", H5T_NATIVE_DOUBLE, path);
  info.world_size = read_scalar_attribute<int64_t>(root, "world_size", H5T_NATIVE_INT64, path);
  if (H5Aexists(root, "cut_cost_t") > 0)  // checkpoints written before the cut-cost check have none
    info.cut_cost_t = read_scalar_attribute<double>(root, "cut_cost_t", H5T_NATIVE_DOUBLE, path);
  info.config = read_string_attribute(root, "config", path);
  info.n_layer = read_scalar_attribute<int64_t>(root, "n_layer", H5T_NATIVE_INT64, path);
  info.n_head = read_scalar_attribute<int64_t>(root, "n_head", H5T_NATIVE_INT64, path);
  info.n_embd = read_scalar_attribute<int64_t>(root, "n_embd", H5T_NATIVE_INT64, path);
  info.block_size = read_scalar_attribute<int64_t>(root, "block_size", H5T_NATIVE_INT64, path);
  info.vocab_size = read_scalar_attribute<int64_t>(root, "vocab_size", H5T_NATIVE_INT64, path);
  if (H5Aexists(root, "tokenizer") > 0) {  // checkpoints written before issue 14 have none
    info.tokenizer = read_string_attribute(root, "tokenizer", path);
    info.eos_id = read_scalar_attribute<int64_t>(root, "eos_id", H5T_NATIVE_INT64, path);
    if (has_link(root, "tokenizer_data")) info.tokenizer_data = read_tokenizer_data(root, path);
  }
  if (has_link(root, "document_starts")) info.document_starts = read_document_starts(root, path);
  KILTER_CHECK(info.step >= 0 && info.epoch >= 0 && info.step_in_epoch >= 0,
               "checkpoint " << path << ": negative step, epoch or step_in_epoch (corrupt attributes)");
  return info;
}

namespace {
herr_t collect_link_name(hid_t, const char* name, const H5L_info_t*, void* data) {
  static_cast<std::set<std::string>*>(data)->insert(name);
  return 0;
}
}  // namespace

namespace {
// Reads every tensor of `expected` from the group /kTensorGroups[g] into out (flat, by offset),
// verifying shapes, types and checksums, and that the group holds nothing else.
void read_tensor_group(hid_t file, const std::string& path, int g, const std::vector<CheckpointTensor>& expected,
                       float* out_base) {
  const std::string group_name = kTensorGroups[g];
  KILTER_CHECK(has_link(file, "adam") || g == 0, "checkpoint " << path << ": group /adam is missing (no optimizer state)");
  KILTER_CHECK(has_link(file, group_name), "checkpoint " << path << ": group /" << group_name << " is missing");
  Hid group(H5Gopen2(file, group_name.c_str(), H5P_DEFAULT), H5Gclose);
  KILTER_CHECK(group.valid(), "checkpoint " << path << ": cannot open group /" << group_name << ": " << hdf5_error_text());
  std::set<std::string> present;
  H5Literate(group.get(), H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, collect_link_name, &present);
  for (const auto& t : expected) {
    const std::string where = "/" + group_name + "/" + t.name;
    KILTER_CHECK(present.count(t.name), "checkpoint " << path << ": tensor " << where
                                                      << " is missing (the model has it; was the checkpoint written for another model?)");
    present.erase(t.name);
    Hid dset(H5Dopen2(group.get(), t.name.c_str(), H5P_DEFAULT), H5Dclose);
    KILTER_CHECK(dset.valid(), "checkpoint " << path << ": cannot open " << where << ": " << hdf5_error_text());
    Hid type(H5Dget_type(dset.get()), H5Tclose);
    KILTER_CHECK(H5Tget_class(type.get()) == H5T_FLOAT && H5Tget_size(type.get()) == 4,
                 "checkpoint " << path << ": " << where << " is not float32");
    Hid space(H5Dget_space(dset.get()), H5Sclose);
    int rank = H5Sget_simple_extent_ndims(space.get());
    std::vector<hsize_t> dims(rank > 0 ? size_t(rank) : 0);
    if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    std::vector<int64_t> shape(dims.begin(), dims.end());
    KILTER_CHECK(shape == t.shape, "checkpoint " << path << ": " << where << " has shape " << shape_text(shape)
                                                 << " but the configured model needs " << shape_text(t.shape)
                                                 << " (check the model.* keys)");
    float* out = out_base + t.offset;
    KILTER_CHECK(H5Dread(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) >= 0,
                 "checkpoint " << path << ": reading " << where << " failed (truncated or corrupt file): "
                               << hdf5_error_text());
    uint64_t stored = read_scalar_attribute<uint64_t>(dset.get(), "checksum", H5T_NATIVE_UINT64, path, where);
    uint64_t actual = checkpoint_checksum(out, t.size);
    KILTER_CHECK(stored == actual, "checkpoint " << path << ": " << where
                                                 << " fails its checksum (the file was damaged after it was written)");
  }
  KILTER_CHECK(present.empty(), "checkpoint " << path << ": has tensor /" << group_name << "/" << *present.begin()
                                              << " that the configured model does not have (check the model.* keys)");
}
}  // namespace

void read_checkpoint_tensors(const std::string& path, const std::vector<CheckpointTensor>& expected,
                             float* params, float* adam_m, float* adam_v) {
  QuietHdf5 quiet;
  Hid file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  KILTER_CHECK(file.valid(), "checkpoint " << path << " cannot be opened as HDF5 - truncated or corrupt file\n  detail: HDF5: "
                                           << hdf5_error_text());
  float* buffers[3] = {params, adam_m, adam_v};
  for (int g = 0; g < 3; ++g) read_tensor_group(file.get(), path, g, expected, buffers[g]);
}

void read_checkpoint_params(const std::string& path, const std::vector<CheckpointTensor>& expected, float* params) {
  QuietHdf5 quiet;
  Hid file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  KILTER_CHECK(file.valid(), "checkpoint " << path << " cannot be opened as HDF5 - truncated or corrupt file\n  detail: HDF5: "
                                           << hdf5_error_text());
  read_tensor_group(file.get(), path, 0, expected, params);
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  for (const auto& name : directory_entries(dir)) {
    int64_t step = step_of_file_name(name);
    if (step >= 0) found.emplace_back(step, dir + "/" + name);
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::vector<std::string> prune_checkpoints(const std::string& dir, int keep) {
  std::vector<std::string> removed;
  auto all = list_checkpoints(dir);
  if (keep < 1) keep = 1;  // never delete the newest
  for (size_t i = 0; i + size_t(keep) < all.size(); ++i) {
    if (::unlink(all[i].second.c_str()) == 0) removed.push_back(all[i].second);
  }
  return removed;
}

std::vector<std::string> stale_temp_files(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& name : directory_entries(dir)) {
    const std::string suffix = ".tmp";
    if (name.size() > 1 + suffix.size() && name[0] == '.' &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        step_of_file_name(name.substr(1, name.size() - 1 - suffix.size())) >= 0)
      found.push_back(dir + "/" + name);
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::vector<std::string> remove_stale_temp_files(const std::string& dir) {
  std::vector<std::string> removed;
  for (const auto& path : stale_temp_files(dir))
    if (::unlink(path.c_str()) == 0) removed.push_back(path);
  return removed;
}

}  // namespace kilter::io
