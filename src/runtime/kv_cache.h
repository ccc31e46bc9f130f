#pragma once
// Per-session attention state of every layer (docs/MODEL.md 8.1): the raw sliding window, the
// compressed rows, the indexer rows, and the compressors' partial windows. Rows are stored as
// f16 (the reference engines round cached rows to f16 anyway) or, for exact comparisons with
// an f32 reference, as f32.
#include <cstdint>
#include <iosfwd>
#include <vector>

#include "model/hparams.h"
#include "runtime/layer_range.h"

namespace ds4::runtime {

// Rows of a fixed width, f16 or f32, appended or overwritten in place.
class RowStore {
  public:
    RowStore() = default;
    RowStore(uint32_t width, bool f16, size_t capacity);

    uint32_t width() const { return width_; }
    size_t size() const { return n_rows_; }
    size_t capacity() const { return capacity_; }
    void push(const float *row);           // throws when full
    void set(size_t i, const float *row);  // i < capacity; grows size to i + 1
    void get(size_t i, float *out) const;
    // Forgets the rows from n on (n <= size()): the next push writes row n.
    void truncate(size_t n);
    size_t bytes() const { return capacity_ * width_ * (f16_ ? 2 : 4); }
    bool f16() const { return f16_; }
    size_t row_bytes() const { return size_t(width_) * (f16_ ? 2 : 4); }

    // Serialisation of session states: the rows in use [0, size()) exactly as stored (f16 or
    // f32 bits), and back: read_rows replaces them with n rows from `in` (n <= capacity, the rows
    // after them zero, as in a fresh store). Throws ds4::Error for n > capacity or short bytes.
    void write_rows(std::ostream &out) const;
    void read_rows(std::istream &in, size_t n);

  private:
    uint32_t width_ = 0;
    bool f16_ = true;
    size_t capacity_ = 0;
    size_t n_rows_ = 0;
    std::vector<uint16_t> h_;
    std::vector<float> f_;
};

// A compressor's rolling window: `rows` rows of `width` values and scores (docs/MODEL.md 4.4).
struct CompressorState {
    uint32_t rows = 0, width = 0;
    std::vector<float> kv, score;  // rows x width; score -inf marks an unwritten row

    void init(uint32_t n_rows, uint32_t n_width);
    size_t bytes() const { return (kv.size() + score.size()) * sizeof(float); }
};

struct LayerState {
    RowStore raw;   // ring: the row of position p lives at slot p % sliding_window
    RowStore comp;  // attention compressed rows (ratio != 0)
    RowStore idx;   // indexer compressed rows (ratio 4)
    CompressorState comp_state, idx_state;
};

// Bytes of layer il's attention state: ring_rows raw rows, for a compressed layer its compressed
// (and, ratio 4, indexer) rows for ctx positions (ctx / ratio + 1 each; none when
// !with_compressed_rows), rows of value_bytes per value, and the compressors' windows of values
// and scores (f32). The layout of the KvCache constructor (value_bytes 2 or 4, ring_rows =
// sliding_window) and of the CUDA backend's state (4, and a prefill batch more in the ring).
uint64_t layer_state_bytes(const model::HParams &hp, uint32_t il, uint64_t ring_rows, uint32_t ctx,
                           uint32_t value_bytes, bool with_compressed_rows = true);

struct KvCache {
    uint32_t ctx = 0;    // positions the cache can hold
    int64_t n_past = 0;  // positions already evaluated
    bool f16_rows =
        true;  // the rows' format (also of a stage's cache whose first layers are empty)
    std::vector<LayerState> layers;

    KvCache() = default;
    // Allocates everything for `ctx` positions up front, so the memory reported at start is the
    // memory used. Only the layers of `range` get state (a stage of a split model); the others'
    // stay empty (no rows, no windows). The default range is every layer.
    KvCache(const model::HParams &hp, uint32_t ctx, bool f16_rows, LayerRange range = {});
    size_t bytes() const;
};

}  // namespace ds4::runtime
