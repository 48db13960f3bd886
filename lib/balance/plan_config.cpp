// Config -> PlanOptions (see plan_config.h) and the plan's memory footprint.
#include "lib/balance/plan_config.h"

#include <algorithm>

#include "lib/model/model.h"

namespace kilter::balance {

double kv_value_bytes(const Config& cfg) {
  return cfg.train.precision == "bf16" && cfg.train.backend != "cpu" ? 2.0 : 4.0;
}

bool runs_on_cpu(const Config& cfg) {
  return cfg.train.backend == "cpu" || (cfg.train.backend == "auto" && !model::cuda_available());
}

double device_tflops(const Config& cfg) {
  if (cfg.comm.device_tflops > 0) return cfg.comm.device_tflops;
  return runs_on_cpu(cfg) ? kCpuTflopsPerThread * std::max(cfg.train.threads, 1) : kGpuTflops;
}

PlanOptions plan_options_from_config(const Config& cfg, uint32_t dataset_vocab, int world_size, int ranks_per_node) {
  PlanOptions opts;
  // Sharded parameters: every micro-batch is a meeting point of the shard group.
  if (cfg.train.shard == "parameters") {
    const int group = shard_group_size(cfg.train, world_size, ranks_per_node);
    opts.shard_group = group > 1 ? group : 0;
  }
  opts.sampler = cfg.data.sampler;
  opts.context = static_cast<uint32_t>(cfg.model.block_size);
  opts.max_tokens = static_cast<uint64_t>(cfg.data.max_tokens);
  opts.tokens_per_step = static_cast<uint64_t>(cfg.train.tokens_per_step);
  opts.naive_batch_size = cfg.data.naive_batch_size;
  opts.tail = cfg.data.tail;
  opts.seed = cfg.train.seed;
  opts.cost.a = cfg.data.cost_a;
  // < 0: the default of the device the run computes on (`kilter plan` on a node without a GPU
  // plans a CPU run unless the config says train.backend = cuda).
  opts.cost.c = cfg.data.cost_c >= 0 ? cfg.data.cost_c
                : runs_on_cpu(cfg)    ? kCpuMicroBatchTokens * cfg.data.cost_a
                                      : default_micro_batch_cost(cfg.data.cost_a);
  model::ModelSpec spec = cfg.model;  // the vocabulary the run will have
  spec.vocab_size = cfg.model.vocab_size > 0 ? cfg.model.vocab_size
                    : dataset_vocab > 0      ? static_cast<int>(dataset_vocab)
                                             : 256;
  opts.cost.b = cfg.data.cost_b >= 0 ? cfg.data.cost_b : attention_cost_coefficient(spec);
  opts.cut_pieces = cfg.data.cut_pieces;
  const double value_bytes = kv_value_bytes(cfg);
  opts.kv_bytes_per_token = model::kv_bytes_per_token(spec, value_bytes);
  const double tflops = device_tflops(cfg);
  // t charges the exposed part of the transfer (transfer_cost_coefficient: plan.h says which);
  // t_link, the whole transfer, is reported beside it. With `layers` set, resolve_cost_model()
  // raises t where the link sets the pace (it needs the world size and the step, which the plan
  // knows); a given data.cost_t stays as it is.
  opts.cost.t = cfg.data.cost_t >= 0
                    ? cfg.data.cost_t
                    : cfg.data.cost_a * transfer_cost_coefficient(spec, value_bytes, cfg.comm.link_gbps, tflops);
  opts.cost.t_link = cfg.data.cost_t >= 0
                         ? 0.0
                         : cfg.data.cost_a * kv_link_cost_coefficient(spec, value_bytes, cfg.comm.link_gbps, tflops);
  opts.cost.layers = cfg.data.cost_t >= 0 ? 0 : cfg.model.n_layer;
  return opts;
}

uint64_t plan_heap_bytes(const EpochPlan& plan) { return plan.steps.heap_bytes(); }

}  // namespace kilter::balance
