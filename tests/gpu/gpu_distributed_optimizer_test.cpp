// The CUDA backend's distributed optimizer (train.shard = optimizer under bf16 storage: the fp32
// master kept for this rank's owned ranges only, the bf16 working copy written from it and
// all-gathered) against its CPU twin (CpuModel under the same shard_optimizer ranges) and against
// the unsharded oracle (CpuModel with bf16 storage, the whole master), on one device: a rank's
// view, the all-gather played by writing the whole working copy into gathered_working_copy().
// Tolerances: the owned master after AdamW from identical gradients 1e-6 of its scale (the same
// per-element arithmetic, the owned master steps exactly like the unsharded one); the working
// copy is the master's rounding: bit for bit but where a master within an fp32 rounding of a bf16
// boundary rounds the other way (near_bf16: 1e-2 of the scale, 99% of the elements identical);
// losses 1e-3 (as gpu_bf16_model's bf16-storage cases); train.grad_dtype = bf16's rounding of
// a gradient range bit for bit.
// Then the same optimizer unit by unit (train.shard = parameters under bf16 storage): a model whose
// parameter holder gathers the working copy alone (CopyUnitHooks, one rank's view without NCCL)
// against the distributed optimizer gathered whole, over two steps from the same ranges and
// initialization: losses, gradients, the owned master and an evaluation loss within 1e-6 (the
// same kernels on the same weights: the norms widened and the head's copy refreshed from the
// gathered units, the master and the copy's chunks written by the same AdamW).
// GoogleTest; without a CUDA device every test is skipped and the binary exits 77.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "lib/backend/cpu_model.h"
#include "lib/backend/cuda_model.h"
#include "lib/model/bf16_ops.h"
#include "lib/model/model.h"
#include "tests/gpu/gpu_model_util.h"
#include "tests/gpu/gpu_test_util.h"

using kilter::backend::CpuModel;
using kilter::gputest::bf16_storage;
using kilter::gputest::Checker;
using kilter::gputest::params_of;
using kilter::gputest::random_batch;
namespace km = kilter::model;

