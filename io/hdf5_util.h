// Small RAII layer over the HDF5 C API used by the dataset code: owned handles, attribute
// read/write by name, and error messages that carry HDF5's own innermost error text.
// HDF5's automatic error printing is switched off; failures become kilter::Error instead.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>

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
  void reset() {
    if (id_ >= 0 && closer_) closer_(id_);
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

// Turns off HDF5's printing of error stacks for the calling thread (idempotent, cheap).
void silence_errors();

// The innermost message on the calling thread's HDF5 error stack ("" when empty).
std::string last_error();

// Opening and creating; each throws kilter::Error naming `path` (and `name`) on failure.
Handle open_file(const std::string& path, bool writable = false);
Handle create_file(const std::string& path);  // truncates
Handle open_dataset(hid_t file, const std::string& name, const std::string& path);
bool has_link(hid_t loc, const std::string& name);

// Attributes on the root group (or any object). Readers accept any integer type that fits.
bool has_attribute(hid_t obj, const std::string& name);
void write_attribute(hid_t obj, const std::string& name, uint64_t value);
void write_attribute(hid_t obj, const std::string& name, const std::string& value);
// Throw kilter::Error naming `path` and the attribute when it is missing or of the wrong class.
uint64_t read_uint_attribute(hid_t obj, const std::string& name, const std::string& path);
std::string read_string_attribute(hid_t obj, const std::string& name, const std::string& path);

// Number of elements of a 1-D dataset (throws naming path/name when not 1-D).
uint64_t dataset_length(hid_t dataset, const std::string& path, const std::string& name);

// Whether `dataset`'s type is an unsigned little-endian integer of `bytes` bytes.
bool is_unsigned_le(hid_t dataset, size_t bytes);
// A human-readable description of a dataset's element type, e.g. "uint16" or "float32".
std::string describe_type(hid_t dataset);

// 1-D dataset creation: contiguous, uncompressed, allocated at creation, no fill pass.
Handle create_contiguous_1d(hid_t file, const std::string& name, hid_t mem_type_le,
                            uint64_t length, const std::string& path);

// Reads/writes elements [first, first+count) of a 1-D dataset from/to `buffer` as `mem_type`.
void read_range(hid_t dataset, hid_t mem_type, uint64_t first, uint64_t count, void* buffer,
                const std::string& path, const std::string& name);
void write_range(hid_t dataset, hid_t mem_type, uint64_t first, uint64_t count,
                 const void* buffer, const std::string& path, const std::string& name);

}  // namespace kilter::io::h5
