// Reader throughput benchmark (run by bench/read.sh): streams every document of a dataset
// through io::PrefetchReader as context-sized pieces grouped into micro-batches, in document
// order, and prints tokens/s. It checks what it timed: the count and the sum of all tokens
// delivered must equal those read independently through HDF5 (after the timing).
// Usage: io_read_bench DIR [--piece TOKENS] [--group TOKENS] [--threads N] [--prefetch N]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "io/dataset.h"
#include "io/base/error.h"
#include "io/hdf5_util.h"
#include "io/reader.h"

using namespace kilter;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: io_read_bench DIR [--piece 1024] [--group 65536] [--threads 2] [--prefetch 4]\n");
    return 2;
  }
  std::string dir = argv[1];
  uint32_t piece = 1024;
  uint64_t group_tokens = 65536;
  io::ReaderOptions options;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string key = argv[i];
    long value = std::atol(argv[i + 1]);
    if (key == "--piece") piece = uint32_t(value);
    else if (key == "--group") group_tokens = uint64_t(value);
    else if (key == "--threads") options.threads = int(value);
    else if (key == "--prefetch") options.prefetch = int(value);
    else { std::fprintf(stderr, "io_read_bench: unknown option %s\n", key.c_str()); return 2; }
  }
  try {
    io::DatasetIndex index = io::load_index(dir);
    // The micro-batches: every document cut into pieces of at most `piece` tokens, in order.
    std::vector<std::vector<io::PieceRequest>> groups(1);
    uint64_t in_group = 0;
    for (uint64_t doc = 0; doc < index.num_docs(); ++doc) {
      for (uint32_t start = 0; start < index.doc_lengths[doc]; start += piece) {
        uint32_t len = std::min(piece, index.doc_lengths[doc] - start);
        groups.back().push_back({doc, start, len});
        in_group += len;
        if (in_group >= group_tokens) {
          groups.emplace_back();
          in_group = 0;
        }
      }
    }
    if (groups.back().empty()) groups.pop_back();

    auto start = std::chrono::steady_clock::now();
    uint64_t tokens = 0, sum = 0;
    double waited = 0;
    {
      io::PrefetchReader reader(index, dir, options);
      size_t sent = 0;
      for (; sent < groups.size() && sent < size_t(options.prefetch); ++sent) reader.enqueue(groups[sent]);
      for (size_t received = 0; received < groups.size(); ++received) {
        const io::ReadyGroup& ready = reader.next();
        waited += ready.wait_seconds;
        for (size_t p = 0; p < ready.pieces.size(); ++p) {
          const int32_t* t = ready.tokens + ready.offsets[p];
          for (uint32_t k = 0; k < ready.pieces[p].len; ++k) sum += uint64_t(t[k]);  // inputs only
          tokens += ready.pieces[p].len;
        }
        if (sent < groups.size()) reader.enqueue(groups[sent++]);
      }
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    // The check, untimed: the same tokens through HDF5.
    uint64_t want_tokens = 0, want_sum = 0;
    std::vector<uint32_t> buffer(size_t(1) << 20);
    for (const io::ShardInfo& shard : index.shards) {
      std::string path = dir + "/" + shard.file;
      io::h5::Handle file = io::h5::open_file(path);
      io::h5::Handle ds = io::h5::open_dataset(file, "tokens", path);
      for (uint64_t first = 0; first < shard.num_tokens; first += buffer.size()) {
        uint64_t n = std::min<uint64_t>(buffer.size(), shard.num_tokens - first);
        io::h5::read_range(ds, H5T_NATIVE_UINT32, first, n, buffer.data(), path, "/tokens");
        for (uint64_t k = 0; k < n; ++k) want_sum += buffer[k];
        want_tokens += n;
      }
    }
    bool ok = tokens == want_tokens && sum == want_sum;
    std::printf("reader: %llu tokens in %.3f s = %.1f Mtokens/s (%zu groups of ~%llu tokens, pieces <= %u, "
                "%d threads, prefetch %d, consumer waited %.3f s) check %s\n",
                (unsigned long long)tokens, seconds, tokens / seconds / 1e6, groups.size(),
                (unsigned long long)group_tokens, piece, options.threads, options.prefetch, waited,
                ok ? "OK" : "FAILED");
    std::printf("reader_tokens_per_s %.0f\n", tokens / seconds);
    return ok ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "io_read_bench: %s\n", e.what());
    return 1;
  }
}
