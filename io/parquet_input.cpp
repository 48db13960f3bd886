// io/parquet_input.h with Apache Arrow's C++ Parquet reader (built as C++20, the standard Arrow's
// headers need; cmake/KilterParquet.cmake). Each worker opens the file with its own FileReader
// (a reader is not shared between threads) and decodes the row groups w, w + T, w + 2T, ... of
// it, one at a time, never more than T row groups ahead of the one the caller is handing on.
// Arrow IPC files (the file and the stream format) are read a record batch at a time from a
// memory map: their columns need no decoding.
#include "io/parquet_input.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <arrow/ipc/reader.h>
#include <arrow/util/config.h>
#include <parquet/arrow/reader.h>
#include <parquet/exception.h>
#include <parquet/metadata.h>
#include <parquet/schema.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "io/did_you_mean.h"
#include "io/base/error.h"

namespace kilter::io {

bool parquet_available() { return true; }
std::string parquet_library() { return std::string("Apache Arrow ") + ARROW_VERSION_STRING + " (libparquet)"; }

namespace {

// A library's message on one line (Arrow's and Thrift's span several): line breaks become "; ".
std::string one_line(const std::string& text) {
  std::string out;
  bool pending_break = false;
  for (char c : text) {
    if (c == '\n' || c == '\r') {
      pending_break = !out.empty();
      continue;
    }
    if (pending_break) {
      while (!out.empty() && (out.back() == ' ' || out.back() == ':')) out.pop_back();
      out += "; ";
      pending_break = false;
    }
    out += c;
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == ':')) out.pop_back();
  return out;
}

// The leaf column to read and its path of field names (["meta", "text"] for "meta.text").
struct ColumnChoice {
  int leaf = -1;
  std::vector<std::string> parts;
};

std::unique_ptr<parquet::arrow::FileReader> open_reader(const std::string& path) {
  auto file = arrow::io::ReadableFile::Open(path);
  KILTER_USER_CHECK(file.ok(), "input " << path << ": cannot open (" << one_line(file.status().ToString()) << ")");
  try {
    auto reader = parquet::arrow::OpenFile(*file, arrow::default_memory_pool());
    KILTER_USER_CHECK(reader.ok(), "input " << path << ": not a readable Parquet file: its footer is missing or damaged ("
                                            << one_line(reader.status().ToString())
                                            << "); a file cut short by a copy or download? Fetch it again, or leave it out");
    return std::move(*reader);
  } catch (const parquet::ParquetException& e) {
    KILTER_USER_FAIL("input " << path << ": not a readable Parquet file: its footer is missing or damaged (" << one_line(e.what())
                              << "); a file cut short by a copy or download? Fetch it again, or leave it out");
  }
}

ColumnChoice find_column(const parquet::arrow::FileReader& reader, const std::string& path, const std::string& key) {
  const parquet::SchemaDescriptor* schema = reader.parquet_reader()->metadata()->schema();
  std::vector<std::string> names;
  for (int i = 0; i < schema->num_columns(); ++i) {
    const std::string name = schema->Column(i)->path()->ToDotString();
    if (name == key) return {i, schema->Column(i)->path()->ToDotVector()};
    names.push_back(name);
  }
  std::string listed;
  for (size_t i = 0; i < names.size() && i < 12; ++i) listed += (i ? ", " : "") + names[i];
  if (names.size() > 12) listed += ", ...";
  KILTER_USER_FAIL("input " << path << ": no column \"" << key << "\" (its columns: " << listed << ")"
                            << did_you_mean_hint(key, names)
                            << ". Name the text column with --text-key (a dotted path reaches into a struct)");
}

// One decoded row group: the leaf column's arrays (a null parent struct made a null cell).
struct Decoded {
  std::vector<std::shared_ptr<arrow::Array>> arrays;
  std::exception_ptr error;
  bool ready = false;
};

std::vector<std::shared_ptr<arrow::Array>> decode_row_group(parquet::arrow::FileReader& reader, const std::string& path,
                                                            int group, const ColumnChoice& column) {
  const int groups = reader.num_row_groups();
  const auto fail = [&](const std::string& what) {
    KILTER_USER_FAIL("input " << path << ": row group " << group << " of " << groups << " does not decode (" << one_line(what)
                              << "); the file is damaged or cut short: fetch it again, or leave it out");
  };
  arrow::Result<std::shared_ptr<arrow::Table>> table;
  try {
    table = reader.ReadRowGroup(group, {column.leaf});
  } catch (const std::exception& e) {  // parquet::ParquetException, thrift's errors
    fail(e.what());
  }
  if (!table.ok()) fail(table.status().ToString());
  std::vector<std::shared_ptr<arrow::Array>> arrays;
  for (const std::shared_ptr<arrow::Array>& chunk : (*table)->column(0)->chunks()) {
    std::shared_ptr<arrow::Array> array = chunk;
    for (size_t p = 1; p < column.parts.size(); ++p) {  // into the struct, its nulls carried down
      if (array->type_id() != arrow::Type::STRUCT) break;
      const auto& parent = static_cast<const arrow::StructArray&>(*array);
      const int index = parent.struct_type()->GetFieldIndex(column.parts[p]);
      if (index < 0) break;
      auto child = parent.GetFlattenedField(index);
      if (!child.ok()) fail(child.status().ToString());
      array = *child;
    }
    arrays.push_back(std::move(array));
  }
  return arrays;
}

template <class StringLike>
void emit_cells(const StringLike& cells, const std::function<void(const char*, size_t)>& document,
                ParquetCounts& counts) {
  for (int64_t i = 0; i < cells.length(); ++i) {
    if (cells.IsNull(i)) {
      ++counts.nulls;
      continue;
    }
    const auto view = cells.GetView(i);
    if (view.empty()) {
      ++counts.empty;
      continue;
    }
    document(view.data(), view.size());
  }
}

void emit_array(const arrow::Array& array, const std::function<void(const char*, size_t)>& document,
                ParquetCounts& counts) {
  counts.rows += uint64_t(array.length());
  switch (array.type_id()) {
    case arrow::Type::STRING: emit_cells(static_cast<const arrow::StringArray&>(array), document, counts); break;
    case arrow::Type::LARGE_STRING: emit_cells(static_cast<const arrow::LargeStringArray&>(array), document, counts); break;
    case arrow::Type::BINARY: emit_cells(static_cast<const arrow::BinaryArray&>(array), document, counts); break;
    case arrow::Type::LARGE_BINARY: emit_cells(static_cast<const arrow::LargeBinaryArray&>(array), document, counts); break;
    case arrow::Type::STRING_VIEW: emit_cells(static_cast<const arrow::StringViewArray&>(array), document, counts); break;
    default:
      counts.nulls += uint64_t(array.null_count());
      counts.non_string += uint64_t(array.length() - array.null_count());
  }
}

// The row groups of one file decoded by `threads` workers, handed out in order.
class RowGroupPipeline {
 public:
  RowGroupPipeline(const std::string& path, const ColumnChoice& column, int groups, unsigned threads)
      : path_(path), column_(column), slots_(size_t(groups)), window_(int(threads)) {
    for (unsigned w = 0; w < threads; ++w) workers_.emplace_back([this, w] { work(int(w)); });
  }
  ~RowGroupPipeline() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    for (std::thread& worker : workers_) worker.join();
  }

