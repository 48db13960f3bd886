// The four tokenized-corpus layouts kilter imports (see import.h), each opened and checked
// against its file size before a token is read:
//   llmc      llm.c `.bin`: 256 little-endian int32 header (magic 20240520, version 1 = uint16
//             tokens / 2 = uint32 tokens; llm.c's LLaMA-3 files: magic 20240801, version 7 =
//             uint32), header[2] = token count, then the tokens.
//   nanogpt   nanoGPT's `prepare.py` output: flat little-endian uint16, no header.
//   npy       numpy `.npy` v1/v2/v3 holding a 1-D integer array (header dict: descr,
//             fortran_order, shape).
//   megatron  Megatron-LM's indexed dataset: `.idx` = "MMIDIDX\0\0", uint64 version 1, uint8
//             dtype code, uint64 sequence count S, uint64 document-index length D, int32 sizes[S],
//             int64 pointers[S] (byte offsets into `.bin`), int64 doc_idx[D] (0, ..., S); `.bin`
//             holds the sequences' tokens.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <vector>

#include "io/base/error.h"
#include "io/import/import_source.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the importers read little-endian files by memcpy; add byte swaps for big-endian hosts");

namespace kilter::io::import_detail {

// ---- MappedFile, dtypes ----------------------------------------------------------------------

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  KILTER_CHECK(fd >= 0, path << ": cannot open: " << std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    KILTER_FAIL(path << ": not a regular file");
  }
  size_ = uint64_t(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    KILTER_CHECK(p != MAP_FAILED, path << ": cannot map " << size_ << " bytes: " << std::strerror(err));
    data_ = static_cast<unsigned char*>(p);
    ::madvise(data_, size_, MADV_SEQUENTIAL);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

void MappedFile::release(uint64_t offset, uint64_t bytes) const {
  if (!data_) return;
  const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = (offset + page - 1) / page * page;  // whole pages inside the range only
  const uint64_t end = std::min(offset + bytes, size_) / page * page;
  if (end > begin) ::madvise(data_ + begin, end - begin, MADV_DONTNEED);
}

size_t dtype_bytes(Dtype dtype) {
  switch (dtype) {
    case Dtype::u8: case Dtype::i8: return 1;
    case Dtype::u16: case Dtype::i16: return 2;
    case Dtype::u32: case Dtype::i32: return 4;
    case Dtype::u64: case Dtype::i64: return 8;
  }
  return 0;
}

const char* dtype_name(Dtype dtype) {
  switch (dtype) {
    case Dtype::u8: return "uint8";
    case Dtype::i8: return "int8";
    case Dtype::u16: return "uint16";
    case Dtype::i16: return "int16";
    case Dtype::u32: return "uint32";
    case Dtype::i32: return "int32";
    case Dtype::u64: return "uint64";
    case Dtype::i64: return "int64";
  }
  return "?";
}

namespace {

template <typename T>
T read_le(const MappedFile& file, uint64_t offset) {
  T value;
  std::memcpy(&value, file.data() + offset, sizeof(T));
  return value;
}

// Throws unless the file holds `bytes` bytes at `offset` (overflow-safe).
void need_bytes(const MappedFile& file, uint64_t offset, uint64_t bytes, const char* what) {
  KILTER_CHECK(offset <= file.size() && bytes <= file.size() - offset,
               file.path() << ": truncated at byte offset " << file.size() << ": " << what << " needs bytes "
                           << offset << ".." << offset + bytes << " (the file has " << file.size() << ")");
}

// One file, one segment (llmc, nanogpt, npy).
class FlatSource : public TokenSource {
 public:
  FlatSource(std::unique_ptr<MappedFile> file, uint64_t offset, uint64_t count, Dtype dtype, uint32_t eot)
      : file_(std::move(file)), offset_(offset), count_(count), dtype_(dtype), eot_(eot) {}
  void for_each_segment(const std::function<void(const Segment&)>& fn) const override {
    if (count_ > 0) fn(Segment{file_.get(), offset_, count_, dtype_, false});
  }
  uint32_t conventional_eot() const override { return eot_; }
  uint64_t input_bytes() const override { return file_->size(); }

 private:
  std::unique_ptr<MappedFile> file_;
  uint64_t offset_, count_;
  Dtype dtype_;
  uint32_t eot_;
};

constexpr uint32_t kGpt2Eot = 50256;      // <|endoftext|>
constexpr uint32_t kLlama3Bos = 128000;   // <|begin_of_text|>: llm.c's document delimiter for LLaMA-3

// The byte count after the header must be exactly the announced elements.
void check_exact_payload(const MappedFile& file, uint64_t data_offset, uint64_t count, size_t item,
                         const std::string& count_place) {
  const uint64_t have = file.size() - data_offset;
  const long double want = (long double)count * item;
  KILTER_CHECK((long double)have >= want,
               file.path() << ": truncated at byte offset " << file.size() << ": " << count_place << " announces "
                           << count << " tokens (" << (unsigned long long)want << " bytes from byte offset "
                           << data_offset << "), the file holds " << have);
  KILTER_CHECK((long double)have == want,
               file.path() << ": " << have - uint64_t(want) << " unexpected bytes at byte offset "
                           << data_offset + uint64_t(want) << " after the " << count << " tokens that "
                           << count_place << " announces");
}

// ---- llm.c -------------------------------------------------------------------------------------

std::unique_ptr<TokenSource> open_llmc(const std::string& path) {
  auto file = std::make_unique<MappedFile>(path);
  const uint64_t header_bytes = 256 * 4;
  need_bytes(*file, 0, header_bytes, "the llm.c header (256 int32)");
  const int32_t magic = read_le<int32_t>(*file, 0), version = read_le<int32_t>(*file, 4);
  Dtype dtype;
  uint32_t eot;
  if (magic == 20240520) {
    KILTER_CHECK(version == 1 || version == 2,
                 path << ": byte offset 4: llm.c version " << version
                      << " is not supported (magic 20240520: version 1 = uint16 tokens, 2 = uint32 tokens)");
    dtype = version == 1 ? Dtype::u16 : Dtype::u32;
    eot = kGpt2Eot;
  } else if (magic == 20240801) {
    KILTER_CHECK(version == 7, path << ": byte offset 4: llm.c version " << version
                                    << " is not supported (magic 20240801, LLaMA-3 tokens: version 7)");
    dtype = Dtype::u32;
    eot = kLlama3Bos;
  } else {
    KILTER_FAIL(path << ": byte offset 0: bad magic " << magic
                     << " (an llm.c .bin starts with int32 20240520, or 20240801 for LLaMA-3 tokens)");
  }
  const int32_t count = read_le<int32_t>(*file, 8);
  KILTER_CHECK(count >= 0, path << ": byte offset 8: negative token count " << count);
  check_exact_payload(*file, header_bytes, uint64_t(count), dtype_bytes(dtype), "the header (byte offset 8)");
  return std::make_unique<FlatSource>(std::move(file), header_bytes, uint64_t(count), dtype, eot);
}

// ---- nanoGPT -----------------------------------------------------------------------------------

std::unique_ptr<TokenSource> open_nanogpt(const std::string& path) {
  auto file = std::make_unique<MappedFile>(path);
  KILTER_CHECK(file->size() % 2 == 0,
               path << ": truncated at byte offset " << file->size() - 1
                    << ": a nanoGPT .bin holds uint16 tokens, but the file has an odd number of bytes ("
                    << file->size() << ")");
  const uint64_t count = file->size() / 2;
  return std::make_unique<FlatSource>(std::move(file), 0, count, Dtype::u16, kGpt2Eot);
}

// ---- npy ---------------------------------------------------------------------------------------

// The header dict numpy writes: {'descr': '<u2', 'fortran_order': False, 'shape': (N,), }
class NpyHeaderParser {
 public:
  NpyHeaderParser(const std::string& path, const std::string& text, uint64_t base)
      : path_(path), text_(text), base_(base) {}

  void parse(std::string& descr, bool& fortran, std::vector<int64_t>& shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    skip_space();
    expect('{');
    for (;;) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = quoted();
      skip_space();
      expect(':');
      skip_space();
      if (key == "descr") {
        descr = quoted();
        have_descr = true;
      } else if (key == "fortran_order") {
        fortran = boolean();
        have_fortran = true;
      } else if (key == "shape") {
        shape = tuple();
        have_shape = true;
      } else {
        fail("unknown key '" + key + "'");
      }
      skip_space();
      if (peek() == ',') ++pos_;
    }
    if (!have_descr || !have_fortran || !have_shape)
      fail(std::string("the header dict lacks '") + (!have_descr ? "descr" : !have_fortran ? "fortran_order" : "shape") + "'");
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    KILTER_FAIL(path_ << ": byte offset " << base_ + pos_ << ": bad npy header: " << what << " (header: "
                      << text_.substr(0, 120) << ")");
  }
  char peek() {
    if (pos_ >= text_.size()) fail("unexpected end of the header");
    return text_[pos_];
  }
  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string quoted() {
    const char q = peek();
    if (q != '\'' && q != '"') fail("expected a quoted string");
    const size_t end = text_.find(q, pos_ + 1);
    if (end == std::string::npos) fail("unterminated string");
    std::string s = text_.substr(pos_ + 1, end - pos_ - 1);
    pos_ = end + 1;
    return s;
  }
  bool boolean() {
    if (text_.compare(pos_, 4, "True") == 0) { pos_ += 4; return true; }
    if (text_.compare(pos_, 5, "False") == 0) { pos_ += 5; return false; }
    fail("fortran_order must be True or False");
  }
  std::vector<int64_t> tuple() {
    std::vector<int64_t> dims;
    expect('(');
    for (;;) {
      skip_space();
      if (peek() == ')') { ++pos_; return dims; }
      if (!std::isdigit(static_cast<unsigned char>(peek()))) fail("shape must be a tuple of non-negative integers");
      uint64_t value = 0;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
        if (value > (uint64_t(1) << 60)) fail("a shape dimension is too large");
        value = value * 10 + uint64_t(text_[pos_++] - '0');
      }
      if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;  // Python 2 longs
      dims.push_back(int64_t(value));
      skip_space();
      if (peek() == ',') ++pos_;
      else if (peek() != ')') fail("expected ',' or ')' in shape");
    }
  }

  const std::string& path_;
  const std::string& text_;
  uint64_t base_;
  size_t pos_ = 0;
};

Dtype npy_dtype(const std::string& path, const std::string& descr, uint64_t offset) {
  auto unsupported = [&](const std::string& why) {
    KILTER_FAIL(path << ": byte offset " << offset << ": unsupported npy dtype '" << descr << "' (" << why
                     << "; token ids need a little-endian integer type: <u2, <i4, <i8, ...)");
  };
  if (descr.size() < 3) unsupported("not a dtype string");
  const char order = descr[0], kind = descr[1];
  const std::string size_text = descr.substr(2);
  if (size_text != "1" && size_text != "2" && size_text != "4" && size_text != "8") unsupported("item size " + size_text);
  const int size = std::stoi(size_text);
  if (kind != 'u' && kind != 'i') unsupported(kind == 'f' ? "floating point" : "not an integer type");
  if (order == '>' && size > 1) unsupported("big-endian");
  if (order != '<' && order != '|' && order != '=' && order != '>') unsupported("byte order '" + std::string(1, order) + "'");
  const bool is_signed = kind == 'i';
  switch (size) {
    case 1: return is_signed ? Dtype::i8 : Dtype::u8;
    case 2: return is_signed ? Dtype::i16 : Dtype::u16;
    case 4: return is_signed ? Dtype::i32 : Dtype::u32;
    default: return is_signed ? Dtype::i64 : Dtype::u64;
  }
}

std::unique_ptr<TokenSource> open_npy(const std::string& path) {
  auto file = std::make_unique<MappedFile>(path);
  need_bytes(*file, 0, 10, "the npy preamble");
  KILTER_CHECK(std::memcmp(file->data(), "\x93NUMPY", 6) == 0,
               path << ": byte offset 0: bad magic (an .npy file starts with \\x93NUMPY)");
  const unsigned major = file->data()[6], minor = file->data()[7];
  KILTER_CHECK(major >= 1 && major <= 3, path << ": byte offset 6: npy format version " << major << "." << minor
                                              << " is not supported (1.0, 2.0, 3.0)");
  uint64_t header_len, header_start;
  if (major == 1) {
    header_len = read_le<uint16_t>(*file, 8);
    header_start = 10;
  } else {
    need_bytes(*file, 0, 12, "the npy preamble");
    header_len = read_le<uint32_t>(*file, 8);
    header_start = 12;
  }
  need_bytes(*file, header_start, header_len, "the npy header dict (its length is at byte offset 8)");
  const std::string text(reinterpret_cast<const char*>(file->data() + header_start), header_len);
  std::string descr;
  bool fortran = false;
  std::vector<int64_t> shape;
  NpyHeaderParser(path, text, header_start).parse(descr, fortran, shape);
  const Dtype dtype = npy_dtype(path, descr, header_start);
  uint64_t count = 1;
  for (int64_t d : shape) count *= uint64_t(d);
  if (shape.size() != 1) {
    std::string dims;
    for (int64_t d : shape) dims += std::to_string(d) + ",";
    KILTER_FAIL(path << ": byte offset " << header_start << ": the npy array has shape (" << dims
                     << "); kilter imports a 1-D array of token ids");
  }
  const uint64_t data_offset = header_start + header_len;
  check_exact_payload(*file, data_offset, count, dtype_bytes(dtype), "the npy header (shape)");
  return std::make_unique<FlatSource>(std::move(file), data_offset, count, dtype, kGpt2Eot);
}

// ---- Megatron ----------------------------------------------------------------------------------

constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

class MegatronSource : public TokenSource {
 public:
  explicit MegatronSource(const std::string& input) {
    std::string prefix = input;
    for (const char* suffix : {".idx", ".bin"})
      if (prefix.size() > 4 && prefix.compare(prefix.size() - 4, 4, suffix) == 0) prefix.resize(prefix.size() - 4);
    idx_ = std::make_unique<MappedFile>(prefix + ".idx");
    bin_ = std::make_unique<MappedFile>(prefix + ".bin");
    const MappedFile& idx = *idx_;
    const std::string& path = idx.path();
    need_bytes(idx, 0, 34, "the Megatron index header");
    KILTER_CHECK(std::memcmp(idx.data(), kMegatronMagic, 9) == 0,
                 path << ": byte offset 0: bad magic (a Megatron-LM .idx starts with \"MMIDIDX\\x00\\x00\")");
    const uint64_t version = read_le<uint64_t>(idx, 9);
    KILTER_CHECK(version == 1, path << ": byte offset 9: Megatron index version " << version << " is not supported (1)");
    const uint8_t code = idx.data()[17];
    switch (code) {
      case 1: dtype_ = Dtype::u8; break;
      case 2: dtype_ = Dtype::i8; break;
      case 3: dtype_ = Dtype::i16; break;
      case 4: dtype_ = Dtype::i32; break;
      case 5: dtype_ = Dtype::i64; break;
      case 8: dtype_ = Dtype::u16; break;
      case 6: case 7:
        KILTER_FAIL(path << ": byte offset 17: unsupported dtype code " << int(code)
                         << " (floating point); token ids need an integer type");
      default:
        KILTER_FAIL(path << ": byte offset 17: unknown dtype code " << int(code) << " (Megatron codes 1-8)");
    }
    sequences_ = read_le<uint64_t>(idx, 18);
    doc_entries_ = read_le<uint64_t>(idx, 26);
    const uint64_t room = idx.size() - 34;
    KILTER_CHECK(sequences_ <= room / 12 && doc_entries_ <= (room - sequences_ * 12) / 8,
                 path << ": byte offset 18: the header announces " << sequences_ << " sequences and "
                      << doc_entries_ << " document-index entries, which need "
                      << (long double)sequences_ * 12 + (long double)doc_entries_ * 8 << " bytes; the file has "
                      << room << " after the header (truncated or not a Megatron index)");
    sizes_at_ = 34;
    pointers_at_ = sizes_at_ + 4 * sequences_;
    doc_idx_at_ = pointers_at_ + 8 * sequences_;
    const uint64_t end = doc_idx_at_ + 8 * doc_entries_;
    // Newer Megatron appends one int8 mode per sequence for multimodal data.
    KILTER_CHECK(idx.size() == end || idx.size() == end + sequences_,
                 path << ": " << idx.size() - end << " unexpected bytes at byte offset " << end
                      << " after the document index");
    KILTER_CHECK(doc_entries_ >= 1, path << ": byte offset 26: the document index is empty (it starts with 0)");
    int64_t previous = 0;
    for (uint64_t d = 0; d < doc_entries_; ++d) {
      const int64_t v = read_le<int64_t>(idx, doc_idx_at_ + 8 * d);
      KILTER_CHECK((d == 0 ? v == 0 : v >= previous) && v <= int64_t(sequences_),
                   path << ": byte offset " << doc_idx_at_ + 8 * d << ": doc_idx[" << d << "] = " << v
                        << " (must start at 0, never decrease and stay <= the " << sequences_ << " sequences)");
      previous = v;
    }
    KILTER_CHECK(uint64_t(previous) == sequences_,
                 path << ": byte offset " << doc_idx_at_ + 8 * (doc_entries_ - 1) << ": the document index ends at "
                      << previous << ", not at the sequence count " << sequences_);
    const size_t item = dtype_bytes(dtype_);
    for (uint64_t s = 0; s < sequences_; ++s) {
      const int32_t size = read_le<int32_t>(idx, sizes_at_ + 4 * s);
      const int64_t pointer = read_le<int64_t>(idx, pointers_at_ + 8 * s);
      KILTER_CHECK(size >= 0, path << ": byte offset " << sizes_at_ + 4 * s << ": negative size " << size
                                   << " of sequence " << s);
      KILTER_CHECK(pointer >= 0 && uint64_t(pointer) <= bin_->size() &&
                       uint64_t(size) * item <= bin_->size() - uint64_t(pointer),
                   path << ": byte offset " << pointers_at_ + 8 * s << ": sequence " << s << " lies at bytes "
                        << pointer << ".." << pointer + int64_t(size) * int64_t(item) << " of " << bin_->path()
                        << ", which has " << bin_->size() << " bytes (truncated .bin?)");
    }
  }

