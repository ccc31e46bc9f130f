#pragma once
// The engine's session API: a loaded model (file mapping, hyper-parameters, bound weights,
// expert source, threads) and sessions over it (token history, KV cache, last logits), with
// in-memory snapshots. The CLI, the tests and later the server use only this.
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "experts/expert_source.h"
#include "gguf/gguf_file.h"
#include "model/hparams.h"
#include "model/weights.h"
#include "runtime/device_weights.h"
#include "runtime/expert_streaming.h"
#include "runtime/forward.h"
#include "runtime/forward_options.h"
#include "runtime/gpu_placement.h"
#include "runtime/layer_stages.h"
#include "runtime/ops.h"
#include "runtime/tensor_shards.h"

namespace ds4::runtime {

struct ModelOptions {
    int n_threads = 0;    // 0 = all cores
    bool strict = false;  // require the published Flash layout
    Backend backend = Backend::Cpu;
    // Called as weights are copied to a device: (bytes done, bytes in all).
    std::function<void(uint64_t, uint64_t)> upload_progress;
    // SSD streaming of the routed experts (expert_streaming.h); on CUDA through a device tier.
    StreamingModelOptions streaming;
    // The layers split into consecutive ranges, each run by its own backend instance holding the
    // attention state of its layers (runtime/layer_stages.h): the first layer of every range
    // after the first, ascending (empty: one range, or on CUDA the planned ranges for `gpus`).
    // On the CPU a split gives the same bits as none (what the tests of the hand-over between
    // ranges check).
    std::vector<uint32_t> layer_starts;
    // CUDA: the devices (ordinals) the ranges of layers go to, one range each, in order (a model
    // larger than one GPU over several, docs/MULTI_GPU.md). A device may be named more than
    // once. Empty: device 0 alone. Without layer_starts the ranges are planned
    // (runtime/gpu_placement.h) for sessions of `plan_ctx` positions, and a plan that does not
    // fit the devices' free memory is refused before anything is uploaded.
    std::vector<int> gpus;
    uint32_t plan_ctx = 32768;
    // How the model is split over `gpus`: by layers (above), or by tensors: every GPU computes
    // its heads, expert hidden columns and vocabulary rows of every layer, holding its part of
    // the weights (runtime/tensor_shards.h) and a copy of the attention state, and the parts'
    // sublayer outputs are added (docs/MULTI_GPU.md). On the CPU backend the tensor split runs
    // over `tensor_ranks` backend instances (the same model order; what tests check it with).
    GpuSplit split = GpuSplit::Layers;
    uint32_t tensor_ranks = 0;
};

class Model {
  public:
    // Opens, validates and binds a deepseek4 GGUF; throws ds4::Error with the file's problem, and
    // BackendUnavailable (device_weights.h) when the file is good but its backend cannot start.
    // With opts.streaming.enabled the routed experts come from an SSD-streaming cache (their
    // bytes are never read through the mapping); ds4::Error for a budget below the floor. On the
    // CUDA backend the cache is the host tier of a device tier (device_weights.h); a device
    // tier given as a count below its floor is ds4::Error, one given as a share or size that
    // comes out below it is BackendUnavailable, as any failure of the upload.
    static std::unique_ptr<Model> load(const std::string &path, const ModelOptions &opts = {});

