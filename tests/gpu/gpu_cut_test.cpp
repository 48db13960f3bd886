// Cut pieces (context parallelism) on the CUDA backend: a piece cut between ranks computes as the uncut
// piece. Each "rank" is a CUDA model in its own host thread on the one GPU; the ranks' K/V and
// dK/dV go through the test exchange of tests/unit/thread_kv_exchange.h (the reference of the
// exchange contract), with device rows staged through host memory by DeviceKvEndpoint below. The
// ranks' losses sum to the uncut piece's loss and their gradients sum to its gradient:
//   - against the CPU model on the whole pieces (the oracle of gpu_model_test): loss 1e-5
//     relative, every gradient tensor 5e-4 of its max |grad| (gpu_model_test's GPU-vs-CPU bounds);
//   - against the CUDA model on the whole pieces: loss 1e-5, gradients 1e-4 (only the attention
//     path and fp32 summation orders differ);
//   - bf16: cut against uncut bf16 on the GPU within model_bf16_test's tolerances (loss 1e-4
//     relative, each tensor 2e-2 norm-wise);
// for a piece cut in 2 and in 3 (a middle part that receives and sends), batches mixing whole
// pieces with earlier and later parts on 2 and 3 ranks, with the cuBLASLt and (where usable) the
// cuDNN engine for the uncut pieces, with train.recompute = attention and block (the recomputed
// attention of a later part reads its prefix again), and the position rows each rank trains.
// Also llama (grouped K/V heads, RoPE from the offset) in fp32, and the bf16-storage datapath
// (its exchange staging) for both architectures: cut vs its own uncut run (loss 1e-4, each tensor
// 5e-3 norm-wise) and vs the CPU oracle on the uncut pieces (1e-3, 1e-2 norm-wise); and that
// datapath with cuDNN SDPA (train.attention = sdpa; recompute none, attention and block) at the
// same bounds, skipped with a note where the build or the machine has no SDPA.
// The NCCL exchange itself needs one GPU per rank: tests/gpu/gpu_nccl_test.cpp.
// GoogleTest; without a CUDA device every test is skipped and the binary exits 77.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lib/backend/cpu_model.h"
#include "lib/backend/cuda_model.h"
#include "lib/model/model.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/model_testing.h"
#include "tests/unit/thread_kv_exchange.h"

using kilter::gputest::Checker;
using kilter::gputest::DeviceBuffer;
using kilter::gputest::device_grads;
using kilter::gputest::with;
namespace km = kilter::model;
namespace kt = kilter::model::testing;

namespace {

// A CUDA model's side of a ThreadKvHub endpoint: the backend hands device pointers, the hub
// works on host rows. The backend drains its stream before forward_send, backward_send and
// backward_wait_add (kv_exchange.h), so plain synchronous copies see final rows; the prefixes it
// reads and the dK/dV buffers it accumulates into live on the device until this object dies.
class DeviceKvEndpoint final : public km::KvExchange {
 public:
  // rows: the model's q|k|v row layout (kv_row_layout: llama's grouped K/V heads make rows
  // narrower than 3C and prefixes narrower than 2C).
  DeviceKvEndpoint(km::KvExchange* host, const km::Batch& batch, const km::KvRowLayout& rows)
      : host_(host), batch_(batch), rows_(rows) {}

  void forward_send(int layer, const float* qkv) override {
    stage_.resize(static_cast<size_t>(batch_.N) * rows_.row_width);
    KILTER_CUDA_CHECK(cudaMemcpy(stage_.data(), qkv, sizeof(float) * stage_.size(), cudaMemcpyDeviceToHost));
    host_->forward_send(layer, stage_.data());  // copies the rows before it returns
  }
  void forward_wait(int layer) override { host_->forward_wait(layer); }

  const float* prefix_kv(int layer, int piece) override {
    auto& slot = prefix_[{layer, piece}];
    if (!slot) {
      const float* rows = host_->prefix_kv(layer, piece);
      slot = std::make_unique<DeviceBuffer<float>>(std::vector<float>(rows, rows + rows_of(piece)));
    }
    return slot->get();
  }
  float* prefix_dkv(int layer, int piece) override {
    auto& slot = dprefix_[{layer, piece}];
    if (!slot) slot = std::make_unique<DeviceBuffer<float>>(rows_of(piece));  // zeroed, synchronized
    return slot->get();
  }
  void backward_send(int layer) override {
    for (auto& [key, buffer] : dprefix_)
      if (key.first == layer) {
        const std::vector<float> rows = buffer->download();
        std::memcpy(host_->prefix_dkv(layer, key.second), rows.data(), sizeof(float) * rows.size());
      }
    host_->backward_send(layer);
  }
  void backward_wait_add(int layer, float* dqkv) override {
    stage_.resize(static_cast<size_t>(batch_.N) * rows_.row_width);
    KILTER_CUDA_CHECK(cudaMemcpy(stage_.data(), dqkv, sizeof(float) * stage_.size(), cudaMemcpyDeviceToHost));
    host_->backward_wait_add(layer, stage_.data());
    KILTER_CUDA_CHECK(cudaMemcpy(dqkv, stage_.data(), sizeof(float) * stage_.size(), cudaMemcpyHostToDevice));
    KILTER_CUDA_CHECK(cudaDeviceSynchronize());  // the model's stream does not wait for the legacy one
  }

