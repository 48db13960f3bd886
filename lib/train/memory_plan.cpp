// The memory plan (memory_plan.h). The figures follow what the backend and the trainer
// allocate: CpuModel's constructor and ensure_capacity (lib/backend/cpu_model.cpp), or on the
// cuda backend CudaModel's device buffers (lib/backend/cuda_memory.h); the checkpointer's
// snapshot and shard buffers, the gradient reducer's MPI temporaries, the reader's ring.
// tests/e2e/memory_plan.sh checks the CPU estimate against the measured peak RSS,
// tests/gpu/gpu_model_test.cpp the device figures against the device memory a CUDA model takes.
#include "lib/train/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "io/base/error.h"
#include "lib/backend/cpu_model.h"
#include "lib/backend/cuda_memory.h"
#include "lib/comm/communicator.h"
#include "lib/comm/unit_chunks.h"
#include "lib/comm/unit_pages.h"
#include "lib/model/model.h"

namespace kilter::train {
namespace {

// What a rank holds besides the figures: MPI (shared-memory transport), oneDNN and OpenMP,
// HDF5, the plan of an epoch, code, and the malloc arenas of the threads. Measured: 41-64 MiB
// (a 2-layer, 32-wide model's rank peaks at 41 MB; 4 x 512 ranks vary by 30 MiB run to run)
// while the communication thread's freed temporaries stayed in its arena; since the reducer
// returns them, 4 x 512 ranks peak 25-35 MiB below a plan with 64 MiB, hence 48.
constexpr uint64_t kRuntimeBytes = 48ull << 20;
// That figure includes the ~18 MiB a CPU-only build holds before main() (code, the libraries'
// static data). A build that links the CUDA libraries (cudart, cuBLASLt, cuDNN, NCCL) holds
// ~210 MiB more there, on every rank, GPU or not: the difference is read at start-up.
constexpr uint64_t kCpuOnlyStartBytes = 18ull << 20;

uint64_t resident_bytes_now() {
  unsigned long long size = 0, resident = 0;
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  const int got = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return got == 2 ? uint64_t(resident) * uint64_t(sysconf(_SC_PAGESIZE)) : 0;
}
// Read during static initialization, after the shared libraries are loaded and before kilter
// allocates anything of its own.
const uint64_t kStartBytes = resident_bytes_now();

double gib(uint64_t bytes) { return double(bytes) / double(1ull << 30); }

// `sharded_parameters`: the LM head's chunk of rows is the smaller one (cpu_model.h).
uint64_t activation_bytes(const Config& cfg, bool sharded_parameters) {
  const uint64_t kHeadChunk = uint64_t(sharded_parameters ? backend::kShardedHeadChunkRows : backend::kHeadChunkRows);
  const uint64_t N = uint64_t(cfg.data.max_tokens), C = uint64_t(cfg.model.n_embd), L = uint64_t(cfg.model.n_layer);
  const uint64_t V = uint64_t(cfg.model.vocab_size), NH = uint64_t(cfg.model.n_head);
  const uint64_t context = uint64_t(cfg.model.block_size);
  const uint64_t att = NH * N * std::min(N, context);  // saved softmax per layer
  // CpuModel's buffers, from the model description's activation layout: what each block keeps per
  // token, what one block's recompute scratch holds, how many layers of softmax and of bf16 GEMM
  // inputs are held.
  const model::ActivationLayout plan = model::activation_layout(cfg.model, model::parse_recompute(cfg.train.recompute));
  const uint64_t att_layers = plan.attention_per_layer ? L : 1;
  uint64_t floats = N * C                                  // encoded
                    + L * N * plan.kept_per_token          // each block's kept activations and statistics
                    + N * plan.shared_per_token            // one block's recomputed activations
                    + N * C + 2 * N                        // the final norm and its statistics
                    + N * plan.backward_per_token          // backward scratch
                    + N * C + kHeadChunk * C + kHeadChunk * V  // LM head rows, their gradient, a chunk of logits
                    + att_layers * att;
  uint64_t bytes = floats * 4 + 2 * N * 4;  // + target rows and ids
  if (cfg.train.precision == "bf16" && cfg.train.bf16_storage == "on") {
    // bf16 storage (the CUDA datapath's oracle): fp32 GEMMs on bf16 values, so no bf16 GEMM
    // inputs, staging or oneDNN bf16 kernels; instead a Linear's output before its fused norm and
    // dresidual's bf16 copy (N x C each), and per thread the largest weight widened from the
    // working copy and the classifier's chunk of rows, their gradient and logits
    // (lib/model/bf16_ops.cpp).
    const uint64_t ffn_in = uint64_t(cfg.model.ffn_in_width()), ffn = uint64_t(cfg.model.ffn_width());
    const uint64_t qkv = uint64_t(cfg.model.qkv_width());
    const uint64_t largest_weight = std::max({V * C, ffn_in * C, ffn * C, qkv * C});
    constexpr uint64_t kClassifierRows = 256;
    bytes += (2 * N * C + largest_weight + kClassifierRows * (2 * C + V)) * 4;
  } else if (cfg.train.precision == "bf16") {
    bytes += N * plan.bf16_layers * plan.bf16_inputs_per_token * 2;  // the kept bf16 GEMM inputs
    // Per-thread bf16 staging of the other GEMM operands (lib/model/matmul.cpp), and what oneDNN's
    // bf16 kernels hold (measured: about 40 MiB more than fp32 whatever the shape).
    const uint64_t ffn_in = uint64_t(cfg.model.ffn_in_width());
    bytes += (std::max(N * ffn_in, kHeadChunk * V) + N * ffn_in) * 2 + (40ull << 20);
  }
  return bytes;
}

// The units `parameters` gathers (model::param_unit_ranges: 0 = the embeddings with a tied head,
// 1 + l = block l, the last = the final norm and an untied head), and what of them is resident at
// the peak under the schedule lib/train/param_shards.cpp runs, phase by phase. The embeddings are
// gathered for the encoder (block 0's gather in flight) and freed; a block is gathered for its
// forward while the next one's gather is in flight (prefetch), freed, and gathered again for its
// backward, which keeps the unit above it until its own gradients are final, the next one's
// gather in flight again: at most three blocks, or two and the final unit. The final unit stays
// from the forward into the backward. A tied head gathers the embeddings again and writes their
// whole gradient, reduce-scattered (the embeddings freed) while the final norm's backward runs,
// the last block's gather in flight. A unit's whole gradient is resident from its backward until its reduce-scatter
// has completed, which overlaps the backward of the unit below: two units' at once. An untied
// head's phase holds the final unit and its gradient; the embedding's own backward writes only the
// rows of the micro-batch's tokens.
struct UnitFloats {
  uint64_t largest = 0;    // the largest unit
  uint64_t chunk = 0;      // the largest unit's chunk on one of G ranks (whole 64-float groups)
  uint64_t gathered = 0;   // parameters resident at once beyond the rank's chunks, at the peak phase
  uint64_t gradients = 0;  // whole unit gradients resident at once, at the same phase
};
UnitFloats unit_floats(const model::ParamLayout& layout, bool tied, uint64_t G) {
  const std::vector<model::ParamRange> units = model::param_unit_ranges(layout);
  UnitFloats f;
  const uint64_t embeddings = units.front().count, last = units.back().count;
  const uint64_t blocks = units.size() - 2;
  uint64_t block = 0;
  for (size_t u = 1; u + 1 < units.size(); ++u) block = std::max<uint64_t>(block, units[u].count);
  for (const model::ParamRange& u : units) f.largest = std::max<uint64_t>(f.largest, u.count);
  f.chunk = ((f.largest + G - 1) / G + 63) / 64 * 64;
  const uint64_t b2 = std::min<uint64_t>(blocks, 2) * block, b3 = std::min<uint64_t>(blocks, 3) * block;
  struct Phase {
    uint64_t gathered, gradients;
  };
  const Phase phases[] = {
      {embeddings + block, 0},                                              // the encoder
      {std::max(b3, b2 + last), std::max(b2, block + last)},                // the blocks
      {(tied ? embeddings : 0) + last, tied ? embeddings : last},           // the head
      {last + block, (tied ? embeddings : 0) + last},                       // the final norm's backward
  };
  for (const Phase& ph : phases)
    if (ph.gathered + ph.gradients > f.gathered + f.gradients) f.gathered = ph.gathered, f.gradients = ph.gradients;
  return f;
}

// Whether a backend shards the fp32 master weights with the moments under train.shard =
// optimizer (Megatron's distributed optimizer): where every weight is read through a bf16 working
// copy, the master is needed only where a rank updates it. The cpu backend does it under bf16
// storage (lib/backend/cpu_model.h, master_sharded_), and so does the cuda backend under bf16
// storage (lib/backend/cuda_model_impl.cuh, master_: the norms widened from the working copy, the
// embeddings read from it). In fp32 and with bf16 GEMMs only, the working weights are the master,
// whole.
constexpr bool kCudaMasterShardedUnderOptimizer = true;
bool master_sharded_under_optimizer(const Config& cfg, bool cuda) {
  if (cfg.train.precision != "bf16") return false;
  return cuda ? kCudaMasterShardedUnderOptimizer && cfg.train.bf16_storage != "off" : cfg.train.bf16_storage == "on";
}

// The weights and gradients of one rank under train.shard = optimizer or parameters, with
// `shard` floats its share of the G-rank group.
struct ShardedState {
  uint64_t parameters = 0, gathered = 0, gradients = 0;
};
ShardedState sharded_state(const MemoryPlan& p, const UnitFloats& units, bool bf16_work, bool master_sharded,
                           uint64_t shard, bool reshard_after_forward, bool mpi_reduce_scatter,
                           bool whole_bf16_copy) {
  ShardedState st;
  const uint64_t work = bf16_work ? 2 : 4;       // bytes of a working weight
  const uint64_t master = bf16_work ? 4 : 0;     // the fp32 master, where it is not the working copy
  // Both backends keep train.grad_dtype = bf16's values in their fp32 gradient buffer (rounded
  // in place as the backward finishes each range): 4 bytes either way.
  const uint64_t grad = 4;
  if (p.shard == "optimizer") {
    // The moments sharded, the gradient buffer whole in train.grad_dtype; the fp32 master 1/G
    // with the moments where the backend shards it (the distributed optimizer: the working copy
    // whole, gathered after each update), else whole.
    st.parameters = p.padded_params * work + (master_sharded ? shard : p.padded_params) * master;
    st.gradients = p.padded_params * grad;
  } else if (p.shard == "parameters") {
    // ZeRO-3: this rank's 1/G of everything, plus the other ranks' parts of the units resident at
    // once (unit_floats; every unit with train.reshard_after_forward = false).
    const uint64_t G = uint64_t(std::max(p.shard_group, 1));
    const uint64_t gathered = reshard_after_forward ? std::min<uint64_t>(units.gathered, p.padded_params)
                                                    : p.padded_params;
    st.parameters = shard * (work + master);
    st.gathered = gathered * (G - 1) / G * work;
    if (whole_bf16_copy) {
      // The cpu backend gathers the fp32 weights of a unit and rounds them into its bf16 copy,
      // which it keeps whole (lib/backend/cpu_model.h, params_bf16_, zeroed at its creation):
      // the rank's fp32 chunk, the whole bf16 copy, and the gathered units in fp32.
      st.parameters = shard * 4 + p.padded_params * 2;
      st.gathered = gathered * (G - 1) / G * 4;
    }
    // The reduce-scatter's scratch besides, on the CPU backend: pieces of at most 4 Mi floats
    // over all chunks (param_shards.cpp packs them), and Open MPI's temporary of as much (its
    // reduce-scatter reduces the whole input before it scatters; NCCL's needs none).
    const uint64_t pack = std::max<uint64_t>(64, std::min<uint64_t>(units.chunk, (uint64_t(4) << 20) / G) / 64 * 64) * G;
    st.gradients = shard * grad + units.gradients * (G - 1) / G * grad + (mpi_reduce_scatter ? 2 * pack * 4 : 0);
  }
  return st;
}

// Under optimizer on the cpu backend, the gradient reducer's scatter stages over MPI, each with
// Open MPI's temporaries of the buckets it has in flight (comm::mpi_reduce_scatter_scratch): one
// stage over the shard group (one node, flat, or HSDP's node), or a node stage and then a stage
// across the nodes over 1/L of each bucket (hierarchical over several nodes). Buckets as the
// reducer cuts them: comm.bucket_mb in whole multiples of 64 floats per rank of the world.
comm::ReduceScatterScratch reduce_scatter_scratch(const MemoryPlan& p, const Config& cfg, int P, int L) {
  comm::ReduceScatterScratch total;
  if (p.shard != "optimizer" || !p.sharded) return total;
  const uint64_t unit = uint64_t(P) * 64;
  const uint64_t asked = std::max<uint64_t>(uint64_t(cfg.comm.bucket_mb * 1024 * 1024) / 4, 1);
  const uint64_t bucket = std::min<uint64_t>(asked >= unit ? asked / unit * unit : asked, p.padded_params) * 4;
  auto add = [&total](uint64_t bytes, int size) {
    const comm::ReduceScatterScratch stage = comm::mpi_reduce_scatter_scratch(bytes, size);
    total.rank0 += stage.rank0;
    total.other += stage.other;
  };
  const bool hierarchical = cfg.comm.algo == "hierarchical" && P % L == 0;
  if (p.shard_group < P) {
    add(bucket, p.shard_group);  // HSDP: the node's reduce-scatter, then an all-reduce across nodes
  } else if (hierarchical && L < P) {
    add(bucket, L);
    add(bucket / uint64_t(L), P / L);
  } else {
    add(bucket, P);
  }
  return total;
}

}  // namespace

uint64_t machine_memory_bytes() {
  if (const char* forced = std::getenv("KILTER_TEST_NODE_MEMORY_BYTES")) return std::strtoull(forced, nullptr, 10);
  uint64_t total = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemTotal:") {
      total = kib * 1024;
      break;
    }
    meminfo.ignore(256, '\n');
  }
  // A cgroup (v2) limit below the machine's is what the job really has.
  std::ifstream limit_file("/sys/fs/cgroup/memory.max");
  std::string limit;
  if (limit_file >> limit && !limit.empty() && limit != "max") {
    const uint64_t bytes = std::strtoull(limit.c_str(), nullptr, 10);
    if (bytes > 0 && (total == 0 || bytes < total)) total = bytes;
  }
  return total;
}

