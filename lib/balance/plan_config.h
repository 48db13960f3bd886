// The one place where the run configuration becomes PlanOptions, so that `kilter plan` and
// `kilter train` plan the same epochs from the same config.
#pragma once
#include <cstdint>

#include "lib/balance/plan.h"
#include "lib/core/config.h"

namespace kilter::balance {

// model.block_size -> context, data.max_tokens, train.tokens_per_step, data.sampler,
// data.naive_batch_size, data.tail, train.seed, and the cost model: a = data.cost_a; b =
// data.cost_b, or when that is < 0, attention_cost_coefficient(model shape, vocab) with vocab =
// model.vocab_size, else `dataset_vocab`, else 256 (byte tokens) — as the trainer derives it;
// c = data.cost_c, or when that is < 0, kCpuMicroBatchTokens x a on a CPU run (runs_on_cpu),
// else (a GPU) default_micro_batch_cost(a); t = data.cost_t, or when
// that is < 0, a x transfer_cost_coefficient(shape, vocab, kv_value_bytes, comm.link_gbps,
// device_tflops(cfg)) with t_link and layers = model.n_layer set, so that resolve_cost_model()
// raises it where the link sets the pace; data.cut_pieces; kv_bytes_per_token from the shape;
// under train.shard = parameters, shard_group = the ranks per shard group (shard_group_size() of
// train.shard_group at `world_size` ranks, `ranks_per_node` per node), so that each group's
// micro-batches meet slot by slot (group_slots.h); 0 otherwise or where a group is one rank.
PlanOptions plan_options_from_config(const Config& cfg, uint32_t dataset_vocab, int world_size = 1,
                                     int ranks_per_node = 0);

// Bytes of one exchanged K/V value: 2 (bf16) where train.precision = bf16 on a GPU backend
// (train.backend auto or cuda), else 4 (the CPU backend exchanges fp32).
double kv_value_bytes(const Config& cfg);

// The FLOP rate that turns link time into the plan's unit: comm.device_tflops, or where it is 0
// (auto, the default) the backend's: kGpuTflops on a GPU (bf16 on an H100 at ~40% of its peak),
// kCpuTflopsPerThread x train.threads on the CPU backend (train.backend = cpu, or auto where
// this process sees no GPU; a core's oneDNN fp32 GEMMs run at 0.1-0.2 TFLOP/s, the model's
// other work slower).
constexpr double kGpuTflops = 400;
constexpr double kCpuTflopsPerThread = 0.1;
double device_tflops(const Config& cfg);
bool runs_on_cpu(const Config& cfg);

// Heap bytes the plan holds (vectors' capacities): what a rank keeps in memory for one epoch.
uint64_t plan_heap_bytes(const EpochPlan& plan);

}  // namespace kilter::balance