namespace {

km::ModelSpec llama_gqa() {
  km::ModelSpec cfg{2, 8, 128, 64, 515};
  cfg.arch = "llama";
  cfg.n_kv_head = 2;
  cfg.ffn_hidden = 3 * 128 / 2 / 8 * 8 + 8;
  cfg.tie_embeddings = "false";
  return cfg;
}

// Two of a 4-rank world's chunks, 64-float aligned as the reducer's: the second and the last
// (the head's end), so that owned and unowned ranges alternate.
std::vector<km::ParamRange> owned_of(size_t padded) {
  const size_t chunk = padded / 4 / 64 * 64;
  return {{chunk, chunk}, {3 * chunk, padded - 3 * chunk}};
}

// The floats of `v` (laid out as the parameters) inside the owned ranges, range after range.
std::vector<float> owned_values(const std::vector<float>& v, const std::vector<km::ParamRange>& owned, size_t num) {
  std::vector<float> out;
  for (const km::ParamRange& r : owned)
    for (size_t i = r.offset; i < r.offset + r.count && i < num; ++i) out.push_back(v[i]);
  return out;
}

void compare(Checker& check, const km::ModelSpec& cfg) {
  const std::string tag = "[" + cfg.arch + "] ";
  try {
    CpuModel whole(cfg, 64, "bf16", "none", true);  // the unsharded oracle
    CpuModel twin(cfg, 64, "bf16", "none", true);   // the CPU distributed optimizer
    std::unique_ptr<km::Model> gpu = kilter::backend::make_cuda_model(cfg, 64, bf16_storage());
    check.expect(tag + "runs bf16 storage", kilter::gputest::runs_bf16_storage(*gpu));
    const size_t padded = whole.layout().padded_size, num = whole.layout().num_params;
    const std::vector<km::ParamRange> owned = owned_of(padded);
    // As the trainer: the ranges first (make_reducer), then the initialization.
    twin.shard_optimizer(owned);
    gpu->shard_optimizer(owned);
    check.expect(tag + "gathers the working copy", gpu->gathered_working_copy() != nullptr);
    whole.init_params(4321);
    twin.init_params(4321);
    gpu->init_params(4321);
    check.near(tag + "the working copy after init (get_params)", params_of(*gpu), params_of(twin), 0.0);

    const km::Batch batch = random_batch(cfg, 4, cfg.block_size);
    const float scale = 1.0f / static_cast<float>(batch.num_targets);
    twin.zero_grads();
    gpu->zero_grads();
    const double twin_loss = twin.forward_backward(batch, scale, {});
    const double gpu_loss = gpu->forward_backward(batch, scale, {});
    check.near_scalar(tag + "loss (the embeddings and norms read from the working copy)", gpu_loss, twin_loss, 1e-3);

    // train.grad_dtype = bf16: a gradient range rounded where it lives, bit for bit.
    std::vector<float> grads = kilter::gputest::device_grads(*gpu);
    grads.resize(padded, 0.0f);
    const size_t lo = owned[0].offset, n = owned[0].count;
    gpu->round_grads_bf16(lo, n);
    km::round_bf16_inplace(grads.data() + lo, n);
    check.near(tag + "round_grads_bf16 against the CPU rounding", kilter::gputest::device_grads(*gpu),
               std::vector<float>(grads.begin(), grads.begin() + num), 0.0);

    // AdamW from identical gradients (the twin's) on the three, a large weight decay.
    std::vector<float> same(twin.grads(), twin.grads() + padded);
    std::copy(same.begin(), same.end(), whole.grads());
    KILTER_CUDA_CHECK(cudaMemcpy(gpu->grads(), same.data(), sizeof(float) * padded, cudaMemcpyHostToDevice));
    km::AdamWParams adam;
    adam.lr = 1e-2f;
    adam.weight_decay = 0.5f;
    adam.t = 1;
    whole.adamw_step(adam);
    twin.adamw_step(adam);
    gpu->adamw_step(adam);
    gpu->synchronize();
    std::vector<float> master(num);
    size_t at = 0;
    for (const km::ParamRange& r : owned) {
      const size_t count = std::min(r.offset + r.count, num) - r.offset;
      gpu->copy_params_to_host(master.data() + at, r.offset, count);
      at += count;
    }
    master.resize(at);
    const std::vector<float> oracle = owned_values(params_of(whole), owned, num);
    check.near(tag + "the owned master after AdamW against the unsharded one", master, oracle, 1e-6);
    check.near_bf16(tag + "the owned working copy is the master's rounding",
                    owned_values(params_of(*gpu), owned, num), owned_values(params_of(twin), owned, num), 1e-2, 0.99);

    // The all-gather: every range's working copy arrives (the unsharded oracle's rounding).
    std::vector<km::bf16> gathered(padded, 0);
    km::to_bf16(gathered.data(), whole.params(), padded);
    KILTER_CUDA_CHECK(cudaMemcpy(gpu->gathered_working_copy(), gathered.data(), sizeof(km::bf16) * padded,
                                 cudaMemcpyHostToDevice));
    std::copy(gathered.begin(), gathered.end(), twin.gathered_working_copy());
    gpu->params_changed();
    twin.params_changed();
    check.near(tag + "the gathered working copy (get_params)", params_of(*gpu), params_of(twin), 0.0);
    check.near_scalar(tag + "forward_loss after the gather (the norms widened, the head's copy)",
                      gpu->forward_loss(batch), twin.forward_loss(batch), 1e-3);
  } catch (const kilter::Error& e) {
    check.expect(tag + "ran", false, e.what());
  }
}

// A parameter holder of one rank that gathers the bf16 working copy (model.h ParamUnitHooks::
// working_copy_storage, what lib/train/param_shards_nccl.cu does over NCCL), on one device: a
// unit's parts outside this rank's chunks come from `others` (the other ranks' copy), its chunks
// are the model's own. A released unit's other parts read NaN (bf16 0xFFFF), and every fp32
// parameter NaN from the start: a model that read a released unit, or an fp32 weight other than
// the ranges it asked the holder to keep, gives a non-finite loss.
class CopyUnitHooks final : public km::ParamUnitHooks {
 public:
  CopyUnitHooks(const km::ParamLayout& layout, std::vector<km::ParamRange> owned)
      : units_(km::param_unit_ranges(layout)), owned_(std::move(owned)), padded_(layout.padded_size),
        gathered_(units_.size(), false) {
    KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&params_), sizeof(float) * padded_));
    KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&grads_), sizeof(float) * padded_));
    KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&copy_), sizeof(uint16_t) * padded_));
    const std::vector<float> nan(padded_, std::numeric_limits<float>::quiet_NaN());
    KILTER_CUDA_CHECK(cudaMemcpy(params_, nan.data(), sizeof(float) * padded_, cudaMemcpyHostToDevice));
    KILTER_CUDA_CHECK(cudaMemset(grads_, 0, sizeof(float) * padded_));
    KILTER_CUDA_CHECK(cudaMemset(copy_, 0xFF, sizeof(uint16_t) * padded_));
  }
  ~CopyUnitHooks() override {
    cudaDeviceSynchronize();
    cudaFree(params_);
    cudaFree(grads_);
    cudaFree(copy_);
  }
  CopyUnitHooks(const CopyUnitHooks&) = delete;
  CopyUnitHooks& operator=(const CopyUnitHooks&) = delete;

  float* params_storage() override { return params_; }
  float* grads_storage() override { return grads_; }
  void* working_copy_storage(size_t element_bytes, const std::vector<km::ParamRange>& fp32_ranges) override {
    element_bytes_ = element_bytes;
    fp32_ranges_ = fp32_ranges;
    for (const km::ParamRange& r : owned_)  // the chunks zero until the model writes them
      KILTER_CUDA_CHECK(cudaMemset(copy_ + r.offset, 0, sizeof(uint16_t) * r.count));
    return copy_;
  }
  bool need(int unit) override {
    if (unit < 0 || unit >= int(units_.size()) || gathered_[size_t(unit)]) return false;
    KILTER_CUDA_CHECK(cudaDeviceSynchronize());
    for (const km::ParamRange& r : outside(units_[size_t(unit)]))
      KILTER_CUDA_CHECK(cudaMemcpy(copy_ + r.offset, others.data() + r.offset, sizeof(uint16_t) * r.count,
                                   cudaMemcpyHostToDevice));
    KILTER_CUDA_CHECK(cudaDeviceSynchronize());  // landed before the model's stream reads it
    gathered_[size_t(unit)] = true;
    ++gathers;
    return true;
  }
  void forward_done(int unit) override {
    if (unit > 0 && unit + 1 < int(units_.size())) release(unit);
  }
  void grads_final(int unit) override {  // one rank: the reduce-scatter leaves the sum as it is
    release(unit + 1);
    if (unit == 0) release(0);
  }
  void pass_done() override {
    for (size_t u = 0; u < units_.size(); ++u) release(int(u));
  }
  size_t element_bytes() const { return element_bytes_; }
  const std::vector<km::ParamRange>& fp32_ranges() const { return fp32_ranges_; }
  std::vector<uint16_t> others;  // padded_size values: the other ranks' working copy
  int gathers = 0;

 private:
  // The parts of `u` outside this rank's chunks (owned_ in ascending order).
  std::vector<km::ParamRange> outside(const km::ParamRange& u) const {
    std::vector<km::ParamRange> parts;
    size_t at = u.offset;
    const size_t end = u.offset + u.count;
    for (const km::ParamRange& r : owned_) {
      const size_t lo = std::max(at, r.offset), hi = std::min(end, r.offset + r.count);
      if (lo >= hi) continue;
      if (at < lo) parts.push_back({at, lo - at});
      at = hi;
    }
    if (at < end) parts.push_back({at, end - at});
    return parts;
  }
  void release(int unit) {
    if (unit < 0 || unit >= int(units_.size()) || !gathered_[size_t(unit)]) return;
    KILTER_CUDA_CHECK(cudaDeviceSynchronize());
    for (const km::ParamRange& r : outside(units_[size_t(unit)]))
      KILTER_CUDA_CHECK(cudaMemset(copy_ + r.offset, 0xFF, sizeof(uint16_t) * r.count));
    KILTER_CUDA_CHECK(cudaDeviceSynchronize());
    gathered_[size_t(unit)] = false;
  }
  std::vector<km::ParamRange> units_, owned_, fp32_ranges_;
  size_t padded_ = 0, element_bytes_ = 0;
  float *params_ = nullptr, *grads_ = nullptr;
  uint16_t* copy_ = nullptr;
  std::vector<bool> gathered_;
};