uint64_t device_memory_bytes() {
  if (const char* forced = std::getenv("KILTER_TEST_DEVICE_MEMORY_BYTES")) return std::strtoull(forced, nullptr, 10);
  uint64_t free_bytes = 0, total_bytes = 0;
  return model::cuda_device_memory(&free_bytes, &total_bytes) ? free_bytes : 0;
}

MemoryPlan plan_memory(const MemoryPlanInput& in) { return plan_memory(in, machine_memory_bytes()); }

namespace {

// The device pages the NCCL shards back (lib/train/param_shards_nccl.cu) and what the CudaModel
// holds beside them under `parameters`. Every buffer is a virtual range backed at the chunks of the
// rank (rank 0: the fullest) and, beyond them, at most comm::unit_page_budget's pages (the
// embeddings, the final unit and three blocks; for the gradients the embeddings and two units);
// the gathers and reduce-scatters move through a staging buffer of the largest unit in G equal
// fp32 chunks plus one chunk. In fp32 (no bf16 storage) the units gather the fp32 parameters,
// backed at the chunks and the units in use. Under bf16 storage they gather the bf16 working copy
// alone (2 bytes an element, through the same staging) and the model keeps the distributed
// optimizer's state (lib/backend/cuda_optimizer.cu): the fp32 master of the owned floats (4 bytes
// each, one allocation), the copy's chunk pages (written by AdamW, for good), the fp32 pages of
// the norms' tensors (widened from the copy at each unit's gather, for good) and the head's padded
// bf16 copy (whole); no fp32 page of a unit is backed. Pages of kDevicePageBytes, the granularity
// a device reports (cuMemGetAllocationGranularity, recommended): 2 MiB on the GPUs seen so far.
// Sets p.parameters (the chunks' state) and p.gradients; returns the gathered bytes (the units'
// pages beyond the chunks and the staging).
constexpr uint64_t kDevicePageBytes = uint64_t(2) << 20;
uint64_t nccl_shard_bytes(MemoryPlan& p, const model::ParamLayout& layout, const model::ModelSpec& gpt,
                          bool bf16_storage, bool reshard_after_forward) {
  const comm::UnitChunks chunks = comm::UnitChunks::of(layout, std::max(p.shard_group, 1), 0);
  auto spans = [&chunks](size_t element) {
    std::vector<comm::PageSpan> units;
    for (int u = 0; u < chunks.num_units(); ++u)
      units.push_back(comm::covering_pages(chunks.unit(u).offset, chunks.unit(u).count, element, kDevicePageBytes));
    return units;
  };
  // The pages of a buffer of `element`-byte values that the ranges cover, each page once.
  auto pages_of = [&layout](const std::vector<model::ParamRange>& ranges, size_t element) {
    comm::PageRefs refs(comm::round_to_pages(layout.padded_size * element, kDevicePageBytes) / kDevicePageBytes);
    for (const model::ParamRange& r : ranges)
      refs.hold(comm::covering_pages(r.offset, r.count, element, kDevicePageBytes));
    return uint64_t(refs.held());
  };
  const std::vector<model::ParamRange> owned = chunks.owned();
  const uint64_t chunk_pages = pages_of(owned, 4);
  const comm::PageBudget fp32 = comm::unit_page_budget(spans(4), !reshard_after_forward);
  const uint64_t staging = (chunks.staging_floats() + chunks.largest_chunk()) * 4;
  p.gradients = (chunk_pages + fp32.grads) * kDevicePageBytes;
  if (!bf16_storage) {
    p.parameters = chunk_pages * kDevicePageBytes;
    return fp32.params * kDevicePageBytes + staging;
  }
  uint64_t owned_floats = 0;
  for (const model::ParamRange& r : owned) owned_floats += r.count;
  const uint64_t head_copy = 2 * ((uint64_t(gpt.vocab_size) + 127) / 128 * 128) * uint64_t(gpt.n_embd);
  const uint64_t copy_chunk_pages = pages_of(owned, 2);
  const uint64_t norm_pages = pages_of(model::norm_tensor_ranges(layout), 4);
  p.parameters = owned_floats * 4 + (copy_chunk_pages + norm_pages) * kDevicePageBytes + head_copy;
  const comm::PageBudget copy = comm::unit_page_budget(spans(2), !reshard_after_forward);
  return copy.params * kDevicePageBytes + staging;
}

// The figures, without looking for a setting that fits.
MemoryPlan memory_figures(const MemoryPlanInput& in, uint64_t machine_bytes) {
  MemoryPlan p;
  p.input = in;
  const Config& cfg = in.cfg;
  const int P = std::max(1, in.world_size);
  const int L = std::clamp(in.ranks_per_node, 1, P);
  // train.shard_optimizer is train.shard's alias (the parsers keep them in step; a plan that
  // changes one sets both).
  p.shard = P > 1 ? cfg.train.shard : "none";
  p.shard_group = p.shard == "none" ? 1 : shard_group_size(cfg.train, P, L);
  p.sharded = p.shard_group > 1;
  model::ModelSpec gpt = cfg.model;
  gpt.vocab_size = std::max(1, gpt.vocab_size);
  // Sharded, the layout is padded to 64 floats per rank of the world, as the trainer pads it
  // (every group size divides it).
  const model::ParamLayout layout = model::ParamLayout::build(gpt, size_t(p.sharded ? P : L) * 64);
  p.num_params = layout.num_params;
  p.padded_params = layout.padded_size;
  const UnitFloats units = unit_floats(layout, gpt.tied(), uint64_t(std::max(p.shard_group, 1)));
  p.unit_floats = units.largest;
  const bool bf16 = cfg.train.precision == "bf16";
  const bool cuda = in.backend == "cuda";
  const uint64_t shard = p.sharded ? p.padded_params / uint64_t(p.shard_group) : p.num_params;
  // The working weights are bf16 where bf16 is stored (cuda: bf16 storage; cpu: the bf16 copy its
  // GEMMs read), and the fp32 weights are then the master copy; in fp32 they are one and the same.
  const bool bf16_work = bf16 && (!cuda || cfg.train.bf16_storage != "off");
  // train.grad_dtype as the run resolves it: auto is bf16 under bf16 storage on the cpu backend
  // (none or optimizer), else fp32; bf16 as asked. Both backends accumulate the bf16 values in
  // their fp32 buffer: 4 bytes (a buffer of bf16 would take 2).
  const bool cpu_bf16_storage = !cuda && bf16 && cfg.train.bf16_storage == "on";
  const bool auto_bf16 = cfg.train.grad_dtype == "auto" && cpu_bf16_storage && p.shard != "parameters";
  p.grad_dtype = cfg.train.grad_dtype == "bf16" || auto_bf16 ? "bf16" : "fp32";
  const bool master_sharded = p.shard == "optimizer" && master_sharded_under_optimizer(cfg, cuda);
  ShardedState state =
      sharded_state(p, units, bf16_work, master_sharded, shard, cfg.train.reshard_after_forward, !cuda, !cuda && bf16);
  // The distributed optimizer also widens the norms' weights from the working copy for the fp32
  // norm kernels, into an allocation only their pages touch (CpuModel::widened_: 4 KiB pages;
  // CudaModel's managed params_: priced at 2 MiB, the largest a device's first touch populates):
  // a page or two per norm tensor.
  if (master_sharded) {
    const uint64_t page = cuda ? uint64_t(2) << 20 : 4096;
    uint64_t norms = 0;
    for (const model::ParamRange& t : model::norm_tensor_ranges(layout))
      norms += (t.count * 4 + page - 1) / page * page + page;  // whole pages, one shared with the next tensor
    state.parameters += norms;
  }

  if (cuda) {
    // The device's: the same weights, gradients and owned moments, and CudaModel's arena.
    const char* copies = std::getenv("KILTER_CUDA_BF16_INPUTS");
    const backend::CudaDeviceBytes device =
        backend::cuda_device_bytes(gpt, layout.padded_size, shard, int(cfg.data.max_tokens), cfg.train.recompute,
                                   bf16 && copies != nullptr && std::string(copies) == "1",
                                   bf16 && cfg.train.bf16_storage != "off",
                                   backend::cuda_plan_counts_sdpa(gpt, cfg.train.attention, cfg.train.precision));
    // The state by mode (cuda_device_bytes counts it whole, the moments of the owned floats).
    p.parameters = p.shard == "none" ? device.parameters : state.parameters;
    p.gradients = p.shard == "none" ? device.gradients : state.gradients;
    p.optimizer = device.optimizer;
    p.gathered = state.gathered;
    p.activations = device.activations;
    p.engine = device.engine;
    p.cudnn = device.cudnn;
    if (p.shard == "parameters")
      p.gathered = nccl_shard_bytes(p, layout, gpt, bf16 && cfg.train.bf16_storage != "off",
                                    cfg.train.reshard_after_forward);
    p.device_total = device.total() - device.parameters - device.gradients + p.parameters + p.gradients + p.gathered;
  } else {
    p.parameters = p.shard == "none" ? p.padded_params * (bf16 ? 6 : 4) : state.parameters;
    p.gradients = p.shard == "none" ? p.padded_params * 4 : state.gradients;
    p.optimizer = shard * 8;
    p.gathered = state.gathered;
    p.activations = activation_bytes(cfg, p.shard == "parameters");
  }
  // Unsharded, rank 0 keeps a snapshot of params and moments for the background writer. Sharded,
  // no rank copies more than pieces of 2^22 floats: every rank writes its own ranges of the file
  // from a piece of each moment, and rank 0's writer reads the file back a piece at a time for the
  // checksums (lib/train/checkpointer.cpp, io/checkpoint.cpp). A resume reads params and moments
  // into buffers on every rank before handing them to the model.
  const uint64_t snapshot = p.num_params * 12;
  const uint64_t piece = 1ull << 22;
  const uint64_t slice_buffers = p.sharded ? std::min<uint64_t>(shard, piece) * 8 : 0;
  const uint64_t read_back = p.sharded ? std::min<uint64_t>(p.num_params, piece) * 4 : 0;
  const uint64_t resume = in.resuming ? snapshot : 0;
  p.checkpoint_rank0 = p.sharded ? std::max(slice_buffers + read_back, resume) : snapshot;
  p.checkpoint_other = std::max(slice_buffers, resume);
  const uint64_t tokens = uint64_t(cfg.data.max_tokens);
  p.prefetch = (uint64_t(std::max<int64_t>(cfg.data.prefetch, 0)) + 1) * tokens * 4 * 2 + tokens * 12;
  p.runtime = kRuntimeBytes + (kStartBytes > kCpuOnlyStartBytes ? kStartBytes - kCpuOnlyStartBytes : 0);

  // On cuda the model's buffers are the device's; the host keeps the checkpoint's, the ring and
  // the runtime (the CUDA libraries' own host memory is not counted: not measured yet).
  const uint64_t model_host = cuda ? 0 : p.parameters + p.gathered + p.gradients + p.optimizer + p.activations;
  if (!cuda) {  // NCCL's reductions take no host temporaries
    const comm::ReduceScatterScratch scratch = reduce_scatter_scratch(p, cfg, P, L);
    p.comm_scratch_rank0 = scratch.rank0;
    p.comm_scratch_other = scratch.other;
  }
  const uint64_t common = model_host + p.prefetch + p.runtime;
  p.rank0_total = common + p.comm_scratch_rank0 + p.checkpoint_rank0;
  p.other_total = common + p.comm_scratch_other + p.checkpoint_other;
  p.node_total = p.rank0_total + uint64_t(L - 1) * p.other_total;
  p.machine_bytes = machine_bytes;
  p.device_fits = !cuda || in.device_bytes == 0 || p.device_total <= in.device_bytes;
  p.fits = (machine_bytes == 0 || p.node_total <= machine_bytes) && p.device_fits;
  return p;
}

}  // namespace

