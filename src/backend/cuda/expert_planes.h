#pragma once
// How a routed-expert format's ggml blocks split into the two planes its kernels read
// (host_upload.h): plane a holds each block's bytes [seg_off, seg_off + seg_len) back to back,
// plane b the block's other bytes, in order. These are the formats the routed kernels reach
// through an expert table (expert_table.h): IQ2_XXS (group data | f16 scale), Q2_K (quants |
// scales, d, dmin) and Q4_K (quants | d, dmin, scales). The resident weights (*_matvec.cu) and
// the streamed experts' slots (runtime/cuda/device_expert_tier.h) both split blocks this way.
#include <cstdint>

#include "gguf/ggml_type.h"

namespace ds4::cuda {

struct BlockSplit {
    int block_bytes = 0, seg_off = 0, seg_len = 0;
    int rest() const { return block_bytes - seg_len; }  // plane b's bytes of a block
};

// Whether the routed kernels read `type` through an expert table.
bool has_block_split(GgmlType type);
// The split of `type`; throws ds4::Error for a type without one.
BlockSplit block_split(GgmlType type);

}  // namespace ds4::cuda