 private:
  size_t rows_of(int piece) const { return static_cast<size_t>(batch_.piece_offset(piece)) * rows_.kv_width; }

  km::KvExchange* host_;
  const km::Batch& batch_;
  km::KvRowLayout rows_;
  std::vector<float> stage_;
  std::map<std::pair<int, int>, std::unique_ptr<DeviceBuffer<float>>> prefix_, dprefix_;
};

struct Result {
  double loss = 0;
  std::vector<float> grads;  // num_params, summed over ranks
  std::vector<std::vector<float>> rank_grads;
  std::vector<std::string> problems;
};

std::unique_ptr<km::Model> make_gpu(const km::ModelSpec& cfg, const km::BackendOptions& options) {
  return kilter::backend::make_cuda_model(cfg, 1, options);
}

// bf16_storage: the CPU oracle of the bf16-storage datapath.
Result cpu_whole(const km::ModelSpec& cfg, const std::vector<float>& params, const km::Batch& batch, float scale,
                 bool bf16_storage = false) {
  kilter::backend::CpuModel model(cfg, 1, bf16_storage ? "bf16" : "fp32", "none", bf16_storage);
  model.set_params(params.data());
  model.zero_grads();
  Result out;
  out.loss = model.forward_backward(batch, scale, {});
  out.grads.assign(model.grads(), model.grads() + model.layout().num_params);
  return out;
}

Result gpu_whole(const km::ModelSpec& cfg, const std::vector<float>& params, const km::Batch& batch, float scale,
                 const km::BackendOptions& options) {
  std::unique_ptr<km::Model> model = make_gpu(cfg, options);
  model->set_params(params.data());
  model->zero_grads();
  Result out;
  out.loss = model->forward_backward(batch, scale, {});
  out.grads = device_grads(*model);
  return out;
}

// Every rank's micro-batch on its own CUDA model and host thread.
Result gpu_cut(const km::ModelSpec& cfg, const std::vector<float>& params, const kt::CutBatches& setup, float scale,
               const km::BackendOptions& options) {
  const int ranks = static_cast<int>(setup.batches.size());
  std::vector<std::unique_ptr<km::Model>> models;
  for (int r = 0; r < ranks; ++r) {
    models.push_back(make_gpu(cfg, options));
    models.back()->set_params(params.data());
    models.back()->zero_grads();
    models.back()->synchronize();
  }
  Result out;
  std::vector<double> losses(ranks, 0.0);
  {
    kt::ThreadKvHub hub(ranks, cfg.n_layer, km::kv_row_layout(cfg), setup.cuts, std::chrono::seconds(60));
    std::vector<km::Batch> batches = setup.batches;
    std::vector<std::unique_ptr<DeviceKvEndpoint>> endpoints;
    for (int r = 0; r < ranks; ++r) {
      endpoints.push_back(std::make_unique<DeviceKvEndpoint>(hub.endpoint(r), batches[r], km::kv_row_layout(cfg)));
      batches[r].exchange = endpoints.back().get();
    }
    const std::vector<std::string> failures = kt::run_ranks(ranks, [&](int r) {
      KILTER_CUDA_CHECK(cudaSetDevice(0));
      losses[r] = models[r]->forward_backward(batches[r], scale, {});
      models[r]->synchronize();
    });
    for (int r = 0; r < ranks; ++r)
      if (!failures[r].empty()) out.problems.push_back("rank " + std::to_string(r) + ": " + failures[r]);
    for (const std::string& error : hub.errors()) out.problems.push_back("exchange contract: " + error);
  }
  const size_t n = models[0]->layout().num_params;
  std::vector<double> sum(n, 0.0);
  for (int r = 0; r < ranks; ++r) {
    out.loss += losses[r];
    out.rank_grads.push_back(device_grads(*models[r]));
    for (size_t i = 0; i < n; ++i) sum[i] += out.rank_grads.back()[i];
  }
  out.grads.assign(sum.begin(), sum.end());
  return out;
}

// Loss within loss_tol relative; every tensor within grad_tol: of its max |grad| (max_norm), or
// norm-wise ||a - b|| / ||b|| (bf16, model_bf16_test's measure).
void compare(Checker& check, const std::string& tag, const Result& cut, const Result& whole, const km::ModelSpec& cfg,
             double loss_tol, double grad_tol, bool norm_wise = false) {
  check.expect(tag + "ranks ran and kept the exchange contract", cut.problems.empty(),
               cut.problems.empty() ? "" : cut.problems.front());
  if (!cut.problems.empty()) return;
  check.near_scalar(tag + "loss", cut.loss, whole.loss, loss_tol);
  double worst = 0.0;
  std::string worst_name;
  bool finite = true, signal = true;
  for (const km::ParamTensor& tensor : km::ParamLayout::build(cfg).tensors) {
    double diff = 0.0, scale = 0.0;
    for (size_t i = tensor.offset; i < tensor.offset + tensor.size; ++i) {
      const double d = static_cast<double>(cut.grads[i]) - whole.grads[i];
      if (!std::isfinite(cut.grads[i])) finite = false;
      if (norm_wise) {
        diff += d * d;
        scale += static_cast<double>(whole.grads[i]) * whole.grads[i];
      } else {
        diff = std::max(diff, std::fabs(d));
        scale = std::max(scale, std::fabs(static_cast<double>(whole.grads[i])));
      }
    }
    if (scale == 0.0) signal = false;
    const double error = norm_wise ? std::sqrt(diff / std::max(scale, 1e-30)) : diff / std::max(scale, 1e-30);
    if (error > worst) worst = error, worst_name = tensor.name;
  }
  char detail[160];
  std::snprintf(detail, sizeof detail, "worst %s rel.err %.3e (tol %.1e%s)", worst_name.c_str(), worst, grad_tol,
                norm_wise ? ", norm-wise" : "");
  check.expect(tag + "every gradient tensor", finite && signal && worst <= grad_tol,
               std::string(detail) + (signal ? "" : "; a tensor has an all-zero reference gradient"));
}

bool cudnn_usable(const km::ModelSpec& cfg) {
  try {
    make_gpu(cfg, with("fp32", "cudnn"));
    return true;
  } catch (const kilter::Error& e) {
    std::printf("NOTE: cuDNN attention not tested here: %s\n", e.what());
    return false;
  }
}

km::ModelSpec cut_config() {
  km::ModelSpec cfg;
  cfg.n_layer = 2;
  cfg.n_head = 4;
  cfg.n_embd = 64;  // head_dim 16
  cfg.block_size = 160;
  cfg.vocab_size = 67;
  return cfg;
}

// The Llama family's form of `cfg`: grouped K/V heads (narrower exchange rows), RoPE, SwiGLU.
km::ModelSpec llama_of(const km::ModelSpec& cfg) {
  km::ModelSpec llama = cfg;
  llama.arch = "llama";
  llama.n_kv_head = 2;
  llama.ffn_hidden = 96;
  return llama;
}

// Parameters away from GPT-2's init (biases 0, LN weights 1), so every path carries signal.
std::vector<float> random_params(const km::ModelSpec& cfg, uint64_t seed) {
  kilter::backend::CpuModel model(cfg, 1);
  return kt::random_vector(model.layout().num_params, seed, 0.3);
}

// Cut against uncut on the CPU (oracle) and on the GPU, for one split of `whole`.
void compare_fp32(Checker& check, const std::string& name, const km::ModelSpec& cfg, const km::Batch& whole,
                  const std::vector<std::vector<kt::RankPart>>& split, const std::string& attention, uint64_t seed,
                  const std::string& recompute = "none") {
  const std::string tag =
      "[fp32, " + attention + (recompute != "none" ? ", recompute " + recompute : "") + "] " + name + ": ";
  try {
    const std::vector<float> params = random_params(cfg, seed);
    const float scale = 1.0f / static_cast<float>(whole.num_targets);
    const kt::CutBatches setup = kt::cut_batches(whole, split);
    const Result cut = gpu_cut(cfg, params, setup, scale, with("fp32", attention, false, recompute));
    compare(check, tag + "vs CPU uncut: ", cut, cpu_whole(cfg, params, whole, scale), cfg, 1e-5, 5e-4);
    compare(check, tag + "vs GPU uncut: ", cut, gpu_whole(cfg, params, whole, scale, with("fp32", attention)), cfg,
            1e-5, 1e-4);
  } catch (const std::exception& e) {
    check.expect(tag + "ran", false, e.what());
  }
}

using CutPieces = kilter::gputest::DeviceTest;

// The batches and cuts of the cases: a piece cut in 2, in 3, and a batch mixing whole pieces with
// earlier and later parts on 2 and 3 ranks.
struct Setups {
  km::ModelSpec cfg = cut_config();
  km::ModelSpec llama = llama_of(cfg);
  km::Batch one_piece = kt::make_batch({150}, cfg.vocab_size, 12, {{0, 149}});
  km::Batch three = kt::make_batch({160}, cfg.vocab_size, 22, {{0, 159}});
  km::Batch mixed = kt::make_batch({150, 100, 30, 120, 1}, cfg.vocab_size, 32, {{0, 149}, {2, 29}, {1, 5}});
  std::vector<std::vector<kt::RankPart>> three_ranks = {
      {{0, 0, 50}, {3}}, {{1, 0, 60}, {0, 50, 110}, {2}}, {{0, 110, -1}, {1, 60, -1}, {4}}};
};

}  // namespace

