#pragma once
// Decode matrix-vector products for IQ2_XXS weights (the routed gate and up experts of the q2
// files) on the device, against Q8_K activations (q8_k_quantize.h).
//
// Layout: ggml's 66-byte blocks (f16 d, then 64 bytes of groups) are 2-byte aligned; repacked
// once at load time into a plane of the 64-byte group data (16-byte aligned: one 16-byte load is
// two groups, 64 values) and a plane of the f16 scales. Same bytes as the file.
//
// A launch covers the rows of several experts of one [n_experts][n_rows][k] tensor: the ids of
// the experts to use are read on the device (ids[i] for output slot i), so the router's
// selection never goes through the host. y[i * n_rows + r] = row r of expert ids[i] times x.
// The terms are the CPU's vec_dot_iq2_xxs_q8_K: per super-block (f16(d) * dx) * float(block
// sum), summed, times 1/8; only the order of the float additions differs.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/expert_groups.h"
#include "backend/cuda/expert_table.h"
#include "backend/cuda/q8_k_quantize.h"

namespace ds4::cuda {

struct Iq2xxsExperts {
    const uint8_t *qs = nullptr;  // [n_experts][n_rows][k / 256][64]
    const uint16_t *d = nullptr;  // [n_experts][n_rows][k / 256]
    int64_t n_rows = 0, k = 0, n_experts = 0;
    ExpertTable table;  // each expert's qs and d planes: what the kernels read
};

// The repacked planes on the host: the CPU twin of the device layout.
struct Iq2xxsPlanes {
    std::vector<uint8_t> qs;
    std::vector<uint16_t> d;
};
Iq2xxsPlanes repack_iq2_xxs(const void *ggml_blocks, int64_t n_blocks);

class Iq2xxsWeights {
  public:
    // n_experts matrices of n_rows rows of k values (k a multiple of 256), ggml blocks back to
    // back (a 2-D matrix is n_experts = 1).
    Iq2xxsWeights(const void *ggml_blocks, int64_t n_rows, int64_t k, int64_t n_experts = 1);
    // The planes are elsewhere (a streaming tier's slots): the kernels reach expert e through
    // `table` only (qs and d of the view are null).
    Iq2xxsWeights(int64_t n_rows, int64_t k, int64_t n_experts, const ExpertTable &table);
    const Iq2xxsExperts &experts() const { return view_; }

  private:
    DeviceBuffer qs_, d_;
    ResidentExpertTable table_;
    Iq2xxsExperts view_;
};

// ids: n_ids expert ids in device memory (a negative id: slot i is left out, its outputs not
// written); y: n_ids * n_rows floats. x is one activation row for every slot, or (x_per_slot)
// n_ids rows back to back, row i for slot i.
void matvec_iq2_xxs(const Iq2xxsExperts &w, const int32_t *ids, int n_ids, const Q8_KActivation &x,
                    float *y, cudaStream_t stream, bool x_per_slot = false);

// matvec_iq2_xxs of two tensors of one shape with the same ids and x (the routed gate and up)
// in one launch: ya from a, yb from b, each the bits of its own launch.
void matvec_iq2_xxs_pair(const Iq2xxsExperts &a, const Iq2xxsExperts &b, const int32_t *ids,
                         int n_ids, const Q8_KActivation &x, float *ya, float *yb,
                         cudaStream_t stream);

// A prefill chunk's pairs grouped by expert (expert_groups.h, expert_matmul.cuh): y[p * n_rows + r]
// is row r of pair p's expert times the pair's activation row, the bits matvec_iq2_xxs gives it.
void matmul_iq2_xxs_grouped(const Iq2xxsExperts &w, const ExpertGroups &groups,
                            const Q8_KActivation &x, float *y, cudaStream_t stream);

}  // namespace ds4::cuda
