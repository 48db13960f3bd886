// The engine of `kilter bench-comm` (see comm_bench.h). What it times is what training runs: the
// GradientReducer over the same communicators, against a plain MPI_Allreduce of the same bytes.
// Every timed result is checked: buffers hold rank-dependent integers, so after one reduction
// each element must equal a sum known exactly, and after k more it must equal that sum times
// n^k (values are scaled by a power of two first when n^k would overflow a float).
#include "lib/comm/comm_bench.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "io/base/error.h"
#include "io/base/mpi_check.h"

namespace kilter::comm {

std::vector<size_t> parse_byte_sizes(const std::string& list, const std::string& option) {
  std::vector<size_t> sizes;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t digits = 0;
    while (digits < item.size() && std::isdigit(static_cast<unsigned char>(item[digits]))) ++digits;
    KILTER_CHECK(digits > 0, option << " '" << list << "': '" << item << "' is not a size (e.g. 64K, 16M)");
    size_t value = std::stoull(item.substr(0, digits));
    const std::string suffix = item.substr(digits);
    if (suffix == "K" || suffix == "k") value <<= 10;
    else if (suffix == "M" || suffix == "m") value <<= 20;
    else if (suffix == "G" || suffix == "g") value <<= 30;
    else KILTER_CHECK(suffix.empty() || suffix == "B", option << " '" << list << "': unknown unit in '" << item
                                                              << "' (use K, M or G)");
    KILTER_CHECK(value >= sizeof(float), option << " '" << list << "': '" << item << "' is smaller than one float");
    sizes.push_back(value);
  }
  KILTER_CHECK(!sizes.empty(), option << " is empty: give sizes like 1K,64K,1M");
  return sizes;
}

namespace {

// Test pattern: small integers, rank- and position-dependent so a misplaced shard shows.
inline float pattern(int rank, size_t i) { return float(int((i * 7 + size_t(rank) * 13) % 23) - 11); }

struct Verifier {
  std::vector<float> sums;  // exact sum over ranks of pattern(r, i)
  int ranks = 1;
  Verifier(size_t count, int n) : sums(count, 0.f), ranks(n) {
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i) sums[i] += pattern(r, i);
  }
  void fill(float* buf, int rank, float scale) const {
    for (size_t i = 0; i < sums.size(); ++i) buf[i] = pattern(rank, i) * scale;
  }
  // Mismatches after `reductions` reductions of the filled buffer.
  long check(const float* buf, int reductions, float scale) const {
    const double growth = std::pow(double(ranks), reductions - 1) * scale;
    long bad = 0;
    for (size_t i = 0; i < sums.size(); ++i) {
      const double expected = double(sums[i]) * growth;
      // Exact when n is a power of two (or after one reduction); otherwise each reduction may
      // round once.
      const double tolerance = reductions <= 1 ? 0.0 : 1e-6 * reductions * std::fabs(expected);
      bad += std::fabs(double(buf[i]) - expected) > tolerance;
    }
    return bad;
  }
};

double max_over(MPI_Comm comm, double v) {
  double out = v;
  KILTER_MPI_CHECK(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, comm), "MPI_Allreduce(max)");
  return out;
}
long sum_over(MPI_Comm comm, long v) {
  long out = v;
  KILTER_MPI_CHECK(MPI_Allreduce(&v, &out, 1, MPI_LONG, MPI_SUM, comm), "MPI_Allreduce(sum)");
  return out;
}

// Times `iters` reductions of `buf` (refilled, untimed, whenever the values would outgrow a
// float) and verifies each stretch. Returns the slowest rank's seconds per reduction; adds this
// rank's mismatches to *bad.
template <class Reduce>
double time_reductions(MPI_Comm world, int rank, const Verifier& verifier, float* buf, int iters,
                       const Reduce& reduce, long* bad) {
  const double bits_per_reduction = std::log2(std::max(verifier.ranks, 2));
  const int stretch = verifier.ranks == 1 ? iters : std::max(1, std::min(iters, int(200 / bits_per_reduction)));
  double seconds = 0;
  for (int done = 0; done < iters;) {
    const int k = std::min(stretch, iters - done);
    const float scale = k * bits_per_reduction > 100 ? std::ldexp(1.f, -100) : 1.f;
    verifier.fill(buf, rank, scale);
    KILTER_MPI_CHECK(MPI_Barrier(world), "MPI_Barrier");
    const double t0 = MPI_Wtime();
    for (int j = 0; j < k; ++j) reduce();
    seconds += MPI_Wtime() - t0;
    *bad += verifier.check(buf, k, scale);
    done += k;
  }
  return max_over(world, seconds) / std::max(iters, 1);
}

