#pragma once
// Routed experts streamed from the model file into a bounded cache of fixed slots (SSD
// streaming). The non-routed weights stay in the file mapping; the routed bytes are never touched
// through it (that would pull them into memory) but read with explicit reads into the slots,
// several in flight at once (io_uring or a pread pool), with O_DIRECT when the file system allows.
//
// Exactness: a get returns the file's bytes or throws ds4::Error naming the file, layer and
// expert (a read error, a truncated file); a slot that a consumer may still read is never reused:
// the slot of each layer's last get until that layer's next get, layer_done or step_done. The
// experts a prefetch announced keep their slots until their get or the end of the layer's pass,
// unless a get finds every other slot pinned: then an announced expert (whose bytes nobody has
// yet) is dropped and read again at its get. One consumer at a time: the calls are serialized,
// but two consumers' gets of one layer would end each other's bytes.
//
// Memory: entries x slot_bytes for the slots (one mapping, touched as slots fill), plus a fixed
// overhead of about 16 bytes per (layer, expert), 70 bytes per slot and the reader's threads.
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "experts/expert_budget.h"
#include "experts/expert_cache.h"
#include "experts/expert_reader.h"
#include "experts/expert_source.h"
#include "experts/stream_file.h"

namespace ds4::gguf {
class File;
}

namespace ds4::experts {

// One expert's bytes in the file: the slabs of ffn_gate_exps, ffn_up_exps and ffn_down_exps.
struct ExpertGeometry {
    uint64_t gate = 0, up = 0, down = 0;
    uint64_t payload() const { return gate + up + down; }
    // A slot's memory: each slab's region, rounded for an aligned O_DIRECT superset of it.
    uint64_t slot_bytes(bool direct) const;
};

// Throws ds4::Error when a layer's experts differ in size from layer 0's (one slot size serves
// every layer).
ExpertGeometry expert_geometry(const model::ModelWeights &w);

struct StreamingOptions {
    ExpertBudget budget;         // required (not automatic): the caller works out `auto`
    uint32_t n_expert_used = 0;  // the floor: one token's experts of one layer (required)
    bool direct_io = true;       // try O_DIRECT (falls back to buffered, with a notice)
    ReaderOptions reader;
    uint32_t decay_interval = 16;  // step_done calls between halvings of the hotness; 0: never
    // Tests: replaces the reader `reader` describes (e.g. a FaultReader on the fd given).
    std::function<std::unique_ptr<ExpertReader>(int fd)> make_reader;
};

class StreamingSource final : public ExpertSource {
  public:
    // `file` is the mapping `weights` was bound from; its path is opened again for the reads.
    // Throws ds4::Error for a budget below the floor (stating it), unequal expert sizes, a file
    // shorter than its routed tensors, or a failure to open or allocate.
    StreamingSource(const gguf::File &file, const model::ModelWeights &weights,
                    const StreamingOptions &opts);
    ~StreamingSource() override;

    ExpertBytes get(uint32_t layer, uint32_t expert) override;
    void prefetch(uint32_t layer, std::span<const uint32_t> experts) override;
    void layer_done(uint32_t layer) override;
    void step_done() override;
    void preload(std::span<const ExpertKey> keys) override;
    std::vector<uint64_t> selection_counts() const override;
    ExpertStats stats() const override;
    std::span<uint8_t> owned_memory() const override { return {memory_.data(), memory_.size()}; }

    // What fell back and why (io_uring -> pool, O_DIRECT -> buffered), for the start-up log.
    const std::vector<std::string> &notices() const { return notices_; }
    const ExpertGeometry &geometry() const { return geom_; }

  private:
    enum class State : uint8_t { Empty, Reading, Ready };
    struct Slot {
        State state = State::Empty;
        uint64_t tickets[3] = {0, 0, 0};
        uint64_t skew[3] = {0, 0, 0};  // where each slab starts in its region (O_DIRECT rounding)
        bool fresh = false;            // read for a get that has not come yet
        bool prefetch_pin = false;     // pinned by its layer's prefetch, not consumed yet
    };
    struct LayerFiles {
        uint64_t offset[3] = {0, 0, 0};  // file offset of ffn_{gate,up,down}_exps
    };
    struct Pass {  // one layer's prefetch: what it announced and what is pinned for it
        std::vector<uint32_t> experts;
        size_t next = 0;  // experts[next..] are not read or pinned yet
        std::vector<int32_t> pinned;
        int32_t held = ExpertCache::kNone;  // the last get's slot
    };

    void check_key(uint32_t layer, uint32_t expert) const;
    int32_t claim_slot(uint32_t layer);
    void retire(int32_t slot);
    void start_load(int32_t slot, uint32_t layer, uint32_t expert);
    void wait_ready(int32_t slot);
    void release_held(uint32_t layer);
    void release_pass(uint32_t layer);
    void top_up(uint32_t layer);
    ExpertBytes bytes_of(int32_t slot) const;
    uint8_t *slot_base(int32_t slot) const { return memory_.data() + uint64_t(slot) * slot_bytes_; }

    // The slots' memory, one anonymous mapping (page aligned, as O_DIRECT wants).
    class SlotMemory {
      public:
        explicit SlotMemory(uint64_t bytes);
        ~SlotMemory();
        SlotMemory(const SlotMemory &) = delete;
        SlotMemory &operator=(const SlotMemory &) = delete;
        uint8_t *data() const { return p_; }
        uint64_t size() const { return n_; }

      private:
        uint8_t *p_ = nullptr;
        uint64_t n_ = 0;
    };

    // Declaration order is destruction order reversed: reader_ waits for every read in flight
    // before memory_ and file_ go.
    mutable std::mutex m_;
    std::vector<std::string> notices_;
    ExpertGeometry geom_;
    uint32_t n_layer_ = 0, n_expert_ = 0;
    std::vector<LayerFiles> files_;
    StreamFile file_;
    uint64_t slot_bytes_ = 0;
    uint64_t region_[3] = {0, 0, 0};  // each slab's region in a slot, in bytes
    ExpertCache cache_;
    SlotMemory memory_;
    std::unique_ptr<ExpertReader> reader_;
    std::vector<Slot> slots_;
    std::vector<Pass> passes_;
    uint32_t decay_interval_ = 0;
    uint64_t tick_ = 0, steps_ = 0;
    ExpertStats stats_;
};

}  // namespace ds4::experts
