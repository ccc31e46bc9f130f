#pragma once
// The lightning indexer's scoring and top-k of a decode step on the device (docs/MODEL.md 4.5),
// twins of backend/cpu/indexer_score.h, bit for bit:
//   indexer_scores   w'_h = w_h * wscale; score_c = sum_h max(q_h . k_c, 0) * w'_h, each dot
//                    product over j and the sum over h in f32 and in index order, every product
//                    and addition rounded on its own (__fmul_rn / __fadd_rn: nvcc cannot fuse
//                    them), so the same operations in the same order as the CPU: equal bits.
//                    The dot products run in parallel (each a sequential f32 sum of its own),
//                    the sum over heads of a row on one thread. Up to 64 heads of a multiple of
//                    4 values, at most 128 (Flash's 64 x 128), q and rows 16-byte aligned: a
//                    thread keeps 4 heads x 4 rows of a 64-row tile in registers (q, the tile
//                    and the products in 82.5 KiB of shared memory), or, for one token of up to
//                    33,792 rows, 4 heads x 1 row of a 16-row tile (more blocks for a decode
//                    step's few hundred rows). Otherwise one head's dot a thread, q (padded
//                    rows), w' and a tile of 16 rows in n_heads (head_dim + 1) + n_heads + 16
//                    (head_dim + n_heads + 1) floats, at most 48 KiB.
//   top_k_ascending  the same set as the CPU's (std::partial_sort, a larger score first, the
//                    lower index on ties), written in ascending index order. Exact: an MSB-first
//                    radix select over the scores' order-preserving 32-bit keys (4 histogram
//                    passes of 8 bits, integer counts) finds the k-th largest key T and how many
//                    of the scores equal to T are taken (the lowest-index ones), then a
//                    block-wide scan over the selection flags writes the indices in order.
//                    -0 counts as +0 (they compare equal on the CPU too). Scores are assumed not
//                    NaN: the CPU's order is then not a strict weak order and its result is not
//                    defined, so there is nothing to match. One block of 1024 threads, O(n) work
//                    (7 reads of the scores): n = 262144 (1M context / 4) reads 7 MiB from L2.
//                    Deterministic (integer counts only).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ds4::cuda {

// Several tokens in one launch (prefill): token t's q at + t n_heads head_dim, w at + t n_heads,
// scores at + t n_rows (the launch's n_rows), selection at + t k, counts at + t word_stride.
struct IndexerTokens {
    int n = 1;
    int64_t word_stride = 0;
};

// q: [n_heads][head_dim]; w: [n_heads] (unchanged); rows: [n_rows][head_dim] back to back;
// score: [n_rows] (all device). n_heads at most 256.
// n_rows_dev (device, optional): the row count read on the device, at most n_rows (which then
// sizes the grid), for a step captured once and replayed at every position.
void indexer_scores(const float *q, const float *w, float wscale, const float *rows, int64_t n_rows,
                    int n_heads, int head_dim, float *score, cudaStream_t stream,
                    const int64_t *n_rows_dev = nullptr, IndexerTokens tokens = {});

// Scratch that top_k_ascending needs for n scores (0 for the present single-block method;
// callers allocate what this says, so a later multi-block method can use it).
size_t top_k_scratch_bytes(int64_t n);

// score: n values; out: k indices (0 <= k <= n < 2^31; all device; k = 0 writes nothing). The
// runtime takes every row when there are at most k, so n < k is not a case.
// n_dev (device, optional): the count read on the device, at most n; while it is at most k
// nothing is written (the caller then takes every row).
void top_k_ascending(const float *score, int64_t n, int64_t k, int32_t *out, void *scratch,
                     cudaStream_t stream, const int64_t *n_dev = nullptr,
                     IndexerTokens tokens = {});

}  // namespace ds4::cuda
