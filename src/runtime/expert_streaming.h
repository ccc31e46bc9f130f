#pragma once
// SSD streaming of the routed experts as Model::load sets it up (docs/SSD_STREAMING.md): the cache
// budget (a count of experts, a size, or `auto`: the memory available minus the resident weights
// minus a margin), the streaming source (experts/streaming_source.h), the preload from a saved
// routing popularity (experts/popularity.h) or, without one, from the router's own tables, the
// popularity saved at the end, and the lines the tools print about all of it. On the CUDA backend
// this cache is the host tier that feeds the device tier (runtime/cuda/device_expert_tier.h).
//
// Loading in streaming mode never reads a routed expert's bytes through the file mapping: the
// GGUF reader and the binding read only the header and tensor table, nothing validates tensor
// contents, and the routed tensors are used only for their offsets and sizes.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "experts/expert_budget.h"
#include "experts/expert_reader.h"
#include "experts/expert_source.h"
#include "experts/streaming_source.h"

namespace ds4::gguf {
class File;
}
namespace ds4::model {
struct HParams;
struct ModelWeights;
}  // namespace ds4::model

namespace ds4::runtime {

struct StreamingModelOptions {
    bool enabled = false;           // stream the routed experts (the rest stays mapped)
    experts::ExpertBudget budget;   // the cache's; automatic: from mem_available
    uint64_t mem_available = 0;     // `auto`: the memory available (MemAvailable), in bytes
    bool direct_io = true;          // O_DIRECT when the file system allows (else a notice)
    experts::ReaderOptions reader;  // io_uring (auto) or the pread pool
    bool preload = true;            // false: start cold (--ssd-streaming-cold)
    int64_t preload_experts = -1;   // at most this many; -1: the cache's slots, at most 4096
    std::string popularity_file;    // read at start, written by save_popularity; "": neither
    // The CUDA backend (runtime/device_weights.h DeviceStreaming): the device tier's budget
    // (automatic: from the device memory free); the budget above then sizes the host tier.
    experts::ExpertBudget device;
    bool host_tier = false;  // the log calls the cache the host tier
    // The host tier is the file's mapping (experts/mapped_source.h) instead of a cache: asked for
    // (--ssd-streaming-host-cache mapped), or `auto` for a file on tmpfs or ramfs (already in
    // memory). Only with host_tier.
    bool host_mapped = false;
    // Tests: replaces the cache's reader (experts::StreamingOptions::make_reader, e.g. a
    // FaultReader).
    std::function<std::unique_ptr<experts::ExpertReader>(int fd)> make_reader;
};

// Whether the file at `path` lies on a file system held in memory (tmpfs, ramfs); false when it
// cannot be told.
bool file_in_memory(const std::string &path);

// The memory `auto` leaves free for the KV cache, the batch buffers and the rest of the process:
// a tenth of what is available, at least 1 GiB.
uint64_t auto_margin_bytes(uint64_t mem_available);

// Where the popularity of `model_path` is kept under `dir`: "<dir>/<file name>-<16 hex digits of
// the hash of its identity (experts::file_identity)>.popularity", so a rewritten, moved or
// replaced model file starts from none. Throws ds4::Error when the model cannot be stat'ed.
std::string popularity_file_for(const std::string &dir, const std::string &model_path);

class ExpertStreaming {
  public:
    // Sizes the cache, opens the source and preloads it. Throws ds4::Error for a budget below the
    // floor (one token's n_expert_used experts of one layer, which is also what the smallest
    // prefill chunk needs: the runtime gets one expert at a time), an `auto` that leaves no room,
    // and the source's own refusals.
    ExpertStreaming(const gguf::File &file, const model::HParams &hp,
                    const model::ModelWeights &weights, const StreamingModelOptions &opts);
    ~ExpertStreaming();

    experts::ExpertSource &source() { return *source_; }
    const experts::ExpertSource &source() const { return *source_; }
    // The host tier is the file's mapping (StreamingModelOptions::host_mapped, or auto on tmpfs).
    bool host_mapped() const { return mapped_; }
    // The start-up lines (budget, what stays resident, reader, notices, preload), without the
    // tool's prefix.
    const std::vector<std::string> &log() const { return log_; }
    uint64_t resident_bytes() const { return resident_bytes_; }  // the file minus its experts
    // The experts preloaded at start, most wanted first (empty: none).
    const std::vector<experts::ExpertKey> &preloaded() const { return preloaded_; }
    uint64_t routed_bytes() const { return routed_bytes_; }
    // Adds this run's selections (`run_counts`, layer * n_expert + expert; empty: the cache's
    // own, which on CUDA sees only the device tier's misses) to the loaded popularity and writes
    // it to the popularity file. Returns one line saying what was written, or why not; never
    // throws.
    std::string save_popularity(std::span<const uint64_t> run_counts = {});

  private:
    std::unique_ptr<experts::ExpertSource> source_;
    bool mapped_ = false;
    std::vector<std::string> log_;
    std::string popularity_file_, identity_;
    std::vector<uint64_t> loaded_;  // the counts read at start (empty: none)
    std::vector<experts::ExpertKey> preloaded_;
    uint32_t n_layer_ = 0, n_expert_ = 0;
    uint64_t resident_bytes_ = 0, routed_bytes_ = 0;
};

// "4096 entries, 32958 hits, 4194 misses, hit rate 88.71%, 29684662272 bytes read (27.65 GiB),
// read bandwidth during misses 2.31 GiB/s, I/O wait 3.210 s, preloaded 2422, prefetched unused 0"
std::string streaming_stats_text(const experts::ExpertStats &s);

}  // namespace ds4::runtime
