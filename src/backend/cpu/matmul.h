#pragma once
// Matrix-vector and small matrix-matrix products over the block formats.
//
//   matvec : y[n]    = sum_k W[n][k] x[k]           (decode, one token)
//   matmul : Y[j][n] = sum_k W[n][k] X[j][k]        (prefill, a small batch of m rows)
//
// W is a weight matrix in ggml layout: n_rows rows of k values in one block format, each row a
// run of blocks. The activations are first brought into the format the weight's dot product
// expects (activations.h), once per row, then rows of W are split over the pool's threads in
// contiguous chunks. Within a chunk each weight row is dotted with all m activation rows while
// it is in L1, so W is read from memory once whatever m is.
//
// Every output element has the bits of the format's vec_dot on (weight row, activation row) (one
// call of it, or a multi-row kernel that computes the same operations: quant.h VecDotMultiFn), so
// the result does not depend on the thread count, and matmul equals m matvecs bit for bit.
#include <cstddef>
#include <cstdint>
#include <span>

#include "backend/cpu/activations.h"
#include "gguf/ggml_type.h"

namespace ds4::backend::cpu {

class ThreadPool;

// n_rows rows of k values in `type`; row r starts at data + r * row_stride bytes.
struct WeightMatrix {
    ds4::GgmlType type;
    const void *data;
    int64_t n_rows;
    int64_t k;
    size_t row_stride;
};

// A dense matrix: rows back to back (row_stride = ggml_row_bytes(type, k)).
WeightMatrix dense_matrix(ds4::GgmlType type, const void *data, int64_t n_rows, int64_t k);
// Expert `expert` of a 3-D tensor of n_expert matrices [n_rows][k] stored back to back (ggml
// ne = {k, n_rows, n_expert}): a view of its rows, no copy.
WeightMatrix expert_matrix(ds4::GgmlType type, const void *data, int64_t n_rows, int64_t k,
                           int64_t expert);

// y = W x. x holds k floats, y receives n_rows floats.
void matvec(ThreadPool &pool, ScratchBuffer &scratch, const WeightMatrix &w, const float *x,
            float *y);
void matvec(ThreadPool &pool, ScratchBuffer &scratch, ds4::GgmlType type, const void *w,
            int64_t n_rows, int64_t k, const float *x, float *y);

// Y = X W^T. X is m rows of k floats (dense), Y is m rows of n_rows floats (dense).
void matmul(ThreadPool &pool, ScratchBuffer &scratch, const WeightMatrix &w, const float *X,
            int64_t m, float *Y);
void matmul(ThreadPool &pool, ScratchBuffer &scratch, ds4::GgmlType type, const void *w,
            int64_t n_rows, int64_t k, const float *X, int64_t m, float *Y);

// Y = X W^T with activations already in W's vec_dot format (quantize_activations), for inputs
// shared by several matrices. Y is m rows of n_rows floats (dense).
void matmul_activations(ThreadPool &pool, const WeightMatrix &w, const ActivationRows &x, float *Y);
// The same product on the calling thread alone (the same bits): for a caller that splits its
// work over the pool by activation rows instead, e.g. a matrix of a few dozen rows that each of
// many tokens multiplies while its activation row is still in cache.
void matmul_activations_here(const WeightMatrix &w, const ActivationRows &x, float *Y);

// Rows [first, first + count) of x: a view, no copy. Throws if they are not all rows of x.
ActivationRows activation_rows(const ActivationRows &x, int64_t first, int64_t count);

// One product of matmul_many: Y = X W^T, X being all x.m rows of x (in W's vec_dot format), Y
// x.m rows of w.n_rows floats, y_stride floats apart (0: dense, w.n_rows).
struct MatrixProduct {
    WeightMatrix w;
    ActivationRows x;
    float *Y;
    int64_t y_stride = 0;
};

// Several products in one parallel loop over all their weight rows (a chunk never spans two
// products), each chunk computed as matmul_activations computes it: the bits of running them
// one by one, with one dispatch to the pool instead of one per product. A layer's routed experts
// are up to n_expert products of a few MB each (a decode step's: a dozen with one row each),
// too small to fill the pool one at a time.
void matmul_many(ThreadPool &pool, std::span<const MatrixProduct> products);

}  // namespace ds4::backend::cpu