size_t element_count(size_t bytes, const Topology& topo) {
  const size_t unit = size_t(topo.uniform ? topo.local_size : 1);
  const size_t floats = (bytes + sizeof(float) - 1) / sizeof(float);
  return std::max(unit, (floats + unit - 1) / unit * unit);
}

double busbw_factor(int n) { return n > 1 ? 2.0 * (n - 1) / n : 0.0; }

}  // namespace

std::vector<BenchRow> run_collective_bench(MPI_Comm world, const BenchOptions& opts) {
  Topology topo = make_topology(world, opts.ranks_per_node);
  std::vector<BenchRow> rows;
  for (size_t requested : opts.sizes) {
    const size_t count = element_count(requested, topo);
    const size_t bytes = count * sizeof(float);
    const Verifier verifier(count, topo.size);
    const size_t bucket_bytes = opts.bucket_bytes ? opts.bucket_bytes : bytes;

    std::vector<float> mpi_buf(count);
    auto mpi_reduce = [&] {
      KILTER_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, mpi_buf.data(), int(count), MPI_FLOAT, MPI_SUM, world),
                       "MPI_Allreduce of " << bytes << " bytes");
    };
    struct Candidate {
      std::string algo;
      std::vector<float> buf;
      std::unique_ptr<GradientReducer> reducer;
      double best = 1e300;
      long bad = 0;
    };
    std::vector<Candidate> candidates;
    for (const std::string& algo : opts.algos) {
      Candidate c;
      c.algo = algo;
      c.buf.resize(count);
      ReducerOptions ro;
      ro.algo = algo;
      ro.bucket_bytes = bucket_bytes;
      ro.overlap = OverlapMode::off;
      ro.blocking_collectives = opts.blocking;
      c.reducer = make_gradient_reducer(topo, c.buf.data(), count, ro);
      candidates.push_back(std::move(c));
    }
    auto reduce_with = [](GradientReducer& r) {
      r.begin();
      r.finish();
    };

    // One exactly verified reduction each, then warm-up.
    long mpi_bad = 0;
    time_reductions(world, topo.rank, verifier, mpi_buf.data(), 1 + opts.warmup, mpi_reduce, &mpi_bad);
    for (Candidate& c : candidates)
      time_reductions(world, topo.rank, verifier, c.buf.data(), 1 + opts.warmup,
                      [&] { reduce_with(*c.reducer); }, &c.bad);
    // Interleaved rounds, so that a noisy neighbour slows the reference and the candidates alike.
    double mpi_best = 1e300;
    for (int round = 0; round < opts.rounds; ++round) {
      mpi_best = std::min(mpi_best, time_reductions(world, topo.rank, verifier, mpi_buf.data(), opts.iters,
                                                    mpi_reduce, &mpi_bad));
      for (Candidate& c : candidates)
        c.best = std::min(c.best, time_reductions(world, topo.rank, verifier, c.buf.data(), opts.iters,
                                                  [&] { reduce_with(*c.reducer); }, &c.bad));
    }
    const bool mpi_ok = sum_over(world, mpi_bad) == 0;
    const size_t bucket_elems = std::max<size_t>(1, bucket_bytes / sizeof(float));
    for (Candidate& c : candidates) {
      BenchRow row;
      row.bytes = bytes;
      row.algo = c.algo;
      row.ranks = topo.size;
      row.nodes = topo.num_nodes;
      row.ranks_per_node = topo.local_size;
      row.buckets = (count + bucket_elems - 1) / bucket_elems;
      row.time_us = c.best * 1e6;
      row.algbw_gbs = double(bytes) / c.best / 1e9;
      row.busbw_gbs = row.algbw_gbs * busbw_factor(topo.size);
      row.mpi_time_us = mpi_best * 1e6;
      row.mpi_busbw_gbs = double(bytes) / mpi_best / 1e9 * busbw_factor(topo.size);
      row.ratio = mpi_best / c.best;
      row.verified = mpi_ok && sum_over(world, c.bad) == 0;
      rows.push_back(row);
    }
  }
  free_topology(topo);
  return rows;
}

