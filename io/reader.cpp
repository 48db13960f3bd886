// The prefetching reader (see reader.h). The constructing thread does all HDF5 work: it checks
// each shard's header, takes /tokens' file offset (H5Dget_offset) and reads /offsets once.
// Worker threads then only pread(): they claim batches of pieces from the oldest group that has
// a ring slot, merge reads that lie close together in a file, and convert the stored uint16 or
// uint32 tokens to int32 in the slot. The consumer gets groups strictly in enqueue order.
#include "io/reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <new>
#include <thread>

#include "io/base/error.h"
#include "io/hdf5_util.h"

namespace kilter::io {

namespace {

constexpr uint64_t kBatchTokens = uint64_t(1) << 18;  // tokens a worker claims at once
constexpr uint64_t kMergeGapBytes = 4096;              // read through gaps up to a page
constexpr uint64_t kSpanBytes = uint64_t(256) << 10;   // largest merged pread (bar one piece):
                                                       // small enough to convert from L2 cache
constexpr size_t kAlignment = 4096;

struct ShardFile {
  ShardLayout layout;
  int fd = -1;
  std::vector<uint64_t> offsets;  // /offsets, checked against the index
};

struct Group {
  uint64_t ticket = 0;
  std::vector<PieceRequest> pieces;
  std::vector<size_t> out_offsets;  // where piece i's len+1 tokens go in the slot
  size_t total_tokens = 0;
  int slot = -1;
  size_t next_piece = 0;   // first piece not yet claimed by a worker
  size_t done_pieces = 0;
  bool ready = false;
  std::exception_ptr error;
};

struct Slot {
  void* memory = nullptr;
  size_t capacity = 0;  // int32 tokens
};

// One token range to read: file bytes [file_pos, file_pos + count*width) of shard `shard`.
struct ReadOp {
  uint32_t shard;
  uint64_t file_pos;
  uint64_t count;
  int32_t* destination;
};

// Stored tokens -> int32, returning the largest id seen (plain loops the compiler vectorizes).
template <typename Stored>
uint32_t widen(const Stored* __restrict in, int32_t* __restrict out, uint64_t count) {
  Stored largest = 0;
  for (uint64_t t = 0; t < count; ++t) {
    out[t] = int32_t(in[t]);
    largest = in[t] > largest ? in[t] : largest;
  }
  return uint32_t(largest);
}

}  // namespace

struct PrefetchReader::Impl {
  DatasetIndex index;
  ReaderOptions options;
  std::vector<ShardFile> shards;
  std::vector<Slot> slots;
  std::vector<int> free_slots;
  std::deque<std::shared_ptr<Group>> groups;  // enqueued, not yet given back by next()
  std::shared_ptr<Group> returned;            // the group next() handed out last
  ReadyGroup current;
  uint64_t next_ticket = 0;

  mutable std::mutex mutex;
  std::condition_variable work_available;
  std::condition_variable group_ready;
  bool stopping = false;
  std::vector<std::thread> workers;