// The distributed optimizer's whole working copy (padded_size values) on the host.
std::vector<uint16_t> working_copy_of(km::Model& model) {
  model.synchronize();
  std::vector<uint16_t> copy(model.layout().padded_size);
  KILTER_CUDA_CHECK(cudaMemcpy(copy.data(), model.gathered_working_copy(), sizeof(uint16_t) * copy.size(),
                               cudaMemcpyDeviceToHost));
  return copy;
}

// The owned ranges' fp32 master (copy_params_to_host), range after range, the padding left out.
std::vector<float> owned_master(km::Model& model, const std::vector<km::ParamRange>& owned) {
  const size_t num = model.layout().num_params;
  std::vector<float> master;
  for (const km::ParamRange& r : owned) {
    if (r.offset >= num) continue;
    std::vector<float> part(std::min(r.offset + r.count, num) - r.offset);
    model.copy_params_to_host(part.data(), r.offset, part.size());
    master.insert(master.end(), part.begin(), part.end());
  }
  return master;
}

// train.shard = parameters under bf16 storage, one rank's view: the holder gathers the working
// copy unit by unit; against the distributed optimizer gathered whole, from the same ranges.
void compare_unit_wise(Checker& check, const km::ModelSpec& cfg) {
  const std::string tag = "[" + cfg.arch + ", units gather the working copy] ";
  try {
    std::unique_ptr<km::Model> whole = kilter::backend::make_cuda_model(cfg, 64, bf16_storage());
    const std::vector<km::ParamRange> owned = owned_of(whole->layout().padded_size);
    CopyUnitHooks hooks(whole->layout(), owned);  // outlives the model that uses its buffers
    km::BackendOptions held = bf16_storage();
    held.params_held_elsewhere = true;  // the holder's buffers, as run_setup builds it
    std::unique_ptr<km::Model> units = kilter::backend::make_cuda_model(cfg, 64, held);
    check.expect(tag + "runs bf16 storage", kilter::gputest::runs_bf16_storage(*units));
    // As run_setup: the holder, then the ranges, then the initialization.
    units->set_param_units(&hooks);
    const std::vector<km::ParamRange> norms = km::norm_tensor_ranges(units->layout());
    check.expect(tag + "asks the holder for a bf16 copy, keeping the norms' fp32 tensors",
                 hooks.element_bytes() == 2 && hooks.fp32_ranges().size() == norms.size() &&
                     std::equal(norms.begin(), norms.end(), hooks.fp32_ranges().begin(),
                                [](const km::ParamRange& a, const km::ParamRange& b) {
                                  return a.offset == b.offset && a.count == b.count;
                                }));
    whole->shard_optimizer(owned);
    units->shard_optimizer(owned);
    check.expect(tag + "nothing gathered whole after a step", units->gathered_working_copy() == nullptr);
    whole->init_params(4321);
    units->init_params(4321);
    hooks.others = working_copy_of(*whole);  // the other ranks' rounding of the same initialization
    for (int step = 1; step <= 2; ++step) {
      const std::string at = ", step " + std::to_string(step);
      const km::Batch batch = random_batch(cfg, 3 + step, cfg.block_size);
      const float scale = 1.0f / static_cast<float>(batch.num_targets);
      whole->zero_grads();
      units->zero_grads();
      const double want = whole->forward_backward(batch, scale, {});
      const double got = units->forward_backward(batch, scale, {});
      check.near_scalar(tag + "loss" + at, got, want, 1e-6);
      check.near(tag + "gradients" + at, kilter::gputest::device_grads(*units), kilter::gputest::device_grads(*whole),
                 1e-6);
      km::AdamWParams adam;
      adam.lr = 1e-2f;
      adam.weight_decay = 0.5f;
      adam.t = step;
      whole->adamw_step(adam);
      units->adamw_step(adam);
      // The all-gather: the whole copy after the step (this rank's ranges updated), which the
      // holder's next gathers bring for the other ranks' parts; the units' own chunks are theirs.
      hooks.others = working_copy_of(*whole);
      whole->params_changed();
      units->params_changed();
      check.near(tag + "the owned master after AdamW" + at, owned_master(*units, owned), owned_master(*whole, owned),
                 1e-6);
    }
    const km::Batch eval = random_batch(cfg, 2, cfg.block_size);
    check.near_scalar(tag + "forward_loss", units->forward_loss(eval), whole->forward_loss(eval), 1e-6);
    check.expect(tag + "units gathered", hooks.gathers >= 2 * (cfg.n_layer + 2), std::to_string(hooks.gathers));
    bool refused = false;
    try {
      params_of(*units);
    } catch (const kilter::Error& e) {
      refused = std::string(e.what()).find("train.shard = parameters") != std::string::npos;
    }
    check.expect(tag + "a whole read (get_params) refused, naming train.shard", refused);
  } catch (const kilter::Error& e) {
    check.expect(tag + "ran", false, e.what());
  }
}

using DistributedOptimizer = kilter::gputest::DeviceTest;

TEST_F(DistributedOptimizer, OwnedMasterAndWorkingCopyAgainstTheCpu) {
  Checker check;
  compare(check, km::ModelSpec{2, 2, 128, 64, 515});  // GPT-2: LayerNorm biases, a position table
  compare(check, llama_gqa());                         // RMSNorm, grouped K/V heads, untied head
}

TEST_F(DistributedOptimizer, UnitWiseWorkingCopyAgainstTheWholeGather) {
  Checker check;
  compare_unit_wise(check, km::ModelSpec{2, 2, 128, 64, 515});  // GPT-2: a tied head in the embeddings' unit
  compare_unit_wise(check, llama_gqa());                         // an untied head in the final unit
}

}  // namespace
