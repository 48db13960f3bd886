// Small RAII layer over the HDF5 C API used by the datasets and the checkpoints: owned handles,
// groups, attribute read/write by name, contiguous datasets, and error messages that carry HDF5's
// own error text. HDF5's automatic error printing is switched off; failures become kilter::Error.
// `path` in every signature is what a message names the file by (a path, or a label such as
// "checkpoint runs/x/checkpoints/step-00000010.h5").
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace kilter::io::h5 {

// An owned hid_t closed with the matching H5*close on destruction.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  ~Handle() { reset(); }
  Handle(Handle&& other) noexcept : id_(other.id_), closer_(other.closer_) { other.id_ = -1; }
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = std::exchange(other.id_, -1);
      closer_ = other.closer_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset() { close(); }
  // Closes now and returns the closer's status (H5Fclose flushes the file: its failure matters).
  herr_t close() {
    herr_t status = 0;
    if (id_ >= 0 && closer_) status = closer_(id_);
    id_ = -1;
    return status;
  }

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

// Turns off HDF5's printing of error stacks for the calling thread (idempotent, cheap).
void silence_errors();

// The innermost message on the calling thread's HDF5 error stack ("" when empty); clears it.
std::string last_error();
// Every message on the stack, innermost first, each once, on one line ("" when empty); clears it.
// For failures whose whole stack is the detail a developer needs (a flush that met a full disk).
std::string error_stack();

// Opening and creating; each throws kilter::Error naming `path` (and `name`) on failure.
Handle open_file(const std::string& path, bool writable = false);
Handle create_file(const std::string& path);  // truncates
Handle open_dataset(hid_t file, const std::string& name, const std::string& path);
bool has_link(hid_t loc, const std::string& name);

// Groups. create_group makes missing parents too ("adam/m" makes /adam).
Handle create_group(hid_t loc, const std::string& name, const std::string& path);
Handle open_group(hid_t loc, const std::string& name, const std::string& path);
// The names of a group's members (datasets and groups).
std::set<std::string> member_names(hid_t group, const std::string& path);

// Attributes on the root group (or any object). Writers replace an attribute of the same name;
// their messages name `path` when one is given. Scalar types in the file: uint64 and int64
// little-endian integers, IEEE float64.
bool has_attribute(hid_t obj, const std::string& name);
void write_attribute(hid_t obj, const std::string& name, uint64_t value, const std::string& path = {});
void write_attribute(hid_t obj, const std::string& name, int64_t value, const std::string& path = {});
void write_attribute(hid_t obj, const std::string& name, double value, const std::string& path = {});
// A fixed-length ASCII string: h5py reads it as bytes, h5dump prints it plainly.
void write_attribute(hid_t obj, const std::string& name, const std::string& value,
                     const std::string& path = {});
// A variable-length UTF-8 string: h5py reads it as str; any length and any text.
void write_utf8_attribute(hid_t obj, const std::string& name, const std::string& value,
                          const std::string& path = {});
// Writes a new value into an existing uint64 attribute, in place: the file keeps its layout.
void overwrite_attribute(hid_t obj, const std::string& name, uint64_t value, const std::string& path);
// Readers throw kilter::Error naming `path` and the attribute when it is missing, not a single
// value, or of the wrong class. Integer readers accept any integer type whose value fits.
uint64_t read_uint_attribute(hid_t obj, const std::string& name, const std::string& path);
int64_t read_int_attribute(hid_t obj, const std::string& name, const std::string& path);
double read_double_attribute(hid_t obj, const std::string& name, const std::string& path);  // float or integer
std::string read_string_attribute(hid_t obj, const std::string& name, const std::string& path);

// Number of elements of a 1-D dataset (throws naming path/name when not 1-D).
uint64_t dataset_length(hid_t dataset, const std::string& path, const std::string& name);
// The extent of a dataset of any rank ({} for a scalar).
std::vector<int64_t> dataset_shape(hid_t dataset);
// The class (H5T_INTEGER, H5T_FLOAT, ...) and size in bytes of a dataset's element type.
H5T_class_t element_class(hid_t dataset);
size_t element_size(hid_t dataset);

// Whether `dataset`'s type is an unsigned little-endian integer of `bytes` bytes.
bool is_unsigned_le(hid_t dataset, size_t bytes);
// A human-readable description of a dataset's element type, e.g. "uint16" or "float32".
std::string describe_type(hid_t dataset);

// Dataset creation: contiguous, uncompressed, allocated at creation, no fill pass, so the data
// have a file offset from the start and can be written by pwrite() without HDF5.
Handle create_contiguous(hid_t loc, const std::string& name, hid_t file_type,
                         const std::vector<uint64_t>& dims, const std::string& path);
Handle create_contiguous_1d(hid_t file, const std::string& name, hid_t mem_type_le,
                            uint64_t length, const std::string& path);
// Where a contiguous, allocated dataset's data start in its file (throws when it has no address).
uint64_t file_offset(hid_t dataset, const std::string& path, const std::string& name);

// Reads/writes elements [first, first+count) of a 1-D dataset from/to `buffer` as `mem_type`.
void read_range(hid_t dataset, hid_t mem_type, uint64_t first, uint64_t count, void* buffer,
                const std::string& path, const std::string& name);
void write_range(hid_t dataset, hid_t mem_type, uint64_t first, uint64_t count,
                 const void* buffer, const std::string& path, const std::string& name);
// Reads/writes a whole dataset of any rank. A failed read says "truncated or corrupt file"; a
// failed write carries HDF5's message (with the errno of a storage fault) for the caller's own
// first line (write_range and create_contiguous lead with the storage fault themselves).
void read_all(hid_t dataset, hid_t mem_type, void* buffer, const std::string& path, const std::string& name);
void write_all(hid_t dataset, hid_t mem_type, const void* buffer, const std::string& path,
               const std::string& name);

}  // namespace kilter::io::h5
