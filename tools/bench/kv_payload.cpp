#include "kv_payload.h"

#include <cstdint>

namespace ds4::bench {

size_t snapshot_payload_bytes(const runtime::Session::Snapshot &snap) {
    size_t b = 13 * sizeof(uint32_t);
    b += snap.tokens.size() * sizeof(uint32_t) + snap.logits.size() * sizeof(float);
    return b + snap.state->payload_bytes();
}

}  // namespace ds4::bench
