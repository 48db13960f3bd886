// RAII helpers over the HDF5 C API (see hdf5_util.h). Every failure becomes a kilter::Error
// that names the file, the object and HDF5's own innermost message.
#include "io/hdf5_util.h"

#include <vector>

#include "io/base/error.h"
#include "io/write_failure.h"

namespace kilter::io::h5 {

void silence_errors() {
  // The automatic printer is per thread in a thread-safe HDF5 build: set it on every thread.
  thread_local bool silenced = false;
  if (!silenced) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    silenced = true;
  }
}

static herr_t take_most_specific(unsigned n, const H5E_error2_t* err, void* client) {
  auto* out = static_cast<std::string*>(client);
  if (n == 0 && err->desc) *out = err->desc;  // walking upward: n == 0 is where it was detected
  return 0;
}

std::string last_error() {
  std::string message;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, take_most_specific, &message);
  H5Eclear2(H5E_DEFAULT);
  return message;
}

static herr_t collect_message(unsigned, const H5E_error2_t* err, void* client) {
  auto* out = static_cast<std::string*>(client);
  if (err->desc && *err->desc) {
    if (!out->empty()) *out += "; ";  // the separator compact_hdf5_text splits at
    *out += err->desc;
  }
  return 0;
}

std::string error_stack() {
  std::string text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_message, &text);
  H5Eclear2(H5E_DEFAULT);
  return compact_hdf5_text(text);
}

static std::string hdf5_says() {
  std::string e = last_error();
  return e.empty() ? std::string() : " (HDF5: " + e + ")";
}

// A failed write: when HDF5's file driver recorded a storage errno (full disk, quota, read-only,
// ...), the message leads with that in plain words and HDF5's text follows as the detail line;
// otherwise HDF5's text follows in parentheses as before.
static std::string write_failure(const std::string& path, const std::string& doing) {
  const std::string e = last_error();
  const int err = errno_in_hdf5_text(e);
  if (!is_storage_errno(err)) return path + ": " + doing + (e.empty() ? std::string() : " (HDF5: " + e + ")");
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
  return path + ": " + doing + ": " + describe_write_errno(err, dir) +
         "; free space there, or write the output elsewhere\n  detail: HDF5: " + compact_hdf5_text(e);
}

Handle open_file(const std::string& path, bool writable) {
  silence_errors();
  hid_t id = H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, H5P_DEFAULT);
  KILTER_CHECK(id >= 0, path << ": cannot open as HDF5" << hdf5_says());
  return Handle(id, H5Fclose);
}

Handle create_file(const std::string& path) {
  silence_errors();
  hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  KILTER_CHECK(id >= 0, path << ": cannot create HDF5 file" << hdf5_says());
  return Handle(id, H5Fclose);
}

bool has_link(hid_t loc, const std::string& name) {
  silence_errors();
  return H5Lexists(loc, name.c_str(), H5P_DEFAULT) > 0;
}

Handle open_dataset(hid_t file, const std::string& name, const std::string& path) {
  KILTER_CHECK(has_link(file, name), path << ": dataset " << name << " is missing");
  hid_t id = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  KILTER_CHECK(id >= 0, path << ": cannot open dataset " << name << hdf5_says());
  return Handle(id, H5Dclose);
}

