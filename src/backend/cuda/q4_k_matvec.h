#pragma once
// Decode matrix-vector products for Q4_K weights (the routed experts of the q4 files) on the
// device, against Q8_K activations, with the expert ids read on the device as for IQ2_XXS and
// Q2_K (expert_matvec.cuh): y[i * n_rows + r] = row r of expert ids[i] times x.
//
// Layout: ggml's 144-byte blocks (f16 d, f16 dmin, 12 bytes of packed 6-bit scales and mins,
// 128 bytes of 4-bit quants) are repacked once into a plane of the 128 quant bytes and a plane of
// the 16-byte block headers (d, dmin, scales), both 16-byte aligned. Same bytes as the file.
// The terms are the CPU's vec_dot_q4_K_q8_K: per super-block
//   (dx * f16(d)) * float(sum_j sc_j sum_{l in j} q_l qx_l)
//     - (dx * f16(dmin)) * float(sum_j m_j (bsums_2j + bsums_2j+1))
// summed over super-blocks; only the order of the float additions differs.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/expert_groups.h"
#include "backend/cuda/expert_table.h"
#include "backend/cuda/q8_k_quantize.h"

namespace ds4::cuda {

struct Q4KExperts {
    const uint8_t *qs = nullptr;       // [n_experts][n_rows][k / 256][128]
    const uint8_t *headers = nullptr;  // [n_experts][n_rows][k / 256][16]
    int64_t n_rows = 0, k = 0, n_experts = 0;
    ExpertTable table;  // each expert's qs and headers planes: what the kernels read
};

struct Q4KPlanes {
    std::vector<uint8_t> qs, headers;
};
Q4KPlanes repack_q4_K(const void *ggml_blocks, int64_t n_blocks);

class Q4KWeights {
  public:
    Q4KWeights(const void *ggml_blocks, int64_t n_rows, int64_t k, int64_t n_experts = 1);
    // The planes are elsewhere (as Iq2xxsWeights's table constructor).
    Q4KWeights(int64_t n_rows, int64_t k, int64_t n_experts, const ExpertTable &table);
    const Q4KExperts &experts() const { return view_; }

  private:
    DeviceBuffer qs_, headers_;
    ResidentExpertTable table_;
    Q4KExperts view_;
};

// As matvec_q2_K (q2_k_matvec.h).
void matvec_q4_K(const Q4KExperts &w, const int32_t *ids, int n_ids, const Q8_KActivation &x,
                 float *y, cudaStream_t stream, bool x_per_slot = false);
// matvec_q4_K of two tensors of one shape with the same ids and x (the routed gate and up of the
// q4 files) in one launch, each output the bits of its own launch.
void matvec_q4_K_pair(const Q4KExperts &a, const Q4KExperts &b, const int32_t *ids, int n_ids,
                      const Q8_KActivation &x, float *ya, float *yb, cudaStream_t stream);

// A prefill chunk's pairs grouped by expert (expert_groups.h, expert_matmul.cuh): y[p * n_rows + r]
// is row r of pair p's expert times the pair's activation row, the bits matvec_q4_K gives it.
void matmul_q4_K_grouped(const Q4KExperts &w, const ExpertGroups &groups, const Q8_KActivation &x,
                         float *y, cudaStream_t stream);

}  // namespace ds4::cuda