MemoryPlan plan_memory(const MemoryPlanInput& in, uint64_t machine_bytes) {
  MemoryPlan p = memory_figures(in, machine_bytes);
  if (p.fits) return p;
  const Config& cfg = in.cfg;
  const int P = std::max(1, in.world_size);
  const int L = std::clamp(in.ranks_per_node, 1, P);

  // The cheapest setting that fits, in this order: sharding the optimizer costs nothing (one
  // all-gather of the updated weights a step); recomputation costs compute, least for gelu (one
  // elementwise op per layer), then attention (the score products again), then block (a block's
  // forward again: about a third more GEMMs); sharding the parameters costs two all-gathers of the
  // weights and a reduce-scatter per micro-batch (hidden by prefetching where the link keeps up);
  // a smaller micro-batch costs GEMM efficiency; more nodes cost machines.
  auto fits_with = [&](const MemoryPlanInput& changed) { return memory_figures(changed, machine_bytes).fits; };
  auto with_shard = [](MemoryPlanInput changed, const std::string& shard) {
    changed.cfg.train.shard = shard;
    changed.cfg.train.shard_optimizer = shard != "none";
    return changed;
  };
  const std::string current_shard = cfg.train.shard;
  const bool can_shard = P > 1;
  // The mode the later steps keep: at least optimizer where sharding is possible.
  const std::string base_shard = can_shard && current_shard == "none" ? "optimizer" : current_shard;
  const std::string shard_and = base_shard != current_shard ? "set train.shard = optimizer and " : "set ";
  if (can_shard && current_shard == "none" && fits_with(with_shard(in, "optimizer"))) {
    p.advice = "set train.shard = optimizer";
    return p;
  }
  const std::vector<std::string> modes = {"none", "gelu", "attention", "block"};
  const auto current = std::find(modes.begin(), modes.end(), cfg.train.recompute);
  const auto recompute_words = [](const std::string& mode) {
    return std::string(" (the backward recomputes ") +
           (mode == "gelu" ? "the MLP's GELU output" : mode == "attention" ? "the attention softmax" : "each block's activations") +
           ")";
  };
  for (auto mode = current == modes.end() ? modes.end() : current + 1; mode != modes.end(); ++mode) {
    MemoryPlanInput changed = with_shard(in, base_shard);
    changed.cfg.train.recompute = *mode;
    if (fits_with(changed)) {
      p.advice = shard_and + "train.recompute = " + *mode + recompute_words(*mode);
      return p;
    }
  }
  // Sharded parameters, with the recomputation as it is and then more of it.
  if (can_shard && current_shard != "parameters") {
    for (auto mode = current; mode != modes.end(); ++mode) {
      MemoryPlanInput changed = with_shard(in, "parameters");
      changed.cfg.train.recompute = *mode;
      if (!fits_with(changed)) continue;
      p.advice = "set train.shard = parameters (train.shard_group = " + cfg.train.shard_group + ")";
      if (mode != current) p.advice += " and train.recompute = " + *mode + recompute_words(*mode);
      return p;
    }
  }
  const std::string last_shard = can_shard ? "parameters" : current_shard;
  const std::string last_and = last_shard != current_shard ? "set train.shard = parameters and " : "set ";
  for (int64_t max_tokens = cfg.data.max_tokens / 2; max_tokens >= 64; max_tokens /= 2) {
    MemoryPlanInput changed = with_shard(in, last_shard);
    changed.cfg.data.max_tokens = max_tokens;
    if (fits_with(changed)) {
      p.advice = last_and + "data.max_tokens = " + std::to_string(max_tokens) + " (micro-batches of fewer tokens)";
      return p;
    }
  }
  const int current_nodes = P / L;
  for (int nodes = current_nodes + 1; nodes <= current_nodes * 1024;
       nodes = nodes < 2 * current_nodes ? nodes + 1 : nodes * 2) {
    MemoryPlanInput changed = with_shard(in, "parameters");
    changed.world_size = nodes * L;
    changed.cfg.train.shard_group = "world";
    if (fits_with(changed)) {
      p.advice = "run on " + std::to_string(nodes) + " nodes of " + std::to_string(L) +
                 " ranks with train.shard = parameters and train.shard_group = world (" + std::to_string(nodes * L) +
                 " ranks)";
      return p;
    }
  }
  return p;
}

