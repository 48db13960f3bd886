// The K/V exchange's cost with no compute around it (bench/kv_exchange.sh runs it): one piece of
// --tokens tokens cut at --cut between ranks 0 and 1 (rank 0 the earlier part), every layer's
// forward K/V and backward dK/dV through lib/comm/kv_exchange_mpi.h, against the same bytes moved
// by plain blocking MPI_Sendrecv of contiguous buffers (the floor). Checks every prefix row and
// every summed gradient of an untimed first iteration, then prints, on
// rank 0, one JSON line: median milliseconds per step of both (the slower rank's, over the timed
// iterations) and the exchange's bandwidth (bytes that crossed, both directions, per second).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "io/base/error.h"
#include "lib/comm/kv_exchange_mpi.h"
#include "lib/train/cut_schedule.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int layers = 12, embd = 768, tokens = 1024, cut = 512, iterations = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (key == "--layers") layers = value;
    else if (key == "--embd") embd = value;
    else if (key == "--tokens") tokens = value;
    else if (key == "--cut") cut = value;
    else if (key == "--iterations") iterations = value;
  }
  if (size != 2 || cut <= 0 || cut >= tokens) {
    if (rank == 0) std::fprintf(stderr, "kv_exchange bench: 2 ranks and 0 < --cut < --tokens\n");
    MPI_Finalize();
    return 2;
  }
  int failures = 0;
  try {
    using kilter::balance::Piece;
    kilter::balance::Step step;
    kilter::balance::MicroBatch first, second;
    first.pieces = {Piece{1, 0, uint32_t(cut), 0}};
    second.pieces = {Piece{1, uint32_t(cut), uint32_t(tokens - cut), uint32_t(cut)}};
    step.micro_batches = {first, second};
    step.rank_batches = {{0}, {1}};
    const kilter::train::StepCuts cuts = kilter::train::StepCuts::of(step);
    const kilter::balance::MicroBatch& mine = step.micro_batches[size_t(rank)];
    const int64_t N = mine.pieces[0].len, C = embd;
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    kilter::comm::KvExchangeOptions opts;
    opts.n_layer = layers;
    opts.rows = {3 * embd, embd, 2 * embd};  // GPT-2 rows: q|k|v, K at column C
    opts.timeout_s = 120;

    // Rank 0's k|v of token t, column j, layer l; rank 1's dk|dv for it. Made before the loop,
    // so the timed iterations do nothing between the exchange's calls but what a backend must:
    // hand over qkv, add into the prefix gradient.
    auto kv = [&](int64_t t, int64_t j, int l) { return float((t * 3 + j + l * 7) % 1021); };
    auto dkv = [&](int64_t t, int64_t j, int l) { return float((t * 5 + j * 3 + l) % 509); };
    std::vector<std::vector<float>> qkv(size_t(layers), std::vector<float>(size_t(N * 3 * C)));
    std::vector<std::vector<float>> grad(size_t(layers), std::vector<float>(size_t(cut * 2 * C)));
    for (int l = 0; l < layers; ++l) {
      for (int64_t t = 0; t < N; ++t)
        for (int64_t j = 0; j < 2 * C; ++j) qkv[size_t(l)][size_t(t * 3 * C + C + j)] = kv(t, j, l);
      for (int64_t t = 0; t < cut; ++t)
        for (int64_t j = 0; j < 2 * C; ++j) grad[size_t(l)][size_t(t * 2 * C + j)] = dkv(t, j, l);
    }
    std::vector<float> dqkv(size_t(N * 3 * C));
    std::vector<double> exchange_s, floor_s;
    int64_t bytes = 0;
    // Iteration 0 checks every value and is not timed; the others are timed.
    for (int it = 0; it <= iterations; ++it) {
      const bool check = it == 0;
      MPI_Barrier(comm);
      const auto t0 = std::chrono::steady_clock::now();
      kilter::comm::MpiKvExchange ex(comm, cuts.schedule(mine, rank, 0, it), opts);
      bytes = ex.schedule().bytes_per_step(layers, 2 * embd);
      for (int l = 0; l < layers; ++l) {
        ex.forward_send(l, qkv[size_t(l)].data());
        ex.forward_wait(l);
        if (check && rank == 1) {
          const float* p = ex.prefix_kv(l, 0);
          for (int64_t t = 0; t < cut; ++t)
            for (int64_t j = 0; j < 2 * C; ++j) failures += p[t * 2 * C + j] != kv(t, j, l);
        }
      }
      for (int l = layers - 1; l >= 0; --l) {
        if (rank == 1) {
          float* d = ex.prefix_dkv(l, 0);
          const float* g = grad[size_t(l)].data();
          for (int64_t i = 0; i < cut * 2 * C; ++i) d[i] += g[i];
        }
        ex.backward_send(l);
        if (check) std::fill(dqkv.begin(), dqkv.end(), 0.0f);
        ex.backward_wait_add(l, dqkv.data());
        if (check && rank == 0)
          for (int64_t t = 0; t < N; ++t)
            for (int64_t j = 0; j < 2 * C; ++j) failures += dqkv[size_t(t * 3 * C + C + j)] != dkv(t, j, l);
      }
      ex.finish();
      double seconds = seconds_since(t0);
      MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, comm);
      if (!check) exchange_s.push_back(seconds);

      // The floor: the same bytes as one contiguous blocking Sendrecv per layer and direction.
      std::vector<float> out(size_t(cut * 2 * C), 1.0f), in(size_t(cut * 2 * C));
      MPI_Barrier(comm);
      const auto t1 = std::chrono::steady_clock::now();
      const int peer = 1 - rank;
      for (int pass = 0; pass < 2 * layers; ++pass)
        MPI_Sendrecv(out.data(), rank == pass % 2 ? int(out.size()) : 0, MPI_FLOAT, peer, pass, in.data(),
                     int(in.size()), MPI_FLOAT, peer, pass, comm, MPI_STATUS_IGNORE);
      double floor_seconds = seconds_since(t1);
      MPI_Allreduce(MPI_IN_PLACE, &floor_seconds, 1, MPI_DOUBLE, MPI_MAX, comm);
      if (!check) floor_s.push_back(floor_seconds);
    }
    MPI_Comm_free(&comm);
    MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) {
      const double ms = 1e3 * median(exchange_s), floor_ms = 1e3 * median(floor_s);
      std::printf("{\"layers\": %d, \"embd\": %d, \"tokens\": %d, \"cut\": %d, \"iterations\": %d, "
                  "\"bytes_per_step\": %lld, \"exchange_ms\": %.3f, \"sendrecv_floor_ms\": %.3f, "
                  "\"exchange_gb_per_s\": %.3f, \"checked\": %s}\n",
                  layers, embd, tokens, cut, iterations, (long long)bytes, ms, floor_ms,
                  ms > 0 ? double(bytes) / (ms * 1e-3) / 1e9 : 0.0, failures == 0 ? "true" : "false");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