Handle create_group(hid_t loc, const std::string& name, const std::string& path) {
  silence_errors();
  Handle props(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(props, 1);
  hid_t id = H5Gcreate2(loc, name.c_str(), props, H5P_DEFAULT, H5P_DEFAULT);
  KILTER_CHECK(id >= 0, path << ": cannot create group /" << name << hdf5_says());
  return Handle(id, H5Gclose);
}

Handle open_group(hid_t loc, const std::string& name, const std::string& path) {
  silence_errors();
  hid_t id = H5Gopen2(loc, name.c_str(), H5P_DEFAULT);
  KILTER_CHECK(id >= 0, path << ": cannot open group /" << name << hdf5_says());
  return Handle(id, H5Gclose);
}

static herr_t collect_member(hid_t, const char* name, const H5L_info_t*, void* client) {
  static_cast<std::set<std::string>*>(client)->insert(name);
  return 0;
}

std::set<std::string> member_names(hid_t group, const std::string& path) {
  std::set<std::string> names;
  KILTER_CHECK(H5Literate(group, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, collect_member, &names) >= 0,
               path << ": cannot list a group's members" << hdf5_says());
  return names;
}

bool has_attribute(hid_t obj, const std::string& name) {
  silence_errors();
  return H5Aexists(obj, name.c_str()) > 0;
}

static void replace_attribute(hid_t obj, const std::string& name) {
  if (has_attribute(obj, name)) H5Adelete(obj, name.c_str());
}

static std::string where(const std::string& path) { return path.empty() ? std::string() : path + ": "; }

// A new scalar attribute of `file_type`, written from `value` as `mem_type`.
static void write_scalar(hid_t obj, const std::string& name, hid_t file_type, hid_t mem_type, const void* value,
                         const std::string& path) {
  replace_attribute(obj, name);
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attr(H5Acreate2(obj, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  KILTER_CHECK(attr.valid() && H5Awrite(attr, mem_type, value) >= 0,
               where(path) << "cannot write attribute " << name << hdf5_says());
}

void write_attribute(hid_t obj, const std::string& name, uint64_t value, const std::string& path) {
  write_scalar(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value, path);
}

void write_attribute(hid_t obj, const std::string& name, int64_t value, const std::string& path) {
  write_scalar(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value, path);
}

void write_attribute(hid_t obj, const std::string& name, double value, const std::string& path) {
  write_scalar(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value, path);
}

void write_attribute(hid_t obj, const std::string& name, const std::string& value, const std::string& path) {
  // Fixed-length ASCII strings: h5py reads them as bytes, h5dump prints them plainly.
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, value.empty() ? 1 : value.size());
  H5Tset_strpad(type, H5T_STR_NULLPAD);
  write_scalar(obj, name, type, type, value.data(), path);
}

void write_utf8_attribute(hid_t obj, const std::string& name, const std::string& value, const std::string& path) {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  const char* text = value.c_str();
  write_scalar(obj, name, type, type, &text, path);
}

static Handle open_attribute(hid_t obj, const std::string& name, const std::string& path) {
  KILTER_CHECK(has_attribute(obj, name), path << ": attribute " << name << " is missing");
  Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
  KILTER_CHECK(attr.valid(), path << ": cannot open attribute " << name << hdf5_says());
  Handle space(H5Aget_space(attr), H5Sclose);
  KILTER_CHECK(H5Sget_simple_extent_npoints(space) == 1,
               path << ": attribute " << name << " is not a single value");
  return attr;
}

void overwrite_attribute(hid_t obj, const std::string& name, uint64_t value, const std::string& path) {
  Handle attr = open_attribute(obj, name, path);
  KILTER_CHECK(H5Awrite(attr, H5T_NATIVE_UINT64, &value) >= 0,
               path << ": cannot write attribute " << name << hdf5_says());
}

uint64_t read_uint_attribute(hid_t obj, const std::string& name, const std::string& path) {
  Handle attr = open_attribute(obj, name, path);
  Handle type(H5Aget_type(attr), H5Tclose);
  KILTER_CHECK(H5Tget_class(type) == H5T_INTEGER,
               path << ": attribute " << name << " is not an integer");
  int64_t signed_value = 0;
  uint64_t value = 0;
  if (H5Tget_sign(type) == H5T_SGN_NONE) {
    KILTER_CHECK(H5Aread(attr, H5T_NATIVE_UINT64, &value) >= 0,
                 path << ": cannot read attribute " << name << hdf5_says());
  } else {
    KILTER_CHECK(H5Aread(attr, H5T_NATIVE_INT64, &signed_value) >= 0,
                 path << ": cannot read attribute " << name << hdf5_says());
    KILTER_CHECK(signed_value >= 0, path << ": attribute " << name << " is negative ("
                                         << signed_value << ")");
    value = uint64_t(signed_value);
  }
  return value;
}

int64_t read_int_attribute(hid_t obj, const std::string& name, const std::string& path) {
  Handle attr = open_attribute(obj, name, path);
  Handle type(H5Aget_type(attr), H5Tclose);
  KILTER_CHECK(H5Tget_class(type) == H5T_INTEGER,
               path << ": attribute " << name << " is not an integer");
  if (H5Tget_sign(type) == H5T_SGN_NONE) {
    uint64_t value = 0;
    KILTER_CHECK(H5Aread(attr, H5T_NATIVE_UINT64, &value) >= 0,
                 path << ": cannot read attribute " << name << hdf5_says());
    KILTER_CHECK(value <= uint64_t(INT64_MAX), path << ": attribute " << name << " is too large (" << value << ")");
    return int64_t(value);
  }
  int64_t value = 0;
  KILTER_CHECK(H5Aread(attr, H5T_NATIVE_INT64, &value) >= 0,
               path << ": cannot read attribute " << name << hdf5_says());
  return value;
}

double read_double_attribute(hid_t obj, const std::string& name, const std::string& path) {
  Handle attr = open_attribute(obj, name, path);
  Handle type(H5Aget_type(attr), H5Tclose);
  const H5T_class_t type_class = H5Tget_class(type);
  KILTER_CHECK(type_class == H5T_FLOAT || type_class == H5T_INTEGER,
               path << ": attribute " << name << " is not a number");
  double value = 0;
  KILTER_CHECK(H5Aread(attr, H5T_NATIVE_DOUBLE, &value) >= 0,
               path << ": cannot read attribute " << name << hdf5_says());
  return value;
}

std::string read_string_attribute(hid_t obj, const std::string& name, const std::string& path) {
  Handle attr = open_attribute(obj, name, path);
  Handle type(H5Aget_type(attr), H5Tclose);
  KILTER_CHECK(H5Tget_class(type) == H5T_STRING,
               path << ": attribute " << name << " is not a string");
  if (H5Tis_variable_str(type) > 0) {
    // Written by h5py (variable-length strings are its default).
    Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem, H5T_VARIABLE);
    H5Tset_cset(mem, H5Tget_cset(type));  // h5py writes UTF-8; HDF5 converts no cset to another
    char* text = nullptr;
    KILTER_CHECK(H5Aread(attr, mem, &text) >= 0,
                 path << ": cannot read attribute " << name << hdf5_says());
    std::string value = text ? text : "";
    H5free_memory(text);
    return value;
  }
  size_t size = H5Tget_size(type);
  std::vector<char> buffer(size + 1, '\0');
  KILTER_CHECK(H5Aread(attr, type, buffer.data()) >= 0,
               path << ": cannot read attribute " << name << hdf5_says());
  return std::string(buffer.data());  // stops at the first NUL (null-padded strings)
}

uint64_t dataset_length(hid_t dataset, const std::string& path, const std::string& name) {
  Handle space(H5Dget_space(dataset), H5Sclose);
  KILTER_CHECK(space.valid() && H5Sget_simple_extent_ndims(space) == 1,
               path << ": dataset " << name << " is not one-dimensional");
  hsize_t dim = 0;
  H5Sget_simple_extent_dims(space, &dim, nullptr);
  return dim;
}

std::vector<int64_t> dataset_shape(hid_t dataset) {
  Handle space(H5Dget_space(dataset), H5Sclose);
  const int rank = space.valid() ? H5Sget_simple_extent_ndims(space) : 0;
  std::vector<hsize_t> dims(rank > 0 ? size_t(rank) : 0);
  if (rank > 0) H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  return std::vector<int64_t>(dims.begin(), dims.end());
}

H5T_class_t element_class(hid_t dataset) {
  Handle type(H5Dget_type(dataset), H5Tclose);
  return H5Tget_class(type);
}

size_t element_size(hid_t dataset) {
  Handle type(H5Dget_type(dataset), H5Tclose);
  return H5Tget_size(type);
}

bool is_unsigned_le(hid_t dataset, size_t bytes) {
  Handle type(H5Dget_type(dataset), H5Tclose);
  return H5Tget_class(type) == H5T_INTEGER && H5Tget_sign(type) == H5T_SGN_NONE &&
         H5Tget_size(type) == bytes && H5Tget_order(type) == H5T_ORDER_LE;
}

std::string describe_type(hid_t dataset) {
  Handle type(H5Dget_type(dataset), H5Tclose);
  std::string bits = std::to_string(8 * H5Tget_size(type));
  switch (H5Tget_class(type)) {
    case H5T_INTEGER: {
      std::string name = (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + bits;
      return H5Tget_order(type) == H5T_ORDER_BE ? name + " big-endian" : name;
    }
    case H5T_FLOAT: return "float" + bits;
    case H5T_STRING: return "string";
    default: return "non-numeric type";
  }
}

Handle create_contiguous(hid_t loc, const std::string& name, hid_t file_type,
                         const std::vector<uint64_t>& dims, const std::string& path) {
  silence_errors();
  const std::vector<hsize_t> extent(dims.begin(), dims.end());
  Handle space(H5Screate_simple(int(extent.size()), extent.data(), nullptr), H5Sclose);
  Handle props(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_layout(props, H5D_CONTIGUOUS);
  // Early allocation gives the dataset a file address right away (H5Dget_offset works for the
  // reader and for writers that pwrite() the data) and FILL_TIME_NEVER avoids writing every byte
  // twice.
  H5Pset_alloc_time(props, H5D_ALLOC_TIME_EARLY);
  H5Pset_fill_time(props, H5D_FILL_TIME_NEVER);
  hid_t id = H5Dcreate2(loc, name.c_str(), file_type, space, H5P_DEFAULT, props, H5P_DEFAULT);
  KILTER_CHECK(id >= 0, write_failure(path, "cannot create dataset " + name));
  return Handle(id, H5Dclose);
}

Handle create_contiguous_1d(hid_t file, const std::string& name, hid_t mem_type_le,
                            uint64_t length, const std::string& path) {
  return create_contiguous(file, name, mem_type_le, {length}, path);
}

uint64_t file_offset(hid_t dataset, const std::string& path, const std::string& name) {
  const haddr_t offset = H5Dget_offset(dataset);
  KILTER_CHECK(offset != HADDR_UNDEF, path << ": dataset " << name << " has no file offset" << hdf5_says());
  return uint64_t(offset);
}

static Handle select_range(hid_t dataset, uint64_t first, uint64_t count) {
  Handle space(H5Dget_space(dataset), H5Sclose);
  hsize_t start = first, n = count;
  H5Sselect_hyperslab(space, H5S_SELECT_SET, &start, nullptr, &n, nullptr);
  return space;
}

void read_range(hid_t dataset, hid_t mem_type, uint64_t first, uint64_t count, void* buffer,
                const std::string& path, const std::string& name) {
  if (count == 0) return;
  Handle file_space = select_range(dataset, first, count);
  hsize_t n = count;
  Handle mem_space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  KILTER_CHECK(H5Dread(dataset, mem_type, mem_space, file_space, H5P_DEFAULT, buffer) >= 0,
               path << ": cannot read " << name << "[" << first << ":" << first + count << "]"
                    << hdf5_says());
}

void write_range(hid_t dataset, hid_t mem_type, uint64_t first, uint64_t count,
                 const void* buffer, const std::string& path, const std::string& name) {
  if (count == 0) return;
  Handle file_space = select_range(dataset, first, count);
  hsize_t n = count;
  Handle mem_space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  KILTER_CHECK(H5Dwrite(dataset, mem_type, mem_space, file_space, H5P_DEFAULT, buffer) >= 0,
               write_failure(path, "cannot write " + name + "[" + std::to_string(first) + ":" +
                                       std::to_string(first + count) + "]"));
}

void read_all(hid_t dataset, hid_t mem_type, void* buffer, const std::string& path, const std::string& name) {
  KILTER_CHECK(H5Dread(dataset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer) >= 0,
               path << ": reading " << name << " failed (truncated or corrupt file)" << hdf5_says());
}

void write_all(hid_t dataset, hid_t mem_type, const void* buffer, const std::string& path,
               const std::string& name) {
  KILTER_CHECK(H5Dwrite(dataset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer) >= 0,
               path << ": cannot write " << name << hdf5_says());
}

}  // namespace kilter::io::h5