std::string format_memory_plan(const MemoryPlan& p) {
  std::ostringstream os;
  char line[256];
  const Config& cfg = p.input.cfg;
  const bool cuda = p.input.backend == "cuda";
  std::string sharding = "nothing sharded";
  if (p.sharded)
    sharding = "shard " + p.shard + " over groups of " + std::to_string(p.shard_group) + " ranks, " + p.grad_dtype +
               " gradients" +
               (p.shard == "parameters" && !cfg.train.reshard_after_forward ? ", units kept from forward to backward" : "");
  std::snprintf(line, sizeof line,
                "memory plan: %llu parameters, %s, %d ranks (%d per node), %s, data.max_tokens %lld; "
                "recompute %s%s\n",
                (unsigned long long)p.num_params, cfg.train.precision.c_str(), p.input.world_size,
                p.input.ranks_per_node, sharding.c_str(), (long long)cfg.data.max_tokens, cfg.train.recompute.c_str(),
                cuda ? "; cuda backend" : "");
  os << line;
  auto row = [&](const char* what, uint64_t rank0, uint64_t other) {
    if (rank0 == other)
      std::snprintf(line, sizeof line, "  %-22s %9.3f GiB per rank\n", what, gib(rank0));
    else
      std::snprintf(line, sizeof line, "  %-22s %9.3f GiB on rank 0, %.3f GiB on the others\n", what, gib(rank0),
                    gib(other));
    os << line;
  };
  if (cuda) os << "  on each rank's device:\n";
  row(!cuda && cfg.train.precision == "bf16" ? "parameters (+bf16)" : "parameters", p.parameters, p.parameters);
  if (p.gathered > 0) row("gathered units", p.gathered, p.gathered);
  row("gradients", p.gradients, p.gradients);
  row("optimizer state", p.optimizer, p.optimizer);
  row("activations", p.activations, p.activations);
  if (cuda) {
    row("GEMM workspaces", p.engine, p.engine);
    if (p.cudnn > 0) row("cuDNN SDPA workspace", p.cudnn, p.cudnn);
    if (p.input.device_bytes > 0)
      std::snprintf(line, sizeof line, "  %-22s %9.3f GiB per rank of %.3f GiB free on its device: %s\n", "device total",
                    gib(p.device_total), gib(p.input.device_bytes), p.device_fits ? "fits" : "does NOT fit");
    else
      std::snprintf(line, sizeof line, "  %-22s %9.3f GiB per rank (the device's memory is unknown here)\n",
                    "device total", gib(p.device_total));
    os << line;
    os << "  in each rank's host memory:\n";
  } else if (p.comm_scratch_rank0 + p.comm_scratch_other > 0) {
    row("reduce-scatter (MPI)", p.comm_scratch_rank0, p.comm_scratch_other);
  }
  row("checkpoint", p.checkpoint_rank0, p.checkpoint_other);
  row("prefetch ring", p.prefetch, p.prefetch);
  row("runtime", p.runtime, p.runtime);
  row(cuda ? "host total" : "total", p.rank0_total, p.other_total);
  if (p.machine_bytes > 0)
    std::snprintf(line, sizeof line, "  node: %.3f GiB for %d ranks of %.3f GiB on this machine: %s\n",
                  gib(p.node_total), p.input.ranks_per_node, gib(p.machine_bytes),
                  p.node_total <= p.machine_bytes ? "fits" : "does NOT fit");
  else
    std::snprintf(line, sizeof line, "  node: %.3f GiB for %d ranks (this machine's memory is unknown)\n",
                  gib(p.node_total), p.input.ranks_per_node);
  os << line;
  if (!p.fits) os << "  " << (p.advice.empty() ? "no setting kilter can change fits" : "fits with: " + p.advice) << "\n";
  return os.str();
}

