#include "kv_payload.h"

#include <cstdint>

namespace ds4::bench {

namespace {

size_t live_bytes(const runtime::RowStore &r) {
    return r.capacity() ? r.bytes() / r.capacity() * r.size() : 0;
}

}  // namespace

size_t snapshot_payload_bytes(const runtime::Session::Snapshot &snap) {
    size_t b = 13 * sizeof(uint32_t);
    b += snap.tokens.size() * sizeof(uint32_t) + snap.logits.size() * sizeof(float);
    b += 2 * snap.cache.layers.size() * sizeof(uint32_t);
    for (const auto &l : snap.cache.layers)
        b += live_bytes(l.raw) + live_bytes(l.comp) + live_bytes(l.idx) + l.comp_state.bytes() +
             l.idx_state.bytes();
    return b;
}

}  // namespace ds4::bench
