#pragma once
// The bookkeeping of the streaming cache, without I/O or bytes: which (layer, expert) each slot
// holds, which slots are pinned (a consumer may still read them, or reads into them are wanted),
// the decayed selection count of every expert and the choice of the slot to reuse. A device-side
// cache can put its own slots behind the same table.
//
// Eviction: an empty slot first; else the unpinned slot whose expert has the lowest hotness (its
// selections, halved at each decay), least recently used first among equals. A pinned slot is
// never chosen.
#include <cstdint>
#include <vector>

namespace ds4::experts {

class ExpertCache {
  public:
    static constexpr int32_t kNone = -1;

    ExpertCache(uint32_t n_layer, uint32_t n_expert, uint32_t n_slots);

    uint32_t n_layer() const { return n_layer_; }
    uint32_t n_expert() const { return n_expert_; }
    uint32_t n_slots() const { return static_cast<uint32_t>(slot_key_.size()); }
    uint32_t n_pinned() const { return n_pinned_; }

    // The slot holding the expert, or kNone.
    int32_t slot_of(uint32_t layer, uint32_t expert) const { return key_slot_[key(layer, expert)]; }
    bool empty(int32_t slot) const { return slot_key_[slot] == kNone; }
    uint32_t layer_of(int32_t slot) const { return uint32_t(slot_key_[slot]) / n_expert_; }
    uint32_t expert_of(int32_t slot) const { return uint32_t(slot_key_[slot]) % n_expert_; }

    // One selection of the expert: its hotness and its total count grow by one.
    void select(uint32_t layer, uint32_t expert);
    // The slot was used at `tick` (a clock that only grows), for the LRU tie-break.
    void touch(int32_t slot, uint64_t tick) { slot_used_[slot] = tick; }

    // The slot to reuse, or kNone when every slot is pinned.
    int32_t victim() const;
    // The slot now holds the expert (whatever it held before is forgotten).
    void assign(int32_t slot, uint32_t layer, uint32_t expert);
    void clear(int32_t slot);

    // Pins nest: a slot is pinned while pin() calls outnumber unpin() calls.
    void pin(int32_t slot);
    void unpin(int32_t slot);
    bool pinned(int32_t slot) const { return slot_pins_[slot] != 0; }

    // Halves every hotness (the reference halves every 16 decode tokens).
    void decay();

    uint32_t hotness(uint32_t layer, uint32_t expert) const { return hot_[key(layer, expert)]; }
    // Selections per expert since the start, index layer * n_expert + expert.
    const std::vector<uint64_t> &selection_counts() const { return total_; }

  private:
    uint32_t key(uint32_t layer, uint32_t expert) const { return layer * n_expert_ + expert; }

    uint32_t n_layer_, n_expert_;
    std::vector<int32_t> key_slot_;    // per expert: its slot or kNone
    std::vector<uint32_t> hot_;        // per expert: decayed selections
    std::vector<uint64_t> total_;      // per expert: selections
    std::vector<int32_t> slot_key_;    // per slot: its expert's key or kNone
    std::vector<uint64_t> slot_used_;  // per slot: last use
    std::vector<uint32_t> slot_pins_;  // per slot: pin depth
    uint32_t n_pinned_ = 0;
};

}  // namespace ds4::experts