TEST_F(CutPieces, Fp32CutsAgainstUncutWithEachAttentionEngine) {
  Checker check;
  const Setups u;
  std::vector<std::string> engines = {"cublaslt"};
  if (cudnn_usable(u.cfg)) engines.push_back("cudnn");
  for (const std::string& attention : engines) {
    // Rank 1's queries span several blocks; the prefix is no multiple of 16.
    compare_fp32(check, "piece cut in 2", u.cfg, u.one_piece, {{{0, 0, 70}}, {{0, 70, -1}}}, attention, 11);
    // A middle part receives the K/V of [0, 40) and sends its own.
    compare_fp32(check, "piece cut in 3", u.cfg, u.three, {{{0, 0, 40}}, {{0, 40, 101}}, {{0, 101, -1}}}, attention,
                 21);
    compare_fp32(check, "mixed batch, 2 ranks", u.cfg, u.mixed,
                 {{{2}, {1, 0, 37}, {0, 70, -1}, {4}}, {{3}, {0, 0, 70}, {1, 37, -1}}}, attention, 31);
    compare_fp32(check, "mixed batch, 3 ranks", u.cfg, u.mixed, u.three_ranks, attention, 41);
  }
}

// Recomputation reruns a later part's attention against the prefix it received.
TEST_F(CutPieces, RecomputeRerunsAgainstTheReceivedPrefix) {
  Checker check;
  const Setups u;
  for (const char* mode : {"attention", "block"})
    compare_fp32(check, "mixed batch, 3 ranks", u.cfg, u.mixed, u.three_ranks, "cublaslt", 41, mode);
}