  void open_shards(const std::string& dir);
  void assign_slots();  // with mutex held
  void worker_loop();
  void read_next_batch(const std::shared_ptr<Group>& group, std::unique_lock<std::mutex>& lock,
                       std::vector<unsigned char>& scratch);
  std::vector<unsigned char> consumer_scratch;
  void read_batch(const Group& group, size_t first, size_t end, std::vector<unsigned char>& scratch);
};

void PrefetchReader::Impl::open_shards(const std::string& dir) {
  for (uint32_t s = 0; s < index.shards.size(); ++s) {
    ShardFile shard;
    std::vector<std::string> problems = check_shard_header(index, dir, s, &shard.layout);
    KILTER_CHECK(problems.empty(), problems.front());
    const std::string& path = shard.layout.path;
    const ShardInfo& info = index.shards[s];
    {
      h5::Handle file = h5::open_file(path);
      h5::Handle offsets = h5::open_dataset(file, "offsets", path);
      shard.offsets.resize(info.num_docs + 1);
      h5::read_range(offsets, H5T_NATIVE_UINT64, 0, shard.offsets.size(), shard.offsets.data(),
                     path, "/offsets");
    }
    // A reader never trusts a file: the offsets must describe exactly the index's documents.
    KILTER_CHECK(shard.offsets[0] == 0, path << ": offsets[0] is " << shard.offsets[0] << ", expected 0");
    for (uint64_t d = 0; d < info.num_docs; ++d) {
      uint64_t begin = shard.offsets[d], end = shard.offsets[d + 1];
      KILTER_CHECK(end <= info.num_tokens, path << ": offsets[" << d + 1 << "] = " << end
                                               << " is out of range (/tokens has "
                                               << info.num_tokens << ")");
      KILTER_CHECK(end >= begin, path << ": offsets decrease at entry " << d + 1 << " (" << begin
                                      << " then " << end << ")");
      KILTER_CHECK(end - begin == index.doc_lengths[info.first_doc + d],
                   path << ": document " << d << " has " << end - begin
                        << " tokens in /offsets but " << index.doc_lengths[info.first_doc + d]
                        << " in the index");
    }
    KILTER_CHECK(shard.offsets.back() == info.num_tokens,
                 path << ": last offset is " << shard.offsets.back() << ", expected len(/tokens) = "
                      << info.num_tokens);
    shard.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    KILTER_CHECK(shard.fd >= 0, path << ": cannot open for reading (" << std::strerror(errno) << ")");
    shards.push_back(std::move(shard));
  }
}

PrefetchReader::PrefetchReader(const DatasetIndex& index, const std::string& dir,
                               const ReaderOptions& opts)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.index = index;
  m.options = opts;
  KILTER_CHECK(opts.prefetch >= 1, "data.prefetch must be at least 1 (got " << opts.prefetch << ")");
  KILTER_CHECK(opts.threads >= 1, "data.reader_threads must be at least 1 (got " << opts.threads << ")");
  if (!m.options.alloc || !m.options.release) {
    m.options.alloc = [](size_t bytes) { return ::operator new(bytes, std::align_val_t(kAlignment)); };
    m.options.release = [](void* p) { ::operator delete(p, std::align_val_t(kAlignment)); };
  }
  try {
    m.open_shards(dir);
  } catch (...) {
    for (ShardFile& shard : m.shards) ::close(shard.fd);
    throw;
  }
  // `prefetch` groups are filled ahead while the consumer still holds the one it was given.
  m.slots.resize(opts.prefetch + 1);
  for (int s = int(m.slots.size()) - 1; s >= 0; --s) m.free_slots.push_back(s);
  for (int t = 0; t < opts.threads; ++t) m.workers.emplace_back([&m] { m.worker_loop(); });
}

PrefetchReader::~PrefetchReader() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    m.stopping = true;
  }
  m.work_available.notify_all();
  for (std::thread& worker : m.workers) worker.join();
  for (Slot& slot : m.slots)
    if (slot.memory) m.options.release(slot.memory);
  for (ShardFile& shard : m.shards) ::close(shard.fd);
}

void PrefetchReader::Impl::assign_slots() {
  for (const std::shared_ptr<Group>& group : groups) {
    if (group->slot >= 0) continue;
    if (free_slots.empty()) break;  // groups get slots in order
    int s = free_slots.back();
    free_slots.pop_back();
    Slot& slot = slots[s];
    if (slot.capacity < group->total_tokens) {
      // Grown with headroom so that a slightly larger group later does not reallocate again.
      if (slot.memory) options.release(slot.memory);
      size_t capacity = group->total_tokens + group->total_tokens / 4;
      slot.memory = options.alloc(capacity * sizeof(int32_t));
      KILTER_CHECK(slot.memory, "reader: allocating " << capacity * 4 << " bytes failed");
      slot.capacity = capacity;
    }
    group->slot = s;
  }
}

