#pragma once
// The backends a model can run on, and the device copy of its weights for the GPU backend.
// The session API names a backend and nothing else of it: a session over a model on a device
// gets its operations (runtime/ops.h) from that model's DeviceWeights.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "experts/expert_budget.h"
#include "experts/expert_source.h"
#include "model/hparams.h"
#include "model/weights.h"
#include "runtime/forward_options.h"
#include "runtime/layer_range.h"
#include "runtime/ops.h"

namespace ds4::runtime {

enum class Backend { Cpu, Cuda };
const char *backend_name(Backend b);  // "cpu" | "cuda"
// "cpu" | "cuda"; throws ds4::Error naming the choices otherwise.
Backend parse_backend(const std::string &name);

// The device tier of the routed experts streamed on the CUDA backend (--ssd-streaming --cuda,
// docs/SSD_STREAMING.md): slots in device memory filled from the host tier. A pass is one layer's
// acquisition of its selected experts (a decode step's layer, or a round of a prefill chunk's);
// acquires = hits + misses counts the experts the passes asked for.
struct DeviceTierStats {
    uint64_t slots = 0, slot_bytes = 0;
    uint64_t passes = 0, acquires = 0, hits = 0, misses = 0;
    uint64_t bytes_uploaded = 0;  // the misses' expert bytes, host tier to device
    uint64_t upload_wait_ns = 0;  // host time blocked on the misses' transfers
    uint64_t preloaded = 0;       // experts uploaded at start (not counted as misses)
    uint64_t hits_first = 0;      // passes whose hits' kernels ran before the misses' uploads ended
};

// "2048 slots (13.50 GiB), 11008 passes, 66048 experts: 61234 hits, 4814 misses, hit rate
// 92.71%, 32.50 GiB uploaded, host blocked on transfers 1.234 s, preloaded 2048, hits first in
// 1234 passes"
std::string device_tier_stats_text(const DeviceTierStats &s);

// How upload_to_cuda streams the routed experts: from `host` (the host tier) into a device tier
// of `budget` (automatic: the device memory free after the other weights, minus a reserve for
// sessions).
struct DeviceStreaming {
    experts::ExpertSource *host = nullptr;
    experts::ExpertBudget budget;
    // Uploaded to the device tier at start, most wanted first, as far as it has room (the host
    // tier's own preload, so that these gets find their bytes in host memory).
    std::vector<experts::ExpertKey> preload;
};

class DeviceWeights {
  public:
    virtual ~DeviceWeights() = default;
    // A session's operations: its attention state for ctx positions (rows rounded to f16 or
    // kept f32) and scratch for batches of up to max_batch tokens; of the layers of `layers`
    // only (default: every layer) for a stage of a split model (runtime/layer_stages.h).
    virtual std::unique_ptr<Ops> new_session(uint32_t ctx, bool f16_rows, ForwardOptions opts,
                                             uint32_t max_batch, LayerRange layers = {}) = 0;
    virtual uint64_t bytes() const = 0;  // device memory the weights take
    virtual std::string device_name() const = 0;
    // Streaming: the device tier's start-up lines and its statistics (none when resident).
    virtual std::vector<std::string> tier_log() const { return {}; }
    virtual std::optional<DeviceTierStats> tier_stats() const { return std::nullopt; }
    // The device tier's selections per (layer, expert) (empty when resident).
    virtual std::vector<uint64_t> tier_selection_counts() const { return {}; }
};

// The model file is good but its backend could not start: no CUDA backend in this build, no
// device or driver answers, the weights do not fit the device (Model::load throws it for any
// failure of the upload, after the file has been read and checked).
class BackendUnavailable : public Error {
  public:
    using Error::Error;
};

// Where upload_to_cuda puts a model's weights: a device, and the layers whose weights go there
// (a stage of a model split over several GPUs, runtime/layer_stages.h): the token embedding goes
// with layer 0, the output head with the last layer. The default is every layer on device 0.
struct DeviceStage {
    int device = 0;
    LayerRange layers;  // {} = every layer
};

// Copies the weights of `stage` to its CUDA device, the routed experts too unless `streaming`
// is given (they then go through a device tier fed by streaming->host; every layer only).
// Throws ds4::Error when this build has no CUDA backend, no device or driver answers, the device
// does not exist, or the weights (or the device tier's floor, one token's experts of one layer)
// do not fit, saying how much is needed.
std::unique_ptr<DeviceWeights> upload_to_cuda(
    const model::HParams &hp, const model::ModelWeights &w,
    const std::function<void(uint64_t, uint64_t)> &progress,
    const DeviceStreaming *streaming = nullptr, DeviceStage stage = {});

// A CUDA device's name and memory now, or nothing when this build has no CUDA backend, no device
// or driver answers, the device does not exist or cannot be used (e.g. held in exclusive mode).
// Never throws.
struct CudaDeviceInfo {
    std::string name;
    uint64_t free_bytes = 0, total_bytes = 0;
};
std::optional<CudaDeviceInfo> cuda_device_info(int device);

}  // namespace ds4::runtime
