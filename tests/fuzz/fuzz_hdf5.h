// A fuzz-driven HDF5 file builder for the structure-aware harnesses (fuzz_dataset, fuzz_checkpoint).
// Files are built in memory (HDF5's core driver, no backing store) and their image is written to
// the scratch directory in /dev/shm only because kilter opens files by path. Each attribute and
// dataset kilter expects is written in its valid form or, as the fuzz input chooses, missing or
// adversarial: another integer width, sign or byte order, a float, a string (fixed or variable,
// with NULs), an array or 2-D instead of a scalar, a null or empty dataspace, an opaque type,
// another rank or length, chunked or compact storage, unallocated storage, a group or a dangling
// link in its place, values at the edges. A choice byte below 128 (and an exhausted input) means
// "valid", so an empty input builds a sound file and mutations stay local.
#pragma once
#include <hdf5.h>

#include <atomic>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "io/hdf5_util.h"

namespace kilter::fuzz::h5b {

// Owned hid_t: the dataset code's own handle.
using Id = kilter::io::h5::Handle;

// HDF5 setup for speed: no error printing, and free lists without limits, so the large blocks
// every file open allocates (the metadata cache's hash table) are reused instead of being mapped
// and unmapped per file under ASan.
inline void quiet() {
  static thread_local bool done = false;
  if (!done) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    H5set_free_list_limits(-1, -1, -1, -1, -1, -1);
    done = true;
  }
}

// KILTER_FUZZ_DEBUG=1 prints what kilter said (to see what an input reaches when triaging).
inline bool debug() {
  static const bool on = std::getenv("KILTER_FUZZ_DEBUG") != nullptr;
  return on;
}