uint64_t PrefetchReader::enqueue(std::vector<PieceRequest> pieces) {
  Impl& m = *impl_;
  auto group = std::make_shared<Group>();
  group->out_offsets.resize(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const PieceRequest& p = pieces[i];
    KILTER_CHECK(p.doc < m.index.num_docs(), "reader: document " << p.doc << " is out of range ("
                                                                 << m.index.num_docs() << " documents)");
    uint32_t length = m.index.doc_lengths[p.doc];
    KILTER_CHECK(p.len >= 1 && uint64_t(p.start) + p.len <= length,
                 "reader: piece [" << p.start << ", " << uint64_t(p.start) + p.len
                                   << ") does not lie inside document " << p.doc << " of length "
                                   << length);
    group->out_offsets[i] = group->total_tokens;
    group->total_tokens += size_t(p.len) + 1;
  }
  group->pieces = std::move(pieces);
  std::lock_guard<std::mutex> lock(m.mutex);
  group->ticket = m.next_ticket++;
  group->ready = group->pieces.empty();
  m.groups.push_back(group);
  m.assign_slots();
  // One worker is woken per event; a worker that leaves work behind wakes the next one, so small
  // groups do not wake every thread.
  m.work_available.notify_one();
  return group->ticket;
}

const ReadyGroup& PrefetchReader::next() {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mutex);
  if (m.returned) {  // the previous group's slot is free again
    if (m.returned->slot >= 0) m.free_slots.push_back(m.returned->slot);
    m.returned.reset();
    m.assign_slots();
    m.work_available.notify_one();
  }
  KILTER_CHECK(!m.groups.empty(), "reader: next() called with no group queued");
  std::shared_ptr<Group> group = m.groups.front();
  auto start = std::chrono::steady_clock::now();
  // A consumer that would block helps read its own group: fewer thread hand-offs per group,
  // which matters for small micro-batches and on oversubscribed nodes.
  while (!group->ready) {
    if (group->next_piece < group->pieces.size())
      m.read_next_batch(group, lock, m.consumer_scratch);
    else
      m.group_ready.wait(lock);
  }
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  m.groups.pop_front();
  m.returned = group;
  if (group->error) std::rethrow_exception(group->error);
  m.current.ticket = group->ticket;
  m.current.tokens = group->slot >= 0 ? static_cast<const int32_t*>(m.slots[group->slot].memory) : nullptr;
  m.current.offsets = group->out_offsets;
  m.current.pieces = group->pieces;
  m.current.wait_seconds = waited;
  return m.current;
}

size_t PrefetchReader::queued() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->groups.size();
}

// Claims the next batch of `group` and reads it with the lock released. Called with `lock` held
// and returns with it held; marks the group ready when its last batch is done.
void PrefetchReader::Impl::read_next_batch(const std::shared_ptr<Group>& group,
                                           std::unique_lock<std::mutex>& lock,
                                           std::vector<unsigned char>& scratch) {
  size_t first = group->next_piece, end = first;
  uint64_t tokens = 0;
  while (end < group->pieces.size() && (end == first || tokens < kBatchTokens))
    tokens += group->pieces[end++].len + 1;
  group->next_piece = end;
  if (end < group->pieces.size()) work_available.notify_one();
  bool failed = bool(group->error);
  lock.unlock();
  std::exception_ptr error;
  if (!failed) {
    try {
      read_batch(*group, first, end, scratch);
    } catch (...) {
      error = std::current_exception();
    }
  }
  lock.lock();
  if (error && !group->error) group->error = error;
  group->done_pieces += end - first;
  if (group->done_pieces == group->pieces.size()) {
    group->ready = true;
    group_ready.notify_all();
  }
}

void PrefetchReader::Impl::worker_loop() {
  std::vector<unsigned char> scratch;
  std::unique_lock<std::mutex> lock(mutex);
  while (!stopping) {  // on shutdown, groups still queued are abandoned, not read
    std::shared_ptr<Group> group;
    for (const std::shared_ptr<Group>& candidate : groups) {
      if (candidate->slot < 0) break;  // later groups have no slot either
      if (candidate->next_piece < candidate->pieces.size()) {
        group = candidate;
        break;
      }
    }
    if (!group) {
      work_available.wait(lock);
      continue;
    }
    read_next_batch(group, lock, scratch);
  }
}