nlohmann::json bench_rows_to_json(const std::vector<BenchRow>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const BenchRow& r : rows) {
    out.push_back({{"bytes", r.bytes},
                   {"algo", r.algo},
                   {"time_us", r.time_us},
                   {"algbw_gbs", r.algbw_gbs},
                   {"busbw_gbs", r.busbw_gbs},
                   {"mpi_allreduce_time_us", r.mpi_time_us},
                   {"mpi_allreduce_busbw_gbs", r.mpi_busbw_gbs},
                   {"ratio_vs_mpi_allreduce", r.ratio},
                   {"verified", r.verified},
                   {"ranks", r.ranks},
                   {"nodes", r.nodes},
                   {"ranks_per_node", r.ranks_per_node},
                   {"buckets", r.buckets}});
  }
  return out;
}

std::string bench_rows_to_text(const std::vector<BenchRow>& rows, const BenchOptions& opts) {
  std::ostringstream os;
  if (!rows.empty()) {
    const BenchRow& f = rows.front();
    os << "# kilter bench-comm: " << f.ranks << " ranks = " << f.nodes << " nodes x " << f.ranks_per_node
       << ", allreduce (sum, float32), " << opts.iters << " iterations x " << opts.rounds
       << " interleaved rounds (fastest round), "
       << (opts.blocking ? "blocking" : "nonblocking") << " collectives\n"
       << "# busbw = algbw * 2(n-1)/n; ratio = MPI_Allreduce time / algo time (>1: faster than MPI_Allreduce)\n";
  }
  char line[256];
  std::snprintf(line, sizeof line, "%12s %-13s %7s %11s %10s %10s %12s %10s %7s %6s\n", "bytes", "algo", "buckets",
                "time_us", "algbw_gbs", "busbw_gbs", "mpi_time_us", "mpi_busbw", "ratio", "check");
  os << line;
  for (const BenchRow& r : rows) {
    std::snprintf(line, sizeof line, "%12zu %-13s %7zu %11.1f %10.3f %10.3f %12.1f %10.3f %7.3f %6s\n", r.bytes,
                  r.algo.c_str(), r.buckets, r.time_us, r.algbw_gbs, r.busbw_gbs, r.mpi_time_us, r.mpi_busbw_gbs,
                  r.ratio, r.verified ? "ok" : "WRONG");
    os << line;
  }
  return os.str();
}

// ---- overlap study -------------------------------------------------------------------------