// An HDF5 file in memory; image() flushes it and returns its bytes.
class MemFile {
 public:
  MemFile() {
    quiet();
    static std::atomic<uint64_t> serial{0};
    Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    H5Pset_fapl_core(fapl, 64 << 10, 0);
    const std::string name = "kilter-fuzz-mem-" + std::to_string(++serial) + ".h5";
    id_ = H5Fcreate(name.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    if (id_ < 0) finding("harness: cannot create an in-memory HDF5 file");
  }
  ~MemFile() { H5Fclose(id_); }
  hid_t id() const { return id_; }
  std::string image() const {
    H5Fflush(id_, H5F_SCOPE_GLOBAL);
    ssize_t n = H5Fget_file_image(id_, nullptr, 0);
    if (n <= 0) finding("harness: cannot take the file image");
    std::string bytes(size_t(n), '\0');
    H5Fget_file_image(id_, bytes.data(), size_t(n));
    return bytes;
  }

 private:
  hid_t id_ = -1;
};

// A valid choice (false) or a mutation number in [0, 32).
inline bool mutate(Input& in, int& which) {
  const uint8_t c = in.u8();
  which = c & 31;
  return c >= 128;
}

// The integer element types a writer may use instead of the expected one.
inline hid_t int_type(uint8_t pick) {
  static const hid_t* const types[] = {&H5T_STD_U8LE_g,  &H5T_STD_U16LE_g, &H5T_STD_U32LE_g, &H5T_STD_U64LE_g,
                                       &H5T_STD_I8LE_g,  &H5T_STD_I16LE_g, &H5T_STD_I32LE_g, &H5T_STD_I64LE_g,
                                       &H5T_STD_U16BE_g, &H5T_STD_U32BE_g, &H5T_STD_U64BE_g, &H5T_STD_I64BE_g};
  H5open();
  return *types[pick % (sizeof types / sizeof types[0])];
}

inline Id scalar_space() { return Id(H5Screate(H5S_SCALAR), H5Sclose); }
inline Id simple_space(std::vector<hsize_t> dims) {
  return Id(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose);
}

inline void write_attr(hid_t obj, const char* name, hid_t file_type, hid_t space, hid_t mem_type,
                       const void* buf) {
  Id attr(H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (attr.valid() && buf) H5Awrite(attr, mem_type, buf);
}

inline Id string_type(size_t size, bool utf8, H5T_str_t pad = H5T_STR_NULLTERM) {
  Id t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t, size);
  H5Tset_cset(t, utf8 ? H5T_CSET_UTF8 : H5T_CSET_ASCII);
  if (size != H5T_VARIABLE) H5Tset_strpad(t, pad);
  return t;
}

// The valid form of string attributes: fixed-length ASCII (the dataset files) or variable-length
// UTF-8 (checkpoints); a harness sets it once.
inline bool& fixed_strings() {
  static bool fixed = false;
  return fixed;
}

// What an attribute holds when valid.
enum class Kind { uint64, int64, float64, string };

// Writes attribute `name` on `obj`: `good` (or `good_text` for strings) in its valid form, or a
// mutation the input picks.
inline void attribute(hid_t obj, const char* name, Kind kind, int64_t good, const std::string& good_text,
                      Input& in) {
  auto valid_type = [&]() -> hid_t {
    switch (kind) {
      case Kind::uint64: return H5T_STD_U64LE;
      case Kind::int64: return H5T_STD_I64LE;
      case Kind::float64: return H5T_IEEE_F64LE;
      case Kind::string: return -1;
    }
    return -1;
  };
  auto write_valid = [&](hid_t space, size_t n, int64_t value) {
    if (kind == Kind::string && fixed_strings()) {  // as io/hdf5_util.cpp writes them
      Id t = string_type(std::max<size_t>(1, good_text.size()), false, H5T_STR_NULLPAD);
      std::string all;
      for (size_t i = 0; i < n; ++i) all += good_text.empty() ? std::string(1, '\0') : good_text;
      write_attr(obj, name, t, space, t, all.data());
    } else if (kind == Kind::string) {  // as io/checkpoint_attributes.cpp and h5py write them
      Id t = string_type(H5T_VARIABLE, true);
      std::vector<const char*> ptrs(n, good_text.c_str());
      write_attr(obj, name, t, space, t, ptrs.data());
    } else if (kind == Kind::float64) {
      std::vector<double> v(n, double(value));
      write_attr(obj, name, valid_type(), space, H5T_NATIVE_DOUBLE, v.data());
    } else if (kind == Kind::uint64) {
      std::vector<uint64_t> v(n, uint64_t(value));
      write_attr(obj, name, valid_type(), space, H5T_NATIVE_UINT64, v.data());
    } else {
      std::vector<int64_t> v(n, value);
      write_attr(obj, name, valid_type(), space, H5T_NATIVE_INT64, v.data());
    }
  };
  int which = 0;
  if (!mutate(in, which)) {
    Id space = scalar_space();
    write_valid(space, 1, good);
    return;
  }
  switch (which % 14) {
    case 0: return;  // missing
    case 1: {        // another integer type, value at an edge
      int64_t v = in.around(good);
      Id space = scalar_space();
      write_attr(obj, name, int_type(in.u8()), space, H5T_NATIVE_INT64, &v);
      return;
    }
    case 2: {  // a float
      double v = double(in.around(good)) + (in.flag() ? 0.5 : 0.0);
      Id space = scalar_space();
      write_attr(obj, name, in.flag() ? H5T_IEEE_F32LE : H5T_IEEE_F64LE, space, H5T_NATIVE_DOUBLE, &v);
      return;
    }
    case 3: {  // a variable-length string (fuzzed bytes, maybe with NULs)
      std::string text = in.flag() ? good_text : in.bytes(64);
      Id t = string_type(H5T_VARIABLE, in.flag());
      const char* p = text.c_str();
      Id space = scalar_space();
      write_attr(obj, name, t, space, t, &p);
      return;
    }
    case 4: {  // a fixed-length string
      std::string text = in.flag() ? good_text : in.bytes(64);
      const size_t size = std::max<size_t>(1, text.size() + in.u8() % 4);
      text.resize(size, in.flag() ? ' ' : '\0');
      const H5T_str_t pads[] = {H5T_STR_NULLTERM, H5T_STR_NULLPAD, H5T_STR_SPACEPAD};
      Id t = string_type(size, in.flag(), pads[in.u8() % 3]);
      Id space = scalar_space();
      write_attr(obj, name, t, space, t, text.data());
      return;
    }
    case 5:
    case 6: {  // an array (1-D or 2-D) of valid elements instead of a scalar
      std::vector<hsize_t> dims{hsize_t(1 + in.u8() % 64)};
      if (which % 14 == 6) dims.push_back(hsize_t(1 + in.u8() % 8));
      size_t n = 1;
      for (hsize_t d : dims) n *= d;
      Id space = simple_space(dims);
      if (kind == Kind::string && in.flag()) {  // an array of fixed-length strings
        const size_t size = 1 + in.u8() % 16;
        std::string all(n * size, 'x');
        Id t = string_type(size, true);
        write_attr(obj, name, t, space, t, all.data());
        return;
      }
      write_valid(space, n, in.around(good));
      return;
    }
    case 7: {  // a null dataspace (no element at all)
      Id space(H5Screate(H5S_NULL), H5Sclose);
      Id t = kind == Kind::string ? string_type(H5T_VARIABLE, true) : Id(H5Tcopy(valid_type()), H5Tclose);
      write_attr(obj, name, t, space, t, nullptr);
      return;
    }
    case 8: {  // an empty 1-D dataspace
      Id space = simple_space({0});
      Id t = kind == Kind::string ? string_type(H5T_VARIABLE, true) : Id(H5Tcopy(valid_type()), H5Tclose);
      write_attr(obj, name, t, space, t, nullptr);
      return;
    }
    case 9: {  // an opaque or bitfield type
      uint64_t v = uint64_t(good);
      Id space = scalar_space();
      if (in.flag()) {
        Id t(H5Tcreate(H5T_OPAQUE, 8), H5Tclose);
        H5Tset_tag(t, "fuzz");
        write_attr(obj, name, t, space, t, &v);
      } else {
        write_attr(obj, name, H5T_STD_B64LE, space, H5T_NATIVE_B64, &v);
      }
      return;
    }
    case 10: {  // the valid type with a value at an edge (for strings: fuzzed text)
      if (kind == Kind::string) {
        std::string text = in.bytes(256);
        Id t = string_type(H5T_VARIABLE, true);
        const char* p = text.c_str();
        Id space = scalar_space();
        write_attr(obj, name, t, space, t, &p);
        return;
      }
      Id space = scalar_space();
      if (kind == Kind::float64) {
        const double specials[] = {0.0, -1.0, 1e308, -1e308, __builtin_nan(""), __builtin_inf(), 1e-310};
        double v = specials[in.u8() % 7];
        write_attr(obj, name, H5T_IEEE_F64LE, space, H5T_NATIVE_DOUBLE, &v);
        return;
      }
      write_valid(space, 1, in.around(good));
      return;
    }
    case 11: {  // an integer where a string is expected, or the reverse, with the valid value
      Id space = scalar_space();
      if (kind == Kind::string) {
        int64_t v = good;
        write_attr(obj, name, H5T_STD_I64LE, space, H5T_NATIVE_INT64, &v);
      } else {
        const std::string text = std::to_string(good);
        Id t = string_type(H5T_VARIABLE, true);
        const char* p = text.c_str();
        write_attr(obj, name, t, space, t, &p);
      }
      return;
    }
    case 12: {  // a compound with one member of the valid type
      Id t(H5Tcreate(H5T_COMPOUND, 8), H5Tclose);
      H5Tinsert(t, "value", 0, H5T_NATIVE_INT64);
      int64_t v = good;
      Id space = scalar_space();
      write_attr(obj, name, t, space, t, &v);
      return;
    }
    default: {  // valid
      Id space = scalar_space();
      write_valid(space, 1, good);
      return;
    }
  }
}

inline void attr_u64(hid_t obj, const char* name, uint64_t good, Input& in) {
  attribute(obj, name, Kind::uint64, int64_t(good), "", in);
}
inline void attr_i64(hid_t obj, const char* name, int64_t good, Input& in) {
  attribute(obj, name, Kind::int64, good, "", in);
}
inline void attr_f64(hid_t obj, const char* name, double good, Input& in) {
  attribute(obj, name, Kind::float64, int64_t(good), "", in);
}
inline void attr_str(hid_t obj, const char* name, const std::string& good, Input& in) {
  attribute(obj, name, Kind::string, 0, good, in);
}

template <typename T> hid_t native_type();
template <> inline hid_t native_type<uint64_t>() { return H5T_NATIVE_UINT64; }
template <> inline hid_t native_type<float>() { return H5T_NATIVE_FLOAT; }
template <typename T> T edge_value(T good, Input& in);
template <> inline uint64_t edge_value<uint64_t>(uint64_t good, Input& in) { return uint64_t(in.around(int64_t(good))); }
template <> inline float edge_value<float>(float, Input& in) {
  const float specials[] = {0.0f, -0.0f, 1e38f, -1e38f, __builtin_nanf(""), __builtin_inff(), 1e-45f, 1.0f};
  return specials[in.u8() % 8];
}

// A dataset of `values` (uint64 or float in memory), stored as `file_type` with shape `dims`
// (their product is values.size()). Returns the dataset (for attributes) or an invalid Id when
// the mutation put something else in its place.
template <typename T>
inline Id dataset(hid_t loc, const char* name, hid_t file_type, std::vector<hsize_t> dims,
                  std::vector<T> values, Input& in) {
  int which = 0;
  const bool mutated = mutate(in, which);
  hid_t type = file_type;
  Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_layout(dcpl, H5D_CONTIGUOUS);
  H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
  bool write_data = true;
  if (mutated) {
    switch (which % 12) {
      case 0: return Id();  // missing
      case 1: {             // a group in its place
        Id(H5Gcreate2(loc, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
        return Id();
      }
      case 2:  // a dangling soft link in its place
        H5Lcreate_soft(in.flag() ? "/nowhere" : name, loc, name, H5P_DEFAULT, H5P_DEFAULT);
        return Id();
      case 3: {  // another element type
        const uint8_t pick = in.u8();
        if (pick % 5 == 0) type = in.flag() ? H5T_IEEE_F32LE : H5T_IEEE_F64BE;
        else type = int_type(pick);
        break;
      }
      case 4: {  // another length: values cut or extended with edge values
        const size_t n = size_t(std::min<int64_t>(std::max<int64_t>(in.around(int64_t(values.size())), 0), 4096));
        while (values.size() < n) values.push_back(T(in.u16()));
        values.resize(n);
        dims = {hsize_t(n)};
        break;
      }
      case 5: {  // another rank: scalar, 2-D, or 3-D
        const uint8_t r = in.u8() % 3;
        if (r == 0 && !values.empty()) {
          values.resize(1);
          dims = {};
        } else if (r == 1) {
          dims = {hsize_t(values.size()), 1};
        } else {
          dims = {1, hsize_t(values.size()), 1};
        }
        break;
      }
      case 6:  // values at the edges (some of them)
        for (size_t k = 0, n = 1 + in.u8() % 4; k < n && !values.empty(); ++k) {
          T& v = values[in.u16() % values.size()];
          v = edge_value<T>(v, in);
        }
        break;
      case 7:  // chunked storage
        H5Pset_layout(dcpl, H5D_CHUNKED);
        {
          hsize_t chunk[3] = {1 + hsize_t(in.u8() % 16), 1, 1};
          if (!dims.empty()) H5Pset_chunk(dcpl, int(dims.size()), chunk);
          else H5Pset_layout(dcpl, H5D_COMPACT);
        }
        break;
      case 8:  // compact storage (in the object header)
        if (values.size() < 1000) H5Pset_layout(dcpl, H5D_COMPACT);
        break;
      case 9:  // storage never allocated (no data written)
        H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_LATE);
        write_data = false;
        break;
      case 10: {  // a string dataset
        Id t = string_type(8, false);
        Id space = simple_space({hsize_t(values.size())});
        std::string all(values.size() * 8, '7');
        Id ds(H5Dcreate2(loc, name, t, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
        if (ds.valid() && !values.empty()) H5Dwrite(ds, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, all.data());
        return ds;
      }
      default:
        break;
    }
  }
  Id space = dims.empty() ? scalar_space() : simple_space(dims);
  Id ds(H5Dcreate2(loc, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) {  // e.g. compact storage too large, a zero chunk: fall back to the valid form
    H5Eclear2(H5E_DEFAULT);
    Id fallback_dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_alloc_time(fallback_dcpl, H5D_ALLOC_TIME_EARLY);
    ds = Id(H5Dcreate2(loc, name, type, space, H5P_DEFAULT, fallback_dcpl, H5P_DEFAULT), H5Dclose);
    if (!ds.valid()) return Id();
  }
  if (write_data && !values.empty()) H5Dwrite(ds, native_type<T>(), H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
  return ds;
}

// The image, maybe truncated (a file cut short by a full disk or a copy that died).
inline std::string maybe_truncated(std::string image, Input& in) {
  int which = 0;
  if (mutate(in, which) && which % 4 == 0 && !image.empty())
    image.resize(size_t(in.u32() % image.size()));
  return image;
}

}  // namespace kilter::fuzz::h5b
