#include "experts/expert_cache.h"

#include <limits>

#include "common/error.h"

namespace ds4::experts {

ExpertCache::ExpertCache(uint32_t n_layer, uint32_t n_expert, uint32_t n_slots)
    : n_layer_(n_layer), n_expert_(n_expert) {
    const uint64_t n_keys = uint64_t(n_layer) * n_expert;
    if (n_keys == 0 || n_keys > uint64_t(std::numeric_limits<int32_t>::max()))
        throw Error("expert cache: bad shape " + std::to_string(n_layer) + " layers x " +
                    std::to_string(n_expert) + " experts");
    if (n_slots == 0) throw Error("expert cache: no slots");
    key_slot_.assign(n_keys, kNone);
    hot_.assign(n_keys, 0);
    total_.assign(n_keys, 0);
    slot_key_.assign(n_slots, kNone);
    slot_used_.assign(n_slots, 0);
    slot_pins_.assign(n_slots, 0);
}

void ExpertCache::select(uint32_t layer, uint32_t expert) {
    const uint32_t k = key(layer, expert);
    if (hot_[k] != std::numeric_limits<uint32_t>::max()) ++hot_[k];
    ++total_[k];
}

int32_t ExpertCache::victim() const {
    // A linear scan: at most a few hundred misses per token against ~10^4 slots costs well under
    // the time one expert takes to read, and there is no ordered structure to keep in step with
    // every selection and decay.
    int32_t best = kNone;
    uint64_t best_hot = 0, best_used = 0;
    for (int32_t s = 0; s < int32_t(slot_key_.size()); ++s) {
        if (slot_pins_[s]) continue;
        if (slot_key_[s] == kNone) return s;
        const uint64_t h = hot_[slot_key_[s]], u = slot_used_[s];
        if (best == kNone || h < best_hot || (h == best_hot && u < best_used)) {
            best = s;
            best_hot = h;
            best_used = u;
        }
    }
    return best;
}

void ExpertCache::assign(int32_t slot, uint32_t layer, uint32_t expert) {
    clear(slot);
    const uint32_t k = key(layer, expert);
    if (key_slot_[k] != kNone) throw Error("expert cache: expert assigned to two slots");
    slot_key_[slot] = int32_t(k);
    key_slot_[k] = slot;
}

void ExpertCache::clear(int32_t slot) {
    if (slot_key_[slot] != kNone) key_slot_[slot_key_[slot]] = kNone;
    slot_key_[slot] = kNone;
}

void ExpertCache::pin(int32_t slot) {
    if (slot_pins_[slot]++ == 0) ++n_pinned_;
}

void ExpertCache::unpin(int32_t slot) {
    if (slot_pins_[slot] == 0) throw Error("expert cache: unpin of an unpinned slot");
    if (--slot_pins_[slot] == 0) --n_pinned_;
}

void ExpertCache::decay() {
    for (uint32_t &h : hot_) h >>= 1;
}

}  // namespace ds4::experts