  // Row group `group` (the next one in order); rethrows a worker's error.
  std::vector<std::shared_ptr<arrow::Array>> take(int group) {
    Decoded decoded;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return slots_[size_t(group)].ready; });
      decoded = std::move(slots_[size_t(group)]);
    }
    if (decoded.error) std::rethrow_exception(decoded.error);
    return std::move(decoded.arrays);
  }
  // The caller is done with `group`: the workers may decode up to `window_` row groups past it.
  void release(int group) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      next_ = group + 1;
    }
    changed_.notify_all();
  }

 private:
  void work(int worker) {
    std::unique_ptr<parquet::arrow::FileReader> reader;
    for (int group = worker; group < int(slots_.size()); group += window_) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return stop_ || group < next_ + window_; });
        if (stop_) return;
      }
      Decoded decoded;
      try {
        if (!reader) reader = open_reader(path_);
        decoded.arrays = decode_row_group(*reader, path_, group, column_);
      } catch (...) {
        decoded.error = std::current_exception();
      }
      const bool failed = bool(decoded.error);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        decoded.ready = true;
        slots_[size_t(group)] = std::move(decoded);
      }
      changed_.notify_all();
      if (failed) return;
    }
  }

  const std::string& path_;
  const ColumnChoice& column_;
  std::vector<Decoded> slots_;
  const int window_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int next_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;  // last: started once the rest is made
};

}  // namespace

void read_parquet_documents(const std::string& path, const ParquetReadOptions& options,
                            const std::function<void(const char*, size_t)>& document,
                            const std::function<void(uint64_t)>& consumed, ParquetCounts& counts) {
  std::unique_ptr<parquet::arrow::FileReader> reader = open_reader(path);
  const ColumnChoice column = find_column(*reader, path, options.column);
  const int groups = reader->num_row_groups();
  // Progress: the file's bytes, shared among the row groups by their compressed sizes, so that
  // it ends at the size on disk as the other formats' does.
  std::vector<double> share_end(size_t(groups), 0.0);
  double total = 0;
  for (int group = 0; group < groups; ++group) {
    total += double(std::max<int64_t>(0, reader->parquet_reader()->metadata()->RowGroup(group)->total_compressed_size()));
    share_end[size_t(group)] = total;
  }
  reader.reset();
  const uint64_t file_size = uint64_t(std::filesystem::file_size(path));
  uint64_t reported = 0;
  const auto report_until = [&](int group) {
    const double share = total > 0 ? share_end[size_t(group)] / total : double(group + 1) / double(groups);
    const uint64_t until = group + 1 == groups ? file_size : uint64_t(share * double(file_size));
    if (until > reported) consumed(until - reported);
    reported = std::max(reported, until);
  };
  if (groups == 0) {
    consumed(file_size);
    return;
  }
  const unsigned threads = std::max(1u, std::min(options.threads, unsigned(groups)));
  RowGroupPipeline pipeline(path, column, groups, threads);
  for (int group = 0; group < groups; ++group) {
    const std::vector<std::shared_ptr<arrow::Array>> arrays = pipeline.take(group);
    for (const std::shared_ptr<arrow::Array>& array : arrays) emit_array(*array, document, counts);
    pipeline.release(group);
    report_until(group);
  }
}