    const gguf::File &file() const { return *file_; }
    const model::HParams &hparams() const { return hp_; }
    const model::ModelWeights &weights() const { return weights_; }
    backend::cpu::ThreadPool &pool() { return *pool_; }
    experts::ExpertSource &experts() { return *experts_; }
    // The SSD streaming of the routed experts, or null when they are resident.
    ExpertStreaming *streaming() { return streaming_.get(); }
    Backend backend() const { return devices_.empty() ? Backend::Cpu : Backend::Cuda; }
    // The device copy of the weights (null on the CPU backend): of the first range of layers, and
    // of each range (one per range of layer_ranges()).
    DeviceWeights *device() { return devices_.empty() ? nullptr : devices_.front().get(); }
    DeviceWeights *device(size_t range) { return devices_.at(range).get(); }
    // The placement's start-up lines (which layers on which GPU; none for one range).
    const std::vector<std::string> &placement_log() const { return placement_log_; }
    // The layers each of the sessions' backend instances runs: one range (the whole model),
    // consecutive ranges (split by layers), or every layer on each (split by tensors).
    const std::vector<LayerRange> &layer_ranges() const { return layer_ranges_; }
    // Split by tensors: each instance's part of the model, and its routed experts' source.
    bool tensor_split() const { return !shards_.empty(); }
    const TensorShard &shard(size_t part) const { return *shards_.at(part); }
    experts::ExpertSource &shard_experts(size_t part) { return *shard_experts_.at(part); }

  private:
    Model() = default;
    // The CUDA backend: every range of layers, or every part, to its device (ModelOptions::gpus).
    void upload(const ModelOptions &opts);
    // Split by tensors: the plan over n parts, and each part's weights.
    void split_tensors(const ModelOptions &opts, uint32_t n);
    std::unique_ptr<gguf::File> file_;
    model::HParams hp_;
    model::ModelWeights weights_;
    std::unique_ptr<backend::cpu::ThreadPool> pool_;
    std::unique_ptr<ExpertStreaming> streaming_;  // owns the source experts_ points to
    experts::ExpertSource *experts_ = nullptr;
    std::unique_ptr<experts::ExpertSource> resident_;
    std::vector<std::unique_ptr<DeviceWeights>> devices_;  // one per range of layers
    std::vector<LayerRange> layer_ranges_;
    std::vector<std::unique_ptr<TensorShard>> shards_;  // split by tensors: one per part
    std::vector<std::unique_ptr<experts::ExpertSource>> shard_experts_;
    std::vector<std::string> placement_log_;
};

// The prefill batch a session takes when none is asked for: on the CPU a chunk of 256 keeps a
// batch's activations in cache; the CUDA backend reads each routed expert's weights once per
// chunk, so longer chunks are faster there (docs/PERFORMANCE.md: 835 -> 915 tok/s at 1024 on an
// H200) and cost ~90 MiB more of device scratch.
inline constexpr uint32_t kCpuDefaultChunk = 256, kCudaDefaultChunk = 1024;
// What a CUDA device needs besides the weights and the attention state when a placement over
// several is checked: a session's batch scratch, the CUDA context (the upload keeps as much).
inline constexpr uint64_t kCudaSessionHeadroom = uint64_t(2) << 30;
// The largest CUDA device ordinal ModelOptions::gpus takes (--gpus: 0 to 1023).
inline constexpr int kMaxCudaOrdinal = 1023;
uint32_t default_chunk(Backend backend);

struct SessionOptions {
    uint32_t ctx = 32768;    // positions the KV cache holds
    uint32_t chunk = 0;      // prefill batch size (1 = token by token; 0 = default_chunk)
    ForwardOptions forward;  // qat_sim on by default
    // Cached rows as f16 (the reference engines' rounding) or f32; default: f16 when QAT
    // simulation is on, f32 when it is off (exact comparisons with f32 references).
    int f16_rows = -1;
    // Rewind points (Session::rewind): one each time the session's length reaches a multiple of
    // rewind_interval tokens (0 = none). When there are more than max_rewind_points of them, every
    // other one is dropped and the interval doubles, so that they keep covering the whole history.
    uint32_t rewind_interval = 0;
    uint32_t max_rewind_points = 32;
};

class Session {
  public:
    Session(Model &model, const SessionOptions &opts = {});

