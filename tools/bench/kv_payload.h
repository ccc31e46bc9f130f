#pragma once
// kvcache_bytes of a bench row: the size a snapshot of the session would take in the session
// payload layout of docs/SURFACES.md 3.13 (what the reference's ds4-bench reports): a 13-field header,
// the token ids, the next-token logits, per-layer row counts, then only the live rows (raw window,
// compressed and indexer rows) and the compressors' partial state. The in-memory snapshot itself
// is bigger: it copies the whole allocated cache.
#include <cstddef>

#include "runtime/session.h"

namespace ds4::bench {

size_t snapshot_payload_bytes(const runtime::Session::Snapshot &snap);

}  // namespace ds4::bench
