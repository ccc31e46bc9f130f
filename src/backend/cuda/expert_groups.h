#pragma once
// A prefill chunk's (token, slot) pairs grouped by expert on the device, so that the routed
// products read each selected expert's weights once per group of tokens (expert_matmul.cuh)
// instead of once per token, with no host synchronisation: the runtime's moe_routed_cpu groups
// the same pairs on the host (runtime/moe_routed.cpp).
//
// Pairs are numbered p = token * n_used + slot (the router's output order). offsets[e] ..
// offsets[e + 1] - 1 index `order`, which lists expert e's pairs in increasing p: a counting
// sort, stable and computed by one warp in pair order, so the grouping is the same every run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/error.h"

namespace ds4::cuda {

struct ExpertGroups {
    const int32_t *offsets = nullptr;  // [n_expert + 1], device
    const int32_t *order = nullptr;    // [n_pairs], device
    int n_expert = 0;
    // The activation row of pair p is p / x_div: n_used for the gate and up products (the
    // token's input), 1 for the down product (the pair's own SwiGLU row).
    int x_div = 1;
    // The tokens whose pairs these are (an expert has at most one pair a token when the router
    // chooses distinct experts, which sizes the grid of the grouped products).
    int n_tokens = 0;
};

// The grid of a grouped product (expert_matmul.cuh, expert_mma.cuh): for each expert
// (blockIdx.z) row_split blocks (blockIdx.y) for each tile of `tile` pairs (blockIdx.x). Tiles run
// in parallel up to the most an expert can have when each token selects it once (the router's
// distinct choices); an expert with more (a hash table naming it twice) loops over its tiles in
// the blocks of that many. The tiles are the grid's fastest index because blocks start in index
// order: an expert's tiles then read the same weight rows at about the same time, once from
// memory and the rest of the times from L2, instead of each tile passing over all the experts'
// weights after the other.
inline dim3 grouped_grid(const ExpertGroups &g, int row_split, int tile, const char *what) {
    if (g.n_expert <= 0 || g.n_expert > 65535)
        throw ds4::Error(std::string(what) + ": 1 to 65535 experts");
    const int64_t tiles = std::max<int64_t>(1, (int64_t(g.n_tokens) + tile - 1) / tile);
    return dim3(unsigned(std::min<int64_t>(tiles, 65535)), unsigned(row_split),
                unsigned(g.n_expert));
}

// ids: n_pairs expert ids (device), each in [0, n_expert) (the router's output); offsets and
// order as above (device, n_expert + 1 and n_pairs ints). n_expert <= 1024.
void group_by_expert(const int32_t *ids, int n_pairs, int n_expert, int32_t *offsets,
                     int32_t *order, cudaStream_t stream);

}  // namespace ds4::cuda
