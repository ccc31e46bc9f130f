#pragma once
// A host tier that is the model file itself, mapped (SSD streaming on CUDA, `--ssd-streaming-host-
// cache mapped`, and `auto` for a file on tmpfs or ramfs): every routed expert is read in place,
// nothing is copied into a cache and nothing is read from the disk by the engine. It is for a file
// that is already in memory (/dev/shm, or a page cache that holds it): a second copy of the experts
// in pinned host memory would only halve what fits. The device tier registers the routed range
// (owned_memory) so that its misses go to the device straight from the file's pages.
//
// The source maps the file again, shared: pinning pages of the engine's private mapping would make
// the kernel give the pin private copies of them (a read-only long-term pin of a private file
// mapping is unshared first), 72 GiB of anonymous memory for the Flash file; a shared mapping pins
// the file's own pages.
//
// Every get is a hit; the source counts the selections (for the saved popularity) and nothing else.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "experts/expert_source.h"

namespace ds4::gguf {
class File;
}

namespace ds4::experts {

class MappedHostSource final : public ExpertSource {
  public:
    // `file` is the mapping `weights` was bound from; its path is mapped again. Throws ds4::Error
    // when the file cannot be opened or mapped, or its size is no longer the one `file` mapped
    // (a file replaced by another of the same size in between is not told apart: the model's
    // load makes this source right after opening the file).
    MappedHostSource(const gguf::File &file, const model::ModelWeights &weights);
    ~MappedHostSource() override;
    MappedHostSource(const MappedHostSource &) = delete;
    MappedHostSource &operator=(const MappedHostSource &) = delete;

    ExpertBytes get(uint32_t layer, uint32_t expert) override;
    std::vector<uint64_t> selection_counts() const override { return counts_; }
    bool bytes_stay_valid() const override { return true; }
    ExpertStats stats() const override;
    // The pages that hold the routed experts, from the first routed byte's page to the last's.
    std::span<uint8_t> owned_memory() const override { return routed_; }

  private:
    std::unique_ptr<ExpertSource> resident_;  // the same experts in the engine's mapping
    const uint8_t *engine_base_ = nullptr;    // that mapping's start
    uint8_t *base_ = nullptr;                 // this source's shared mapping
    uint64_t size_ = 0;
    uint32_t n_expert_ = 0;
    std::vector<uint64_t> counts_;  // gets per (layer, expert)
    std::span<uint8_t> routed_;
    ExpertStats stats_;
};

}  // namespace ds4::experts
