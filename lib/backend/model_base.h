// What every backend shares beneath the Model interface (model.h): the model description, the
// parameter layout, and the AdamW moments of the ranges this rank owns (all of the parameters,
// or its ZeRO-1 shard), with the rules of keeping, sharding, loading and reading them written
// once. A backend supplies only where the moments live: host memory (the CPU backend) or a
// device's (CUDA), through the copy policy below.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "lib/model/block_schedule.h"
#include "lib/model/model.h"

namespace kilter::backend {

class ModelBase : public model::Model {
 public:
  const model::ModelSpec& config() const override { return cfg_; }
  const model::ParamLayout& layout() const override { return layout_; }

  void get_optimizer_state(float* m, float* v) const override;
  void set_optimizer_state(const float* m, const float* v) override;
  bool supports_optimizer_shard() const override { return true; }
  void shard_optimizer(const std::vector<model::ParamRange>& owned) override;
  std::vector<model::ParamRange> optimizer_ranges() const override { return owned_; }
  void get_optimizer_shard(float* m, float* v, size_t first, size_t count) const override;

 protected:
  ModelBase(const model::ModelSpec& spec, size_t pad_multiple, const std::string& recompute);
  ~ModelBase() override = default;  // a backend calls release_moments() in its own destructor

  // The copy policy: zeroed memory for `floats` moments (throws kilter::Error when it cannot be
  // had, naming the setting that needs less), its release, and copies between it and the host.
  // Copies may be queued; finish_copies() waits until they are done.
  virtual float* allocate_moments(size_t floats) = 0;
  virtual void free_moments(float* moments) = 0;
  virtual void upload(float* to, const float* host, size_t count) = 0;
  virtual void download(float* host, const float* from, size_t count) const = 0;
  virtual void zero(float* to, size_t count) = 0;
  virtual void finish_copies() const {}

  // Allocates the moments of the owned floats on first use (a sharded model never holds all).
  void ensure_moments();
  void release_moments();
  void zero_moments();  // a fresh start (init_params)
  size_t owned_floats() const;
  float* moment_m() const { return adam_m_; }
  float* moment_v() const { return adam_v_; }
  const std::vector<model::ParamRange>& owned() const { return owned_; }
  bool sharded() const { return sharded_; }
  // "the cpu backend": for messages.
  std::string who() const { return "the " + backend_name() + " backend"; }

  model::ModelSpec cfg_;
  model::ParamLayout layout_;
  model::LayoutOffsets offsets_;
  // train.recompute: what the forward keeps per layer (docs/model.md, "Activation recomputation").
  // gelu: the GELU output lives in one slice shared by the layers and is recomputed from fch before
  // the MLP projection's backward; attention: the attention's saved state (softmax or cuDNN's
  // statistics) is shared and the layer's attention forward reruns before its backward; block:
  // every activation of a layer but its output (residual3) is shared, and the whole block forward
  // reruns from the layer's input at the start of its backward. plan_: the activation layout of
  // the model description (spec.h) it gives; schedule_: the blocks' forward and backward.
  model::Recompute recompute_;
  model::ActivationLayout plan_;
  model::BlockSchedule schedule_;

 private:
  // AdamW moments of the owned ranges, range after range ({[0, num_params)} unless sharded), in
  // one allocation: m, then v.
  std::vector<model::ParamRange> owned_;
  bool sharded_ = false;
  float *adam_m_ = nullptr, *adam_v_ = nullptr;
  size_t moments_held_ = 0;  // floats of each moment allocated (0: none yet)
};

}  // namespace kilter::backend
