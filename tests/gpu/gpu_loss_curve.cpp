// The loss curve of bf16 training against fp32's on a real corpus (issue 37's "200 bf16 steps
// give a loss curve within 1% of fp32's at the end"). Two runs from the same initial weights on the
// same batches: fp32 (fp32 GEMMs, fp32 activations) and bf16 (bf16 GEMMs; on the GPU also the
// bf16-storage datapath and the attention engine train.attention = auto picks; on the CPU the
// bf16-storage oracle). The corpus is the bytes of the given text files (vocabulary 257, as
// `kilter prep --tokenizer byte`), read in order as rows of T + 1 bytes, wrapping around. The
// optimizer is the trainer's: AdamW with clipping at 1.0, a linear warm-up, then a constant rate.
// Prints both curves every --every steps and passes when the bf16 run's final loss (mean of the
// last 10 steps) is within --tolerance of fp32's, relative. Exit 0 pass, 1 fail, 77 no device.
// usage: kilter_gpu_loss_curve [--backend cuda|cpu] [--steps N] [--B rows] [--T tokens]
//          [--n-layer L] [--n-head H] [--n-embd C] [--lr X] [--tolerance X] [--every N] FILE...
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "io/base/error.h"
#include "lib/backend/cpu_model.h"
#include "lib/backend/cuda_model.h"
#include "lib/model/model.h"

namespace km = kilter::model;

namespace {

struct Options {
  std::string backend = "cuda";
  int steps = 200, B = 4, T = 1024, every = 20, warmup = 20;
  km::ModelSpec cfg{12, 12, 768, 1024, 257};
  float lr = 6e-4f;
  double tolerance = 0.01;
  std::vector<std::string> files;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag.rfind("--", 0) != 0) {
      o.files.push_back(flag);
      continue;
    }
    KILTER_USER_CHECK(i + 1 < argc, "kilter_gpu_loss_curve: " << flag << " needs a value");
    const std::string value = argv[++i];
    if (flag == "--backend") o.backend = value;
    else if (flag == "--steps") o.steps = std::stoi(value);
    else if (flag == "--B") o.B = std::stoi(value);
    else if (flag == "--T") o.T = std::stoi(value);
    else if (flag == "--n-layer") o.cfg.n_layer = std::stoi(value);
    else if (flag == "--n-head") o.cfg.n_head = std::stoi(value);
    else if (flag == "--n-embd") o.cfg.n_embd = std::stoi(value);
    else if (flag == "--lr") o.lr = std::stof(value);
    else if (flag == "--tolerance") o.tolerance = std::stod(value);
    else if (flag == "--every") o.every = std::stoi(value);
    else KILTER_USER_FAIL("kilter_gpu_loss_curve: unknown flag " << flag);
  }
  KILTER_USER_CHECK(!o.files.empty(), "kilter_gpu_loss_curve: name the corpus (one or more text files)");
  KILTER_USER_CHECK(o.backend == "cuda" || o.backend == "cpu", "kilter_gpu_loss_curve: --backend is cuda or cpu");
  KILTER_USER_CHECK(o.steps >= 10 && o.B > 0 && o.T > 1 && o.every > 0, "kilter_gpu_loss_curve: steps >= 10, B, T > 0");
  o.cfg.block_size = o.T;
  o.warmup = std::min(o.warmup, o.steps / 4);
  return o;
}

std::vector<int32_t> read_corpus(const std::vector<std::string>& files) {
  std::vector<int32_t> tokens;
  for (const std::string& path : files) {
    std::ifstream in(path, std::ios::binary);
    KILTER_USER_CHECK(in, "kilter_gpu_loss_curve: cannot read the corpus file " << path);
    for (auto it = std::istreambuf_iterator<char>(in); it != std::istreambuf_iterator<char>(); ++it)
      tokens.push_back(static_cast<unsigned char>(*it));
  }
  return tokens;
}

// Step s's micro-batch: B pieces of T tokens, consecutive rows of the corpus (wrapping around).
km::Batch batch_of(const std::vector<int32_t>& corpus, const Options& o, int step) {
  km::Batch batch;
  batch.clear();
  std::vector<int32_t> inputs(o.T), targets(o.T);
  for (int b = 0; b < o.B; ++b) {
    const size_t start = (static_cast<size_t>(step) * o.B + b) * o.T;
    for (int t = 0; t < o.T; ++t) {
      inputs[t] = corpus[(start + t) % corpus.size()];
      targets[t] = corpus[(start + t + 1) % corpus.size()];
    }
    batch.append_piece(inputs.data(), targets.data(), o.T);
  }
  return batch;
}

