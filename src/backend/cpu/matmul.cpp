#include "backend/cpu/matmul.h"

#include <algorithm>
#include <string>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "common/error.h"
#include "quant/quant.h"

namespace ds4::backend::cpu {
namespace {

// Chunking of the weight rows. Chunks are claimed from a shared counter, so there are several
// per thread (a thread that is descheduled or slowed by a neighbour gets fewer), but each stays
// large enough that the claim and the restart of the hardware prefetcher are lost in the
// streaming. Matrices under kMinChunkBytes run on the caller alone.
constexpr int64_t kChunksPerThread = 8;
constexpr int64_t kMinChunkBytes = int64_t{32} << 10;
constexpr int64_t kMaxChunkBytes = int64_t{1} << 20;

int64_t rows_per_chunk(int64_t n_rows, size_t row_bytes, int n_threads) {
    const int64_t bytes = static_cast<int64_t>(row_bytes);
    const int64_t min_rows = std::max<int64_t>(1, kMinChunkBytes / bytes);
    const int64_t max_rows = std::max<int64_t>(min_rows, kMaxChunkBytes / bytes);
    const int64_t share =
        (n_rows + kChunksPerThread * n_threads - 1) / (kChunksPerThread * n_threads);
    return std::clamp(share, min_rows, max_rows);
}

// The chunk for a product of m activation rows: rows_per_chunk, rounded up to whole panels of
// the format's multi-row kernel when it will take the chunk in panels (quant.h multi_row_panel).
int64_t rows_per_chunk(const WeightMatrix &w, int64_t m, int n_threads) {
    const int64_t rows = rows_per_chunk(w.n_rows, w.row_stride, n_threads);
    const int64_t panel = quant::kernels(w.type).multi_row_panel;
    if (m <= 1 || panel <= 1) return rows;
    return (rows + panel - 1) / panel * panel;
}

// The multi-row kernel's tables for x, built once for every chunk of a product (empty when the
// format's kernel has none, or will not take these rows).
std::vector<uint8_t> multi_tables(const WeightMatrix &w, const ActivationRows &x) {
    const quant::TypeKernels &kern = quant::kernels(w.type);
    const bool multi = kern.vec_dot_multi != nullptr && (x.m > 1 || kern.vec_dot_multi_for_one_row);
    if (!multi || kern.multi_tables.bytes == nullptr) return {};
    std::vector<uint8_t> tables(kern.multi_tables.bytes(w.k, x.m));
    if (!tables.empty()) kern.multi_tables.make(w.k, x.data, x.row_stride, x.m, tables.data());
    return tables;
}

void check_weight(const WeightMatrix &w) {
    if (w.n_rows < 0 || w.k <= 0)
        throw Error("matmul: bad weight shape " + std::to_string(w.n_rows) + " x " +
                    std::to_string(w.k));
    if (!quant::is_supported(w.type) || quant::kernels(w.type).vec_dot == nullptr)
        throw Error("matmul: weight type " + std::string(ggml_type_name(w.type)) +
                    " has no CPU dot product");
    const size_t row_bytes = quant::row_size(w.type, w.k);  // throws if k splits a block
    if (w.row_stride < row_bytes)
        throw Error("matmul: row stride " + std::to_string(w.row_stride) +
                    " is shorter than a row (" + std::to_string(row_bytes) + " bytes)");
    if (w.data == nullptr && w.n_rows > 0) throw Error("matmul: null weight pointer");
}

// x must be in the format and layout of W's dot product, with W's row length.
void check_activations(const WeightMatrix &w, const ActivationRows &x) {
    const quant::TypeKernels &kern = quant::kernels(w.type);
    if (x.type != kern.vec_dot_type || x.k != w.k)
        throw Error("matmul: activations are " + std::string(ggml_type_name(x.type)) + " x " +
                    std::to_string(x.k) + ", the " + std::string(ggml_type_name(w.type)) +
                    " weight needs " + std::string(ggml_type_name(kern.vec_dot_type)) + " x " +
                    std::to_string(w.k));
    if (x.layout != kern.activation_layout)
        throw Error("matmul: the activations were quantized for another kernel's layout than the " +
                    std::string(ggml_type_name(w.type)) + " weight's (quantize_activations)");
}

// Rows [row_begin, row_end) of Y = X W^T (Y: x.m rows of w.n_rows, y_stride apart). Row-outer,
// batch-inner: a
// weight row is fetched from memory once and reused x.m times from L1 (decoded once, where the
// format has a multi-row dot); the activation rows (x.m x ~1.1 bytes x k) stay in L2.
void product_rows(const WeightMatrix &w, const ActivationRows &x,
                  const std::vector<uint8_t> &tables, float *Y, int64_t y_stride, int64_t row_begin,
                  int64_t row_end) {
    const quant::TypeKernels &kern = quant::kernels(w.type);
    const auto *w_bytes = static_cast<const uint8_t *>(w.data);
    const auto *x_bytes = static_cast<const uint8_t *>(x.data);
    const int64_t n = y_stride, m = x.m, k = w.k;
    if (!tables.empty()) {
        kern.multi_tables.dot(k, w_bytes + static_cast<size_t>(row_begin) * w.row_stride,
                              w.row_stride, row_end - row_begin, x_bytes, x.row_stride, m,
                              tables.data(), Y + row_begin, n);
        return;
    }
    if (kern.vec_dot_multi != nullptr && (m > 1 || kern.vec_dot_multi_for_one_row)) {
        kern.vec_dot_multi(k, w_bytes + static_cast<size_t>(row_begin) * w.row_stride, w.row_stride,
                           row_end - row_begin, x_bytes, x.row_stride, m, Y + row_begin, n);
        return;
    }
    for (int64_t r = row_begin; r < row_end; ++r) {
        const uint8_t *w_row = w_bytes + static_cast<size_t>(r) * w.row_stride;
        for (int64_t j = 0; j < m; ++j)
            Y[j * n + r] = kern.vec_dot(k, w_row, x_bytes + static_cast<size_t>(j) * x.row_stride);
    }
}

}  // namespace

WeightMatrix dense_matrix(GgmlType type, const void *data, int64_t n_rows, int64_t k) {
    if (n_rows < 0 || k <= 0)
        throw Error("matmul: bad weight shape " + std::to_string(n_rows) + " x " +
                    std::to_string(k));
    return {type, data, n_rows, k, static_cast<size_t>(ggml_row_bytes(type, k))};
}

WeightMatrix expert_matrix(GgmlType type, const void *data, int64_t n_rows, int64_t k,
                           int64_t expert) {
    if (expert < 0) throw Error("expert_matrix: negative expert index " + std::to_string(expert));
    WeightMatrix w = dense_matrix(type, data, n_rows, k);
    w.data = static_cast<const uint8_t *>(data) +
             static_cast<size_t>(expert) * static_cast<size_t>(n_rows) * w.row_stride;
    return w;
}

void matmul_activations(ThreadPool &pool, const WeightMatrix &w, const ActivationRows &x,
                        float *Y) {
    check_weight(w);
    check_activations(w, x);
    if (x.m <= 0 || w.n_rows == 0) return;

    const std::vector<uint8_t> tables = multi_tables(w, x);
    pool.parallel_for(w.n_rows, rows_per_chunk(w, x.m, pool.n_threads()),
                      [&](int64_t row_begin, int64_t row_end, int) {
                          product_rows(w, x, tables, Y, w.n_rows, row_begin, row_end);
                      });
}

void matmul_activations_here(const WeightMatrix &w, const ActivationRows &x, float *Y) {
    check_weight(w);
    check_activations(w, x);
    if (x.m <= 0 || w.n_rows == 0) return;
    product_rows(w, x, multi_tables(w, x), Y, w.n_rows, 0, w.n_rows);
}

ActivationRows activation_rows(const ActivationRows &x, int64_t first, int64_t count) {
    if (first < 0 || count < 0 || first > x.m || count > x.m - first)
        throw Error("activation_rows: rows " + std::to_string(first) + " + " +
                    std::to_string(count) + " of " + std::to_string(x.m));
    ActivationRows view = x;
    view.data = static_cast<const uint8_t *>(x.data) + static_cast<size_t>(first) * x.row_stride;
    view.m = count;
    return view;
}

void matmul_many(ThreadPool &pool, std::span<const MatrixProduct> products) {
    struct Chunk {
        size_t product;
        int64_t begin, end;
    };
    std::vector<Chunk> chunks;
    // Each product's tables; products that share their activation rows (an expert's gate and up)
    // share them.
    std::vector<std::vector<uint8_t>> tables;
    std::vector<size_t> tables_of(products.size(), 0);
    for (size_t p = 0; p < products.size(); ++p) {
        const MatrixProduct &mp = products[p];
        check_weight(mp.w);
        check_activations(mp.w, mp.x);
        if (mp.y_stride != 0 && mp.y_stride < mp.w.n_rows)
            throw Error("matmul_many: product " + std::to_string(p) + " has output rows " +
                        std::to_string(mp.y_stride) + " floats apart, shorter than its " +
                        std::to_string(mp.w.n_rows) + " rows");
        if (mp.x.m <= 0) continue;
        const MatrixProduct *prev = p > 0 ? &products[p - 1] : nullptr;
        if (prev != nullptr && prev->x.m > 0 && mp.x.data == prev->x.data && mp.x.m == prev->x.m &&
            mp.x.row_stride == prev->x.row_stride && mp.w.type == prev->w.type &&
            mp.w.k == prev->w.k) {
            tables_of[p] = tables_of[p - 1];
        } else {
            tables_of[p] = tables.size();
            tables.push_back(multi_tables(mp.w, mp.x));
        }
        const int64_t chunk = rows_per_chunk(mp.w, mp.x.m, pool.n_threads());
        for (int64_t r = 0; r < mp.w.n_rows; r += chunk)
            chunks.push_back({p, r, std::min(mp.w.n_rows, r + chunk)});
    }
    pool.parallel_for(int64_t(chunks.size()), 1, [&](int64_t c0, int64_t c1, int) {
        for (int64_t c = c0; c < c1; ++c) {
            const Chunk &ch = chunks[size_t(c)];
            const MatrixProduct &mp = products[ch.product];
            product_rows(mp.w, mp.x, tables[tables_of[ch.product]], mp.Y,
                         mp.y_stride > 0 ? mp.y_stride : mp.w.n_rows, ch.begin, ch.end);
        }
    });
}

void matmul(ThreadPool &pool, ScratchBuffer &scratch, const WeightMatrix &w, const float *X,
            int64_t m, float *Y) {
    check_weight(w);
    if (m < 0) throw Error("matmul: negative batch " + std::to_string(m));
    if (m == 0) return;
    const ActivationRows x = quantize_activations(pool, scratch, w.type, X, m, w.k);
    matmul_activations(pool, w, x, Y);
}

void matmul(ThreadPool &pool, ScratchBuffer &scratch, GgmlType type, const void *w, int64_t n_rows,
            int64_t k, const float *X, int64_t m, float *Y) {
    matmul(pool, scratch, dense_matrix(type, w, n_rows, k), X, m, Y);
}

void matvec(ThreadPool &pool, ScratchBuffer &scratch, const WeightMatrix &w, const float *x,
            float *y) {
    matmul(pool, scratch, w, x, 1, y);
}

void matvec(ThreadPool &pool, ScratchBuffer &scratch, GgmlType type, const void *w, int64_t n_rows,
            int64_t k, const float *x, float *y) {
    matmul(pool, scratch, dense_matrix(type, w, n_rows, k), x, 1, y);
}

}  // namespace ds4::backend::cpu
