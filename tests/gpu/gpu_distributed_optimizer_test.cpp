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
// GoogleTest; without a CUDA device every test is skipped and the binary exits 77.
#include <cuda_runtime.h>

#include <algorithm>
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

using DistributedOptimizer = kilter::gputest::DeviceTest;

TEST_F(DistributedOptimizer, OwnedMasterAndWorkingCopyAgainstTheCpu) {
  Checker check;
  compare(check, km::ModelSpec{2, 2, 128, 64, 515});  // GPT-2: LayerNorm biases, a position table
  compare(check, llama_gqa());                         // RMSNorm, grouped K/V heads, untied head
}

}  // namespace
