#include "runtime/kv_cache_io.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/error.h"
#include "runtime/state_io.h"

namespace ds4::runtime {
namespace {

constexpr uint32_t kStateMagic = 0x43345344;  // "DS4C"
constexpr uint32_t kStateVersion = 1;

void write_store(std::ostream &out, const RowStore &r) {
    state_io::put<uint32_t>(out, r.width());
    state_io::put<uint64_t>(out, r.size());
    r.write_rows(out);
}

// Into `r`, a fresh store of this session's shape: the width must match and the rows fit both
// the store and the positions (`max_rows`).
void read_store(std::istream &in, RowStore &r, uint64_t max_rows, uint32_t il, const char *what) {
    const uint32_t width = state_io::get<uint32_t>(in, what);
    const uint64_t rows = state_io::get<uint64_t>(in, what);
    if (width != r.width())
        throw Error(fmt::format("session state: layer {} {} rows are {} wide, this model's {}", il,
                                what, width, r.width()));
    if (rows > r.capacity() || rows > max_rows)
        throw Error(fmt::format("session state: layer {} holds {} {} rows, at most {} fit", il,
                                rows, what, std::min<uint64_t>(r.capacity(), max_rows)));
    r.read_rows(in, rows);
}

void write_window(std::ostream &out, const CompressorState &c) {
    state_io::put<uint32_t>(out, c.rows);
    state_io::put<uint32_t>(out, c.width);
    state_io::put_bytes(out, c.kv.data(), c.kv.size() * sizeof(float));
    state_io::put_bytes(out, c.score.data(), c.score.size() * sizeof(float));
}

void read_window(std::istream &in, CompressorState &c, uint32_t il, const char *what) {
    const uint32_t rows = state_io::get<uint32_t>(in, what);
    const uint32_t width = state_io::get<uint32_t>(in, what);
    if (rows != c.rows || width != c.width)
        throw Error(
            fmt::format("session state: layer {} {} window is {} x {}, this model's {} x {}", il,
                        what, rows, width, c.rows, c.width));
    state_io::get_bytes(in, c.kv.data(), c.kv.size() * sizeof(float), what);
    state_io::get_bytes(in, c.score.data(), c.score.size() * sizeof(float), what);
}

}  // namespace

void write_kv_cache(std::ostream &out, const KvCache &cache) {
    state_io::put<uint32_t>(out, kStateMagic);
    state_io::put<uint32_t>(out, kStateVersion);
    state_io::put<uint32_t>(out, cache.ctx);
    state_io::put<uint32_t>(out, static_cast<uint32_t>(cache.layers.size()));
    state_io::put<uint8_t>(out, cache.f16_rows ? 1 : 0);
    state_io::put<int64_t>(out, cache.n_past);
    for (const LayerState &L : cache.layers) {
        write_store(out, L.raw);
        write_store(out, L.comp);
        write_store(out, L.idx);
        write_window(out, L.comp_state);
        write_window(out, L.idx_state);
    }
}

KvCache read_kv_cache(std::istream &in, const model::HParams &hp, uint32_t ctx, bool f16_rows,
                      int64_t n_past, LayerRange range) {
    if (state_io::get<uint32_t>(in, "the magic") != kStateMagic)
        throw Error("session state: not an attention state (bad magic)");
    if (const uint32_t v = state_io::get<uint32_t>(in, "the version"); v != kStateVersion)
        throw Error(fmt::format("session state: attention state version {}, this build reads {}", v,
                                kStateVersion));
    const uint32_t saved_ctx = state_io::get<uint32_t>(in, "the context size");
    const uint32_t n_layer = state_io::get<uint32_t>(in, "the layer count");
    const bool f16 = state_io::get<uint8_t>(in, "the row format") != 0;
    const int64_t past = state_io::get<int64_t>(in, "the position count");
    if (saved_ctx > ctx)
        throw Error(fmt::format("session state: saved with a context of {}, this session's is {}",
                                saved_ctx, ctx));
    if (n_layer != hp.n_layer)
        throw Error(
            fmt::format("session state: {} layers, this model has {}", n_layer, hp.n_layer));
    if (f16 != f16_rows)
        throw Error(fmt::format("session state: rows stored as {}, this session keeps {}",
                                f16 ? "f16" : "f32", f16_rows ? "f16" : "f32"));
    if (past != n_past || past < 0 || past > int64_t(saved_ctx))
        throw Error(fmt::format("session state: {} positions, expected {} (context {})", past,
                                n_past, saved_ctx));
    // Read into a fresh cache of this session's shape, so that a failure leaves the state as is.
    KvCache next(hp, ctx, f16_rows, range);
    next.n_past = past;
    const uint64_t positions = uint64_t(past);
    for (uint32_t il = 0; il < n_layer; ++il) {
        LayerState &L = next.layers[il];
        // Position p's compressed row is p / ratio (the last one possibly partial): at most
        // past / ratio + 1 rows; the raw ring holds at most min(past, sliding_window).
        const uint32_t r = hp.compress_ratio[il];
        const uint64_t comp_rows = r ? positions / r + 1 : 0;
        read_store(in, L.raw, positions, il, "raw");
        read_store(in, L.comp, comp_rows, il, "compressed");
        read_store(in, L.idx, comp_rows, il, "indexer");
        read_window(in, L.comp_state, il, "compressor");
        read_window(in, L.idx_state, il, "indexer compressor");
    }
    return next;
}

}  // namespace ds4::runtime