// Positions continue from the offset: rank 0 trains wpe rows 0..69 only, rank 1 rows 70..149.
TEST_F(CutPieces, EachRankTrainsItsPositionRows) {
  Checker check;
  const Setups u;
  const km::ModelSpec& cfg = u.cfg;
  const std::vector<float> params = random_params(cfg, 11);
  const kt::CutBatches setup = kt::cut_batches(u.one_piece, {{{0, 0, 70}}, {{0, 70, -1}}});
  const Result cut = gpu_cut(cfg, params, setup, 1.0f / u.one_piece.num_targets, with("fp32", "cublaslt"));
  const km::ParamTensor& wpe = km::ParamLayout::build(cfg).find("transformer.wpe.weight");
  const size_t C = cfg.n_embd;
  for (int r = 0; r < 2 && cut.problems.empty(); ++r) {
    const float* g = cut.rank_grads[r].data() + wpe.offset;
    const size_t first = r == 0 ? 0 : 70, last = r == 0 ? 70 : 150;
    bool outside_zero = true, inside_signal = false;
    for (size_t i = 0; i < wpe.size; ++i) {
      if ((i < first * C || i >= last * C) && g[i] != 0.0f) outside_zero = false;
      if (i >= first * C && i < last * C && g[i] != 0.0f) inside_signal = true;
    }
    check.expect("rank " + std::to_string(r) + " trains wpe rows " + std::to_string(first) + ".." +
                     std::to_string(last - 1) + " only",
                 outside_zero && inside_signal);
  }
  check.expect("position check ran", cut.problems.empty(), cut.problems.empty() ? "" : cut.problems.front());
}