  void for_each_segment(const std::function<void(const Segment&)>& fn) const override {
    for (uint64_t d = 0; d + 1 < doc_entries_; ++d) {
      const uint64_t begin = uint64_t(read_le<int64_t>(*idx_, doc_idx_at_ + 8 * d));
      const uint64_t end = uint64_t(read_le<int64_t>(*idx_, doc_idx_at_ + 8 * (d + 1)));
      if (begin == end) fn(Segment{bin_.get(), 0, 0, dtype_, true});  // an empty document: counted, dropped
      for (uint64_t s = begin; s < end; ++s) {
        const int32_t size = read_le<int32_t>(*idx_, sizes_at_ + 4 * s);
        const int64_t pointer = read_le<int64_t>(*idx_, pointers_at_ + 8 * s);
        fn(Segment{bin_.get(), uint64_t(pointer), uint64_t(size), dtype_, s + 1 == end});
      }
    }
  }
  uint32_t conventional_eot() const override { return kGpt2Eot; }
  uint64_t input_bytes() const override { return idx_->size() + bin_->size(); }

 private:
  std::unique_ptr<MappedFile> idx_, bin_;
  Dtype dtype_ = Dtype::u16;
  uint64_t sequences_ = 0, doc_entries_ = 0;
  uint64_t sizes_at_ = 0, pointers_at_ = 0, doc_idx_at_ = 0;
};

}  // namespace

std::unique_ptr<TokenSource> open_token_source(ImportFormat format, const std::string& path) {
  switch (format) {
    case ImportFormat::llmc: return open_llmc(path);
    case ImportFormat::nanogpt: return open_nanogpt(path);
    case ImportFormat::npy: return open_npy(path);
    case ImportFormat::megatron: return std::make_unique<MegatronSource>(path);
  }
  KILTER_FAIL("unknown import format");
}

}  // namespace kilter::io::import_detail
