#include "runtime/session.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/error.h"
#include "runtime/cpu_ops.h"
#include "runtime/forward.h"
#include "runtime/gpu_placement.h"
#include "runtime/state_io.h"

namespace ds4::runtime {

std::unique_ptr<Model> Model::load(const std::string &path, const ModelOptions &opts) {
    std::unique_ptr<Model> m(new Model());
    m->file_ = gguf::File::open(path);
    m->hp_ = model::HParams::from_gguf(*m->file_);
    m->weights_ = model::ModelWeights::bind(*m->file_, m->hp_);
    if (opts.strict) {
        if (const std::string why = model::strict_flash_mismatch(m->hp_, m->weights_); !why.empty())
            throw Error(fmt::format("{}: not the published DeepSeek V4 Flash layout (--strict): {}",
                                    path, why));
    }
    // A device tier given as a count is checked here, with the file's other errors; one given as
    // a share or a size is checked by the upload, which knows the slots' size.
    if (opts.streaming.enabled && opts.backend == Backend::Cuda &&
        opts.streaming.device.experts != 0 && opts.streaming.device.experts < m->hp_.n_expert_used)
        throw Error(fmt::format(
            "SSD streaming device tier of {} experts is below the floor of {} (one token's experts "
            "of one layer)",
            opts.streaming.device.experts, m->hp_.n_expert_used));
    m->layer_ranges_ = split_layers(m->hp_.n_layer, opts.layer_starts);
    if (!opts.gpus.empty() && opts.backend != Backend::Cuda)
        throw Error("a list of GPUs needs the CUDA backend");
    for (int g : opts.gpus)
        if (g < 0 || g > kMaxCudaOrdinal)
            throw Error(fmt::format("GPU {}: device ordinals are 0 to {}", g, kMaxCudaOrdinal));
    if (opts.tensor_ranks != 0 && (opts.backend != Backend::Cpu || opts.split != GpuSplit::Tensors))
        throw Error("tensor ranks are the CPU backend's tensor split");
    // SSD streaming has one expert cache (on CUDA one device tier) for the whole model.
    if (opts.streaming.enabled &&
        (!opts.layer_starts.empty() || opts.gpus.size() > 1 || opts.split == GpuSplit::Tensors))
        throw Error("SSD streaming of the routed experts with a split model is not supported");
    if (opts.split == GpuSplit::Tensors) {
        if (!opts.layer_starts.empty())
            throw Error("a layer split and the tensor split at once: give one");
        const size_t n = opts.backend == Backend::Cuda ? opts.gpus.size() : opts.tensor_ranks;
        if (n < 2)
            throw Error(fmt::format("the tensor split needs 2 or more {}, got {}",
                                    opts.backend == Backend::Cuda ? "GPUs (--gpus)" : "ranks", n));
        m->split_tensors(opts, uint32_t(n));
    }
    m->pool_ = std::make_unique<backend::cpu::ThreadPool>(opts.n_threads);
    if (opts.streaming.enabled) {
        m->streaming_ =
            std::make_unique<ExpertStreaming>(*m->file_, m->hp_, m->weights_, opts.streaming);
        m->experts_ = &m->streaming_->source();
    } else {
        m->resident_ = experts::make_resident_source(m->weights_);
        m->experts_ = m->resident_.get();
    }
    if (opts.backend == Backend::Cuda) m->upload(opts);
    return m;
}

namespace {

// The plan's shares summed per named device (a device named twice holds both) against each
// device's free memory, before anything is uploaded. Indexed by ordinal: the devices not named,
// and those that cannot be asked (the upload then says why), are let through.
void check_devices_fit(const GpuPlacement &plan, const std::vector<int> &gpus) {
    const int n_ordinals = *std::max_element(gpus.begin(), gpus.end()) + 1;
    GpuPlacement per_device = plan;
    per_device.gpus.assign(size_t(n_ordinals), GpuShare{});
    std::vector<uint64_t> free_bytes(size_t(n_ordinals), UINT64_MAX);
    for (size_t i = 0; i < gpus.size(); ++i) {
        const size_t d = size_t(gpus[i]);
        per_device.gpus[d].weight_bytes += plan.gpus[i].weight_bytes;
        per_device.gpus[d].state_bytes += plan.gpus[i].state_bytes;
        if (const auto info = cuda_device_info(gpus[i])) free_bytes[d] = info->free_bytes;
    }
    try {
        check_placement_fits(per_device, free_bytes, kCudaSessionHeadroom);
    } catch (const Error &e) {
        throw BackendUnavailable(e.what());
    }
}

}  // namespace

void Model::split_tensors(const ModelOptions &opts, uint32_t n) {
    const GpuPlacement plan =
        plan_gpu_placement(hp_, weights_, GpuSplit::Tensors, n, opts.plan_ctx, kCudaDefaultChunk);
    layer_ranges_.assign(n, LayerRange{0, hp_.n_layer});
    for (uint32_t r = 0; r < n; ++r) {
        shards_.push_back(std::make_unique<TensorShard>(hp_, weights_, plan, r));
        // The CPU computes from the parts; on CUDA they are uploaded, then freed.
        if (opts.backend == Backend::Cpu)
            shard_experts_.push_back(experts::make_resident_source(shards_.back()->weights()));
    }
    if (opts.backend == Backend::Cuda) check_devices_fit(plan, opts.gpus);
}

void Model::upload(const ModelOptions &opts) {
    const std::vector<int> gpus = opts.gpus.empty() ? std::vector<int>{0} : opts.gpus;
    if (!opts.layer_starts.empty() && layer_ranges_.size() != gpus.size())
        throw Error(fmt::format("{} ranges of layers for {} GPU(s): name one GPU per range",
                                layer_ranges_.size(), gpus.size()));
    if (!tensor_split() && opts.layer_starts.empty() && gpus.size() > 1) {
        // The ranges whose largest share of weights and attention state is smallest.
        const GpuPlacement plan =
            plan_gpu_placement(hp_, weights_, GpuSplit::Layers, uint32_t(gpus.size()),
                               opts.plan_ctx, kCudaDefaultChunk);
        layer_ranges_.clear();
        for (const GpuShare &g : plan.gpus) layer_ranges_.push_back({g.first_layer, g.end_layer});
        check_devices_fit(plan, gpus);
    }
    // Streaming: the cache is the host tier; the device tier's budget comes along.
    DeviceStreaming ds;
    ds.host = experts_;
    ds.budget = opts.streaming.device;
    if (streaming_) ds.preload = streaming_->preloaded();
    // One progress over every range: the bytes of the ranges uploaded before are added.
    uint64_t before = 0;
    const auto progress = [&](uint64_t done, uint64_t total) {
        if (opts.upload_progress) opts.upload_progress(before + done, before + total);
    };
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    for (size_t i = 0; i < layer_ranges_.size(); ++i) {
        const LayerRange r = layer_ranges_[i];
        try {
            if (tensor_split()) {  // the part's weights, every layer
                devices_.push_back(upload_to_cuda(shards_[i]->hparams(), shards_[i]->weights(),
                                                  progress, nullptr, {gpus[i], {}}));
                shards_[i]->release_bytes();
            } else
                devices_.push_back(upload_to_cuda(
                    hp_, weights_, progress, opts.streaming.enabled ? &ds : nullptr, {gpus[i], r}));
        } catch (const Error &e) {
            throw BackendUnavailable(e.what());
        }
        before += devices_.back()->bytes();
        const double gib = double(devices_.back()->bytes()) / kGiB;
        const std::string device =
            fmt::format("CUDA device {} ({})", gpus[i], devices_.back()->device_name());
        if (tensor_split()) {
            const TensorShard &p = *shards_[i];
            placement_log_.push_back(fmt::format(
                "{}: part {} of {}: {} heads in {} output groups, {} expert hidden columns, "
                "vocabulary rows {}-{}; {:.2f} GiB of weights",
                device, i, shards_.size(), p.hparams().n_head, p.hparams().n_out_group,
                p.hparams().n_ff_exp, p.vocab_begin(), p.vocab_end() - 1, gib));
        } else if (layer_ranges_.size() > 1) {
            placement_log_.push_back(fmt::format("{}: layers {}-{}{}{}, {:.2f} GiB of weights",
                                                 device, r.begin, r.end - 1,
                                                 r.begin == 0 ? ", token embedding" : "",
                                                 r.end == hp_.n_layer ? ", output head" : "", gib));
        }
    }
}

uint32_t default_chunk(Backend backend) {
    return backend == Backend::Cuda ? kCudaDefaultChunk : kCpuDefaultChunk;
}

Session::Session(Model &model, const SessionOptions &opts)
    : model_(model),
      chunk_(opts.chunk ? opts.chunk : default_chunk(model.backend())),
      interval_(opts.rewind_interval),
      max_points_(opts.max_rewind_points) {
    if (opts.ctx == 0) throw Error("context size must be > 0");
    if (interval_ != 0 && max_points_ == 0)
        throw Error("rewind points every N tokens need room for at least one (max_rewind_points)");
    const bool f16 = opts.f16_rows < 0 ? opts.forward.qat_sim : opts.f16_rows != 0;
    std::vector<Stage> stages;
    const bool parts = model.tensor_split();
    for (size_t i = 0; i < model.layer_ranges().size(); ++i) {
        const LayerRange range = model.layer_ranges()[i];
        Stage &s = stages.emplace_back();
        s.layers = range;
        if (model.device())
            s.ops = model.device(i)->new_session(opts.ctx, f16, opts.forward, chunk_, range);
        else if (parts)
            s.ops = std::make_unique<CpuOps>(model.shard(i).hparams(), model.shard(i).weights(),
                                             model.pool(), model.shard_experts(i), opts.forward,
                                             opts.ctx, f16);
        else
            s.ops = std::make_unique<CpuOps>(model.hparams(), model.weights(), model.pool(),
                                             model.experts(), opts.forward, opts.ctx, f16, range);
        if (parts) {
            s.ops->interleaved();
            ranks_.push_back({s.ops.get(), &model.shard(i).hparams(), &model.shard(i).weights(),
                              model.shard(i).vocab_begin()});
        }
    }
    stages_ = std::make_unique<LayerStages>(model.hparams(), std::move(stages), f16, parts);
    points_[0] = {stages_->save_tail(), {}};
}

uint64_t Session::kv_bytes_for(const model::HParams &hp, const SessionOptions &opts,
                               Backend backend) {
    // The CPU's KvCache; the CUDA backend keeps f32 values and its ring holds a prefill batch
    // more than the window (cuda_ops.cpp).
    const bool f16 = opts.f16_rows < 0 ? opts.forward.qat_sim : opts.f16_rows != 0;
    const uint32_t elem = f16 && backend == Backend::Cpu ? 2 : 4;
    const uint32_t chunk = opts.chunk ? opts.chunk : default_chunk(backend);
    const uint64_t ring =
        uint64_t(hp.sliding_window) + (backend == Backend::Cuda && chunk > 1 ? chunk : 0);
    uint64_t b = 0;
    for (uint32_t il = 0; il < hp.n_layer; ++il)
        b += layer_state_bytes(hp, il, ring, opts.ctx, elem);
    return b;
}

uint64_t Session::kv_bytes_for(const Model &model, const SessionOptions &opts) {
    const uint64_t copies = model.tensor_split() ? model.layer_ranges().size() : 1;
    return copies * kv_bytes_for(model.hparams(), opts, model.backend());
}

const std::vector<float> &Session::eval(std::span<const int32_t> tokens,
                                        const std::function<void(size_t, size_t)> &progress) {
    if (tokens_.size() + tokens.size() > ctx())
        throw Error(
            fmt::format("{} tokens do not fit: {} already in the context, {} new, context size {}",
                        tokens_.size() + tokens.size(), tokens_.size(), tokens.size(), ctx()));
    for (size_t i = 0; i < tokens.size();) {
        size_t n = std::min<size_t>(chunk_, tokens.size() - i);
        // A batch ends at each multiple of the rewind interval (the bits do not depend on
        // where batches end), where the point is taken.
        if (interval_) n = std::min<size_t>(n, interval_ - tokens_.size() % interval_);
        const std::span<const int32_t> batch = tokens.subspan(i, n);
        if (ranks_.empty())
            forward(stages_->stages(), model_.hparams(), model_.weights(), batch, logits_);
        else
            forward_tensor_split(ranks_, model_.hparams(), batch, logits_);
        tokens_.insert(tokens_.end(), batch.begin(), batch.end());
        i += n;
        if (interval_ && tokens_.size() % interval_ == 0) add_periodic_point();
        if (progress) progress(i, tokens.size());
    }
    return logits_;
}

void Session::restore(const Snapshot &s) {
    stages_->restore(*s.state);
    logits_ = s.logits;
    tokens_ = s.tokens;
    forget_history();
}

size_t Session::RewindPoint::bytes() const {
    return tail->payload_bytes() + logits.size() * sizeof(float);
}

void Session::add_periodic_point() {
    points_[tokens_.size()] = {stages_->save_tail(), logits_};
    if (points_.size() - 1 <= max_points_) return;
    // Too many: keep the multiples of twice the interval (position 0 among them).
    interval_ *= 2;
    std::erase_if(points_, [&](const auto &p) { return p.first % interval_ != 0; });
}

void Session::forget_history() {
    std::erase_if(points_, [](const auto &p) { return p.first != 0; });
    mark_.reset();
}

void Session::mark_rewind_point() {
    if (mark_ && mark_->first == tokens_.size()) return;
    mark_.emplace(tokens_.size(), RewindPoint{stages_->save_tail(), logits_});
}

size_t Session::rewind_point(size_t n) const {
    if (n >= tokens_.size()) return tokens_.size();
    size_t best = 0;  // the point at 0 is always there
    if (auto it = points_.upper_bound(n); it != points_.begin()) best = std::prev(it)->first;
    if (mark_ && mark_->first <= n) best = std::max(best, mark_->first);
    return best;
}

size_t Session::rewind(size_t n) {
    const size_t p = rewind_point(n);
    // Back to the start always restores it: after an evaluation that failed half-way the
    // attention state may hold more than the tokens say.
    if (p == tokens_.size() && p != 0) return p;
    const RewindPoint &point = mark_ && mark_->first == p ? mark_->second : points_.at(p);
    stages_->rewind(*point.tail);
    logits_ = point.logits;
    tokens_.resize(p);
    std::erase_if(points_, [&](const auto &q) { return q.first > p; });
    if (mark_ && mark_->first > p) mark_.reset();
    return p;
}

std::vector<size_t> Session::rewind_points() const {
    std::vector<size_t> out;
    for (const auto &[pos, point] : points_) out.push_back(pos);
    if (mark_ && !points_.count(mark_->first)) {
        out.push_back(mark_->first);
        std::sort(out.begin(), out.end());
    }
    return out;
}

size_t Session::rewind_points_bytes() const {
    size_t b = mark_ ? mark_->second.bytes() : 0;
    for (const auto &[pos, point] : points_) b += point.bytes();
    return b;
}

uint64_t Session::rewind_point_bytes_for(const model::HParams &hp, const SessionOptions &opts,
                                         Backend backend) {
    // kv_bytes_for without the compressed rows (of the raw ring, the window's rows), and the
    // logits.
    const bool f16 = opts.f16_rows < 0 ? opts.forward.qat_sim : opts.f16_rows != 0;
    const uint32_t elem = f16 && backend == Backend::Cpu ? 2 : 4;
    uint64_t b = uint64_t(hp.n_vocab) * sizeof(float);
    for (uint32_t il = 0; il < hp.n_layer; ++il)
        b += layer_state_bytes(hp, il, hp.sliding_window, 0, elem, false);
    return b;
}

namespace {
constexpr uint32_t kSessionStateMagic = 0x53345344;  // "DS4S"
constexpr uint32_t kSessionStateVersion = 1;
}  // namespace

void Session::write_state(std::ostream &out) const {
    const model::HParams &hp = model_.hparams();
    state_io::put<uint32_t>(out, kSessionStateMagic);
    state_io::put<uint32_t>(out, kSessionStateVersion);
    state_io::put<uint32_t>(out, ctx());
    state_io::put<uint32_t>(out, hp.n_vocab);
    state_io::put<uint32_t>(out, hp.n_layer);
    state_io::put<uint64_t>(out, tokens_.size());
    state_io::put_bytes(out, tokens_.data(), tokens_.size() * sizeof(int32_t));
    state_io::put<uint64_t>(out, logits_.size());
    state_io::put_bytes(out, logits_.data(), logits_.size() * sizeof(float));
    stages_->write_state(out);
}

void Session::read_state(std::istream &in) {
    const model::HParams &hp = model_.hparams();
    if (state_io::get<uint32_t>(in, "the magic") != kSessionStateMagic)
        throw Error("session state: not a ds4 session state (bad magic)");
    if (const uint32_t v = state_io::get<uint32_t>(in, "the version"); v != kSessionStateVersion)
        throw Error(
            fmt::format("session state: version {}, this build reads {}", v, kSessionStateVersion));
    const uint32_t saved_ctx = state_io::get<uint32_t>(in, "the context size");
    const uint32_t n_vocab = state_io::get<uint32_t>(in, "the vocabulary size");
    const uint32_t n_layer = state_io::get<uint32_t>(in, "the layer count");
    if (saved_ctx > ctx())
        throw Error(fmt::format("session state: saved with a context of {}, this session's is {}",
                                saved_ctx, ctx()));
    if (n_vocab != hp.n_vocab || n_layer != hp.n_layer)
        throw Error(
            fmt::format("session state: a model of {} tokens and {} layers, this one has "
                        "{} and {}",
                        n_vocab, n_layer, hp.n_vocab, hp.n_layer));
    const uint64_t n_tokens = state_io::get<uint64_t>(in, "the token count");
    if (n_tokens > saved_ctx)
        throw Error(
            fmt::format("session state: {} tokens in a context of {}", n_tokens, saved_ctx));
    std::vector<int32_t> tokens(n_tokens);
    state_io::get_bytes(in, tokens.data(), tokens.size() * sizeof(int32_t), "the tokens");
    for (size_t i = 0; i < tokens.size(); ++i)
        if (tokens[i] < 0 || uint32_t(tokens[i]) >= hp.n_vocab)
            throw Error(fmt::format("session state: token {} is {}, outside the vocabulary of {}",
                                    i, tokens[i], hp.n_vocab));
    // The logits after the last token: none before the first.
    const uint64_t n_logits = state_io::get<uint64_t>(in, "the logit count");
    if (n_logits != (n_tokens ? hp.n_vocab : 0) && !(n_tokens == 0 && n_logits == hp.n_vocab))
        throw Error(fmt::format("session state: {} logits for {} tokens, expected {}", n_logits,
                                n_tokens, n_tokens ? hp.n_vocab : 0));
    std::vector<float> logits(n_logits);
    state_io::get_bytes(in, logits.data(), logits.size() * sizeof(float), "the logits");
    stages_->read_state(in, int64_t(n_tokens));
    tokens_ = std::move(tokens);
    logits_ = std::move(logits);
    forget_history();
}

const char *backend_name(Backend b) {
    return b == Backend::Cuda ? "cuda" : "cpu";
}

Backend parse_backend(const std::string &name) {
    if (name == "cpu") return Backend::Cpu;
    if (name == "cuda") return Backend::Cuda;
    throw Error(fmt::format("unknown backend '{}': expected cpu or cuda", name));
}

}  // namespace ds4::runtime