    // Appends and evaluates tokens; returns the logits after the last one. `progress(done,
    // total)` is called as tokens are evaluated. Throws when the context would overflow, before
    // evaluating anything.
    const std::vector<float> &eval(std::span<const int32_t> tokens,
                                   const std::function<void(size_t, size_t)> &progress = {});
    const std::vector<float> &logits() const { return logits_; }
    const std::vector<int32_t> &tokens() const { return tokens_; }
    uint32_t ctx() const { return stages_->ctx(); }
    uint32_t chunk() const { return chunk_; }
    size_t kv_bytes() const { return stages_->kv_bytes(); }
    // The bytes kv_bytes() will report for a session of `opts` over a model of `hp`, computed
    // without allocating, so that a context too large for the machine is refused beforehand.
    // The CUDA backend keeps rows as f32 values (of their f16 rounding when rows are rounded).
    static uint64_t kv_bytes_for(const model::HParams &hp, const SessionOptions &opts,
                                 Backend backend = Backend::Cpu);
    // The same for a session over `model` as loaded: its backend, and with the model split by
    // tensors a copy of the attention state in every part (a layer split holds each layer's
    // once).
    static uint64_t kv_bytes_for(const Model &model, const SessionOptions &opts);

    // A copy of the session's state: the backend's attention state, the logits and the tokens.
    struct Snapshot {
        std::shared_ptr<const BackendState> state;
        std::vector<float> logits;
        std::vector<int32_t> tokens;
    };
    Snapshot save() const { return {stages_->save(), logits_, tokens_}; }
    void restore(const Snapshot &s);

    // The same state as bytes (the server's disk KV cache), and back. The format: u32 magic
    // "DS4S", u32 version, u32 ctx, u32 n_vocab, u32 n_layer, u64 token count, the i32 tokens,
    // u64 logit count (0 or n_vocab), the f32 logits, then the backend's state (Ops::write_state).
    // read_state validates everything against this session (ctx at save <= ctx(), the model's
    // vocabulary and layers, token ids, the backend's shapes) and throws ds4::Error on any
    // mismatch or short read, leaving the session as it was; it reads exactly what write_state
    // wrote and nothing after it. Both throw on a backend that cannot serialise its state.
    void write_state(std::ostream &out) const;
    void read_state(std::istream &in);

    // Going back to a prefix of the tokens without evaluating them again. A rewind point holds
    // the attention state but the compressed rows (Ops::save_tail: the raw window and the
    // compressors' windows, ~17 MB for the Flash layout on the CPU, f16 rows) and the logits;
    // the session keeps one at position 0, the periodic ones of SessionOptions::rewind_interval,
    // and the one mark_rewind_point() sets. rewind_point(n) is the longest prefix of at most n
    // tokens it can return to (n itself for n >= tokens().size()); rewind(n) returns there,
    // drops the points after it, and returns its length (rewind(0) restores the start whatever
    // the state, also after an eval that threw): the state, logits and tokens are then
    // exactly those the session had at that length (the tokens after it are evaluated again by
    // the caller, with the same bits as a session that never went further). restore() and
    // read_state() keep only the point at 0 (the others belong to another history).
    void mark_rewind_point();
    size_t rewind_point(size_t n) const;
    size_t rewind(size_t n);
    // The positions of the rewind points kept, ascending (the mark among them), and their bytes.
    std::vector<size_t> rewind_points() const;
    size_t rewind_points_bytes() const;
    // The bytes of one rewind point of a session of `opts` (an upper bound; the logits included).
    static uint64_t rewind_point_bytes_for(const model::HParams &hp, const SessionOptions &opts,
                                           Backend backend = Backend::Cpu);

  private:
    struct RewindPoint {
        std::shared_ptr<const BackendState> tail;
        std::vector<float> logits;
        size_t bytes() const;
    };
    void add_periodic_point();
    void forget_history();  // after restore / read_state: only the point at 0 stays

    Model &model_;
    std::unique_ptr<LayerStages> stages_;
    std::vector<TensorRank> ranks_;  // split by tensors: the stages' parts
    uint32_t chunk_;
    std::vector<float> logits_;
    std::vector<int32_t> tokens_;
    uint32_t interval_, max_points_;
    std::map<size_t, RewindPoint> points_;                // position 0 and the periodic ones
    std::optional<std::pair<size_t, RewindPoint>> mark_;  // mark_rewind_point()'s
};

}  // namespace ds4::runtime