namespace {

// A fixed amount of arithmetic on a cache-resident array: the synthetic backward. Fixed work
// (not a fixed time) so that a communication thread stealing the core shows as slower compute.
struct SyntheticCompute {
  std::vector<float> scratch = std::vector<float>(8192, 1.f);
  volatile float sink = 0;
  void run(long units) {
    float* a = scratch.data();
    for (long u = 0; u < units; ++u)
      for (size_t i = 0; i < scratch.size(); ++i) a[i] = a[i] * 0.999f + 0.25f;
    sink = a[0];
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

std::vector<OverlapRow> run_overlap_bench(MPI_Comm world, const BenchOptions& opts) {
  KILTER_CHECK(opts.backward_ms > 0, "overlap study: --backward-ms must be > 0");
  KILTER_CHECK(opts.ready_per_bucket >= 1, "overlap study: --ready-per-bucket must be >= 1");
  Topology topo = make_topology(world, opts.ranks_per_node);
  int thread_level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&thread_level);
  struct Engine {
    const char* name;
    OverlapMode mode;
    bool blocking;
  };
  // The first is also the "reduction alone" reference.
  std::vector<Engine> modes = {{"off", OverlapMode::off, true}, {"poll", OverlapMode::poll, false}};
  if (thread_level == MPI_THREAD_MULTIPLE) {
    modes.push_back({"thread", OverlapMode::thread, true});
    modes.push_back({"thread-nb", OverlapMode::thread, false});
  }

  // Calibrate the compute: each rank's best rate over a few runs (a run the scheduler cut into
  // is slow, not representative), averaged over ranks so every rank does the same work.
  SyntheticCompute compute;
  long calib_units = 16;
  for (;;) {
    const double t0 = MPI_Wtime();
    compute.run(calib_units);
    if (MPI_Wtime() - t0 > 0.02) break;
    calib_units *= 2;
  }
  double best_rate = 0;  // units per ms
  for (int trial = 0; trial < 5; ++trial) {
    const double t0 = MPI_Wtime();
    compute.run(calib_units);
    best_rate = std::max(best_rate, double(calib_units) / ((MPI_Wtime() - t0) * 1e3));
  }
  double rate_sum = 0;
  KILTER_MPI_CHECK(MPI_Allreduce(&best_rate, &rate_sum, 1, MPI_DOUBLE, MPI_SUM, world), "MPI_Allreduce(rate)");
  const double units_per_ms = rate_sum / topo.size;

  std::vector<OverlapRow> rows;
  for (size_t requested : opts.sizes) {
    const size_t count = element_count(requested, topo);
    const Verifier verifier(count, topo.size);
    const size_t bucket_bytes = opts.bucket_bytes ? opts.bucket_bytes : std::max<size_t>(count * 4 / 8, 4);
    const size_t bucket_elems = std::max<size_t>(1, bucket_bytes / sizeof(float));
    const size_t buckets = (count + bucket_elems - 1) / bucket_elems;
    const size_t pieces = buckets * size_t(opts.ready_per_bucket);
    const long units_per_piece =
        std::max(1L, long(std::lround(opts.backward_ms * double(buckets) / double(pieces) * units_per_ms)));
    std::vector<float> buf(count);

    // The synthetic backward: compute, then report the next range down, as a model does.
    auto backward = [&](GradientReducer* reducer) {
      const size_t piece = (count + pieces - 1) / pieces;
      for (size_t end = count; end > 0;) {
        const size_t begin = end > piece ? end - piece : 0;
        compute.run(units_per_piece);
        if (reducer) reducer->ready(begin, end - begin);
        end = begin;
      }
    };

    for (const std::string& algo : opts.algos) {
      std::vector<double> compute_s, alone_s;
      struct PerMode {
        std::unique_ptr<GradientReducer> reducer;
        std::vector<double> step_s, exposed_s;
        long bad = 0;
      };
      std::vector<PerMode> per_mode(modes.size());
      for (size_t m = 0; m < modes.size(); ++m) {
        ReducerOptions ro;
        ro.algo = algo;
        ro.bucket_bytes = bucket_bytes;
        ro.overlap = modes[m].mode;
        ro.blocking_collectives = modes[m].blocking;
        per_mode[m].reducer = make_gradient_reducer(topo, buf.data(), count, ro);
      }
      const int reps = std::max(1, opts.iters) + 1;  // the first is a warm-up
      for (int rep = 0; rep < reps; ++rep) {
        // The backward alone, and the reduction alone.
        KILTER_MPI_CHECK(MPI_Barrier(world), "MPI_Barrier");
        double t0 = MPI_Wtime();
        backward(nullptr);
        const double c = max_over(world, MPI_Wtime() - t0);
        verifier.fill(buf.data(), topo.rank, 1.f);
        KILTER_MPI_CHECK(MPI_Barrier(world), "MPI_Barrier");
        t0 = MPI_Wtime();
        per_mode[0].reducer->begin();
        per_mode[0].reducer->finish();
        const double a = max_over(world, MPI_Wtime() - t0);
        per_mode[0].bad += verifier.check(buf.data(), 1, 1.f);
        if (rep > 0) {
          compute_s.push_back(c);
          alone_s.push_back(a);
        }
        for (size_t m = 0; m < modes.size(); ++m) {
          PerMode& pm = per_mode[m];
          verifier.fill(buf.data(), topo.rank, 1.f);
          KILTER_MPI_CHECK(MPI_Barrier(world), "MPI_Barrier");
          t0 = MPI_Wtime();
          pm.reducer->begin();
          backward(pm.reducer.get());
          const double exposed = pm.reducer->finish();
          const double step = MPI_Wtime() - t0;
          pm.bad += verifier.check(buf.data(), 1, 1.f);
          const double step_max = max_over(world, step), exposed_max = max_over(world, exposed);
          if (rep > 0) {
            pm.step_s.push_back(step_max);
            pm.exposed_s.push_back(exposed_max);
          }
        }
      }
      const double compute_med = median(compute_s), alone_med = median(alone_s);
      for (size_t m = 0; m < modes.size(); ++m) {
        OverlapRow row;
        row.bytes = count * sizeof(float);
        row.algo = algo;
        row.mode = modes[m].name;
        row.buckets = buckets;
        row.backward_ms_per_bucket = opts.backward_ms;
        row.compute_s = compute_med;
        row.reduce_alone_s = alone_med;
        row.step_s = median(per_mode[m].step_s);
        row.exposed_s = median(per_mode[m].exposed_s);
        row.hidden_fraction = alone_med > 0 ? 1.0 - row.exposed_s / alone_med : 0;
        row.net_hidden_fraction = alone_med > 0 ? (compute_med + alone_med - row.step_s) / alone_med : 0;
        row.verified = sum_over(world, per_mode[m].bad) == 0;
        rows.push_back(row);
      }
    }
  }
  free_topology(topo);
  return rows;
}

nlohmann::json overlap_rows_to_json(const std::vector<OverlapRow>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const OverlapRow& r : rows) {
    out.push_back({{"bytes", r.bytes},
                   {"algo", r.algo},
                   {"overlap", r.mode},
                   {"buckets", r.buckets},
                   {"backward_ms_per_bucket", r.backward_ms_per_bucket},
                   {"compute_s", r.compute_s},
                   {"reduce_alone_s", r.reduce_alone_s},
                   {"step_s", r.step_s},
                   {"exposed_s", r.exposed_s},
                   {"hidden_fraction", r.hidden_fraction},
                   {"net_hidden_fraction", r.net_hidden_fraction},
                   {"verified", r.verified}});
  }
  return out;
}

std::string overlap_rows_to_text(const std::vector<OverlapRow>& rows, const BenchOptions& opts) {
  std::ostringstream os;
  os << "# kilter bench-comm overlap study: synthetic backward of " << opts.backward_ms
     << " ms compute per bucket, " << opts.ready_per_bucket << " ready() calls per bucket, median of "
     << std::max(1, opts.iters) << " steps (slowest rank)\n"
     << "# hidden = 1 - exposed/reduce_alone; net_hidden = (compute + reduce_alone - step)/reduce_alone "
        "(also charges compute slowed by communication)\n";
  char line[256];
  std::snprintf(line, sizeof line, "%11s %-13s %-9s %7s %10s %10s %10s %10s %7s %10s %6s\n", "bytes", "algo",
                "overlap", "buckets", "compute_ms", "reduce_ms", "step_ms", "exposed_ms", "hidden", "net_hidden",
                "check");
  os << line;
  for (const OverlapRow& r : rows) {
    std::snprintf(line, sizeof line, "%11zu %-13s %-9s %7zu %10.2f %10.2f %10.2f %10.2f %6.0f%% %9.0f%% %6s\n",
                  r.bytes, r.algo.c_str(), r.mode.c_str(), r.buckets, r.compute_s * 1e3, r.reduce_alone_s * 1e3,
                  r.step_s * 1e3, r.exposed_s * 1e3, 100 * r.hidden_fraction, 100 * r.net_hidden_fraction,
                  r.verified ? "ok" : "WRONG");
    os << line;
  }
  return os.str();
}

}  // namespace kilter::comm
