// Parquet input for `kilter prep --format parquet` (and Arrow IPC, `--format arrow`): the
// documents of one column of `.parquet` (`.arrow`) files, read with Apache Arrow's C++ library
// where the build found it
// (cmake/KilterParquet.cmake), one row group at a time. This header is all that the rest of prep
// sees; without Arrow, parquet_input_none.cpp answers every call with what to install.
//
// Row groups are decoded on `threads` workers, at most one row group per worker at a time, and
// handed on strictly in file and row order, so the documents (and the dataset's content hashes)
// are the same for any thread count, and memory holds a row group per worker whatever the file
// size. Null cells, empty strings and cells of a column that holds no strings are counted and
// skipped. A file that is not Parquet, or a row group that does not decode, is an error naming
// the file (and the row group); a column that does not exist names the columns there are.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace kilter::io {

// Whether this binary reads Parquet, and the library that does ("Apache Arrow 26.0.1"), or
// what to install where it does not.
bool parquet_available();
std::string parquet_library();

struct ParquetCounts {
  uint64_t rows = 0;        // rows read
  uint64_t nulls = 0;       // null cells (a null parent struct included)
  uint64_t empty = 0;       // empty strings
  uint64_t non_string = 0;  // cells of a column of another type
};

struct ParquetReadOptions {
  std::string column = "text";  // the column; "a.b" is field b of struct column a
  unsigned threads = 1;         // row groups decoded at once
};

// Calls `document` with every non-empty string cell of `column` in `path`, in row order, and
// `consumed` with the file's bytes as row groups finish (their compressed size). Throws
// kilter::Error (a user error) naming the file for a file that is not Parquet, a damaged row
// group, or a missing column.
void read_parquet_documents(const std::string& path, const ParquetReadOptions& options,
                            const std::function<void(const char* data, size_t size)>& document,
                            const std::function<void(uint64_t bytes)>& consumed, ParquetCounts& counts);

// The same for an Arrow IPC file (the file format: Feather v2, `*.arrow`) or stream (the
// format of Hugging Face datasets' cache files), one record batch at a time from a memory map
// (`threads` unused: the batches need no decoding).
void read_arrow_ipc_documents(const std::string& path, const ParquetReadOptions& options,
                              const std::function<void(const char* data, size_t size)>& document,
                              const std::function<void(uint64_t bytes)>& consumed, ParquetCounts& counts);

}  // namespace kilter::io