// bf16: the prefix K/V are rounded to bf16 as local K/V are.
TEST_F(CutPieces, Bf16GemmsCutAgainstUncut) {
  Checker check;
  const Setups u;
  const km::ModelSpec& cfg = u.cfg;
  const std::vector<float> params = random_params(cfg, 51);
  const km::Batch whole = kt::make_batch({160, 31, 90}, cfg.vocab_size, 52);
  const float scale = 1.0f / static_cast<float>(whole.num_targets);
  const kt::CutBatches setup =
      kt::cut_batches(whole, {{{0, 0, 45}, {1}}, {{0, 45, 130}, {2, 0, 50}}, {{0, 130, -1}, {2, 50, -1}}});
  const Result cut = gpu_cut(cfg, params, setup, scale, with("bf16", "cublaslt"));
  const Result uncut = gpu_whole(cfg, params, whole, scale, with("bf16", "cublaslt"));
  const Result fp32 = gpu_whole(cfg, params, whole, scale, with("fp32", "cublaslt"));
  check.expect("[bf16] the bf16 loss differs from the fp32 one (bf16 GEMMs ran)", uncut.loss != fp32.loss);
  compare(check, "[bf16, cublaslt] 3 ranks vs GPU uncut bf16: ", cut, uncut, cfg, 1e-4, 2e-2, true);
}

// The Llama family (grouped K/V heads: narrower exchange rows; RoPE continues from the offset)
// in fp32 against the CPU.
TEST_F(CutPieces, LlamaFp32AgainstTheCpu) {
  Checker check;
  const Setups u;
  compare_fp32(check, "llama, mixed batch, 3 ranks", u.llama, u.mixed, u.three_ranks, "cublaslt", 61);
  compare_fp32(check, "llama, mixed batch, 3 ranks", u.llama, u.mixed, u.three_ranks, "cublaslt", 61, "block");
}

// The bf16-storage datapath (fp32 staging of the exchanged rows) against its uncut self and its
// CPU oracle, for both architectures.
TEST_F(CutPieces, Bf16StorageAgainstUncutAndTheOracle) {
  Checker check;
  const Setups u;
  for (const km::ModelSpec& arch : {u.cfg, u.llama}) {
    const std::string tag = "[bf16 storage, " + arch.arch + "] mixed batch, 3 ranks ";
    const std::vector<float> params = random_params(arch, 71);
    const float scale = 1.0f / static_cast<float>(u.mixed.num_targets);
    const kt::CutBatches setup = kt::cut_batches(u.mixed, u.three_ranks);
    for (const char* mode : {"none", "attention"}) {
      const Result cut = gpu_cut(arch, params, setup, scale, kilter::gputest::bf16_storage(mode));
      compare(check, tag + mode + " vs GPU uncut: ", cut,
              gpu_whole(arch, params, u.mixed, scale, kilter::gputest::bf16_storage()), arch, 1e-4, 5e-3, true);
      compare(check, tag + mode + " vs CPU oracle uncut: ", cut, cpu_whole(arch, params, u.mixed, scale, true), arch,
              1e-3, 1e-2, true);
    }
  }
}

// The same on cuDNN SDPA (train.attention = sdpa): the later parts through the bottom-right
// calls over their staged K/V (prefixes from the exchange's fp32 rows), the exchange's call
// order kept, recompute attention and block rerunning the calls against the held prefixes.
TEST_F(CutPieces, Bf16StorageOnCudnnSdpa) {
  Checker check;
  const Setups u;
  const std::string no_sdpa = kilter::gputest::sdpa_absent_reason(u.cfg);
  if (!no_sdpa.empty()) GTEST_SKIP() << "cuDNN SDPA with cut pieces not tested here: " << no_sdpa;
  for (const km::ModelSpec& arch : {u.cfg, u.llama}) {
    const std::string tag = "[bf16 storage, SDPA, " + arch.arch + "] mixed batch, 3 ranks ";
    const std::vector<float> params = random_params(arch, 81);
    const float scale = 1.0f / static_cast<float>(u.mixed.num_targets);
    const kt::CutBatches setup = kt::cut_batches(u.mixed, u.three_ranks);
    const Result uncut = gpu_whole(arch, params, u.mixed, scale, kilter::gputest::bf16_storage_sdpa());
    const Result oracle = cpu_whole(arch, params, u.mixed, scale, true);
    for (const char* mode : {"none", "attention", "block"}) {
      const Result cut = gpu_cut(arch, params, setup, scale, kilter::gputest::bf16_storage_sdpa(mode));
      compare(check, tag + mode + " vs GPU uncut: ", cut, uncut, arch, 1e-4, 5e-3, true);
      compare(check, tag + mode + " vs CPU oracle uncut: ", cut, oracle, arch, 1e-3, 1e-2, true);
    }
  }
}
