#pragma once
// Decode matrix-vector product for Q8_0 weights on the device, y = W x, in three steps:
//
//   1. upload: ggml's 34-byte blocks (f16 scale, 32 int8 quants) put every row's quants at an
//      offset of 2 mod 4, so wide loads cannot reach them. The matrix is repacked once, at load
//      time, into two planes: the quants of each row back to back ([n_rows][k] int8, 16-byte
//      aligned because k is a multiple of 32) and the block scales ([n_rows][k/32] f16). Same
//      bytes as the file.
//   2. quantize_q8_0_activation: x to int8 blocks of 32 by ds4's rule, bit for bit the CPU's
//      quantize_row_q8_0_activation (d = amax / 127, q = round-half-even(x / d), NaN -> -128),
//      with the scale kept as the f32 value of its f16 rounding.
//   3. matvec_q8_0: per row, sum over blocks of float(sum_i qw_i qx_i) * (dw * dx), the same
//      integer sums and scales as the CPU's vec_dot_q8_0_q8_0; the order of the float additions
//      differs (per lane, then a fixed butterfly across the warp: deterministic run to run), and
//      nvcc may fuse a term's product into its addition, which the CPU keeps as two roundings
//      (docs/MODEL.md 5.1), so the two agree within float rounding, not bit for bit.
//
// matvec_q8_0_experts is the same kernel over several experts of one [n_experts][n_rows][k]
// tensor (the routed experts of the q8 files), with the expert ids read on the device as for
// the Q8_K formats (q2_k_matvec.h): y[i * n_rows + r] = row r of expert ids[i] times x. Every
// output has the dense product's terms and order: its bits are matvec_q8_0's on that expert.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/device_buffer.h"

namespace ds4::cuda {

// A repacked Q8_0 matrix in device memory (a view; the owner is Q8_0Weights).
struct Q8_0Matrix {
    const int8_t *qs = nullptr;   // [n_rows][k]
    const uint16_t *d = nullptr;  // [n_rows][k / 32], f16 bit patterns
    int64_t n_rows = 0;
    int64_t k = 0;
};

// The repacked layout on the host: the CPU twin of what upload_q8_0 puts on the device.
struct Q8_0Planes {
    std::vector<int8_t> qs;
    std::vector<uint16_t> d;
};
Q8_0Planes repack_q8_0(const void *ggml_rows, int64_t n_rows, int64_t k);

class Q8_0Weights {
  public:
    // Repacks n_experts matrices of n_rows rows of k values (k a multiple of 32; ggml Q8_0 rows
    // back to back, n_experts * n_rows of them) and copies them to the device. matrix() has
    // n_rows rows: those of one expert (of the matrix, when n_experts is 1).
    Q8_0Weights(const void *ggml_rows, int64_t n_rows, int64_t k, int64_t n_experts = 1);
    const Q8_0Matrix &matrix() const { return view_; }
    int64_t n_experts() const { return n_experts_; }

  private:
    DeviceBuffer qs_, d_;
    Q8_0Matrix view_;
    int64_t n_experts_ = 1;
};

// xq: k int8 (16-byte aligned), xd: k/32 floats. x, xq, xd in device memory.
void quantize_q8_0_activation(const float *x, int64_t k, int8_t *xq, float *xd,
                              cudaStream_t stream);
// y[n_rows] = W x, with x quantized by quantize_q8_0_activation.
void matvec_q8_0(const Q8_0Matrix &w, const int8_t *xq, const float *xd, float *y,
                 cudaStream_t stream);
// A batch of tokens (prefill): y[t][n_rows] = W x_t for t < n_tokens, xq and xd holding the
// tokens' quantized rows back to back (k int8 and k / 32 scales each). Below 32 tokens each weight
// piece read serves 8 tokens; from 32 the product runs on the tensor cores (q8_0_matmul.h).
// Either way every output has matvec_q8_0's bits for its token.
void matmul_q8_0(const Q8_0Matrix &w, const int8_t *xq, const float *xd, int64_t n_tokens, float *y,
                 cudaStream_t stream);
// The grouped product of a batch (the attention's output projection): w holds `groups` matrices
// of w.n_rows rows of w.k back to back; token t's row of groups * w.k values is split into the
// groups' slices; y[t][g][n_rows] = W_g slice_g(x_t). The bits of matvec_q8_0 on each group.
void matmul_q8_0_groups(const Q8_0Matrix &w, int groups, const int8_t *xq, const float *xd,
                        int64_t n_tokens, float *y, cudaStream_t stream);
// w: n_experts matrices of w.n_rows rows back to back (Q8_0Weights with n_experts); ids: n_ids
// expert ids (device; clamped into [0, n_experts): the caller validates them); y: n_ids *
// w.n_rows floats. xq, xd: one quantized activation row for every slot, or (x_per_slot) n_ids
// rows back to back (k int8 and k / 32 scales each), row i for slot i.
void matvec_q8_0_experts(const Q8_0Matrix &w, int64_t n_experts, const int32_t *ids, int n_ids,
                         const int8_t *xq, const float *xd, bool x_per_slot, float *y,
                         cudaStream_t stream);

}  // namespace ds4::cuda