void PrefetchReader::Impl::read_batch(const Group& group, size_t first, size_t end,
                                      std::vector<unsigned char>& scratch) {
  auto* slot_tokens = static_cast<int32_t*>(slots[group.slot].memory);
  std::vector<ReadOp> ops;
  ops.reserve(end - first);
  for (size_t i = first; i < end; ++i) {
    const PieceRequest& p = group.pieces[i];
    uint32_t s = index.shard_of(p.doc);
    const ShardFile& shard = shards[s];
    uint64_t local = p.doc - index.shards[s].first_doc;
    uint64_t doc_begin = shard.offsets[local];
    uint64_t doc_length = shard.offsets[local + 1] - doc_begin;
    int32_t* destination = slot_tokens + group.out_offsets[i];
    // The target after a document's last token is EOS, which is not stored.
    bool ends_document = uint64_t(p.start) + p.len == doc_length;
    uint64_t count = ends_document ? p.len : uint64_t(p.len) + 1;
    if (ends_document) destination[p.len] = int32_t(index.eos_id);
    uint64_t file_pos = shard.layout.tokens_file_offset + (doc_begin + p.start) * shard.layout.token_bytes;
    ops.push_back({s, file_pos, count, destination});
  }
  std::sort(ops.begin(), ops.end(), [](const ReadOp& a, const ReadOp& b) {
    return a.shard != b.shard ? a.shard < b.shard : a.file_pos < b.file_pos;
  });

  for (size_t a = 0; a < ops.size();) {
    // Merge neighbouring reads of one file into one pread: planners read pieces of nearby
    // documents, and one large read is far cheaper than many small ones.
    const ShardFile& shard = shards[ops[a].shard];
    const uint32_t width = shard.layout.token_bytes;
    uint64_t span_begin = ops[a].file_pos;
    uint64_t span_end = span_begin + ops[a].count * width;
    size_t b = a + 1;
    while (b < ops.size() && ops[b].shard == ops[a].shard &&
           ops[b].file_pos <= span_end + kMergeGapBytes &&
           std::max(span_end, ops[b].file_pos + ops[b].count * width) - span_begin <= kSpanBytes) {
      span_end = std::max(span_end, ops[b].file_pos + ops[b].count * width);
      ++b;
    }
    uint64_t span_bytes = span_end - span_begin;
    if (scratch.size() < span_bytes) scratch.resize(span_bytes);
    for (uint64_t done = 0; done < span_bytes;) {
      ssize_t n = ::pread(shard.fd, scratch.data() + done, span_bytes - done, off_t(span_begin + done));
      if (n < 0 && errno == EINTR) continue;
      // The shard was whole when the run opened it: a short or failed read means it changed or
      // its storage failed under the run. Say so first, then what the read found.
      KILTER_CHECK(n >= 0, "shard " << shard.layout.path << " cannot be read (" << std::strerror(errno)
                                    << "): check its storage, then continue the run with --resume"
                                    << "\n  detail: pread of bytes [" << span_begin + done << ", " << span_end
                                    << ") failed");
      KILTER_CHECK(n > 0, "shard " << shard.layout.path << " was truncated while the run read it: restore the "
                                   << "dataset (kilter prep validate names damaged shards), then continue the run "
                                   << "with --resume\n  detail: the file ends at byte " << span_begin + done
                                   << " but /tokens extends to byte " << span_end);
      done += uint64_t(n);
    }
    uint32_t largest = 0;
    for (size_t k = a; k < b; ++k) {
      const unsigned char* source = scratch.data() + (ops[k].file_pos - span_begin);
      uint32_t seen = width == 2
          ? widen(reinterpret_cast<const uint16_t*>(source), ops[k].destination, ops[k].count)
          : widen(reinterpret_cast<const uint32_t*>(source), ops[k].destination, ops[k].count);
      largest = std::max(largest, seen);
    }
    // Out-of-vocabulary ids would index past the embedding table: refuse them here.
    KILTER_CHECK(largest < index.vocab_size, shard.layout.path << ": token id " << largest
                                                               << " is not below vocab_size "
                                                               << index.vocab_size);
    a = b;
  }
}

}  // namespace kilter::io