std::unique_ptr<km::Model> make_model(const Options& o, bool bf16) {
  if (o.backend == "cpu")
    return std::make_unique<kilter::backend::CpuModel>(o.cfg, 8, bf16 ? "bf16" : "fp32", "none", bf16);
  km::BackendOptions options;
  options.precision = bf16 ? "bf16" : "fp32";
  options.bf16_storage = bf16 ? "on" : "off";
  options.attention = bf16 ? "auto" : "cublaslt";
  return kilter::backend::make_cuda_model(o.cfg, 8, options);
}

// The per-step losses of one run (token means), the trainer's way: zero, forward+backward,
// global-norm clipping at 1.0, AdamW at the warmed-up rate.
std::vector<double> train(const Options& o, const std::vector<int32_t>& corpus, bool bf16) {
  std::unique_ptr<km::Model> model = make_model(o, bf16);
  std::printf("%s run: %s\n", bf16 ? "bf16" : "fp32", model->describe().c_str());
  model->init_params(1337);
  model->reserve(o.B * o.T, o.T);
  std::vector<double> losses;
  for (int step = 0; step < o.steps; ++step) {
    const km::Batch batch = batch_of(corpus, o, step);
    const float loss_scale = 1.0f / static_cast<float>(batch.num_targets);
    model->zero_grads();
    losses.push_back(model->forward_backward(batch, loss_scale, {}) * loss_scale);
    const double norm = std::sqrt(model->grad_norm_squared());
    km::AdamWParams adam;
    adam.lr = o.lr * std::min(1.0f, static_cast<float>(step + 1) / static_cast<float>(std::max(o.warmup, 1)));
    adam.grad_scale = norm > 1.0 ? static_cast<float>(1.0 / norm) : 1.0f;
    adam.t = step + 1;
    model->adamw_step(adam);
  }
  model->synchronize();
  return losses;
}

double tail_mean(const std::vector<double>& losses) {
  const size_t n = std::min<size_t>(10, losses.size());
  return std::accumulate(losses.end() - n, losses.end(), 0.0) / static_cast<double>(n);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    if (o.backend == "cuda" && !kilter::backend::cuda_device_present()) {
      std::printf("SKIPPED: no CUDA device (%s)\n", kilter::backend::cuda_device_absent_reason().c_str());
      return 77;
    }
    const std::vector<int32_t> corpus = read_corpus(o.files);
    KILTER_USER_CHECK(corpus.size() > static_cast<size_t>(o.T) + 1,
                      "kilter_gpu_loss_curve: the corpus holds " << corpus.size() << " bytes, fewer than one row of "
                                                                 << o.T + 1);
    std::printf("corpus: %zu bytes of %zu file(s); %s; %d steps of %d x %d tokens\n", corpus.size(), o.files.size(),
                km::describe_spec(o.cfg).c_str(), o.steps, o.B, o.T);
    const std::vector<double> fp32 = train(o, corpus, false);
    const std::vector<double> bf16 = train(o, corpus, true);
    std::printf("%6s %10s %10s %9s\n", "step", "fp32", "bf16", "bf16/fp32");
    for (int s = 0; s < o.steps; ++s)
      if (s % o.every == 0 || s + 1 == o.steps)
        std::printf("%6d %10.5f %10.5f %9.4f\n", s + 1, fp32[s], bf16[s], bf16[s] / fp32[s]);
    const double end32 = tail_mean(fp32), end16 = tail_mean(bf16);
    const double gap = std::fabs(end16 - end32) / end32;
    const bool learned = end32 < 0.8 * fp32.front() && std::isfinite(end16);
    const bool ok = learned && gap <= o.tolerance;
    std::printf("RESULT loss_curve backend=%s steps=%d fp32_end=%.5f bf16_end=%.5f gap=%.4f tolerance=%.4f check=%s\n",
                o.backend.c_str(), o.steps, end32, end16, gap, o.tolerance,
                ok ? "ok" : learned ? "failed(gap)" : "failed(fp32 did not learn)");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kilter_gpu_loss_curve: %s\n", e.what());
    return 1;
  }
}