namespace {

// The top-level field and the struct fields below it that `key` names in an Arrow schema: the
// field called `key` itself first, then the dotted path.
ColumnChoice find_ipc_column(const arrow::Schema& schema, const std::string& path, const std::string& key) {
  if (schema.GetFieldIndex(key) >= 0) return {schema.GetFieldIndex(key), {key}};
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  const int top = schema.GetFieldIndex(parts[0]);
  std::shared_ptr<arrow::DataType> type = top >= 0 ? schema.field(top)->type() : nullptr;
  for (size_t p = 1; type && p < parts.size(); ++p) {
    const auto* nested = type->id() == arrow::Type::STRUCT ? static_cast<const arrow::StructType*>(type.get()) : nullptr;
    type = nested && nested->GetFieldIndex(parts[p]) >= 0 ? nested->field(nested->GetFieldIndex(parts[p]))->type() : nullptr;
  }
  if (type) return {top, parts};
  std::vector<std::string> names;
  std::string listed;
  for (const std::shared_ptr<arrow::Field>& field : schema.fields()) {
    listed += (names.empty() ? "" : ", ") + field->name();
    names.push_back(field->name());
  }
  KILTER_USER_FAIL("input " << path << ": no column \"" << key << "\" (its columns: " << listed << ")"
                            << did_you_mean_hint(key, names)
                            << ". Name the text column with --text-key (a dotted path reaches into a struct)");
}

// The column `column` of one record batch, into its structs.
std::shared_ptr<arrow::Array> ipc_cells(const arrow::RecordBatch& batch, const ColumnChoice& column,
                                        const std::string& path, int64_t index) {
  std::shared_ptr<arrow::Array> array = batch.column(column.leaf);
  for (size_t p = 1; p < column.parts.size() && array->type_id() == arrow::Type::STRUCT; ++p) {
    const auto& parent = static_cast<const arrow::StructArray&>(*array);
    auto child = parent.GetFlattenedField(parent.struct_type()->GetFieldIndex(column.parts[p]));
    KILTER_USER_CHECK(child.ok(), "input " << path << ": record batch " << index << " does not decode ("
                                           << one_line(child.status().ToString()) << ")");
    array = *child;
  }
  return array;
}

}  // namespace

void read_arrow_ipc_documents(const std::string& path, const ParquetReadOptions& options,
                              const std::function<void(const char*, size_t)>& document,
                              const std::function<void(uint64_t)>& consumed, ParquetCounts& counts) {
  auto file = arrow::io::MemoryMappedFile::Open(path, arrow::io::FileMode::READ);
  KILTER_USER_CHECK(file.ok(), "input " << path << ": cannot open (" << one_line(file.status().ToString()) << ")");
  const uint64_t file_size = uint64_t(std::filesystem::file_size(path));
  const auto damaged = [&](int64_t batch, const arrow::Status& status) {
    KILTER_USER_FAIL("input " << path << ": record batch " << batch << " does not decode (" << one_line(status.ToString())
                              << "); the file is damaged or cut short: fetch it again, or leave it out");
  };
  // The IPC file format (a footer indexes the batches: Feather v2, `*.arrow`), else the stream
  // format (Hugging Face datasets' cache files).
  auto random_access = arrow::ipc::RecordBatchFileReader::Open(*file);
  if (random_access.ok()) {
    const ColumnChoice column = find_ipc_column(*(*random_access)->schema(), path, options.column);
    const int batches = (*random_access)->num_record_batches();
    for (int b = 0; b < batches; ++b) {
      auto batch = (*random_access)->ReadRecordBatch(b);
      if (!batch.ok()) damaged(b, batch.status());
      emit_array(*ipc_cells(**batch, column, path, b), document, counts);
    }
    consumed(file_size);
    return;
  }
  KILTER_CHECK((*file)->Seek(0).ok(), "input " << path << ": cannot seek");
  auto stream = arrow::ipc::RecordBatchStreamReader::Open(*file);
  KILTER_USER_CHECK(stream.ok(), "input " << path << ": not an Arrow IPC file or stream ("
                                          << one_line(stream.status().ToString()) << " / "
                                          << one_line(random_access.status().ToString())
                                          << "); a file cut short by a copy or download? Fetch it again, or leave it out");
  const ColumnChoice column = find_ipc_column(*(*stream)->schema(), path, options.column);
  for (int64_t b = 0;; ++b) {
    std::shared_ptr<arrow::RecordBatch> batch;
    const arrow::Status status = (*stream)->ReadNext(&batch);
    if (!status.ok()) damaged(b, status);
    if (!batch) break;
    emit_array(*ipc_cells(*batch, column, path, b), document, counts);
  }
  consumed(file_size);
}

}  // namespace kilter::io
