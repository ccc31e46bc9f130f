#pragma once
// Where every weight and every layer's attention state goes on several GPUs (docs/MULTI_GPU.md).
// Pure arithmetic on the tensor layout (model/tensor_layout.h) and the file's tensor types: no
// device is touched, so the plan is tested on any machine and printed before anything is copied.
//
// Two ways to split a model over N GPUs:
//   Layers  (pipeline): each GPU holds whole layers, a contiguous range chosen so that the
//           largest GPU share is as small as possible; the token embedding sits with the first
//           layer, the output head with the last. The hidden state crosses to the next GPU once
//           per range. For models larger than one card.
//   Tensors (tensor parallel, for decode speed): each GPU reads 1/N of every large matrix and
//           does 1/N of the heads and of every expert's hidden width; the partial sums of each
//           sublayer's output projection are added (runtime/forward.cpp). Small tensors (norms, the
//           hyper-connection mixers, q_a / kv, the compressors and indexer, the router) are
//           copied to every GPU, and so is each layer's attention state (one KV head, which every
//           GPU's heads read).
// Shards follow units that keep the math per GPU whole: an output group of heads for the
// attention (q_b rows, sinks, output_a rows, output_b columns), a block of every down
// projection's format for the expert hidden width (gate/up rows, down columns: the least common
// multiple over the routed and shared downs of every layer, so no block is cut), a row of
// the vocabulary for the head. Units are dealt as evenly as they divide: GPU g of N gets units
// [U g / N, U (g + 1) / N), which may be empty when there are fewer units than GPUs.
#include <cstdint>
#include <string>
#include <vector>

#include "model/hparams.h"
#include "model/weights.h"

namespace ds4::runtime {

enum class GpuSplit { Layers, Tensors };
const char *gpu_split_name(GpuSplit s);  // "layers" | "tensors"
// "layers" | "tensors"; throws ds4::Error naming the choices otherwise.
GpuSplit parse_gpu_split(const std::string &name);

// How one tensor is held. Whole: the tensor on the GPUs whose range is {0, 1}; Rows / Columns:
// the range of rows (ne[1]) or of input columns (ne[0]) each GPU holds, for every expert of a
// 3-D tensor.
enum class ShardAxis { Whole, Rows, Columns };

struct TensorPlacement {
    std::string name;
    int layer = -1;  // -1: a global tensor
    uint64_t bytes = 0;
    ShardAxis axis = ShardAxis::Whole;
    uint64_t extent = 1;  // rows or columns along the axis (1 for Whole)
    struct Range {
        uint64_t begin = 0, end = 0;
    };
    std::vector<Range> ranges;        // per GPU
    std::vector<uint64_t> gpu_bytes;  // per GPU: the bytes of its part
};

struct GpuShare {
    uint64_t weight_bytes = 0;
    uint64_t replicated_bytes = 0;  // of weight_bytes: tensors every GPU holds (Tensors split)
    uint64_t state_bytes = 0;       // attention state of its layers for the planned context
    uint32_t first_layer = 0, end_layer = 0;  // Layers split: its layers [first, end)
    uint64_t total() const { return weight_bytes + state_bytes; }
};

struct GpuPlacement {
    GpuSplit split = GpuSplit::Layers;
    uint32_t ctx = 0;
    std::vector<GpuShare> gpus;
    std::vector<TensorPlacement> tensors;  // in file order
};

// The attention state is counted as the CUDA backend allocates it for ctx positions and prefill
// batches of max_batch tokens (runtime/kv_cache.h layer_state_bytes: f32 values, the ring holding
// the window and a batch). Throws ds4::Error for n_gpus of 0, or, for the Layers split, more GPUs
// than layers.
GpuPlacement plan_gpu_placement(const model::HParams &hp, const model::ModelWeights &w,
                                GpuSplit split, uint32_t n_gpus, uint32_t ctx, uint32_t max_batch);

// Throws ds4::Error when a GPU's share plus `headroom` (what the backend needs besides weights
// and state: its scratch for a batch, the CUDA context, NCCL's buffers) is more than its free
// memory, naming each such GPU, what it needs and what it has, and what would help (more GPUs,
// a shorter context, the other split).
void check_placement_fits(const GpuPlacement &p, const std::vector<uint64_t> &free_bytes,
                          uint64_t headroom);

// The start-up log: one line per GPU, its layers or its shards, weights and state in GiB.
std::string describe_placement(const model::HParams &hp, const GpuPlacement &p);

}  // namespace ds4::runtime
