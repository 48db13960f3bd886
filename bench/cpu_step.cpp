// kilter_bench_step: times kilter's CPU training step (zero_grads + forward_backward + AdamW)
// on one fixed batch of full-length rows, in fp32 or bf16 (--precision), and reports tokens/s,
// the GEMM rate reached inside the step, and the rate of the same GEMM shapes run standalone
// (each shape on fresh buffers, best of 3, weighted by its calls per step) plus a plain square
// SGEMM rate, all measured in the same process. It checks what it
// times: the first loss must be about ln(vocab) (fresh GPT-2 init) and the loss must fall while
// it trains on the repeated batch. Output: one JSON object on stdout. Run by bench/cpu_step.sh.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "lib/backend/cpu_model.h"
#include "lib/model/gemm.h"
#include "lib/model/init.h"
#include "lib/model/model.h"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Options {
  int n_layer = 4, n_embd = 256, n_head = 4, vocab = 8192, B = 8, T = 256, kv_heads = 0, ffn = 0;
  std::string arch = "gpt2";
  int steps = 5, warmup = 1, threads = 1, gemm_size = 1024, shapes = 0;
  std::string precision = "fp32";
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
      std::fprintf(stderr, "usage: kilter_bench_step [--arch=gpt2|llama --layers=4 --embd=256 --heads=4 --kv-heads=0 --ffn=0 --vocab=8192 --B=8 --T=256 "
                           "--steps=5 --warmup=1 --threads=1 --gemm-size=1024 --precision=fp32|bf16 --shapes=0|1]\n");
      std::exit(2);
    }
    const std::string key = arg.substr(2, eq - 2);
    if (key == "precision" || key == "arch") {
      (key == "arch" ? o.arch : o.precision) = arg.substr(eq + 1);
      continue;
    }
    const int value = std::atoi(arg.c_str() + eq + 1);
    if (key == "layers") o.n_layer = value;
    else if (key == "embd") o.n_embd = value;
    else if (key == "heads") o.n_head = value;
    else if (key == "kv-heads") o.kv_heads = value;
    else if (key == "ffn") o.ffn = value;
    else if (key == "vocab") o.vocab = value;
    else if (key == "B") o.B = value;
    else if (key == "T") o.T = value;
    else if (key == "steps") o.steps = value;
    else if (key == "warmup") o.warmup = value;
    else if (key == "threads") o.threads = value;
    else if (key == "gemm-size") o.gemm_size = value;
    else if (key == "shapes") o.shapes = value;
    else {
      std::fprintf(stderr, "kilter_bench_step: unknown option --%s\n", key.c_str());
      std::exit(2);
    }
  }
  return o;
}

// Best-of-5 rate of one square sgemm of size n (the machine's SGEMM reference), checked
// against a few dot products.
double plain_sgemm_gflops(int n) {
  std::vector<float> a = std::vector<float>(static_cast<size_t>(n) * n), b = a, c = a;
  kilter::model::SplitMix64 rng(1);
  for (float& x : a) x = static_cast<float>(rng.uniform_open01() - 0.5);
  for (float& x : b) x = static_cast<float>(rng.uniform_open01() - 0.5);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    kilter::model::sgemm_rowmajor(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    best = std::min(best, seconds_since(t0));
  }
  for (int check = 0; check < 4; ++check) {
    const int i = (check * 7919) % n, j = (check * 104729) % n;
    double ref = 0.0;
    for (int k = 0; k < n; ++k) ref += static_cast<double>(a[static_cast<size_t>(i) * n + k]) * b[static_cast<size_t>(k) * n + j];
    if (std::fabs(ref - c[static_cast<size_t>(i) * n + j]) > 1e-3 * std::sqrt(static_cast<double>(n))) {
      std::fprintf(stderr, "kilter_bench_step: reference sgemm gave a wrong result\n");
      std::exit(1);
    }
  }
  return 2.0 * n * n * n / best / 1e9;
}

