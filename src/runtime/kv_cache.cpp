#include "runtime/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/error.h"
#include "quant/kernels_ref.h"
#include "quant/quant.h"
#include "runtime/state_io.h"

namespace ds4::runtime {

RowStore::RowStore(uint32_t width, bool f16, size_t capacity)
    : width_(width), f16_(f16), capacity_(capacity) {
    if (f16_)
        h_.assign(capacity * width, 0);
    else
        f_.assign(capacity * width, 0.0f);
}

void RowStore::set(size_t i, const float *row) {
    if (i >= capacity_)
        throw Error("KV row store full: row " + std::to_string(i) + " of " +
                    std::to_string(capacity_));
    if (f16_) {
        uint16_t *dst = h_.data() + i * width_;
        for (uint32_t j = 0; j < width_; ++j) dst[j] = quant::ref::f32_to_f16(row[j]);
    } else {
        std::memcpy(f_.data() + i * width_, row, width_ * sizeof(float));
    }
    if (i + 1 > n_rows_) n_rows_ = i + 1;
}

void RowStore::push(const float *row) {
    set(n_rows_, row);
}

void RowStore::truncate(size_t n) {
    if (n > n_rows_)
        throw Error("KV row store: truncating " + std::to_string(n_rows_) + " rows to " +
                    std::to_string(n));
    n_rows_ = n;
}

void RowStore::get(size_t i, float *out) const {
    if (f16_) {
        // The SIMD level's exact conversion (a gathered row of attention: 512 values).
        quant::dequantize_row(GgmlType::F16, h_.data() + i * width_, out, width_);
    } else {
        std::memcpy(out, f_.data() + i * width_, width_ * sizeof(float));
    }
}

void RowStore::write_rows(std::ostream &out) const {
    const size_t n = n_rows_ * width_;
    if (f16_)
        state_io::put_bytes(out, h_.data(), n * sizeof(uint16_t));
    else
        state_io::put_bytes(out, f_.data(), n * sizeof(float));
}

void RowStore::read_rows(std::istream &in, size_t n) {
    if (n > capacity_)
        throw Error("session state: " + std::to_string(n) + " rows for a store of " +
                    std::to_string(capacity_));
    const size_t used = n * width_;
    if (f16_) {
        state_io::get_bytes(in, h_.data(), used * sizeof(uint16_t), "f16 rows");
        std::fill(h_.begin() + used, h_.end(), uint16_t(0));
    } else {
        state_io::get_bytes(in, f_.data(), used * sizeof(float), "f32 rows");
        std::fill(f_.begin() + used, f_.end(), 0.0f);
    }
    n_rows_ = n;
}

void CompressorState::init(uint32_t n_rows, uint32_t n_width) {
    rows = n_rows;
    width = n_width;
    kv.assign(size_t(rows) * width, 0.0f);
    score.assign(size_t(rows) * width, -std::numeric_limits<float>::infinity());
}

uint64_t layer_state_bytes(const model::HParams &hp, uint32_t il, uint64_t ring_rows, uint32_t ctx,
                           uint32_t value_bytes, bool with_compressed_rows) {
    const uint64_t D = hp.head_dim, I = hp.idx_head_dim, f32 = sizeof(float);
    uint64_t b = ring_rows * D * value_bytes;
    const uint64_t r = hp.compress_ratio.at(il);
    if (r == 0) return b;
    const uint64_t coff = hp.compressor_coff(il), rows = with_compressed_rows ? ctx / r + 1 : 0;
    b +=
        rows * D * value_bytes + 2 * (coff * r) * (coff * D) * f32;  // rows, window values + scores
    if (hp.attention_kind(il) == model::AttentionKind::Overlapped)
        b += rows * I * value_bytes + 2 * (coff * r) * (coff * I) * f32;
    return b;
}

KvCache::KvCache(const model::HParams &hp, uint32_t ctx_, bool f16_rows_, LayerRange range)
    : ctx(ctx_), f16_rows(f16_rows_) {
    if (range == LayerRange{}) range = {0, hp.n_layer};
    layers.resize(hp.n_layer);
    for (uint32_t il = range.begin; il < range.end; ++il) {
        LayerState &L = layers[il];
        L.raw = RowStore(hp.head_dim, f16_rows, hp.sliding_window);
        const uint32_t r = hp.compress_ratio[il];
        if (r == 0) continue;
        const uint32_t coff = hp.compressor_coff(il);
        L.comp = RowStore(hp.head_dim, f16_rows, ctx / r + 1);
        L.comp_state.init(coff * r, coff * hp.head_dim);
        if (hp.attention_kind(il) == model::AttentionKind::Overlapped) {
            L.idx = RowStore(hp.idx_head_dim, f16_rows, ctx / r + 1);
            L.idx_state.init(coff * r, coff * hp.idx_head_dim);
        }
    }
}

size_t KvCache::bytes() const {
    size_t b = 0;
    for (const auto &L : layers)
        b += L.raw.bytes() + L.comp.bytes() + L.idx.bytes() + L.comp_state.bytes() +
             L.idx_state.bytes();
    return b;
}

}  // namespace ds4::runtime
