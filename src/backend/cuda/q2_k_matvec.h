#pragma once
// Decode matrix-vector products for Q2_K weights (the routed down experts of the q2 files) on
// the device, against Q8_K activations (q8_k_quantize.h), with the expert ids read on the device
// as for IQ2_XXS (iq2_xxs_matvec.h): y[i * n_rows + r] = row r of expert ids[i] times x.
//
// Layout: ggml's 84-byte blocks (16 scale bytes, 64 bytes of 2-bit quants, f16 d, f16 dmin)
// are repacked once into a plane of the 64 quant bytes (16-byte aligned) and a plane of 20-byte
// records (the 16 scale bytes, then d and dmin). Same bytes as the file.
// The terms are the CPU's vec_dot_q2_K_q8_K: per super-block
//   (dx * f16(d)) * float(sum_k sc_k sum_{l in k} q_l qx_l) - (dx * f16(dmin)) * float(sum_k m_k
//   bsums_k)
// summed over super-blocks; only the order of the float additions differs.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/expert_groups.h"
#include "backend/cuda/expert_table.h"
#include "backend/cuda/q8_k_quantize.h"

namespace ds4::cuda {

struct Q2KExperts {
    const uint8_t *qs = nullptr;       // [n_experts][n_rows][k / 256][64]
    const uint8_t *records = nullptr;  // [n_experts][n_rows][k / 256][20]
    int64_t n_rows = 0, k = 0, n_experts = 0;
    ExpertTable table;  // each expert's qs and records planes: what the kernels read
};

constexpr int kQ2KRecordBytes = 20;

// The repacked planes on the host: the CPU twin of the device layout.
struct Q2KPlanes {
    std::vector<uint8_t> qs, records;
};
Q2KPlanes repack_q2_K(const void *ggml_blocks, int64_t n_blocks);

class Q2KWeights {
  public:
    Q2KWeights(const void *ggml_blocks, int64_t n_rows, int64_t k, int64_t n_experts = 1);
    // The planes are elsewhere (as Iq2xxsWeights's table constructor).
    Q2KWeights(int64_t n_rows, int64_t k, int64_t n_experts, const ExpertTable &table);
    const Q2KExperts &experts() const { return view_; }

  private:
    DeviceBuffer qs_, records_;
    ResidentExpertTable table_;
    Q2KExperts view_;
};

void matvec_q2_K(const Q2KExperts &w, const int32_t *ids, int n_ids, const Q8_KActivation &x,
                 float *y, cudaStream_t stream, bool x_per_slot = false);

// A prefill chunk's pairs grouped by expert (expert_groups.h, expert_matmul.cuh): y[p * n_rows + r]
// is row r of pair p's expert times the pair's activation row, the bits matvec_q2_K gives it.
void matmul_q2_K_grouped(const Q2KExperts &w, const ExpertGroups &groups, const Q8_KActivation &x,
                         float *y, cudaStream_t stream);

}  // namespace ds4::cuda
