#pragma once
// The device tier of the routed experts streamed on the CUDA backend (docs/SSD_STREAMING.md):
// slots in device memory, each holding one (layer, expert)'s gate, up and down weights split into
// the planes the routed kernels read (backend/cuda/expert_planes.h), filled from the host tier
// (an experts::ExpertSource: the SSD-streaming cache's slots in host memory, fed from the disk,
// or the file's own mapping when it is in memory; pinned here) on a copy stream; and one expert
// table per routed tensor (backend/cuda/expert_table.h) that points the kernels at the slots. It
// moves bytes and does no math: the kernels, and so the bits, are those of the resident weights.
//
// A layer pass: acquire(il, experts, s) points the layer's tables at a slot holding each of the
// experts (uploading the missing ones) and has stream s wait for the uploads; the caller
// enqueues the kernels that read them on s; release(s). Exactness:
// - a slot is rewritten only on the copy stream, after it waited for everything enqueued on the
//   stream of the last release (which itself waited for the release before it), so no kernel
//   reads a slot while it is refilled (the reference engine's wrong-logits bug was exactly that);
// - a pass's own experts are pinned in the bookkeeping until its release;
// - the host tier's bytes of a miss are used (their transfer done) before its next get, unless
//   they stay valid (ExpertSource::bytes_stay_valid: the mapped file).
// Which slot to reuse is experts::ExpertCache's choice (hotness, then least recently used).
#include <cuda_runtime.h>

#include <array>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/expert_planes.h"
#include "backend/cuda/expert_table.h"
#include "experts/expert_cache.h"
#include "experts/expert_source.h"
#include "model/hparams.h"
#include "model/weights.h"
#include "runtime/device_weights.h"

namespace ds4::runtime::cuda_backend {

class DeviceExpertTier {
  public:
    // One slot's layout: for each routed tensor (gate, up, down) its type, block split, blocks
    // per expert, bytes per expert in the file, and where its two planes start in a slot.
    struct Part {
        GgmlType type = GgmlType::F32;
        cuda::BlockSplit split;
        int64_t n_blocks = 0;
        uint64_t file_bytes = 0;
        uint64_t plane_a = 0, plane_b = 0;
    };
    struct Layout {
        std::array<Part, 3> parts;
        uint64_t slot_bytes = 0;  // each plane starts 256-byte aligned
        uint64_t file_bytes = 0;  // one expert's bytes in the file (what a miss transfers)
    };
    // Throws ds4::Error for routed tensors in a format without expert-table planes, or layers
    // whose routed tensors differ in type or shape from layer 0's.
    static Layout layout_of(const model::ModelWeights &w);

    // n_slots >= hp.n_expert_used (else ds4::Error), at most every routed expert. The host
    // tier's memory (ExpertSource::owned_memory: a cache's slots, or the mapped file's routed
    // experts, read-only where the device supports it) is registered (pinned) for direct
    // transfers; a failure to pin is a notice in log(), not an error (the driver then stages
    // each transfer).
    DeviceExpertTier(const model::HParams &hp, const model::ModelWeights &w,
                     experts::ExpertSource &host, uint64_t n_slots);
    ~DeviceExpertTier();
    DeviceExpertTier(const DeviceExpertTier &) = delete;
    DeviceExpertTier &operator=(const DeviceExpertTier &) = delete;

    // The expert table of layer il's routed tensor `part` (0 gate, 1 up, 2 down), in device
    // memory: entries are current for the experts of the layer's last acquire.
    cuda::ExpertTable table(uint32_t il, int part) const;

    // experts: distinct, increasing, at most n_slots(). Throws ds4::Error for a pass already open,
    // too many experts, or the host tier's errors (nothing is then left pinned or half-filled).
    // With `hit`, stream s does not wait for the misses' uploads yet (hits first): (*hit)[i] says
    // whether experts[i] was in a slot already, and kernels reading only those may be enqueued
    // on s at once; wait_uploads(s) comes before any that reads a miss (release does it too).
    void acquire(uint32_t il, std::span<const uint32_t> experts, cudaStream_t s,
                 std::vector<uint8_t> *hit = nullptr);
    // Stream s waits for the open pass's uploads (nothing if they are waited for already).
    void wait_uploads(cudaStream_t s);
    // The kernels reading the pass's experts are enqueued on s: their slots may be reused after.
    void release(cudaStream_t s);
    // A forward step is over (the host tier's step; the hotness decays every 16 steps).
    void step_done();
    // Fills empty slots with these experts, in order, until none is left; returns how many were
    // uploaded. Before the first pass (throws otherwise), and as acquire on the host tier's
    // errors.
    uint64_t preload(std::span<const experts::ExpertKey> keys);

    uint32_t n_slots() const { return cache_.n_slots(); }
    const Layout &layout() const { return layout_; }
    DeviceTierStats stats() const;
    // The passes' selections per (layer, expert), index layer * n_expert + expert (the routing
    // popularity of the run: the host tier sees only the device tier's misses).
    const std::vector<uint64_t> &selection_counts() const { return cache_.selection_counts(); }
    const std::vector<std::string> &log() const { return log_; }

  private:
    uint8_t *slot_base(int32_t slot) const {
        return memory_.as<uint8_t>() + uint64_t(slot) * layout_.slot_bytes;
    }
    // The mirror entries of expert e of layer il -> slot.
    void point(uint32_t il, uint32_t e, int32_t slot);
    // The transfer of the last miss is done (its host bytes may go).
    void wait_copied();
    // wait_copied, unless the host tier's bytes stay valid (the mapped file): the host then
    // enqueues a pass's misses without waiting, and the compute stream waits for the copy
    // stream's event.
    void wait_host_bytes();
    void upload(uint32_t il, uint32_t e, int32_t slot);
    void push_tables(uint32_t il, cudaStream_t s);
    void unpin_pass();
    // The ring, the copy stream and the events, where created.
    void free_handles() noexcept;

    const model::HParams &hp_;
    experts::ExpertSource &host_;
    Layout layout_;
    experts::ExpertCache cache_;
    cuda::DeviceBuffer memory_;   // the slots
    cuda::DeviceBuffer staging_;  // one expert's file bytes
    // Tables: [layer][part][qs pointers n_expert | scale pointers n_expert], on the device and
    // the host's mirror of it.
    cuda::DeviceBuffer tables_;
    std::vector<const uint8_t *> mirror_;
    size_t layer_table_entries_ = 0;
    // Pinned copies of a layer's tables on their way to the device, reused in turn once their
    // transfer is done (ring_done_).
    static constexpr int kRing = 64;
    uint8_t *ring_ = nullptr;
    std::array<cudaEvent_t, kRing> ring_done_{};
    int ring_next_ = 0;
    cudaStream_t copy_ = nullptr;
    cudaEvent_t copied_ = nullptr, uploaded_ = nullptr, released_ = nullptr;
    bool copy_pending_ = false, released_once_ = false, pass_open_ = false;
    bool copy_waits_release_ = false;  // the pass's first repack still has to wait
    bool uploads_unwaited_ = false;    // the open pass's stream has not waited for its uploads
    std::vector<int32_t> pass_slots_;
    void *registered_ = nullptr;  // the pinned host tier, unregistered at the end
    uint64_t tick_ = 0, steps_ = 0;
    DeviceTierStats stats_;
    std::vector<std::string> log_;
};

}  // namespace ds4::runtime::cuda_backend