nlohmann::json memory_plan_json(const MemoryPlan& p) {
  return {{"backend", p.input.backend},
          {"world_size", p.input.world_size},
          {"ranks_per_node", p.input.ranks_per_node},
          {"precision", p.input.cfg.train.precision},
          {"shard_optimizer", p.sharded},
          {"shard", p.shard},
          {"shard_group", p.shard_group},
          {"grad_dtype", p.grad_dtype},
          {"reshard_after_forward", p.input.cfg.train.reshard_after_forward},
          {"unit_floats", p.unit_floats},
          {"gathered_bytes", p.gathered},
          {"recompute", p.input.cfg.train.recompute},
          {"max_tokens", p.input.cfg.data.max_tokens},
          {"num_params", p.num_params},
          {"parameters_bytes", p.parameters},
          {"gradients_bytes", p.gradients},
          {"optimizer_bytes", p.optimizer},
          {"activations_bytes", p.activations},
          {"comm_scratch_bytes_rank0", p.comm_scratch_rank0},
          {"comm_scratch_bytes_other", p.comm_scratch_other},
          {"checkpoint_bytes_rank0", p.checkpoint_rank0},
          {"checkpoint_bytes_other", p.checkpoint_other},
          {"prefetch_bytes", p.prefetch},
          {"runtime_bytes", p.runtime},
          {"rank0_bytes", p.rank0_total},
          {"other_rank_bytes", p.other_total},
          {"node_bytes", p.node_total},
          {"machine_bytes", p.machine_bytes},
          {"engine_bytes", p.engine},
          {"cudnn_bytes", p.cudnn},
          {"device_total_bytes", p.device_total},
          {"device_bytes", p.input.device_bytes},
          {"device_fits", p.device_fits},
          {"fits", p.fits},
          {"advice", p.advice}};
}

