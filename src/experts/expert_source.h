#pragma once
// Where the bytes of a routed expert come from. The runtime asks for (layer, expert) and gets
// pointers to the expert's gate, up and down rows; whether they live in the resident file mapping
// or in a cache fed from SSD is the source's business. This folder knows nothing about math.
//
// A layer's pass, as the CPU runtime makes it: prefetch(il, sorted experts), then get(il, e) for
// each of them in that order (using the bytes until the next get), then layer_done(il); after the
// whole forward step, step_done(). A source that does not stream ignores all but get.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace ds4::model {
struct ModelWeights;
}

namespace ds4::experts {

struct ExpertBytes {
    const uint8_t *gate = nullptr;  // n_ff rows of n_embd values
    const uint8_t *up = nullptr;    // n_ff rows of n_embd values
    const uint8_t *down = nullptr;  // n_embd rows of n_ff values
};

struct ExpertKey {
    uint32_t layer = 0;
    uint32_t expert = 0;
};

// Cache accounting since the source was made. A get is a hit when no read was needed for it (the
// expert was already cached or preloaded) and a miss when its bytes were read for it, on demand or
// by a prefetch; so hits + misses = gets, and bytes_read = misses x payload bytes of one expert.
struct ExpertStats {
    bool streaming = false;        // false: resident mapping, every other field 0
    const char *reader = "";       // "io_uring" or "pread pool"
    bool direct_io = false;        // reads bypass the page cache (O_DIRECT)
    uint64_t entries = 0;          // cache slots (experts held at once)
    uint64_t expert_bytes = 0;     // payload of one expert: gate + up + down
    uint64_t slot_bytes = 0;       // memory of one slot (payload + alignment room)
    uint64_t gets = 0;             // calls to get that returned bytes
    uint64_t hits = 0;             // gets served without a read
    uint64_t misses = 0;           // gets whose expert was read for them
    uint64_t bytes_read = 0;       // payload bytes read for gets (preload excluded)
    uint64_t disk_bytes = 0;       // bytes the reads transferred, preload and alignment included
    uint64_t preloaded = 0;        // experts read by preload
    uint64_t prefetch_unused = 0;  // prefetched experts evicted before any get used them
    uint64_t io_wait_ns = 0;       // time get spent blocked on reads
    uint64_t io_busy_ns = 0;       // wall time with at least one read in flight: disk_bytes /
                                   // io_busy_ns is the read bandwidth during misses
};

class ExpertSource {
  public:
    virtual ~ExpertSource() = default;
    // The bytes stay valid until the next call to `get` for the same layer, or until
    // layer_done(layer) or step_done().
    virtual ExpertBytes get(uint32_t layer, uint32_t expert) = 0;
    // The experts the coming pass of `layer` will get (sorted, as the runtime's loop goes), so
    // their reads can be in flight together. A hint: get gives the same bytes without it.
    virtual void prefetch(uint32_t /*layer*/, std::span<const uint32_t> /*experts*/) {}
    // The consumer reads no more bytes of this layer's gets until its next get.
    virtual void layer_done(uint32_t /*layer*/) {}
    // One forward step (a token or a prefill chunk) is over: no bytes of any get are read any
    // more. Also the clock of the selection counts' decay.
    virtual void step_done() {}
    // Seeds the cache with these experts, most wanted first, as far as it has room.
    virtual void preload(std::span<const ExpertKey> /*keys*/) {}
    // Selections (gets) per (layer, expert), index layer * n_expert + expert, undecayed, for
    // saving (popularity.h); empty when the source does not count.
    virtual std::vector<uint64_t> selection_counts() const { return {}; }
    // Whether a get's bytes stay valid for the whole source (a resident mapping): the consumer
    // may then hold several experts' bytes at once.
    virtual bool bytes_stay_valid() const { return false; }
    virtual ExpertStats stats() const { return {}; }
    // The one range every get's bytes lie in (a cache's slots, the mapped file's routed experts),
    // else empty: a device backend may register it for direct transfers (pinned host memory). It
    // only reads it.
    virtual std::span<uint8_t> owned_memory() const { return {}; }
};

// Experts read in place from the model file's mapping.
std::unique_ptr<ExpertSource> make_resident_source(const model::ModelWeights &weights);

}  // namespace ds4::experts
