// Plain, gzip and zstd input streams for `kilter prep` (see compressed_input.h).
#include "io/compressed_input.h"

#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>

#include "io/base/error.h"

namespace kilter::io {

struct InputStream::Codec {
  z_stream z{};
  bool z_open = false;
  bool z_member_done = false;  // the last gzip member ended (another may follow)
  ZSTD_DCtx* zstd = nullptr;
  size_t zstd_last = 0;        // ZSTD_decompressStream's last hint: 0 = a frame just ended
  ~Codec() {
    if (z_open) inflateEnd(&z);
    if (zstd) ZSTD_freeDCtx(zstd);
  }
};

InputStream::InputStream(const std::string& path) : path_(path), codec_(std::make_unique<Codec>()) {
  file_ = std::fopen(path.c_str(), "rb");
  KILTER_USER_CHECK(file_, "input " << path << ": cannot open (" << std::strerror(errno) << ")");
  raw_.resize(size_t(256) << 10);
  fill_raw();
  const unsigned char* m = raw_.data();
  const size_t n = raw_end_;
  if (n >= 2 && m[0] == 0x1f && m[1] == 0x8b) {
    kind_ = Kind::gzip;
    KILTER_CHECK(inflateInit2(&codec_->z, 16 + MAX_WBITS) == Z_OK, "input " << path << ": zlib cannot start");
    codec_->z_open = true;
  } else if (n >= 4 && m[0] == 0x28 && m[1] == 0xb5 && m[2] == 0x2f && m[3] == 0xfd) {
    kind_ = Kind::zstd;
    codec_->zstd = ZSTD_createDCtx();
    KILTER_CHECK(codec_->zstd, "input " << path << ": libzstd cannot start");
  }
}

InputStream::~InputStream() {
  if (file_) std::fclose(file_);
}

const char* InputStream::kind() const {
  return kind_ == Kind::gzip ? "gzip" : kind_ == Kind::zstd ? "zstd" : "plain";
}

size_t InputStream::fill_raw() {
  if (raw_eof_) return 0;
  if (raw_begin_ > 0) {  // keep what is left, at the front
    std::memmove(raw_.data(), raw_.data() + raw_begin_, raw_end_ - raw_begin_);
    raw_end_ -= raw_begin_;
    raw_begin_ = 0;
  }
  const size_t n = std::fread(raw_.data() + raw_end_, 1, raw_.size() - raw_end_, file_);
  KILTER_CHECK(!std::ferror(file_), "input " << path_ << ": read error (" << std::strerror(errno) << ")");
  if (n == 0) raw_eof_ = true;
  raw_end_ += n;
  return n;
}

size_t InputStream::read(unsigned char* data, size_t size) {
  if (size == 0) return 0;
  if (kind_ == Kind::plain) {
    if (raw_begin_ == raw_end_) {
      raw_begin_ = raw_end_ = 0;
      if (fill_raw() == 0) return 0;
    }
    const size_t n = std::min(size, raw_end_ - raw_begin_);
    std::memcpy(data, raw_.data() + raw_begin_, n);
    raw_begin_ += n;
    file_bytes_ += n;
    return n;
  }
  size_t produced = 0;
  while (produced == 0) {
    if (raw_begin_ == raw_end_ && fill_raw() == 0) {
      // The end of the file: it must end where a gzip member or zstd frame ends.
      const bool complete = kind_ == Kind::gzip ? codec_->z_member_done : codec_->zstd_last == 0;
      KILTER_USER_CHECK(complete, "input " << path_ << ": the " << kind() << " stream ends early (truncated file?)");
      return 0;
    }
    const size_t available = raw_end_ - raw_begin_;
    if (kind_ == Kind::gzip) {
      z_stream& z = codec_->z;
      if (codec_->z_member_done) {  // another member follows the one that ended
        KILTER_CHECK(inflateReset(&z) == Z_OK, "input " << path_ << ": zlib reset failed");
        codec_->z_member_done = false;
      }
      z.next_in = raw_.data() + raw_begin_;
      z.avail_in = uInt(available);
      z.next_out = data;
      z.avail_out = uInt(size);
      const int rc = inflate(&z, Z_NO_FLUSH);
      KILTER_USER_CHECK(rc == Z_OK || rc == Z_STREAM_END || rc == Z_BUF_ERROR,
                   "input " << path_ << ": not valid gzip data near byte " << file_bytes_ << " ("
                            << (z.msg ? z.msg : "zlib error " + std::to_string(rc)) << ")");
      const size_t used = available - z.avail_in;
      raw_begin_ += used;
      file_bytes_ += used;
      produced = size - z.avail_out;
      if (rc == Z_STREAM_END) codec_->z_member_done = true;
    } else {
      ZSTD_inBuffer in{raw_.data() + raw_begin_, available, 0};
      ZSTD_outBuffer out{data, size, 0};
      const size_t rc = ZSTD_decompressStream(codec_->zstd, &out, &in);
      KILTER_USER_CHECK(!ZSTD_isError(rc), "input " << path_ << ": not valid zstd data near byte " << file_bytes_ << " ("
                                               << ZSTD_getErrorName(rc) << ")");
      codec_->zstd_last = rc;
      raw_begin_ += in.pos;
      file_bytes_ += in.pos;
      produced = out.pos;
    }
  }
  return produced;
}

bool StreamLineReader::next(const unsigned char*& data, size_t& size) {
  size_t scanned = begin_;
  while (true) {
    const void* nl = std::memchr(buffer_.data() + scanned, '\n', end_ - scanned);
    if (nl) {
      const size_t stop = size_t(static_cast<const unsigned char*>(nl) - buffer_.data()) + 1;
      data = buffer_.data() + begin_;
      size = stop - begin_;
      begin_ = stop;
      ++line_number_;
      return true;
    }
    if (eof_) {
      if (begin_ == end_) return false;
      data = buffer_.data() + begin_;  // a last line without '\n'
      size = end_ - begin_;
      begin_ = end_;
      ++line_number_;
      return true;
    }
    // Make room: move the partial line to the front, grow when it fills the buffer.
    if (begin_ > 0) {
      std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    if (end_ == buffer_.size()) buffer_.resize(buffer_.size() * 2);
    scanned = end_;
    const size_t n = stream_.read(buffer_.data() + end_, buffer_.size() - end_);
    if (n == 0) eof_ = true;
    end_ += n;
  }
}

uint64_t StreamLineReader::take_file_bytes() {
  const uint64_t delta = stream_.file_bytes() - reported_;
  reported_ = stream_.file_bytes();
  return delta;
}

}  // namespace kilter::io