std::string memory_refusal(const MemoryPlan& p) {
  std::ostringstream os;
  char line[400];
  if (!p.device_fits)
    std::snprintf(line, sizeof line,
                  "this run needs %.2f GiB of device memory per rank (parameters, gradients, optimizer state and "
                  "activations of data.max_tokens %lld), and this rank's device has %.2f GiB free; ",
                  gib(p.device_total), (long long)p.input.cfg.data.max_tokens, gib(p.input.device_bytes));
  else
    std::snprintf(line, sizeof line,
                  "this run needs %.2f GiB per node (%d ranks: %.2f GiB on rank 0, %.2f GiB on each other), and this "
                  "machine has %.2f GiB; ",
                  gib(p.node_total), p.input.ranks_per_node, gib(p.rank0_total), gib(p.other_total),
                  gib(p.machine_bytes));
  os << line;
  if (!p.advice.empty())
    os << "the cheapest setting that fits: " << p.advice;
  else
    os << "no setting kilter can change makes it fit: use a smaller model or machines with more memory";
  os << "\n" << format_memory_plan(p);
  return os.str();
}

void check_memory_plan(MPI_Comm world, const Config& cfg, int ranks_per_node, bool resuming,
                       const std::string& backend) {
  MemoryPlanInput in;
  in.backend = backend;
  if (backend == "cuda") in.device_bytes = device_memory_bytes();
  in.cfg = cfg;
  MPI_Comm_size(world, &in.world_size);
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  in.ranks_per_node = ranks_per_node;
  in.resuming = resuming;
  const MemoryPlan plan = plan_memory(in);
  // The first rank whose node cannot hold the run tells the others why (its plan in the error).
  int refusing = plan.fits ? in.world_size : rank;
  MPI_Allreduce(MPI_IN_PLACE, &refusing, 1, MPI_INT, MPI_MIN, world);
  if (refusing == in.world_size) {
    if (rank == 0) std::fprintf(stderr, "kilter: %s", format_memory_plan(plan).c_str());
    return;
  }
  std::string message = rank == refusing ? memory_refusal(plan) : std::string();
  long long length = (long long)message.size();
  MPI_Bcast(&length, 1, MPI_LONG_LONG, refusing, world);
  message.resize(size_t(length));
  MPI_Bcast(message.data(), int(length), MPI_CHAR, refusing, world);
  KILTER_USER_FAIL(message);
}

}  // namespace kilter::train