// Seconds per step of the profiled GEMM shapes run standalone: each shape on its own buffers,
// one warm-up call, best of 3, times its calls per step. best_call: each shape's best seconds.
double standalone_seconds_per_step(const kilter::model::GemmProfile& profile, int steps,
                                   std::map<kilter::model::GemmShape, double>& best_call) {
  using kilter::model::bf16;
  double total = 0.0;
  kilter::model::SplitMix64 rng(3);
  for (const auto& [shape, stats] : profile.shapes) {
    const auto [bf16_inputs, ta, tb, M, N, K] = shape;
    const size_t a_size = static_cast<size_t>(M) * K, b_size = static_cast<size_t>(K) * N;
    std::vector<float> a(a_size), b(b_size), c(static_cast<size_t>(M) * N, 0.0f);
    for (float& x : a) x = static_cast<float>(rng.uniform_open01() - 0.5);
    for (float& x : b) x = static_cast<float>(rng.uniform_open01() - 0.5);
    std::vector<bf16> ah(bf16_inputs ? a_size : 0), bh(bf16_inputs ? b_size : 0);
    if (bf16_inputs) {
      kilter::model::to_bf16(ah.data(), a.data(), a_size);
      kilter::model::to_bf16(bh.data(), b.data(), b_size);
    }
    const int lda = ta ? M : K, ldb = tb ? K : N;
    double best = 1e30;
    for (int rep = 0; rep < 4; ++rep) {
      const auto t0 = Clock::now();
      if (bf16_inputs)
        kilter::model::gemm_bf16_rowmajor(ta, tb, M, N, K, 1.0f, ah.data(), lda, bh.data(), ldb, 1.0f, c.data(), N);
      else
        kilter::model::sgemm_rowmajor(ta, tb, M, N, K, 1.0f, a.data(), lda, b.data(), ldb, 1.0f, c.data(), N);
      if (rep > 0) best = std::min(best, seconds_since(t0));
    }
    best_call[shape] = best;
    total += best * static_cast<double>(stats.first) / steps;
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  kilter::backend::set_blas_threads(o.threads);
  kilter::model::ModelSpec cfg;
  cfg.n_layer = o.n_layer;
  cfg.n_embd = o.n_embd;
  cfg.n_head = o.n_head;
  cfg.vocab_size = o.vocab;
  cfg.block_size = o.T;
  cfg.arch = o.arch;
  cfg.n_kv_head = o.kv_heads;
  cfg.ffn_hidden = o.ffn;
  if (cfg.llama()) cfg.tie_embeddings = "false";  // bench/torch_step.py's Llama has an untied head
  kilter::backend::CpuModel model(cfg, 1, o.precision);
  model.init_params(1337);
  model.reserve(o.B * o.T, o.T);

  // B packed pieces of T tokens each.
  kilter::model::Batch batch;
  batch.clear();
  kilter::model::SplitMix64 rng(42);
  std::vector<int32_t> inputs(o.T), targets(o.T);
  for (int b = 0; b < o.B; ++b) {
    for (int t = 0; t < o.T; ++t) {
      inputs[t] = static_cast<int32_t>(rng.next() % o.vocab);
      targets[t] = static_cast<int32_t>(rng.next() % o.vocab);
    }
    batch.append_piece(inputs.data(), targets.data(), o.T);
  }
  const float loss_scale = 1.0f / static_cast<float>(batch.num_targets);

  double first_loss = 0.0, last_loss = 0.0;
  std::vector<double> step_times;
  double time_fwdbwd = 0.0, time_optimizer = 0.0, time_zero = 0.0, time_total = 0.0;
  kilter::model::GemmProfile gemm;
  for (int step = 0; step < o.warmup + o.steps; ++step) {
    const bool timed = step >= o.warmup;
    kilter::model::gemm_profile_enable(timed);
    const auto t0 = Clock::now();
    model.zero_grads();
    const auto t1 = Clock::now();
    const double loss = model.forward_backward(batch, loss_scale, {}) * loss_scale;
    const auto t2 = Clock::now();
    kilter::model::AdamWParams p;
    p.lr = 1e-3f;
    p.t = step + 1;
    model.adamw_step(p);
    const auto t3 = Clock::now();
    if (step == 0) first_loss = loss;
    last_loss = loss;
    if (timed) {
      time_zero += std::chrono::duration<double>(t1 - t0).count();
      time_fwdbwd += std::chrono::duration<double>(t2 - t1).count();
      time_optimizer += std::chrono::duration<double>(t3 - t2).count();
      time_total += std::chrono::duration<double>(t3 - t0).count();
      step_times.push_back(std::chrono::duration<double>(t3 - t0).count());
    }
  }
  kilter::model::gemm_profile_enable(false);
  gemm = kilter::model::gemm_profile_take();
  std::map<kilter::model::GemmShape, double> standalone_call;
  const double standalone_s = standalone_seconds_per_step(gemm, o.steps, standalone_call);
  if (o.shapes) {  // --shapes=1: the in-step GEMM time per shape on stderr, largest first
    std::vector<std::pair<double, kilter::model::GemmShape>> by_time;
    for (const auto& [shape, stats] : gemm.shapes) by_time.emplace_back(stats.second / o.steps, shape);
    std::sort(by_time.rbegin(), by_time.rend());
    std::fprintf(stderr, "%-5s %2s %2s %6s %6s %6s %7s %9s %8s %10s\n", "type", "tA", "tB", "M", "N", "K", "calls",
                 "s/step", "GFLOP/s", "standalone");
    for (const auto& [seconds, shape] : by_time) {
      const auto [bf16_inputs, ta, tb, M, N, K] = shape;
      const double calls = static_cast<double>(gemm.shapes[shape].first) / o.steps;
      std::fprintf(stderr, "%-5s %2d %2d %6d %6d %6d %7.0f %9.4f %8.1f %10.1f\n", bf16_inputs ? "bf16" : "fp32", ta, tb,
                   M, N, K, calls, seconds, 2.0 * M * N * K * calls / seconds / 1e9,
                   2.0 * M * N * K / standalone_call[shape] / 1e9);
    }
  }
  const double plain = plain_sgemm_gflops(o.gemm_size);

  const double expected = std::log(static_cast<double>(o.vocab));
  const bool ok = std::isfinite(last_loss) && std::fabs(first_loss - expected) < 0.5 &&
                  (o.warmup + o.steps < 2 || last_loss < first_loss);
  // tokens/s from the median step: robust to a neighbour stealing the core for one step.
  std::sort(step_times.begin(), step_times.end());
  const double median_step = step_times[step_times.size() / 2];
  const double tokens = static_cast<double>(o.B) * o.T;
  const double gemm_gflops = gemm.seconds > 0 ? gemm.flops / gemm.seconds / 1e9 : 0.0;
  const double standalone_gflops = standalone_s > 0 ? gemm.flops / o.steps / standalone_s / 1e9 : 0.0;
  std::printf(
      "{\"impl\": \"kilter\", \"arch\": \"%s\", \"precision\": \"%s\", \"engine\": \"%s\", \"threads\": %d, \"n_layer\": %d, \"n_embd\": %d, \"n_head\": %d, \"vocab\": %d, "
      "\"B\": %d, \"T\": %d, \"steps\": %d, \"tokens_per_s\": %.1f, \"median_step_s\": %.4f, \"mean_step_s\": %.4f, \"fwdbwd_s\": %.4f, "
      "\"optimizer_s\": %.4f, \"zero_grads_s\": %.4f, \"gemm_s\": %.4f, \"gemm_calls\": %lld, \"gemm_shapes\": %zu, "
      "\"gemm_gflops\": %.2f, \"standalone_gflops\": %.2f, \"gemm_vs_standalone\": %.3f, \"bf16_convert_s\": %.4f, "
      "\"plain_sgemm_gflops\": %.2f, \"gemm_fraction_of_step\": %.3f, \"first_loss\": %.4f, \"last_loss\": %.4f, "
      "\"check\": \"%s\"}\n",
      o.arch.c_str(), o.precision.c_str(), kilter::model::gemm_engine().c_str(), o.threads, o.n_layer, o.n_embd, o.n_head, o.vocab, o.B, o.T, o.steps, tokens / median_step, median_step,
      time_total / o.steps,
      time_fwdbwd / o.steps, time_optimizer / o.steps, time_zero / o.steps, gemm.seconds / o.steps,
      static_cast<long long>(gemm.calls / o.steps), gemm.shapes.size(), gemm_gflops, standalone_gflops,
      standalone_gflops > 0 ? gemm_gflops / standalone_gflops : 0.0, gemm.convert_seconds / o.steps, plain, gemm.seconds / time_total, first_loss,
      last_loss, ok ? "ok" : "FAILED");
  if (!ok) {
    std::fprintf(stderr, "kilter_bench_step: result check failed (first loss %.4f vs ln(V) %.4f, last %.4f)\n",
                 first_loss, expected, last_loss);
    return 1;
  }
  return 0;
}
