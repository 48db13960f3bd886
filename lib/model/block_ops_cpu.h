// The CPU's op tables of the block schedule (block_schedule.h), over the memory their owner hands
// them (BlockMemory, block_names.h; the CPU backend, the KV-cache generator): the fp32 table runs
// the kernels of lib/model (the oracle; with precision bf16 their GEMMs take bf16 inputs under the
// owner's Bf16MatmulScope), the bf16-storage table the CPU twins of the CUDA kernels (bf16_ops.h,
// attention_bf16.h), rounding where the device stores bf16.
#pragma once
#include <memory>

#include "lib/model/block_names.h"
#include "lib/model/block_schedule.h"

namespace kilter::model {

// bf16_gemm: the fp32 table's bf16-GEMM precision; bf16_storage: the bf16-storage table.
std::unique_ptr<BlockOps> make_cpu_block_ops(const ModelSpec& spec, const BlockMemory& memory, bool bf16_gemm,
                                             bool bf16_storage, Recompute recompute);

}  // namespace kilter::model
